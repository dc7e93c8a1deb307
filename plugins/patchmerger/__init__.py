"""PatchMerger: a learned layer that merges the patch tokens into ``M`` tokens once, in the middle
of the network (Renggli et al., *Learning to Merge Tokens in Vision Transformers*, arXiv
2202.12015, 2022, Sec. 2; docs/methods.md, "PatchMerger").

The merger holds ``M`` learned queries ``W [M, C]``. Output token ``j`` is the average of the
``N`` patch tokens ``X`` weighted by ``softmax_i(W_j . LayerNorm(X_i))``: ``Y = softmax(W
LN(X)^T) X``, the weights of each output summing to 1 over the input tokens. Every later block
runs on the prefix tokens plus ``M``. It is trained with the backbone frozen (default) or with
it (``--train-backbone``).

Choices (docs/methods.md, "PatchMerger"): it runs in block ``layer`` after the attention, before the MLP
(vitbench's one hook point; the paper merges between two blocks); prefix tokens are neither
merged nor queries; no proportional attention.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from vitbench.errors import ParamError
from vitbench.kit import HELP, BudgetKnob, MethodSpec, Range, hookimpl, param, patch_count


@dataclass(frozen=True)
class PatchMergerParams:
    """``tokens``: the output token count ``M``; ``layer``: the block whose MLP and later blocks see
    ``M`` tokens (``None``: ``depth // 2 - 1``, the middle); ``epochs``, ``lr``, ``weight_decay``,
    ``batch_size``: the fine-tuning of the merger (AdamW, cosine schedule)."""

    tokens: int = field(default=8, metadata={HELP: "the output token count M"})
    layer: Optional[int] = field(default=None, metadata={HELP: (
        "the block whose MLP and later blocks see M tokens (None: the middle, depth // 2 - 1)")})
    epochs: int = param(1, "fine-tuning epochs of the merger (AdamW, cosine schedule)", range=Range(1))
    lr: float = param(1e-3, "fine-tuning learning rate", range=Range(0, low_open=True))
    weight_decay: float = param(0.0, "fine-tuning weight decay", range=Range(0))
    batch_size: int = param(64, "images per training batch", range=Range(1))

    def __post_init__(self) -> None:
        if not isinstance(self.tokens, int) or isinstance(self.tokens, bool) or self.tokens < 1:
            raise ParamError(f"patchmerger.tokens={self.tokens!r} is out of range; the output token count "
                             f"must be an integer >= 1 (and at most the model's patch count)")
        if self.layer is not None and (not isinstance(self.layer, int) or self.layer < 0):
            raise ParamError(f"patchmerger.layer={self.layer!r} is out of range; it is a block index >= 0")


@hookimpl
def vitbench_register_methods(register):  # type: ignore[no-untyped-def]
    register(MethodSpec(
        name="patchmerger",
        kind="merging",
        params=PatchMergerParams,
        build="vitbench_plugins.patchmerger.reduction:build",
        needs=frozenset({"token_steps", "one_width"}),
        needs_training=True,
        # M output tokens: the counts (and GMACs) are fixed by M, trained or not
        budget=BudgetKnob("tokens", larger_means="more", low=1, high=patch_count, integer=True),
        description="PatchMerger: a learned layer merges the patches into M tokens in the middle "
                    "of the network (trains the merger)",
    ))
