"""The channel compute budget (vitbench/kit/channel_budget.py) on hand-made reducers."""
from __future__ import annotations

import torch

from vitbench.kit import ComputeBudget, CostModel, enforce_budget


class _Gate:
    """Four gated channels of 10 MACs each; ``alpha`` ranks them (lowest first out)."""

    def __init__(self, alpha: list[float]) -> None:
        self.alpha = torch.tensor(alpha)

    def block_macs(self, keep):
        return 10.0 * (self.hard_decision() if keep is None else keep).sum()

    def hard_decision(self) -> torch.Tensor:
        return (self.alpha > 0).float()

    def budget_units(self):
        return [(float(a), torch.tensor([c])) for c, a in enumerate(self.alpha.tolist())]


def test_the_cost_is_the_fixed_part_plus_each_reducers_terms():
    reducers = (_Gate([1.0, 2.0, 3.0, 4.0]), _Gate([1.0, -1.0, 1.0, -1.0]))
    cost = ComputeBudget(budget=0.5, fixed=20.0, baseline=100.0, reducers=reducers)
    assert isinstance(cost, CostModel) and cost.full == 100.0 and cost.target == 50.0
    assert cost.current() == 20.0 + 40.0 + 20.0 and cost.floor() == 20.0
    keep = torch.tensor([1.0, 0.0, 0.0, 0.0], requires_grad=True)
    macs = cost.macs([keep, None])
    macs.backward()
    assert macs.item() == 50.0 and keep.grad.tolist() == [10.0] * 4


def test_enforce_budget_drops_the_lowest_alpha_channels_until_it_fits():
    reducers = (_Gate([0.5, 2.0, 3.0, 4.0]), _Gate([1.0, -1.0, 1.0, -1.0]))
    cost = ComputeBudget(budget=0.5, fixed=20.0, baseline=100.0, reducers=reducers)
    result = enforce_budget(cost, reducers)
    assert result.searched_macs == 80.0 and result.final_macs == 50.0 and result.extra_dropped == 3
    # alpha 0.5 first, then both of the second block's alpha 1 (its alpha -1 ones were never kept)
    assert [k.tolist() for k in result.keep] == [[0.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0]]
