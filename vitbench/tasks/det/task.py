"""The ``det`` and ``seg`` tasks as the command line sets them up (:class:`~vitbench.catalog.TaskSpec`
callables; the built-in plugin ``dense_tasks`` registers them): the backbone and COCO-format
data, the dense fine-tuning protocol, and the workspace whose baseline detector is trained once,
by the first run that needs it (:mod:`vitbench.tasks.det.run`; under a launcher by every rank
together, with DDP).
"""
from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Callable, Optional

from vitbench.catalog import ReportColumn, TaskSetup, WorkspaceRequest
from vitbench.errors import VitbenchError
from vitbench.plan import METRICS, check_applies, parse_list

if TYPE_CHECKING:  # the mm stack is imported when a dense run starts, not when the plugin loads
    from vitbench.tasks.det.run import DenseWorkspace

Progress = Callable[[str], None]

__all__ = ["DEFAULT_DENSE_MODEL", "DENSE_METRICS", "DET_ACCURACY", "SEG_ACCURACY", "dense_counter", "dense_setup",
           "dense_workspace", "run_dense"]

#: the default backbone of the dense tasks (random init, trained with the detector)
DEFAULT_DENSE_MODEL = "mobilevit_xs"
#: metrics of the dense tasks ("accuracy" is box/mask mAP; the IB metric needs image classes)
DENSE_METRICS = tuple(m for m in METRICS if m != "ib")
_BOX = ReportColumn("box_map", "Box mAP", "ΔBox mAP", ".3f", plot_label="box mAP",
                    after=(("Box AP50", "box_ap50"), ("Box AP75", "box_ap75")))
_MASK = ReportColumn("mask_map", "Mask mAP", "ΔMask mAP", ".3f", plot_label="mask mAP",
                     after=(("Mask AP50", "mask_ap50"), ("Mask AP75", "mask_ap75")))
#: what the reports show as accuracy: COCO box (and mask) mAP with AP50 and AP75
DET_ACCURACY = (_BOX,)
SEG_ACCURACY = (_BOX, _MASK)


def dense_setup(args: argparse.Namespace, methods: Sequence[str]) -> TaskSetup:
    """The backbone (default :data:`DEFAULT_DENSE_MODEL`), data (default: the embedded shapes set),
    metrics and dense fine-tuning protocol of ``--task det|seg``."""
    from vitbench.tasks.det.data import SHAPES
    from vitbench.tasks.det.run import DEFAULT_EPOCHS

    metrics = parse_list("metric", args.metrics, DENSE_METRICS) if args.metrics is not None else DENSE_METRICS
    protocol = _dense_protocol(args)
    epochs = DEFAULT_EPOCHS[args.task] if args.detector_epochs is None else args.detector_epochs
    if epochs < 1:
        raise VitbenchError(f"--detector-epochs {epochs} is out of range; it must be >= 1")
    return TaskSetup(model=args.model or DEFAULT_DENSE_MODEL, data=args.data or SHAPES, metrics=metrics,
                     plan={"train_limit": args.train_limit, "dense_finetune": protocol,
                           "control": not args.no_control})


def dense_workspace(request: WorkspaceRequest) -> "DenseWorkspace":
    """Resolve the data, load the backbone, check every method applies. Nothing is trained here:
    each seed's baseline detector is trained (or loaded from the cache) when the first run of
    that seed needs it (:func:`~vitbench.tasks.det.run.trained_weights`) -- under
    ``--launcher pytorch|slurm`` by every rank together, with DDP, once the process group runs --
    so a ``--resume`` with every run finished trains nothing."""
    from vitbench.tasks.cls.default_model import cache_dir
    from vitbench.tasks.det.data import resolve_det_data
    from vitbench.tasks.det.run import DEFAULT_EPOCHS, DenseWorkspace, check_model_name, load_backbone

    args, setup, plan = request.args, request.setup, request.plan
    check_model_name(setup.model)  # before the data: the default set takes seconds to generate
    data = resolve_det_data(args.data)
    request.note(f"data {data.name}: {data.num_classes} classes ({', '.join(data.classes[:8])}"
                 f"{', ...' if data.num_classes > 8 else ''}); loading backbone {setup.model}")
    model = load_backbone(setup.model, data.num_classes, data.input_size, pretrained=args.pretrained,
                          checkpoint=args.checkpoint, seed=plan[0].seed)
    check_applies(plan, model)
    request.out.mkdir(parents=True, exist_ok=True)
    epochs = DEFAULT_EPOCHS[args.task] if args.detector_epochs is None else args.detector_epochs
    return DenseWorkspace(task=args.task, model=model, model_name=setup.model, data=data,
                          width=args.detector_width or ("light" if data.embedded else "full"), epochs=epochs,
                          train_limit=args.train_limit, work_dir=request.out / "work", eval_limit=args.limit,
                          cache_dir=cache_dir() / "detectors" if data.embedded else request.out / "checkpoints")


def run_dense(spec: Any, ws: "DenseWorkspace", baseline: Optional[dict], progress: Progress,
              params: dict[str, Any]) -> dict[str, Any]:
    """One det/seg spec (:func:`vitbench.tasks.det.run.run_dense_spec`)."""
    from vitbench.tasks.det.run import run_dense_spec

    return run_dense_spec(spec, ws, baseline, progress, params=params)


def dense_counter(spec: Any, ws: "DenseWorkspace", progress: Progress) -> Any:
    """The backbone's GMACs inside the trained detector (matched compute)."""
    from vitbench.tasks.det.run import dense_gmacs_counter

    return dense_gmacs_counter(ws, spec.seed, progress)


def _dense_protocol(args: argparse.Namespace) -> str:
    """``--dense-finetune`` checked (``--train-backbone`` on det/seg is ``all``)."""
    from vitbench.tasks.det.protocol import DEFAULT_PROTOCOL, check_protocol

    protocol = check_protocol(args.dense_finetune) if args.dense_finetune is not None else None
    if args.train_backbone:
        if protocol not in (None, "all"):
            raise VitbenchError(f"--train-backbone trains every detector weight (--dense-finetune all); "
                                f"it contradicts --dense-finetune {protocol}")
        protocol = "all"
    return protocol or DEFAULT_PROTOCOL
