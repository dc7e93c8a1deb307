"""``--batch-sizes`` (issue 38 item 2): throughput and latency timed at each batch size for every
row, the speed-up at each against the baseline, the report's table, sentences and plot; bad
input is one line, exit 2, before anything runs. timm's tiny ``test_vit`` (random weights)."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from vitbench.cli.main import main

TINY = ["--task", "cls", "--model", "test_vit", "--methods", "tome", "--batch-size", "2"]
COMMANDS = {"run": ["run", *TINY], "sweep": ["sweep", *TINY, "--budgets", "0.7"]}


def _records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("flags, named", [
    (["--batch-sizes", ""], ["--batch-sizes is empty", "from 1 to 65536"]),
    (["--batch-sizes", "1,x"], ["--batch-sizes item 'x' is not an integer", "from 1 to 65536"]),
    (["--batch-sizes", "0,4"], ["--batch-sizes item 0 is out of range", "from 1 to 65536"]),
    (["--batch-sizes", "1,65537"], ["--batch-sizes item 65537 is out of range", "from 1 to 65536"]),
    (["--batch-sizes", "4,1,4"], ["--batch-sizes names 4 twice (4,1,4)", "each is timed once"]),
    (["--batch-sizes", "1,4", "--metrics", "gmacs"],
     ["--batch-sizes times throughput and latency, but --metrics gmacs measures neither",
      "add throughput or latency"]),
])
def test_bad_batch_sizes_are_one_line_before_anything_runs(tmp_path, capsys, command, flags, named):
    out = tmp_path / "out"
    metrics = [] if "--metrics" in flags else ["--metrics", "gmacs,throughput"]
    assert main([*COMMANDS[command], *metrics, *flags, "--out", str(out)]) == 2
    captured = capsys.readouterr()
    lines = [x for x in captured.err.splitlines() if not x.startswith("vitbench: warning: plugin")]
    assert len(lines) == 1 and lines[0].startswith("vitbench: error: "), captured.err
    assert all(part in lines[0] for part in named), lines[0]
    assert captured.out == "" and not out.exists()


def test_every_row_is_timed_at_each_batch_size_and_the_report_says_where_each_method_pays(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["run", *TINY[:5], "tome,random", "--metrics", "throughput,latency", "--batch-size", "2",
                 "--batch-sizes", "4,1,2", "--quick", "--out", str(out)]) == 0
    records = _records(out)
    assert [r["method"] for r in records] == ["baseline", "tome", "random"]
    for r in records:
        assert r["status"] == "ok" and r["batch_size"] == 2
        assert [p["batch_size"] for p in r["batch_curve"]] == [1, 2, 4]
        for p in r["batch_curve"]:
            # milliseconds of one forward and images per second come from the same repeats
            assert p["latency_ms"] > 0 and p["throughput_img_s"] > 0
            assert p["batch_size"] / (p["latency_ms"] / 1e3) == pytest.approx(p["throughput_img_s"], rel=0.5)
        # the throughput at --batch-size is the curve's point at that size, not a second timing
        assert r["throughput_img_s"] == r["batch_curve"][1]["throughput_img_s"]
    base = {p["batch_size"]: p["throughput_img_s"] for p in records[0]["batch_curve"]}
    assert all(p["speedup"] == 1.0 for p in records[0]["batch_curve"])
    for r in records[1:]:
        for p in r["batch_curve"]:
            assert p["speedup"] == pytest.approx(p["throughput_img_s"] / base[p["batch_size"]])
    report = (out / "report.md").read_text()
    assert "| Method | bs 1 | bs 2 | bs 4 |" in report and "Where each method pays:" in report
    lines = report.splitlines()
    start = lines.index("Where each method pays:")
    for label, said in zip(("- tome (r=", "- random ("), lines[start + 1:start + 3]):
        assert said.startswith(label) and any(words in said for words in (
            "faster than the baseline", "slower than the baseline", "faster only at batch")), said
    png = out / "report-speedup-vs-batch.png"
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert f"plot:   {png}" in capsys.readouterr().out


def test_batch_sizes_are_in_a_run_s_identity_only_when_given():
    from vitbench.run.plan import build_plan

    common = dict(task="cls", model="test_vit", methods=["tome"], data=None, overrides={},
                  metrics=("throughput",), batch_size=2, device="cpu", seed=0)
    plan, curved = build_plan(**common), build_plan(**common, batch_sizes=[16, 1, 4])
    assert [s.batch_sizes for s in curved] == [(1, 4, 16)] * 2
    assert all(a.spec_id != b.spec_id for a, b in zip(plan, curved))  # a curve is never resumed from a plain run
    assert [dataclasses.replace(s, batch_sizes=None).spec_id for s in curved] == [s.spec_id for s in plan]
