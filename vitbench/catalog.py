"""What plugins register: methods, scorers, model families and tasks (docs/architecture.md,
"Plugins").

These are plain frozen dataclasses. The plugin host (:mod:`vitbench.host`) keeps one
catalog of each and records which plugin registered what. Every command loads every plugin, so a
spec names its heavy code (a method's ``build``, a scorer, a family's functions) by reference, a
``"package.module:name"`` string that is imported the first time the thing is asked for
(:func:`resolved`); listing a spec imports nothing.
"""
from __future__ import annotations

import dataclasses
import importlib
import re
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Optional, Sequence, Union

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from torch import nn

    from vitbench.core.options import RunOptions

from vitbench.core.params import (  # noqa: F401 (re-exported: what a plugin declares its parameters with)
    CHOICES, HELP, RANGE, Range, above, at_least, limits_text, param)
from vitbench.core.capabilities import CAPABILITIES, capability_set  # noqa: F401 (re-exported)
from vitbench.core.contract import BlockInfo, ModelInfo, Reduction, StatsCallback, TrainStage  # noqa: F401 (re-exported)
from vitbench.errors import choices_error


#: ``"package.module:name"`` (``name`` may be dotted): what a spec's field may hold instead of the object
REFERENCE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


def load_reference(ref: str) -> Any:
    """The object ``"package.module:name"`` names, its module imported now."""
    module, _, name = ref.partition(":")
    obj: Any = importlib.import_module(module)
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


def _check_references(spec: Any, names: tuple[str, ...]) -> None:
    for name in names:
        value = getattr(spec, name)
        if isinstance(value, str) and not REFERENCE.match(value):
            raise ValueError(f"{type(spec).__name__}.{name} of {spec.name!r} is {value!r}: a reference is "
                             f"'package.module:name'")


def resolved(spec: Any) -> Any:
    """``spec`` with each reference field (:data:`REFERENCE`, the spec's ``_references``) replaced by
    the object it names; the spec itself when it holds none."""
    changes = {name: load_reference(getattr(spec, name)) for name in getattr(spec, "_references", ())
               if isinstance(getattr(spec, name), str)}
    return dataclasses.replace(spec, **changes) if changes else spec


#: how a budget knob is set for ``--match-gmacs F`` (:class:`BudgetKnob`)
KNOB_MODES = ("search", "fraction")
#: what a larger knob value does to the compute (:class:`BudgetKnob`)
KNOB_DIRECTIONS = ("more", "less")
#: what a search does when no setting lands within the tolerance (``BudgetKnob.coarse``)
KNOB_COARSE = ("fail", "below")


@dataclass(frozen=True)
class BudgetKnob:
    """The one parameter that sets a method's compute, so that ``--match-gmacs F`` and
    ``vitbench sweep`` can put every method at the same GMACs (docs/architecture.md, "The budget knob").

    - ``param``: the parameter's name in the method's parameter dataclass (ToMe: ``"r"``).
    - ``larger_means``: ``"less"`` when a larger value gives fewer GMACs (ToMe's ``r``, tokens
      removed), ``"more"`` when it gives more (top-k's ``keep``, a fraction kept).
    - ``mode``: ``"search"``: the GMACs count is a monotone function of the knob that does not
      depend on training (a training-free method, or LTM whose token count is fixed by its
      ratio), so vitbench searches the knob on the real count (``low``..``high``) until it lands
      within the tolerance. ``"fraction"``: the knob *is* the fraction of the baseline's GMACs to
      keep (DCS's ``budget``, LTMP's ``gmacs_fraction``); vitbench sets it to ``F`` and checks the
      count after fine-tuning.
    - ``low``/``high``: the search range, inclusive (numbers, or ``f(ModelInfo) -> number`` when
      the range depends on the model, e.g. ToMe's ``r`` up to the patch count).
    - ``integer``: the knob takes integers (each guess of the search rounded to one).
    - ``per_block``: an integer knob that also takes a list with one value per block (ToMe's
      ``r``): when no single integer lands within the tolerance, the search gives the last
      ``k`` blocks ``v + 1`` and the others ``v``, which lands between ``v`` and ``v + 1``.
    - ``coarse``: when the count moves in steps too coarse for the tolerance, ``"fail"`` (the
      run is an error) or ``"below"``: take the nearest setting under the budget, recorded as
      landed outside the tolerance (the ``downsample`` control, whose images come in whole patches).
    """

    param: str
    larger_means: str
    mode: str = "search"
    low: Union[float, Callable[[ModelInfo], float]] = 0.0
    high: Union[float, Callable[[ModelInfo], float]] = 1.0
    integer: bool = False
    per_block: bool = False
    coarse: str = "fail"

    def __post_init__(self) -> None:
        if self.coarse not in KNOB_COARSE:
            raise ValueError(f"BudgetKnob.coarse={self.coarse!r}; valid: {', '.join(KNOB_COARSE)}")
        if self.larger_means not in KNOB_DIRECTIONS:
            raise ValueError(f"BudgetKnob.larger_means={self.larger_means!r}; valid: {', '.join(KNOB_DIRECTIONS)}")
        if self.mode not in KNOB_MODES:
            raise ValueError(f"BudgetKnob.mode={self.mode!r}; valid: {', '.join(KNOB_MODES)}")
        if self.per_block and not self.integer:
            raise ValueError("BudgetKnob.per_block needs integer=True (one integer per block)")

    def bounds(self, info: ModelInfo) -> tuple[float, float]:
        """The search range ``(low, high)`` on the model ``info`` describes."""
        low = self.low(info) if callable(self.low) else self.low
        high = self.high(info) if callable(self.high) else self.high
        return low, high


def patch_count(info: ModelInfo) -> int:
    """``high`` of a knob that counts tokens removed per block (ToMe's and PPT's ``r``): beyond
    half the patches a block cannot merge more, so the most patches any block sees is enough."""
    return info.max_patches


#: what a method reduces (``MethodSpec.kind``; a ``control`` is what a method must beat), as listed
METHOD_KINDS = ("merging", "pruning", "hybrid", "channel", "control", "other")
#: what a method of each kind needs of a family unless its spec says (``MethodSpec.needs``)
KIND_NEEDS = {kind: frozenset({"channels" if kind == "channel" else "token_steps"}) for kind in METHOD_KINDS}


@dataclass(frozen=True)
class MethodSpec:
    """A reduction method as a plugin registers it.

    ``build(params, info)`` turns validated parameters and the model description into a
    :class:`Reduction`; give it as a reference (``"my_plugin.reduction:build"``) so that the
    plugin imports no torch when it registers. ``params`` is a dataclass type (torch-free: the
    listings read it) whose fields all have defaults and whose ``__post_init__`` raises
    :class:`vitbench.errors.ParamError` on out-of-range values. ``budget`` names the parameter
    that sets its compute (:class:`BudgetKnob`). ``needs`` says what the method needs of a model
    family (:data:`~vitbench.core.capabilities.CAPABILITIES`; by default what its kind needs,
    :data:`KIND_NEEDS`): it runs on every family that provides all of it.
    """

    _references: ClassVar[tuple[str, ...]] = ("build",)

    name: str
    params: type
    build: Union[str, Callable[[Any, ModelInfo], Reduction]]
    #: what the method reduces, one of :data:`METHOD_KINDS` (``vitbench list methods``)
    kind: str = "other"
    #: the capabilities a family must provide (:data:`~vitbench.core.capabilities.CAPABILITIES`); ``None``: its kind's
    needs: Optional[frozenset[str]] = None
    aliases: tuple[str, ...] = ()
    needs_training: bool = False
    description: str = ""
    #: the knob that sets the method's compute (a :class:`BudgetKnob` or its kwargs); ``None``: not matchable
    budget: Optional[BudgetKnob] = None
    #: a parameter that makes a training-free method fine-tune when it is above 0 (ALGM's ``epochs``)
    trains_when: str = ""
    #: ``"package:folder"`` of the plugin's shipped fine-tuned weights (:mod:`vitbench.train.shipped`)
    weights: str = ""
    #: deprecated (say what the method needs in ``needs``): the only families it runs on, besides its needs
    families: tuple[str, ...] = ()
    #: deprecated, read by nothing: say ``attn`` or ``cls_attn`` in ``needs``
    needs_attention_probs: bool = False

    def trains(self, values: Any = None) -> bool:
        """Whether a run with parameters ``values`` (an instance of ``params``; ``None``: the
        defaults) fine-tunes the method before it is measured."""
        if self.needs_training or not self.trains_when:
            return self.needs_training
        return getattr(self.params() if values is None else values, self.trains_when) > 0

    def __post_init__(self) -> None:
        _check_references(self, self._references)
        if self.kind not in METHOD_KINDS:
            raise choices_error(f"method kind (of method {self.name!r})", self.kind, METHOD_KINDS)
        needs = KIND_NEEDS[self.kind] if self.needs is None else self.needs
        object.__setattr__(self, "needs", capability_set(needs, f"method {self.name!r}"))
        for old in ("families", "needs_attention_probs"):
            if getattr(self, old):
                warnings.warn(f"MethodSpec.{old} of {self.name!r} is deprecated: say what the method needs of a "
                              f"family in MethodSpec.needs (docs/guide/backbones.md, \"Capabilities\")",
                              DeprecationWarning, stacklevel=3)
        if self.trains_when and (self.needs_training or self.trains_when not in
                                 {f.name for f in dataclasses.fields(self.params)}):
            raise TypeError(f"MethodSpec.trains_when of {self.name!r} names {self.trains_when!r}: it must be a "
                            f"parameter of {self.params.__name__}, and needs_training False")
        if isinstance(self.budget, Mapping):  # BudgetKnob's keyword arguments
            object.__setattr__(self, "budget", BudgetKnob(**self.budget))
        elif self.budget is not None and not isinstance(self.budget, BudgetKnob):
            raise TypeError(f"MethodSpec.budget of {self.name!r} takes a BudgetKnob (or its keyword "
                            f"arguments as a dict), got {type(self.budget).__name__}")


@dataclass(frozen=True)
class ScorerSpec:
    """A token significance scorer (docs/methods.md, "Token scorers").

    ``score(info, prefix) -> [B, N - prefix]`` normalised to sum 1 per image, ``info`` the block's
    :class:`vitbench.engine.AttnInfo` (or its reference, ``"package.module:name"``); ``needs`` says
    what the attention must hand over for it.
    """

    _references: ClassVar[tuple[str, ...]] = ("score",)

    name: str
    score: Union[str, Callable[[Any, int], "torch.Tensor"]]
    needs: frozenset[str] = field(default_factory=frozenset)
    description: str = ""

    def __post_init__(self) -> None:
        _check_references(self, self._references)


Grid = tuple[int, int]
#: ``(info, ratio) -> (P, (H', W'))``: :attr:`FamilySpec.merge_grid`
MergeGrid = Callable[[ModelInfo, float], tuple[int, Grid]]
#: ``(info, shrink) -> [(grid seen, grid folded to)]``: :attr:`FamilySpec.sequence_grids`
SequenceGrids = Callable[[ModelInfo, Callable[[int, Grid], Grid]], list[tuple[Grid, Grid]]]


@dataclass(frozen=True)
class FamilySpec:
    """A model-family adapter: recognise a backbone, describe it, and patch it with a Reduction.

    Each function (and ``channel_reducer``) may be given as a reference, ``"package.module:name"``.
    """

    _references: ClassVar[tuple[str, ...]] = ("matches", "describe", "patch", "feature_module", "final_features",
                                              "merge_grid", "sequence_grids", "channel_reducer")

    name: str
    matches: Union[str, Callable[["nn.Module"], bool]]
    describe: Union[str, Callable[["nn.Module"], ModelInfo]]
    patch: Union[str, Callable[["nn.Module", Reduction], "nn.Module"]]
    model_patterns: tuple[str, ...] = ()
    #: the ``timm.models`` modules whose matching names the adapter accepts; empty: any module
    model_modules: tuple[str, ...] = ()
    #: wildcards of names the patterns match that the adapter refuses (e.g. attention pooling)
    model_excludes: tuple[str, ...] = ()
    description: str = ""
    #: the capabilities it gives methods: a method runs on it when it provides all it needs
    provides: frozenset[str] = frozenset()
    # what methods may ask of the family; a method that needs a member the family leaves at its
    # default refuses the family with an UnsupportedError
    #: ``model -> module``: the last block or stage, whose pooled output an IB bound trains on
    feature_module: Optional[Union[str, Callable[["nn.Module"], "nn.Module"]]] = None
    #: the blocks and stages give ``[B, H, W, C]`` maps (timm's ``output_fmt`` NHWC: Swin)
    channels_last: bool = False
    #: ``(model, images) -> [B, C]``, the IB metric's features; ``None``: the spatial mean
    final_features: Optional[Union[str, Callable[["nn.Module", "torch.Tensor"], "torch.Tensor"]]] = None
    #: token merging: ``(info, ratio) -> (P, (H', W'))``, the tokens and grid a merge keeps
    merge_grid: Optional[Union[str, MergeGrid]] = None
    #: every block reduces its own tiles for the MLP only and unmerges after it (Swin)
    reduces_tiles: bool = False
    #: ``(info, shrink) -> [(grid seen, grid folded to)]`` for hybrids whose merges shrink the map
    sequence_grids: Optional[Union[str, SequenceGrids]] = None
    #: channel reducer class for non-ViT blocks, built by ``from_block(block, arch, separate, tau0)``
    channel_reducer: Optional[Union[str, type]] = None

    def __post_init__(self) -> None:
        _check_references(self, self._references)
        object.__setattr__(self, "provides", capability_set(self.provides, f"family {self.name!r}"))


def missing_capabilities(method: MethodSpec, family: FamilySpec) -> frozenset[str]:
    """What ``method`` needs that ``family`` does not provide (empty: the method runs on it); a
    method that still lists its families (deprecated) misses ``family`` itself when it is not listed."""
    if method.families and family.name not in method.families:
        return frozenset({f"the {family.name} family (MethodSpec.families)"})
    return method.needs - family.provides


#: what a task's GMACs count (:attr:`vitbench.task.TaskInfo.counts`): the model (cls) or its backbone (det/seg)
COUNTED = ("model", "backbone")


@dataclass(frozen=True)
class ReportColumn:
    """An accuracy metric of a task as the reports show it (:attr:`vitbench.task.TaskInfo.accuracy`).

    The comparison table shows ``title`` (the record field ``key``, formatted with ``fmt``),
    then the columns of ``before`` as they are, then ``delta`` (the row minus the baseline), the
    delta against the control row when the task has one, then the columns of ``after``.
    ``before``/``after`` are ``(title, record key)`` pairs shown with the same format (cls: Top-5
    beside Top-1; det: AP50 and AP75 beside box mAP). ``plot_label`` labels the plots' axes; ``about``
    says how the task measures it, in the report's methodology (cls: mmpretrain's Accuracy).
    """

    key: str
    title: str
    delta: str
    fmt: str = ".3f"
    plot_label: str = ""
    before: tuple[tuple[str, str], ...] = ()
    after: tuple[tuple[str, str], ...] = ()
    about: str = ""

    @property
    def axis(self) -> str:
        """The plots' axis label: ``plot_label``, else ``title``."""
        return self.plot_label or self.title

    @property
    def keys(self) -> tuple[str, ...]:
        """The record fields the column shows: ``key``, then those of ``before`` and ``after``."""
        return (self.key, *(k for _, k in self.before), *(k for _, k in self.after))


@dataclass(frozen=True)
class TaskSetup:
    """What a task resolved from the command line before anything heavy runs
    (:meth:`vitbench.task.Task.setup`): the model and data names, the metrics it will measure, and the
    extra keywords its plan needs (:func:`vitbench.run.plan.build_plan`'s ``train_limit``,
    ``train_backbone``, ``control`` and the task's :attr:`~vitbench.task.TaskInfo.fields`)."""

    model: str
    data: Optional[str]
    metrics: tuple[str, ...]
    plan: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class WorkspaceRequest:
    """What :meth:`vitbench.task.Task.workspace` builds the plan's workspace from: the options, the
    task's own :class:`TaskSetup`, the plan (a list of :class:`~vitbench.host.spec.RunSpec`), the
    result folder, whether finished runs are reused (``--resume``, sweeps) and where progress
    notes go."""

    options: "RunOptions"
    setup: TaskSetup
    plan: Sequence[Any]
    out: Path
    resume: bool
    note: Callable[[str], None]


@dataclass(frozen=True)
class ParamDoc:
    """One parameter of a method as ``vitbench describe`` and the docs show it."""

    name: str
    type: str
    default: Any
    help: str
    #: the declared limits in words (``>= 0``, ``one of: a, b``; :func:`~vitbench.core.params.param`)
    limits: str = ""


def type_name(tp: Any) -> str:
    """A readable annotation: ``int | list[int] | (int, float)``, not ``Union[...]``."""
    import types
    import typing

    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (Union, types.UnionType):
        return " | ".join(type_name(a) for a in args)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return f"tuple[{type_name(args[0])}, ...]"
        return "(" + ", ".join(type_name(a) for a in args) + ")"
    if origin is not None:
        inner = ", ".join(type_name(a) for a in args)
        name = getattr(origin, "__name__", str(origin))
        return f"{name}[{inner}]" if inner else name
    if tp is type(None):
        return "None"
    return getattr(tp, "__name__", str(tp))


def param_docs(params: type) -> list[ParamDoc]:
    """The fields of a method's params dataclass: name, readable type, default and the one-line
    meaning from the field's ``metadata[HELP]`` (``""`` when it has none)."""
    import typing

    try:
        hints = typing.get_type_hints(params)
    except Exception:  # noqa: BLE001 - an annotation that does not resolve is shown as written
        hints = {}
    docs = []
    for f in dataclasses.fields(params):
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = dataclasses.MISSING
        tp = hints.get(f.name, f.type)
        docs.append(ParamDoc(f.name, tp if isinstance(tp, str) else type_name(tp), default, _help(params, f.name),
                             limits_text(f)))
    return docs


def _help(params: type, name: str) -> str:
    """The field's help, else that of the base class field it overrides (PPT's ``entropy``)."""
    for cls in params.__mro__:
        found = getattr(cls, "__dataclass_fields__", {}).get(name)
        if found is not None and HELP in found.metadata:
            return str(found.metadata[HELP])
    return ""
