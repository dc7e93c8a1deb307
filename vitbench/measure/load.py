"""The machine's load around a timing, and the wait for a quiet machine before one: a timed
section starts once the 1-minute load average is at most the usable cores plus
:data:`LOAD_MARGIN`, waiting at most :data:`WAIT_LIMIT_S` (docs/measuring.md, "Honest timings").
"""
from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Optional

import torch

from vitbench.core import progress
from vitbench.data.workers import usable_cores

__all__ = ["LOAD_MARGIN", "WAIT_LIMIT_S", "MachineLoad", "machine_load", "wait_for_quiet", "waiting",
           "waiting_on"]

#: a timing whose 1-minute load average before or after exceeds the usable cores by more than this is marked
LOAD_MARGIN = 0.5
#: the longest a timed section waits for a quiet machine (seconds)
WAIT_LIMIT_S = 60.0
#: how often the load average is read while waiting (seconds)
POLL_S = 2.0


@dataclass(frozen=True)
class MachineLoad:
    """The 1-minute load average (None where the OS has none), usable cores and torch threads."""

    load_1min: Optional[float]
    cores: int
    threads: int

    @property
    def busy(self) -> bool:
        """More runnable threads than the cores plus :data:`LOAD_MARGIN` (never, where unknown)."""
        return self.load_1min is not None and self.load_1min > self.cores + LOAD_MARGIN


def machine_load() -> MachineLoad:
    """Read the load average, cores and torch threads now."""
    try:
        load: Optional[float] = float(os.getloadavg()[0])
    except (AttributeError, OSError):  # Windows; an unreadable /proc/loadavg
        load = None
    return MachineLoad(load, usable_cores(), torch.get_num_threads())


#: whether timed sections wait (a run turns it on, :func:`waiting`), and whether a wait of this run ran out
_WAITING = {"on": False, "gave_up": False}


@contextlib.contextmanager
def waiting(on: bool) -> Iterator[None]:
    """Within the block, timed sections wait for a quiet machine when ``on`` (a run's setting);
    a wait that ran out is not repeated until the block ends (the machine stays busy; the
    report's marks say so)."""
    saved = dict(_WAITING)
    _WAITING.update(on=on, gave_up=False)
    try:
        yield
    finally:
        _WAITING.update(saved)


def waiting_on() -> bool:
    """Whether timed sections wait now (inside a run's :func:`waiting` block)."""
    return _WAITING["on"]


def _say(text: str) -> None:
    if not progress.say(f"vitbench: {text}"):
        print(f"vitbench: {text}", file=sys.stderr)


def wait_for_quiet(what: str, *, read: Optional[Callable[[], MachineLoad]] = None,
                   sleep: Callable[[float], None] = time.sleep,
                   clock: Callable[[], float] = time.monotonic) -> float:
    """Wait until the machine is not :attr:`~MachineLoad.busy` before timing ``what``, at most
    :data:`WAIT_LIMIT_S`, saying so on the progress line; the seconds waited (0 when it was quiet,
    waiting is off, or an earlier wait of this run ran out)."""
    if not _WAITING["on"] or _WAITING["gave_up"]:
        return 0.0
    read = read or machine_load
    load = read()
    if not load.busy:
        return 0.0
    start = clock()
    _say(f"waiting for a quiet machine before {what}: load average {load.load_1min:.2f} above "
                  f"{load.cores} cores + {LOAD_MARGIN:g} (at most {WAIT_LIMIT_S:.0f} s; --no-wait: not)")
    while load.busy and clock() - start < WAIT_LIMIT_S:
        sleep(POLL_S)
        load = read()
    if load.busy:
        _WAITING["gave_up"] = True
        _say(f"the machine stayed busy (load average {load.load_1min:.2f}); timing anyway, marked")
    return clock() - start
