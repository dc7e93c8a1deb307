"""A data folder's identity: the sorted relative paths, sizes and modification times of its files,
hashed, so that a folder whose images changed is measured again instead of resumed
(docs/measuring.md, "What a run's identity holds")."""
from __future__ import annotations

import hashlib
from pathlib import Path

__all__ = ["folder_fingerprint"]


def folder_fingerprint(root: str | Path, *, content: bool = False) -> str:
    """``files=N,sha256=<16 hex>`` over every file under ``root`` (hidden ones too, links
    followed): each one's path relative to ``root``, size and modification time in ns, in
    sorted order; with ``content``, its bytes as well (slow on a large folder, but blind to
    copies that keep the times)."""
    root = Path(root).expanduser().resolve()
    files = sorted(p for p in root.rglob("*") if p.is_file())
    digest = hashlib.sha256()
    for path in files:
        stat = path.stat()
        digest.update(f"{path.relative_to(root).as_posix()}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
        if content:
            with path.open("rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    digest.update(block)
    return f"files={len(files)},sha256={digest.hexdigest()[:16]}"
