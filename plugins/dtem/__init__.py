"""DTEM: decoupled token embedding for merging (Lee & Hong, *Learning to Merge Tokens via
Decoupled Embedding for Efficient Vision Transformers*, NeurIPS 2024, Sec. 3; docs/methods.md, "DTEM").

Each block gets a small embedding module, a linear map of the attention's input (its gradient
never reaches the backbone), whose output replaces the keys as ToMe's merging metric.
Inference (Sec. 3, discretised) is ToMe's bipartite soft matching on that metric, ``r`` tokens per
block. Training (Sec. 3, continuous relaxation) keeps every token: a soft top-``r`` over each A
token's ``k2`` most similar B tokens (temperatures ``tau1``, ``tau2``) gives soft assignments,
B tokens take the size-weighted share of their A partners, A tokens lose that share of their
size, the tokens are sorted by size and the last ``r`` stop taking part in later matchings.
The backbone is frozen (the paper's modular training) unless ``--train-backbone``.

Choices (docs/methods.md, "DTEM"): ``init="keys"`` (default) adds the embedding to the head-averaged
keys with a zero-initialised map, so an untrained DTEM is exactly ToMe; ``init="random"`` is
the official code's fresh linear layer. Sizes are floored at float eps in training.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Union

from vitbench.errors import ParamError
from vitbench.kit import HELP, BudgetKnob, MethodSpec, Range, hookimpl, param, patch_count

#: how the embedding starts: ``keys`` (the head-averaged keys plus a zero map: ToMe) or ``random``
INITS = ("keys", "random")


@dataclass(frozen=True)
class DTEMParams:
    """``r``: tokens merged per block (an int, a per-block list, or ``(r, inflect)`` as ToMe's);
    ``feat_dim``: the embedding's width (``None``: the head width, twice that from width 1024 on,
    as the official code); ``init``: one of :data:`INITS`; ``k2``: B candidates per A token in
    the soft grouping; ``tau1``, ``tau2``: its similarity and top-k temperatures; ``epochs``,
    ``lr``, ``weight_decay``, ``batch_size``: the fine-tuning (AdamW, cosine schedule)."""

    r: Union[int, list[int], tuple[int, float]] = field(default=16, metadata={HELP: (
        "tokens merged per block: one int, one per block, or (r, inflect) for a linear schedule")})
    feat_dim: Optional[int] = param(None,
                                    "width of the learned merging embedding (None: the head width, doubled from width 1024)",
                                    range=Range(1))
    init: str = param("keys", "how the embedding starts: keys (the attention's keys) or random", choices=INITS)
    k2: int = param(3, "B candidates per A token in the soft grouping", range=Range(1))
    tau1: float = param(0.1, "temperature of the soft grouping's similarity", range=Range(0, low_open=True),
                        why="the temperature")
    tau2: float = param(0.1, "temperature of the soft grouping's top-k", range=Range(0, low_open=True),
                        why="the temperature")
    epochs: int = param(1, "fine-tuning epochs (AdamW, cosine schedule)", range=Range(1))
    lr: float = param(1e-4, "fine-tuning learning rate", range=Range(0, low_open=True))
    weight_decay: float = param(1e-4, "fine-tuning weight decay", range=Range(0))
    batch_size: int = param(64, "images per training batch", range=Range(1))
    trace_source: bool = field(default=False, metadata={HELP: "record the patches each token stands for"})

    def __post_init__(self) -> None:
        values = [self.r] if isinstance(self.r, int) else list(self.r)
        if isinstance(self.r, tuple):
            if len(self.r) != 2 or not isinstance(self.r[0], int):
                raise ParamError(f"dtem.r={self.r!r}: a schedule is (r, inflect), e.g. (13, -0.5)")
            values = [self.r[0]]
        if any(not isinstance(v, int) or isinstance(v, bool) or v < 0 for v in values):
            raise ParamError(f"dtem.r={self.r!r} is out of range; r must be an integer >= 0 "
                             f"(or a list of them, one per block)")


@hookimpl
def vitbench_register_methods(register):  # type: ignore[no-untyped-def]
    register(MethodSpec(
        name="dtem",
        kind="merging",
        params=DTEMParams,
        build="vitbench_plugins.dtem.reduction:build",
        needs=frozenset({"token_steps", "one_width", "input"}),
        needs_training=True,
        # r tokens merged per block, as ToMe's: the counts (and GMACs) do not depend on training
        budget=BudgetKnob("r", larger_means="less", low=0, high=patch_count, integer=True, per_block=True),
        description="DTEM: ToMe's merging on a learned, decoupled embedding per block "
                    "(trains the embeddings through a soft, differentiable merge)",
    ))
