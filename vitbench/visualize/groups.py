"""Which patches a reduced model merged or dropped by each block: per-patch group maps.

With source tracing on (docs/methods.md, "The hook point", "Unmerge"), row ``t`` of the token state's
``source [B, N, N0]`` says which original tokens token ``t`` stands for. After a block, each
patch belongs to the token holding the largest share of it (hard merges: the one token covering
it); a patch no token covers was pruned. :func:`group_map` turns one image's sources into a
``[gh, gw]`` map of group numbers (``DROPPED`` for pruned patches) and :func:`trace_groups` runs
one forward with hooks after the chosen blocks.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from vitbench.engine import enable_source_tracing, reduction_context

__all__ = ["DROPPED", "BlockGroups", "group_map", "trace_groups"]

#: the group number of a pruned patch
DROPPED = -1


@dataclass(frozen=True)
class BlockGroups:
    """One image's patches after block ``block``: ``groups [gh, gw]`` (``0 .. G-1`` in raster
    order of each group's first patch, :data:`DROPPED` for pruned ones) and the token count."""

    block: int
    groups: torch.Tensor
    tokens: int
    prefix: int

    @property
    def num_groups(self) -> int:
        """Distinct groups of kept patches (pruned patches not counted)."""
        return int(self.groups.max().item()) + 1 if bool((self.groups >= 0).any()) else 0

    @property
    def num_dropped(self) -> int:
        return int((self.groups == DROPPED).sum().item())


def group_map(source: torch.Tensor, prefix: int, grid: tuple[int, int]) -> torch.Tensor:
    """Group numbers ``[gh, gw]`` of the patches from one image's ``source [N, N0]``.

    Each patch goes to the token holding its largest share; groups are numbered in raster order
    of their first patch; a patch with no share in any token is :data:`DROPPED`."""
    gh, gw = grid
    patches = source[:, prefix:]
    if patches.shape[1] != gh * gw:
        raise ValueError(f"group_map: the sources cover {patches.shape[1]} patches, the grid {gh}x{gw} "
                         f"has {gh * gw}")
    share, token = patches.float().max(dim=0)
    kept = share > 0
    labels = torch.full_like(token, DROPPED)
    if bool(kept.any()):
        first_seen: dict[int, int] = {}
        for t in token[kept].tolist():
            first_seen.setdefault(t, len(first_seen))
        lookup = torch.full((patches.shape[0],), DROPPED, dtype=torch.long)
        for t, g in first_seen.items():
            lookup[t] = g
        labels = torch.where(kept, lookup[token], labels)
    return labels.view(gh, gw)


def trace_groups(model: nn.Module, image: torch.Tensor, blocks: list[int]) -> list[BlockGroups]:
    """Run ``image [1, C, H, W]`` through reduced ``model`` with source tracing and return the
    group map after each of ``blocks`` (0-based block indices, in the order given)."""
    context = reduction_context(model)
    if context is None:
        raise ValueError("trace_groups needs a model reduced with vitbench.apply")
    enable_source_tracing(model)
    grid = tuple(int(g) for g in model.patch_embed.grid_size)  # type: ignore[union-attr]
    found: dict[int, BlockGroups] = {}

    def hook_for(b: int):  # type: ignore[no-untyped-def]
        def after(module: nn.Module, inputs: object, out: torch.Tensor) -> None:
            state = context.state
            source = None if state is None else state.source
            if source is None or source.shape[1] != out.shape[1]:
                rows = "none" if source is None else source.shape[1]
                raise ValueError(f"method {context.method!r} changed the tokens at block {b} without "
                                 f"recording their sources ({out.shape[1]} tokens, {rows} source rows); "
                                 f"its reductions must go through TokenState (docs/token-state.md)")
            found[b] = BlockGroups(b, group_map(source[0].detach().cpu(), state.prefix, grid),  # type: ignore[arg-type]
                                   int(out.shape[1]), state.prefix)  # type: ignore[union-attr]
        return after

    handles = [model.blocks[b].register_forward_hook(hook_for(b)) for b in sorted(set(blocks))]
    try:
        with torch.inference_mode():
            model(image)
    finally:
        for handle in handles:
            handle.remove()
    return [found[b] for b in blocks]
