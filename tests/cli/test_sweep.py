"""``vitbench sweep`` (issue 10): every method at every budget plus the baseline once, one store,
re-running skips what is done; report with per-budget tables, summary and two Pareto PNGs.
timm's tiny ``test_vit`` (random weights), GMACs and parameters only: seconds per run."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from vitbench.measure.calibrate import TOLERANCE
from vitbench.cli.main import main

SWEEP = ["sweep", "--task", "cls", "--model", "test_vit", "--methods", "tome,topk", "--param", "topk.layers=(1,3)",
         "--no-controls", "--budgets", "0.9,0.6", "--metrics", "gmacs,params"]  # SWEEP[:-4]: without the last two
PNG = b"\x89PNG\r\n\x1a\n"


def _records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def swept(tmp_path_factory) -> tuple[Path, str]:
    """One sweep, shared (its tests copy it before changing it), and what it printed."""
    import contextlib
    import io

    out = tmp_path_factory.mktemp("sweep") / "out"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main([*SWEEP, "--out", str(out)]) == 0
    return out, printed.getvalue()


def test_sweep_runs_each_method_at_each_budget_and_the_baseline_once(swept):
    out, printed = swept
    records = _records(out)
    assert [(r["method"], r.get("match_gmacs")) for r in records] == [
        ("baseline", None), ("tome", 0.9), ("topk", 0.9), ("tome", 0.6), ("topk", 0.6)]
    base = records[0]
    for r in records[1:]:
        assert r["status"] == "ok" and abs(r["gmacs"] / (r["match_gmacs"] * base["gmacs"]) - 1) <= TOLERANCE
    assert len({r["gmacs"] for r in records if r["method"] == "tome"}) == 2
    report = (out / "report.md").read_text()
    for text in ("### Summary", "### F = 0.9 (90 % of the baseline's GMACs)", "### F = 0.6 (60 % of the baseline's GMACs)",
                 "![Pareto: accuracy vs GMACs](pareto_gmacs.png)",
                 "![Pareto: accuracy vs throughput](pareto_throughput.png)", "GMACs at each budget (no accuracy measured)"):
        assert text in report
    for r in records[1:]:
        assert r["label"] in report  # tome (r=..), topk (keep=.., layers=[1,3])
    for name in ("pareto_gmacs.png", "pareto_throughput.png"):
        assert (out / name).read_bytes()[:8] == PNG
    assert "F = 0.9" in printed and "pareto_gmacs.png" in printed


def test_a_sweep_runs_the_controls_beside_the_methods(tmp_path):
    """Without ``--no-controls`` a sweep adds ``downsample`` and ``random`` at every budget:
    random within the tolerance, downsample within it or at the nearest grid under the budget."""
    out = tmp_path / "out"
    assert main(["sweep", "--task", "cls", "--model", "test_vit", "--methods", "tome", "--budgets", "0.8",
                 "--metrics", "gmacs", "--out", str(out)]) == 0
    records = _records(out)
    assert [(r["method"], r.get("match_gmacs")) for r in records] == [
        ("baseline", None), ("tome", 0.8), ("downsample", 0.8), ("random", 0.8)]
    base = records[0]["gmacs"]
    for r in records[1:]:
        off = r["gmacs"] / (0.8 * base) - 1
        assert r["status"] == "ok"
        assert abs(off) <= TOLERANCE or (r["method"] == "downsample" and off < 0 and not r["budget"]["landed_within"])


def test_rerunning_a_sweep_skips_done_runs_and_runs_only_what_is_missing(swept, tmp_path, capsys):
    out = tmp_path / "sweep"
    shutil.copytree(swept[0], out)
    first = (out / "runs.jsonl").read_text().splitlines()
    assert main([*SWEEP, "--out", str(out)]) == 0  # no --resume needed
    assert (out / "runs.jsonl").read_text().splitlines() == first
    assert capsys.readouterr().err.count("already finished (resume): skipped") == 5
    # interrupted after four runs: re-running runs the last one only; a new budget adds its runs
    (out / "runs.jsonl").write_text("\n".join(first[:4]) + "\n")
    assert main([*SWEEP[:-4], "--budgets", "0.9,0.6,0.75", "--metrics", "gmacs,params", "--out", str(out)]) == 0
    again = _records(out)
    assert [(r["method"], r["match_gmacs"]) for r in again[4:]] == [("topk", 0.6), ("tome", 0.75), ("topk", 0.75)]
    assert "### F = 0.75" in (out / "report.md").read_text()


@pytest.mark.parametrize("budgets, message", [
    ("0.9,1.2", "--budgets item '1.2' is out of range; the fraction of the baseline's GMACs to keep must be in (0, 1]"),
    ("", "--budgets '' is empty"),
    ("0.5,0.5", "--budgets names 0.5 twice"),
])
def test_malformed_budgets_exit_2(tmp_path, capsys, budgets, message):
    argv = [*SWEEP[:-4], "--budgets", budgets, "--metrics", "gmacs", "--out", str(tmp_path / "o")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"vitbench: error: {message}" in err and "Traceback" not in err
    assert not (tmp_path / "o" / "runs.jsonl").exists()


def test_sweep_requires_budgets(capsys):
    with pytest.raises(SystemExit):
        main(["sweep", "--methods", "tome"])
    assert "--budgets" in capsys.readouterr().err


def test_report_command_renders_a_sweep_store(swept, tmp_path, capsys):
    target = tmp_path / "again" / "sweep.md"
    target.parent.mkdir()
    assert main(["report", str(swept[0]), "-o", str(target), "--sweep"]) == 0
    text = target.read_text()
    assert "### Summary" in text and "### F = 0.6" in text
    assert (target.parent / "pareto_gmacs.png").read_bytes()[:8] == PNG


def test_report_sweep_refuses_a_store_without_a_sweep(tmp_path, capsys):
    out = tmp_path / "plain"
    assert main(["run", "--task", "cls", "--model", "test_vit", "--methods", "tome", "--metrics", "gmacs",
                 "--out", str(out)]) == 0
    before = (out / "report.md").read_text()
    capsys.readouterr()
    assert main(["report", str(out), "--sweep"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.splitlines()[-1].startswith(f"vitbench: error: --sweep: result store '{out / 'runs.jsonl'}' holds "
                                           f"no sweep") and "Traceback" not in err
    assert (out / "report.md").read_text() == before  # not overwritten with an empty table


@pytest.mark.slow
def test_a_sweep_on_changed_data_prints_the_new_datas_numbers(tmp_path, folder_writer, capsys):
    data = tmp_path / "data"
    folder_writer(data / "val", {"a": 4, "b": 1})
    folder_writer(data / "train", {"a": 2, "b": 2}, seed=1)
    args = ["sweep", "--task", "cls", "--model", "test_vit", "--methods", "tome", "--no-controls", "--budgets",
            "0.9", "--metrics", "accuracy,gmacs", "--data", str(data), "--num-classes", "2", "--workers", "0",
            "--out", str(tmp_path / "out")]
    assert main(args) == 0
    capsys.readouterr()
    (data / "val" / "a").rename(data / "val" / "x")  # the classes' images swapped
    (data / "val" / "b").rename(data / "val" / "a")
    (data / "val" / "x").rename(data / "val" / "b")
    assert main(args) == 0
    printed = capsys.readouterr().out
    old, new = [r for r in _records(tmp_path / "out") if r["method"] == "tome"]  # measured again, not resumed
    assert old["spec_id"] != new["spec_id"] and old["top1_pct"] != new["top1_pct"]
    row = next(line for line in printed.splitlines() if line.startswith("| tome"))
    assert f"{new['top1_pct']:.2f}" in row
