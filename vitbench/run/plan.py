"""The run plan: models x methods x params x task as frozen, hashable run specs
(docs/architecture.md, layer 2). A spec's hash keys the result store, so runs resume.
"""
from __future__ import annotations

import json
import sys
from typing import Any, Iterable, Mapping, Optional

from vitbench.catalog import TaskSetup
from vitbench.core.options import RunOptions
from vitbench.errors import ParamError, VitbenchError, choices_error
from vitbench.core.option_values import MAX_BATCH_SIZE, check_precision, checked_seeds, checked_shard
from vitbench.core.params import params_dict, params_json
from vitbench.host import get_host
from vitbench.host.spec import RunSpec
from vitbench.host.values import method_values
from vitbench.task import BASELINE, CONTROL, REFERENCES

DEVICES = ("cpu", "cuda")
#: the largest throughput batch (``--batch-size``): 65536 images, far beyond any accelerator's memory at 224 px


def parse_param_overrides(items: Iterable[str]) -> dict[str, dict[str, str]]:
    """``["tome.r=13", "ppt.layers=(2,5)"]`` -> ``{"tome": {"r": "13"}, "ppt": {"layers": "(2,5)"}}``."""
    out: dict[str, dict[str, str]] = {}
    for item in items:
        head, sep, value = item.partition("=")
        method, dot, key = head.partition(".")
        if not sep or not dot or not method.strip() or not key.strip():
            raise ParamError(f"--param {item!r} is not METHOD.KEY=VALUE (e.g. tome.r=13)")
        if not value.strip():
            raise ParamError(f"--param {item!r} has no value; give METHOD.KEY=VALUE (e.g. tome.r=13)")
        values = out.setdefault(method.strip(), {})
        if key.strip() in values and values[key.strip()] != value.strip():
            raise ParamError(f"--param {method.strip()}.{key.strip()} is given twice, as "
                             f"{values[key.strip()]!r} and {value.strip()!r}; give it once")
        values[key.strip()] = value.strip()
    return out


def build_plan(*, task: str, model: str, methods: Iterable[str], data: Optional[str],
               overrides: Mapping[str, Mapping[str, Any]], metrics: Iterable[str],
               batch_size: int, device: str, seed: int, checkpoint: Optional[str] = None,
               pretrained: bool = False, train_backbone: bool = False,
               train_limit: Optional[int] = None, match_gmacs: Optional[float] = None, control: bool = True,
               precision: str = "fp32", compile: bool = False, cuda_graph: bool = False,
               limit: Optional[int] = None, head: Optional[str] = None, weights: Optional[str] = None,
               repeats: Optional[int] = None, data_id: Optional[str] = None,
               batch_sizes: Optional[Iterable[int]] = None, train_limits: Optional[Mapping[str, int]] = None,
               img_size: Optional[int] = None, **task_fields: Any) -> list[RunSpec]:
    """The baseline, then one spec per method, parameters validated (no model is built here); the
    number options come checked by :class:`~vitbench.core.options.RunOptions`.

    ``task_fields``: the task's own spec fields (:attr:`~vitbench.task.TaskInfo.fields`, det's
    ``dense_finetune``), carried by the specs of learnable methods. ``control`` (tasks with
    :attr:`~vitbench.task.TaskInfo.control`, unless a task field holds one of its ``no_control``
    values): when a method trains, the :data:`CONTROL` spec, with the same task fields, follows the
    baseline: the baseline fine-tuned the same way without a method, so that a method's accuracy
    can be compared at equal training.

    ``batch_sizes`` (``--batch-sizes``): throughput and latency are also timed at each of them
    (:func:`check_batch_sizes`), for the report's speed-up against batch size.

    ``match_gmacs``: every method runs at that fraction of the baseline's GMACs, its budget knob
    chosen when it runs (:mod:`vitbench.measure.calibrate`); ``--param`` may not set the knob then.

    ``train_limits``: a method's own training images where ``train_limit`` was not chosen by the
    user (the budget of the weights it ships for the model, :meth:`~vitbench.task.Task.setup`).

    ``limit``, ``head``, ``weights``, ``data_id``, ``img_size``: what else decides the numbers, as the task's
    :meth:`~vitbench.task.Task.setup` names it (the evaluation images, a new head's inputs, a
    random init's seed or a checkpoint's digest, the data folder's fingerprint, the input side); every spec carries them, the baseline's too, so
    that ``--resume`` never reuses a run measured on something else (docs/measuring.md)."""
    host = get_host()
    task_spec = host.task(task)  # unknown -> error listing the registered tasks
    unknown = [k for k in task_fields if k not in task_spec.info.field_names]
    if unknown:
        raise TypeError(f"build_plan() got {unknown[0]!r}, which is no field of task {task!r} (its fields: "
                        f"{', '.join(task_spec.info.field_names) or 'none'})")
    if device not in DEVICES:
        raise choices_error("device", device, DEVICES)
    metrics = tuple(metrics)
    if batch_sizes is not None:
        batch_sizes = check_batch_sizes(batch_sizes, metrics)
    methods = list(methods)
    typed = {host.method(name).name: name for name in reversed(methods)}  # the first name given for each
    chosen = method_values(methods, overrides, matched=match_gmacs is not None)  # instances the API parsed pass
    common = dict(task=task, model=model, data=data, metrics=tuple(metrics), batch_size=batch_size,
                  device=device, seed=seed, checkpoint=checkpoint, pretrained=pretrained,
                  precision=None if check_precision(precision) == "fp32" else precision, compile=compile,
                  cuda_graph=cuda_graph, limit=limit, head=head, weights=weights, repeats=repeats,
                  data_id=data_id, batch_sizes=batch_sizes, img_size=img_size)
    plan = [RunSpec(method=BASELINE, params_json="{}", **common)]
    wants_control = task_spec.info.control and not any(task_fields.get(f.name) in f.no_control
                                                        for f in task_spec.info.fields)
    if control and wants_control and any(host.method(n).trains(v) for n, v in chosen.items()):
        plan.append(RunSpec(method=CONTROL, params_json="{}", **common, train_limit=train_limit,
                            task_fields=_task_fields(task_fields)))
    for name, values in chosen.items():
        spec = host.method(name)
        own_limit = (train_limits or {}).get(name, train_limit)
        training = ({"train_backbone": train_backbone, "train_limit": own_limit,
                     "task_fields": _task_fields(task_fields)} if spec.trains(values) else {})
        matched = {"match_gmacs": match_gmacs} if match_gmacs is not None else {}
        if match_gmacs is not None and spec.budget is not None:
            params = params_dict(values)
            params.pop(spec.budget.param, None)  # chosen when the run starts
            text = json.dumps(params, sort_keys=True)
        else:
            text = params_json(values)
        shown = {"shown_as": typed[name]} if typed.get(name, name) != name else {}
        plan.append(RunSpec(method=name, params_json=text, values=values, **common, **training, **matched, **shown))
    return plan


def _task_fields(values: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    """``values`` as :attr:`RunSpec.task_fields`: the set ones, sorted by name."""
    return tuple(sorted((k, v) for k, v in values.items() if v is not None))


def _int_list(text: str, option: str, hint: str) -> list[int]:
    """``"1, 4,16"`` -> ``[1, 4, 16]`` (empty items skipped); a non-integer item raises ParamError
    naming ``option`` and ``hint`` (the valid values)."""
    values = []
    for item in (item.strip() for item in str(text).split(",")):
        if not item:
            continue
        try:
            values.append(int(item))
        except ValueError:
            raise ParamError(f"{option} item {item!r} is not an integer; give {hint}") from None
    return values


def parse_batch_sizes(text: str) -> tuple[int, ...]:
    """``"1,4,16"`` -> ``(1, 4, 16)``: the ``--batch-sizes`` list (checked by :func:`check_batch_sizes`)."""
    return tuple(_int_list(text, "--batch-sizes",
                           f"comma-separated integers from 1 to {MAX_BATCH_SIZE}, e.g. 1,4,16,64"))


def check_batch_sizes(sizes: Iterable[int], metrics: Iterable[str]) -> tuple[int, ...]:
    """The batch sizes in increasing order, refusing an empty list, one outside 1..
    :data:`MAX_BATCH_SIZE`, a repeated one, or metrics that time nothing (neither throughput nor latency)."""
    sizes = tuple(sizes)
    if not sizes:
        raise ParamError(f"--batch-sizes is empty; give comma-separated integers from 1 to {MAX_BATCH_SIZE}, "
                         f"e.g. 1,4,16,64")
    for size in sizes:
        if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= MAX_BATCH_SIZE:
            raise ParamError(f"--batch-sizes item {size!r} is out of range; batch sizes are integers from 1 to "
                             f"{MAX_BATCH_SIZE}")
        if sizes.count(size) > 1:
            raise ParamError(f"--batch-sizes names {size} twice ({','.join(map(str, sizes))}); each is timed once")
    metrics = tuple(metrics)
    if "throughput" not in metrics and "latency" not in metrics:
        raise ParamError(f"--batch-sizes times throughput and latency, but --metrics {','.join(metrics)} "
                         f"measures neither; add throughput or latency to --metrics")
    return tuple(sorted(sizes))


def parse_seeds(text: str) -> tuple[int, ...]:
    """``"0,1,2"`` -> ``(0, 1, 2)``: the ``--seeds`` list (see :func:`check_seeds`)."""
    return check_seeds(_int_list(text, "--seeds", "comma-separated integers >= 0, e.g. 0,1,2"))


def check_seeds(seeds: Iterable[int]) -> tuple[int, ...]:
    """The seeds as a tuple (:func:`~vitbench.core.option_values.checked_seeds`)."""
    return checked_seeds(seeds)


def build_seeded_plan(*, seeds: Iterable[int], **kwargs: Any) -> list[RunSpec]:
    """:func:`build_plan` once per seed (``--seeds 0,1,2``), seed after seed, each seed's baseline
    first: every method run is paired with the baseline of its own seed for speed-up and
    efficiency. The seed is part of a spec's id, so each seed's run is stored, resumed and
    retried on its own; reports aggregate the runs that differ only by seed (mean ± std,
    docs/measuring.md). ``kwargs`` are :func:`build_plan`'s, without ``seed``."""
    if "seed" in kwargs:
        raise TypeError("build_seeded_plan takes seeds=, not seed=")
    return [spec for seed in check_seeds(seeds) for spec in build_plan(seed=seed, **kwargs)]


def build_sweep_plan(*, budgets: Iterable[float], **kwargs: Any) -> list[RunSpec]:
    """:func:`build_seeded_plan` at each of ``budgets`` (``vitbench sweep``): every method at
    every budget, the baseline of each seed once (the first budget's; later budgets share it).
    ``kwargs`` are :func:`build_seeded_plan`'s, without ``match_gmacs``."""
    if "match_gmacs" in kwargs:
        raise TypeError("build_sweep_plan takes budgets=, not match_gmacs=")
    plan: dict[str, RunSpec] = {}
    for budget in budgets:
        for spec in build_seeded_plan(match_gmacs=budget, **kwargs):
            plan.setdefault(spec.spec_id, spec)
    return list(plan.values())


def parse_shard(text: str) -> tuple[int, int]:
    """``"2/4"`` -> ``(2, 4)``: the ``--shard I/N`` of a job array (I counts from 1;
    :func:`~vitbench.core.option_values.checked_shard`)."""
    return checked_shard(text)


def shard_plan(plan: list[RunSpec], index: int, count: int) -> list[RunSpec]:
    """Part ``index`` of ``count`` of ``plan`` (``--shard I/N``), in plan order: every
    ``count``-th method spec from the ``index``-th on, with the baseline (and det/seg control) of
    each seed those specs need -- a speed-up is only taken against a baseline timed in the same
    session, so a shard on another machine measures its own (a shard that finds one finished
    in the store, under ``--resume`` or in a sweep, reuses it). The parts' method specs are
    disjoint and together the whole plan."""
    index, count = checked_shard((index, count))
    methods = [s for s in plan if s.method not in REFERENCES]
    mine = {s.spec_id for s in methods[index - 1::count]}
    seeds = {s.seed for s in methods if s.spec_id in mine}
    return [s for s in plan if s.spec_id in mine or (s.method in REFERENCES and s.seed in seeds)]


def plan_for(options: RunOptions, setup: TaskSetup, repeats: Optional[int]) -> list[RunSpec]:
    """The plan of a run (or a sweep) as ``options`` ask for it, once the task's ``setup`` has named
    the model, data and metrics (and the keywords of its own, ``setup.plan``): a sweep's controls
    added, GMACs measured when compute is matched, each seed, each budget, the ``--shard`` part."""
    budgets = options.matched_budgets
    kwargs = dict(task=options.task, model=setup.model, methods=with_controls(options, setup.model), data=setup.data,
                  overrides=options.params, metrics=_with_gmacs(setup.metrics, budgets),
                  batch_size=options.batch_size, batch_sizes=options.batch_sizes, device=options.device,
                  seeds=options.plan_seeds, checkpoint=options.checkpoint, pretrained=options.pretrained,
                  precision=options.precision, compile=options.compile, cuda_graph=options.cuda_graph,
                  repeats=repeats, **setup.plan)
    plan = build_seeded_plan(**kwargs) if budgets is None else build_sweep_plan(budgets=budgets, **kwargs)
    return plan if options.shard is None else shard_plan(plan, *options.shard)


def method_names(options: RunOptions) -> list[str]:
    """The methods ``options`` name, refusing none."""
    methods = [m.strip() for m in options.methods if m.strip()]
    if not methods:
        raise VitbenchError("--methods is empty; see `vitbench list methods`")
    return methods


def with_controls(options: RunOptions, model: str) -> list[str]:
    """The methods, and for a sweep after them the controls (methods of kind ``control``) that
    apply to ``model``'s family; a model no family names by its timm name (an embedded default)
    is taken as a ViT."""
    methods = method_names(options)
    if not options.is_sweep or not options.controls:
        return methods
    # timm: only for a sweep's controls; planning stays light
    from vitbench.tasks.model_names import accepted_models

    host = get_host()
    family = accepted_models().get(model, "vit")
    controls = [name for name, spec in sorted(host.specs("methods").items())
                if spec.kind == "control" and family in host.families_for(spec) and name not in methods]
    return methods + controls


def _with_gmacs(metrics: tuple[str, ...], budgets: Optional[tuple[float, ...]]) -> tuple[str, ...]:
    """Matched compute is checked on the GMACs count: it is measured whenever budgets are given."""
    if budgets is None or "gmacs" in metrics:
        return metrics
    print("vitbench: note: matched compute: measuring gmacs too (where each method landed)", file=sys.stderr)
    return ("gmacs", *metrics)
