"""Agreement with the unreduced model: the share of images whose top-1 is the baseline's, per row,
also when the baseline's run was an earlier one (``--resume``) or another process (``--isolate``)."""
from __future__ import annotations

import json

import pytest

from vitbench.cli.main import main


def _records(out):
    return {r["method"]: r for r in map(json.loads, (out / "runs.jsonl").read_text().splitlines())}


def _top1_agreement_oracle(out):
    """The agreement recomputed from the baseline's kept predictions (the file the run wrote)."""
    [path] = list((out / "work" / "baseline-top1").glob("*.json"))
    return json.loads(path.read_text())


@pytest.mark.slow
def test_each_row_says_how_often_it_answers_as_the_baseline(tmp_path):
    out = tmp_path / "out"
    common = ["--limit", "64", "--metrics", "accuracy", "--out", str(out)]
    assert main(["run", "--methods", "tome", "--param", "tome.r=0", *common]) == 0
    first = _records(out)
    assert "agreement_pct" not in first["baseline"]
    assert first["tome"]["agreement_pct"] == 100.0  # r=0 merges nothing: every answer is the baseline's
    assert len(_top1_agreement_oracle(out)) == 64
    # a later run into the same store: the baseline is not run again, its kept predictions are read
    assert main(["run", "--methods", "topk", "--param", "topk.keep=0.3", "--resume", *common]) == 0
    topk = _records(out)["topk"]
    assert 0.0 < topk["agreement_pct"] < 100.0
    report = (out / "report.md").read_text()
    assert "Agreement (%)" in report and "**Agreement**" in report
