"""``vitbench run --seeds``: every spec once per seed, per-seed records, one aggregated report row,
speed-ups paired per seed, ``--resume`` per seed. Uses timm's tiny ``test_vit`` without data."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from vitbench.cli.main import main

FAST = ["--model", "test_vit", "--metrics", "params,throughput,latency", "--batch-size", "2",
        "--methods", "tome", "--param", "tome.r=4"]


def _records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]


def test_two_seeds_end_to_end_then_resume_adds_a_third(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["run", *FAST, "--seeds", "0,1", "--out", str(out)]) == 0
    records = _records(out)
    assert [(r["method"], r["seed"], r["status"]) for r in records] == [
        ("baseline", 0, "ok"), ("tome", 0, "ok"), ("baseline", 1, "ok"), ("tome", 1, "ok")]
    base0, tome0, base1, tome1 = records
    # each method run's speed-up is timed in turn with the baseline, in its own run
    assert all(r["speedup_paired"] and r["speedup"] > 0 for r in (tome0, tome1))
    assert base0["speedup"] == base1["speedup"] == 1.0
    # the timing records keep their raw facts
    for key in ("load_before", "load_after", "cores", "threads", "spread_ratio", "flagged", "flag_reason"):
        assert f"throughput_{key}" in tome1 and f"latency_{key}" in tome1
    assert tome0["params_m"] == tome1["params_m"] == base1["params_m"]
    report = (out / "report.md").read_text()
    rows = [line for line in report.splitlines() if line.startswith("| tome (r=4)")]
    assert len(rows) == 1 and "| 0,1 (n=2) |" in rows[0]
    assert "Seeds: a row holds the runs that differ only by their seed" in report
    err = capsys.readouterr().err
    assert "[4/4] tome (r=4)" in err

    # --resume with a third seed runs only seed 2's baseline and method
    assert main(["run", *FAST, "--seeds", "0,1,2", "--resume", "--out", str(out)]) == 0
    records = _records(out)
    assert [(r["method"], r["seed"]) for r in records[4:]] == [("baseline", 2), ("tome", 2)]
    err = capsys.readouterr().err
    assert err.count("already finished (resume): skipped") == 4
    report = (out / "report.md").read_text()
    assert "| 0,1,2 (n=3) |" in report


def test_seed_and_seeds_together_are_refused(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["run", *FAST, "--seed", "3", "--seeds", "0,1", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--seed 3 and --seeds 0,1 were both given" in err
    assert not (out / "runs.jsonl").exists()


def test_bad_seeds_are_refused_before_anything_runs(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["run", *FAST, "--seeds", "0,0", "--out", str(out)]) == 2
    assert "--seeds names seed 0 twice" in capsys.readouterr().err
    assert not (out / "runs.jsonl").exists()
