"""A data set vitbench generates into its cache once: written to a temporary sibling folder, stamped
last, and renamed into place when complete, so an interrupted run never leaves a folder that looks
finished (the shapes COCO set, :mod:`vitbench.data.shapes_coco`; the Fashion-MNIST scenes,
:mod:`vitbench.data.fmnist_scenes`).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, Optional

from vitbench.core.cache import cache_dir

__all__ = ["STAMP_FILE", "SplitSettings", "generated_once", "stamped", "write_stamp"]

STAMP_FILE = "stamp.json"


class SplitSettings:
    """What a generated COCO set's settings (a frozen dataclass) share: the images of each split
    and the digest its cache stamp keeps (generator version and every field)."""

    version: ClassVar[int]
    train_images: int
    val_images: int

    def images(self, split: str) -> int:
        """Number of images in ``split``."""
        return self.train_images if split == "train" else self.val_images

    def digest(self) -> str:
        """SHA-256 of the generator version and these settings (the cache stamp's key)."""
        fields = dataclasses.asdict(self)  # type: ignore[call-overload]
        blob = json.dumps({"version": self.version, **fields}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()


def write_stamp(root: Path, generator: str, version: int, settings: dict[str, Any], digest: str) -> None:
    """Write ``root``'s stamp, last: its presence means the writing finished."""
    stamp = {"generator": generator, "version": version, "settings": settings, "settings_hash": digest}
    (root / STAMP_FILE).write_text(json.dumps(stamp, indent=2) + "\n")


def stamped(root: str | Path, digest: str) -> bool:
    """Whether ``root`` holds a stamp with this settings hash."""
    try:
        stamp = json.loads((Path(root) / STAMP_FILE).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(stamp, dict) and stamp.get("settings_hash") == digest


def generated_once(name: str, complete: Callable[[Path], bool], generate: Callable[[Path], Any],
                   cache: Optional[str | Path] = None) -> Path:
    """``CACHE/name``, made by ``generate(folder)`` unless ``complete(CACHE/name)``.

    ``cache`` defaults to vitbench's cache folder (``$VITBENCH_CACHE`` or ``~/.cache/vitbench``).
    A stale or half-written folder is replaced; if another process finishes first, its copy is
    kept and ours discarded."""
    parent = cache_dir(cache)
    target = parent / name
    if complete(target):
        return target
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=parent))
    try:
        generate(tmp)
        os.chmod(tmp, 0o755)  # mkdtemp makes 0700; a cache folder is an ordinary folder
        if target.exists():  # stale or half-written: move it aside, then drop it
            old = Path(tempfile.mkdtemp(prefix=f".{name}.old-", dir=parent))
            try:
                os.replace(target, old / name)
            except FileNotFoundError:  # another process moved it first
                pass
            shutil.rmtree(old, ignore_errors=True)
        try:
            os.rename(tmp, target)
        except OSError:
            if not complete(target):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
