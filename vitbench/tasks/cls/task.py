"""The ``cls`` task as its plugin registers it (:class:`ClsTask`; the built-in plugin ``cls_task``):
what it measures and how it resolves the model, data and metrics from the options. Loading the model
and running a spec (:mod:`vitbench.tasks.cls.run`) are imported when a run starts, so that listing
the tasks imports no torch.
"""
from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Optional

from vitbench.catalog import ReportColumn, TaskSetup, WorkspaceRequest
from vitbench.errors import VitbenchError
from vitbench.core.metrics import DATA_METRICS, DEFAULT_METRICS, METRICS
from vitbench.core.options import parse_list
from vitbench.host import get_host
from vitbench.task import Progress, Task, TaskInfo, parse_options
from vitbench.tasks.cls import DEFAULT_MODEL, EMBEDDED_MODELS, EMBEDDED_TRAIN_LIMIT, ENV_DEFAULT_MODEL
from vitbench.tasks.cls.options import ClsOptions, check_img_size
from vitbench.tasks.identity import data_path, identity_fields
from vitbench.core.params import params_dict, training_params
from vitbench.host.values import method_values

if TYPE_CHECKING:  # pragma: no cover
    from torch import nn

    from vitbench.core.options import RunOptions
    from vitbench.host.spec import RunSpec
    from vitbench.tasks.cls.run import ClsWorkspace

__all__ = ["CLS_ACCURACY", "ClsTask"]

#: what the reports show as accuracy: top-1 (with top-5 beside it, and the agreement with the baseline after)
CLS_ACCURACY = (ReportColumn(
    "top1_pct", "Top-1 (%)", "ΔTop-1 (pp)", ".2f", before=(("Top-5 (%)", "top5_pct"),),
    after=(("Agreement (%)", "agreement_pct"),),
    about="Top-1/top-5 come from mmpretrain's Accuracy. Column Images is the number of evaluation images a row was "
          "scored on, and a single run's accuracy is shown with its 95 % Wilson score interval, `85.50 [80.0, 89.6]` "
          "(k correct of n images; asymmetric near 0 and 100 %, where a ± would leave the range): two rows whose "
          "intervals overlap may not differ. Over several seeds the cell is the mean ± standard deviation instead."),)


def _learnable(options: "RunOptions") -> list[str]:
    """The methods of ``options`` that fine-tune with their ``--param`` values (ALGM only with
    ``epochs`` above 0)."""
    host = get_host()
    return [name for name, values in method_values(options.methods, options.params).items()
            if host.method(name).trains(values)]


def _metrics(options: "RunOptions", model: str) -> tuple[str, ...]:
    if options.metrics is not None:
        metrics = parse_list("metric", ",".join(options.metrics), METRICS)
        needs = [m for m in metrics if m in DATA_METRICS]
        if needs and options.data is None and model not in EMBEDDED_MODELS:
            raise VitbenchError(f"{' and '.join(needs)} of {model!r} need --data PATH (an ImageNet-style "
                                f"folder); or leave {', '.join(needs)} out of --metrics")
        return metrics
    if options.data is None and model not in EMBEDDED_MODELS:
        without = tuple(m for m in DEFAULT_METRICS if m not in DATA_METRICS)
        print(f"vitbench: note: no --data for {model!r}: measuring {', '.join(without)} without "
              f"{' and '.join(DATA_METRICS)}", file=sys.stderr)
        return without
    return DEFAULT_METRICS


def _reads_data(metrics: Sequence[str], options: "RunOptions") -> bool:
    """Whether the plan reads its data: accuracy (or IB) is measured, or a method fine-tunes."""
    return any(m in metrics for m in DATA_METRICS) or bool(_learnable(options))


def _shipped_train_limits(options: "RunOptions", methods: Sequence[str], model: str) -> dict[str, int]:
    """The training images of the weights a method ships for ``model``
    (:mod:`vitbench.train.shipped`), for each of ``methods`` whose ``--param`` values equal that
    entry's training parameters (under ``--match-gmacs`` a searched budget knob aside, a fraction
    knob as the F it will be): without
    ``--train-limit`` such a run trains on the entry's budget and so loads it; another setting
    trains on the default images. None in a sweep (its budgets set the knob)."""
    # torch/mm: when a run starts; registering the task stays light
    from vitbench.train.shipped import shipped_entries

    if options.is_sweep:
        return {}
    host = get_host()
    out = {}
    parsed = method_values(options.methods, options.params)
    for name in methods:
        spec = host.method(name)
        values = parsed[spec.name]
        wanted = training_params(spec.params, params_dict(values))
        knob = spec.budget.param if spec.budget is not None and options.match_gmacs is not None else None
        if knob is not None and spec.budget.mode == "fraction":  # the knob will be F itself: compare it
            wanted, knob = {**wanted, spec.budget.param: options.match_gmacs}, None
        for entry in shipped_entries(spec.weights):
            shipped = dict(entry.settings["params"])
            if knob is not None:
                shipped.pop(knob, None)
            if entry.settings["model"] == model and shipped == {k: v for k, v in wanted.items() if k != knob} \
                    and isinstance(entry.settings["train_limit"], int):
                out[spec.name] = entry.settings["train_limit"]
                break
    return out


class ClsTask(Task):
    """``cls``: an mmpretrain ``ImageClassifier`` around the reduced model; top-1/top-5 accuracy."""

    name = "cls"
    info = TaskInfo(description="image classification (mmpretrain ImageClassifier): top-1/top-5 accuracy",
                    metrics=METRICS, accuracy=CLS_ACCURACY, distributed=True, options=ClsOptions)

    def setup(self, options: "RunOptions") -> TaskSetup:
        """The model (default: the embedded Fashion-MNIST ViT), data and metrics."""
        own = parse_options(self, options.task_options)  # another task's options are refused
        img_size = check_img_size(own.img_size)
        model_name = options.model or DEFAULT_MODEL
        if model_name not in EMBEDDED_MODELS and options.model is None:
            raise VitbenchError(f"${ENV_DEFAULT_MODEL} {DEFAULT_MODEL!r} is not an embedded model; valid: "
                                f"{', '.join(EMBEDDED_MODELS)}")
        metrics = _metrics(options, model_name)
        data: Optional[str] = options.data
        if any(m in metrics for m in DATA_METRICS) and data is None:
            data = "fashion-mnist"
        train_limit = options.train_limit
        if train_limit is None and model_name in EMBEDDED_MODELS:
            train_limit = EMBEDDED_TRAIN_LIMIT[model_name]
        learnable = _learnable(options)
        if learnable and data is None:
            if model_name not in EMBEDDED_MODELS:
                raise VitbenchError(f"{', '.join(learnable)} must be fine-tuned: pass --data PATH (an "
                                    f"ImageNet-style folder with a train/ split)")
            data = "fashion-mnist"
        reads_data = _reads_data(metrics, options)
        head = None
        if options.num_classes is not None and model_name not in EMBEDDED_MODELS:  # a new head: fitted when data is read
            head = f"num_classes={options.num_classes}" + (
                f",fit_limit={'all' if train_limit is None else train_limit}" if reads_data else "")
        # torch/mm: when a run starts; registering the task stays light
        from vitbench.tasks.cls.data import is_fashion_mnist

        if not is_fashion_mnist(data):
            data = data_path(data)
        folder = data if reads_data and not is_fashion_mnist(data) else None
        identity = identity_fields(options, evaluates_data=reads_data, head=head, data_folder=folder,
                                   random_init=not options.pretrained and model_name not in EMBEDDED_MODELS)
        shipped = _shipped_train_limits(options, learnable, model_name) if options.train_limit is None else {}
        return TaskSetup(model=model_name, data=data, metrics=metrics,
                         plan={"train_backbone": options.train_backbone, "train_limit": train_limit,
                               **({"train_limits": shipped} if shipped else {}),
                               **({"img_size": img_size} if img_size is not None else {}), **identity})

    def workspace(self, request: WorkspaceRequest) -> "ClsWorkspace":
        """Load the model (the default one is trained once and cached), check every method applies,
        resolve the data when accuracy is measured or a method trains, fit a new head when asked
        (:func:`~vitbench.tasks.cls.run.cls_workspace`)."""
        # torch/mm: when a run starts; registering the task stays light
        from vitbench.tasks.cls.run import cls_workspace

        return cls_workspace(request, reads_data=_reads_data(request.setup.metrics, request.options))

    def run(self, spec: "RunSpec", ws: "ClsWorkspace", model: "nn.Module", progress: Progress) -> dict[str, Any]:
        """:func:`~vitbench.tasks.cls.run.run_cls_spec`."""
        # torch/mm: when a run starts; registering the task stays light
        from vitbench.tasks.cls.run import run_cls_spec

        return run_cls_spec(spec, ws, model, progress)
