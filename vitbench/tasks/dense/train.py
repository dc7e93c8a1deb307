"""Training for the dense tasks on the mmengine ``Runner`` (docs/measuring.md, "Accuracy and mAP").

:func:`train_detector` is the default training of the baseline detector (every weight, AdamW,
cosine), done once and cached; :func:`finetune_control` fine-tunes that detector exactly as a
learnable method's detector is, with no method (the ``baseline+ft`` control);
:func:`finetune_method` runs a method's stages on the detection loss with the detector weights
the dense fine-tuning protocol names (:mod:`vitbench.tasks.dense.protocol`). A method that needs
image labels gets the class of the image's largest object; on a plain ViT, each patch's class
(:func:`patch_labels`) is in the reduction context too. Under a launcher all three train
with DDP (:class:`~vitbench.train.stages.MethodDDP`, at least :data:`MIN_RANK_BATCH` images
per rank); afterwards every rank holds rank 0's buffers and is checked to hold the same weights
(docs/architecture.md, "Distributed runs")."""
from __future__ import annotations

import contextlib
import io
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Optional

import torch
from mmengine.model import BaseModel
from mmengine.optim import OptimWrapper
from torch import nn

from vitbench.host.distributed import same_on_every_rank
from vitbench.engine.block import reduction_context
from vitbench.errors import VitbenchError
from vitbench.tasks.dense.backbone import is_plain_vit
from vitbench.tasks.dense.data import DetData
from vitbench.tasks.dense.protocol import CONTROL, DenseFinetune, detector_parameters, stage_for
from vitbench.train.stages import FinetuneResult, StageSource, StageTrainer, run_stages, trainable_parameters
from vitbench.catalog import TrainStage
from vitbench.core.guards import train_position
from vitbench.host import distributed
from vitbench.mm.runner import release, runner_kwargs, work_dir_or_temp
from vitbench.train.batches import loader_cfg
from vitbench.train import stages

__all__ = ["MIN_RANK_BATCH", "ControlStages", "DetMethodTrainer", "DetStages", "DetectorTrainer", "dominant_labels",
           "finetune_control", "patch_labels", "finetune_method", "rank_share", "train_detector"]


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
        boxes = _box_tensor(gt)
        area = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
        out.append(int(gt.labels[int(area.argmax())]))
    return torch.tensor(out, dtype=torch.long, device=device)


def _box_tensor(gt: Any) -> torch.Tensor:
    """The ground-truth boxes ``[K, 4]`` (x1, y1, x2, y2) of an instance set, plain or mmdet-wrapped."""
    return gt.bboxes.tensor if hasattr(gt.bboxes, "tensor") else gt.bboxes


def patch_labels(data_samples: list[Any], grid: tuple[int, int], patch: int, background: int,
                 device: torch.device | str = "cpu") -> torch.Tensor:
    """``[B, gh * gw]``: the class of each patch of the ``grid`` (row-major, as the tokens), that of
    the smallest ground-truth box holding the patch's centre, ``background`` where none does."""
    gh, gw = grid
    ys, xs = torch.meshgrid((torch.arange(gh) + 0.5) * patch, (torch.arange(gw) + 0.5) * patch, indexing="ij")
    centres = torch.stack([xs.reshape(-1), ys.reshape(-1)], dim=1)  # [P, 2] as (x, y)
    out = torch.full((len(data_samples), gh * gw), background, dtype=torch.long)
    for i, sample in enumerate(data_samples):
        gt = sample.gt_instances
        if len(gt) == 0:
            continue
        boxes = _box_tensor(gt).detach().float().cpu()
        inside = ((centres[None, :, 0] >= boxes[:, None, 0]) & (centres[None, :, 0] < boxes[:, None, 2])
                  & (centres[None, :, 1] >= boxes[:, None, 1]) & (centres[None, :, 1] < boxes[:, None, 3]))
        area = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
        smallest = torch.where(inside, area[:, None], torch.inf).argmin(dim=0)  # [P]
        labels = gt.labels.detach().cpu().long()[smallest]
        out[i] = torch.where(inside.any(dim=0), labels, background)
    return out.to(device)


def quiet_stdout() -> contextlib.AbstractContextManager:
    """pycocotools prints "loading annotations into memory..." and its evaluation summary to
    stdout, which vitbench keeps for results: drop it (progress goes to stderr)."""
    return contextlib.redirect_stdout(io.StringIO())


def _loader(dataset: dict[str, Any], batch_size: int, shuffle: bool, *, local: bool = False) -> dict[str, Any]:
    """An mmengine dataloader config for a detection data set (no workers, mmdet's list
    collation). ``DefaultSampler`` by default (under a launcher: each rank its shard, and a seed
    agreed on by every rank when the Runner gives none -- a collective). ``local``: every index
    in order on every rank, with no collective (:class:`~vitbench.train.batches.LocalSampler`;
    no shuffle): for what one rank reads alone or every rank reads whole."""
    cfg = loader_cfg(dataset, batch_size, shuffle, local=local, workers=0)
    cfg["collate_fn"] = {"type": "pseudo_collate"}  # mmdet's detectors take lists of samples, not stacked tensors
    return cfg


#: the fewest images per step and rank (the SSDLite head's BatchNorm needs more than one)
MIN_RANK_BATCH = 2


def rank_share(batch_size: int, stage: str, progress: Optional[Callable[[str], None]] = None
               ) -> tuple[int, dict[str, int]]:
    """Each rank's batch of a detector fine-tuning stage and what the stage record says about it:
    ``batch_size`` and ``{}`` without a process group; under a launcher
    :func:`~vitbench.host.distributed.rank_batch_size` (at least :data:`MIN_RANK_BATCH`) and
    ``ranks``/``rank_batch_size``/``effective_batch_size`` (``progress`` is told when the
    effective batch differs from ``batch_size``)."""
    from mmengine.dist import get_world_size


    world = get_world_size()
    if world <= 1:
        return batch_size, {}
    per_rank = max(MIN_RANK_BATCH, distributed.rank_batch_size(batch_size, world))
    if progress and per_rank * world != batch_size:
        progress(f"stage {stage!r}: batch {batch_size} over {world} ranks: {per_rank} per rank, an effective "
                 f"batch of {per_rank * world}")
    return per_rank, {"ranks": world, "rank_batch_size": per_rank, "effective_batch_size": per_rank * world}


def _progress_hook(prefix: str, verbose: bool) -> dict[str, Any]:
    return {"type": "vitbench.ProgressHook", "verbose": verbose, "interval": 10, "prefix": prefix}


def train_detector(detector: nn.Module, data: DetData, *, masks: bool, epochs: int, batch_size: int = 8,
                   lr: float = DEFAULT_LR, limit: Optional[int] = None, device: str = "cpu", seed: int = 0,
                   work_dir: str | Path | None = None, verbose: bool = True,
                   progress: Optional[Callable[[str], None]] = None) -> dict[str, Any]:
    """Train every weight of ``detector`` for ``epochs`` epochs (the default training).

    Under a launcher (a process group of more than one rank; every rank calls this at the same
    point with the same detector) the ranks train it together with DDP, as the fine-tunings do:
    the Runner wraps :class:`DetectorTrainer` in :class:`~vitbench.train.stages.MethodDDP`,
    each rank trains on its ``DefaultSampler`` shard with :func:`rank_share`'s batch
    (``batch_size // world``, at least :data:`MIN_RANK_BATCH`), the loss guard is collective,
    and afterwards every rank holds rank 0's BatchNorm statistics (checked with
    :func:`~vitbench.host.distributed.same_on_every_rank`); the returned facts then say
    ``ranks``, ``rank_batch_size`` and ``effective_batch_size``. Without one: mmengine's own
    ``train_step`` on the detector, with :class:`~vitbench.train.stages.FiniteLossHook`."""
    from mmengine.runner import Runner


    if epochs < 1 or batch_size < 2:
        raise VitbenchError(f"detector training needs epochs >= 1 and batch size >= 2 (BatchNorm in the "
                            f"SSDLite head); got epochs={epochs}, batch size={batch_size}")
    start = time.perf_counter()
    target = torch.device(device)
    sharded = distributed.is_distributed()
    per_rank, ranks = rank_share(batch_size, DEFAULT_STAGE, progress)
    if sharded:  # every rank trains its shard; the losses go through DDP's forward
        distributed.raise_if_any_rank_failed(None)  # the agreement point before a Runner, as train_stage's
        model: nn.Module = DetectorTrainer(detector)
        hooks: list[Any] = [_progress_hook("vitbench: detector training: ", verbose and distributed.is_main()),
                            stages.PositionHook(model)]  # the loss guard is the trainer's (collective)
        extra = stages._distributed_runner(model, target)
    else:  # one process: exactly the training of vitbench before launchers trained detectors
        model = detector
        hooks = [_progress_hook("vitbench: detector training: ", verbose),
                 stages.FiniteLossHook(DETECTOR_TRAINING, DEFAULT_STAGE)]
        extra = {}
    with work_dir_or_temp(work_dir) as wd:
        with warnings.catch_warnings():  # a distributed Runner's note that it sets OMP/MKL_NUM_THREADS
            warnings.filterwarnings("ignore", message=r"Setting (OMP|MKL)_NUM_THREADS", category=UserWarning)
            runner = Runner(**runner_kwargs(
                work_dir=wd, seed=seed, default_scope="mmdet", model=model,
                train_dataloader=_loader(data.dataset_cfg("train", masks=masks, limit=limit), per_rank, True),
                train_cfg={"by_epoch": True, "max_epochs": epochs, "val_interval": epochs + 1},
                optim_wrapper={"optimizer": {"type": "AdamW", "lr": lr, "weight_decay": DEFAULT_WEIGHT_DECAY},
                               "clip_grad": {"max_norm": 10.0}},
                param_scheduler=[{"type": "CosineAnnealingLR", "by_epoch": True, "T_max": epochs,
                                  "convert_to_iter_based": True, "eta_min_ratio": 0.01}],
                custom_hooks=hooks, **extra,
            ))
        try:
            runner.model.to(target)
            with quiet_stdout():
                runner.train()
            images, iters = len(runner.train_dataloader.dataset), runner.iter
        finally:
            release(runner)
    if sharded:
        stages.broadcast_buffers(detector)  # rank 0's BatchNorm statistics on every rank
        same_on_every_rank(detector, "the detector's default training")
    detector.eval()
    return {"epochs": epochs, "iters": iters, "images": images, "batch_size": batch_size, "lr": lr, **ranks,
            "seconds": round(time.perf_counter() - start, 2)}


#: who and which stage a non-finite loss of the default training is reported as
DETECTOR_TRAINING = "detector training"
DEFAULT_STAGE = "default training"


class DetectorTrainer(BaseModel):
    """The model the Runner trains in the default training under a launcher (wrapped in
    :class:`~vitbench.train.stages.MethodDDP`): the detector's own step -- mmengine's
    ``BaseModel.train_step``, with the detector's optimiser wrapper (AdamW, gradient clipping) --
    with the losses computed through the wrapper's forward (so their backward averages the
    gradients over the ranks) and the collective loss guard
    (:func:`~vitbench.train.stages.check_losses_on_every_rank`) before the update, so that a
    non-finite loss stops every rank at the same step."""
    def __init__(self, detector: nn.Module) -> None:
        super().__init__(data_preprocessor=detector.data_preprocessor)
        self.detector = detector
        self.steps = 0
        self.position: Optional[tuple[int, int]] = None  # (epoch, iteration), set by PositionHook

    def init_weights(self) -> None:
        """The detector's initialisation, as the Runner gives a detector trained without a
        launcher (the Runner then broadcasts rank 0's weights)."""
        self.detector.init_weights()

    def forward(self, inputs: torch.Tensor, data_samples: Any = None, mode: str = "tensor") -> Any:
        return self.detector(inputs, data_samples, mode=mode)

    def train_step(self, data: Any, optim_wrapper: OptimWrapper,
                   forward: Optional[nn.Module] = None) -> dict[str, torch.Tensor]:
        """One step: the losses through ``forward`` (the DDP wrapper; ``None``: this trainer),
        the collective loss guard, the update."""
        run = self if forward is None else forward
        with optim_wrapper.optim_context(run):
            data = self.data_preprocessor(data, True)
            losses = run(data["inputs"], data["data_samples"], mode="loss")
        loss, log_vars = self.detector.parse_losses(losses)
        epoch, iteration = self.position or (None, self.steps + 1)
        stages.check_losses_on_every_rank({k: v for k, v in log_vars.items() if "loss" in k}, DETECTOR_TRAINING,
                                   train_position(DEFAULT_STAGE, epoch, iteration))
        optim_wrapper.update_params(loss)
        self.steps += 1
        return log_vars


class DetMethodTrainer(StageTrainer):
    """The model the Runner trains while a method fine-tunes inside a detector: the detection
    losses plus the method's ``extra_loss``; the step is the stage loop's
    (:class:`~vitbench.train.stages.StageTrainer`). A method that needs image labels gets the
    class of each image's largest object."""
    def __init__(self, detector: nn.Module, backbone: nn.Module, stage: Any, precision: str = "fp32") -> None:
        super().__init__(stage, detector.data_preprocessor, precision)
        self.detector = detector
        self.backbone = backbone  # the reduced timm model inside the detector

    @property
    def reduced(self) -> nn.Module:
        return self.backbone

    @property
    def trained(self) -> nn.Module:
        return self.detector

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

    def forward(self, inputs: torch.Tensor, data_samples: Any = None, mode: str = "tensor",
                labels: Optional[torch.Tensor] = None) -> Any:
        """The detector's forward in ``mode``; ``loss`` with ``labels`` (what :meth:`train_step`
        runs, through :class:`~vitbench.train.stages.MethodDDP`'s forward under a launcher):
        :meth:`losses`."""
        if mode == "loss" and labels is not None:
            return self.losses(inputs, data_samples, labels)
        return self.detector(inputs, data_samples, mode=mode)

    def losses(self, inputs: torch.Tensor, data_samples: Any, labels: torch.Tensor) -> dict[str, Any]:
        """The detector's raw loss terms of one batch plus, under ``extra``, the method's extra
        loss (``labels``, the images' dominant classes, are in the reduction context meanwhile).
        Both are computed here, inside the (DDP) forward: DDP finds the parameters a step used
        from the forward's outputs, and a loss computed after it would reach parameters it had
        already marked unused."""
        ctx = reduction_context(self.backbone)  # None: the control (no method)
        if ctx is not None:
            ctx.labels = labels
            ctx.patch_labels = self.patch_labels_of(data_samples, inputs.device)
        try:
            out = dict(self.detector.loss(inputs, data_samples))
            if "extra" in out:
                raise VitbenchError(f"{type(self.detector).__name__}'s losses have a term 'extra', the name "
                                    f"kept for the method's extra loss")
            if self.stage.extra_loss:
                extra = self.stage.extra_loss(self.backbone, None, labels)
                if extra is not None:
                    out["extra"] = extra
        finally:
            if ctx is not None:
                ctx.labels = ctx.patch_labels = None
        return out

    def patch_labels_of(self, data_samples: Any, device: torch.device) -> Optional[torch.Tensor]:
        """:func:`patch_labels` on a plain ViT backbone's patch grid (``None`` on a hybrid)."""
        model = self.backbone
        if not is_plain_vit(model):
            return None
        return patch_labels(data_samples, tuple(model.patch_embed.grid_size), int(model.patch_embed.patch_size[0]),
                            int(model.num_classes), device)

    def split(self, data: dict[str, Any]) -> tuple[torch.Tensor, Any, torch.Tensor]:
        inputs, samples = data["inputs"], data["data_samples"]
        return inputs, samples, dominant_labels(samples, inputs.device)

    def losses_of(self, run: nn.Module, inputs: torch.Tensor, samples: Any, labels: torch.Tensor
                  ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        raw = run(inputs, samples, mode="loss", labels=labels)
        extra = raw.pop("extra", None)
        loss, log_vars = self.detector.parse_losses(raw)
        if extra is not None:
            loss = loss + extra
            log_vars["extra"] = extra.detach()
        log_vars["loss"] = loss.detach()
        return loss, log_vars

    def guarded_terms(self, terms: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Each detection loss term and the method's extra (not logged extras such as Mask R-CNN's acc)."""
        return {k: v for k, v in terms.items() if "loss" in k or k == "extra"}


def _image_batches(detector: nn.Module, data: DetData, masks: bool, limit: Optional[int],
                   device: torch.device) -> Callable[[], Iterator[tuple[torch.Tensor, torch.Tensor]]]:
    """``batches()`` for the stages' callbacks: the training split as (normalised images as the
    backbone sees them, the dominant label of each image), in order -- all of it on every rank
    under a launcher (``LocalSampler``: the callbacks' statistics are then the same on every
    rank, and reading involves no collective, as a ``DefaultSampler``'s seed would)."""
    from mmengine.registry import DefaultScope
    from mmengine.runner import Runner

    def batches() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        with DefaultScope.overwrite_default_scope("mmdet"), quiet_stdout():  # the pipeline names mmdet transforms
            loader = Runner.build_dataloader(_loader(data.dataset_cfg("train", masks=masks, limit=limit), 8, False,
                                                     local=True))
        for batch in loader:
            out = detector.data_preprocessor(batch, False)
            yield out["inputs"].to(device), dominant_labels(out["data_samples"], device)

    return batches


class DetStages(StageSource):
    """The dense tasks' part of the stage loop: the method's parameters plus the detector weights
    of the dense fine-tuning protocol, each stage as the protocol runs it
    (:func:`~vitbench.tasks.dense.protocol.stage_for`), :class:`DetMethodTrainer`, the training
    split at each rank's share of the stage's batch (at most 8 images)."""
    scope = "mmdet"
    interval = 10

    def __init__(self, method: str, detector: nn.Module, backbone: nn.Module, data: DetData, *, masks: bool,
                 settings: DenseFinetune, limit: Optional[int], precision: str,
                 batches: Optional[Callable[[], Iterator[tuple[torch.Tensor, torch.Tensor]]]]) -> None:
        super().__init__(method, detector, backbone, batches)
        self.data, self.masks, self.settings, self.limit, self.precision = data, masks, settings, limit, precision

    def prepare(self, stage: Any, last: bool) -> Any:
        return stage_for(stage, self.settings, last)

    def parameters(self, stage: Any) -> dict[str, nn.Parameter]:
        """The protocol's detector weights, then the stage's parameters that are not among them: the
        backbone of a stage with ``backbone`` (Cropr's, ALGM's) trains as a detector weight under
        ``all``, at the control's rate, so that the control differs from the row by the method alone."""
        detector = detector_parameters(self.module, self.settings.protocol)
        taken = {id(p) for p in detector.values()}
        own = trainable_parameters(self.reduced, stage, False)
        return {**{name: p for name, p in own.items() if id(p) not in taken}, **detector}

    def trainer(self, stage: Any) -> DetMethodTrainer:
        return DetMethodTrainer(self.module, self.reduced, stage, precision=self.precision)

    def loader(self, stage: Any, progress: Optional[Callable[[str], None]]) -> tuple[dict[str, Any], dict[str, int]]:
        per_rank, ranks = rank_share(max(2, min(stage.batch_size, CONTROL_BATCH)), stage.name, progress)
        return _loader(self.data.dataset_cfg("train", masks=self.masks, limit=self.limit), per_rank, True), ranks

    def announce(self, stage: Any, trainable: int) -> str:
        return (f"fine-tuning stage {stage.name!r} on the detection loss: {stage.epochs} epoch(s), "
                f"{trainable:,} trainable parameters (dense fine-tuning protocol {self.settings.protocol!r})")


class ControlStages(DetStages):
    """The control's one stage (:func:`control_stage`, already as the protocol runs it): the
    detector weights alone, no method."""
    def prepare(self, stage: Any, last: bool) -> Any:
        return stage

    def announce(self, stage: Any, trainable: int) -> str:
        return (f"fine-tuning the baseline detector without a method (the control): {stage.epochs} epoch(s), "
                f"{trainable:,} trainable parameters (dense fine-tuning protocol {self.settings.protocol!r})")


def _record(result: FinetuneResult, settings: DenseFinetune) -> dict[str, Any]:
    """A dense run record's training fields from what the stage loop did."""
    return {"trained": "fine-tuned", "train_s": result.seconds, "trainable_params": result.trainable_params,
            "train_stages": result.stages, "dense_finetune": settings.record(), "train_images": result.train_images}


def finetune_method(detector: nn.Module, backbone: nn.Module, data: DetData, *, masks: bool,
                    settings: Optional[DenseFinetune] = None, limit: Optional[int] = None, device: str = "cpu",
                    seed: int = 0, work_dir: str | Path | None = None, verbose: bool = False,
                    progress: Optional[Callable[[str], None]] = None, precision: str = "fp32") -> dict[str, Any]:
    """Run the training stages of the method ``backbone`` was reduced with, inside ``detector``
    (the forwards under ``precision``'s autocast), on the stage loop
    (:func:`vitbench.train.stages.run_stages`).

    Trained: the method's parameters plus the detector weights of the dense fine-tuning
    protocol ``settings`` (:mod:`vitbench.tasks.dense.protocol`; ``None``: ``method``, the
    method's parameters alone -- the CLI's default is ``all``). Returns the record's training
    fields, ``dense_finetune`` among them.
    """
    ctx = reduction_context(backbone)
    if ctx is None or ctx.reduction is None:
        raise VitbenchError("finetune_method() needs a backbone reduced with vitbench.apply(model, method)")
    target = torch.device(device)
    settings = settings or DenseFinetune("method")
    source = DetStages(ctx.method, detector, backbone, data, masks=masks, settings=settings, limit=limit,
                       precision=precision, batches=_image_batches(detector, data, masks, limit, target))
    result = run_stages(list(ctx.reduction.train), source, device=target, seed=seed, work_dir=work_dir,
                        verbose=verbose, progress=progress)
    return _record(result, settings)


def control_stage(settings: DenseFinetune) -> Any:
    """The one training stage of the control: the detector-weight half of a learnable method's
    last dense stage (:func:`~vitbench.tasks.dense.protocol.stage_for`) -- AdamW without weight
    decay, cosine to 1 %, ``settings.epochs`` epochs, detector weights at ``settings.detector_lr``,
    batch 8 (what the methods' stages of batch >= 8 run at, :class:`DetStages`)."""
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
    (:func:`~vitbench.tasks.dense.protocol.detector_parameters`), epochs, learning rate and
    schedule, BatchNorm handling, stage loop -- with no method. Returns the record fields
    :func:`finetune_method` returns."""
    if not settings.trains_detector or settings.epochs < 1:
        raise VitbenchError(f"the {CONTROL} control fine-tunes detector weights: it needs the dense "
                            f"fine-tuning protocol all or heads and epochs >= 1; got protocol "
                            f"{settings.protocol!r}, epochs {settings.epochs}")
    source = ControlStages(CONTROL, detector, detector.backbone, data, masks=masks, settings=settings, limit=limit,
                           precision=precision, batches=None)
    result = run_stages([control_stage(settings)], source, device=torch.device(device), seed=seed,
                        work_dir=work_dir, verbose=verbose, progress=progress)
    return _record(result, settings)
