"""``vitbench run --match-gmacs F`` (issue 10): every method's knob matched to F x the baseline's
GMACs, the knob in the labels, clear errors for malformed and unreachable budgets and for a
method without a knob. timm's tiny ``test_vit`` (random weights, 6 blocks, 100 patches), GMACs only."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from vitbench.measure.calibrate import TOLERANCE
from vitbench.cli.main import main
from vitbench.hookspecs import hookimpl
from vitbench.host import get_host

FAST = ["--model", "test_vit", "--metrics", "gmacs"]
TOPK = ["--param", "topk.layers=(1,3)"]  # test_vit has 6 blocks


def _records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]


def test_matched_runs_land_within_tolerance_with_their_knobs_in_record_label_and_report(tmp_path):
    out = tmp_path / "out"
    assert main(["run", "--methods", "tome,topk", *FAST, *TOPK, "--match-gmacs", "0.6", "--out", str(out)]) == 0
    base, tome, topk = _records(out)
    assert base["method"] == "baseline" and "match_gmacs" not in base and "budget" not in base
    for rec, param in ((tome, "r"), (topk, "keep")):
        assert rec["status"] == "ok" and rec["match_gmacs"] == 0.6
        budget = rec["budget"]
        assert budget["param"] == param and rec["params"][param] == budget["value"]
        assert budget["target_gmacs"] == pytest.approx(0.6 * base["gmacs"])
        assert abs(rec["gmacs"] / (0.6 * base["gmacs"]) - 1) <= TOLERANCE
        assert budget["landed_gmacs"] == rec["gmacs"] == pytest.approx(budget["calibrated_gmacs"])
        assert budget["landed_within"] is True
    assert tome["label"] == f"tome (r={json.dumps(tome['params']['r'], separators=(',', ':'))}; matched 0.6x GMACs)"
    assert topk["label"] == f"topk (keep={topk['params']['keep']}, layers=[1,3]; matched 0.6x GMACs)"
    report = (out / "report.md").read_text()
    assert tome["label"] in report and topk["label"] in report
    assert "Matched compute (F = 0.6)" in report and "searched on the GMACs count" in report


def test_the_knob_shows_even_when_it_equals_its_default(tmp_path):
    # topk's default keep is 0.7: a matched row still says keep=... (a plain run would not)
    from vitbench.run.plan import build_plan

    spec = build_plan(task="cls", model="m", methods=["topk"], data=None, overrides={}, metrics=("gmacs",),
                      batch_size=1, device="cpu", seed=0, match_gmacs=0.5)[1]
    assert "keep" not in spec.params and spec.label == "topk (matched 0.5x GMACs)"
    assert spec.matched_label({**spec.params, "keep": 0.7}) == "topk (keep=0.7; matched 0.5x GMACs)"


@pytest.mark.parametrize("value", ["0", "1.5", "-0.2", "abc", "nan"])
def test_malformed_match_gmacs_exits_2_naming_the_value_and_range(tmp_path, capsys, value):
    out = tmp_path / "out"
    assert main(["run", "--methods", "tome", *FAST, "--match-gmacs", value, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"vitbench: error: --match-gmacs {value!r}" in err and "(0, 1]" in err and "Traceback" not in err
    assert not (out / "runs.jsonl").exists()


def test_a_param_that_sets_the_knob_conflicts_with_matching(tmp_path, capsys):
    assert main(["run", "--methods", "tome", *FAST, "--param", "tome.r=4", "--match-gmacs", "0.6",
                 "--out", str(tmp_path / "o")]) == 2
    assert "--param tome.r conflicts with matched compute: r is tome's budget knob" in capsys.readouterr().err


def test_an_unreachable_budget_is_an_error_for_that_run_and_the_others_go_on(tmp_path):
    out = tmp_path / "out"
    # PPT at two blocks of six halves the tokens at most: it cannot get below 0.55 x; top-k can
    rc = main(["run", "--methods", "ppt,topk", *FAST, *TOPK, "--param", "ppt.layers=(1,3)", "--match-gmacs",
               "0.45", "--out", str(out)])
    assert rc == 1
    base, ppt, topk = _records(out)
    assert (ppt["status"], topk["status"]) == ("error", "ok")
    assert ppt["error"].startswith("ppt cannot reach F = 0.45 ") and "valid budgets for ppt here: F >= 0.5" in ppt["error"]
    assert ppt["label"] == "ppt (layers=[1,3]; matched 0.45x GMACs)"
    assert abs(topk["gmacs"] / (0.45 * base["gmacs"]) - 1) <= TOLERANCE
    report = (out / "report.md").read_text()
    assert "Failed runs:" in report and "ppt cannot reach F = 0.45" in report


class _Knobless:
    """A third-party method that declares no budget knob."""

    @hookimpl
    def vitbench_register_methods(self, register):
        from vitbench.catalog import MethodSpec, Reduction

        @dataclass(frozen=True)
        class NoParams:
            pass

        register(MethodSpec("knobless", NoParams, lambda p, info: Reduction([None] * info.depth)))


def test_a_third_party_method_without_a_knob_is_reported_not_matchable(tmp_path):
    get_host().add_plugin(_Knobless(), "knobless-plugin")
    out = tmp_path / "out"
    assert main(["run", "--methods", "knobless,tome", *FAST, "--match-gmacs", "0.7", "--out", str(out)]) == 1
    records = _records(out)
    assert [(r["method"], r["status"]) for r in records] == [("baseline", "ok"), ("knobless", "error"), ("tome", "ok")]
    assert records[1]["error"].startswith("knobless is not matchable: its plugin declares no budget knob")
    assert "knobless (matched 0.7x GMACs): knobless is not matchable" in (out / "report.md").read_text()
    # without --match-gmacs it runs at its own defaults as before
    assert main(["run", "--methods", "knobless", *FAST, "--out", str(tmp_path / "plain")]) == 0


def test_matching_measures_gmacs_even_when_left_out_of_metrics(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["run", "--methods", "tome", "--model", "test_vit", "--metrics", "params",
                 "--match-gmacs", "0.8", "--out", str(out)]) == 0
    assert "measuring gmacs too" in capsys.readouterr().err
    assert all(r.get("gmacs") for r in _records(out))
