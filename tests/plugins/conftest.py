"""Fixtures the method plugins' tests share."""
from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Optional

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


@pytest.fixture
def calibrated_on_tiny_vit() -> Callable[[str, float], Any]:
    """``calibrate(method, fraction)``: the method's budget knob matched to ``fraction`` of the
    baseline's GMACs on :func:`vitbench.testing.tiny_vit`, counted as trained."""
    import copy

    import vitbench
    from vitbench import measure
    from vitbench.measure.calibrate import GmacsCounter, calibrate, prepared_as_trained
    from vitbench.host import get_host
    from vitbench.testing import tiny_vit

    def run(method: str, fraction: float) -> Any:
        tiny = tiny_vit()
        images = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))

        def count(name: Optional[str], values: Any) -> float:
            m = copy.deepcopy(tiny)
            if name is not None:
                m = prepared_as_trained(vitbench.apply(m, name, values), images)
            return measure.count_gmacs(m.eval(), images).mean

        host = get_host()
        return calibrate(host.method(method), None, fraction, GmacsCounter(count), host.family_of(tiny).describe(tiny))

    return run


@pytest.fixture
def fine_tuned_run(tmp_path, folder_writer) -> Callable[[str, str], tuple[dict[str, Any], dict[str, Any]]]:
    """``run(method, *params)``: ``vitbench run`` of ``method`` with a ``--param`` each on test_vit,
    fine-tuned on 8 images of a 2-class folder (val 3, train 4 per class); the baseline's and
    the method's records, after checking the method's are ok, fine-tuned, finite and cheaper."""
    import json
    import math

    from vitbench.cli.main import main

    def run(method: str, *params: str) -> tuple[dict[str, Any], dict[str, Any]]:
        data = tmp_path / "data"
        for split, per_class, seed in (("val", 3, 0), ("train", 4, 1)):
            folder_writer(data / split, {"cat": per_class, "dog": per_class}, size=(64, 48), seed=seed)
        out = tmp_path / "out"
        flags = [arg for param in params for arg in ("--param", param)]
        assert main(["run", "--methods", method, *flags, "--model", "test_vit", "--data", str(data),
                     "--num-classes", "2", "--metrics", "accuracy,gmacs", "--train-limit", "8",
                     "--out", str(out)]) == 0
        base, reduced = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
        assert reduced["status"] == "ok" and reduced["trained"] == "fine-tuned" and reduced["train_images"] == 8
        assert math.isfinite(reduced["top1_pct"]) and 0.0 <= reduced["top1_pct"] <= 100.0
        assert math.isfinite(reduced["gmacs"]) and reduced["gmacs"] < base["gmacs"]
        return base, reduced

    return run
