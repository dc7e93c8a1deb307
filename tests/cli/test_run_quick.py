"""``--quick`` and ``--repeats N`` (issue 23, item 3): a fast look at the timings, recorded and said
in the report; a bad value is one line, exit 2, before anything runs. And the progress a command
prints where stderr is no terminal: plain lines, a final one per step with its time.
timm's tiny ``test_vit`` (random weights), throughput only: seconds per run."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from vitbench.cli.main import main

TINY = ["--task", "cls", "--model", "test_vit", "--methods", "tome", "--metrics", "throughput", "--batch-size", "2"]
COMMANDS = {"run": ["run", *TINY], "sweep": ["sweep", *TINY, "--budgets", "0.7"]}


def _records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]


def _one_line(err: str) -> str:
    lines = [x for x in err.splitlines() if not x.startswith("vitbench: warning: plugin")]
    assert len(lines) == 1 and lines[0].startswith("vitbench: error: "), err
    return lines[0]


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("flags, named", [
    (["--repeats", "0"], ["--repeats 0 is out of range", "an integer from 1 to 10000"]),
    (["--repeats", "x"], ["--repeats 'x' is not an integer", "an integer from 1 to 10000"]),
    (["--repeats", "10001"], ["--repeats 10001 is out of range", "from 1 to 10000"]),
    (["--quick", "--repeats", "3"], ["--quick and --repeats 3 were both given", "give one of them"]),
])
def test_a_bad_repeat_count_is_one_line_before_anything_runs(tmp_path, capsys, command, flags, named):
    out = tmp_path / "out"
    assert main([*COMMANDS[command], *flags, "--out", str(out)]) == 2
    captured = capsys.readouterr()
    line = _one_line(captured.err)
    assert all(part in line for part in named), line
    assert captured.out == "" and not out.exists()


def test_quick_records_its_repeats_and_the_report_says_so(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["run", *TINY, "--quick", "--out", str(out)]) == 0
    records = _records(out)
    assert [r["method"] for r in records] == ["baseline", "tome"]
    assert all(r["status"] == "ok" and r["throughput_repeats"] == 3 and r["timing_repeats"] == 3 for r in records)
    report = (out / "report.md").read_text()
    assert "Timed with 3 repeats (--quick): a fast look, not for publication." in report
    err = capsys.readouterr().err  # stderr is no terminal here: plain lines, no bars
    assert "\x1b" not in err
    assert "vitbench: timing throughput (batch 2): done, 5/5 forwards in " in err  # 2 warm-up + 3 repeats
    assert "vitbench: runs of the plan: done, 2/2 runs in " in err


def test_repeats_are_in_a_run_s_identity_only_when_given():
    from vitbench.run.plan import build_plan

    plan = build_plan(task="cls", model="test_vit", methods=["tome"], data=None, overrides={},
                      metrics=("throughput",), batch_size=2, device="cpu", seed=0)
    quick = build_plan(task="cls", model="test_vit", methods=["tome"], data=None, overrides={},
                       metrics=("throughput",), batch_size=2, device="cpu", seed=0, repeats=3)
    assert [s.repeats for s in quick] == [3, 3]
    assert all(a.spec_id != b.spec_id for a, b in zip(plan, quick))  # a --quick record never resumes a full run
    assert [dataclasses.replace(s, repeats=None).spec_id for s in quick] == [s.spec_id for s in plan]


def test_a_rank_above_0_prints_no_progress(tmp_path, capsys, monkeypatch):
    import vitbench.host.distributed

    monkeypatch.setattr(vitbench.host.distributed, "launcher_rank", lambda launcher: 1)
    assert main(["run", *TINY, "--quick", "--out", str(tmp_path / "out")]) == 0
    err = capsys.readouterr().err
    assert "runs of the plan" not in err and "timing throughput" not in err and "[1/2]" not in err
