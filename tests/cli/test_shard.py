"""``--shard I/N`` (issue 13, item 3): disjoint parts of a plan or sweep into one folder, each
appending to its own file, merged on read; the halves give the unsharded sweep's report."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from vitbench.cli.main import main
from vitbench.errors import ParamError
from vitbench.run.plan import build_seeded_plan, parse_shard, shard_plan
from vitbench.report.sweep import budget_records, summary_table
from vitbench.report.tables import comparison_table
from vitbench.results import ResultStore

SWEEP = ["sweep", "--task", "cls", "--model", "test_vit", "--methods", "tome,topk", "--param", "topk.layers=(1,3)",
         "--budgets", "0.9,0.6", "--metrics", "gmacs,params", "--no-controls"]


def _plan(seeds=(0, 1)):
    return build_seeded_plan(seeds=seeds, task="cls", model="test_vit", methods=["tome", "topk", "ppt"], data=None,
                             overrides={"ppt": {"layers": "(1,3)"}, "topk": {"layers": "(1,3)"}},
                             metrics=("gmacs",), batch_size=2, device="cpu")


def test_shards_are_disjoint_and_cover_the_plan():
    plan = _plan()
    parts = [shard_plan(plan, i, 4) for i in (1, 2, 3, 4)]
    methods = [[s.spec_id for s in part if s.method != "baseline"] for part in parts]
    assert sorted(sum(methods, [])) == sorted(s.spec_id for s in plan if s.method != "baseline")
    assert all(len(set(a) & set(b)) == 0 for i, a in enumerate(methods) for b in methods[i + 1:])
    for part in parts:  # each part has the baselines of the seeds its methods run on, first in plan order
        seeds = {s.seed for s in part if s.method != "baseline"}
        assert {s.seed for s in part if s.method == "baseline"} == seeds
        assert [s.spec_id for s in part] == [s.spec_id for s in plan if s in part]
    assert shard_plan(plan, 1, 1) == plan
    assert shard_plan(_plan(seeds=(0,)), 4, 4) == []  # 3 method runs over 4 shards: the 4th is empty


@pytest.mark.parametrize("text", ["0/2", "3/2", "1", "a/b", "1/0", "-1/2"])
def test_bad_shard_is_a_clear_error(text):
    with pytest.raises(ParamError, match=r"--shard .* is not I/N with 1 <= I <= N"):
        parse_shard(text)


def _rec(spec_id: str) -> dict:
    return {"spec_id": spec_id, "status": "ok", "task": "cls", "model": "m", "method": "tome"}


def test_store_merges_shard_files(tmp_path):
    ResultStore(tmp_path).append(_rec("a"))
    ResultStore(tmp_path, shard=(2, 2)).append(_rec("c"))
    ResultStore(tmp_path, shard=(1, 2)).append(_rec("b"))
    assert (tmp_path / "runs-shard-1-of-2.jsonl").is_file() and (tmp_path / "runs-shard-2-of-2.jsonl").is_file()
    assert [r["spec_id"] for r in ResultStore(tmp_path).records()] == ["a", "b", "c"]
    assert [r["spec_id"] for r in ResultStore(tmp_path / "runs.jsonl").records()] == ["a"]  # one file: itself


def test_two_halves_of_a_sweep_give_the_unsharded_report(tmp_path):
    whole, halves = tmp_path / "whole", tmp_path / "halves"
    assert main([*SWEEP, "--out", str(whole)]) == 0
    assert main([*SWEEP, "--shard", "1/2", "--out", str(halves)]) == 0
    assert main([*SWEEP, "--shard", "2/2", "--out", str(halves)]) == 0
    assert not (halves / "runs.jsonl").exists()
    first = [json.loads(x) for x in (halves / "runs-shard-1-of-2.jsonl").read_text().splitlines()]
    second = [json.loads(x) for x in (halves / "runs-shard-2-of-2.jsonl").read_text().splitlines()]
    assert [r["method"] for r in second if r["method"] == "baseline"] == []  # the sweep reused shard 1's
    a, b = ResultStore(whole).records(), ResultStore(halves).records()
    assert sorted(r["spec_id"] for r in a) == sorted(r["spec_id"] for r in first + second)
    assert summary_table(a, "cls", "test_vit").equals(summary_table(b, "cls", "test_vit"))
    for budget in (0.9, 0.6):
        ta, tb = (comparison_table(budget_records(r, budget), "cls", "test_vit") for r in (a, b))
        assert ta.equals(tb) and len(ta) == 3  # the baseline, tome and topk at this budget
    assert main(["report", str(halves), "--sweep", "-o", str(tmp_path / "merged.md")]) == 0
    merged = (tmp_path / "merged.md").read_text()
    assert "topk" in merged and "tome" in merged


def test_an_empty_shard_says_so_and_exits_0(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["run", "--model", "test_vit", "--methods", "tome", "--metrics", "gmacs", "--shard", "2/2",
                 "--out", str(out)]) == 0
    assert "shard 2/2 holds no runs of this plan" in capsys.readouterr().err
    assert not out.exists()
