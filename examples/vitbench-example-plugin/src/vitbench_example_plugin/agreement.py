"""agreement: an example vitbench *task* -- how often the reduced model still predicts what the
unreduced one predicts.

For every run spec the model (``--model``, default vitbench's embedded Fashion-MNIST ViT), which
vitbench reduces by the method before the task sees it, runs on ``--limit`` images (default 64); the record's
``agreement_pct`` is the percentage of images whose top-1 class equals the unreduced model's
(the baseline row is 100 by definition); with the task's own option ``--agreement-top K`` an
image agrees when the unreduced model's class is among the reduced model's top K. It needs no labels and no data set: the images are
seeded standard-normal noise at the model's input size, the same for every run of a plan. So
it is a cheap probe of how much a method changes the model's function -- not an accuracy (use
``--task cls`` for that). GMACs are counted on the first 16 of the same images, and
``--match-gmacs``/``vitbench sweep`` match budgets on that count.

Training-free methods only: a learnable one would need the training data this task does not
have, and is refused before anything runs. Every vitbench command imports this module (to list
the task and its option), so torch and the model code are imported inside the methods that run.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from vitbench.catalog import ReportColumn, TaskSetup, WorkspaceRequest
from vitbench.errors import VitbenchError
from vitbench.core.options import RunOptions, parse_list
from vitbench.host import get_host
from vitbench.task import Progress, Task, TaskInfo, Workspace, option, parse_options
from vitbench.tasks.embedded import DEFAULT_MODEL

if TYPE_CHECKING:
    import torch
    from torch import nn

#: what the task can measure (``--metrics``); "accuracy" is the agreement
METRICS = ("accuracy", "gmacs", "params")
IMAGES = 64
GMACS_IMAGES = 16


@dataclass
class AgreementWorkspace(Workspace):
    """What the runs of one plan share: the unreduced model, the images and its predictions."""

    model: nn.Module
    images: torch.Tensor
    reference: torch.Tensor  # the unreduced model's top-1 class of each image
    top: int = 1  # --agreement-top K: the reference class among the reduced model's top K
    counters: dict = field(default_factory=dict)  # matched compute: the executor's cache

    def gmacs_of(self, spec: Any, progress: Progress) -> Callable[[nn.Module], float]:
        """A reduced copy's GMACs on the images :meth:`AgreementTask.run` counts on (``--match-gmacs``)."""
        from vitbench import measure

        return lambda model: measure.count_gmacs(model.eval(), self.images[:GMACS_IMAGES]).mean


@dataclass(frozen=True)
class AgreementOptions:
    """The task's own command-line option (refused with another task)."""

    agreement_top: int = option("an image agrees when the unreduced model's top-1 class is among the reduced "
                                "model's top K classes (default 1)", default=1, metavar="K")


def _top1(model: nn.Module, images: torch.Tensor) -> torch.Tensor:
    import torch

    with torch.inference_mode():
        return model.eval()(images).argmax(dim=-1)


def _agrees(model: nn.Module, images: torch.Tensor, reference: torch.Tensor, top: int) -> torch.Tensor:
    """Per image: whether ``reference`` is among the model's ``top`` classes."""
    import torch

    with torch.inference_mode():
        logits = model.eval()(images)
    ranked = logits.topk(min(top, logits.shape[-1]), dim=-1).indices
    return (ranked == reference[:, None]).any(dim=-1)


class AgreementTask(Task):
    """``agreement``: top-1 agreement of the reduced model with the unreduced one on seeded noise."""

    name = "agreement"
    info = TaskInfo(description="example: top-1 agreement of the reduced model with the unreduced one on seeded "
                                "noise images",
                    metrics=METRICS, accuracy=(ReportColumn("agreement_pct", "Agreement (%)", "ΔAgreement (pp)", ".1f",
                                                            plot_label="top-1 agreement with the unreduced model (%)"),),
                    options=AgreementOptions)

    def setup(self, options: RunOptions) -> TaskSetup:
        """The model and metrics; learnable methods are refused (no training data here)."""
        own = parse_options(self, options.task_options)
        host = get_host()
        learnable = [host.method(m).name for m in options.methods if host.method(m).needs_training]
        if learnable:
            raise VitbenchError(f"task 'agreement' runs training-free methods only; {', '.join(learnable)} must "
                                f"be fine-tuned (use --task cls)")
        if options.limit is not None and options.limit < 1:
            raise VitbenchError(f"--limit {options.limit} is out of range; it must be >= 1")
        if own.agreement_top < 1:
            raise VitbenchError(f"--agreement-top {own.agreement_top} is out of range; it must be >= 1")
        metrics = parse_list("metric", ",".join(options.metrics), METRICS) if options.metrics is not None else METRICS
        return TaskSetup(model=options.model or DEFAULT_MODEL, data=None, metrics=metrics)

    def workspace(self, request: WorkspaceRequest) -> AgreementWorkspace:
        """Load the model, check every method applies, draw the images and the reference predictions."""
        import torch

        from vitbench.host.apply import check_applies
        from vitbench.tasks.models import load_model
        from vitbench.tasks.common import input_size_of

        options, plan = request.options, request.plan
        request.note(f"loading model {request.setup.model}")
        model = load_model(request.setup.model, pretrained=options.pretrained, checkpoint=options.checkpoint,
                           seed=plan[0].seed)
        check_applies(plan, model)
        generator = torch.Generator().manual_seed(plan[0].seed)
        images = torch.randn(options.limit or IMAGES, *input_size_of(model), generator=generator)
        top = parse_options(self, options.task_options).agreement_top
        return AgreementWorkspace(model=model, images=images, reference=_top1(model, images), top=top)

    def run(self, spec: Any, ws: AgreementWorkspace, model: nn.Module, progress: Progress) -> dict[str, Any]:
        """One run of ``model`` (reduced by vitbench): the agreement with the unreduced model, GMACs
        and parameters."""
        from vitbench import measure

        model = model.eval()
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
