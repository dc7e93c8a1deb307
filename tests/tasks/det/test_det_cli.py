"""``vitbench run --task det|seg``: end to end on the embedded shapes set (``--data shapes-coco``; slow,
kept short with --detector-epochs 1, --train-limit 4, --limit 4) and bad input that exits 2 with
one clear line."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from vitbench.cli.main import main

#: plumbing, not a result: the small shapes set (the scenes are the default data)
SHORT = ["--data", "shapes-coco", "--detector-epochs", "1", "--train-limit", "4", "--limit", "4",
         "--metrics", "accuracy,gmacs,params"]


def _records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]


def _error_line(err: str) -> str:
    errors = [line for line in err.splitlines() if line.startswith("vitbench: error:")]
    assert len(errors) == 1, err
    assert "Traceback" not in err
    return errors[0]


@pytest.fixture(scope="module")
def dense_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One VITBENCH_CACHE for this module's end-to-end runs: the default set is generated once."""
    return tmp_path_factory.mktemp("vitbench-cache")


@pytest.mark.slow
def test_det_end_to_end(dense_cache, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("VITBENCH_CACHE", str(dense_cache))
    out = tmp_path / "out"
    rc = main(["run", "--task", "det", "--methods", "tome,ltm", "--model", "mobilevit_xs", *SHORT,
               "--param", "ltm.epochs=1", "--out", str(out)])
    assert rc == 0
    records = _records(out)
    assert [r["method"] for r in records] == ["baseline", "baseline+ft", "tome", "ltm"]
    assert all(r["status"] == "ok" and r["error"] is None and r["task"] == "det" for r in records)
    for r in records:
        assert r["data"] == "shapes-coco" and r["model"] == "mobilevit_xs"
        assert all(0.0 <= r[k] <= 1.0 for k in ("box_map", "box_ap50", "box_ap75"))
        assert 0 < r["backbone_gmacs"] < r["gmacs"] and r["gmacs_input"] == "320x320"
        assert r["num_images"] == 4 and "mask_map" not in r
        assert r["detector"].startswith("SSDLite") and "light heads" in r["detector"]
    base, control, tome, ltm = records
    assert tome["gmacs"] < base["gmacs"] and ltm["gmacs"] < base["gmacs"]
    assert ltm["trained"] == "fine-tuned" and "trained" not in tome
    assert control["trained"] == "fine-tuned" and control["gmacs"] == base["gmacs"]
    report = (out / "report.md").read_text()
    assert "Box mAP" in report and "Mask mAP" not in report and "ΔBox mAP vs +ft" in report
    assert "Detector: SSDLite" in report and "Backbone GMACs" in report
    # the default set and the trained detector live in VITBENCH_CACHE
    assert (dense_cache / "shapes_coco" / "annotations" / "instances_val2017.json").is_file()
    assert len(list((dense_cache / "detectors").glob("det-mobilevit_xs-*.pth"))) == 1
    stdout = capsys.readouterr().out
    assert "Box mAP" in stdout and "report:" in stdout


@pytest.mark.slow
def test_seg_end_to_end(dense_cache, tmp_path, monkeypatch):
    monkeypatch.setenv("VITBENCH_CACHE", str(dense_cache))
    out = tmp_path / "out"
    assert main(["run", "--task", "seg", "--methods", "tome", *SHORT, "--out", str(out)]) == 0
    records = _records(out)
    assert [r["method"] for r in records] == ["baseline", "tome"]
    assert all(r["status"] == "ok" and r["model"] == "mobilevit_xs" for r in records)  # the dense default
    for r in records:
        assert all(0.0 <= r[k] <= 1.0 for k in ("box_map", "mask_map", "mask_ap50", "mask_ap75"))
        assert r["detector"].startswith("Mask R-CNN")
    report = (out / "report.md").read_text()
    assert "Mask mAP" in report and "Box mAP" in report and "Detector: Mask R-CNN" in report
    assert list((dense_cache / "detectors").glob("seg-mobilevit_xs-*.pth"))


def test_unknown_model_exits_2(shapes_root, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("VITBENCH_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "out"
    rc = main(["run", "--task", "det", "--methods", "tome", "--model", "no_such_model", "--data", str(shapes_root),
               "--out", str(out)])
    assert rc == 2
    assert "unknown model 'no_such_model'" in _error_line(capsys.readouterr().err)
    assert not out.exists()


def test_missing_data_exits_2_naming_the_path(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("VITBENCH_CACHE", str(tmp_path / "cache"))
    missing = tmp_path / "missing"
    out = tmp_path / "out"
    assert main(["run", "--task", "det", "--methods", "tome", "--data", str(missing), "--out", str(out)]) == 2
    line = _error_line(capsys.readouterr().err)
    assert f"COCO data folder {missing} does not exist" in line and "instances_train2017.json" in line
    assert not out.exists() and not (tmp_path / "cache").exists()


@pytest.mark.parametrize("argv, message", [
    (["--detector-epochs", "0"], "--detector-epochs 0 is out of range; it must be >= 1"),
    (["--limit", "0"], "--limit 0 is out of range; it must be >= 1"),
    (["--train-limit", "0"], "--train-limit 0 is out of range"),
    (["--metrics", "accuracy,ib"], "unknown metric 'ib'; valid metrics: accuracy,"),
    (["--param", "tome.r=-1"], "tome.r=-1 is out of range"),
    (["--methods", " , "], "--methods is empty"),
])
@pytest.mark.parametrize("task", ["det", "seg"])
def test_bad_input_exits_2_before_anything_runs(tmp_path, monkeypatch, capsys, task, argv, message):
    monkeypatch.setenv("VITBENCH_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "out"
    args = ["run", "--task", task, "--methods", "tome", *argv, "--out", str(out)]
    assert main(args) == 2
    assert message in _error_line(capsys.readouterr().err)
    assert not out.exists() and not (tmp_path / "cache").exists()  # no data generated, nothing written


def test_method_unsupported_by_the_backbone_exits_2(shapes_root, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("VITBENCH_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "out"
    rc = main(["run", "--task", "det", "--methods", "topk", "--data", str(shapes_root), "--out", str(out)])
    assert rc == 2
    assert "needs cls_attn, which the 'mobilevit' family" in _error_line(capsys.readouterr().err)
    assert not out.exists()


@pytest.mark.slow
def test_det_sweep_matches_the_backbone_gmacs(dense_cache, tmp_path, monkeypatch):
    # issue 10: the sweep reuses the dense run machinery; budgets are fractions of the backbone's
    # GMACs (the part a method reduces); ToMe on MobileViT cannot go below ~0.79 of them
    monkeypatch.setenv("VITBENCH_CACHE", str(dense_cache))
    out = tmp_path / "out"
    rc = main(["sweep", "--task", "det", "--methods", "tome", "--budgets", "0.9,0.5", "--no-controls", *SHORT,
               "--out", str(out)])
    assert rc == 1  # the unreachable budget is a failed run, the others are fine
    base, tome9, tome5 = _records(out)
    assert (base["status"], tome9["status"], tome5["status"]) == ("ok", "ok", "error")
    assert abs(tome9["backbone_gmacs"] / (0.9 * base["backbone_gmacs"]) - 1) <= 0.02
    assert tome9["budget"]["counted"] == "backbone" and tome9["label"] == f"tome (r={tome9['params']['r']}; matched 0.9x GMACs)"
    assert tome5["error"].startswith("tome cannot reach F = 0.5")
    report = (out / "report.md").read_text()
    assert "Box mAP at each budget:" in report and "### F = 0.9" in report and "backbone GMACs" in report
    assert (out / "pareto_gmacs.png").is_file() and (out / "pareto_throughput.png").is_file()
