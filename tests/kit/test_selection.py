"""The top-k token selection (vitbench/kit/selection.py): prefix first, the best patches in either layout."""
from __future__ import annotations

import pytest
import torch

from vitbench.kit import TOKEN_ORDERS, top_tokens


def test_pruned_tokens_are_laid_out_by_score_highest_first():
    # by hand: prefix 1, patch scores 0.1 0.3 0.2 0.4 at positions 1..4; keep 2 -> 4 (0.4), 2 (0.3)
    scores = torch.tensor([[0.1, 0.3, 0.2, 0.4]])
    assert top_tokens(scores, 2, prefix=1, order="score").tolist() == [[0, 4, 2]]
    assert top_tokens(scores, 2, prefix=1, order="original").tolist() == [[0, 2, 4]]
    assert top_tokens(scores, 3, prefix=2, order="score").tolist() == [[0, 1, 5, 3, 4]]
    # equal scores: the lower position first, in both layouts
    ties = torch.tensor([[0.2, 0.4, 0.2, 0.2]])
    assert top_tokens(ties, 3, prefix=1, order="score").tolist() == [[0, 2, 1, 3]]


def test_an_unknown_order_is_refused():
    assert TOKEN_ORDERS == ("score", "original")
    with pytest.raises(ValueError, match="order='spatial'; valid orders: score, original"):
        top_tokens(torch.zeros(1, 4), 2, prefix=1, order="spatial")
