"""One fine-tuning loop for every learnable method, on the mmengine ``Runner`` (issue 3).

Each :class:`~vitbench.catalog.TrainStage` a method declares is one ``Runner.train()``:

- **what trains**: the method's parameters (those of its ``nn.Module`` reducers, keys
  ``blocks.i.reducer.*``), filtered by ``stage.trainable``; every backbone weight is frozen
  (the papers' fine-tuning setup) unless ``train_backbone`` (the train-from-scratch setup, where
  the backbone trains at the stage's learning rate);
- **the step** (:class:`MethodTrainer.train_step`): the batch's labels go to the reduction
  context (LTM's IB step needs them), CE with the stage's label smoothing plus the method's
  ``extra_loss``; with ``arch_keys`` the step alternates between the architecture parameters
  (a share ``arch_fraction`` of the steps) and the others, each with its own optimiser (DCS);
  then the ``after_step`` callbacks;
- **the schedule**: mmengine's ``CosineAnnealingLR`` per iteration (or constant);
- **guards**: every step checks its loss terms and gradients (:func:`guarded_update`), and the
  finished model its weights, so a diverging run stops at once with a
  :class:`~vitbench.errors.NonFiniteError` naming the method, stage, epoch, iteration and the
  term or parameter (issue 9: a NaN fine-tuning once became a silent 0.00 % row);
- **callbacks** (:class:`StageHook`): ``before`` once, ``epoch_end`` after every epoch and
  ``after`` when the stage ends, each given ``batches()``, an iterator over the training data
  (normalised images, labels) run in eval mode without gradients.

Data: the training split of the evaluation data (:meth:`ClsData.train_cfg`), the first
``limit`` images when given, no augmentation (a choice: brief fine-tuning of a few method
parameters; noted in the README).
"""
from __future__ import annotations

import contextlib
import io
import math
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch
import torch.nn.functional as F
from mmengine.hooks import Hook
from mmengine.model import BaseModel
from mmengine.optim import OptimWrapper, OptimWrapperDict
from torch import nn

from vitbench.catalog import TrainStage
from vitbench.engine.block import ReductionContext, reduction_context
from vitbench.errors import ParamError, VitbenchError
from vitbench.guards import check_finite, check_gradients, check_losses, train_position
from vitbench.measure.precision import autocast

__all__ = ["FiniteLossHook", "FinetuneResult", "MethodTrainer", "PositionHook", "StageHook", "finetune", "guarded_update",
           "step_wrapper", "train_stage", "trainable_parameters"]

OPTIMIZERS = ("SGD", "AdamW", "Adam")
SCHEDULES = ("cosine", "constant")
from vitbench.tasks.cls.batches import Batches


@dataclass
class FinetuneResult:
    """What the loop did: per stage its settings, images, iterations, time and last losses."""

    stages: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0
    train_images: int = 0
    trainable_params: int = 0


def _is_method_param(name: str) -> bool:
    return ".reducer." in f".{name}"


def trainable_parameters(model: nn.Module, stage: TrainStage, train_backbone: bool = False
                         ) -> dict[str, nn.Parameter]:
    """The parameters ``stage`` trains, by name: the method's (filtered by
    ``stage.trainable``), plus every backbone parameter when ``train_backbone``."""
    out: dict[str, nn.Parameter] = {}
    for name, p in model.named_parameters():
        if _is_method_param(name):
            if stage.trainable is None or any(key in name for key in stage.trainable):
                out[name] = p
        elif train_backbone:
            out[name] = p
    return out


def _check_stage(method: str, stage: TrainStage) -> None:
    if stage.optimizer not in OPTIMIZERS:
        raise ParamError(f"{method}: optimizer {stage.optimizer!r} is not supported; "
                         f"valid: {', '.join(OPTIMIZERS)}")
    if stage.schedule not in SCHEDULES:
        raise ParamError(f"{method}: schedule {stage.schedule!r} is not supported; "
                         f"valid: {', '.join(SCHEDULES)}")
    if stage.epochs < 0 or stage.lr <= 0 or stage.batch_size < 1:
        raise ParamError(f"{method}: stage {stage.name!r} needs epochs >= 0, lr > 0, batch_size >= 1; "
                         f"got epochs={stage.epochs}, lr={stage.lr}, batch_size={stage.batch_size}")
    if not 0.0 <= stage.arch_fraction < 1.0:
        raise ParamError(f"{method}: arch_fraction {stage.arch_fraction} is out of range [0, 1)")


def _optimizer(stage: TrainStage, params: dict[str, nn.Parameter]) -> torch.optim.Optimizer:
    """One torch optimiser with a parameter group per ``lr_groups`` entry (first match wins)."""
    groups: dict[float, list[nn.Parameter]] = {}
    for name, p in params.items():
        lr = next((lr for key, lr in stage.lr_groups if key in name), stage.lr)
        groups.setdefault(lr, []).append(p)
    param_groups = [{"params": ps, "lr": lr} for lr, ps in groups.items()]
    kwargs: dict[str, Any] = {"lr": stage.lr, "weight_decay": stage.weight_decay}
    if stage.optimizer == "SGD":
        kwargs["momentum"] = stage.momentum
    return getattr(torch.optim, stage.optimizer)(param_groups, **kwargs)


def _optim_wrapper(stage: TrainStage, params: dict[str, nn.Parameter]) -> OptimWrapper:
    if not stage.arch_keys or stage.arch_fraction == 0:
        return OptimWrapper(_optimizer(stage, params))
    arch = {n: p for n, p in params.items() if any(k in n for k in stage.arch_keys)}
    weights = {n: p for n, p in params.items() if n not in arch}
    wrappers = {}
    if weights:
        wrappers["weights"] = OptimWrapper(_optimizer(stage, weights))
    if arch:
        wrappers["arch"] = OptimWrapper(_optimizer(stage, arch))
    return OptimWrapperDict(**wrappers)


def is_arch_step(step: int, fraction: float) -> bool:
    """Whether step ``step`` (0-based) updates the architecture parameters: evenly spread,
    ``fraction`` of the steps (0.3 -> steps 3, 6, 9 of every 10 when counted from 1)."""
    return math.floor((step + 1) * fraction + 1e-9) > math.floor(step * fraction + 1e-9)


def step_wrapper(optim_wrapper: OptimWrapper, stage: TrainStage, step: int) -> OptimWrapper:
    """The optimiser wrapper step ``step`` updates: with an arch/weights split
    (:func:`_optim_wrapper`), ``arch`` on the arch steps and ``weights`` on the others."""
    if not isinstance(optim_wrapper, OptimWrapperDict):
        return optim_wrapper
    key = "arch" if is_arch_step(step, stage.arch_fraction) else "weights"
    return optim_wrapper[key] if key in optim_wrapper.keys() else next(iter(optim_wrapper.values()))


def guarded_update(wrapper: OptimWrapper, loss: torch.Tensor, model: nn.Module, who: str, where: str) -> None:
    """``wrapper.update_params(loss)`` with a gradient check between backward and step: a
    non-finite gradient raises (naming the parameter) before it reaches the weights."""
    wrapper.backward(wrapper.scale_loss(loss))
    updated = {id(p) for group in wrapper.optimizer.param_groups for p in group["params"]}
    check_gradients(((n, p) for n, p in model.named_parameters() if id(p) in updated), who, where)
    if wrapper.should_update():
        wrapper.step()
        wrapper.zero_grad()


class FiniteLossHook(Hook):
    """A runner hook that stops a plain mmengine training (the baseline detector's default
    training, whose ``train_step`` is mmengine's) at the first iteration whose loss terms are
    non-finite. It sees the losses after that step's update, so it costs nothing per step but
    the one check; vitbench's own trainers check before the update
    (:func:`~vitbench.guards.check_losses`)."""

    priority = "VERY_HIGH"

    def __init__(self, who: str, stage: str) -> None:
        self.who, self.stage = who, stage

    def after_train_iter(self, runner: Any, batch_idx: int, data_batch: Any = None,
                         outputs: Optional[Mapping[str, Any]] = None) -> None:
        if outputs:
            check_losses({k: v for k, v in outputs.items()  # the loss terms, not logged extras (acc)
                          if "loss" in k and isinstance(v, (torch.Tensor, float, int))},
                         self.who, train_position(self.stage, runner.epoch + 1, batch_idx + 1))


class PositionHook(Hook):
    """Tells the trainer the epoch and the iteration within it (both from 1) before each step,
    so a guard's error says where training diverged, as mmengine's log would."""

    priority = "VERY_HIGH"

    def __init__(self, trainer: BaseModel) -> None:
        self.trainer = trainer

    def before_train_iter(self, runner: Any, batch_idx: int, data_batch: Any = None) -> None:
        self.trainer.position = (runner.epoch + 1, batch_idx + 1)


def trainer_position(trainer: Any, stage: TrainStage) -> str:
    """Where ``trainer`` is: ``in stage 'finetune', epoch 1, iteration 37``."""
    epoch, iteration = getattr(trainer, "position", None) or (None, trainer.steps + 1)
    return train_position(stage.name, epoch, iteration)


def train_stage(trainer: BaseModel, stage: TrainStage, params: dict[str, nn.Parameter],
                train_dataloader: dict[str, Any], hooks: list[Any], *, work_dir: Path, seed: int,
                device: torch.device, default_scope: str = "mmpretrain") -> tuple[int, int]:
    """One ``Runner.train()`` of ``stage`` on ``trainer`` (the stage's optimiser(s) over
    ``params``, its cosine or constant schedule, ``hooks``); returns (iterations, images)."""
    from mmengine.runner import Runner

    from vitbench.mm.runner import release, runner_kwargs

    schedulers = None if stage.schedule == "constant" else [{
        "type": "CosineAnnealingLR", "by_epoch": True, "T_max": stage.epochs,
        "convert_to_iter_based": True, "eta_min_ratio": 0.01}]
    runner = Runner(**runner_kwargs(
        work_dir=work_dir, seed=seed, default_scope=default_scope, model=trainer,
        train_dataloader=train_dataloader,
        train_cfg={"by_epoch": True, "max_epochs": stage.epochs, "val_interval": stage.epochs + 1},
        optim_wrapper=_optim_wrapper(stage, params), param_scheduler=schedulers,
        custom_hooks=[*hooks, PositionHook(trainer)]))
    try:
        runner.model.to(device)
        with contextlib.redirect_stdout(io.StringIO()):  # pycocotools' chatter (det/seg data sets)
            runner.train()
        return runner.iter, len(runner.train_dataloader.dataset)
    finally:
        release(runner)


class MethodTrainer(BaseModel):
    """The model the Runner trains: normalisation, the reduced timm model, CE + method loss."""

    def __init__(self, model: nn.Module, stage: TrainStage, data_preprocessor: nn.Module,
                 precision: str = "fp32") -> None:
        super().__init__(data_preprocessor=data_preprocessor)
        self.model = model
        self.stage = stage
        self.precision = precision  # the forward's autocast (vitbench.measure.precision)
        self.steps = 0
        self.position: Optional[tuple[int, int]] = None  # (epoch, iteration), set by PositionHook
        self.last: dict[str, float] = {}

    def init_weights(self) -> None:
        """Keep the weights (``Runner.train()`` would re-initialise the timm backbone)."""

    @property
    def context(self) -> ReductionContext:
        ctx = reduction_context(self.model)
        assert ctx is not None
        return ctx

    def forward(self, inputs: torch.Tensor, data_samples: Any = None, mode: str = "tensor") -> Any:
        if mode != "tensor":
            raise NotImplementedError("MethodTrainer trains through train_step only")
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

    def train_step(self, data: Any, optim_wrapper: OptimWrapper) -> dict[str, torch.Tensor]:
        data = self.data_preprocessor(data, True)
        inputs = data["inputs"]
        labels = torch.cat([s.gt_label for s in data["data_samples"]]).to(inputs.device)
        wrapper = step_wrapper(optim_wrapper, self.stage, self.steps)
        with wrapper.optim_context(self), autocast(self.precision, inputs.device):
            losses = self.losses(inputs, labels)
        who, where = self.context.method, trainer_position(self, self.stage)
        check_losses(losses, who, where)
        optim_wrapper.zero_grad()  # the other optimiser's parameters must not accumulate grads
        guarded_update(wrapper, losses["loss"], self.model, who, where)
        self.steps += 1
        for callback in self.stage.after_step:
            callback(self.model)
        out = {k: v.detach() for k, v in losses.items()}
        self.last = {k: float(v) for k, v in out.items()}
        return out


@contextlib.contextmanager
def _eval_no_grad(model: nn.Module) -> Iterator[None]:
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        model.train(was_training)


class StageHook(Hook):
    """Calls a stage's ``before`` / ``epoch_end`` / ``after`` callbacks (LTM's statistics
    passes, DCS's temperature schedule and shrink) with the training-data iterator."""

    priority = "HIGH"

    def __init__(self, stage: TrainStage, model: nn.Module, batches: Batches) -> None:
        self.stage, self.model, self.batches = stage, model, batches

    def before_train(self, runner: Any) -> None:
        for callback in self.stage.before:
            with _eval_no_grad(self.model):
                callback(self.model, self.batches)

    def after_train_epoch(self, runner: Any) -> None:
        for callback in self.stage.epoch_end:
            with _eval_no_grad(self.model):
                callback(self.model, runner.epoch, self.batches)

    def after_train(self, runner: Any) -> None:
        for callback in self.stage.after:
            callback(self.model)


def finetune(model: nn.Module, data: Any, *, train_backbone: bool = False, limit: Optional[int] = None,
             device: str = "cpu", seed: int = 0, work_dir: str | Path | None = None,
             verbose: bool = False, progress: Optional[Callable[[str], None]] = None,
             precision: str = "fp32") -> FinetuneResult:
    """Run the training stages of the method ``model`` was reduced with, in place.

    ``data``: a :class:`~vitbench.tasks.cls.data.ClsData`; training uses its training split,
    the first ``limit`` images when given. ``precision``: ``bf16`` runs the training forwards
    under bf16 autocast; ``fp32`` as they are (:func:`vitbench.measure.precision.trains_in`
    says which a run's precision trains in). Returns what was done; ``model`` is left in eval
    mode with ``requires_grad`` as it was.
    """
    from vitbench.mm.runner import work_dir_or_temp
    from vitbench.tasks.cls.batches import cls_batches, data_preprocessor, loader_cfg

    ctx = reduction_context(model)
    if ctx is None or ctx.reduction is None:
        raise VitbenchError("finetune() needs a model reduced with vitbench.apply(model, method)")
    stages = list(ctx.reduction.train)
    result = FinetuneResult()
    if not stages:
        return result
    for stage in stages:
        _check_stage(ctx.method, stage)
    target = torch.device(device)
    dataset = data.train_cfg(limit=limit)
    preprocessor = data_preprocessor(model, data.bgr)
    batches = cls_batches(dataset, preprocessor, device=target, seed=seed)
    saved_grad = {n: p.requires_grad for n, p in model.named_parameters()}
    start = time.perf_counter()
    try:
        for stage in stages:
            params = trainable_parameters(model, stage, train_backbone)
            if not params:
                raise VitbenchError(f"{ctx.method}: training stage {stage.name!r} has no trainable "
                                    f"parameters (trainable={stage.trainable})")
            for name, p in model.named_parameters():
                p.requires_grad_(name in params)
            result.trainable_params = max(result.trainable_params, sum(p.numel() for p in params.values()))
            if progress:
                progress(f"fine-tuning stage {stage.name!r}: {stage.epochs} epoch(s), "
                         f"{sum(p.numel() for p in params.values()):,} trainable parameters"
                         + (" (backbone included)" if train_backbone else " (backbone frozen)"))
            trainer = MethodTrainer(model, stage, preprocessor, precision=precision).to(target)
            stage_start = time.perf_counter()
            if stage.epochs == 0:
                hook = StageHook(stage, model, batches)
                hook.before_train(None)
                hook.after_train(None)
                result.stages.append({"name": stage.name, "epochs": 0, "iters": 0,
                                      "seconds": round(time.perf_counter() - stage_start, 2)})
                continue
            with work_dir_or_temp(work_dir) as wd:
                iters, n_images = train_stage(
                    trainer, stage, params, loader_cfg(dataset, stage.batch_size, True),
                    [StageHook(stage, model, batches),
                     {"type": "vitbench.ProgressHook", "verbose": verbose, "interval": 50,
                      "prefix": f"vitbench: {ctx.method} {stage.name}: "}],
                    work_dir=wd / stage.name, seed=seed, device=target)
            result.train_images = max(result.train_images, n_images)
            result.stages.append({"name": stage.name, "epochs": stage.epochs, "iters": iters,
                                  "images": n_images, **{f"last_{k}": v for k, v in trainer.last.items()},
                                  "seconds": round(time.perf_counter() - stage_start, 2)})
            if progress:
                last = ", ".join(f"{k} {v:.4f}" for k, v in trainer.last.items())
                progress(f"stage {stage.name!r} done: {iters} iterations on {n_images} images "
                         f"in {time.perf_counter() - stage_start:.0f} s ({last})")
        check_finite(model.state_dict(), f"{ctx.method}: the fine-tuned weights",
                     f"after stage {stages[-1].name!r}")
    finally:
        for name, p in model.named_parameters():
            p.requires_grad_(saved_grad.get(name, False))
        ctx.labels = None
    result.seconds = round(time.perf_counter() - start, 2)
    model.eval()
    return result
