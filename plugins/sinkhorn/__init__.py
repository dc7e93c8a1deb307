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

from dataclasses import dataclass, field

from vitbench.catalog import HELP, BudgetKnob, MethodSpec
from vitbench.errors import ParamError
from vitbench.hookspecs import hookimpl


@dataclass(frozen=True)
class SinkhornParams:
    """``keep``: centres per listed block as a fraction of its patch tokens; ``layers``: the
    blocks that cluster; ``eps``: the entropic regularisation (official code: 1.0); ``iters``:
    Sinkhorn iterations (official: 3); ``epochs``, ``lr``, ``batch_size``: the training of the
    centres (AdamW, cosine schedule)."""

    keep: float = field(default=0.5, metadata={HELP: "centres per listed block, as a fraction of its patch tokens"})
    layers: tuple[int, ...] = field(default=(3, 6, 9), metadata={HELP: "the blocks that cluster (0-based)"})
    eps: float = field(default=1.0, metadata={HELP: (
        "entropic regularisation of the Sinkhorn assignment (official code: 1.0)")})
    iters: int = field(default=3, metadata={HELP: "Sinkhorn iterations (official code: 3)"})
    epochs: int = field(default=1, metadata={HELP: "training epochs of the centres (AdamW, cosine schedule)"})
    lr: float = field(default=1e-2, metadata={HELP: "learning rate of the centres"})
    batch_size: int = field(default=64, metadata={HELP: "images per training batch"})

    def __post_init__(self) -> None:
        if not 0.0 < self.keep <= 1.0:
            raise ParamError(f"sinkhorn.keep={self.keep} is out of range; it must be in (0, 1]")
        if any(layer < 0 for layer in self.layers):
            raise ParamError(f"sinkhorn.layers={list(self.layers)}: block indices are >= 0")
        if len(set(self.layers)) != len(self.layers):
            raise ParamError(f"sinkhorn.layers={list(self.layers)} is out of range; each block may be listed once")
        if not self.eps > 0.0:
            raise ParamError(f"sinkhorn.eps={self.eps} is out of range; it must be > 0")
        if self.iters < 1:
            raise ParamError(f"sinkhorn.iters={self.iters} is out of range; it must be an integer >= 1")
        if self.epochs < 1:
            raise ParamError(f"sinkhorn.epochs={self.epochs} is out of range; it must be >= 1")
        if not self.lr > 0.0:
            raise ParamError(f"sinkhorn.lr={self.lr} is out of range; it must be > 0")
        if self.batch_size < 1:
            raise ParamError(f"sinkhorn.batch_size={self.batch_size} is out of range; it must be >= 1")


@hookimpl
def vitbench_register_methods(register):  # type: ignore[no-untyped-def]
    register(MethodSpec(
        name="sinkhorn",
        kind="merging",
        params=SinkhornParams,
        build="vitbench_plugins.sinkhorn.reduction:build",
        families=("vit",),
        needs_training=True,
        # the fraction of patch tokens kept (as centres) per listed block: the counts (and GMACs)
        # are fixed by it, trained or not, so the knob can be searched on the untrained model
        budget=BudgetKnob("keep", larger_means="more", low=0.001, high=1.0),
        description="Sinkhorn: soft clustering merge of the patch tokens onto learned centres at listed blocks "
                    "(Sinkhorn-Knopp assignment; trains the centres)",
    ))
