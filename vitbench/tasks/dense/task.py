"""What the ``det`` and ``seg`` tasks share (:class:`DenseTask`; the built-in plugin ``dense_tasks``
registers them): an mmdet detector around the backbone, COCO-format data, the dense fine-tuning
protocol, and the workspace whose baseline detector is trained once, by the first run that needs
it (:mod:`vitbench.tasks.dense.run`; under a launcher by every rank together, with DDP).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Optional

from vitbench.catalog import ReportColumn, TaskSetup, WorkspaceRequest
from vitbench.errors import VitbenchError
from vitbench.core.metrics import DEFAULT_METRICS
from vitbench.core.options import parse_list
from vitbench.task import Progress, Task, TaskField, TaskInfo, TaskReport, parse_options
from vitbench.tasks.dense.options import DenseOptions
from vitbench.tasks.identity import data_path, first_seed, identity_fields
from vitbench.core.cache import cache_dir
from vitbench.tasks.dense.protocol import DEFAULT_PROTOCOL, check_finetune_epochs, check_protocol, describe
from vitbench.tasks.dense.requires import check_dense_stack

if TYPE_CHECKING:  # the mm stack is imported when a dense run starts, not when the plugin loads
    from torch import nn

    from vitbench.core.options import RunOptions
    from vitbench.tasks.dense.run import DenseWorkspace

__all__ = ["BOX_MAP", "DEFAULT_DENSE_MODEL", "MAP_ABOUT", "DENSE_FIELDS", "DENSE_METRICS", "DenseTask", "dense_info"]

#: the default backbone of the dense tasks (on the embedded data: trained on Fashion-MNIST, shipped)
DEFAULT_DENSE_MODEL = "mobilevit_xs"
#: metrics of the dense tasks ("accuracy" is box/mask mAP; the IB metric needs image classes)
DENSE_METRICS = tuple(m for m in DEFAULT_METRICS if m != "ib")
#: how the dense tasks measure box and mask mAP, in the report's methodology
MAP_ABOUT = ("Box/mask mAP come from mmdet's CocoMetric, on the number of images in column Images; they get no "
             "interval: mAP is no proportion of images, so no binomial interval applies, and an honest one (a "
             "bootstrap over images) needs the per-image detections, which a record does not keep.")
#: what the reports show as a dense task's accuracy: COCO box mAP with AP50 and AP75
BOX_MAP = ReportColumn("box_map", "Box mAP", "ΔBox mAP", ".3f", plot_label="box mAP",
                       after=(("Box AP50", "box_ap50"), ("Box AP75", "box_ap75")), about=MAP_ABOUT)


#: the dense fine-tuning protocol and its epochs as spec fields, noted in labels unless the default
DENSE_FIELDS = (TaskField("dense_finetune", note="fine-tuned: {}", unless=DEFAULT_PROTOCOL, no_control=("method",)),
                TaskField("finetune_epochs", note="fine-tuned {} epoch{s}"))


def dense_info(description: str, accuracy: tuple[ReportColumn, ...]) -> TaskInfo:
    """What a dense task declares: its backbone's GMACs matched, the dense protocol's spec fields,
    the :data:`~vitbench.task.CONTROL` row."""
    return TaskInfo(description=description, metrics=DENSE_METRICS, accuracy=accuracy, counts="backbone",
                    distributed=True, control=True, fields=DENSE_FIELDS, options=DenseOptions)


class DenseTask(Task, TaskReport):
    """What ``det`` and ``seg`` share: an mmdet detector around the reduced backbone, its
    backbone's GMACs matched, the dense fine-tuning protocol as spec fields and the control row
    (:data:`~vitbench.task.CONTROL`) while detector weights fine-tune."""
    #: the backbone strides the detector takes (:class:`~vitbench.tasks.dense.backbone.FeatureMaps`)
    strides: tuple[int, ...] = ()

    def detector_config(self, in_channels: Sequence[int], num_classes: int, *, width: str,
                        mean: Sequence[float], std: Sequence[float]) -> dict[str, Any]:
        """The mmdet config of the task's detector, backbone left out
        (:func:`~vitbench.tasks.dense.detectors.build_detector` fills it in)."""
        raise NotImplementedError(f"the dense task {self.name!r} names no detector")

    def setup(self, options: "RunOptions") -> TaskSetup:
        """The backbone (default :data:`DEFAULT_DENSE_MODEL`), data (default: the embedded
        Fashion-MNIST scenes), metrics and dense fine-tuning protocol; the weights the backbone
        starts from (:func:`~vitbench.tasks.dense.data.embedded_backbone`) are part of the runs' identity."""
        # torch/mm: when a run starts; registering the task stays light
        from vitbench.tasks.dense.data import DEFAULT_DATA, EMBEDDED_DATA, embedded_backbone, embedded_weights

        check_dense_stack(self.name)  # mmdet and mmcv's ops: the dense extra, not the cls install
        own = parse_options(self, options.task_options)
        metrics = (parse_list("metric", ",".join(options.metrics), DENSE_METRICS) if options.metrics is not None
                   else DENSE_METRICS)
        protocol = _dense_protocol(own, options.train_backbone)

        finetune_epochs = check_finetune_epochs(own.finetune_epochs)
        if finetune_epochs is not None and protocol == "method":
            raise VitbenchError(f"--finetune-epochs {finetune_epochs} sets how long detector weights fine-tune; "
                                "--dense-finetune method trains none (use all or heads)")
        model = options.model or DEFAULT_DENSE_MODEL
        data = data_path(options.data) if options.data and options.data not in EMBEDDED_DATA else options.data or DEFAULT_DATA
        epochs = self._epochs(own, data)
        if epochs < 1:
            raise VitbenchError(f"--detector-epochs {epochs} is out of range; it must be >= 1")
        embedded = embedded_backbone(model, data, options.pretrained, options.checkpoint)
        identity = identity_fields(options, evaluates_data=True, random_init=not options.pretrained and not embedded)
        if embedded:
            identity["weights"] = embedded_weights(embedded)
        return TaskSetup(model=model, data=data, metrics=metrics,
                         plan={"train_limit": _train_limit(options, data), "dense_finetune": protocol,
                               "finetune_epochs": finetune_epochs,
                               "control": not own.no_control, **identity})

    def _epochs(self, own: DenseOptions, data: Optional[str]) -> int:
        # the data sets' modules: when a run starts; registering the task stays light
        from vitbench.tasks.dense.schedule import schedule_for

        return schedule_for(data).detector_epochs[self.name] if own.detector_epochs is None else own.detector_epochs

    def workspace(self, request: WorkspaceRequest) -> "DenseWorkspace":
        """Resolve the data, load the backbone, check every method applies. Nothing is trained here:
        each seed's baseline detector is trained (or loaded from the cache) when the first run of
        that seed needs it (:func:`~vitbench.tasks.dense.run.trained_weights`) -- under
        ``--launcher pytorch|slurm`` by every rank together, with DDP, once the process group runs --
        so a ``--resume`` with every run finished trains nothing."""
        # torch/mm: when a run starts; registering the task stays light
        from vitbench.host.apply import check_applies
        from vitbench.tasks.dense.data import embedded_backbone, resolve_det_data
        from vitbench.tasks.dense.run import DenseWorkspace, check_model_name, load_backbone

        options, setup, plan = request.options, request.setup, request.plan
        own = parse_options(self, options.task_options)
        check_model_name(setup.model)  # before the data: the default set takes seconds to generate
        data = resolve_det_data(options.data)
        scheduled = data.name if data.embedded else None  # a folder's name is no embedded set's
        request.note(f"data {data.name}: {data.num_classes} classes ({', '.join(data.classes[:8])}"
                     f"{', ...' if data.num_classes > 8 else ''}); loading backbone {setup.model}")
        embedded = embedded_backbone(setup.model, data.name, options.pretrained, options.checkpoint)
        model = load_backbone(setup.model, data.num_classes, data.input_size, pretrained=options.pretrained,
                              checkpoint=options.checkpoint, seed=first_seed(options), embedded=embedded)
        check_applies(plan, model, isolated=options.isolated)
        request.out.mkdir(parents=True, exist_ok=True)
        normalise = {}
        if embedded:  # the grey statistics it was trained with, in 0-255 as mmdet's preprocessor takes them
            cfg = model.pretrained_cfg
            normalise = {"mean": tuple(255 * m for m in cfg["mean"]), "std": tuple(255 * s for s in cfg["std"])}
        return DenseWorkspace(task=self.name, model=model, model_name=setup.model, data=data, **normalise,
                              width=own.detector_width or ("light" if data.embedded else "full"),
                              epochs=self._epochs(own, scheduled), train_limit=setup.plan["train_limit"],
                              work_dir=request.out / "work", eval_limit=options.limit,
                              cache_dir=cache_dir() / "detectors" if data.embedded else request.out / "checkpoints")

    def run(self, spec: Any, ws: "DenseWorkspace", model: "nn.Module", progress: Progress) -> dict[str, Any]:
        """One det/seg spec (:func:`vitbench.tasks.dense.run.run_dense_spec`)."""
        # torch/mm: when a run starts; registering the task stays light
        from vitbench.tasks.dense.run import run_dense_spec

        return run_dense_spec(spec, ws, model, progress)

    def compared_with_control(self, record: Mapping[str, Any]) -> bool:
        """Rows that fine-tuned detector weights, as the control did."""
        # torch/mm: when a run starts; registering the task stays light
        from vitbench.tasks.dense.report import finetunes_detector

        return finetunes_detector(record)

    def training_words(self, record: Mapping[str, Any], with_method: bool = True) -> Optional[str]:
        """The recorded dense fine-tuning protocol in words."""
        settings = record.get("dense_finetune")
        return describe(settings, with_method) if settings else None

    def report_notes(self, rows: Sequence[Mapping[str, Any]]) -> list[str]:
        """The detector, its training, what GMACs cover, the protocol and the control
        (:func:`vitbench.tasks.dense.report.detector_notes`)."""
        # torch/mm: when a run starts; registering the task stays light
        from vitbench.tasks.dense.report import detector_notes

        return detector_notes(rows)


def _dense_protocol(own: DenseOptions, train_backbone: bool) -> str:
    """``--dense-finetune`` checked (``--train-backbone`` on det/seg is ``all``)."""
    protocol = check_protocol(own.dense_finetune) if own.dense_finetune is not None else None
    if train_backbone:
        if protocol not in (None, "all"):
            raise VitbenchError(f"--train-backbone trains every detector weight (--dense-finetune all); "
                                f"it contradicts --dense-finetune {protocol}")
        protocol = "all"
    return protocol or DEFAULT_PROTOCOL


def _train_limit(options: "RunOptions", data: Optional[str]) -> Optional[int]:
    """``--train-limit``, else the data set's default (:mod:`vitbench.tasks.dense.schedule`)."""
    # the data sets' modules: when a run starts; registering the task stays light
    from vitbench.tasks.dense.schedule import schedule_for

    return options.train_limit if options.train_limit is not None else schedule_for(data).train_limit
