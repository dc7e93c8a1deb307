"""pytest plugin of vitbench (entry point ``pytest11``): fixtures for plugin authors."""
from __future__ import annotations

from typing import Any, Callable

import pytest


@pytest.fixture
def vitbench_tiny_vit() -> Callable[..., Any]:
    """A factory for the tiny random ViT of :func:`vitbench.testing.tiny_vit`."""
    # torch: when the fixture is used; pytest loads this plugin at start
    from vitbench.testing import tiny_vit

    return tiny_vit


@pytest.fixture
def vitbench_check_method() -> Callable[..., Any]:
    """:func:`vitbench.testing.check_method`: assert that a method plugin conforms."""
    # torch: when the fixture is used; pytest loads this plugin at start
    from vitbench.testing import check_method

    return check_method
