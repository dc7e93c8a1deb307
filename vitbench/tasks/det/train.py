"""Training for the dense tasks on the mmengine ``Runner`` (issue 4).

- :func:`train_detector`: the *default training* -- the whole detector (backbone, neck, heads)
  trains on the training split with AdamW and a cosine schedule. This is the baseline every
  method is applied to, as the fine-tuned classifier is in ``cls``: vitbench trains it once per
  (task, model, data, schedule) and caches the weights.
- :func:`finetune_control`: the *control* -- the baseline detector fine-tuned with the detector
  weights, epochs, learning rate, optimiser and batch size a learnable method's detector gets
  under the same protocol, with no method: what a fine-tuned method's mAP is compared with, so
  that the extra detector training is not credited to the method.
- :func:`finetune_method`: a learnable method's stages (:class:`~vitbench.catalog.TrainStage`)
  on the detection loss instead of cross-entropy. The same rules as the cls loop
  (:mod:`vitbench.train.finetune`) -- arch/weight alternation, the stage's callbacks -- with
  the detector weights the dense fine-tuning protocol names (:mod:`vitbench.tasks.det.protocol`:
  ``all``, ``heads`` or ``method``) training beside the method's parameters. What a method that needs
  image labels (LTM's IB step, DCS's IB bound) gets as the label of a detection image: the
  class of its largest object (a documented choice: the IB terms are defined for image
  classes, docs/methods.md §6, and the largest object is what the image is "of").
"""
from __future__ import annotations

import contextlib
import io
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Optional

import torch
from mmengine.model import BaseModel
from mmengine.optim import OptimWrapper
from torch import nn

from vitbench.engine.block import reduction_context
from vitbench.errors import VitbenchError
from vitbench.measure.precision import autocast
from vitbench.tasks.det.data import DetData
from vitbench.tasks.det.protocol import CONTROL, DenseFinetune, detector_parameters, stage_for

__all__ = ["DetMethodTrainer", "dominant_labels", "finetune_control", "finetune_method", "train_detector"]


#: the default training: AdamW, cosine to 1% of the rate, per iteration
DEFAULT_LR = 2e-3
DEFAULT_WEIGHT_DECAY = 0.05


def dominant_labels(data_samples: list[Any], device: torch.device | str = "cpu") -> torch.Tensor:
    """The class of the largest ground-truth box of each image (``0`` for an image without any)."""
    out = []
    for sample in data_samples:
        gt = sample.gt_instances
        if len(gt) == 0:
            out.append(0)
            continue
        boxes = gt.bboxes.tensor if hasattr(gt.bboxes, "tensor") else gt.bboxes
        area = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
        out.append(int(gt.labels[int(area.argmax())]))
    return torch.tensor(out, dtype=torch.long, device=device)


def quiet_stdout() -> contextlib.AbstractContextManager:
    """pycocotools prints "loading annotations into memory..." and its evaluation summary to
    stdout, which vitbench keeps for results: drop it (progress goes to stderr)."""
    return contextlib.redirect_stdout(io.StringIO())


def _loader(dataset: dict[str, Any], batch_size: int, shuffle: bool) -> dict[str, Any]:
    return {"batch_size": batch_size, "num_workers": 0, "persistent_workers": False,
            "sampler": {"type": "DefaultSampler", "shuffle": shuffle}, "dataset": dataset,
            # mmdet's detectors take lists of samples, not stacked tensors
            "collate_fn": {"type": "pseudo_collate"}}


def _progress_hook(prefix: str, verbose: bool) -> dict[str, Any]:
    return {"type": "vitbench.ProgressHook", "verbose": verbose, "interval": 10, "prefix": prefix}


def train_detector(detector: nn.Module, data: DetData, *, masks: bool, epochs: int, batch_size: int = 8,
                   lr: float = DEFAULT_LR, limit: Optional[int] = None, device: str = "cpu", seed: int = 0,
                   work_dir: str | Path | None = None, verbose: bool = True) -> dict[str, Any]:
    """Train every weight of ``detector`` for ``epochs`` epochs (the default training)."""
    from mmengine.runner import Runner

    from vitbench.mm.runner import release, runner_kwargs, work_dir_or_temp
    from vitbench.train.finetune import FiniteLossHook

    if epochs < 1 or batch_size < 2:
        raise VitbenchError(f"detector training needs epochs >= 1 and batch size >= 2 (BatchNorm in the "
                            f"SSDLite head); got epochs={epochs}, batch size={batch_size}")
    start = time.perf_counter()
    with work_dir_or_temp(work_dir) as wd:
        runner = Runner(**runner_kwargs(
            work_dir=wd, seed=seed, default_scope="mmdet", model=detector,
            train_dataloader=_loader(data.dataset_cfg("train", masks=masks, limit=limit), batch_size, True),
            train_cfg={"by_epoch": True, "max_epochs": epochs, "val_interval": epochs + 1},
            optim_wrapper={"optimizer": {"type": "AdamW", "lr": lr, "weight_decay": DEFAULT_WEIGHT_DECAY},
                           "clip_grad": {"max_norm": 10.0}},
            param_scheduler=[{"type": "CosineAnnealingLR", "by_epoch": True, "T_max": epochs,
                              "convert_to_iter_based": True, "eta_min_ratio": 0.01}],
            custom_hooks=[_progress_hook("vitbench: detector training: ", verbose),
                          FiniteLossHook("detector training", "default training")],
        ))
        try:
            runner.model.to(torch.device(device))
            with quiet_stdout():
                runner.train()
            images, iters = len(runner.train_dataloader.dataset), runner.iter
        finally:
            release(runner)
    detector.eval()
    return {"epochs": epochs, "iters": iters, "images": images, "batch_size": batch_size, "lr": lr,
            "seconds": round(time.perf_counter() - start, 2)}


class DetMethodTrainer(BaseModel):
    """The model the Runner trains while a method fine-tunes inside a detector: the detection
    losses plus the method's ``extra_loss``, with the arch/weight alternation of the cls loop."""

    def __init__(self, detector: nn.Module, backbone: nn.Module, stage: Any, precision: str = "fp32") -> None:
        super().__init__(data_preprocessor=detector.data_preprocessor)
        self.precision = precision  # the forward's autocast (vitbench.measure.precision)
        self.detector = detector
        self.backbone = backbone  # the reduced timm model inside the detector
        self.stage = stage
        self.steps = 0
        self.last: dict[str, float] = {}

    def init_weights(self) -> None:
        """Keep every weight (the detector is trained already)."""

    def train(self, mode: bool = True) -> "DetMethodTrainer":
        """Train mode, except for normalisation layers with nothing to train: a frozen
        backbone stays frozen, its BatchNorm running statistics included."""
        super().train(mode)
        if mode:
            for module in self.detector.modules():
                if isinstance(module, nn.modules.batchnorm._BatchNorm) and not any(
                        p.requires_grad for p in module.parameters(recurse=False)):
                    module.eval()
        return self

    def forward(self, inputs: torch.Tensor, data_samples: Any = None, mode: str = "tensor") -> Any:
        return self.detector(inputs, data_samples, mode=mode)

    def train_step(self, data: Any, optim_wrapper: OptimWrapper) -> dict[str, torch.Tensor]:
        from vitbench.guards import check_losses
        from vitbench.train.finetune import guarded_update, step_wrapper, trainer_position

        data = self.data_preprocessor(data, True)
        inputs, samples = data["inputs"], data["data_samples"]
        labels = dominant_labels(samples, inputs.device)
        wrapper = step_wrapper(optim_wrapper, self.stage, self.steps)
        ctx = reduction_context(self.backbone)  # None: the control (no method)
        if ctx is not None:
            ctx.labels = labels
        try:
            with wrapper.optim_context(self), autocast(self.precision, inputs.device):
                loss, log_vars = self.detector.parse_losses(self.detector.loss(inputs, samples))
                extra = self.stage.extra_loss(self.backbone, None, labels) if self.stage.extra_loss else None
        finally:
            if ctx is not None:
                ctx.labels = None
        if extra is not None:
            loss = loss + extra
            log_vars["extra"] = extra.detach()
        log_vars["loss"] = loss.detach()
        who, where = ctx.method if ctx is not None else CONTROL, trainer_position(self, self.stage)
        # each detection loss term and the method's extra (not logged extras such as Mask R-CNN's acc)
        check_losses({k: v for k, v in log_vars.items() if "loss" in k or k == "extra"}, who, where)
        optim_wrapper.zero_grad()
        guarded_update(wrapper, loss, self.detector, who, where)
        self.steps += 1
        for callback in self.stage.after_step:
            callback(self.backbone)
        self.last = {k: float(v.detach()) if isinstance(v, torch.Tensor) else float(v) for k, v in log_vars.items()}
        return log_vars


def _image_batches(detector: nn.Module, data: DetData, masks: bool, limit: Optional[int],
                   device: torch.device) -> Callable[[], Iterator[tuple[torch.Tensor, torch.Tensor]]]:
    """``batches()`` for the stages' callbacks: the training split as (normalised images as the
    backbone sees them, the dominant label of each image), in order."""
    from mmengine.registry import DefaultScope
    from mmengine.runner import Runner

    def batches() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        with DefaultScope.overwrite_default_scope("mmdet"), quiet_stdout():  # the pipeline names mmdet transforms
            loader = Runner.build_dataloader(_loader(data.dataset_cfg("train", masks=masks, limit=limit), 8, False))
        for batch in loader:
            out = detector.data_preprocessor(batch, False)
            yield out["inputs"].to(device), dominant_labels(out["data_samples"], device)

    return batches


def finetune_method(detector: nn.Module, backbone: nn.Module, data: DetData, *, masks: bool,
                    settings: Optional[DenseFinetune] = None, limit: Optional[int] = None, device: str = "cpu",
                    seed: int = 0, work_dir: str | Path | None = None, verbose: bool = False,
                    progress: Optional[Callable[[str], None]] = None, precision: str = "fp32") -> dict[str, Any]:
    """Run the training stages of the method ``backbone`` was reduced with, inside ``detector``
    (the forwards under ``precision``'s autocast, :func:`vitbench.train.finetune.finetune`).

    Trained: the method's parameters plus the detector weights of the dense fine-tuning
    protocol ``settings`` (:mod:`vitbench.tasks.det.protocol`; ``None``: ``method``, the
    method's parameters alone -- the CLI's default is ``all``). Returns what was done, as
    :func:`vitbench.train.finetune.finetune` does for cls, plus ``dense_finetune``.
    """
    from vitbench.mm.runner import work_dir_or_temp
    from vitbench.train.finetune import (
        StageHook,
        _check_stage,
        train_stage,
        trainable_parameters,
    )

    ctx = reduction_context(backbone)
    if ctx is None or ctx.reduction is None:
        raise VitbenchError("finetune_method() needs a backbone reduced with vitbench.apply(model, method)")
    target = torch.device(device)
    batches = _image_batches(detector, data, masks, limit, target)
    saved = {n: p.requires_grad for n, p in detector.named_parameters()}
    stages_done: list[dict[str, Any]] = []
    start = time.perf_counter()
    trainable = 0
    settings = settings or DenseFinetune("method")
    stages = list(ctx.reduction.train)
    last = max((i for i, s in enumerate(stages) if s.epochs > 0), default=-1)
    try:
        for i, stage in enumerate(stages):
            _check_stage(ctx.method, stage)
            stage = stage_for(stage, settings, last=i == last)
            params = trainable_parameters(backbone, stage, False)
            params.update(detector_parameters(detector, settings.protocol))
            if not params:
                raise VitbenchError(f"{ctx.method}: training stage {stage.name!r} has no trainable parameters")
            chosen = {id(p) for p in params.values()}
            for p in detector.parameters():
                p.requires_grad_(id(p) in chosen)
            trainable = max(trainable, sum(p.numel() for p in params.values()))
            if progress:
                progress(f"fine-tuning stage {stage.name!r} on the detection loss: {stage.epochs} epoch(s), "
                         f"{sum(p.numel() for p in params.values()):,} trainable parameters "
                         f"(dense fine-tuning protocol {settings.protocol!r})")
            hook = StageHook(stage, backbone, batches)
            stage_start = time.perf_counter()
            if stage.epochs == 0:
                hook.before_train(None)
                hook.after_train(None)
                stages_done.append({"name": stage.name, "epochs": 0, "iters": 0})
                continue
            trainer = DetMethodTrainer(detector, backbone, stage, precision=precision).to(target)
            loader = _loader(data.dataset_cfg("train", masks=masks, limit=limit), max(2, min(stage.batch_size, 8)), True)
            with work_dir_or_temp(work_dir) as wd:
                iters, images = train_stage(
                    trainer, stage, params, loader,
                    [hook, _progress_hook(f"vitbench: {ctx.method} {stage.name}: ", verbose)],
                    work_dir=wd / stage.name, seed=seed, device=target, default_scope="mmdet")
            stages_done.append({"name": stage.name, "epochs": stage.epochs, "iters": iters, "images": images,
                                **{f"last_{k}": v for k, v in trainer.last.items()},
                                "seconds": round(time.perf_counter() - stage_start, 2)})
    finally:
        for n, p in detector.named_parameters():
            p.requires_grad_(saved.get(n, True))
        ctx.labels = None
    detector.eval()
    return {"trained": "fine-tuned", "train_s": round(time.perf_counter() - start, 2),
            "trainable_params": trainable, "train_stages": stages_done, "dense_finetune": settings.record(),
            "train_images": max((s.get("images", 0) for s in stages_done), default=0)}


def control_stage(settings: DenseFinetune) -> Any:
    """The one training stage of the control: the detector-weight half of a learnable method's
    last dense stage (:func:`~vitbench.tasks.det.protocol.stage_for`) -- AdamW without weight
    decay, cosine to 1 %, ``settings.epochs`` epochs, detector weights at ``settings.detector_lr``,
    batch 8 (what the methods' stages of batch >= 8 run at, :func:`finetune_method`)."""
    from vitbench.catalog import TrainStage

    base = TrainStage(name="control", epochs=settings.epochs, optimizer="AdamW", lr=settings.detector_lr,
                      batch_size=CONTROL_BATCH)
    return stage_for(base, settings, last=True)


#: the batch the methods' dense stages run at (their batch_size, 64 by default, capped at 8)
CONTROL_BATCH = 8


def finetune_control(detector: nn.Module, data: DetData, *, masks: bool, settings: DenseFinetune,
                     limit: Optional[int] = None, device: str = "cpu", seed: int = 0,
                     work_dir: str | Path | None = None, verbose: bool = False,
                     progress: Optional[Callable[[str], None]] = None, precision: str = "fp32") -> dict[str, Any]:
    """Fine-tune the unreduced ``detector`` as :func:`finetune_method` fine-tunes a learnable
    method's detector under ``settings`` -- the same detector weights
    (:func:`~vitbench.tasks.det.protocol.detector_parameters`), epochs, learning rate and
    schedule, BatchNorm handling -- with no method. Returns the record fields
    :func:`finetune_method` returns."""
    from vitbench.mm.runner import work_dir_or_temp
    from vitbench.train.finetune import train_stage

    if not settings.trains_detector or settings.epochs < 1:
        raise VitbenchError(f"the {CONTROL} control fine-tunes detector weights: it needs the dense "
                            f"fine-tuning protocol all or heads and epochs >= 1; got protocol "
                            f"{settings.protocol!r}, epochs {settings.epochs}")
    target = torch.device(device)
    stage = control_stage(settings)
    params = detector_parameters(detector, settings.protocol)
    saved = {n: p.requires_grad for n, p in detector.named_parameters()}
    chosen = {id(p) for p in params.values()}
    start = time.perf_counter()
    if progress:
        progress(f"fine-tuning the baseline detector without a method (the control): {stage.epochs} epoch(s), "
                 f"{sum(p.numel() for p in params.values()):,} trainable parameters "
                 f"(dense fine-tuning protocol {settings.protocol!r})")
    try:
        for p in detector.parameters():
            p.requires_grad_(id(p) in chosen)
        trainer = DetMethodTrainer(detector, detector.backbone, stage, precision=precision).to(target)
        loader = _loader(data.dataset_cfg("train", masks=masks, limit=limit), CONTROL_BATCH, True)
        with work_dir_or_temp(work_dir) as wd:
            iters, images = train_stage(trainer, stage, params, loader,
                                        [_progress_hook(f"vitbench: {CONTROL}: ", verbose)],
                                        work_dir=wd / stage.name, seed=seed, device=target, default_scope="mmdet")
    finally:
        for n, p in detector.named_parameters():
            p.requires_grad_(saved.get(n, True))
    detector.eval()
    seconds = round(time.perf_counter() - start, 2)
    done = {"name": stage.name, "epochs": stage.epochs, "iters": iters, "images": images,
            **{f"last_{k}": v for k, v in trainer.last.items()}, "seconds": seconds}
    return {"trained": "fine-tuned", "train_s": seconds, "trainable_params": sum(p.numel() for p in params.values()),
            "train_stages": [done], "dense_finetune": settings.record(), "train_images": images}
