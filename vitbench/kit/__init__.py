"""The method kit: all a method or family plugin imports from vitbench, built-in or not
(docs/plugin-tutorial.md; import-linter's ``plugins-sealed`` contract in pyproject.toml).

- registering: ``hookimpl``, the specs (:class:`MethodSpec`, :class:`ScorerSpec`,
  :class:`FamilySpec`), ``param``/``Range``/``BudgetKnob``, the host (``get_host``);
- the token step: :class:`Reducer`, :class:`TokenState`, :class:`AttnInfo`, the reduction a build
  returns (:class:`Reduction`, :class:`TrainStage`) and the engine's shared pieces (matching,
  ordering, rows, masks, grid merges, Swin's tiles, channel gates);
- helpers several methods share: parameter checks, the top-k token selection, ToMe's merge
  schedule, the clustering merges (hard and soft), the token significance scores, the AdamW-cosine
  training stage, the differentiable cost models; the IB estimate's pieces are in :mod:`vitbench.kit.ib`.

A built-in plugin imports no other plugin and no other vitbench module but :mod:`vitbench.errors`.
The specs and ``hookimpl`` load with the kit; the rest on first use, so that registering a
plugin (``vitbench list``) imports no torch.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from vitbench.catalog import (
    HELP, BudgetKnob, FamilySpec, MergeGrid, MethodSpec, ModelInfo, Range, Reduction, ScorerSpec, TrainStage,
    param, patch_count,
)
from vitbench.hookspecs import hookimpl

if TYPE_CHECKING:  # the names below load on first use: a plugin's registration stays free of torch
    from vitbench.engine import (
        AttnInfo, LiteMLAHooks, Matching, Reducer, TileUnmerge, TokenState, bipartite_soft_matching,
        descending_order, max_merge, reduction_context,
    )
    from vitbench.engine.channel_select import (
        ChannelGate, GatedDecisions, QKChannelMask, check_mlp, gated_mlp, shrink_mlp, sparse_mlp,
        straight_through_mask,
    )
    from vitbench.engine.grid_merge import record_grid_merge
    from vitbench.engine.host_sync import host_reads_allowed
    from vitbench.engine.rows import take_rows
    from vitbench.engine.tiles import tile_of
    from vitbench.host import get_host
    from vitbench.kit.channel_budget import BudgetResult, ComputeBudget, enforce_budget
    from vitbench.kit.clustering import ClusterFn, ClusterMergeReducer, token_distances
    from vitbench.kit.cost import CostModel, Macs, counted_fixed, linear_macs, probe_image
    from vitbench.kit.merge_schedule import schedule
    from vitbench.kit.params import blocks_from_quarter, check_layers, check_scorer, chosen_layers, quarter_blocks
    from vitbench.kit.scores import average_score, cls_attn_score, entropy_score
    from vitbench.kit.selection import TOKEN_ORDERS, top_tokens
    from vitbench.kit.soft_merge import soft_cluster
    from vitbench.kit.train_stages import adamw_cosine, stage_epochs
    from vitbench.kit.vit_costs import ViTBlockCosts, vit_block_costs
    from vitbench.train.batches import first_images

#: where each name that loads on first use lives
_LAZY = {
    **dict.fromkeys(("AttnInfo", "LiteMLAHooks", "Matching", "Reducer", "TileUnmerge", "TokenState",
                     "bipartite_soft_matching", "descending_order", "max_merge", "reduction_context"),
                    "vitbench.engine"),
    **dict.fromkeys(("ChannelGate", "GatedDecisions", "QKChannelMask", "check_mlp", "gated_mlp", "shrink_mlp",
                     "sparse_mlp", "straight_through_mask"), "vitbench.engine.channel_select"),
    "tile_of": "vitbench.engine.tiles", "record_grid_merge": "vitbench.engine.grid_merge",
    "host_reads_allowed": "vitbench.engine.host_sync", "take_rows": "vitbench.engine.rows",
    "get_host": "vitbench.host", "first_images": "vitbench.train.batches",
    **dict.fromkeys(("BudgetResult", "ComputeBudget", "enforce_budget"), "vitbench.kit.channel_budget"),
    **dict.fromkeys(("ClusterFn", "ClusterMergeReducer", "token_distances"), "vitbench.kit.clustering"),
    **dict.fromkeys(("CostModel", "Macs", "counted_fixed", "linear_macs", "probe_image"), "vitbench.kit.cost"),
    "schedule": "vitbench.kit.merge_schedule",
    **dict.fromkeys(("blocks_from_quarter", "check_layers", "check_scorer", "chosen_layers", "quarter_blocks"),
                    "vitbench.kit.params"),
    **dict.fromkeys(("average_score", "cls_attn_score", "entropy_score"), "vitbench.kit.scores"),
    **dict.fromkeys(("TOKEN_ORDERS", "top_tokens"), "vitbench.kit.selection"),
    "soft_cluster": "vitbench.kit.soft_merge",
    **dict.fromkeys(("adamw_cosine", "stage_epochs"), "vitbench.kit.train_stages"),
    **dict.fromkeys(("ViTBlockCosts", "vit_block_costs"), "vitbench.kit.vit_costs"),
}


def __getattr__(name: str) -> Any:
    """A name of the kit whose module imports torch, loaded when a plugin first uses it."""
    if name not in _LAZY:
        raise AttributeError(f"module 'vitbench.kit' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value


__all__ = [
    "HELP", "AttnInfo", "BudgetKnob", "ChannelGate", "FamilySpec", "GatedDecisions", "LiteMLAHooks", "Matching",
    "MergeGrid", "TileUnmerge",
    "MethodSpec", "ModelInfo", "QKChannelMask", "Range", "Reducer", "Reduction", "ScorerSpec", "TokenState",
    "TrainStage", "bipartite_soft_matching", "check_mlp", "descending_order", "first_images", "gated_mlp",
    "get_host", "hookimpl", "host_reads_allowed", "max_merge", "param", "patch_count", "record_grid_merge",
    "reduction_context", "shrink_mlp", "sparse_mlp", "straight_through_mask", "take_rows", "tile_of",
    "BudgetResult", "ClusterFn", "ClusterMergeReducer", "ComputeBudget", "CostModel", "Macs", "TOKEN_ORDERS",
    "ViTBlockCosts", "adamw_cosine", "average_score", "blocks_from_quarter", "check_layers", "check_scorer",
    "chosen_layers", "cls_attn_score", "counted_fixed", "enforce_budget", "entropy_score", "linear_macs",
    "probe_image", "quarter_blocks", "schedule", "soft_cluster", "stage_epochs", "token_distances", "top_tokens",
    "vit_block_costs"
]
