"""The run spec: one run of a plan -- task, model, method, validated parameters, what to measure --
frozen and hashable; its :attr:`~RunSpec.spec_id` keys the result store, so runs resume."""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Optional

from vitbench.errors import VitbenchError
from vitbench.core.params import default_params
from vitbench.host import get_host
from vitbench.task import BASELINE, CONTROL, label_notes

__all__ = ["RunSpec"]


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
    #: ``--match-gmacs F``: the knob is set at run start to land at F x the baseline's GMACs; ``params`` omit it
    match_gmacs: Optional[float] = None
    #: ``--precision``: ``fp16``/``bf16`` autocast (:mod:`vitbench.measure.precision`); ``None`` is fp32
    precision: Optional[str] = None
    #: ``--compile``: the timing loops run the ``torch.compile``d model (:mod:`vitbench.measure.compiled`)
    compile: bool = False
    #: ``--cuda-graph``: time a CUDA graph of the forward where sound (:mod:`vitbench.measure.cuda_graph`)
    cuda_graph: bool = False
    #: the task's own fields (``TaskInfo.fields``), sorted ``(name, value)`` pairs; read as attributes
    task_fields: tuple[tuple[str, Any], ...] = ()
    #: ``--limit N``: evaluated on the first N images (set by the task when it evaluates on data)
    limit: Optional[int] = None
    #: a new classifier head's inputs (cls ``--num-classes``: ``num_classes=10,fit_limit=12``); ``None``: the model's
    head: Optional[str] = None
    #: ``init_seed=S`` (random weights) or ``sha256=...`` (the ``--checkpoint``); ``None``: as model/pretrained say
    weights: Optional[str] = None
    #: ``--repeats N``/``--quick``: repeats of each timing (fewer make a noisier median); ``None``: the task's
    repeats: Optional[int] = None
    #: the ``--data`` folder's fingerprint (``files=N,sha256=...``): a changed folder is another run
    data_id: Optional[str] = None
    #: ``--batch-sizes 1,4,16``: throughput and latency timed at each (the speed-up curve); ``None``: not
    batch_sizes: Optional[tuple[int, ...]] = None
    #: ``--img-size``: the input side the model was resized to (cls, timm ViT); ``None``: the model's own
    img_size: Optional[int] = None
    #: the name the user gave the method (an alias: ``ibtm`` for ``ltm``), shown in the label; not hashed
    shown_as: Optional[str] = None
    #: the method's parameter dataclass, parsed once by the plan (``None``: its defaults); not hashed
    values: Any = field(default=None, compare=False, repr=False)

    def __getattr__(self, name: str) -> Any:
        """A task field of the spec's task (``spec.dense_finetune``): its value, else ``None``."""
        if name.startswith("_") or name == "task_fields":
            raise AttributeError(name)
        fields = dict(self.task_fields)
        if name in fields:
            return fields[name]
        try:
            declared = get_host().task(self.task).info.field_names
        except VitbenchError:
            declared = ()
        if name in declared:
            return None
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def precision_name(self) -> str:
        """The run's precision, ``fp32`` when none was asked for."""
        return self.precision or "fp32"

    @property
    def params(self) -> dict[str, Any]:
        """The parameters as their canonical JSON holds them (a tuple written ``"(13,0.0)"``)."""
        return json.loads(self.params_json)

    @property
    def spec_id(self) -> str:
        fields = asdict(self)
        del fields["task_fields"], fields["shown_as"], fields["values"]  # an alias names the same run
        fields.update(self.task_fields)  # hashed as top-level keys, as when they were RunSpec fields
        for key in (*_LATER_FIELDS, *dict(self.task_fields)):  # hashed only when set: old ids stay valid
            if fields[key] is None or fields[key] is False:
                del fields[key]
        return hashlib.sha1(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]

    @property
    def label(self) -> str:
        """``tome (r=16)``: the method with its budget knob (always, defaults too) and the parameters
        that differ from its defaults; a matched run before its knob is chosen says its budget
        (``tome (matched 0.6x GMACs)``). Not part of :attr:`spec_id`."""
        if self.method == BASELINE:
            return BASELINE
        if self.method == CONTROL:
            notes = self._task_notes()
            return f"{CONTROL} ({', '.join(notes)})" if notes else CONTROL
        if self.match_gmacs is not None:
            return self._label(self.params, matched=self.match_gmacs)
        return self._label(self.params, force=self._knob())

    def matched_label(self, params: Mapping[str, Any]) -> str:
        """The label of a matched run once its knob is chosen: ``params`` with the knob shown first,
        then the budget (``tome (r=7; matched 0.5x GMACs)``)."""
        return self._label(params, force=self._knob(), matched=self.match_gmacs)

    def _knob(self) -> tuple[str, ...]:
        knob = get_host().method(self.method).budget
        return (knob.param,) if knob is not None else ()

    def _label(self, params: Mapping[str, Any], force: tuple[str, ...] = (),
               matched: Optional[float] = None) -> str:
        spec = get_host().method(self.method)
        defaults = default_params(spec.params)
        changed = {k: params[k] for k in force if params.get(k) is not None}  # the knob, default or not
        changed.update({k: v for k, v in params.items() if k not in changed and defaults.get(k) != v})
        shown = self._shown(changed)
        task_notes = self._task_notes()  # what the task's fields change from its defaults
        if task_notes:
            shown += task_notes
        elif self.train_backbone:
            shown.append("backbone trained")
        inner = ", ".join(shown)
        if matched is not None:
            inner = f"{inner}; matched {matched:g}x GMACs" if inner else f"matched {matched:g}x GMACs"
        name = self.shown_as or self.method
        return f"{name} ({inner})" if inner else name

    def _task_notes(self) -> list[str]:
        return label_notes(get_host().task(self.task), dict(self.task_fields)) if self.task_fields else []

    @staticmethod
    def _shown(changed: dict[str, Any]) -> list[str]:
        return [f"{k}={v if _written_tuple(v) else json.dumps(v, separators=(',', ':'))}" for k, v in changed.items()]


def _written_tuple(value: Any) -> bool:
    """A tuple as :func:`~vitbench.core.params.params_dict` writes it (``"(13,0.0)"``): shown bare."""
    return isinstance(value, str) and value.startswith("(") and value.endswith(")")


#: fields added after the first stores, hashed only when set (docs/measuring.md, "What a run's identity holds")
_LATER_FIELDS = ("train_backbone", "train_limit", "match_gmacs", "precision", "compile",
                 "cuda_graph", "limit", "head", "weights", "repeats", "data_id", "batch_sizes", "img_size")
