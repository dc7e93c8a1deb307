"""The family kit: what a model-family adapter builds on (docs/guide/families.md).

A family plugin is one package: its registration (``FamilySpec``, ``PROVIDES``) and an adapter
whose ``describe`` reads the model and whose ``patch`` checks a reduction
(:func:`describe_for_patch`) and wraps the attention blocks so that each runs its reducer.
Everything here is the engine's, public; importing this module imports torch.
"""
from __future__ import annotations

from vitbench.core.contract import BlockInfo, ModelInfo, Reduction
from vitbench.engine.attention import AttnInfo, QKHook
from vitbench.engine.block import ReducingBlock, ReductionContext, keep_wrapped_keys, reduction_context
from vitbench.engine.channel_select import (
    ChannelGate, GatedDecisions, QKChannelMask, check_pointwise_proj, conv_output_channels, shrink_proj_input,
    shrink_qk_mask,
)
from vitbench.engine.features import module_features
from vitbench.engine.grid_merge import grid_merge
from vitbench.engine.host_sync import host_reads_allowed
from vitbench.engine.patching import RememberInputs, ResizeInputs, describe_for_patch
from vitbench.engine.reducer import LiteMLAHooks, Reducer, TileUnmerge
from vitbench.engine.tiles import tile_of
from vitbench.engine.token_state import TokenState
from vitbench.engine.unmerge import unmerge

__all__ = [
    "AttnInfo", "BlockInfo", "ChannelGate", "GatedDecisions", "LiteMLAHooks", "ModelInfo", "QKChannelMask",
    "QKHook", "Reducer", "ReducingBlock", "Reduction", "ReductionContext", "RememberInputs", "ResizeInputs",
    "TileUnmerge", "TokenState", "check_pointwise_proj", "conv_output_channels", "describe_for_patch", "grid_merge",
    "host_reads_allowed", "keep_wrapped_keys", "module_features", "reduction_context", "shrink_proj_input",
    "shrink_qk_mask", "tile_of", "unmerge",
]
