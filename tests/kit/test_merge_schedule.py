"""ToMe's merge schedule (vitbench/kit/merge_schedule.py): an int, a per-block list, ``(r, inflect)``."""
from __future__ import annotations

import pytest

from vitbench.errors import ParamError
from vitbench.kit import schedule


def test_a_per_block_list_is_kept_and_must_cover_every_block():
    assert schedule([3, 2, 1], 3) == [3, 2, 1]
    with pytest.raises(ParamError, match="tome.r has 2 entries; the model has 3 blocks"):
        schedule([1, 2], 3)


def test_inflect_never_goes_below_zero():
    assert schedule((4, 1.5), 3) == [0, 4, 10]
