"""The append-only result store: one JSON record per line in ``DIR/runs.jsonl``.

Why append-only JSONL: a run writes its record when it ends, so a benchmark interrupted after
run 7 of 20 keeps 7 results and ``--resume`` continues from there. A record is serialised
first and written with one ``write`` of the whole line, then flushed and fsync'ed, so a killed
process leaves at most a truncated *last* line; :meth:`ResultStore.records` skips it and lists
it in :attr:`ResultStore.corrupt_lines` (not ``warnings.warn``: a store must stay readable
under ``-W error``). Retries append a new record; the newest record of a spec wins.
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import enum
import json
import math
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

from vitbench.errors import DataError
from vitbench.core.files import special_file

__all__ = ["CorruptLine", "ResultStore", "latest_records", "shard_file", "to_jsonable", "FINISHED_STATUSES"]

STORE_FILE = "runs.jsonl"
#: Statuses that ``--resume`` does not run again; ``error`` is retried.
FINISHED_STATUSES = frozenset({"ok", "skipped"})


#: the fields a line must hold, as strings, to be read as a run record
RECORD_KEYS = ("spec_id", "status", "task", "model", "method")


class CorruptLine(NamedTuple):
    """A line of a store file that is not a run record (1-based line number) and why."""

    lineno: int
    text: str
    file: str = STORE_FILE
    reason: str = "not a complete JSON object"

    def describe(self) -> str:
        """``runs.jsonl line 3 (not a complete JSON object): {"spec_i...``"""
        text = self.text if len(self.text) <= 60 else self.text[:57] + "..."
        return f"{self.file} line {self.lineno} ({self.reason}): {text}"


def _not_a_record(rec: Any) -> str | None:
    """Why a parsed line is no run record, or ``None`` when it is one."""
    if not isinstance(rec, dict):
        return "not a complete JSON object"
    missing = [k for k in RECORD_KEYS if not isinstance(rec.get(k), str)]
    if missing:
        return f"no string {missing[0]!r}"
    return None


def to_jsonable(value: Any) -> Any:
    """Return ``value`` as plain JSON types: numpy/torch scalars and arrays become Python
    numbers and lists, NaN and infinities become ``None`` (JSON has no NaN), paths and dates
    become strings. Anything else unknown is stored as ``str(value)`` rather than losing a run."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [to_jsonable(v) for v in value]
    if hasattr(value, "tolist"):  # numpy scalars/arrays, torch tensors
        return to_jsonable(value.tolist())
    if isinstance(value, enum.Enum):
        return to_jsonable(value.value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return to_jsonable(dataclasses.asdict(value))
    if isinstance(value, (_dt.datetime, _dt.date)):
        return value.isoformat()
    return str(value)  # Path and anything else


def latest_records(records: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The newest record of each ``spec_id`` (later in the file = newer), in the order the
    specs first appear, so a retried run keeps its place in reports. Records without a
    ``spec_id`` are kept as they are."""
    by_id: dict[Any, dict[str, Any]] = {}
    for i, rec in enumerate(records):
        key = rec.get("spec_id")
        by_id[key if key is not None else ("<no spec_id>", i)] = dict(rec)
    return list(by_id.values())


def shard_file(index: int, count: int) -> str:
    """The store file shard ``index`` of ``count`` appends to (``--shard I/N``)."""
    return f"runs-shard-{index}-of-{count}.jsonl"


def _shard_order(path: Path) -> tuple[int, int, str]:
    """Sort key of the shard files: by shard count, then index (numerically), then name."""
    parts = path.stem.split("-")  # runs-shard-I-of-N
    try:
        return (int(parts[4]), int(parts[2]), path.name)
    except (IndexError, ValueError):
        return (0, 0, path.name)


class ResultStore:
    """``DIR/runs.jsonl``. ``path_dir`` may also name the ``.jsonl`` file itself.

    Sharded runs (``--shard I/N``, a job array spreading one plan over machines) append to
    their own file ``DIR/runs-shard-I-of-N.jsonl`` (``shard=(I, N)``), so that no two processes
    write one file; reading a directory merges ``runs.jsonl`` and every shard file (in that
    order, shards by index), and the newest record of a spec wins as always."""

    def __init__(self, path_dir: str | os.PathLike[str], shard: tuple[int, int] | None = None) -> None:
        p = Path(path_dir)
        self.dir_mode = p.suffix != ".jsonl"
        base = p if not self.dir_mode else p / STORE_FILE
        #: the file this store appends to
        self.path = base.parent / shard_file(*shard) if shard is not None and self.dir_mode else base
        #: Lines skipped by the last :meth:`records` call (a run killed mid-write).
        self.corrupt_lines: list[CorruptLine] = []

    def files(self) -> list[Path]:
        """The files :meth:`records` reads: ``runs.jsonl``, then the shard files of the directory
        (a store opened on one ``.jsonl`` file reads that file alone)."""
        if not self.dir_mode:
            return [self.path]
        folder = self.path.parent
        return [folder / STORE_FILE] + sorted(folder.glob("runs-shard-*-of-*.jsonl"), key=_shard_order)

    def append(self, record: Mapping[str, Any]) -> None:
        """Append ``record`` as one complete line, durable when this returns."""
        line = json.dumps(to_jsonable(record), ensure_ascii=True, allow_nan=False) + "\n"
        data = line.encode("ascii")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a+b", buffering=0) as f:
            # After a crash mid-write the file ends without a newline: start on a fresh line
            # so the truncated record stays one skippable line and ours stays whole.
            if f.tell() > 0 and os.pread(f.fileno(), 1, f.tell() - 1) != b"\n":
                data = b"\n" + data
            f.write(data)
            f.flush()
            os.fsync(f.fileno())

    def records(self) -> list[dict[str, Any]]:
        """Every run record (a JSON object with the :data:`RECORD_KEYS` as strings), file by file
        (:meth:`files`) in file order; other lines go to :attr:`corrupt_lines`."""
        self.corrupt_lines = []
        out: list[dict[str, Any]] = []
        for path in self.files():
            kind = special_file(path)
            if kind is not None:  # reading a pipe would wait for a writer forever
                raise DataError(f"result store {str(path)!r} is {kind}, not a file; move it away")
            try:
                raw = path.read_bytes()
            except FileNotFoundError:
                continue
            except OSError as exc:  # a folder named runs.jsonl, no read permission
                raise DataError(f"result store {str(path)!r} cannot be read: {exc.strerror or exc}") from None
            for lineno, line in enumerate(raw.split(b"\n"), start=1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line.decode("utf-8"))
                except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
                    rec = None
                reason = _not_a_record(rec)
                if reason is None:
                    out.append(rec)
                else:
                    self.corrupt_lines.append(CorruptLine(lineno, line.decode("utf-8", "replace"), path.name, reason))
        return out

    def latest(self) -> dict[str, dict[str, Any]]:
        """``spec_id -> newest record`` (see :func:`latest_records` for the order)."""
        recs = latest_records(self.records())
        return {r["spec_id"]: r for r in recs if r.get("spec_id") is not None}

    def finished_ids(self) -> set[str]:
        """Spec ids that ``--resume`` skips: the newest record is ``ok`` or ``skipped``."""
        return {k for k, r in self.latest().items() if r.get("status") in FINISHED_STATUSES}
