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
