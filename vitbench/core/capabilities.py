"""What a model family provides and a method needs: a method runs on every family that provides
all it needs (docs/guide/backbones.md, "Capabilities")."""
from __future__ import annotations

from collections.abc import Iterable

__all__ = ["ATTENTION", "CAPABILITIES", "capability_set"]

#: what a block's attention can hand a reducer (:class:`vitbench.engine.AttnInfo`'s fields; Swin's received attention)
ATTENTION: dict[str, str] = {
    "keys": "the attention's keys, averaged over the heads",
    "cls_attn": "the class token's attention row (a class token leads every sequence)",
    "attn": "the full attention probabilities",
    "values": "the attention's values per head",
    "input": "the attention's input, the block's normed tokens",
    "tokens": "the block's input before its norm",
    "received_attn": "the attention each token receives, summed over its window (Swin)",
}

#: every capability a family may provide and a method may need, and what it means
CAPABILITIES: dict[str, str] = {
    "token_steps": "its blocks run on token sequences a method may shorten (merge or prune) after the attention",
    "grid_merges": "its blocks take a merge to a smaller token grid (Reducer.records_grid_merge)",
    "channels": "its attention and MLP channels may be selected (channel methods)",
    "one_width": "every reducing block has the same width, so a method's learned modules are sized once",
    "patch_grid": "each token sequence is the model's patch grid, row by row (spatial graphs, local windows)",
    "smaller_input": "it takes a smaller input image (Reduction.input_grid)",
    "before_attention": "a step may run before a block's attention (Reducer.before_attention)",
    "restores": "tokens set aside earlier may come back (Reducer.restores)",
    **ATTENTION,
}


def capability_set(names: Iterable[str], owner: str) -> frozenset[str]:
    """``names`` as a frozenset, each checked against :data:`CAPABILITIES` (``owner`` names who
    declared them in the error)."""
    names = frozenset((names,) if isinstance(names, str) else names)
    unknown = sorted(names - CAPABILITIES.keys())
    if unknown:
        raise ValueError(f"unknown capability {unknown[0]!r} of {owner}; valid capabilities: "
                         f"{', '.join(CAPABILITIES)}")
    return names
