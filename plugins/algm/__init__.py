"""ALGM: adaptive local-then-global token merging (Norouzi et al., *ALGM: Adaptive Local-then-Global
Token Merging for Efficient Semantic Segmentation with Plain Vision Transformers*, CVPR 2024;
docs/methods.md, "ALGM").

Two merges, both where ToMe merges (docs/methods.md, "The hook point"): in an early block each
``window x window`` window of patches whose mean pairwise key similarity reaches ``threshold``
becomes one token (local); halfway through every patch token whose best bipartite partner's
similarity reaches ``global_threshold`` merges into it (global, ToMe's matching). How many merge
follows from the thresholds (the fewest over the batch). On det/seg the tokens are unmerged for
the dense head like every vit-family method's. Training-free by default; with ``epochs`` above 0
the whole network is fine-tuned with the merges in place, as the paper trains its models.

Parameters: ``threshold`` (the budget knob), ``global_threshold``, ``window``, ``local_block``,
``global_block``, ``prop_attn``, ``trace_source``, ``epochs``, ``lr``, ``batch_size``."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from vitbench.errors import ParamError
from vitbench.kit import HELP, BudgetKnob, MethodSpec, Range, hookimpl, param


@dataclass(frozen=True)
class ALGMParams:
    """``threshold``: the local merge's window similarity (and the global one's, unless
    ``global_threshold``); ``window``: the local windows' side; ``local_block``/``global_block``:
    where each merge happens (``None``: halfway, block ``depth // 2 - 1``)."""

    threshold: float = param(0.88, "similarity a 2x2 window (and a global pair) must reach to merge", range=Range(-1, 1))
    global_threshold: Optional[float] = field(default=None, metadata={HELP: (
        "similarity a global pair must reach to merge (None: threshold)")})
    window: int = param(2, "side of the local merge's windows, in patches", range=Range(2))
    local_block: int = param(0, "block whose tokens the local merge reduces", range=Range(0))
    global_block: Optional[int] = field(default=None, metadata={HELP: (
        "block whose tokens the global merge reduces (None: depth // 2 - 1, halfway)")})
    prop_attn: bool = field(default=True, metadata={HELP: "proportional attention: add log(size) to the logits"})
    trace_source: bool = field(default=False, metadata={HELP: "record the patches each token stands for"})
    epochs: int = param(0, "fine-tuning epochs of the whole network, merges in place (0: training-free)",
                        range=Range(0))
    lr: float = param(5e-5, "AdamW's peak rate when fine-tuning (cosine decay)", range=Range(0, low_open=True))
    batch_size: int = param(64, "fine-tuning batch size", range=Range(1))

    def __post_init__(self) -> None:
        if self.global_threshold is not None and not -1.0 <= self.global_threshold <= 1.0:
            raise ParamError(f"algm.global_threshold={self.global_threshold} is out of range; it must be in "
                             f"[-1, 1] (a cosine similarity), or None for threshold")
        if self.global_block is not None and (isinstance(self.global_block, bool) or self.global_block < 0):
            raise ParamError(f"algm.global_block={self.global_block!r} is out of range; it must be an integer "
                             f">= 0, or None for halfway")


@hookimpl
def vitbench_register_methods(register):  # type: ignore[no-untyped-def]
    register(MethodSpec(
        name="algm",
        kind="merging",
        params=ALGMParams,
        build="vitbench_plugins.algm.reduction:build",
        needs=frozenset({"token_steps", "patch_grid"}),
        trains_when="epochs",
        # a higher similarity threshold merges fewer tokens: more GMACs
        budget=BudgetKnob("threshold", larger_means="more", low=-1.0, high=1.0),
        description="ALGM: merge similar 2x2 windows early, then similar pairs globally halfway",
    ))
