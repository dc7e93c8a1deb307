"""Sinkhorn token clustering, learned (Haurum et al., *Which Tokens to Use? Investigating Token
Reduction in Vision Transformers*, ICCV Workshops 2023, Sec. 3; its official code's
``models/sinkhorn.py``; the algorithm: Sinkhorn-Knopp entropic transport, Cuturi 2013;
docs/methods.md, "Sinkhorn").

At each listed block (after the attention residual, docs/methods.md, "The hook point") the ``N_p`` patch tokens
become ``M`` tokens, one per learned centre: the cosine similarities of tokens and unit-norm
centres, divided by ``eps``, are the log-kernel of ``iters`` log-domain Sinkhorn iterations
between uniform marginals (each token ``1/N_p``, each centre ``1/M``); each token's transport
row, summing to 1, gives its shares, and each new token is the share- and size-weighted mean
of the patches. ``M = ceil(keep * M_prev)`` per listed block; ``keep = 1`` changes nothing.

Parameters: ``keep``, ``layers``, ``eps``, ``iters``, ``epochs``, ``lr``, ``batch_size``."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from vitbench.errors import ParamError
from vitbench.kit import BudgetKnob, MethodSpec, Range, hookimpl, param


@dataclass(frozen=True)
class SinkhornParams:
    """``keep``: centres per listed block as a fraction of its patch tokens; ``layers``: the
    blocks that cluster; ``eps``: the entropic regularisation (official code: 1.0); ``iters``:
    Sinkhorn iterations (official: 3); ``epochs``, ``lr``, ``batch_size``: the training of the
    centres (AdamW, cosine schedule)."""

    keep: float = param(0.5, "centres per listed block, as a fraction of its patch tokens",
                        range=Range(0, 1, low_open=True))
    layers: Optional[tuple[int, ...]] = param(None, "the blocks that cluster (0-based); None: a quarter, half and three quarters of the depth ((3, 6, 9) of 12)", range=Range(0))
    eps: float = param(1.0, "entropic regularisation of the Sinkhorn assignment (official code: 1.0)",
                       range=Range(0, low_open=True))
    iters: int = param(3, "Sinkhorn iterations (official code: 3)", range=Range(1))
    epochs: int = param(1, "training epochs of the centres (AdamW, cosine schedule)", range=Range(1))
    lr: float = param(1e-2, "learning rate of the centres", range=Range(0, low_open=True))
    batch_size: int = param(64, "images per training batch", range=Range(1))

    def __post_init__(self) -> None:
        if self.layers is not None and len(set(self.layers)) != len(self.layers):
            raise ParamError(f"sinkhorn.layers={list(self.layers)} is out of range; each block may be listed once")


@hookimpl
def vitbench_register_methods(register):  # type: ignore[no-untyped-def]
    register(MethodSpec(
        name="sinkhorn",
        kind="merging",
        params=SinkhornParams,
        build="vitbench_plugins.sinkhorn.reduction:build",
        needs=frozenset({"token_steps", "one_width"}),
        needs_training=True,
        # the fraction of patch tokens kept (as centres) per listed block: the counts (and GMACs)
        # are fixed by it, trained or not, so the knob can be searched on the untrained model
        budget=BudgetKnob("keep", larger_means="more", low=0.001, high=1.0),
        description="Sinkhorn: soft clustering merge of the patch tokens onto learned centres at listed blocks "
                    "(Sinkhorn-Knopp assignment; trains the centres)",
    ))
