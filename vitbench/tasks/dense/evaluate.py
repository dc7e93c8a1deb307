"""Box (and mask) mAP of a detector, measured by the mmengine Runner's test loop with mmdet's
``CocoMetric`` (docs/measuring.md, "Accuracy and mAP").

Under ``--launcher pytorch|slurm`` (a process group of more than one rank) every rank runs the
same call: mmengine's ``DefaultSampler`` gives each rank its part of the validation images and
the ``Evaluator`` gathers the per-image predictions on rank 0 (in the spec's work folder,
:func:`vitbench.host.distributed.collect_in`), which scores them once with ``CocoMetric`` and
broadcasts the metrics, so every rank returns what a single process would.

Guarded: NaN features drop every box at NMS's score threshold and read as an mAP
near 0 with no sign of why, so the outputs of the backbone, neck and heads and the final
predictions must be finite in every batch, and so must the metrics. Under a launcher a rank
whose shard trips a guard stops, and every rank raises the same error naming it (``... in batch
2 on rank 1 of 2``) where they would otherwise gather the predictions
(:func:`vitbench.host.distributed.collective_test`), instead of the others waiting there for it.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import torch
from mmengine.hooks import Hook
from torch import nn

from vitbench.errors import DataError
from vitbench.core.guards import check_finite, check_metrics
from vitbench.tasks.dense.data import DetData
from vitbench.tasks.dense.train import _loader, quiet_stdout
from vitbench.core import progress
from vitbench.host import distributed
from vitbench.measure.precision import autocast_method
from vitbench.mm.hooks import TestProgressHook
from vitbench.mm.runner import release, runner_kwargs, work_dir_or_temp

#: record field <- CocoMetric key (COCO's 0..1 scale, as mmdet and the papers' tables report it)
_KEYS = {"box_map": "coco/bbox_mAP", "box_ap50": "coco/bbox_mAP_50", "box_ap75": "coco/bbox_mAP_75",
         "mask_map": "coco/segm_mAP", "mask_ap50": "coco/segm_mAP_50", "mask_ap75": "coco/segm_mAP_75"}


#: the detector parts whose outputs are checked (those present; mmdet calls them as modules)
_CHECKED = ("backbone", "neck", "bbox_head", "rpn_head", "roi_head.bbox_head", "roi_head.mask_head")


class _FiniteOutputs:
    """Forward hooks on the detector's parts and a test-loop check of its predictions."""
    def __init__(self, detector: nn.Module) -> None:
        self.batch = 1
        self.handles = [module.register_forward_hook(self._hook(name))
                        for name, module in detector.named_modules() if name in _CHECKED]

    def _hook(self, name: str) -> Any:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            check_finite(output, f"mAP evaluation: the outputs of the detector's {name}", f"in batch {self.batch}")
        return hook

    def after_test_iter(self, outputs: Any) -> None:
        check_finite([getattr(o, "pred_instances", None) for o in outputs],
                     "mAP evaluation: the predicted boxes/scores", f"in batch {self.batch}")
        self.batch += 1

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


class _PredictionsHook(Hook):
    priority = "VERY_HIGH"

    def __init__(self, guard: _FiniteOutputs) -> None:
        self.guard = guard

    def after_test_iter(self, runner: Any, batch_idx: int, data_batch: Any = None, outputs: Any = None) -> None:
        self.guard.after_test_iter(outputs or [])


def coco_metric(data: DetData, *, masks: bool, work_dir: str | Path | None = None) -> Any:
    """mmdet's ``CocoMetric`` on ``data``'s validation annotations, collecting the ranks' results
    in ``work_dir/collect`` under a launcher (:func:`vitbench.host.distributed.collect_in`; instead of
    ``./.dist_test`` in the current folder)."""
    from mmdet.registry import METRICS
    from mmengine.registry import DefaultScope


    with DefaultScope.overwrite_default_scope("mmdet"), quiet_stdout():  # pycocotools reads the annotations
        metric = METRICS.build(data.metric_cfg(masks=masks))
    return distributed.collect_in(metric, None if work_dir is None else Path(work_dir))


def evaluate_detector(detector: nn.Module, data: DetData, *, masks: bool, batch_size: int = 8,
                      limit: Optional[int] = None, device: str = "cpu", seed: int = 0,
                      work_dir: str | Path | None = None, precision: str = "fp32") -> dict[str, Any]:
    """COCO mAP, AP50 and AP75 of boxes (and masks) on the validation split, plus ``num_images``.

    Non-finite outputs (naming the part and the batch) or metrics raise
    :class:`~vitbench.errors.NonFiniteError`. ``precision``: the forward's autocast
    (:mod:`vitbench.measure.precision`). Under a launcher every rank must call this with the
    same detector and ``work_dir`` (a collective: each rank scores its part of the images, every
    rank gets the metrics of all of them, each image counted once; an error on one rank is
    raised on every rank, naming that rank)."""
    from mmengine.runner import Runner


    distributed.raise_if_any_rank_failed(None)  # meets a rank that failed earlier in the run (the Runner broadcasts)
    guard = _FiniteOutputs(detector)
    with work_dir_or_temp(work_dir) as wd, progress.steps("evaluating mAP", unit="batches") as step:
        counted = TestProgressHook(step)
        runner = Runner(**runner_kwargs(
            work_dir=wd, seed=seed, default_scope="mmdet", model=detector,
            test_dataloader=_loader(data.dataset_cfg("val", masks=masks, limit=limit), batch_size, False),
            test_evaluator=[coco_metric(data, masks=masks, work_dir=None if work_dir is None else wd)],
            test_cfg={"type": "TestLoop"},
            custom_hooks=[_PredictionsHook(guard), counted],
        ))
        try:
            runner.model.to(torch.device(device))
            # backbone and neck in ``precision``; heads and NMS in fp32 (mmcv's NMS has no half kernel)
            with quiet_stdout(), autocast_method(runner.model, "extract_feat", precision, device, to_float=True):
                metrics = distributed.collective_test(runner)  # a rank's error is every rank's
            num_images = len(runner.test_dataloader.dataset)
            if not distributed.is_distributed() and counted.scored != num_images:  # a rank scores its shard only
                raise DataError(f"the evaluation scored {counted.scored} predictions for its {num_images} images: "
                                f"the model's forward changed the batch; no mAP is reported for it")
        finally:
            guard.remove()
            release(runner)
    out: dict[str, Any] = {key: float(metrics[src]) for key, src in _KEYS.items() if src in metrics}
    check_metrics(out, "mAP evaluation")
    out.update(num_images=int(num_images), num_classes=data.num_classes)
    return out


def first_val_images(detector: nn.Module, data: DetData, n: int) -> torch.Tensor:
    """The first ``n`` validation images as the detector's backbone sees them (normalised,
    resized, padded) -- what GMACs are counted on. Read from the data set directly, not through
    a ``DefaultSampler``: under a launcher that would hand each rank its shard (other images than
    one process counts on) and agree on a seed with the other ranks (a collective that rank 0,
    counting alone, would wait in forever)."""
    from mmdet.registry import DATASETS
    from mmengine.dataset import pseudo_collate
    from mmengine.registry import DefaultScope

    with DefaultScope.overwrite_default_scope("mmdet"), quiet_stdout():  # the pipeline names mmdet transforms
        dataset = DATASETS.build(data.dataset_cfg("val", masks=False, limit=n))
        batch = pseudo_collate([dataset[i] for i in range(min(n, len(dataset)))])
    return detector.data_preprocessor(batch, False)["inputs"][:n].float()
