"""A plugin written against an older plugin tutorial still loads and runs (issue 36, item 6).

``tutorial_2026_11/vitbench_norm_drop.py`` is the tutorial's plugin as the page had it on
2026-11-28, never edited: its imports from ``vitbench.catalog``, ``vitbench.engine``,
``vitbench.errors`` and ``vitbench.hookspecs`` must keep working (re-exported, or with a
deprecation warning) whatever moves inside vitbench. The live tutorial is run by
tests/docs/test_plugin_tutorial.py.
"""
from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest
import torch

import vitbench
from vitbench.host import get_host

PLUGIN = Path(__file__).parent / "tutorial_2026_11" / "vitbench_norm_drop.py"


@pytest.fixture
def norm_drop(monkeypatch):
    """The frozen plugin module, imported from its file and added to the host."""
    spec = importlib.util.spec_from_file_location("vitbench_norm_drop_2026_11", PLUGIN)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    get_host().add_plugin(module, "norm_drop_2026_11")
    return module


def test_the_old_tutorial_plugin_passes_the_conformance_check(norm_drop, vitbench_check_method):
    vitbench_check_method("norm-drop")


def test_the_old_tutorial_plugin_drops_the_tokens_it_says(norm_drop, vitbench_tiny_vit):
    """keep 0.5 at blocks 0 and 1 of a 64-patch ViT: 64 -> 32 -> 16 patch tokens, the class token kept."""
    model = vitbench_tiny_vit()
    reduced = vitbench.apply(model, "norm-drop", keep=0.5, layers=(0, 1))
    seen: list[int] = []
    for block in reduced.blocks[:2]:
        block.register_forward_hook(lambda m, a, out: seen.append(out.shape[1]))
    x = torch.randn(2, 3, *model.patch_embed.img_size)
    n = model.patch_embed.num_patches
    with torch.no_grad():
        logits = reduced(x)
    assert logits.shape == (2, model.num_classes)
    assert seen == [1 + math.ceil(0.5 * n), 1 + math.ceil(0.5 * math.ceil(0.5 * n))]
