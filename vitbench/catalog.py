"""What plugins register: methods, scorers and model families (architecture.md, "Plugins").

These are plain frozen dataclasses. The plugin host (:mod:`vitbench.plugins`) keeps one
catalog of each and records which plugin registered what.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from torch import nn

    from vitbench.engine.attention import AttnInfo
    from vitbench.engine.token_state import TokenState


@dataclass(frozen=True)
class ModelInfo:
    """A family adapter's uniform description of a backbone (what a method may size itself by)."""

    family: str
    depth: int
    embed_dim: int
    num_heads: int
    num_prefix_tokens: int
    num_patches: int
    grid: tuple[int, int]
    has_dist_token: bool = False
    global_pool: str = "token"

    @property
    def num_tokens(self) -> int:
        return self.num_prefix_tokens + self.num_patches


@dataclass
class Reduction:
    """What a method contributes to one model: one reducer (or ``None``) per block.

    A reducer is a callable ``reducer(x, state, info) -> x`` with an attribute ``needs``
    (a subset of ``{"keys", "cls_attn", "attn", "values"}``) saying what the attention of its
    block must hand over (methods.md §0). Blocks whose reducer is ``None`` only apply
    proportional attention (when ``prop_attn``) and keep the fused kernel.
    """

    reducers: Sequence[Optional[Callable[..., "torch.Tensor"]]]
    prop_attn: bool = True
    trace_source: bool = False


@dataclass(frozen=True)
class MethodSpec:
    """A reduction method as a plugin registers it.

    ``build(params, info)`` turns validated parameters and the model description into a
    :class:`Reduction`. ``params`` is a dataclass type whose fields all have defaults and whose
    ``__post_init__`` raises :class:`vitbench.errors.ParamError` on out-of-range values.
    """

    name: str
    params: type
    build: Callable[[Any, ModelInfo], Reduction]
    families: tuple[str, ...] = ("vit",)
    aliases: tuple[str, ...] = ()
    needs_training: bool = False
    needs_attention_probs: bool = False
    description: str = ""


@dataclass(frozen=True)
class ScorerSpec:
    """A token significance scorer (methods.md §4).

    ``score(info, prefix) -> [B, N - prefix]`` normalised to sum 1 per image; ``needs`` says
    what the block's attention must hand over for it.
    """

    name: str
    score: Callable[["AttnInfo", int], "torch.Tensor"]
    needs: frozenset[str] = field(default_factory=frozenset)
    description: str = ""


@dataclass(frozen=True)
class FamilySpec:
    """A model-family adapter: recognise a backbone, describe it, and patch it with a Reduction."""

    name: str
    matches: Callable[["nn.Module"], bool]
    describe: Callable[["nn.Module"], ModelInfo]
    patch: Callable[["nn.Module", Reduction], "nn.Module"]
    model_patterns: tuple[str, ...] = ()
    description: str = ""
