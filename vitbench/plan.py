"""The run plan: models x methods x params x task as frozen, hashable run specs
(docs/architecture.md, layer 2). A spec's hash keys the result store, so runs resume.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from typing import Any, Iterable, Mapping, Optional

from vitbench.errors import ParamError, VitbenchError, choices_error
from vitbench.params import make_params, params_dict
from vitbench.plugins import get_host

BASELINE = "baseline"
#: the control row of tasks with ``TaskSpec.control`` (det/seg): the baseline fine-tuned as a
#: learnable method's model is, with no method -- what a fine-tuned method's accuracy is compared
#: with at the same amount of extra training
CONTROL = "baseline+ft"
#: the two rows that are no method (no plugin, no parameters)
REFERENCES = (BASELINE, CONTROL)
METRICS = ("accuracy", "gmacs", "params", "throughput", "latency", "memory", "ib")
#: metrics that need labelled evaluation data
DATA_METRICS = ("accuracy", "ib")
#: training images learnable methods fine-tune on with the embedded default model (``--train-limit``
#: overrides): keeps ``vitbench run --methods ibtm,tome`` within minutes on a 2-core CPU
DEFAULT_MODEL_TRAIN_LIMIT = 10000
DEVICES = ("cpu", "cuda")
DEFAULT_MODEL = "vitbench-fmnist-vit"


@dataclass(frozen=True)
class RunSpec:
    """One run: what to reduce, how, and what to measure. Frozen; hashed into ``spec_id``."""

    task: str
    model: str
    method: str
    params_json: str  # the validated parameters as canonical JSON (hashable)
    data: Optional[str]
    metrics: tuple[str, ...]
    batch_size: int
    device: str
    seed: int
    checkpoint: Optional[str] = None
    pretrained: bool = False
    train_backbone: bool = False  # fine-tune the backbone too (the train-from-scratch setup)
    train_limit: Optional[int] = None  # fine-tune on the first N training images
    #: det/seg: what trains beside the method (vitbench.tasks.det.protocol: all | heads | method)
    dense_finetune: Optional[str] = None
    #: matched compute (``--match-gmacs F``, ``vitbench sweep``): the method's budget knob is set
    #: when the run starts so that its GMACs land within 2 % of ``F`` x the baseline's
    #: (:mod:`vitbench.calibrate`); ``params`` then hold every parameter but the knob
    match_gmacs: Optional[float] = None
    #: ``--precision`` (:mod:`vitbench.measure.precision`): ``fp16``/``bf16`` autocast on the
    #: measured forward, evaluation and (bf16) fine-tuning; ``None`` is fp32
    precision: Optional[str] = None
    #: ``--compile``: the timing loops run the ``torch.compile``d model (:mod:`vitbench.measure.compiled`)
    compile: bool = False
    #: ``--cuda-graph``: throughput and latency time a CUDA graph of the forward where its shapes are
    #: static (:mod:`vitbench.measure.cuda_graph`)
    cuda_graph: bool = False

    @property
    def precision_name(self) -> str:
        """The run's precision, ``fp32`` when none was asked for."""
        return self.precision or "fp32"

    @property
    def params(self) -> dict[str, Any]:
        return json.loads(self.params_json)

    @property
    def spec_id(self) -> str:
        fields = asdict(self)
        for key in _LATER_FIELDS:  # fields added later hash only when set: old ids stay valid
            if fields[key] is None or fields[key] is False:
                del fields[key]
        return hashlib.sha1(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]

    @property
    def label(self) -> str:
        """``tome (r=13)``: the method with the parameters that differ from its defaults; a
        matched run before its knob is chosen says its budget (``tome (at 0.6x GMACs)``)."""
        if self.method == BASELINE:
            return BASELINE
        if self.method == CONTROL:
            from vitbench.tasks.det.protocol import DEFAULT_PROTOCOL

            other = self.dense_finetune not in (None, DEFAULT_PROTOCOL)
            return f"{CONTROL} (fine-tuned: {self.dense_finetune})" if other else CONTROL
        if self.match_gmacs is not None:
            return self._label(self.params, notes=[f"at {self.match_gmacs:g}x GMACs"])
        return self._label(self.params)

    def matched_label(self, params: Mapping[str, Any]) -> str:
        """The label of a matched run once its knob is chosen: ``params`` with the knob always
        shown, first (``tome (r=7)``, ``topk (keep=0.7)`` even at the default)."""
        knob = get_host().method(self.method).budget
        return self._label(params, force=(knob.param,) if knob is not None else ())

    def _label(self, params: Mapping[str, Any], force: tuple[str, ...] = (), notes: Iterable[str] = ()) -> str:
        spec = get_host().method(self.method)
        defaults = params_dict(make_params(self.method, spec.params, {}))
        changed = {k: params[k] for k in force if k in params}
        changed.update({k: v for k, v in params.items() if k not in changed and defaults.get(k) != v})
        shown = self._shown(changed)
        dense_note = False
        if self.dense_finetune is not None:
            from vitbench.tasks.det.protocol import DEFAULT_PROTOCOL

            dense_note = self.dense_finetune != DEFAULT_PROTOCOL  # the row says what differs from the default
        if dense_note:
            shown.append(f"fine-tuned: {self.dense_finetune}")
        elif self.train_backbone:
            shown.append("backbone trained")
        shown += list(notes)
        return f"{self.method} ({', '.join(shown)})" if shown else self.method

    @staticmethod
    def _shown(changed: dict[str, Any]) -> list[str]:
        return [f"{k}={json.dumps(v, separators=(',', ':'))}" for k, v in changed.items()]


_LATER_FIELDS = ("train_backbone", "train_limit", "dense_finetune", "match_gmacs", "precision", "compile",
                 "cuda_graph")


def parse_param_overrides(items: Iterable[str]) -> dict[str, dict[str, str]]:
    """``["tome.r=13", "ppt.layers=(2,5)"]`` -> ``{"tome": {"r": "13"}, "ppt": {"layers": "(2,5)"}}``."""
    out: dict[str, dict[str, str]] = {}
    for item in items:
        head, sep, value = item.partition("=")
        method, dot, key = head.partition(".")
        if not sep or not dot or not method or not key:
            raise ParamError(f"--param {item!r} is not METHOD.KEY=VALUE (e.g. tome.r=13)")
        out.setdefault(method.strip(), {})[key.strip()] = value.strip()
    return out


def parse_list(kind: str, text: str, valid: Iterable[str]) -> tuple[str, ...]:
    """Split a comma list and check every item against ``valid``."""
    items = tuple(item.strip() for item in text.split(",") if item.strip())
    valid = tuple(valid)
    for item in items:
        if item not in valid:
            raise choices_error(kind, item, valid)
    return items


def build_plan(*, task: str, model: str, methods: Iterable[str], data: Optional[str],
               overrides: Mapping[str, Mapping[str, Any]], metrics: Iterable[str],
               batch_size: int, device: str, seed: int, checkpoint: Optional[str] = None,
               pretrained: bool = False, train_backbone: bool = False,
               train_limit: Optional[int] = None, dense_finetune: Optional[str] = None,
               match_gmacs: Optional[float] = None, control: bool = True,
               precision: str = "fp32", compile: bool = False, cuda_graph: bool = False) -> list[RunSpec]:
    """The baseline, then one spec per method, parameters validated (no model is built here).

    ``control`` (tasks with a control row: det/seg): when a learnable method fine-tunes detector weights (protocol ``all``
    or ``heads``), the :data:`CONTROL` spec follows the baseline: the baseline detector fine-tuned
    the same way without a method, so that a method's mAP can be compared at equal training.

    ``match_gmacs``: every method runs at that fraction of the baseline's GMACs, its budget knob
    chosen when it runs (:mod:`vitbench.calibrate`); ``--param`` may not set the knob then."""
    host = get_host()
    task_spec = host.task(task)  # unknown -> error listing the registered tasks
    if device not in DEVICES:
        raise choices_error("device", device, DEVICES)
    if batch_size < 1:
        raise ParamError(f"--batch-size {batch_size} is out of range; it must be >= 1")
    if train_limit is not None and train_limit < 1:
        raise ParamError(f"--train-limit {train_limit} is out of range; it must be >= 1")
    names = [host.method(name).name for name in methods]  # unknown -> error listing valid ones
    for name in overrides:
        canonical = host.method(name).name
        if canonical not in names:
            raise VitbenchError(f"--param names method {name!r}, which is not in --methods "
                                f"({', '.join(names) or 'none'})")
    canonical_overrides = {host.method(k).name: v for k, v in overrides.items()}
    if match_gmacs is not None:
        from vitbench.calibrate import check_fraction

        match_gmacs = check_fraction(match_gmacs)
        for name, values in canonical_overrides.items():
            knob = host.method(name).budget
            if knob is not None and knob.param in values:
                raise ParamError(f"--param {name}.{knob.param} conflicts with matched compute: {knob.param} "
                                 f"is {name}'s budget knob, which --match-gmacs/--budgets sets; leave it out")
    from vitbench.measure.precision import check_precision

    common = dict(task=task, model=model, data=data, metrics=tuple(metrics), batch_size=batch_size,
                  device=device, seed=seed, checkpoint=checkpoint, pretrained=pretrained,
                  precision=None if check_precision(precision) == "fp32" else precision, compile=compile,
                  cuda_graph=cuda_graph)
    plan = [RunSpec(method=BASELINE, params_json="{}", **common)]
    if control and task_spec.control and any(host.method(n).needs_training for n in names):
        from vitbench.tasks.det.protocol import DEFAULT_PROTOCOL, check_protocol

        if check_protocol(dense_finetune or DEFAULT_PROTOCOL) != "method":  # detector weights train
            plan.append(RunSpec(method=CONTROL, params_json="{}", **common, train_limit=train_limit,
                                dense_finetune=dense_finetune or DEFAULT_PROTOCOL))
    for name in dict.fromkeys(names):
        spec = host.method(name)
        values = make_params(name, spec.params, canonical_overrides.get(name, {}))
        training = ({"train_backbone": train_backbone, "train_limit": train_limit,
                     "dense_finetune": dense_finetune} if spec.needs_training else {})
        matched = {"match_gmacs": match_gmacs} if match_gmacs is not None else {}
        params = params_dict(values)
        if match_gmacs is not None and spec.budget is not None:
            params.pop(spec.budget.param, None)  # chosen when the run starts
        plan.append(RunSpec(method=name, params_json=json.dumps(params, sort_keys=True),
                            **common, **training, **matched))
    return plan


def check_applies(plan: Iterable[RunSpec], model: Any) -> None:
    """Check, before anything runs, that a model-family adapter recognises ``model`` and that
    every method of ``plan`` applies to a copy of it: unsupported pairs and out-of-range
    parameters (e.g. a block index the model lacks) fail here with a clear error."""
    import copy

    from vitbench.engine import apply

    get_host().family_of(model)
    checked: set[tuple[str, str]] = set()
    for spec in plan:
        if spec.method in REFERENCES or (spec.method, spec.params_json) in checked:
            continue  # the baseline, or the same method checked for an earlier seed
        checked.add((spec.method, spec.params_json))
        apply(copy.deepcopy(model), spec.method, **spec.params)


def parse_seeds(text: str) -> tuple[int, ...]:
    """``"0,1,2"`` -> ``(0, 1, 2)``: the ``--seeds`` list (see :func:`check_seeds`)."""
    seeds = []
    for item in (item.strip() for item in str(text).split(",")):
        if not item:
            continue
        try:
            seeds.append(int(item))
        except ValueError:
            raise ParamError(f"--seeds item {item!r} is not an integer; give comma-separated "
                             f"integers >= 0, e.g. 0,1,2") from None
    return check_seeds(seeds)


def check_seeds(seeds: Iterable[int]) -> tuple[int, ...]:
    """The seeds as a tuple, refusing an empty list, a negative seed or a repeated one."""
    seeds = tuple(seeds)
    if not seeds:
        raise ParamError("--seeds is empty; give comma-separated integers >= 0, e.g. 0,1,2")
    for seed in seeds:
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ParamError(f"seed {seed!r} is out of range; seeds are integers >= 0")
        if seeds.count(seed) > 1:
            raise ParamError(f"--seeds names seed {seed} twice ({','.join(map(str, seeds))}); "
                             f"each seed runs once")
    return seeds


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
    from vitbench.calibrate import check_fraction

    if "match_gmacs" in kwargs:
        raise TypeError("build_sweep_plan takes budgets=, not match_gmacs=")
    budgets = tuple(check_fraction(b, "--budgets item") for b in budgets)
    if not budgets:
        raise ParamError("--budgets is empty; give fractions of the baseline's GMACs in (0, 1], e.g. 0.9,0.7,0.5")
    plan: dict[str, RunSpec] = {}
    for budget in budgets:
        for spec in build_seeded_plan(match_gmacs=budget, **kwargs):
            plan.setdefault(spec.spec_id, spec)
    return list(plan.values())


def parse_shard(text: str) -> tuple[int, int]:
    """``"2/4"`` -> ``(2, 4)``: the ``--shard I/N`` of a job array (I counts from 1)."""
    head, sep, tail = str(text).partition("/")
    try:
        index, count = int(head), int(tail)
    except ValueError:
        index = count = 0
    if not sep or count < 1 or not 1 <= index <= count:
        raise ParamError(f"--shard {text!r} is not I/N with 1 <= I <= N (e.g. 1/4 for the first of four parts)")
    return index, count


def shard_plan(plan: list[RunSpec], index: int, count: int) -> list[RunSpec]:
    """Part ``index`` of ``count`` of ``plan`` (``--shard I/N``), in plan order: every
    ``count``-th method spec from the ``index``-th on, with the baseline (and det/seg control) of
    each seed those specs need -- a speed-up is only taken against a baseline timed in the same
    session, so a shard on another machine measures its own (a shard that finds one finished
    in the store, under ``--resume`` or in a sweep, reuses it). The parts' method specs are
    disjoint and together the whole plan."""
    index, count = parse_shard(f"{index}/{count}")
    methods = [s for s in plan if s.method not in REFERENCES]
    mine = {s.spec_id for s in methods[index - 1::count]}
    seeds = {s.seed for s in methods if s.spec_id in mine}
    return [s for s in plan if s.spec_id in mine or (s.method in REFERENCES and s.seed in seeds)]
