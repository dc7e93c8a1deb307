"""Shared fixtures: small random timm models (no weights are downloaded).

The plumbing tests run on the legacy embedded model (65 tokens): the default (197 tokens) costs
ten times more per image. Tests of the default itself name it (``DEIT_MODEL``).
"""
from __future__ import annotations

import os
import signal
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("VITBENCH_DEFAULT_MODEL", "vitbench-fmnist-vit")  # before vitbench is imported
os.environ.setdefault("VITBENCH_DECODED_CACHE", tempfile.mkdtemp(prefix="vitbench-decoded-"))  # not the user's

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


@pytest.fixture(autouse=True)
def _fresh_plugin_host(monkeypatch):
    """Every test starts from the process-wide host of the installed plugins, never a leftover."""
    import vitbench.plugins

    monkeypatch.delenv("VITBENCH_PLUGINS", raising=False)
    monkeypatch.delenv("VITBENCH_DISABLE_PLUGINS", raising=False)
    monkeypatch.delenv("VITBENCH_STRICT_PLUGINS", raising=False)
    yield
    vitbench.plugins.reset_host()


#: the signals whose handlers a test must leave as it found them
_HANDLED = (signal.SIGINT, signal.SIGTERM)


def _live_children() -> set[int]:
    """This process's child processes that still run (zombies excluded), from ``/proc``."""
    me, found = os.getpid(), set()
    for task in Path(f"/proc/{me}/task").glob("*/children"):
        for pid in task.read_text().split():
            try:
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            if state != "Z" and not _helper(pid):
                found.add(int(pid))
    return found


def _helper(pid: str) -> bool:
    """Whether ``pid`` is one of multiprocessing's own long-lived helpers (its resource tracker,
    its fork server), which serve the whole session rather than one test."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"resource_tracker" in cmdline or b"forkserver" in cmdline


@pytest.fixture(autouse=True)
def _isolated(request):
    """A test leaves the signal handlers it found (restored here, and named if it changed one)
    and no child process running: one that outlives it gets SIGKILL and fails the test, so no
    leftover (a torchrun, a worker) can signal a later test (issue 37, item 8)."""
    handlers = {sig: signal.getsignal(sig) for sig in _HANDLED}
    children = _live_children() if sys.platform == "linux" else set()
    yield
    changed = [signal.Signals(sig).name for sig, handler in handlers.items() if signal.getsignal(sig) is not handler]
    for sig, handler in handlers.items():
        signal.signal(sig, handler)
    left = set()
    if sys.platform == "linux":
        deadline = time.monotonic() + 10  # a child that is exiting gets a moment
        while (left := _live_children() - children) and time.monotonic() < deadline:
            time.sleep(0.1)
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert not changed, f"the test left its own handler for {', '.join(changed)} (restored now)"
    assert not left, f"the test left child processes running: {sorted(left)} (killed now)"


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
