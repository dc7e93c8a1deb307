"""What a report row says about itself besides its numbers (docs/measuring.md, "What a row says"):
its label with the method's settings, how many images it was evaluated on, the 95 % interval of
its accuracy and where its weights came from.

A proportion of images (top-1, top-5) gets the Wilson score interval of k correct out of n
images (Wilson, JASA 1927), shown as ``85.50 [80.0, 89.6]``: asymmetric near 0 and 100 %, where
a ± would leave the range. mAP gets none: it is no proportion of images.
"""
from __future__ import annotations

import json
import math
from collections.abc import Mapping
from statistics import NormalDist
from typing import Any, Optional
from vitbench.host import get_host

__all__ = ["TOP5_MIN_CLASSES", "images", "interval_pct", "row_label", "shows_top5", "weights_from", "wilson"]

Record = Mapping[str, Any]

#: top-5 is shown only for rows of at least this many classes (docs/measuring.md, "What a row says")
TOP5_MIN_CLASSES = 50
#: the two-sided 95 % normal quantile
_Z95 = NormalDist().inv_cdf(0.975)


def _int(v: Any) -> Optional[int]:
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def images(rec: Record) -> Optional[int]:
    """The number of images the row's accuracy was evaluated on (``num_images``), else ``None``."""
    n = _int(rec.get("num_images"))
    return n if n is not None and n > 0 else None


def wilson(k: int, n: int, z: float = _Z95) -> tuple[float, float]:
    """The Wilson score interval of ``k`` successes in ``n`` trials, as proportions (0-1)."""
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def interval_pct(pct: Optional[float], n: Optional[int]) -> Optional[tuple[float, float]]:
    """The 95 % Wilson interval (in %) of a percentage of ``n`` images, or ``None`` without both."""
    if pct is None or not n:
        return None
    lo, hi = wilson(round(pct * n / 100), n)
    return 100 * lo, 100 * hi


def shows_top5(rec: Record) -> bool:
    """Whether top-5 means something for the row: its task has :data:`TOP5_MIN_CLASSES` classes or
    more (a record that does not say how many is shown as it is)."""
    n = _int(rec.get("num_classes"))
    return n is None or n >= TOP5_MIN_CLASSES


def weights_from(rec: Record) -> Optional[str]:
    """Where the row's weights came from: the record's ``weights_from``, else what its
    ``measured_on`` weights say (a random init's seed, a checkpoint's sha256), else ``None``."""
    if rec.get("weights_from"):
        return str(rec["weights_from"])
    on = rec.get("measured_on")
    weights = str(on.get("weights") or "") if isinstance(on, Mapping) else ""
    if weights.startswith("init_seed="):
        return f"random init (seed {weights.partition('=')[2]})"
    if weights.startswith("sha256="):
        return f"checkpoint (sha256 {weights.partition('=')[2][:12]})"
    return None


def _value(v: Any) -> str:
    return json.dumps(v, separators=(",", ":"))


def row_label(rec: Record) -> Optional[str]:
    """The record's ``label`` with the settings older records left out: the budget knob (``tome``
    -> ``tome (r=16)``) and a matched budget (``; matched 0.5x GMACs``); ``None`` without a label."""
    label = rec.get("label")
    if not label:
        return None
    label, method, params = str(label), str(rec.get("method")), rec.get("params") or {}
    if method in ("baseline",) or not isinstance(params, Mapping):
        return label
    budget = rec.get("budget") if isinstance(rec.get("budget"), Mapping) else {}
    knob = budget.get("param") or _knob(method)
    name, _, inner = label.partition(" (")
    inner = inner[:-1] if inner.endswith(")") else inner
    parts = [inner] if inner else []
    shown = any(part.startswith(f"{knob}=") for part in inner.replace(";", ",").split(", "))
    if knob and params.get(knob) is not None and not shown:
        parts.insert(0, f"{knob}={_value(params[knob])}")
    text = ", ".join(parts)
    fraction = rec.get("match_gmacs")
    if fraction is not None and "matched" not in text and "x GMACs" not in text:
        text = f"{text}; matched {float(fraction):g}x GMACs" if text else f"matched {float(fraction):g}x GMACs"
    return f"{name} ({text})" if text else name


def _knob(method: str) -> Optional[str]:
    """The budget parameter of ``method`` when a loaded plugin registers it."""
    spec = get_host().catalogs["methods"].get(method)
    budget = getattr(spec, "budget", None)
    return budget.param if budget is not None else None
