"""How long the rest of a plan will take, from the runs done: a run takes as long as the finished
runs of its kind (the baseline, a method that trains, one that does not); a method run before any
of its kind finished takes the baseline's time plus what the baseline does not do -- its speed-up
timed in turn with the unreduced model, and a learnable method's fine-tuning (docs/measuring.md,
"How long a run takes").
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from statistics import fmean
from typing import Any, Optional

from vitbench.measure.paired import PAIRED_ROUNDS
from vitbench.task import BASELINE

__all__ = ["TRAIN_STEP_FORWARDS", "run_seconds", "seconds_left"]

#: a training image costs about this many evaluation forwards of it (forward, backward, update)
TRAIN_STEP_FORWARDS = 3.0
#: the throughput's repeats, which a run evaluated with ``--limit`` pairs its speed-up over
_LIMIT_ROUNDS = 10

Done = Sequence[tuple[Any, dict]]


def _kind(spec: Any, trains: Callable[[Any], bool]) -> tuple[bool, bool]:
    return spec.method == BASELINE, trains(spec)


def _paired_seconds(spec: Any, baseline: dict) -> float:
    """The speed-up timed in turn with the baseline: each round one forward of either model at the
    batch size, the reduced one counted as long as the unreduced (an upper bound)."""
    throughput = baseline.get("throughput_img_s")
    if "throughput" not in spec.metrics or not throughput:
        return 0.0
    rounds = spec.repeats or (_LIMIT_ROUNDS if spec.limit is not None else PAIRED_ROUNDS)
    return 2 * rounds * spec.batch_size / throughput


def _train_seconds(spec: Any, baseline: dict) -> float:
    """A fine-tuning never seen in this plan: its images (and epochs, where the method has them)
    at the baseline's evaluation pace, :data:`TRAIN_STEP_FORWARDS` forwards an image; 0 where
    either is unknown."""
    pace, images = baseline.get("eval_img_s"), spec.train_limit
    if not pace or not images:
        return 0.0
    return TRAIN_STEP_FORWARDS * images * float(getattr(spec.values, "epochs", 1) or 1) / pace


def run_seconds(spec: Any, done: Done, trains: Callable[[Any], bool]) -> Optional[float]:
    """The seconds ``spec`` will take, from the ``(spec, record)`` pairs ``done`` (successful
    runs only); None before any run finished."""
    ok = [(s, r) for s, r in done if r.get("status") == "ok" and r.get("wall_s") is not None]
    like = [r["wall_s"] for s, r in ok if _kind(s, trains) == _kind(spec, trains)]
    if like:
        return fmean(like)
    baselines = [r for s, r in ok if s.method == BASELINE]
    if not baselines:
        return fmean(r["wall_s"] for _, r in ok) if ok else None
    base = baselines[-1]
    seconds = fmean(r["wall_s"] for r in baselines) + _paired_seconds(spec, base)
    return seconds + (_train_seconds(spec, base) if trains(spec) else 0.0)


def seconds_left(remaining: Sequence[Any], done: Done, trains: Callable[[Any], bool]) -> Optional[float]:
    """The seconds the ``remaining`` specs will take (:func:`run_seconds` each); None when nothing
    finished yet to estimate from."""
    times = [run_seconds(spec, done, trains) for spec in remaining]
    return None if any(t is None for t in times) else sum(t for t in times if t is not None)
