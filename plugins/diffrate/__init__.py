"""DiffRate: prune, then merge, by class attention, with per-block kept counts (Chen et al.,
"DiffRate: Differentiable Compression Rate for Efficient Vision Transformers", ICCV 2023, Sec. 3;
docs/methods.md, "DiffRate").

``diffrate`` (training-free): in each block, after the attention residual, the patch tokens are
ranked by the class token's attention, all but ``prune_kept[l]`` are pruned, and all but
``merge_kept[l]`` of those merge into their most similar kept token (size-weighted). Without
lists the counts follow a constant-``r`` schedule set by ``keep`` and ``merge_share``.
``diffrate-search`` (learnable, backbone frozen) searches the counts with the paper's
differentiable discrete proxy: per-block distributions over candidate rates, straight-through
masks in training, and ``CE + lambda * (gmacs_ratio - F)^2`` on the counted cost
(:class:`SearchCost`); :func:`searched_kept` reads off the counts it found.

Parameters: ``keep``, ``merge_share``, ``prune_kept``, ``merge_kept``; the search:
``gmacs_fraction``, ``lambda_flops``, ``epochs``, ``lr``, ``batch_size``, ``label_smoothing``."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

from vitbench.errors import ParamError
from vitbench.kit import HELP, BudgetKnob, MethodSpec, Range, hookimpl, param


_OPTIMIZERS = ("SGD", "AdamW", "Adam")


def _check_counts(method: str, name: str, counts: Optional[Sequence[int]]) -> None:
    if counts is None:
        return
    if len(counts) == 0:
        raise ParamError(f"{method}.{name}=() is out of range; it must list one count per block")
    for value in counts:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ParamError(f"{method}.{name}={list(counts)} is out of range; every count must be an "
                             f"integer >= 1 (patch tokens kept in that block)")


def check_chain(method: str, prune_kept: Sequence[int], merge_kept: Sequence[int]) -> None:
    """Raise a ParamError unless ``prune_kept[0] >= merge_kept[0] >= prune_kept[1] >= ...``:
    tokens never come back, and a block merges only tokens its pruning kept."""
    if len(prune_kept) != len(merge_kept):
        raise ParamError(f"{method}.prune_kept has {len(prune_kept)} entries and {method}.merge_kept "
                         f"{len(merge_kept)}; both give one count per block")
    for i, (p, m) in enumerate(zip(prune_kept, merge_kept)):
        if m > p:
            raise ParamError(f"{method}.merge_kept[{i}]={m} is out of range; it must be <= "
                             f"prune_kept[{i}]={p} (a block merges among the tokens its pruning kept)")
        if i > 0 and p > merge_kept[i - 1]:
            raise ParamError(f"{method}.prune_kept[{i}]={p} is out of range; it must be <= "
                             f"merge_kept[{i - 1}]={merge_kept[i - 1]} (the tokens block {i} receives: "
                             f"counts never increase)")


def _check_non_increasing(method: str, name: str, counts: Sequence[int]) -> None:
    for i in range(1, len(counts)):
        if counts[i] > counts[i - 1]:
            raise ParamError(f"{method}.{name}[{i}]={counts[i]} is out of range; it must be <= "
                             f"{name}[{i - 1}]={counts[i - 1]} (counts never increase)")


@dataclass(frozen=True)
class DiffRateParams:
    """``keep``: the fraction of patch tokens left after the last block, removed evenly over
    the blocks (the default schedule, :func:`default_schedule`; the budget knob);
    ``merge_share``: the share of each block's removed tokens that merge rather than being
    pruned; ``prune_kept``/``merge_kept``: patch tokens kept after each block's pruning/merging
    (one count per block; given, they replace the default schedule and ``keep`` is not used)."""

    keep: float = param(0.3, "fraction of patch tokens left after the last block, removed evenly over the blocks",
                        range=Range(0, 1, low_open=True))
    merge_share: float = param(0.5, "share of each block's removed tokens that merge rather than being pruned",
                               range=Range(0, 1))
    prune_kept: Optional[tuple[int, ...]] = field(default=None, metadata={HELP: (
        "patch tokens kept after each block's pruning (one per block; replaces keep)")})
    merge_kept: Optional[tuple[int, ...]] = field(default=None, metadata={HELP: (
        "patch tokens kept after each block's merging (one per block; replaces keep)")})

    def __post_init__(self) -> None:
        _check_counts("diffrate", "prune_kept", self.prune_kept)
        _check_counts("diffrate", "merge_kept", self.merge_kept)
        if self.prune_kept is not None and self.merge_kept is not None:
            check_chain("diffrate", self.prune_kept, self.merge_kept)
        elif self.prune_kept is not None:
            _check_non_increasing("diffrate", "prune_kept", self.prune_kept)
        elif self.merge_kept is not None:
            _check_non_increasing("diffrate", "merge_kept", self.merge_kept)


@dataclass(frozen=True)
class DiffRateSearchParams:
    """``gmacs_fraction``: the fraction of the model's counted GMACs the search aims at (the
    budget knob; 0.63 is about the paper's DeiT-S operating point, 2.9 of 4.6 GFLOPs);
    ``lambda_flops``: weight of the penalty ``(gmacs_ratio - gmacs_fraction)^2``;
    the rest: the training stage (only the rate distributions train; the backbone is frozen)."""

    gmacs_fraction: float = param(0.63, "fraction of the model's counted GMACs the search aims at",
                                  range=Range(0, 1, low_open=True), why="the fraction of the model's GMACs")
    lambda_flops: float = param(10.0, "weight of the penalty (gmacs_ratio - gmacs_fraction)^2", range=Range(0))
    epochs: int = param(1, "epochs of the rate search (the backbone is frozen)", range=Range(1))
    lr: float = param(0.05, "learning rate of the rate distributions", range=Range(0, low_open=True))
    optimizer: str = param("Adam", "the search's optimizer: SGD, AdamW or Adam", choices=_OPTIMIZERS)
    batch_size: int = param(64, "images per training batch", range=Range(1))
    label_smoothing: float = param(0.0, "label smoothing of the cross-entropy", range=Range(0, 1, high_open=True))


@hookimpl
def vitbench_register_methods(register):  # type: ignore[no-untyped-def]
    register(MethodSpec(
        name="diffrate",
        kind="hybrid",
        params=DiffRateParams,
        build="vitbench_plugins.diffrate.reduction:build",
        needs=frozenset({"token_steps", "cls_attn"}),
        # the fraction of patch tokens left after the last block: more keep, more GMACs
        budget=BudgetKnob("keep", larger_means="more", low=0.001, high=1.0),
        description="DiffRate: prune then merge by class attention to given per-block kept counts "
                    "(training-free)",
    ))
    register(MethodSpec(
        name="diffrate-search",
        kind="hybrid",
        params=DiffRateSearchParams,
        build="vitbench_plugins.diffrate.reduction:build_search",
        needs=frozenset({"token_steps", "cls_attn"}),
        needs_training=True,
        budget=BudgetKnob("gmacs_fraction", larger_means="more", mode="fraction"),
        description="DiffRate search: learns the per-block prune/merge kept counts to a GMACs fraction "
                    "(differentiable discrete proxy; backbone frozen)",
    ))
