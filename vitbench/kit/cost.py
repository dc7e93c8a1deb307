"""Differentiable cost models: the fixed part counted, the variable part by formula.

A method that trains towards a GMACs budget (LTMP's matched penalty, DiffRate's search, DCS's
compute budget; docs/methods.md, "LTMP", "DCS") needs one image's MACs as a differentiable function of
its decisions. It writes only the part its decisions change, term by term
(:meth:`CostModel.terms`); the rest is counted once with :func:`vitbench.measure.count_gmacs`,
the counter the report uses, less the method's terms for the forward that was counted
(:func:`counted_fixed`). So ``fixed + terms`` is the counted GMACs at any decision.
"""
from __future__ import annotations

import abc
from collections.abc import Callable, Iterable
from typing import Any, Union

import torch
from torch import nn

from vitbench.measure.flops import count_gmacs

__all__ = ["CostModel", "Macs", "counted_fixed", "linear_macs", "probe_image"]

#: MACs per image: a number, or a tensor (per image, or differentiable in the decisions)
Macs = Union[torch.Tensor, float]


class CostModel(abc.ABC):
    """The MACs of one image's forward: :attr:`fixed` plus the method's :meth:`terms` of its decisions."""

    #: MACs per image no decision changes (:func:`counted_fixed`)
    fixed: float

    @abc.abstractmethod
    def terms(self, decisions: Any) -> Iterable[Macs]:
        """The MACs the decisions change, term by term (differentiable in the decisions)."""

    @property
    @abc.abstractmethod
    def full(self) -> float:
        """MACs of the unreduced model (the baseline a GMACs fraction is taken of)."""

    def macs(self, decisions: Any) -> Macs:
        """``fixed`` plus every term, added in order (so a number stays exact until a tensor joins)."""
        total: Macs = self.fixed
        for term in self.terms(decisions):
            total = total + term
        return total

    def ratio(self, decisions: Any) -> Macs:
        """:meth:`macs` as a fraction of :attr:`full` (what ``--match-gmacs F`` asks to be ``F``)."""
        return self.macs(decisions) / self.full


def counted_fixed(model: nn.Module, image: torch.Tensor, variable: Callable[[], float]) -> float:
    """The fixed part in whole MACs: ``model`` counted on ``image[:1]`` by ``count_gmacs`` less
    ``variable()``, the method's terms at the decisions that counted forward took (called after
    the count, so it may read them off the model)."""
    total = count_gmacs(model, image[:1].detach()).mean * 1e9
    return float(round(total - float(variable())))


def probe_image(model: nn.Module, size: tuple[int, int]) -> torch.Tensor:
    """A zero image ``[1, C, H, W]`` to count ``model`` on: ``C`` the input channels of its first
    convolution (the patch embedding), ``(H, W) = size``."""
    conv = next((m for m in model.modules() if isinstance(m, nn.Conv2d)), None)
    channels = 3 if conv is None else conv.in_channels
    return torch.zeros(1, channels, *size)


def linear_macs(module: nn.Module) -> float:
    """MACs per token of every ``nn.Linear`` in ``module`` (each applied once per token)."""
    return float(sum(m.in_features * m.out_features for m in module.modules() if isinstance(m, nn.Linear)))
