"""agreement: an example vitbench *task* -- how often the reduced model still predicts what the
unreduced one predicts.

For every run spec the model (``--model``, default vitbench's embedded Fashion-MNIST ViT) is
reduced by the method and run on ``--limit`` images (default 64); the record's
``agreement_pct`` is the percentage of images whose top-1 class equals the unreduced model's
(the baseline row is 100 by definition); with the task's own option ``--agreement-top K`` an
image agrees when the unreduced model's class is among the reduced model's top K. It needs no labels and no data set: the images are
seeded standard-normal noise at the model's input size, the same for every run of a plan. So
it is a cheap probe of how much a method changes the model's function -- not an accuracy (use
``--task cls`` for that). GMACs are counted on the first 16 of the same images, and
``--match-gmacs``/``vitbench sweep`` match budgets on that count.

Training-free methods only: a learnable one would need the training data this task does not
have, and is refused before anything runs.
"""
from __future__ import annotations

import argparse
import copy
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch
from torch import nn

from vitbench import apply, measure
from vitbench.calibrate import GmacsCounter
from vitbench.catalog import ReportColumn, TaskSetup, TaskSpec, WorkspaceRequest
from vitbench.errors import VitbenchError
from vitbench.plan import BASELINE, DEFAULT_MODEL, check_applies, parse_list
from vitbench.plugins import get_host
from vitbench.tasks.common import input_size_of

Progress = Callable[[str], None]
#: what the task can measure (``--metrics``); "accuracy" is the agreement
METRICS = ("accuracy", "gmacs", "params")
IMAGES = 64
GMACS_IMAGES = 16


@dataclass
class AgreementWorkspace:
    """What the runs of one plan share: the unreduced model, the images and its predictions."""

    model: nn.Module
    images: torch.Tensor
    reference: torch.Tensor  # the unreduced model's top-1 class of each image
    top: int = 1  # --agreement-top K: the reference class among the reduced model's top K
    counters: dict = field(default_factory=dict)  # matched compute: the executor's cache


def add_options(group: argparse._ArgumentGroup) -> None:
    """The task's own command-line option (``TaskSpec.options``; refused with another task)."""
    group.add_argument("--agreement-top", type=int, default=1, metavar="K",
                       help="an image agrees when the unreduced model's top-1 class is among the reduced "
                            "model's top K classes (default 1)")


def setup(args: argparse.Namespace, methods: Sequence[str]) -> TaskSetup:
    """The model and metrics; learnable methods are refused (no training data here)."""
    host = get_host()
    learnable = [host.method(m).name for m in methods if host.method(m).needs_training]
    if learnable:
        raise VitbenchError(f"task 'agreement' runs training-free methods only; {', '.join(learnable)} must "
                            f"be fine-tuned (use --task cls)")
    if args.limit is not None and args.limit < 1:
        raise VitbenchError(f"--limit {args.limit} is out of range; it must be >= 1")
    if args.agreement_top < 1:
        raise VitbenchError(f"--agreement-top {args.agreement_top} is out of range; it must be >= 1")
    metrics = parse_list("metric", args.metrics, METRICS) if args.metrics is not None else METRICS
    return TaskSetup(model=args.model or DEFAULT_MODEL, data=None, metrics=metrics)


def _top1(model: nn.Module, images: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return model.eval()(images).argmax(dim=-1)


def _agrees(model: nn.Module, images: torch.Tensor, reference: torch.Tensor, top: int) -> torch.Tensor:
    """Per image: whether ``reference`` is among the model's ``top`` classes."""
    with torch.inference_mode():
        logits = model.eval()(images)
    ranked = logits.topk(min(top, logits.shape[-1]), dim=-1).indices
    return (ranked == reference[:, None]).any(dim=-1)


def workspace(request: WorkspaceRequest) -> AgreementWorkspace:
    """Load the model, check every method applies, draw the images and the reference predictions."""
    from vitbench.tasks.cls.models import load_model

    args, plan = request.args, request.plan
    request.note(f"loading model {request.setup.model}")
    model = load_model(request.setup.model, pretrained=args.pretrained, checkpoint=args.checkpoint,
                       seed=plan[0].seed)
    check_applies(plan, model)
    generator = torch.Generator().manual_seed(plan[0].seed)
    images = torch.randn(args.limit or IMAGES, *input_size_of(model), generator=generator)
    return AgreementWorkspace(model=model, images=images, reference=_top1(model, images), top=args.agreement_top)


def _reduced(ws: AgreementWorkspace, method: Optional[str], params: dict[str, Any]) -> nn.Module:
    model = copy.deepcopy(ws.model)
    return apply(model, method, **params) if method is not None else model


def run(spec: Any, ws: AgreementWorkspace, baseline: Optional[dict], progress: Progress,
        params: dict[str, Any]) -> dict[str, Any]:
    """One run: the agreement with the unreduced model, GMACs and parameters."""
    if spec.method != BASELINE:
        progress("applying the method")
    model = _reduced(ws, None if spec.method == BASELINE else spec.method, params).eval()
    out: dict[str, Any] = {}
    if "accuracy" in spec.metrics:
        progress(f"comparing top-{ws.top} with the unreduced model on {len(ws.images)} noise images")
        agree = _agrees(model, ws.images, ws.reference, ws.top).float().mean().item()
        out.update(agreement_pct=100.0 * agree, agreement_top=ws.top, num_images=len(ws.images),
                   images="seeded noise")
    if "gmacs" in spec.metrics:
        progress("counting GMACs")
        result = measure.count_gmacs(model, ws.images[:GMACS_IMAGES])
        out.update(gmacs=result.mean, gmacs_std=result.std, gmacs_images=result.n, gmacs_on="random images")
    if "params" in spec.metrics:
        out["params_m"] = measure.count_params_m(model)
    return out


def gmacs_counter(spec: Any, ws: AgreementWorkspace, progress: Progress) -> GmacsCounter:
    """GMACs of a reduced copy on the images :func:`run` counts on (``--match-gmacs``)."""
    images = ws.images[:GMACS_IMAGES]
    return GmacsCounter(lambda method, params: measure.count_gmacs(_reduced(ws, method, params).eval(),
                                                                    images).mean)


TASK = TaskSpec(
    name="agreement", setup=setup, workspace=workspace, run=run, gmacs_counter=gmacs_counter,
    metrics=METRICS, counts="model", options=add_options,
    accuracy=(ReportColumn("agreement_pct", "Agreement (%)", "ΔAgreement (pp)", ".1f",
                           plot_label="top-1 agreement with the unreduced model (%)"),),
    description="example: top-1 agreement of the reduced model with the unreduced one on seeded noise images",
)
