"""The reducer contract: what a method hands the engine for one block (docs/token-state.md)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional

import torch
from torch import nn

from vitbench.core.contract import Reduction
from vitbench.engine.attention import AttnInfo
from vitbench.engine.token_state import TokenState
from vitbench.errors import PluginError

__all__ = ["FAMILY_HOOKS", "FamilyHooks", "LiteMLAHooks", "Reducer", "TileUnmerge", "check_reducers", "hook_names", "reduction_needs"]


class Reducer:
    """A method's step in one block: the token step, plus optional channel, tile and observation
    hooks whose defaults change nothing (docs/token-state.md, "The reducer contract").

    A base class, not a Protocol: the defaults reach a reducer only through inheritance, and
    ``isinstance(r, Reducer)`` then holds by construction. A learnable reducer is
    ``class R(nn.Module, Reducer)`` (``nn.Module`` first), so calling it runs ``forward``.
    """

    # -- the token step (every family with a token sequence) -------------------------------------
    #: what the block's attention hands over in ``info`` (docs/methods.md, "The hook point"); an instance may replace it
    needs: frozenset[str] = frozenset()
    #: ``True``: the step runs before the block's attention, on its input, with an empty ``info`` (Cropr)
    before_attention: bool = False
    #: ``True``: the step may bring back tokens set aside earlier (last-layer fusion, Cropr; ``TokenState.restore``)
    restores: bool = False

    def __call__(self, x: torch.Tensor, state: TokenState, info: AttnInfo) -> torch.Tensor:
        """The reduced tokens ``[B, N', C]`` of ``x [B, N, C]``, recorded in ``state``."""
        raise NotImplementedError(f"{type(self).__name__} has no token step: define __call__(x, state, info)")

    # -- channel selection (DCS, docs/methods.md, "DCS") ---------------------------------------------
    #: ``True`` for a channel method (keeps every token; docs/token-state.md, "The reducer contract")
    selects_channels: bool = False

    def qk(self, q: torch.Tensor, k: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The per-head queries and keys ``[B, h, N, d]`` the attention uses (``x`` its input tokens)."""
        return q, k

    def mlp_forward(self, mlp: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """The block's MLP on the normed tokens ``x``: ``mlp(x)``."""
        return mlp(x)

    # -- grid merges (MobileViT) -----------------------------------------------------------------
    #: ``True`` when every merge is a grid merge, so MobileViT's unmerge traces no sources
    records_grid_merge: bool = False

    # -- observation -----------------------------------------------------------------------------
    def observe(self, module: nn.Module, x: torch.Tensor) -> None:
        """Called first in every forward with the module the reducer changes and its input
        (EfficientViT: the LiteMLA and its map)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Refuse ``class R(Reducer, nn.Module)``: calling it would skip ``nn.Module.__call__``."""
        super().__init_subclass__(**kwargs)
        if issubclass(cls, nn.Module) and cls.__call__ is Reducer.__call__:
            raise TypeError(f"{cls.__name__}: list nn.Module before Reducer (class {cls.__name__}(nn.Module, "
                            f"Reducer)) so that calling the reducer runs nn.Module.__call__ -> forward")
        for mixin in FAMILY_HOOKS:  # a family hook defined without its mixin would never be called
            strays = [name for name in hook_names(mixin) if hasattr(cls, name) and not issubclass(cls, mixin)]
            if strays:
                raise TypeError(f"{cls.__name__} defines {', '.join(strays)} without inheriting "
                                f"vitbench.kit.{mixin.__name__} (class {cls.__name__}(..., {mixin.__name__})); "
                                f"the family calls it only on reducers that do")


class FamilyHooks:
    """A mixin of hooks one model family calls on a reducer besides :class:`Reducer`'s: a reducer
    that inherits it is given them; the family checks ``isinstance`` and never probes for a member."""


class LiteMLAHooks(FamilyHooks):
    """EfficientViT's LiteMLA hooks: which heads run and the projection of their outputs (DCS, Sec. 3.2)."""

    def proj_forward(self, proj: nn.Module, out: torch.Tensor) -> torch.Tensor:
        """A LiteMLA's projection of its concatenated head outputs: ``proj(out)``."""
        return proj(out)

    def selected_heads(self) -> Optional[torch.Tensor]:
        """The LiteMLA heads whose attention runs, as positions among the heads its convolutions
        compute (a sorted ``LongTensor``); ``None``: every head."""
        return None


class TileUnmerge(FamilyHooks):
    """Swin's tile hook: the reducer's own unmerge of the MLP outputs on the reduced tiles."""

    def unmerge(self, y: torch.Tensor, state: TokenState) -> Optional[torch.Tensor]:
        """The MLP outputs ``y`` of the reduced tiles back on every token of the tiles; ``None``
        leaves it to the family (the token holding the largest share gives its output)."""
        return None


#: every family's hooks, in the order a reducer may combine them
FAMILY_HOOKS: tuple[type[FamilyHooks], ...] = (LiteMLAHooks, TileUnmerge)


def hook_names(mixin: type[FamilyHooks]) -> list[str]:
    """The public methods ``mixin`` adds."""
    return [name for name, member in vars(mixin).items() if callable(member) and not name.startswith("_")]


def check_reducers(reducers: Sequence[Optional[object]], method: str) -> None:
    """Raise :class:`~vitbench.errors.PluginError` for the first reducer that is neither ``None``
    nor a :class:`Reducer`, naming the method and the block."""
    for i, reducer in enumerate(reducers):
        if reducer is not None and not isinstance(reducer, Reducer):
            raise PluginError(f"{f'method {method!r}: ' if method else ''}block {i}'s reducer {type(reducer).__name__!r} is not a "
                              f"vitbench.engine.Reducer; subclass it (class MyReducer(vitbench.engine.Reducer), "
                              f"or (nn.Module, vitbench.engine.Reducer) for a learnable one; "
                              f"docs/token-state.md, \"The reducer contract\")")


def reduction_needs(reduction: Reduction) -> frozenset[str]:
    """What a built ``reduction`` asks of the model family
    (:data:`~vitbench.core.capabilities.CAPABILITIES`): per reducer channels, a grid merge or a
    token step, its attention hand-overs, a step before the attention and taking tokens back;
    a smaller input."""
    needs: set[str] = {"smaller_input"} if reduction.input_grid is not None else set()
    for reducer in reduction.reducers:
        if reducer is None:
            continue
        needs |= set(reducer.needs)
        needs.add("channels" if reducer.selects_channels else
                  "grid_merges" if reducer.records_grid_merge else "token_steps")
        needs |= {flag for flag in ("before_attention", "restores") if getattr(reducer, flag)}
    return frozenset(needs)
