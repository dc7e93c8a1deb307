"""The checks of a benchmark's number options, each written once: :class:`~vitbench.core.options.RunOptions`
applies them to the command line's text and the Python API's values alike, so a bad value fails
with the same one line from both sides (docs/reliability.md)."""
from __future__ import annotations

import math
from typing import Any, Optional

from vitbench.errors import ParamError, choices_error

__all__ = ["DEFAULT_PRECISION", "MAX_BATCH_SIZE", "MAX_REPEATS", "MAX_SEED", "PRECISIONS", "QUICK_REPEATS",
           "check_fraction", "check_precision", "checked_budgets", "checked_integer", "checked_seconds", "checked_seeds",
           "checked_shard", "chosen_repeats"]

#: the largest batch size a timing accepts
MAX_BATCH_SIZE = 2**16
#: ``--precision``: the autocast dtypes of the measured forward (:mod:`vitbench.measure.precision`)
PRECISIONS = ("fp32", "fp16", "bf16")
DEFAULT_PRECISION = "fp32"
#: the repeats of every timing under ``--quick``: a fast look, not for publication
QUICK_REPEATS = 3
#: the most repeats ``--repeats`` takes
MAX_REPEATS = 10_000


def check_precision(name: str) -> str:
    """``name`` when it is a precision, else a clear error listing the valid ones."""
    if name not in PRECISIONS:
        raise choices_error("precision", name, PRECISIONS)
    return name


def chosen_repeats(quick: bool, repeats: Any) -> Optional[int]:
    """The repeats of every timing that ``--quick`` or ``--repeats N`` asks for (1 to
    :data:`MAX_REPEATS`), or None for the task's own; both at once, or a bad N, is a ParamError."""
    if repeats is None:
        return QUICK_REPEATS if quick else None
    if quick:
        raise ParamError(f"--quick and --repeats {repeats} were both given; --quick times with {QUICK_REPEATS} "
                         f"repeats, --repeats N with N: give one of them")
    valid = f"an integer from 1 to {MAX_REPEATS}"
    try:
        number = repeats if isinstance(repeats, int) and not isinstance(repeats, bool) else int(str(repeats).strip())
    except ValueError:
        raise ParamError(f"--repeats {repeats!r} is not an integer; give {valid}") from None
    if not 1 <= number <= MAX_REPEATS:
        raise ParamError(f"--repeats {number} is out of range; give {valid}")
    return number


def checked_integer(flag: str, value: Any, minimum: Optional[int] = None,
                    maximum: Optional[int] = None) -> Optional[int]:
    """``value`` (an int, or the command line's text) as an int within ``[minimum, maximum]``;
    ``None`` stays ``None`` (the option was not given)."""
    if value is None:
        return None
    bounds = (f" from {minimum} to {maximum}" if maximum is not None
              else f" >= {minimum}" if minimum is not None else "")
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ParamError(f"{flag} {value!r} is not an integer; give an integer{bounds}")
    try:
        number = int(value.strip()) if isinstance(value, str) else value
    except ValueError:
        raise ParamError(f"{flag} {value!r} is not an integer; give an integer{bounds}") from None
    if (minimum is not None and number < minimum) or (maximum is not None and number > maximum):
        raise ParamError(f"{flag} {number} is out of range; it must be{bounds}")
    return number


def check_fraction(value: Any, option: str = "--match-gmacs") -> float:
    """``value`` as a float in (0, 1], the fraction of the baseline's GMACs to keep; else a
    :class:`ParamError` naming the value and the valid range."""
    try:
        f = float(value)
    except (TypeError, ValueError):
        raise ParamError(f"{option} {value!r} is not a number; give the fraction of the baseline's "
                         f"GMACs to keep, in (0, 1], e.g. 0.6") from None
    if isinstance(value, bool) or not math.isfinite(f) or not 0.0 < f <= 1.0:
        raise ParamError(f"{option} {value!r} is out of range; the fraction of the baseline's GMACs "
                         f"to keep must be in (0, 1], e.g. 0.6")
    return f


def checked_budgets(value: Any) -> tuple[float, ...]:
    """``"0.9,0.8,0.7"`` (the ``--budgets`` text of ``vitbench sweep``) or a sequence of numbers
    as a tuple of fractions, each in (0, 1], none repeated, at least one."""
    items = [item.strip() for item in value.split(",") if item.strip()] if isinstance(value, str) else list(value)
    if not items:
        raise ParamError(f"--budgets {value!r} is empty; give comma-separated fractions of the "
                         f"baseline's GMACs in (0, 1], e.g. 0.9,0.7,0.5")
    budgets = tuple(check_fraction(item, "--budgets item") for item in items)
    for b in budgets:
        if budgets.count(b) > 1:
            shown = value if isinstance(value, str) else ",".join(map(str, value))
            raise ParamError(f"--budgets names {b:g} twice ({shown}); each budget runs once")
    return budgets


def checked_seconds(flag: str, value: Any) -> Optional[float]:
    """A positive, finite number of seconds (or its text); ``None`` when the option was not given."""
    if value is None:
        return None
    try:
        number = float(value) if not isinstance(value, bool) else float("nan")
    except (TypeError, ValueError):
        number = float("nan")
    if not 0 < number < float("inf"):
        raise ParamError(f"{flag} {value!r} is not a number of seconds > 0; give e.g. {flag} 600")
    return number


def checked_shard(value: Any) -> tuple[int, int]:
    """``--shard I/N`` as ``(I, N)`` with 1 <= I <= N, given as the text ``"2/4"`` or the pair ``(2, 4)``."""
    text = "/".join(map(str, value)) if isinstance(value, (tuple, list)) else str(value)
    head, sep, tail = text.partition("/")
    try:
        index, count = int(head), int(tail)
    except ValueError:
        index = count = 0
    if not sep or count < 1 or not 1 <= index <= count or (isinstance(value, (tuple, list)) and len(value) != 2):
        raise ParamError(f"--shard {text!r} is not I/N with 1 <= I <= N (e.g. 1/4 for the first of four parts)")
    return index, count


#: the largest seed numpy's and torch's generators take (2**32 - 1)
MAX_SEED = 2**32 - 1


def checked_seeds(seeds: Any) -> tuple[int, ...]:
    """The seeds as a tuple, refusing an empty list, a seed outside 0..2**32-1 (numpy's range)
    or a repeated one."""
    seeds = tuple(seeds)
    if not seeds:
        raise ParamError("--seeds is empty; give comma-separated integers >= 0, e.g. 0,1,2")
    for seed in seeds:
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
            raise ParamError(f"seed {seed!r} is out of range; seeds are integers >= 0 and <= {MAX_SEED} (2**32 - 1)")
        if seeds.count(seed) > 1:
            raise ParamError(f"--seeds names seed {seed} twice ({','.join(map(str, seeds))}); "
                             f"each seed runs once")
    return seeds
