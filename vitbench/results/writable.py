"""A result folder checked for writing before anything runs, and records kept elsewhere when the
store cannot take them (a full disk at the end of a long run)."""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Optional

from vitbench.errors import VitbenchError
from vitbench.results.store import to_jsonable

__all__ = ["OutputError", "check_writable", "rescue_record"]


class OutputError(VitbenchError):
    """A result folder (``--out``) that cannot be created or written."""


def check_writable(out: Path, store_file: Path, *, shared: bool = False) -> None:
    """Prove a file can be created, written, renamed and removed in ``out`` (created for the probe
    and removed again when it was new, unless ``shared``: several ranks check the same folder at
    once, and one rank's removal would pull it from under another), and that ``store_file`` can be
    appended to; raise :class:`OutputError` naming ``out`` otherwise."""
    if out.exists() and not out.is_dir():
        raise OutputError(f"--out {str(out)!r} is a file, not a folder; name a new or existing folder")
    created = [] if shared else [d for d in (out, *out.parents) if not d.exists()]  # removed again: bad input leaves nothing
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"--out {str(out)!r} cannot be created: {_reason(exc)}") from None
    if store_file.exists() and not store_file.is_file():
        raise OutputError(f"--out {str(out)!r}: its store {store_file.name!r} is not a file; "
                          f"move it away or name another folder")
    probe = None
    try:
        fd, probe = tempfile.mkstemp(prefix=".vitbench-probe-", dir=out)
        with os.fdopen(fd, "wb") as f:
            f.write(b"{}\n")
            f.flush()
            os.fsync(f.fileno())
        renamed = out / f"{Path(probe).name}.renamed"
        os.replace(probe, renamed)
        probe = str(renamed)
        if store_file.exists():
            with open(store_file, "ab"):
                pass
    except OSError as exc:
        raise OutputError(f"--out {str(out)!r} cannot be written: {_reason(exc)}") from None
    finally:
        if probe is not None:
            Path(probe).unlink(missing_ok=True)
        for folder in created:  # deepest first
            try:
                folder.rmdir()
            except OSError:
                break


def rescue_record(record: Mapping[str, Any], store_file: Path, error: OSError) -> Optional[Path]:
    """Append ``record`` to a rescue file outside the store when the store's append failed; say
    where on stderr (the record itself when no rescue file can be written). Returns the file."""
    line = json.dumps(to_jsonable(record), ensure_ascii=True, allow_nan=False) + "\n"
    name = f"vitbench-rescued-{time.strftime('%Y%m%d')}-{os.getpid()}.jsonl"
    for folder in (Path(tempfile.gettempdir()), Path.home() / ".cache" / "vitbench" / "rescued"):
        path = folder / name
        try:
            folder.mkdir(parents=True, exist_ok=True)
            with open(path, "a", encoding="ascii") as f:
                f.write(line)
                f.flush()
                os.fsync(f.fileno())
        except OSError:
            continue
        print(f"vitbench: error: could not append to {store_file} ({_reason(error)}); the measured record "
              f"is kept in {path}: append it with `cat {path} >> {store_file}`", file=sys.stderr)
        return path
    print(f"vitbench: error: could not append to {store_file} ({_reason(error)}) nor keep the record "
          f"elsewhere; here it is: {line.rstrip()}", file=sys.stderr)
    return None


def _reason(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__
