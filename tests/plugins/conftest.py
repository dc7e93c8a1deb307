"""Fixtures the method plugins' tests share."""
from __future__ import annotations

from collections.abc import Iterator

import pytest
import timm
import torch
from torch import nn


@pytest.fixture
def single_thread() -> Iterator[None]:
    """One torch thread: the tiny models' tensors are too small for threads, and on a shared
    2-core CPU they only cost time. A file opts in with ``pytestmark``."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def vit() -> nn.Module:
    """timm's ``test_vit`` (100 patches + class token, 6 blocks, 160x160), seeded, eval mode."""
    torch.manual_seed(0)
    return timm.create_model("test_vit", pretrained=False).eval()
