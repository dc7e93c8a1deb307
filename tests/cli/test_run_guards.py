"""``vitbench run`` against silent garbage (issue 9 item 2): a class-count mismatch is refused
before anything runs, ``--num-classes`` fits a new head once, and a NaN at each measured point
(fine-tuning, logits, GMACs, IB) is an ``error`` record listed in the report, the other runs going on."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from vitbench.cli.main import main
from vitbench.hookspecs import hookimpl
from vitbench.host import get_host


def _write(root: Path, splits: dict[str, int], classes=("cat", "dog", "eel")) -> Path:
    rng = np.random.default_rng(0)
    for split, per_class in splits.items():
        for c in classes:
            (root / split / c).mkdir(parents=True)
            for i in range(per_class):
                Image.fromarray(rng.integers(0, 255, (40, 40, 3), dtype=np.uint8)).save(root / split / c / f"{i}.png")
    return root


def _records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]


def _one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.startswith("vitbench: error:")]
    assert len(lines) == 1 and "Traceback" not in err
    return lines[0]


def test_a_head_of_another_class_count_is_refused_before_anything_runs(tmp_path, capsys):
    data = _write(tmp_path / "data", {"val": 1})
    out = tmp_path / "out"
    assert main(["run", "--methods", "tome", "--model", "test_vit", "--data", str(data), "--metrics", "accuracy",
                 "--out", str(out)]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "has 3 classes but the model predicts 1000" in line and "pass --num-classes 3" in line
    assert not (out / "runs.jsonl").exists()
    # --num-classes fits the new head on train/: a folder without one is refused too
    assert main(["run", "--methods", "tome", "--model", "test_vit", "--data", str(data), "--metrics", "accuracy",
                 "--num-classes", "3", "--out", str(out)]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "--num-classes 3 fits a new head on the data's train/ split" in line
    assert not (out / "runs.jsonl").exists()


def test_diverging_fine_tuning_is_an_error_record_and_the_fitted_head_is_shared(tmp_path, capsys):
    """The issue's check on a tiny setup: ltm.lr=1e9 with the IB step's MLPs training at it too
    (frozen by default, and the masks and scales alone saturate without overflowing) ends as an
    error record saying the loss became non-finite, exit 1; tome and the baseline go on, on the head fitted once."""
    import timm
    import torch

    data = _write(tmp_path / "data", {"val": 2, "train": 6})
    weights = tmp_path / "test_vit.pth"  # a 1000-way checkpoint: its backbone under the new 3-way head
    torch.save(timm.create_model("test_vit").state_dict(), weights)
    out = tmp_path / "out"
    args = ["run", "--methods", "tome,ltm", "--model", "test_vit", "--data", str(data), "--num-classes", "3",
            "--checkpoint", str(weights),
            "--param", "ltm.lr=1e9", "--param", "ltm.mlp_lr=1e9", "--param", "ltm.batch_size=6", "--param", "tome.r=4",
            "--metrics", "accuracy", "--out", str(out)]
    assert main(args) == 1
    base, tome, ltm = _records(out)
    assert (base["status"], tome["status"], ltm["status"]) == ("ok", "ok", "error")
    assert ltm["error"].startswith("ltm: the loss became non-finite (")
    assert "in stage 'finetune', epoch 1, iteration " in ltm["error"]
    assert not (out / "checkpoints" / f"{ltm['spec_id']}.pth").exists()  # no checkpoint of a diverged run
    head = base["head"]
    assert head == tome["head"] == ltm["head"] and head["num_classes"] == 3 and head["train_images"] == 18
    assert Path(head["checkpoint_path"]).is_file() and Path(head["checkpoint_path"]).parent == out / "checkpoints"
    report = (out / "report.md").read_text()
    assert "Classifier head: a new 3-way head, fitted once by a linear probe" in report
    failed = report.split("Failed runs:")[1]
    assert "ltm" in failed and "the loss became non-finite" in failed
    assert "fitting a new 3-way head" in capsys.readouterr().err
    assert main(args + ["--resume"]) == 1  # the failed run is retried; the head is reused
    assert "reusing the 3-way head fitted earlier" in capsys.readouterr().err
    assert _records(out)[-1]["status"] == "error"


@dataclass(frozen=True)
class _NoParams:
    pass


class _Poison:
    """``test-nan``: block 1's MLP, through its reducer's ``mlp_forward``, turns every patch token
    into NaN (the token step itself keeps the rules, finiteness included; block 2's attention
    spreads the NaN into the class token)."""

    @hookimpl
    def vitbench_register_methods(self, register):
        from vitbench.catalog import MethodSpec, Reduction
        from vitbench.engine import Reducer

        class Poison(Reducer):
            def __call__(self, x, state, info):
                return x

            def mlp_forward(self, mlp, x):
                y = mlp(x)
                return torch.cat([y[:, :1], y[:, 1:] * float("nan")], dim=1)

        register(MethodSpec("test-nan", _NoParams,
                            lambda p, info: Reduction([Poison() if i == 1 else None for i in range(info.depth)])))


@pytest.mark.parametrize("metric, message", [
    ("accuracy", "evaluation: the logits hold non-finite values (2000 of 2000) in batch 1"),
    ("gmacs", "GMACs: the counted forward's outputs hold non-finite values (1000 of 1000) on image 1 of 16"),
    ("ib", "IB metrics: the final features hold non-finite values (128 of 128) in batch 1"),
])
def test_a_nan_at_each_measured_point_is_an_error_record_in_the_report(tmp_path, metric, message):
    from timm.data import ImageNetInfo

    wnids = list(ImageNetInfo().label_names())  # ImageNet folders: test_vit's 1000-way head fits
    data = _write(tmp_path / "data", {"val": 1}, classes=(wnids[3], wnids[9]))
    get_host().add_plugin(_Poison(), "poison")
    out = tmp_path / "out"
    assert main(["run", "--methods", "test-nan", "--model", "test_vit", "--data", str(data), "--metrics", metric,
                 "--out", str(out)]) == 1
    base, bad = _records(out)
    assert base["status"] == "ok" and (bad["status"], bad["error"]) == ("error", message)
    if metric == "ib":  # synset labels (3, 9) are measured over the 2 classes present
        assert base["ib_loss"] is not None and base["ib_bound"] is not None
    report = (out / "report.md").read_text()
    assert f"Failed runs:\n\n- test-nan: {message}" in report


@pytest.mark.slow
def test_forced_divergence_on_the_embedded_default_is_an_error_record(tmp_path):
    """The issue's "done when": ltm.lr=1e9 on the default (with the IB step's MLPs training at it:
    ``mlp_lr=1e9``; by default they are frozen and the masks and scales alone saturate without
    overflowing) gives an error record whose message says the loss became non-finite, exit 1."""
    out = tmp_path / "out"
    rc = main(["run", "--methods", "ltm", "--param", "ltm.lr=1e9", "--param", "ltm.mlp_lr=1e9",
               "--param", "ltm.stats_images=128",
               "--metrics", "accuracy", "--limit", "100", "--train-limit", "256", "--out", str(out)])
    assert rc == 1
    base, ltm = _records(out)
    assert base["status"] == "ok" and base["top1_pct"] > 70.0
    assert ltm["status"] == "error" and ltm["error"].startswith("ltm: the loss became non-finite (")
    assert "in stage 'finetune', epoch 1, iteration " in ltm["error"]
    assert not (out / "checkpoints" / f"{ltm['spec_id']}.pth").exists()
    assert "the loss became non-finite" in (out / "report.md").read_text().split("Failed runs:")[1]


def test_a_plan_where_every_run_failed_says_so_instead_of_an_empty_table(tmp_path, capsys, monkeypatch):
    def broken(spec, ws, model, progress):
        raise RuntimeError(f"broken {spec.method}")

    monkeypatch.setattr("vitbench.tasks.cls.run.run_cls_spec", broken)
    assert main(["run", "--methods", "tome", "--model", "test_vit", "--metrics", "params",
                 "--out", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert out.startswith("no run finished: 2 of 2 failed\n")
    assert "FAILED baseline: RuntimeError: broken baseline" in out and "FAILED tome (r=16): RuntimeError: broken tome" in out
