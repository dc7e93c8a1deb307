"""``vitbench run`` with accuracy: an ImageNet-style folder, and the embedded default (slow)."""
from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from vitbench.cli.main import main


def _folder(root, classes=("cat", "dog"), per_class=3):
    rng = np.random.default_rng(0)
    for c in classes:
        (root / "val" / c).mkdir(parents=True)
        for i in range(per_class):
            Image.fromarray(rng.integers(0, 255, (48, 64, 3), dtype=np.uint8)).save(root / "val" / c / f"{i}.png")
    return root


def test_accuracy_on_an_imagenet_style_folder(tmp_path):
    data = _folder(tmp_path / "data")
    out = tmp_path / "out"
    rc = main(["run", "--methods", "tome", "--param", "tome.r=8", "--model", "test_vit", "--data", str(data),
               "--metrics", "accuracy,gmacs", "--out", str(out)])
    assert rc == 0
    records = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
    assert [r["num_images"] for r in records] == [6, 6]
    assert all(0.0 <= r["top1_pct"] <= 100.0 for r in records)
    assert records[0]["data"] == str(data)


@pytest.mark.slow
def test_embedded_default_end_to_end(tmp_path):
    """The main job on the embedded default (trains the Fashion-MNIST ViT once if not cached)."""
    out = tmp_path / "out"
    rc = main(["run", "--task", "cls", "--methods", "tome,ppt", "--param", "tome.r=4", "--param", "ppt.r=12",
               "--metrics", "accuracy,gmacs,params,throughput", "--limit", "500", "--batch-size", "16",
               "--out", str(out)])
    assert rc == 0
    records = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
    base, tome, ppt = records
    assert base["model"] == "vitbench-fmnist-vit" and base["data"] == "fashion-mnist"
    assert base["num_images"] == 500 and base["num_classes"] == 10
    assert base["top1_pct"] > 70.0  # a trained model, far above chance (10%)
    assert tome["gmacs"] < base["gmacs"] and ppt["gmacs"] < base["gmacs"]
    assert "Top-1 (%)" in (out / "report.md").read_text()
