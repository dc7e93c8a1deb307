"""A compute budget over channel keep/drop decisions (DCS, docs/methods.md, "DCS").

The user states a budget: the fraction of the baseline's counted GMACs the searched model may
keep. :class:`ComputeBudget` is the model's :class:`~vitbench.kit.cost.CostModel` (the fixed part
counted, the channel reducers' part by formula) and :func:`enforce_budget` the rule the shrink
applies. A channel reducer offers ``block_macs(keep)`` (its part at a 0/1 decision ``keep [C]``,
or as it is now with ``None``), ``baseline_macs()``, ``snapshot_shape()`` (fix the last forward's
shapes as the ones costed), ``hard_decision()`` and ``budget_units()`` (what the budget may drop,
least important first).
"""
from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
from torch import nn

from vitbench.errors import ParamError
from vitbench.kit.cost import CostModel, Macs, counted_fixed

__all__ = ["BudgetResult", "ComputeBudget", "enforce_budget"]

log = logging.getLogger("vitbench.dcs")


@dataclass
class ComputeBudget(CostModel):
    """The counted cost model of one patched model and the budget it must meet (MACs per image).

    ``fixed``: counted MACs of everything the decisions do not change; ``baseline``: counted MACs
    of the unpatched model (``fixed`` plus every reducer's ``baseline_macs``); ``budget``: the
    fraction of ``baseline`` the searched model may keep; ``reducers``: the channel reducers whose
    decisions the terms are of, in block order."""

    budget: float
    fixed: float
    baseline: float
    reducers: tuple[Any, ...] = field(default=(), repr=False, compare=False)

    @property
    def full(self) -> float:
        """The unpatched model's MACs: :attr:`baseline`."""
        return self.baseline

    @property
    def target(self) -> float:
        """The MACs per image the searched model may keep: ``budget * baseline``."""
        return self.budget * self.baseline

    @classmethod
    def measure(cls, model: nn.Module, image: torch.Tensor, reducers: Sequence[Any], budget: float,
                method: str = "dcs") -> "ComputeBudget":
        """Count ``model`` (the patched model, architecture as it is now) on ``image [1, C, H, W]``
        and build the cost model; raises :class:`ParamError` when even dropping every gated
        channel would not reach ``budget``."""
        reducers = tuple(reducers)

        def modelled() -> float:
            for reducer in reducers:
                reducer.snapshot_shape()
            return sum(float(r.block_macs(None)) for r in reducers)

        fixed = counted_fixed(model, image, modelled)
        cost = cls(budget=budget, fixed=fixed, baseline=fixed + sum(float(r.baseline_macs()) for r in reducers),
                   reducers=reducers)
        floor = cost.floor()
        if floor > cost.target:
            raise ParamError(
                f"{method}.budget={budget:g} cannot be met on this model: dropping every channel "
                f"{method} may drop still leaves {floor / cost.baseline:.3f} of the baseline's "
                f"{cost.baseline / 1e9:.4g} GMACs; valid: {floor / cost.baseline:.3f} <= budget <= 1")
        return cost

    def terms(self, decisions: Sequence[Optional[torch.Tensor]]) -> Iterator[Macs]:
        """Each reducer's ``block_macs`` at its decision (``None``: its current architecture)."""
        return (reducer.block_macs(keep) for reducer, keep in zip(self.reducers, decisions))

    def macs(self, decisions: Sequence[Optional[torch.Tensor]]) -> torch.Tensor:
        """``fixed + sum(block_macs(decision))``: the counted MACs per image at ``decisions`` (one
        per reducer, ``None`` for its current architecture), differentiable through them."""
        total = super().macs(decisions)
        return total if isinstance(total, torch.Tensor) else torch.tensor(float(total))

    def floor(self) -> float:
        """The least cost the decisions can reach: every gated channel dropped."""
        return self.fixed + sum(float(r.block_macs(_none_kept(r))) for r in self.reducers)

    def current(self) -> float:
        """The counted MACs per image of the architecture as it is now."""
        return float(self.macs([None] * len(self.reducers)))


def _none_kept(reducer: Any) -> Optional[torch.Tensor]:
    keep = reducer.hard_decision()
    return None if keep is None else torch.zeros_like(keep)


@dataclass(frozen=True)
class BudgetResult:
    """What :func:`enforce_budget` decided: the kept channels per reducer (``None``: not gated),
    the searched cost, the cost after enforcing, how many channels the budget dropped beyond
    the search's own decision."""

    keep: list[Optional[torch.Tensor]]
    searched_macs: float
    final_macs: float
    extra_dropped: int


def enforce_budget(cost: ComputeBudget, reducers: Sequence[Any], method: str = "dcs") -> BudgetResult:
    """The search's hard decisions (``reducer.hard_decision()``: ``alpha > 0``), made to fit the
    budget: while the counted cost exceeds ``cost.target``, the least important unit still
    holding a kept channel is dropped, over all blocks -- a unit is what a reducer's
    ``budget_units()`` offers, ``(score, channel indices)``: one channel scored by its ``alpha``
    on a ViT MLP, a LiteMLA head pair scored by its mean ``alpha`` -- the search's own ranking of
    what matters least. The cost is recomputed after every drop (savings need not be linear: a
    LiteMLA head whose last channel goes stops being computed). Logged when it drops any."""
    keep = [None if (k := r.hard_decision()) is None else k.clone() for r in reducers]
    per_block = [float(r.block_macs(k)) for r, k in zip(reducers, keep)]
    searched = cost.fixed + sum(per_block)
    total = searched
    units = sorted(((score, n, i, channels) for i, r in enumerate(reducers) if keep[i] is not None
                    for n, (score, channels) in enumerate(r.budget_units())), key=lambda u: u[:3])
    dropped = 0
    for _, _, i, channels in units:
        if total <= cost.target:
            break
        channels = channels.to(keep[i].device)
        if not bool(keep[i][channels].any()):
            continue
        dropped += int(keep[i][channels].sum())
        keep[i][channels] = 0.0
        new = float(reducers[i].block_macs(keep[i]))
        total += new - per_block[i]
        per_block[i] = new
    if total > cost.target:  # cannot happen after ComputeBudget.measure's floor check
        raise ParamError(f"{method}.budget={cost.budget:g} cannot be met on this model")
    if dropped:
        log.warning("%s: the search kept %.4g GMACs (%.3f of the baseline's %.4g), over budget=%g; "
                    "dropped %d more kept channels, least important (lowest alpha) first: %.4g GMACs "
                    "(%.3f)", method, searched / 1e9, searched / cost.baseline, cost.baseline / 1e9,
                    cost.budget, dropped, total / 1e9, total / cost.baseline)
    return BudgetResult(keep=keep, searched_macs=searched, final_macs=total, extra_dropped=dropped)
