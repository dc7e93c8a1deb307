"""A data folder's identity: the sorted relative paths of its files and the SHA-256 of each one's
bytes, hashed, so that a folder whose images changed is measured again instead of resumed, and a
copy of the same images is the same data (docs/measuring.md, "What a run's identity holds").

Reading every byte on every run would cost a large folder more than its evaluation, so a file's
digest is kept in vitbench's cache beside what ``stat`` says of it (size, modification and change
times, inode) and read again only when one of those differs. The change time cannot be set from
user space: a file replaced or rewritten with its old modification time (``touch -r``) is hashed
again.
"""
from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Optional

from vitbench.core.cache import atomic_write, cache_dir
from vitbench.errors import DataError

__all__ = ["folder_fingerprint", "folder_files"]

_MEMO_FORMAT = 1


def folder_files(root: str | Path) -> list[Path]:
    """Every regular file under ``root`` (hidden ones too, links followed, each folder once so a
    link loop ends), sorted; pipes, devices and sockets are not files and are left out."""
    root = Path(root)
    seen: set[tuple[int, int]] = set()
    found: list[Path] = []
    for folder, dirs, files in os.walk(root, followlinks=True):
        try:
            st = os.stat(folder)
        except OSError:
            dirs[:] = []
            continue
        if (st.st_dev, st.st_ino) in seen:  # a link back up the tree
            dirs[:] = []
            continue
        seen.add((st.st_dev, st.st_ino))
        for name in files:
            path = Path(folder) / name
            if path.is_file():
                found.append(path)
    return sorted(found, key=lambda p: os.fsencode(p))


def _stamp(st: os.stat_result) -> list[int]:
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def _file_sha256(path: Path) -> str:
    try:
        with path.open("rb") as f:
            return hashlib.file_digest(f, "sha256").hexdigest()
    except OSError as exc:
        raise DataError(f"cannot read {path} to fingerprint the data folder: {exc.strerror or exc}") from exc


def _memo_path(root: Path) -> Path:
    key = hashlib.sha256(os.fsencode(root)).hexdigest()[:16]
    return cache_dir() / "fingerprints" / f"{key}.json"


def _read_memo(path: Path) -> dict[str, list]:
    try:
        memo = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(memo, dict) or memo.get("format") != _MEMO_FORMAT or not isinstance(memo.get("files"), dict):
        return {}
    return memo["files"]


def _write_memo(path: Path, root: Path, files: dict[str, list]) -> None:
    """Keep the digests for the next run; a cache that cannot be written only costs that run the reading."""
    text = json.dumps({"format": _MEMO_FORMAT, "root": os.fsdecode(root), "files": files})
    try:
        atomic_write(path, lambda tmp: tmp.write_text(text))
    except OSError:
        pass


def _digests(root: Path, files: list[Path]) -> Iterator[tuple[str, str]]:
    memo_path = _memo_path(root)
    memo = _read_memo(memo_path)
    fresh: dict[str, list] = {}
    changed = False
    for path in files:
        rel = path.relative_to(root).as_posix()
        try:
            stamp = _stamp(path.stat())
        except OSError as exc:
            raise DataError(f"cannot read {path} to fingerprint the data folder: {exc.strerror or exc}") from exc
        known: Optional[list] = memo.get(rel)
        if known is not None and known[:4] == stamp:
            digest = str(known[4])
        else:
            digest, changed = _file_sha256(path), True
        fresh[rel] = [*stamp, digest]
        yield rel, digest
    if changed or len(fresh) != len(memo):
        _write_memo(memo_path, root, fresh)


def folder_fingerprint(root: str | Path) -> str:
    """``files=N,sha256=<16 hex>`` over every file under ``root`` (:func:`folder_files`): each one's
    path relative to ``root`` and the SHA-256 of its bytes, in sorted order."""
    root = Path(root).expanduser().resolve()
    files = folder_files(root)
    digest = hashlib.sha256()
    for rel, sha in _digests(root, files):
        digest.update(os.fsencode(rel) + b"\0" + sha.encode() + b"\n")
    return f"files={len(files)},sha256={digest.hexdigest()[:16]}"
