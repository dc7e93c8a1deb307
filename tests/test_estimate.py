"""The plan's time left (:mod:`vitbench.run.estimate`): a run takes as long as the finished runs
of its kind; a method run before any of its kind adds to the baseline's time the phases the
baseline skips (the paired speed-up, a fine-tuning)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from vitbench.run.estimate import TRAIN_STEP_FORWARDS, run_seconds, seconds_left


def _spec(method: str, *, limit=None, repeats=None, train_limit=None, metrics=("accuracy", "throughput"),
          values=None):
    return SimpleNamespace(method=method, limit=limit, repeats=repeats, train_limit=train_limit, metrics=metrics,
                           batch_size=32, values=values)


def _trains(spec) -> bool:
    return spec.method == "ltmp"


BASE = _spec("baseline")
BASE_RECORD = {"status": "ok", "wall_s": 20.0, "throughput_img_s": 64.0, "eval_img_s": 100.0}


def test_nothing_finished_gives_no_estimate():
    assert run_seconds(_spec("tome"), [], _trains) is None
    assert seconds_left([_spec("tome")], [], _trains) is None


def test_a_method_before_any_of_its_kind_adds_the_paired_rounds_to_the_baseline():
    # 30 rounds of two forwards of 32 images at the baseline's 64 img/s: 30 s on top of its 20 s
    assert run_seconds(_spec("tome"), [(BASE, BASE_RECORD)], _trains) == pytest.approx(20.0 + 30.0)
    # --limit: 10 rounds; --quick (repeats 3): 3 rounds; no throughput: no paired timing
    assert run_seconds(_spec("tome", limit=200), [(BASE, BASE_RECORD)], _trains) == pytest.approx(30.0)
    assert run_seconds(_spec("tome", repeats=3), [(BASE, BASE_RECORD)], _trains) == pytest.approx(23.0)
    assert run_seconds(_spec("tome", metrics=("accuracy",)), [(BASE, BASE_RECORD)], _trains) == 20.0


def test_a_learnable_method_adds_its_fine_tuning_at_the_baselines_pace():
    spec = _spec("ltmp", train_limit=1000, values=SimpleNamespace(epochs=2))
    train = TRAIN_STEP_FORWARDS * 1000 * 2 / 100.0
    assert run_seconds(spec, [(BASE, BASE_RECORD)], _trains) == pytest.approx(20.0 + 30.0 + train)
    # a finished run of its kind is the estimate from then on
    done = [(BASE, BASE_RECORD), (spec, {"status": "ok", "wall_s": 200.0})]
    assert run_seconds(_spec("ltmp", train_limit=1000), done, _trains) == 200.0
    assert run_seconds(_spec("tome"), done, _trains) == pytest.approx(50.0)  # not its kind


def test_the_rest_of_the_plan_sums_its_runs_and_failed_runs_do_not_count():
    done = [(BASE, BASE_RECORD), (_spec("tome"), {"status": "ok", "wall_s": 44.0}),
            (_spec("topk"), {"status": "error", "wall_s": 1.0})]
    assert seconds_left([_spec("ppt"), _spec("topk")], done, _trains) == pytest.approx(88.0)
    assert seconds_left([], done, _trains) == 0
