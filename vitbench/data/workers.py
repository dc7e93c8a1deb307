"""How many loader worker processes a data set gets: ``--workers N``, else a share of the usable
cores for data that must be decoded, none for data already in memory (Fashion-MNIST, the decoded
cache), where a worker would only add a process."""
from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, Optional

from vitbench.errors import ParamError

__all__ = ["IN_MEMORY", "bounded_workers", "loader_settings", "usable_cores", "without_worker_traceback",
           "workers_for"]

#: data-set types whose items are rows of an array in memory: nothing to decode
IN_MEMORY = frozenset({"vitbench.OfflineFashionMNIST", "vitbench.DecodedImages"})
#: at most this many workers by default (more rarely pays for its memory)
MOST_BY_DEFAULT = 8


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity mask, else the machine's)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def bounded_workers(requested: Optional[int], note: Callable[[str], None] = lambda message: None) -> Optional[int]:
    """``--workers`` checked (an integer >= 0) and lowered to the usable cores, saying so in
    ``note``: a worker per core already keeps them busy, and each one more holds a process and
    its memory (``--workers 100000`` started processes until the host ran out of memory)."""
    if requested is None:
        return None
    if isinstance(requested, bool) or not isinstance(requested, int) or requested < 0:
        raise ParamError(f"--workers must be an integer >= 0, got {requested!r}")
    cores = usable_cores()
    if requested > cores:
        note(f"--workers {requested} lowered to {cores}, the CPU cores this process may use")
        return cores
    return requested


def workers_for(dataset: dict[str, Any], requested: Optional[int] = None) -> int:
    """``requested`` (``--workers``, at most the usable cores: :func:`bounded_workers`) when given,
    else 0 for in-memory data and half the usable cores (1 to 8) for data that is decoded: the
    other half runs the model."""
    if requested is not None:
        return bounded_workers(requested)  # type: ignore[return-value]
    if dataset.get("type") in IN_MEMORY:
        return 0
    return max(1, min(MOST_BY_DEFAULT, usable_cores() // 2))


def loader_settings(workers: int, device: str = "cpu", *, persistent: bool = False) -> dict[str, Any]:
    """A dataloader config's worker keys: with ``persistent``, workers kept alive across the epochs
    of one training stage (a one-pass loader would only wait for them to stop when released);
    pinned memory on CUDA (batches then copy to the device without blocking)."""
    return {"num_workers": workers, "persistent_workers": persistent and workers > 0,
            "pin_memory": str(device).startswith("cuda")}


def without_worker_traceback(message: str) -> str:
    """The error's own message when a loader worker raised it: torch re-raises it in the main
    process as ``Caught X in DataLoader worker process N.`` followed by the worker's traceback,
    whose last line is ``module.X: <the message>``; other messages are returned as they are."""
    if not message.startswith("Caught ") or "Original Traceback" not in message:
        return message
    last = message.rstrip().splitlines()[-1]
    head, sep, text = last.partition(": ")
    return text if sep and " " not in head else last
