"""Write a whole file or nothing: a new file in the same folder, then ``os.replace``
(:func:`vitbench.core.cache.atomic_write`: the mode a plain ``open()`` gives)."""
from __future__ import annotations

import os
from pathlib import Path

from vitbench.core.cache import atomic_write


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to ``path`` so readers see the old file or the new one, never half."""
    def write(tmp: Path) -> None:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())

    return atomic_write(path, write)


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    """:func:`atomic_write_bytes` of ``text`` in UTF-8; bytes a path or argument held that no
    encoding decodes (surrogates) are written as ``\\udcXX`` escapes rather than failing."""
    return atomic_write_bytes(path, text.encode("utf-8", "backslashreplace"))
