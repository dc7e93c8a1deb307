"""Where vitbench keeps what it makes once and reuses: the default model, the embedded data sets,
trained detectors (``$VITBENCH_CACHE``, else ``~/.cache/vitbench``); how it writes files whole
(:func:`atomic_write`, with the mode a plain ``open()`` gives) and how processes that would make
the same entry take turns (:func:`cache_lock`)."""
from __future__ import annotations

import errno
import os
import secrets
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from vitbench.core.files import special_file

__all__ = ["ENV_CACHE", "atomic_write", "cache_dir", "cache_lock"]

#: the environment variable that moves the cache
ENV_CACHE = "VITBENCH_CACHE"


def cache_dir(path: str | Path | None = None) -> Path:
    """Where cached models live: ``path``, else ``$VITBENCH_CACHE``, else ``~/.cache/vitbench``."""
    if path is not None:
        return Path(path).expanduser()
    env = os.environ.get(ENV_CACHE)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "vitbench"


def atomic_write(path: str | os.PathLike[str], write: Callable[[Path], object]) -> Path:
    """Write ``path`` whole or not at all: ``write(tmp)`` fills a new file beside it, which then
    replaces ``path`` (``os.replace``). The file's mode is what ``open(path, "w")`` would give
    (0666 less the umask), not ``tempfile.mkstemp``'s 0600, so a shared folder stays readable.
    A ``path`` that is a pipe or a device is refused (``OSError``), never replaced by a file."""
    path = Path(path)
    kind = special_file(path)
    if kind is not None:
        raise OSError(errno.EINVAL, f"{path} is {kind}, not a regular file; vitbench writes only files", str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _new_file_beside(path)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def _new_file_beside(path: Path) -> Path:
    """A new empty hidden file in ``path``'s folder, created as ``open()`` would (mode 0666 & ~umask)."""
    for _ in range(100):
        tmp = path.parent / f".{path.name}.{secrets.token_hex(4)}.tmp"
        try:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
        except FileExistsError:
            continue
        return tmp
    raise FileExistsError(f"could not create a temporary file beside {path}")


@contextmanager
def cache_lock(path: str | os.PathLike[str], doing: str) -> Iterator[bool]:
    """Hold the lock file ``<path>.lock`` (the ``filelock`` package) while making the cache entry
    ``path``; yields whether another process held it first (then it may have made the entry:
    look again). Waiting, it says once on stderr that it waits for another vitbench process
    ``doing`` (e.g. "training the default model"). Where no lock file can be made (a read-only
    cache), it goes on unlocked: writing the entry then fails with its own error."""
    from filelock import FileLock, Timeout

    lock_path = Path(str(path) + ".lock")
    try:
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(lock_path))
        waited = False
        try:
            lock.acquire(timeout=0)
        except Timeout:
            print(f"vitbench: waiting for another vitbench process {doing} (lock {lock_path})",
                  file=sys.stderr, flush=True)
            waited = True
            lock.acquire()
    except OSError:
        yield False
        return
    try:
        yield waited
    finally:
        lock.release()
