"""Fine-tuning a reduced classifier: the cls task's trainer and stage source for the one stage loop
(:mod:`vitbench.train.stages`, which det and seg use too; docs/architecture.md, "The fine-tuning loop").

The step's loss is cross-entropy (with the stage's label smoothing) plus the method's
``extra_loss``; the data is the training split, the first ``limit`` images, no augmentation."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import nn

from vitbench.catalog import TrainStage
from vitbench.engine.block import ReductionContext, reduction_context
from vitbench.errors import VitbenchError
from vitbench.train.batches import Batches
from vitbench.train.stages import FinetuneResult, StageSource, StageTrainer, run_stages, trainable_parameters
from vitbench.host import distributed
from vitbench.train import stages
from vitbench.train.batches import cls_batches, data_preprocessor, loader_cfg

__all__ = ["ClsStages", "FinetuneResult", "MethodTrainer", "finetune", "trainable_parameters"]


class MethodTrainer(StageTrainer):
    """The model the Runner trains on cls: normalisation, the reduced timm model, CE + method loss."""
    def __init__(self, model: nn.Module, stage: TrainStage, data_preprocessor: nn.Module,
                 precision: str = "fp32") -> None:
        super().__init__(stage, data_preprocessor, precision)
        self.model = model

    @property
    def reduced(self) -> nn.Module:
        return self.model

    @property
    def context(self) -> ReductionContext:
        ctx = reduction_context(self.model)
        assert ctx is not None
        return ctx

    def forward(self, inputs: torch.Tensor, data_samples: Any = None, mode: str = "tensor",
                labels: Optional[torch.Tensor] = None) -> Any:
        """``tensor``: the logits; ``loss``: :meth:`losses` of ``labels`` (what
        :meth:`train_step` runs, through the DDP wrapper's forward under a launcher)."""
        if mode == "loss" and labels is not None:
            return self.losses(inputs, labels)
        if mode != "tensor":
            raise NotImplementedError(f"MethodTrainer runs mode 'tensor' or 'loss' with labels (from train_step); "
                                      f"got mode {mode!r}")
        return self.model(inputs)

    def losses(self, inputs: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        """CE (with the stage's label smoothing) and the method's extra loss for one batch."""
        ctx = self.context
        ctx.labels = labels
        try:
            logits = self.model(inputs)
            ce = F.cross_entropy(logits, labels, label_smoothing=self.stage.label_smoothing)
            extra = self.stage.extra_loss(self.model, logits, labels) if self.stage.extra_loss else None
        finally:
            ctx.labels = None
        out = {"ce": ce}
        if extra is not None:
            out["extra"] = extra
        out["loss"] = ce + extra if extra is not None else ce
        return out

    def split(self, data: dict[str, Any]) -> tuple[torch.Tensor, Any, torch.Tensor]:
        inputs = data["inputs"]
        return inputs, data["data_samples"], torch.cat([s.gt_label for s in data["data_samples"]]).to(inputs.device)

    def losses_of(self, run: nn.Module, inputs: torch.Tensor, samples: Any, labels: torch.Tensor
                  ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        losses = run(inputs, mode="loss", labels=labels)
        return losses["loss"], losses


class ClsStages(StageSource):
    """The cls task's part of the stage loop: the method's parameters (and the backbone's with
    ``train_backbone``), :class:`MethodTrainer`, the training split in each rank's batch."""
    def __init__(self, model: nn.Module, dataset: dict[str, Any], preprocessor: nn.Module, batches: Batches, *,
                 train_backbone: bool, precision: str, workers: Optional[int], device: torch.device) -> None:
        ctx = reduction_context(model)
        assert ctx is not None
        super().__init__(ctx.method, model, model, batches)
        self.dataset, self.preprocessor = dataset, preprocessor
        self.train_backbone, self.precision, self.workers, self.device = train_backbone, precision, workers, device

    def parameters(self, stage: TrainStage) -> dict[str, nn.Parameter]:
        return trainable_parameters(self.module, stage, self.train_backbone)

    def trainer(self, stage: TrainStage) -> MethodTrainer:
        return MethodTrainer(self.module, stage, self.preprocessor, precision=self.precision)

    def loader(self, stage: TrainStage, progress: Optional[Callable[[str], None]]
               ) -> tuple[dict[str, Any], dict[str, int]]:
        from mmengine.dist import get_world_size


        world = get_world_size()
        per_rank = distributed.rank_batch_size(stage.batch_size, world)
        if progress and per_rank * world != stage.batch_size:
            progress(f"stage {stage.name!r}: batch {stage.batch_size} does not divide over {world} ranks: "
                     f"{per_rank} per rank, an effective batch of {per_rank * world}")
        ranks = {"ranks": world, "rank_batch_size": per_rank, "effective_batch_size": per_rank * world} \
            if world > 1 else {}
        return loader_cfg(self.dataset, per_rank, True, workers=self.workers, device=self.device,
                          persistent=True), ranks

    def announce(self, stage: TrainStage, trainable: int) -> str:
        return (super().announce(stage, trainable)
                + (" (backbone included)" if self.train_backbone or stage.backbone else " (backbone frozen)"))


def finetune(model: nn.Module, data: Any, *, train_backbone: bool = False, limit: Optional[int] = None,
             device: str = "cpu", seed: int = 0, work_dir: str | Path | None = None,
             verbose: bool = False, progress: Optional[Callable[[str], None]] = None,
             precision: str = "fp32", workers: Optional[int] = None) -> FinetuneResult:
    """Run the training stages of the method ``model`` was reduced with, in place.

    ``data``: a :class:`~vitbench.tasks.cls.data.ClsData`; training uses its training split,
    the first ``limit`` images when given. ``precision``: ``bf16`` runs the training forwards
    under bf16 autocast; ``fp32`` as they are (:func:`vitbench.measure.precision.trains_in`
    says which a run's precision trains in). Returns what was done; ``model`` is left in eval
    mode with ``requires_grad`` as it was. ``workers``: loader worker processes (``--workers``;
    None: :func:`vitbench.data.workers.workers_for`'s default).
    """

    ctx = reduction_context(model)
    if ctx is None or ctx.reduction is None:
        raise VitbenchError("finetune() needs a model reduced with vitbench.apply(model, method)")
    stages = list(ctx.reduction.train)
    if not stages:
        return FinetuneResult()
    target = torch.device(device)
    dataset = data.train_cfg(limit=limit)
    preprocessor = data_preprocessor(model, data.bgr)
    batches = cls_batches(dataset, preprocessor, device=target, seed=seed, workers=workers)
    source = ClsStages(model, dataset, preprocessor, batches, train_backbone=train_backbone, precision=precision,
                       workers=workers, device=target)
    return run_stages(stages, source, device=target, seed=seed, work_dir=work_dir, verbose=verbose,
                      progress=progress)


#: the loop's helpers that lived in this module (then ``vitbench.train.finetune``) before the one stage loop
_MOVED = ("DDP_WRAPPER", "FiniteLossHook", "MethodDDP", "PositionHook", "StageHook", "broadcast_buffers",
          "check_losses_on_every_rank", "guarded_update", "is_arch_step", "step_wrapper", "train_stage")


def __getattr__(name: str) -> Any:
    """A moved helper, from :mod:`vitbench.train.stages`, with a deprecation warning."""
    if name in _MOVED:
        import warnings


        warnings.warn(f"vitbench.train.finetune.{name} moved to vitbench.train.stages.{name}",
                      DeprecationWarning, stacklevel=2)
        return getattr(stages, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
