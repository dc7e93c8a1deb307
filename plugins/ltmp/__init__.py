"""LTMP: learned thresholds for token merging and pruning (Bonnaerens & Dambre, 2023;
docs/methods.md, "LTMP").

Every reducing block owns two scalar thresholds, the only parameters that train. After the
attention residual (docs/methods.md, "The hook point") it merges each A token into its most similar B token
(ToMe's bipartite split, cosine of the keys) when the similarity exceeds ``theta_m``, then
prunes tokens whose received attention is at most ``theta_p``. In training tokens are masked,
not removed (straight-through masks, key bias ``log(mask + 1e-6)``) and the loss adds
``lambda * (flops_ratio - target)^2``; at inference tokens are removed and a batch is padded to
its largest count. On Swin (:class:`LTMPTileReducer`) the thresholds act per tile for the MLP.

Parameters: ``target`` (or ``gmacs_fraction`` at matched compute), ``tau``, ``lambda_flops``,
``epochs``, ``lr_merge``, ``lr_prune``, ``max_grad``, ``optimizer``, ``label_smoothing``,
``batch_size``, ``layers``, ``order`` (``bipartite``, the official layout, or ``original``),
``calibrate`` (thresholds scaled onto the budget after training, :mod:`.calibration`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from vitbench.kit import BudgetKnob, MethodSpec, Range, hookimpl, param


_OPTIMIZERS = ("SGD", "AdamW", "Adam")
#: layouts of the tokens after a reducing block (docs/methods.md, "LTMP", "Token layout")
ORDERS = ("bipartite", "original")
#: when the thresholds are calibrated onto the goal after training (docs/methods.md, "LTMP", "Calibration")
CALIBRATIONS = ("matched", "always", "never")


@dataclass(frozen=True)
class LTMPParams:
    """``target``: FLOPs ratio to reach (Swin: a fraction of the counted GMACs); ``tau``: masker
    temperature; ``lambda_flops``: weight of the FLOPs penalty; ``lr_merge``/``lr_prune``:
    learning rates of ``theta_m``/``theta_p``; ``layers``: the blocks that reduce (``None``:
    all); ``order``: the token layout after a reducing block (``"bipartite"``: prefix, set A,
    set B, as the official code; ``"original"``: the original order); ``gmacs_fraction``:
    matched compute (``--match-gmacs F`` sets it to ``F``): the fraction of the model's counted GMACs to reach. ``None``
    (default): the penalty measures the paper's FLOPs ratio against ``target``; set: it measures
    the model's exact cost (:class:`CostModel`, as ``vitbench.measure.count_gmacs`` counts it)
    against ``gmacs_fraction``, and ``target`` is not used. ``max_grad``: the bound on each
    threshold's gradient per step (``None``: unbounded, as the paper), so one step moves a
    threshold by at most ``lr * max_grad`` (docs/methods.md, "LTMP", "Thresholds"). ``calibrate``:
    when the thresholds are scaled onto the goal after training (``matched``: only with
    ``gmacs_fraction`` set; ``always``; ``never``, as the paper)."""

    target: float = param(0.75,
                          "FLOPs ratio to reach (Swin: a fraction of the counted GMACs); unused with gmacs_fraction",
                          range=Range(0, 1, low_open=True), why="the FLOPs ratio")
    tau: float = param(0.1, "temperature of the learned thresholds' maskers", range=Range(0, low_open=True),
                       why="the temperature")
    lambda_flops: float = param(10.0, "weight of the FLOPs penalty", range=Range(0))
    epochs: int = param(1, "fine-tuning epochs of the thresholds", range=Range(1))
    lr_merge: float = param(5e-3, "learning rate of the merging thresholds theta_m", range=Range(0))
    lr_prune: float = param(5e-6, "learning rate of the pruning thresholds theta_p", range=Range(0))
    max_grad: Optional[float] = param(10.0,
                                      "bound on each threshold's gradient per step (None: unbounded, as the paper)",
                                      range=Range(0, low_open=True), why="or None: unbounded")
    optimizer: str = param("SGD", "the fine-tuning's optimizer: SGD, AdamW or Adam", choices=_OPTIMIZERS)
    label_smoothing: float = param(0.1, "label smoothing of the cross-entropy", range=Range(0, 1, high_open=True))
    batch_size: int = param(64, "images per training batch", range=Range(1))
    layers: Optional[tuple[int, ...]] = param(None, "the blocks that reduce (0-based; None: all)", range=Range(0))
    order: str = param("bipartite", "token layout after a reducing block: bipartite (prefix, A, B) or original",
                       choices=ORDERS)
    calibrate: str = param("matched",
                           "after training, scale the thresholds so training images land on the goal: "
                           "matched (at matched compute only), always or never",
                           choices=CALIBRATIONS)
    gmacs_fraction: Optional[float] = param(None,
                                            "fraction of the counted GMACs to reach (--match-gmacs sets it; None: use target)",
                                            range=Range(0, 1, low_open=True),
                                            why="the fraction of the model's GMACs")


@hookimpl
def vitbench_register_methods(register):  # type: ignore[no-untyped-def]
    register(MethodSpec(
        name="ltmp",
        kind="hybrid",
        params=LTMPParams,
        build="vitbench_plugins.ltmp.reduction:build",
        needs=frozenset({"token_steps", "keys"}),
        needs_training=True,
        # matched compute sets gmacs_fraction = F: the penalty then measures the counted cost
        # (CostModel), not the paper's ratio, whose target lands off F (flops_penalty_of)
        budget=BudgetKnob("gmacs_fraction", larger_means="more", mode="fraction"),
        weights="vitbench_plugins.ltmp:weights",  # fine-tuned 1 epoch on the default model's 60,000 images
        description="LTMP: learned per-block thresholds for token merging and pruning "
                    "(trains only the thresholds)",
    ))
