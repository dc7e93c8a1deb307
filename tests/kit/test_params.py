"""Shared parameter checks (vitbench/kit/params.py): block indices and scorer names."""
from __future__ import annotations

import pytest

from vitbench.errors import ParamError
from vitbench.kit import check_layers, check_scorer


def test_check_layers_names_the_valid_range():
    check_layers("m", (0, 11), 12)
    with pytest.raises(ParamError, match=r"m.layers contains 12; valid block indices for this model: 0..11"):
        check_layers("m", (3, 12), 12)


def test_check_scorer_names_the_method_and_the_registered_scorers():
    check_scorer("m", "cls-attn")
    with pytest.raises(ParamError, match=r"m.score='nope': .*cls-attn"):
        check_scorer("m", "nope")


def test_default_blocks_scale_with_the_depth():
    from vitbench.kit import blocks_from_quarter, chosen_layers, quarter_blocks

    assert quarter_blocks(12) == (3, 6, 9) and quarter_blocks(6) == (1, 3, 4) and quarter_blocks(24) == (6, 12, 18)
    assert quarter_blocks(2) == (0, 1)
    assert blocks_from_quarter(12) == tuple(range(3, 12))
    assert chosen_layers("topk", None, 6) == (1, 3, 4) and chosen_layers("topk", [2, 5], 6) == (2, 5)
    with pytest.raises(ParamError, match=r"topk.layers contains 6; valid block indices for this model: 0..5"):
        chosen_layers("topk", (3, 6, 9), 6)
