"""Token Cropr: token pruning by trained auxiliary selection heads (Bergner et al., *Token Cropr:
Faster ViTs for Quite a Few Tasks*, CVPR 2025; docs/methods.md, "Cropr").

Between every two blocks (before the next block's attention), a selection module -- learned
queries cross-attending to the tokens -- scores them by the summed attention logits and prunes
the ``rate`` lowest-scoring patch tokens (the first module ``rate + 1``); the kept tokens follow
in descending score. In training the module's aggregate of the (detached) tokens feeds an
auxiliary prediction -- the image's class, or with ``aux="patches"`` each patch's (one query per
patch, the paper's dense heads) -- trained with cross-entropy while the whole network fine-tunes;
at inference only the scorer runs. With ``fusion`` (Sec. 3.3) the modules stop two blocks before
the end and the pruned tokens rejoin before the last block, so a dense head reads the whole grid.
Parameters: ``rate`` (the budget knob), ``fusion``, ``aux``, ``queries``, ``heads``,
``mlp_ratio``, ``label_smoothing``, ``epochs``, ``lr``, ``module_lr``, ``weight_decay``,
``batch_size``."""
from __future__ import annotations

from dataclasses import dataclass

from vitbench.kit import BudgetKnob, MethodSpec, Range, hookimpl, param, patch_count


@dataclass(frozen=True)
class CroprParams:
    """``rate``: patch tokens pruned between two blocks (the first module prunes one more);
    ``fusion``: last-layer fusion (the pruned tokens rejoin before the last block); ``aux``: what
    the auxiliary heads predict (``class``: the image's; ``patches``: each patch's); ``queries``/``heads``: the selection module's learned queries and attention heads;
    ``mlp_ratio``: its MLP's width; ``label_smoothing``: of the main and auxiliary losses;
    ``epochs``, ``lr`` (the backbone), ``module_lr`` (the selection modules), ``weight_decay``,
    ``batch_size``: the fine-tuning of the whole network (AdamW, cosine schedule)."""

    rate: int = param(8, "patch tokens pruned between two blocks (the first module prunes one more)", range=Range(0))
    fusion: bool = param(False, "last-layer fusion: the pruned tokens rejoin before the last block "
                               "(the paper's choice for dense tasks)")
    aux: str = param("class", "what each module's auxiliary head predicts: class (the image's label, one query) "
                     "or patches (one query per patch, its class; det/seg on a plain ViT)",
                     choices=("class", "patches"))
    queries: int = param(1, "learned queries of each selection module", range=Range(1))
    heads: int = param(1, "attention heads of each selection module (must divide the width)", range=Range(1))
    mlp_ratio: float = param(4.0, "width of the selection module's MLP, in multiples of the model's",
                             range=Range(0, low_open=True))
    label_smoothing: float = param(0.1, "label smoothing of the main and the auxiliary cross-entropies",
                                   range=Range(0, 1, high_open=True))
    epochs: int = param(1, "fine-tuning epochs of the whole network with the selection modules", range=Range(1))
    lr: float = param(5e-5, "AdamW's peak rate for the backbone (cosine decay)", range=Range(0, low_open=True))
    module_lr: float = param(1e-3, "AdamW's peak rate for the selection modules", range=Range(0, low_open=True))
    weight_decay: float = param(0.05, "AdamW's weight decay", range=Range(0))
    batch_size: int = param(64, "fine-tuning batch size", range=Range(1))


@hookimpl
def vitbench_register_methods(register):  # type: ignore[no-untyped-def]
    register(MethodSpec(
        name="cropr",
        kind="pruning",
        params=CroprParams,
        build="vitbench_plugins.cropr.reduction:build",
        needs=frozenset({"token_steps", "one_width", "before_attention"}),
        needs_training=True,
        # rate tokens pruned per module: counts (and GMACs) follow from it, trained or not
        budget=BudgetKnob("rate", larger_means="less", low=0, high=patch_count, integer=True),
        description="Token Cropr: prune rate tokens between blocks by trained cross-attention selection heads "
                    "(fine-tunes the whole network with their auxiliary losses)",
    ))
