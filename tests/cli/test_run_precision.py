"""``vitbench run --precision`` (issue 11, item 1): recorded per run and in the report's
environment; GMACs unchanged; bf16 works on the CPU."""
from __future__ import annotations

import json
from pathlib import Path

from vitbench.cli.main import main

FAST = ["--model", "test_vit", "--metrics", "gmacs,throughput", "--batch-size", "2", "--methods", "tome",
        "--param", "tome.r=4"]


def _records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]


def test_bf16_run_on_the_cpu_is_recorded(tmp_path):
    bf16, fp32 = tmp_path / "bf16", tmp_path / "fp32"
    assert main(["run", *FAST, "--precision", "bf16", "--out", str(bf16)]) == 0
    assert main(["run", *FAST, "--out", str(fp32)]) == 0
    half, full = _records(bf16), _records(fp32)
    assert [r["status"] for r in half] == ["ok", "ok"]
    assert all(r["precision"] == "bf16" and r["env"]["precision"] == "bf16" for r in half)
    assert all(r["precision"] == "fp32" and r["env"]["precision"] == "fp32" for r in full)
    assert [r["gmacs"] for r in half] == [r["gmacs"] for r in full]  # counted the same in any precision
    assert all(r["throughput_img_s"] > 0 for r in half)
    assert {r["spec_id"] for r in half}.isdisjoint(r["spec_id"] for r in full)  # another run, stored apart
    assert "- Precision: bf16" in (bf16 / "report.md").read_text()


def test_bad_precision_exits_2(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["run", *FAST, "--precision", "fp8", "--out", str(out)]) == 2
    assert "unknown precision 'fp8'; valid precisions: bf16, fp16, fp32" in capsys.readouterr().err
    assert not (out / "runs.jsonl").exists()
