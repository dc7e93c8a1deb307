"""The method kit: helpers that method plugins share, public so that outside plugins can use them too.

A built-in plugin imports no other plugin; what several methods need lives here: parameter
checks, the top-k token selection, ToMe's merge schedule, the clustering merges (hard and soft), the token
significance scores, the AdamW-cosine training stage, and the differentiable cost models (fixed
part counted, variable part by formula).
"""
from __future__ import annotations

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

__all__ = [
    "BudgetResult", "ClusterFn", "ClusterMergeReducer", "ComputeBudget", "CostModel", "Macs", "TOKEN_ORDERS",
    "ViTBlockCosts", "adamw_cosine", "average_score", "blocks_from_quarter", "check_layers", "check_scorer",
    "chosen_layers", "cls_attn_score", "counted_fixed", "enforce_budget", "entropy_score", "linear_macs",
    "probe_image", "quarter_blocks", "schedule", "soft_cluster", "stage_epochs", "token_distances", "top_tokens",
    "vit_block_costs"
]
