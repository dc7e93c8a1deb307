"""Option lists given as comma-separated text: split, stripped, each checked against the choices."""
from __future__ import annotations

import pytest

from vitbench.errors import UnknownNameError
from vitbench.core.options import parse_list


def test_a_comma_list_is_split_and_checked():
    assert parse_list("metric", " gmacs, params ,", ("gmacs", "params", "ib")) == ("gmacs", "params")
    with pytest.raises(UnknownNameError, match=r"^unknown metric 'flops'; valid metrics: gmacs, params$"):
        parse_list("metric", "gmacs,flops", ("gmacs", "params"))
