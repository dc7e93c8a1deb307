"""ATS: adaptive token sampling, training-free (Fayyaz et al., "Adaptive Token Sampling for
Efficient Vision Transformers", ECCV 2022, Sec. 3; docs/methods.md, "ATS").

At each listed block (after the attention residual, docs/methods.md, "The hook point"), per image: the patch
tokens are scored by the class token's attention times the value norm (Sec. 3.1, the ``cls-attn``
scorer), the scores' CDF is inverted at ``K`` fixed midpoints ``(i - 1/2) / K`` (Sec. 3.2), and each
token drawn at least once is kept, so the count adapts per image. The prefix tokens stay first;
a batch with different counts is padded (value 0, size 0, key bias ``-inf``), so every image
gets the output it gets alone. GMACs are counted at batch 1 and are input-dependent.

Parameters: ``keep`` (``K = ceil(keep * N_p0)`` of the model's patch count; ``1`` is the paper's
setting and not a no-op), ``layers`` (default ``(3, ..., 11)``, the official DeiT-S setting;
``()`` switches it off)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from vitbench.kit import BudgetKnob, MethodSpec, Range, hookimpl, param


#: the largest ``keep``: eight sample points per original patch
MAX_KEEP = 8.0


@dataclass(frozen=True)
class ATSParams:
    """``keep``: sample points ``K = ceil(keep * N_p0)`` per listed block (``N_p0`` the model's
    patch count; 1.0 = the paper's DeiT-S setting); ``layers``: the blocks that sample."""

    keep: float = param(1.0,
                        "sample points K = ceil(keep * patches) per listed block (1.0: the paper's DeiT-S setting)",
                        range=Range(0, MAX_KEEP, low_open=True),
                        why="sample points per original patch token; 1 = the paper's setting")
    layers: Optional[tuple[int, ...]] = param(None, "the blocks that sample (0-based); None: every block from a quarter of the depth on ((3, ..., 11) of 12)", range=Range(0))


@hookimpl
def vitbench_register_methods(register):  # type: ignore[no-untyped-def]
    register(MethodSpec(
        name="ats",
        kind="pruning",
        params=ATSParams,
        build="vitbench_plugins.ats.reduction:build",
        needs=frozenset({"token_steps", "cls_attn"}),
        # sample points per original patch: more points, fewer duplicates, more tokens kept
        budget=BudgetKnob("keep", larger_means="more", low=0.001, high=MAX_KEEP),
        description="ATS: adaptive token sampling, inverse-transform sampling of the cls-attn CDF; "
                    "a variable number of tokens per image (training-free)",
    ))
