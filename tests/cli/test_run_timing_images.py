"""``vitbench run`` times every forward on the first evaluation images, not on noise."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

import vitbench.measure as measure
from vitbench.cli.main import main
from vitbench.errors import ParamError
from vitbench.measure import measure_throughput
from vitbench.measure._common import batch_of


def _flat_folder(root, values):
    """``val/`` and ``train/`` of one-colour images: image ``i`` of ``val`` (sorted) is ``values[i]``."""
    for split in ("val", "train"):
        for i, value in enumerate(values):
            folder = root / split / ("a" if i < len(values) // 2 else "b")
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(np.full((40, 40, 3), value, dtype=np.uint8)).save(folder / f"{i}.png")
    return root


def test_a_run_times_the_first_evaluation_images(tmp_path, monkeypatch):
    values = [10, 60, 120, 200]
    data = _flat_folder(tmp_path / "data", values)
    seen = []

    def recording(*args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(kwargs.get("images"))
        return measure_throughput(*args, **kwargs)

    monkeypatch.setattr(measure, "measure_throughput", recording)
    out = tmp_path / "out"
    rc = main(["run", "--methods", "tome", "--model", "test_vit", "--data", str(data), "--num-classes", "2",
               "--metrics", "accuracy,throughput,latency", "--batch-size", "6", "--repeats", "1",
               "--out", str(out)])
    assert rc == 0
    records = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
    assert [r["timed_on"] for r in records] == ["evaluation images"] * 2
    images = seen[0]
    assert images is not None and images.shape[0] == 4  # the 4 evaluation images, fewer than the batch
    # every image is one flat colour, in the folder's order: not noise
    flat = images.flatten(1)
    assert torch.allclose(flat.max(1).values, flat.min(1).values, atol=1e-4)
    assert flat[:, 0].tolist() == sorted(flat[:, 0].tolist())  # brighter in the folder's order
    assert len(set(round(v, 4) for v in flat[:, 0].tolist())) == 4


def test_batch_of_takes_the_images_in_turn():
    images = torch.arange(3.0).view(3, 1, 1, 1).expand(3, 1, 2, 2)
    batch = batch_of(images, 7, (1, 2, 2))
    assert batch[:, 0, 0, 0].tolist() == [0, 1, 2, 0, 1, 2, 0]
    assert batch_of(None, 2, (1, 2, 2)).shape == (2, 1, 2, 2)  # seeded noise
    with pytest.raises(ParamError, match=r"\[C, H, W\] = \[1, 2, 2\]"):
        batch_of(torch.zeros(2, 3, 2, 2), 4, (1, 2, 2))
    with pytest.raises(ParamError, match="m >= 1"):
        batch_of(torch.zeros(0, 1, 2, 2), 4, (1, 2, 2))


class _Seen(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(()))
        self.inputs: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.inputs.append(x.clone())
        return x * self.scale


def test_throughput_latency_and_paired_forward_the_given_images():
    from vitbench.measure import measure_latency
    from vitbench.measure.paired import measure_paired_speedup

    images = torch.arange(2.0).view(2, 1, 1, 1).expand(2, 1, 2, 2)
    model, baseline = _Seen(), _Seen()
    measure_throughput(model, 5, (1, 2, 2), repeats=2, warmup=1, images=images)
    assert all(x[:, 0, 0, 0].tolist() == [0, 1, 0, 1, 0] for x in model.inputs)
    model.inputs.clear()
    measure_latency(model, (1, 2, 2), repeats=2, warmup=0, images=images)
    assert all(x[:, 0, 0, 0].tolist() == [0] for x in model.inputs)
    model.inputs.clear()
    measure_paired_speedup(model, baseline, 2, (1, 2, 2), rounds=2, warmup=0, images=images)
    assert [x[:, 0, 0, 0].tolist() for x in model.inputs + baseline.inputs] == [[0, 1]] * 4
