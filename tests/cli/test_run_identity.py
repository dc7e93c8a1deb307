"""A run's identity holds everything that decides its numbers (docs/measuring.md, "What a run's
identity holds"): ``--resume`` never skips a run measured on other images, another head or other
weights, and the report takes no delta across them."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from vitbench.cli.main import main
from vitbench.core.options import RunOptions
from vitbench.tasks.cls.task import ClsTask

DEFAULT = ["--task", "cls", "--metrics", "accuracy", "--batch-size", "2"]


def _records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]


def _delta(report: str, label: str) -> str:
    """The ΔTop-1 cell of the row ``label`` (the report's first such row)."""
    header = next(line for line in report.splitlines() if line.startswith("| Method"))
    column = [c.strip() for c in header.strip("|").split("|")].index("ΔTop-1 (pp)")
    row = next(line for line in report.splitlines() if line.startswith(f"| {label} "))
    return [c.strip() for c in row.strip("|").split("|")][column]


def test_a_larger_limit_on_resume_measures_again(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["run", "--methods", "tome", *DEFAULT, "--limit", "4", "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["run", "--methods", "tome", *DEFAULT, "--limit", "16", "--resume", "--out", str(out)]) == 0
    assert "already finished" not in capsys.readouterr().err
    records = _records(out)
    assert [(r["method"], r["num_images"]) for r in records] == [("baseline", 4), ("tome", 4), ("baseline", 16),
                                                                 ("tome", 16)]
    assert [r["measured_on"] for r in records[2:]] == [{"data": "fashion-mnist", "images": 16}] * 2
    # the same command again: now it is finished
    assert main(["run", "--methods", "tome", *DEFAULT, "--limit", "16", "--resume", "--out", str(out)]) == 0
    assert capsys.readouterr().err.count("already finished (resume): skipped") == 2
    assert len(_records(out)) == 4


def test_no_delta_across_evaluation_images_in_one_folder(tmp_path):
    out = tmp_path / "out"
    assert main(["run", "--methods", "tome", *DEFAULT, "--limit", "4", "--out", str(out)]) == 0
    assert main(["run", "--methods", "topk", *DEFAULT, "--limit", "16", "--out", str(out)]) == 0
    base4, tome, base16, topk = _records(out)
    assert (base4["method"], base16["method"]) == ("baseline", "baseline") and base4["spec_id"] != base16["spec_id"]
    report = (out / "report.md").read_text()
    four, sixteen = report.split("### Measured on 4 evaluation images of fashion-mnist")[1].split(
        "### Measured on 16 evaluation images of fashion-mnist")
    assert "| tome" in four and "| topk" not in four and "| topk" in sixteen and "| tome" not in sixteen
    assert float(_delta(four, "tome")) == pytest.approx(tome["top1_pct"] - base4["top1_pct"], abs=0.01)
    assert float(_delta(sixteen, "topk")) == pytest.approx(topk["top1_pct"] - base16["top1_pct"], abs=0.01)


def test_a_new_head_is_part_of_the_identity(tmp_path, folder_writer, capsys):
    """``--num-classes`` fits a head on the first ``--train-limit`` train images: another train
    limit on ``--resume`` measures the baseline and tome again on the new head."""
    data = tmp_path / "data"
    for split, seed in (("val", 0), ("train", 1)):
        folder_writer(data / split, {"cat": 3, "dog": 3}, seed=seed)
    args = ["run", "--model", "test_vit", "--data", str(data), "--num-classes", "2", "--metrics", "accuracy",
            "--batch-size", "2", "--out", str(tmp_path / "out")]
    assert main([*args, "--methods", "tome", "--train-limit", "2"]) == 0
    capsys.readouterr()
    assert main([*args, "--methods", "tome,ppt", "--param", "ppt.layers=(1,3)", "--train-limit", "4",
                 "--resume"]) == 0
    assert "already finished" not in capsys.readouterr().err
    records = _records(tmp_path / "out")
    assert [(r["method"], r["head"]["train_images"]) for r in records] == [
        ("baseline", 2), ("tome", 2), ("baseline", 4), ("tome", 4), ("ppt", 4)]
    report = (tmp_path / "out" / "report.md").read_text()
    assert report.count("the baseline and every method start from it") == 2
    assert "head: 2-way, fitted on 4 training images; weights: random init (seed 0)" in report


def _plan(**options) -> dict:
    return ClsTask().setup(RunOptions(methods=("tome",), **options)).plan


def test_random_weights_are_identified_by_the_seed_they_are_drawn_from():
    """A random init is drawn from the plan's first seed: a ``--seeds 0,1`` plan's seed-1 runs
    and a ``--seed 1`` plan's are different runs."""
    assert _plan(model="test_vit", seeds=(0, 1))["weights"] == "init_seed=0"
    assert _plan(model="test_vit", seed=1)["weights"] == "init_seed=1"
    assert _plan(model="test_vit", seeds=(2, 0))["weights"] == "init_seed=2"
    assert "weights" not in _plan()  # the default model: trained weights, ids as before
    assert "weights" not in _plan(model="test_vit", pretrained=True)
    assert "limit" not in _plan(model="test_vit", limit=4)  # no data read: the limit decides nothing
    assert _plan(limit=4)["limit"] == 4


def test_a_checkpoint_is_identified_by_its_content(tmp_path, capsys):
    ckpt = tmp_path / "w.pth"
    ckpt.write_bytes(b"first")
    first = _plan(model="test_vit", checkpoint=str(ckpt))["weights"]
    assert re.fullmatch(r"sha256=[0-9a-f]{64}", first)
    ckpt.write_bytes(b"second")  # the file replaced, the path the same
    assert _plan(model="test_vit", checkpoint=str(ckpt))["weights"] != first
    missing = tmp_path / "nope.pth"
    assert main(["run", "--methods", "tome", "--model", "test_vit", "--metrics", "gmacs", "--checkpoint",
                 str(missing), "--out", str(tmp_path / "out")]) == 2
    assert f"vitbench: error: checkpoint {missing} not found" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_changed_data_folder_is_measured_again_and_reported_apart(tmp_path, folder_writer, capsys):
    """The ``--data`` folder's fingerprint (paths and the bytes of each file) is part of the
    identity: a touched image is the same data, but after one image changes (under its old
    modification time too), ``--resume`` measures again, and the report keeps the runs on the old
    and the new folder in two tables."""
    import os

    data = tmp_path / "data"
    for split, seed in (("val", 0), ("train", 1)):
        folder_writer(data / split, {"cat": 3, "dog": 3}, seed=seed)
    args = ["run", "--model", "test_vit", "--data", str(data), "--num-classes", "2", "--metrics", "accuracy",
            "--batch-size", "2", "--methods", "tome", "--resume", "--out", str(tmp_path / "out")]
    assert main(args) == 0
    first = _plan(model="test_vit", data=str(data), num_classes=2)["data_id"]
    assert re.fullmatch(r"files=12,sha256=[0-9a-f]{16}", first)
    capsys.readouterr()
    assert main(args) == 0
    assert capsys.readouterr().err.count("already finished (resume): skipped") == 2
    image = data / "val" / "cat" / "img0.png"
    times = (image.stat().st_atime_ns, image.stat().st_mtime_ns)
    os.utime(image, ns=(times[0], times[1] + 10**9))  # touched: the same bytes
    assert _plan(model="test_vit", data=str(data), num_classes=2)["data_id"] == first
    image.write_bytes((data / "val" / "dog" / "img0.png").read_bytes())
    os.utime(image, ns=times)  # another image under the old time
    second = _plan(model="test_vit", data=str(data), num_classes=2)["data_id"]
    assert second != first
    assert main(args) == 0
    assert "already finished" not in capsys.readouterr().err
    records = _records(tmp_path / "out")
    assert [r["measured_on"]["data_id"] for r in records] == [first, first, second, second]
    report = (tmp_path / "out" / "report.md").read_text()
    assert report.count("### Measured on") == 2
    assert f"data {first.replace(',', ', ')}" in report and f"data {second.replace(',', ', ')}" in report
