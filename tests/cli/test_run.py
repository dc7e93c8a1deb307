"""``vitbench run``: the CLI contract and its bad-input behaviour (issue #2, items 8-9).

Uses timm's tiny registered ``test_vit`` (random weights, 160x160, 6 blocks) without accuracy,
so no data is needed and each run takes a second.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from vitbench.cli.main import main
from vitbench.hookspecs import hookimpl
from vitbench.host import get_host

FAST = ["--model", "test_vit", "--metrics", "gmacs,params,throughput", "--batch-size", "2"]


def _records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]


def test_run_writes_store_report_and_plot(tmp_path, capsys):
    out = tmp_path / "out"
    rc = main(["run", "--task", "cls", "--methods", "tome,ppt", "--param", "tome.r=4",
               "--param", "ppt.layers=(1,3)", "--param", "ppt.r=10", *FAST, "--out", str(out)])
    assert rc == 0
    records = _records(out)
    assert [r["method"] for r in records] == ["baseline", "tome", "ppt"]
    assert all(r["status"] == "ok" and r["error"] is None for r in records)
    base, tome, ppt = records
    assert tome["params"] == {"r": 4, "prop_attn": True, "trace_source": False}
    assert ppt["params"]["layers"] == [1, 3]
    assert tome["gmacs"] < base["gmacs"] and ppt["gmacs"] < base["gmacs"]
    assert base["speedup"] == 1.0 and tome["speedup"] > 0 and tome["efficiency"] > 0
    # each method's speed-up timed in turn with the baseline, its efficiency taken from it
    assert "speedup_paired" not in base and tome["speedup_paired"] and ppt["speedup_paired"]
    assert tome["speedup_rounds"] == 30 and tome["throughput_repeats"] == 10  # the speed-up column: more rounds
    # the method's own time: timed in turn with its token counts' limit, as many rounds as the throughput
    assert tome["overhead_rounds"] == 10 and len(tome["overhead_counts"]) == 6 and "overhead_pct" not in base
    assert tome["overhead_ms"] == pytest.approx(tome["overhead_pct"] / 100 * 1000 * 2 / tome["throughput_img_s"])
    assert tome["efficiency"] == pytest.approx(tome["speedup"] * tome["gmacs"] / base["gmacs"])
    assert base["params_m"] == tome["params_m"]
    for key in ("task", "model", "params", "seed", "env", "throughput_img_s", "batch_size"):
        assert key in tome
    assert tome["env"]["versions"]["torch"] == torch.__version__.split("+")[0] or tome["env"]["versions"]["torch"]
    report = (out / "report.md").read_text()
    assert "tome (r=4" in report and "baseline" in report
    assert "**Paired speed-ups**" in report and "Overhead (% of fwd)" in report and "**Overhead**" in report
    assert (out / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    err = capsys.readouterr().err
    assert "[1/3] baseline" in err and "[3/3] ppt" in err


@pytest.mark.parametrize("argv, message", [
    (["--methods", "nope"], "unknown method 'nope'; valid methods: "),
    (["--methods", "tome", "--task", "nope"], "unknown task 'nope'; valid tasks: agreement, cls, det, seg"),
    (["--methods", "tome", "--param", "tome.r=-3"], "tome.r=-3 is out of range"),
    (["--methods", "ppt", "--param", "ppt.layers=(3,99)"],
     "ppt.layers contains 99; valid block indices for this model: 0..5"),
    (["--methods", "ppt", "--param", "ppt.score=nope"], "unknown scorer 'nope'; valid scorers: average, cls-attn, entropy"),
    (["--methods", "tome", "--param", "ppt.r=3"], "--param names method 'ppt', which is not in --methods"),
    (["--methods", "tome", "--param", "tome.x=3"], "unknown parameter tome.x; valid parameters of tome: r,"),
    (["--methods", "tome", "--metrics", "gmacs,speed"], "unknown metric 'speed'; valid metrics: accuracy,"),
    (["--methods", "tome", "--device", "tpu"], "unknown device 'tpu'; valid devices: cpu, cuda"),
])
def test_bad_input_exits_2_with_one_line(tmp_path, capsys, argv, message):
    out = tmp_path / "out"
    rc = main(["run", *FAST, *argv, "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2
    errors = [line for line in err.splitlines() if line.startswith("vitbench: error:")]
    assert len(errors) == 1 and message in errors[0]
    assert "Traceback" not in err
    assert not (out / "runs.jsonl").exists()


def test_unknown_model_suggests_names(tmp_path, capsys):
    assert main(["run", "--methods", "tome", "--model", "deit_smal_patch16_224", "--metrics", "gmacs",
                 "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "deit_smal_patch16_224" in err and "deit_small_patch16_224" in err


def test_backbone_outside_the_vit_family_is_unsupported(tmp_path, capsys):
    assert main(["run", "--methods", "tome", "--model", "test_resnet", "--metrics", "gmacs",
                 "--out", str(tmp_path)]) == 2
    assert "no model-family adapter recognises ResNet; supported families: efficientvit, mobilevit, swin, vit" in capsys.readouterr().err


def test_unreadable_checkpoint(tmp_path, capsys):
    bad = tmp_path / "broken.pth"
    bad.write_bytes(b"not a checkpoint")
    assert main(["run", "--methods", "tome", *FAST, "--checkpoint", str(bad), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "Traceback" not in err


def test_missing_and_malformed_data_folder(tmp_path, capsys):
    missing = tmp_path / "nowhere"
    assert main(["run", "--methods", "tome", "--model", "test_vit", "--data", str(missing),
                 "--out", str(tmp_path / "o")]) == 2
    assert str(missing) in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["run", "--methods", "tome", "--model", "test_vit", "--data", str(empty),
                 "--out", str(tmp_path / "o")]) == 2
    assert "malformed" in capsys.readouterr().err


class _Exploding:
    """A method plugin whose reducer raises mid-forward."""

    @hookimpl
    def vitbench_register_methods(self, register):
        from dataclasses import dataclass

        from vitbench.catalog import MethodSpec, Reduction
        from vitbench.engine import Reducer

        @dataclass(frozen=True)
        class NoParams:
            pass

        class Explode(Reducer):
            def __call__(self, x, state, info):
                raise RuntimeError("boom in block 2")

        register(MethodSpec("explode", NoParams,
                            lambda p, info: Reduction([Explode() if i == 2 else None for i in range(info.depth)])))


def test_failed_run_is_recorded_and_the_others_go_on_then_resume_retries_it(tmp_path, capsys):
    get_host().add_plugin(_Exploding(), "exploding")
    out = tmp_path / "out"
    assert main(["run", "--methods", "explode,tome", *FAST, "--out", str(out)]) == 1
    records = _records(out)
    assert [(r["method"], r["status"]) for r in records] == [("baseline", "ok"), ("explode", "error"), ("tome", "ok")]
    assert records[1]["error"] == "RuntimeError: boom in block 2"
    assert "explode" in (out / "report.md").read_text() and "boom in block 2" in (out / "report.md").read_text()
    capsys.readouterr()
    assert main(["run", "--methods", "explode,tome", *FAST, "--out", str(out), "--resume"]) == 1
    again = _records(out)
    assert [r["method"] for r in again[3:]] == ["explode"]  # only the failed run was retried
    assert "already finished (resume): skipped" in capsys.readouterr().err


def test_report_command_renders_a_store(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["run", "--methods", "tome", *FAST, "--out", str(out)]) == 0
    target = tmp_path / "r" / "x.md"
    target.parent.mkdir()
    assert main(["report", str(out), "-o", str(target)]) == 0
    assert "tome" in target.read_text() and target.with_suffix(".png").exists()
    assert main(["report", str(tmp_path / "none"), "-o", str(target)]) == 2
