"""Shared fixtures: small random timm models (no weights are downloaded)."""
from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="session")
def deit_small():
    """DeiT-S with random weights: the oracles of methods.md count tokens, not accuracy."""
    import timm

    torch.manual_seed(0)
    return timm.create_model("deit_small_patch16_224", pretrained=False).eval()


@pytest.fixture(autouse=True)
def _fresh_plugin_host(monkeypatch):
    """Every test starts from the process-wide host of the installed plugins, never a leftover."""
    import vitbench.plugins

    monkeypatch.delenv("VITBENCH_PLUGINS", raising=False)
    monkeypatch.delenv("VITBENCH_DISABLE_PLUGINS", raising=False)
    monkeypatch.delenv("VITBENCH_STRICT_PLUGINS", raising=False)
    yield
    vitbench.plugins.reset_host()
