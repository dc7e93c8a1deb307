"""Shared fixtures: small random timm models (no weights are downloaded).

The plumbing tests run on the legacy embedded model (65 tokens): the default (197 tokens) costs
ten times more per image. Tests of the default itself name it (``DEIT_MODEL``).
"""
from __future__ import annotations

import os
import signal
import tempfile
from pathlib import Path

os.environ.setdefault("VITBENCH_DEFAULT_MODEL", "vitbench-fmnist-vit")  # before vitbench is imported
os.environ.setdefault("VITBENCH_DECODED_CACHE", tempfile.mkdtemp(prefix="vitbench-decoded-"))  # not the user's
os.environ.setdefault("VITBENCH_NO_WAIT", "1")  # runs time at once: a test's timing is no measurement

import numpy as np
import pytest
import torch
from PIL import Image


@pytest.fixture(scope="session")
def deit_small():
    """DeiT-S with random weights: the oracles of docs/methods.md count tokens, not accuracy."""
    import timm

    torch.manual_seed(0)
    return timm.create_model("deit_small_patch16_224", pretrained=False).eval()


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread for a module's tests: the 2-core machines run other tests beside them."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def _fresh_plugin_host(monkeypatch):
    """Every test starts from the process-wide host of the installed plugins, never a leftover."""
    import vitbench.host

    monkeypatch.delenv("VITBENCH_PLUGINS", raising=False)
    monkeypatch.delenv("VITBENCH_DISABLE_PLUGINS", raising=False)
    monkeypatch.delenv("VITBENCH_STRICT_PLUGINS", raising=False)
    yield
    vitbench.host.reset_host()


#: the signals whose handlers a test must leave as it found them
_HANDLED = (signal.SIGINT, signal.SIGTERM)


@pytest.fixture(autouse=True)
def _isolated():
    """A test leaves the SIGINT and SIGTERM handlers it found: they are restored after it, and a
    test that changed one fails naming it, so no handler leaks into later tests (issue 37, item 8:
    a leaked SIGTERM handler turned a stray SIGTERM into one test's exit 143)."""
    handlers = {sig: signal.getsignal(sig) for sig in _HANDLED}
    yield
    changed = [signal.Signals(sig).name for sig, handler in handlers.items() if signal.getsignal(sig) is not handler]
    for sig, handler in handlers.items():
        signal.signal(sig, handler)
    assert not changed, f"the test left its own handler for {', '.join(changed)} (restored now)"


def write_folder(root: Path, classes: dict[str, int], *, size: tuple[int, int] = (40, 48),
                 seed: int = 0) -> Path:
    """Write ``count`` random RGB PNGs (``size`` = (w, h)) per class under ``root/<class>/``."""
    rng = np.random.default_rng(seed)
    for name, count in classes.items():
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(count):
            pixels = rng.integers(0, 256, size=(size[1], size[0], 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / name / f"img{i}.png")
    return root


@pytest.fixture()
def folder_writer():
    """:func:`write_folder` as a fixture (conftest modules are not reliably importable)."""
    return write_folder


@pytest.fixture()
def gate_method():
    """Registers ``test-gate``, a small learnable method (tests/tests_support.py)."""
    from tests_support import register_gate

    return register_gate()
