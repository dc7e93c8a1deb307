"""Decode once: an evaluation split after the model's own resize and crop, kept as one uint8 array.

Every configuration of a run or a sweep (each method, budget and seed) reads the same evaluation
images; decoding and resizing a JPEG costs a CPU core milliseconds, the model on a GPU far less.
The first configuration decodes the split (with worker processes) into an entry under
``<cache>/decoded/<key>/``: ``images.u8`` (the images, row after row), ``labels.npy`` and
``meta.json``, and last ``checksum.json`` (their SHA-256); every later one reads it memory-mapped
(:class:`DecodedImages`) once its files match the checksum, else decodes it again. The key hashes
the folder's fingerprint (:mod:`vitbench.data.fingerprint`) with the data-set config (path,
labels, transform, subset), so another input size or crop, or a changed folder, is a new entry.
An entry is written beside its final name and renamed into place whole, under a lock so that two
processes fill it once; a full disk is a :class:`~vitbench.errors.DataError` that leaves nothing
behind. The entries together stay under ``$VITBENCH_DECODED_CACHE_GB`` (default 50; 0 turns the
cache off), the least recently used ones going first; ``$VITBENCH_DECODED_CACHE`` moves them.
docs/measuring.md, "Decode once".
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import secrets
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Optional

import numpy as np
from mmengine.dataset import BaseDataset

from vitbench.core.cache import cache_dir, cache_lock
from vitbench.errors import DataError, ParamError
from vitbench.data.workers import without_worker_traceback
from vitbench.mm.registry import DATASETS

__all__ = ["DecodedEntry", "DecodedImages", "cache_limit_bytes", "clear_entries", "decode_once",
           "decoded_root", "entry_key", "list_entries"]

ENV_LIMIT = "VITBENCH_DECODED_CACHE_GB"
ENV_DIR = "VITBENCH_DECODED_CACHE"
DEFAULT_LIMIT_GB = 50.0
_IMAGES, _LABELS, _META, _USED, _SUMS = "images.u8", "labels.npy", "meta.json", "used", "checksum.json"
_CHECKED = (_IMAGES, _LABELS, _META)
#: entries whose files matched their checksum in this process, with the files' stat stamps then
_verified: dict[Path, tuple] = {}


@dataclass(frozen=True)
class DecodedEntry:
    """One complete entry of the decoded-image cache."""

    path: Path
    images: int
    #: one image's array shape, ``(H, W)`` or ``(H, W, C)``
    shape: tuple[int, ...]
    nbytes: int
    #: when a run last read it (seconds since the epoch)
    last_used: float
    #: the data folder it was decoded from
    source: str

    @property
    def key(self) -> str:
        """The entry's name: the hash of what it was decoded from."""
        return self.path.name


def decoded_root(directory: str | Path | None = None) -> Path:
    """The folder that holds the entries: ``directory/decoded``, else ``$VITBENCH_DECODED_CACHE``,
    else ``decoded/`` in vitbench's cache."""
    if directory is None and os.environ.get(ENV_DIR):
        return Path(os.environ[ENV_DIR]).expanduser()
    return cache_dir(directory) / "decoded"


def cache_limit_bytes() -> int:
    """The entries' size limit in bytes, from ``$VITBENCH_DECODED_CACHE_GB`` (0: no cache)."""
    text = os.environ.get(ENV_LIMIT, "").strip()
    try:
        gb = float(text) if text else DEFAULT_LIMIT_GB
    except ValueError:
        gb = -1.0
    if not 0 <= gb < float("inf"):
        raise ParamError(f"${ENV_LIMIT}={text!r} is not a size; use a number of GB >= 0 (0 turns the "
                         f"decoded-image cache off)")
    return int(gb * 1e9)


def entry_key(dataset_cfg: dict[str, Any], fingerprint: str) -> str:
    """The entry's name for ``dataset_cfg`` (an mm data-set config) on a folder of ``fingerprint``."""
    blob = json.dumps({"format": 1, "dataset": dataset_cfg, "fingerprint": fingerprint}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _read_entry(path: Path) -> Optional[DecodedEntry]:
    """The entry at ``path``, or None when it is incomplete (no checksum, written last) or unreadable."""
    try:
        if not (path / _SUMS).is_file():
            return None
        meta = json.loads((path / _META).read_text())
        used = (path / _USED).stat().st_mtime_ns if (path / _USED).exists() else (path / _META).stat().st_mtime_ns
        return DecodedEntry(path=path, images=int(meta["images"]), shape=tuple(int(n) for n in meta["shape"]),
                            nbytes=int(meta["nbytes"]), last_used=used / 1e9, source=str(meta.get("source", "")))
    except (OSError, ValueError, TypeError, KeyError):
        return None


def _file_sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _stamps(path: Path) -> tuple:
    return tuple((s.st_size, s.st_mtime_ns, s.st_ctime_ns, s.st_ino)
                 for s in (os.stat(path / name) for name in (*_CHECKED, _SUMS)))


def mismatch(path: Path) -> Optional[str]:
    """Why the entry at ``path`` is not what was written (a file that does not match its checksum,
    is missing, or an image array of another size than its metadata says), or None when it is;
    a match is remembered for the process while the files' stat stamps stay the same."""
    try:
        stamps = _stamps(path)
        if _verified.get(path) == stamps:
            return None
        sums = json.loads((path / _SUMS).read_text())
        for name in _CHECKED:
            if not isinstance(sums, dict) or sums.get(name) != _file_sha256(path / name):
                return f"{name} does not match its checksum"
        entry = _read_entry(path)
        if entry is None or (path / _IMAGES).stat().st_size != entry.nbytes or \
                entry.nbytes != entry.images * int(np.prod(entry.shape)):
            return "its metadata does not describe its image array"
    except (OSError, ValueError) as exc:
        return f"it cannot be read ({exc})"
    _verified[path] = stamps
    return None


def list_entries(directory: str | Path | None = None) -> list[DecodedEntry]:
    """The complete entries, least recently used first."""
    return _entries_in(decoded_root(directory))


def _entries_in(root: Path) -> list[DecodedEntry]:
    found = [_read_entry(p) for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")] \
        if root.is_dir() else []
    return sorted((e for e in found if e is not None), key=lambda e: e.last_used)


def clear_entries(directory: str | Path | None = None) -> list[DecodedEntry]:
    """Remove every entry (and any left-over partial one); returns the entries removed."""
    entries = list_entries(directory)
    root = decoded_root(directory)
    if root.is_dir():
        for path in root.iterdir():
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
    return entries


def _evict(root: Path, needed: int, limit: int, note: Callable[[str], None]) -> None:
    """Remove the least recently used entries until ``needed`` more bytes fit under ``limit``."""
    entries = _entries_in(root)
    total = sum(e.nbytes for e in entries)
    for entry in entries:
        if total + needed <= limit:
            break
        note(f"decoded-image cache: removing {entry.key} ({entry.nbytes / 1e9:.2f} GB, least recently used) "
             f"to stay under {limit / 1e9:g} GB")
        shutil.rmtree(entry.path, ignore_errors=True)
        total -= entry.nbytes


def _without_pack(pipeline: Sequence[Any]) -> list[Any]:
    """The pipeline up to (not including) its final ``PackInputs``: what yields the ``img`` array."""
    steps = list(pipeline)
    if steps and isinstance(steps[-1], dict) and str(steps[-1].get("type", "")).endswith("PackInputs"):
        steps = steps[:-1]
    return steps


def _collate(items: list[dict[str, Any]]) -> tuple[np.ndarray, np.ndarray]:
    images = [np.ascontiguousarray(item["img"], dtype=np.uint8) for item in items]
    shapes = {im.shape for im in images}
    if len(shapes) != 1:
        raise DataError(f"the transformed evaluation images differ in shape ({sorted(shapes)[:3]}); "
                        f"they cannot be cached as one array")
    return np.stack(images), np.asarray([int(item["gt_label"]) for item in items], dtype=np.int64)


def _disk_full(path: Path, needed: int, exc: Optional[OSError] = None) -> DataError:
    free = shutil.disk_usage(path).free if path.exists() else 0
    why = "the disk filled while writing" if exc is not None else "there is not enough free disk for"
    return DataError(f"{why} the decoded evaluation images under {path} ({needed / 1e9:.2f} GB needed, "
                     f"{free / 1e9:.2f} GB free); free some space, point $VITBENCH_CACHE elsewhere, or set "
                     f"${ENV_LIMIT}=0 to decode every time instead")


def _not_filled(exc: DataError, note: Callable[[str], None]) -> None:
    """An image that does not decode: no entry, so that each run decodes and records the error."""
    note(f"decoded-image cache: not filled ({without_worker_traceback(str(exc))}); every configuration "
         f"decodes the images itself")


def _fill(entry: Path, dataset_cfg: dict[str, Any], workers: int, limit: int,
          note: Callable[[str], None]) -> Optional[int]:
    """Decode ``dataset_cfg`` into ``entry``; the number of images, or None when it would not fit."""
    from mmengine.registry import DefaultScope
    from torch.utils.data import DataLoader

    with DefaultScope.overwrite_default_scope("mmpretrain"):
        dataset = DATASETS.build({**dataset_cfg, "pipeline": _without_pack(dataset_cfg.get("pipeline", ()))})
    count = len(dataset)
    try:
        first = np.ascontiguousarray(dataset[0]["img"], dtype=np.uint8)
    except DataError as exc:
        return _not_filled(exc, note)
    needed = count * first.nbytes
    if needed > limit:
        note(f"decoded-image cache: {count} images of {first.shape} need {needed / 1e9:.2f} GB, above "
             f"${ENV_LIMIT} ({limit / 1e9:g} GB); every configuration decodes them again")
        return None
    root = entry.parent
    _evict(root, needed, limit, note)
    if shutil.disk_usage(root).free < needed + (64 << 20):
        raise _disk_full(root, needed)
    note(f"decoding {count} evaluation images once into the cache ({needed / 1e9:.2f} GB, {workers} workers)")
    tmp = root / f".{entry.name}.{secrets.token_hex(4)}.tmp"
    labels = np.empty(count, dtype=np.int64)
    try:
        tmp.mkdir()
        loader = DataLoader(dataset, batch_size=64, num_workers=workers, collate_fn=_collate, shuffle=False)
        done = 0
        images_sha = hashlib.sha256()
        with open(tmp / _IMAGES, "wb") as f:
            for images, batch_labels in loader:
                if images.shape[1:] != first.shape:
                    raise DataError(f"the transformed evaluation images differ in shape ({first.shape} and "
                                    f"{images.shape[1:]}); they cannot be cached as one array")
                block = images.tobytes()
                f.write(block)
                images_sha.update(block)
                labels[done:done + len(images)] = batch_labels
                done += len(images)
        np.save(tmp / _LABELS, labels)
        meta = {"images": count, "shape": list(first.shape), "nbytes": needed, "created": time.time(),
                "source": str(dataset_cfg.get("data_root", "")), "dataset": dataset_cfg,
                "classes": list(dataset.metainfo.get("classes") or ())}
        (tmp / _META).write_text(json.dumps(meta, indent=1, default=str) + "\n")
        _mark_used(tmp)
        sums = {_IMAGES: images_sha.hexdigest(), _LABELS: _file_sha256(tmp / _LABELS),
                _META: _file_sha256(tmp / _META)}
        (tmp / _SUMS).write_text(json.dumps(sums, indent=1) + "\n")  # last: an entry without it is incomplete
        if entry.exists():  # a stale or corrupt entry of the same name, found under the lock
            shutil.rmtree(entry)
        os.replace(tmp, entry)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise _disk_full(root, needed, exc) from exc
        raise DataError(f"the decoded-image cache {root} cannot be written ({exc.strerror or exc}); point "
                        f"${ENV_DIR} at a writable folder, or set ${ENV_LIMIT}=0 to decode every time") from exc
    except DataError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        return _not_filled(exc, note)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return count


def decode_once(dataset_cfg: dict[str, Any], fingerprint: str, *, workers: int = 0,
                directory: str | Path | None = None,
                note: Callable[[str], None] = lambda message: None) -> tuple[Optional[dict[str, Any]], int]:
    """The config of a :class:`DecodedImages` data set over ``dataset_cfg``'s images, decoding them
    into the cache first unless an entry exists; and how many images were decoded now (0 on a hit).
    ``(None, 0)`` when the cache is off or the images would not fit under its limit."""
    limit = cache_limit_bytes()
    if limit == 0:
        return None, 0
    pipeline = list(dataset_cfg.get("pipeline", ()))
    entry = decoded_root(directory) / entry_key(dataset_cfg, fingerprint)
    decoded = {"type": "vitbench.DecodedImages", "path": str(entry), "pipeline": pipeline[len(_without_pack(pipeline)):]}
    if _usable(entry, note) is None:
        _creatable(entry.parent)
        with cache_lock(entry, "decoding the evaluation images"):
            if _usable(entry, note) is None:
                count = _fill(entry, dataset_cfg, workers, limit, note)
                return (None, 0) if count is None else (decoded, count)
    _mark_used(entry)
    return decoded, 0


def _usable(entry: Path, note: Callable[[str], None]) -> Optional[DecodedEntry]:
    """The complete entry at ``entry`` whose files match their checksum; None otherwise (a
    corrupt or incomplete one is said in one line and decoded again)."""
    found = _read_entry(entry)
    if found is None:
        if entry.exists():
            note(f"decoded-image cache: entry {entry.name} is incomplete; decoding the images again")
        return None
    why = mismatch(entry)
    if why is not None:
        note(f"decoded-image cache: entry {entry.name} is not what was written ({why}); decoding the images again")
        return None
    return found


def _creatable(root: Path) -> None:
    """Make the entries' folder, or say in one line why it cannot be made or written."""
    try:
        root.mkdir(parents=True, exist_ok=True)
        if not root.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, "not a folder")
        if not os.access(root, os.W_OK | os.X_OK):
            raise PermissionError(errno.EACCES, "not writable")
    except OSError as exc:
        raise DataError(f"the decoded-image cache {root} cannot be used ({exc.strerror or exc}); point "
                        f"${ENV_DIR} at a writable folder, or set ${ENV_LIMIT}=0 to decode every time") from exc


def _mark_used(entry: Path) -> None:
    """Stamp the entry as used now, to the nanosecond (a plain touch takes the kernel's coarse
    clock, so two entries used within a few milliseconds would tie). A cache that cannot be
    written is still read: its entries then only age by when they were made."""
    try:
        (entry / _USED).touch()
        now = time.time_ns()
        os.utime(entry / _USED, ns=(now, now))
    except OSError:
        pass


@DATASETS.register_module()
class DecodedImages(BaseDataset):
    """The images of a decoded-cache entry (memory-mapped, read-only) as an mm data set: each
    item's ``img`` is the array the original pipeline made before ``PackInputs``, its
    ``gt_label`` the original label; ``indices`` selects a subset, as in every mmengine data set."""

    METAINFO: ClassVar[dict[str, Any]] = {}

    def __init__(self, path: str, pipeline: Sequence[Any] = ({"type": "mmpretrain.PackInputs"},),
                 indices: int | Sequence[int] | None = None, **kwargs: Any) -> None:
        entry = _read_entry(Path(path))
        why = "it is missing or incomplete" if entry is None else mismatch(Path(path))
        if why is not None:
            raise DataError(f"decoded-image cache entry {path} cannot be read: {why}; run again to decode "
                            f"the images (or `vitbench cache clear`)")
        self.entry = entry
        meta = json.loads((entry.path / _META).read_text())
        self._images = np.memmap(entry.path / _IMAGES, dtype=np.uint8, mode="r",
                                 shape=(entry.images, *entry.shape))
        self._labels = np.load(entry.path / _LABELS)
        super().__init__(ann_file="", metainfo={"classes": tuple(meta.get("classes") or ())},
                         pipeline=pipeline, indices=indices, test_mode=True, **kwargs)

    def load_data_list(self) -> list[dict]:
        """One small dict per image: its row in the array and its label."""
        return [{"img_index": i, "gt_label": int(label)} for i, label in enumerate(self._labels)]

    def get_data_info(self, idx: int) -> dict:
        """Attach a copy of the image's row (so batches never hold the mapping open)."""
        info = super().get_data_info(idx)
        img = np.array(self._images[info["img_index"]])
        info.update(img=img, img_shape=img.shape[:2], ori_shape=img.shape[:2])
        return info
