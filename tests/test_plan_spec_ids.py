"""Spec ids key the result store, so they never change: a task's own spec fields
(``RunSpec.task_fields``, det's ``dense_finetune``) hash as the top-level keys they were when they
were ``RunSpec`` fields, and only when set. The ids below were computed before the task fields
existed."""
from __future__ import annotations

import pytest

from vitbench.run.plan import CONTROL, RunSpec, build_plan

DET = dict(task="det", model="mobilevit_xs", data="shapes-coco", metrics=("accuracy",), batch_size=2, device="cpu",
           seed=0)


@pytest.mark.parametrize("spec, spec_id", [
    (RunSpec(method="baseline", params_json="{}", **DET), "deeb830f06fe5a99"),
    (RunSpec(method=CONTROL, params_json="{}", **DET, task_fields=(("dense_finetune", "heads"),)),
     "33a2fcfc4bbe2037"),
    (RunSpec(method="ltm", params_json='{"a": 1}', **DET, task_fields=(("dense_finetune", "heads"),)),
     "f67848827e161504"),
    (RunSpec(method="ltm", params_json='{"a": 1}', **DET, task_fields=(("dense_finetune", "all"),), train_limit=7,
             match_gmacs=0.5), "62e79120ea26b2a2"),
    (RunSpec(method="tome", params_json='{"r": 4}', **DET), "3e4a5e5f7b0a017b"),
    (RunSpec(method="ltm", params_json="{}", task="cls", model="test_vit", data=None, metrics=("gmacs",), batch_size=2,
             device="cpu", seed=1, train_backbone=True, train_limit=5), "9f779551b2a544aa"),
])
def test_spec_ids_are_those_of_earlier_stores(spec, spec_id):
    assert spec.spec_id == spec_id


def test_a_plans_task_fields_give_the_same_ids_as_before():
    """build_plan with det's ``dense_finetune`` (and without it): the ids the plan gave before."""
    base, control, tome, ltm = build_plan(task="det", model="mobilevit_xs", methods=["tome", "ltm"],
                                          data="shapes-coco", overrides={}, metrics=("accuracy",), batch_size=2,
                                          device="cpu", seed=0, dense_finetune="heads")
    # ltm's own id follows its parameters: it changed (1eccfe419d73cd1c -> c8c3516b40cba9f9, and
    # 7b7544b6f888c032 -> 5a96d886c9aa1518 below) when they gained recipe, clusters and
    # num_clusters (-> a0bb7e3bded6129b, 17c7be1f9199d69f: ib_step, and epochs 2 -> 1; ->
    # d67e9f5939bed2f2, 62c0711c75ea6e14: lr and mlp_lr the recipe's); the task field still hashes as before
    assert [s.spec_id for s in (base, control, tome, ltm)] == ["deeb830f06fe5a99", "33a2fcfc4bbe2037",
                                                               "a2cd22b0ac9b5e67", "d67e9f5939bed2f2"]
    assert ltm.task_fields == (("dense_finetune", "heads"),) and ltm.dense_finetune == "heads"
    assert base.task_fields == () and base.dense_finetune is None
    # the control carries the plan's task fields as they are: the det setup always names the
    # protocol, so a run's control keeps its id (8dc88496c634f7e4 with the default ``all``); a plan
    # built without the field plans a control without it (6d0d66df0ea7726e, run the same way)
    plain = build_plan(task="det", model="mobilevit_xs", methods=["tome", "ltm"], data="shapes-coco", overrides={},
                       metrics=("accuracy",), batch_size=2, device="cpu", seed=0, dense_finetune="all")
    assert [s.spec_id for s in plain] == ["deeb830f06fe5a99", "8dc88496c634f7e4", "a2cd22b0ac9b5e67",
                                          "9bf46fe6719bbb0d"]
    bare = build_plan(task="det", model="mobilevit_xs", methods=["tome", "ltm"], data="shapes-coco", overrides={},
                      metrics=("accuracy",), batch_size=2, device="cpu", seed=0)
    assert [s.spec_id for s in bare] == ["deeb830f06fe5a99", "6d0d66df0ea7726e", "a2cd22b0ac9b5e67",
                                         "62c0711c75ea6e14"]


def test_a_field_the_task_does_not_declare_is_refused():
    with pytest.raises(TypeError, match="build_plan\\(\\) got 'dense_finetune', which is no field of task 'cls'"):
        build_plan(task="cls", model="test_vit", methods=["tome"], data=None, overrides={}, metrics=("gmacs",),
                   batch_size=2, device="cpu", seed=0, dense_finetune="all")
    with pytest.raises(AttributeError):
        RunSpec(method="tome", params_json="{}", **DET).no_such_field  # noqa: B018


CLS = dict(task="cls", model="test_vit", methods=["tome", "ltm"], data="fashion-mnist", overrides={},
           metrics=("accuracy",), batch_size=2, device="cpu", seed=0)


def test_what_decides_a_number_is_in_every_specs_id_and_old_ids_stay():
    """``limit``, ``head`` and ``weights`` (docs/measuring.md, "What a run's identity holds"):
    unset, the ids are those of earlier stores; set, every spec (the baseline's too) carries
    them and each changes the id."""
    plain = build_plan(**CLS)
    assert all(s.limit is None and s.head is None and s.weights is None for s in plain)
    assert RunSpec(method="baseline", params_json="{}", **DET).spec_id == "deeb830f06fe5a99"
    assert RunSpec(method="baseline", params_json="{}", **DET, limit=None, head=None,
                   weights=None).spec_id == "deeb830f06fe5a99"
    ids = {s.spec_id for s in plain}
    for extra in ({"limit": 4}, {"limit": 16}, {"head": "num_classes=2,fit_limit=12"},
                  {"head": "num_classes=2,fit_limit=all"}, {"weights": "init_seed=0"}, {"weights": "init_seed=1"},
                  {"weights": "sha256=" + "0" * 64}):
        plan = build_plan(**CLS, **extra)
        (name, value), = extra.items()
        assert all(getattr(s, name) == value for s in plan)  # baseline included
        assert [s.method for s in plan] == [s.method for s in plain]
        assert not ids & {s.spec_id for s in plan}, extra
        ids |= {s.spec_id for s in plan}


def test_a_limit_below_one_is_refused_before_anything_runs():
    """The run's options check their numbers once, from the command line's text or the API's values."""
    from vitbench.core.options import RunOptions
    from vitbench.errors import ParamError

    for limit in (0, "0"):
        with pytest.raises(ParamError, match="--limit 0 is out of range; it must be >= 1"):
            RunOptions(limit=limit)
    with pytest.raises(ParamError, match=r"--limit 'ten' is not an integer; give an integer >= 1"):
        RunOptions(limit="ten")
    assert RunOptions(limit=" 7").limit == 7
