"""Built-in token significance scorers (docs/methods.md, "Token scorers"; the PPT thesis' score functions).

A scorer maps one block's attention to a significance per patch token ``[B, N - prefix]``,
normalised to sum 1 per image. Attention probabilities include proportional attention, i.e.
they are exactly the probabilities the block used.

- ``cls-attn`` (ATS; the thesis' baseline): ``s_j = (sum_h A[h,0,j]) * ||V_j||_2`` with ``V_j``
  the value of token j over all heads concatenated.
- ``entropy`` (the thesis' "diversity"): ``s_j = mean_h(-sum_t A[h,j,t] log(A[h,j,t]+eps)) * ||V_j||``.
- ``average`` (the thesis' "average attention"): ``s_j = mean_h A[h,0,j]`` (no value norm).
"""
from __future__ import annotations

from vitbench.kit import ScorerSpec, hookimpl

_CODE = "vitbench.kit.scores"  # the score functions, imported when a scorer is asked for


@hookimpl
def vitbench_register_scorers(register):  # type: ignore[no-untyped-def]
    register(ScorerSpec("cls-attn", f"{_CODE}:cls_attn_score", frozenset({"cls_attn", "values"}),
                        "ATS: cls attention (sum over heads) x value norm"))
    register(ScorerSpec("entropy", f"{_CODE}:entropy_score", frozenset({"attn", "values"}),
                        "entropy of each token's attention row x value norm"))
    register(ScorerSpec("average", f"{_CODE}:average_score", frozenset({"cls_attn"}),
                        "cls attention averaged over heads"))
