"""One fine-tuning loop for every learnable method, on the mmengine ``Runner``
(docs/architecture.md, "The fine-tuning loop").

Each :class:`~vitbench.catalog.TrainStage` a method declares is one ``Runner.train()``: the
method's parameters train (the backbone too with ``train_backbone``), the step
(:class:`MethodTrainer`) adds the method's ``extra_loss`` to CE and may alternate architecture
and weight optimisers, every step is guarded against non-finite losses and gradients
(:func:`guarded_update`), and the stage's callbacks (:class:`StageHook`) see the training
data. Under a launcher the trainer is wrapped in :class:`MethodDDP` and the loss guard is
collective. Data: the training split, the first ``limit`` images, no augmentation."""
from __future__ import annotations

import contextlib
import inspect
import io
import math
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch
import torch.nn.functional as F
from mmengine.hooks import Hook
from mmengine.model import BaseModel, MMDistributedDataParallel
from mmengine.optim import OptimWrapper, OptimWrapperDict
from torch import nn

from vitbench.catalog import TrainStage
from vitbench.distributed import is_distributed, rank_batch_size
from vitbench.engine.block import ReductionContext, reduction_context
from vitbench.errors import NonFiniteError, ParamError, VitbenchError
from vitbench.guards import check_finite, check_gradients, check_losses, train_position
from vitbench.measure.precision import autocast

__all__ = ["DDP_WRAPPER", "FiniteLossHook", "FinetuneResult", "MethodDDP", "MethodTrainer", "PositionHook", "StageHook",
           "broadcast_buffers", "check_losses_on_every_rank", "finetune", "guarded_update", "step_wrapper",
           "train_stage", "trainable_parameters"]

OPTIMIZERS = ("SGD", "AdamW", "Adam")
SCHEDULES = ("cosine", "constant")
from vitbench.train.batches import Batches


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
    clip = None if stage.clip_grad_value is None else {"type": "value", "clip_value": stage.clip_grad_value}
    if not stage.arch_keys or stage.arch_fraction == 0:
        return OptimWrapper(_optimizer(stage, params), clip_grad=clip)
    arch = {n: p for n, p in params.items() if any(k in n for k in stage.arch_keys)}
    weights = {n: p for n, p in params.items() if n not in arch}
    wrappers = {}
    if weights:
        wrappers["weights"] = OptimWrapper(_optimizer(stage, weights), clip_grad=clip)
    if arch:
        wrappers["arch"] = OptimWrapper(_optimizer(stage, arch), clip_grad=clip)
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


def check_losses_on_every_rank(losses: Mapping[str, torch.Tensor], who: str, where: str) -> None:
    """:func:`~vitbench.guards.check_losses`, decided by every rank together (a collective under
    a launcher: every rank calls it at every step). Without a process group it is
    ``check_losses`` itself. With one, the ranks share whether any loss is non-finite (one small
    all-reduce per step) and, when one is, every rank raises the same
    :class:`~vitbench.errors.NonFiniteError`: the first bad rank's message and which ranks saw
    it. A rank raising alone would leave the others waiting forever in DDP's gradient all-reduce."""
    if not is_distributed():
        check_losses(losses, who, where)
        return
    from mmengine.dist import all_gather_object, all_reduce, get_world_size

    local: Optional[str] = None
    try:
        check_losses(losses, who, where)
    except NonFiniteError as exc:
        local = str(exc)
    bad = torch.tensor([0 if local is None else 1], dtype=torch.int32)
    all_reduce(bad, op="sum")
    if int(bad.item()) == 0:
        return
    messages = all_gather_object(local)
    ranks = [rank for rank, message in enumerate(messages) if message is not None]
    raise NonFiniteError(f"{messages[ranks[0]]} on rank {', '.join(map(str, ranks))} of {get_world_size()} "
                         f"(every rank stopped)")


def broadcast_buffers(model: nn.Module, src: int = 0) -> None:
    """Give every rank ``src``'s buffers of ``model`` (nothing without a process group; a
    collective: every rank calls it, with buffers of the same shapes). DDP keeps the parameters
    equal but not the buffers (``broadcast_buffers=False``, as mmengine's default), and the
    stage callbacks compute statistics on every rank (the same on the CPU; on a GPU atomics may
    differ in the last bits): after this every rank holds what rank 0 checkpoints. Written by
    hand on ``mmengine.dist.broadcast``; ``bool`` buffers travel as ``uint8`` (gloo has no bool)."""
    if not is_distributed():
        return
    from mmengine.dist import broadcast

    for buf in model.buffers():
        if buf.numel() == 0:
            continue
        if buf.dtype == torch.bool:
            as_bytes = buf.to(torch.uint8)
            broadcast(as_bytes, src)
            buf.copy_(as_bytes.bool())
        else:
            broadcast(buf, src)


def _mean_over_ranks(values: dict[str, float]) -> dict[str, float]:
    """``values`` (the same keys on every rank) averaged over the ranks: each rank's last losses
    are its share of the batch's, and with equal shares their mean is the whole batch's (what a
    single process records). ``values`` itself without a process group."""
    if not is_distributed() or not values:
        return dict(values)
    from mmengine.dist import all_reduce

    keys = sorted(values)
    tensor = torch.tensor([values[k] for k in keys], dtype=torch.float64)
    all_reduce(tensor, op="mean")
    return {k: float(v) for k, v in zip(keys, tensor.tolist())}


#: the DDP wrapper's name in mmengine's root ``MODEL_WRAPPERS`` (reachable from every scope)
DDP_WRAPPER = "VitbenchMethodDDP"


class MethodDDP(MMDistributedDataParallel):
    """mmengine's ``MMDistributedDataParallel`` for vitbench's trainers: its ``train_step`` is
    the trainer's own (the guards, the alternating optimisers, the callbacks), given this
    wrapper as ``forward`` so that the losses are computed through DDP's forward and their
    backward averages the gradients over the ranks (mmengine's documented way for a model with
    its own optimisation step: "a custom model wrapper inherit from MMDistributedDataParallel
    ... override the train_step method")."""

    def train_step(self, data: Any, optim_wrapper: OptimWrapper) -> dict[str, torch.Tensor]:
        return self.module.train_step(data, optim_wrapper, forward=self)


def _register_ddp_wrapper() -> None:
    from mmengine.registry import MODEL_WRAPPERS

    if MODEL_WRAPPERS.get(DDP_WRAPPER) is None:
        MODEL_WRAPPERS.register_module(name=DDP_WRAPPER, module=MethodDDP)


def _distributed_runner(trainer: BaseModel, device: torch.device) -> dict[str, Any]:
    """The Runner's keyword arguments for training under a launcher: ``launcher="pytorch"``
    (the process group is already running: the Runner only marks itself distributed) and the
    :class:`MethodDDP` wrapper; nothing without a process group of more than one rank."""
    if not is_distributed():
        return {}
    if "forward" not in inspect.signature(trainer.train_step).parameters:
        raise VitbenchError(f"{type(trainer).__name__} cannot train under a launcher yet (its train_step takes "
                            f"no forward=, the DDP wrapper); run it with --launcher none")
    if device.type != "cuda" and torch.cuda.is_available():
        raise VitbenchError("training on the CPU under a launcher on a machine with CUDA: mmengine's Runner "
                            "puts a distributed model on the GPU; use --device cuda, or hide the GPUs "
                            "(CUDA_VISIBLE_DEVICES=)")
    _register_ddp_wrapper()
    from torch.nn.parallel import DistributedDataParallel

    # buffers are not synced at each forward (rank 0's are broadcast after the stage,
    # broadcast_buffers); torch 2.13 renamed the switch and deprecated the old name
    sync = ("forward_sync_buffers" if "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters
            else "broadcast_buffers")
    wrapper: dict[str, Any] = {"type": DDP_WRAPPER, "find_unused_parameters": True, sync: False}
    if device.type != "cuda":
        wrapper["device_ids"] = None  # a CPU module; mmengine's default [LOCAL_RANK] is for GPUs
    return {"launcher": "pytorch", "cfg": {"model_wrapper_cfg": wrapper}}  # the Runner reads it from cfg


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
    ``params``, its cosine or constant schedule, ``hooks``); returns (iterations, images).
    Under a launcher (a process group of more than one rank) the Runner wraps ``trainer`` in
    :class:`MethodDDP`; ``train_dataloader``'s ``DefaultSampler`` then gives each rank its
    shard and its batch size is each rank's. Before the Runner is built (its constructor
    broadcasts) the ranks meet at an agreement point, so a rank that failed earlier in the run
    makes every rank raise its error here instead of leaving them in DDP's first all-reduce
    (:func:`vitbench.distributed.raise_if_any_rank_failed`)."""
    from mmengine.runner import Runner

    from vitbench.distributed import raise_if_any_rank_failed
    from vitbench.mm.runner import release, runner_kwargs

    raise_if_any_rank_failed(None)

    schedulers = None if stage.schedule == "constant" else [{
        "type": "CosineAnnealingLR", "by_epoch": True, "T_max": stage.epochs,
        "convert_to_iter_based": True, "eta_min_ratio": 0.01}]
    with warnings.catch_warnings():  # a distributed Runner's note that it sets OMP/MKL_NUM_THREADS
        warnings.filterwarnings("ignore", message=r"Setting (OMP|MKL)_NUM_THREADS", category=UserWarning)
        runner = Runner(**runner_kwargs(
            work_dir=work_dir, seed=seed, default_scope=default_scope, model=trainer,
            train_dataloader=train_dataloader,
            train_cfg={"by_epoch": True, "max_epochs": stage.epochs, "val_interval": stage.epochs + 1},
            optim_wrapper=_optim_wrapper(stage, params), param_scheduler=schedulers,
            custom_hooks=[*hooks, PositionHook(trainer)], **_distributed_runner(trainer, device)))
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

    def forward(self, inputs: torch.Tensor, data_samples: Any = None, mode: str = "tensor",
                labels: Optional[torch.Tensor] = None) -> Any:
        """``tensor``: the logits; ``loss``: :meth:`losses` of ``labels`` (what
        :meth:`train_step` runs, through :class:`MethodDDP`'s forward under a launcher)."""
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

    def train_step(self, data: Any, optim_wrapper: OptimWrapper,
                   forward: Optional[nn.Module] = None) -> dict[str, torch.Tensor]:
        """One step: losses, the (collective) loss guard, backward, the gradient guard, the
        update of this step's optimiser, the ``after_step`` callbacks. ``forward``: the
        :class:`MethodDDP` around this trainer under a launcher (the losses must go through its
        forward for DDP to average the gradients); ``None``: this trainer."""
        run = self if forward is None else forward
        data = self.data_preprocessor(data, True)
        inputs = data["inputs"]
        labels = torch.cat([s.gt_label for s in data["data_samples"]]).to(inputs.device)
        wrapper = step_wrapper(optim_wrapper, self.stage, self.steps)
        with wrapper.optim_context(run), autocast(self.precision, inputs.device):
            losses = run(inputs, mode="loss", labels=labels)
        who, where = self.context.method, trainer_position(self, self.stage)
        check_losses_on_every_rank(losses, who, where)
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
             precision: str = "fp32", workers: Optional[int] = None) -> FinetuneResult:
    """Run the training stages of the method ``model`` was reduced with, in place.

    ``data``: a :class:`~vitbench.tasks.cls.data.ClsData`; training uses its training split,
    the first ``limit`` images when given. ``precision``: ``bf16`` runs the training forwards
    under bf16 autocast; ``fp32`` as they are (:func:`vitbench.measure.precision.trains_in`
    says which a run's precision trains in). Returns what was done; ``model`` is left in eval
    mode with ``requires_grad`` as it was. ``workers``: loader worker processes (``--workers``;
    None: :func:`vitbench.data.workers.workers_for`'s default).
    """
    from mmengine.dist import get_world_size

    from vitbench.mm.runner import work_dir_or_temp
    from vitbench.train.batches import cls_batches, data_preprocessor, loader_cfg

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
    batches = cls_batches(dataset, preprocessor, device=target, seed=seed, workers=workers)
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
                broadcast_buffers(model)
                result.stages.append({"name": stage.name, "epochs": 0, "iters": 0,
                                      "seconds": round(time.perf_counter() - stage_start, 2)})
                continue
            world = get_world_size()
            per_rank = rank_batch_size(stage.batch_size, world)
            if progress and per_rank * world != stage.batch_size:
                progress(f"stage {stage.name!r}: batch {stage.batch_size} does not divide over {world} ranks: "
                         f"{per_rank} per rank, an effective batch of {per_rank * world}")
            with work_dir_or_temp(work_dir) as wd:
                iters, n_images = train_stage(
                    trainer, stage, params, loader_cfg(dataset, per_rank, True, workers=workers, device=target,
                               persistent=True),
                    [StageHook(stage, model, batches),
                     {"type": "vitbench.ProgressHook", "verbose": verbose, "interval": 50,
                      "prefix": f"vitbench: {ctx.method} {stage.name}: ",
                      "what": f"fine-tuning {ctx.method} (stage {stage.name!r})"}],
                    work_dir=wd / stage.name, seed=seed, device=target)
            broadcast_buffers(model)  # under a launcher: rank 0's buffers everywhere
            last = _mean_over_ranks(trainer.last)  # the last step's losses over the whole batch
            result.train_images = max(result.train_images, n_images)
            ranks = {"ranks": world, "rank_batch_size": per_rank,
                     "effective_batch_size": per_rank * world} if world > 1 else {}
            result.stages.append({"name": stage.name, "epochs": stage.epochs, "iters": iters,
                                  "images": n_images, **ranks, **{f"last_{k}": v for k, v in last.items()},
                                  "seconds": round(time.perf_counter() - stage_start, 2)})
            if progress:
                shown = ", ".join(f"{k} {v:.4f}" for k, v in last.items())
                progress(f"stage {stage.name!r} done: {iters} iterations on {n_images} images "
                         f"in {time.perf_counter() - stage_start:.0f} s ({shown})")
        check_finite(model.state_dict(), f"{ctx.method}: the fine-tuned weights",
                     f"after stage {stages[-1].name!r}")
    finally:
        for name, p in model.named_parameters():
            p.requires_grad_(saved_grad.get(name, False))
        ctx.labels = None
    result.seconds = round(time.perf_counter() - start, 2)
    model.eval()
    return result
