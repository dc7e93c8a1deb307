"""``--launcher none|pytorch`` (issue 13 item 2): under ``torchrun --nproc-per-node 2`` on the CPU
(gloo) the cls evaluation is sharded by mmengine's ``DefaultSampler`` and collected by its
``Evaluator``, with the same top-1 as one process, and rank 0 alone writes the store and report;
what cannot run distributed yet is refused before anything runs."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from vitbench.cli.main import main

#: an odd image count: DefaultSampler pads rank 1's part with one repeated image, which the
#: evaluator must drop (mmengine's collect_results cuts the gathered results to the data's size)
LIMIT = "199"


def _records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]


def _top1(out: Path) -> dict[str, float]:
    return {r["method"]: r["top1_pct"] for r in _records(out)}


def _vitbench(cwd: Path, *prefix: str, args: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([*prefix, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=240)


@pytest.mark.slow
def test_torchrun_two_ranks_give_the_single_process_top1_and_one_store(tmp_path):
    torchrun = shutil.which("torchrun")
    runner = [torchrun] if torchrun else [sys.executable, "-m", "torch.distributed.run"]
    args = ["run", "--task", "cls", "--methods", "tome", "--metrics", "accuracy", "--limit", LIMIT]
    one = _vitbench(tmp_path, sys.executable, "-m", "vitbench", args=[*args, "--out", "D1"])
    assert one.returncode == 0, one.stderr
    two = _vitbench(tmp_path, *runner, "--standalone", "--nproc-per-node", "2", "-m", "vitbench",
                    args=[*args, "--launcher", "pytorch", "--out", "D2"])
    assert two.returncode == 0, two.stderr[-4000:]
    assert _top1(tmp_path / "D2") == _top1(tmp_path / "D1")
    records = _records(tmp_path / "D2")
    assert [r["method"] for r in records] == ["baseline", "tome"]  # rank 0's records only, once
    assert all(r["status"] == "ok" and r["num_images"] == int(LIMIT) for r in records)
    assert sorted(p.name for p in (tmp_path / "D2").glob("*.jsonl")) == ["runs.jsonl"]
    assert (tmp_path / "D2" / "report.md").is_file()
    assert two.stdout.count("| tome") == 1  # one summary (rank 0's)
    assert not (tmp_path / ".dist_test").exists()  # results gathered in the spec's work folder


@pytest.mark.parametrize("extra, message", [
    (["--task", "det", "--methods", "tome"], "--launcher pytorch supports the cls task(s) so far (TaskSpec.distributed); --task is 'det'"),
    (["--methods", "dynamicvit"], "--launcher pytorch does not fine-tune learnable methods yet (dynamicvit)"),
    (["--methods", "tome"], "--launcher pytorch needs the environment torchrun sets"),
])
def test_what_cannot_run_distributed_is_refused_before_anything_runs(tmp_path, capsys, monkeypatch, extra, message):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    code = main(["run", *extra, "--launcher", "pytorch", "--out", str(tmp_path / "out")])
    assert code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_an_unknown_launcher_is_refused_by_the_parser(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["run", "--methods", "tome", "--launcher", "slurm"])
    assert exc.value.code == 2
    assert "invalid choice: 'slurm'" in capsys.readouterr().err
