"""The stage loop every fine-tuning runs -- cls, det and seg alike -- on the mmengine ``Runner``
(docs/architecture.md, "The fine-tuning loop").

Each :class:`~vitbench.catalog.TrainStage` a method declares is one ``Runner.train()``. A task
supplies, through a :class:`StageSource`, what a stage trains, its trainer (a
:class:`StageTrainer`: the task's batches and losses) and its data; :func:`run_stages` does the
rest once: which parameters train, the stage's optimiser(s) and schedule, every step guarded
against non-finite losses and gradients (:func:`guarded_update`), the stage's callbacks
(:class:`StageHook`), progress, and under a launcher the DDP wrapper (:class:`MethodDDP`), the
collective loss guard, rank 0's buffers everywhere and the ranks checked to agree."""
from __future__ import annotations

import contextlib
import inspect
import io
import math
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch
from mmengine.hooks import Hook
from mmengine.model import BaseModel, MMDistributedDataParallel
from mmengine.optim import OptimWrapper, OptimWrapperDict
from torch import nn

from vitbench.catalog import TrainStage
from vitbench.host.distributed import is_distributed
from vitbench.engine.block import reduction_context
from vitbench.errors import NonFiniteError, ParamError, VitbenchError
from vitbench.core.guards import check_finite, check_gradients, check_losses, train_position
from vitbench.measure.precision import autocast
from vitbench.task import CONTROL
from vitbench.train.batches import Batches
from vitbench.train.ema import ParameterEMA
from vitbench.host import distributed
from vitbench.mm.runner import release, runner_kwargs, work_dir_or_temp

__all__ = ["DDP_WRAPPER", "FiniteLossHook", "FinetuneResult", "MethodDDP", "PositionHook", "StageHook",
           "StageSource", "StageTrainer", "broadcast_buffers", "check_losses_on_every_rank", "check_stage",
           "guarded_update", "run_stages", "step_wrapper", "train_stage", "trainable_parameters"]

OPTIMIZERS = ("SGD", "AdamW", "Adam")
SCHEDULES = ("cosine", "constant")


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
    ``stage.trainable``), plus every backbone parameter when ``train_backbone`` or ``stage.backbone``."""
    out: dict[str, nn.Parameter] = {}
    for name, p in model.named_parameters():
        if _is_method_param(name):
            if stage.trainable is None or any(key in name for key in stage.trainable):
                out[name] = p
        elif train_backbone or stage.backbone:
            out[name] = p
    return out


def check_stage(method: str, stage: TrainStage) -> None:
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
    if not 0.0 <= stage.min_lr_ratio <= 1.0:
        raise ParamError(f"{method}: min_lr_ratio {stage.min_lr_ratio} is out of range [0, 1]")
    if stage.ema_decay is not None and not 0.0 < stage.ema_decay < 1.0:
        raise ParamError(f"{method}: ema_decay {stage.ema_decay} is out of range (0, 1); None: no average")


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
    """:func:`~vitbench.core.guards.check_losses`, decided by every rank together (a collective under
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
    (:func:`~vitbench.core.guards.check_losses`)."""
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
    (:func:`vitbench.host.distributed.raise_if_any_rank_failed`)."""
    from mmengine.runner import Runner


    distributed.raise_if_any_rank_failed(None)

    optim_wrapper = _optim_wrapper(stage, params)
    schedulers = None if stage.schedule == "constant" else [{
        "type": "CosineAnnealingLR", "by_epoch": True, "T_max": stage.epochs,
        "convert_to_iter_based": True, "eta_min_ratio": stage.min_lr_ratio}]
    with warnings.catch_warnings():  # a distributed Runner's note that it sets OMP/MKL_NUM_THREADS
        warnings.filterwarnings("ignore", message=r"Setting (OMP|MKL)_NUM_THREADS", category=UserWarning)
        runner = Runner(**runner_kwargs(
            work_dir=work_dir, seed=seed, default_scope=default_scope, model=trainer,
            train_dataloader=train_dataloader,
            train_cfg={"by_epoch": True, "max_epochs": stage.epochs, "val_interval": stage.epochs + 1},
            optim_wrapper=optim_wrapper, param_scheduler=schedulers,
            custom_hooks=[*hooks, PositionHook(trainer)], **_distributed_runner(trainer, device)))
    try:
        runner.model.to(device)
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():  # pycocotools' chatter
            if isinstance(optim_wrapper, OptimWrapperDict):
                # by design the arch optimiser first steps after its schedule has (step 0 updates the weights)
                warnings.filterwarnings("ignore", message=r"Detected call of `scheduler.step\(\)` before",
                                        category=UserWarning)
            runner.train()
        return runner.iter, len(runner.train_dataloader.dataset)
    finally:
        release(runner)


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
        #: what the ``before`` callbacks returned, for the stage's record
        self.notes: dict[str, float] = {}

    def before_train(self, runner: Any) -> None:
        for callback in self.stage.before:
            with _eval_no_grad(self.model):
                self.notes.update(callback(self.model, self.batches) or {})

    def after_train_epoch(self, runner: Any) -> None:
        for callback in self.stage.epoch_end:
            with _eval_no_grad(self.model):
                callback(self.model, runner.epoch, self.batches)

    def after_train(self, runner: Any) -> None:
        for callback in self.stage.after:
            callback(self.model)



class StageTrainer(BaseModel):
    """The model the Runner trains in one stage: a task's losses of a batch (:meth:`losses_of`),
    the (collective) loss guard, backward, the gradient guard, the update of this step's
    optimiser (:func:`step_wrapper`) and the stage's ``after_step`` callbacks. A task subclasses
    it for its batches and losses; under a launcher the Runner wraps it in :class:`MethodDDP`."""
    def __init__(self, stage: TrainStage, data_preprocessor: Any, precision: str = "fp32") -> None:
        super().__init__(data_preprocessor=data_preprocessor)
        self.stage = stage
        self.precision = precision  # the forward's autocast (vitbench.measure.precision)
        self.steps = 0
        self.position: Optional[tuple[int, int]] = None  # (epoch, iteration), set by PositionHook
        self.last: dict[str, float] = {}

    @property
    def reduced(self) -> nn.Module:
        """The model the method reduced (what the stage's callbacks get)."""
        raise NotImplementedError

    @property
    def trained(self) -> nn.Module:
        """The module whose parameters the step updates (what the gradient guard reads)."""
        return self.reduced

    @property
    def who(self) -> str:
        """The method's name in an error (the control's, :data:`~vitbench.task.CONTROL`, without one)."""
        ctx = reduction_context(self.reduced)
        return ctx.method if ctx is not None else CONTROL

    def init_weights(self) -> None:
        """Keep the weights (``Runner.train()`` would re-initialise them)."""
    def split(self, data: dict[str, Any]) -> tuple[torch.Tensor, Any, torch.Tensor]:
        """A preprocessed batch as (inputs, data samples, the images' class labels)."""
        raise NotImplementedError

    def losses_of(self, run: nn.Module, inputs: torch.Tensor, samples: Any, labels: torch.Tensor
                  ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The loss to minimise and the terms to log, through ``run``'s forward (this trainer, or
        the DDP wrapper around it: DDP averages the gradients of what goes through its forward)."""
        raise NotImplementedError

    def guarded_terms(self, terms: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The terms the loss guard checks (every one; a task drops logged extras such as an accuracy)."""
        return terms

    def train_step(self, data: Any, optim_wrapper: OptimWrapper,
                   forward: Optional[nn.Module] = None) -> dict[str, torch.Tensor]:
        """One step. ``forward``: the :class:`MethodDDP` around this trainer under a launcher;
        ``None``: this trainer."""
        run = self if forward is None else forward
        inputs, samples, labels = self.split(self.data_preprocessor(data, True))
        wrapper = step_wrapper(optim_wrapper, self.stage, self.steps)
        with wrapper.optim_context(run), autocast(self.precision, inputs.device):
            loss, terms = self.losses_of(run, inputs, samples, labels)
        who, where = self.who, trainer_position(self, self.stage)
        check_losses_on_every_rank(self.guarded_terms(terms), who, where)
        optim_wrapper.zero_grad()  # the other optimiser's parameters must not accumulate grads
        guarded_update(wrapper, loss, self.trained, who, where)
        self.steps += 1
        for callback in self.stage.after_step:
            callback(self.reduced)
        out = {k: v.detach() if isinstance(v, torch.Tensor) else v for k, v in terms.items()}
        self.last = {k: float(v) for k, v in out.items()}
        return out


class StageSource:
    """What a task gives :func:`run_stages`: the method's name, the module whose parameters the
    stages may train, the model the method reduced, the training data of the stage callbacks,
    and per stage its trainable parameters, trainer and data loader."""
    #: the Runner's default registry scope (the task's data pipeline names its transforms)
    scope = "mmpretrain"
    #: iterations between progress lines
    interval = 50

    def __init__(self, method: str, module: nn.Module, reduced: nn.Module, batches: Optional[Batches]) -> None:
        self.method, self.module, self.reduced, self.batches = method, module, reduced, batches

    def prepare(self, stage: TrainStage, last: bool) -> TrainStage:
        """``stage`` as this task runs it (``last``: the last stage with epochs)."""
        return stage

    def parameters(self, stage: TrainStage) -> dict[str, nn.Parameter]:
        """The parameters ``stage`` trains, by name."""
        raise NotImplementedError

    def trainer(self, stage: TrainStage) -> StageTrainer:
        """The trainer of ``stage``."""
        raise NotImplementedError

    def loader(self, stage: TrainStage, progress: Optional[Callable[[str], None]]
               ) -> tuple[dict[str, Any], dict[str, int]]:
        """The stage's dataloader config (each rank's batch) and what its record says of the ranks."""
        raise NotImplementedError

    def announce(self, stage: TrainStage, trainable: int) -> str:
        """The progress line before ``stage`` trains ``trainable`` parameters."""
        return f"fine-tuning stage {stage.name!r}: {stage.epochs} epoch(s), {trainable:,} trainable parameters"


def _set_trainable(module: nn.Module, params: dict[str, nn.Parameter]) -> None:
    chosen = {id(p) for p in params.values()}
    for p in module.parameters():
        p.requires_grad_(id(p) in chosen)


def run_stages(stages: Sequence[TrainStage], source: StageSource, *, device: torch.device, seed: int = 0,
               work_dir: str | Path | None = None, verbose: bool = False,
               progress: Optional[Callable[[str], None]] = None) -> FinetuneResult:
    """Run ``stages`` in order on what ``source`` supplies, in place; returns what was done.

    Every stage is checked before the first runs. A stage of 0 epochs runs only its ``before``
    and ``after`` callbacks. After each stage every rank holds rank 0's buffers and is checked to
    hold the same weights (:func:`~vitbench.host.distributed.same_on_every_rank`); after the last the
    weights are checked finite. ``requires_grad`` is restored and the module left in eval mode."""
    for stage in stages:
        check_stage(source.method, stage)
    last = max((i for i, s in enumerate(stages) if s.epochs > 0), default=-1)
    module, method = source.module, source.method
    saved = {name: p.requires_grad for name, p in module.named_parameters()}  # by name: a shrink makes new tensors
    result = FinetuneResult()
    start = time.perf_counter()
    try:
        for i, declared in enumerate(stages):
            stage = source.prepare(declared, last=i == last)
            params = source.parameters(stage)
            if not params:
                raise VitbenchError(f"{method}: training stage {stage.name!r} has no trainable parameters "
                                    f"(trainable={stage.trainable})")
            _set_trainable(module, params)
            trainable = sum(p.numel() for p in params.values())
            result.trainable_params = max(result.trainable_params, trainable)
            if progress:
                progress(source.announce(stage, trainable))
            hook = StageHook(stage, source.reduced, source.batches)
            averaged = [] if stage.ema_decay is None else [ParameterEMA(params, stage.ema_decay)]
            ctx = reduction_context(source.reduced)
            if ctx is not None:
                ctx.stage = stage
            stage_start = time.perf_counter()
            if stage.epochs == 0:
                hook.before_train(None)
                hook.after_train(None)
                broadcast_buffers(module)
                result.stages.append({"name": stage.name, "epochs": 0, "iters": 0, **hook.notes,
                                      "seconds": round(time.perf_counter() - stage_start, 2)})
                continue
            trainer = source.trainer(stage).to(device)
            loader, ranks = source.loader(stage, progress)
            with work_dir_or_temp(work_dir) as wd:
                iters, images = train_stage(
                    trainer, stage, params, loader,
                    [*averaged, hook, {"type": "vitbench.ProgressHook", "verbose": verbose, "interval": source.interval,
                            "prefix": f"vitbench: {method} {stage.name}: ",
                            "what": f"fine-tuning {method} (stage {stage.name!r})"}],
                    work_dir=wd / stage.name, seed=seed, device=device, default_scope=source.scope)
            broadcast_buffers(module)  # under a launcher: rank 0's buffers (BatchNorm statistics) everywhere
            distributed.same_on_every_rank(module, f"{method}: stage {stage.name!r}")
            losses = _mean_over_ranks(trainer.last)  # the last step's losses over the whole batch
            result.train_images = max(result.train_images, images)
            seconds = time.perf_counter() - stage_start
            result.stages.append({"name": stage.name, "epochs": stage.epochs, "iters": iters, "images": images,
                                  **({"backbone": True} if stage.backbone else {}), **ranks,
                                  **{f"last_{k}": v for k, v in losses.items()}, **hook.notes,
                                  "seconds": round(seconds, 2)})
            if progress:
                shown = ", ".join(f"{k} {v:.4f}" for k, v in losses.items())
                progress(f"stage {stage.name!r} done: {iters} iterations on {images} images in {seconds:.0f} s "
                         f"({shown})")
        if stages:
            check_finite(module.state_dict(), f"{method}: the fine-tuned weights", f"after stage {stages[-1].name!r}")
    finally:
        for name, p in module.named_parameters():
            p.requires_grad_(saved.get(name, p.requires_grad))
        ctx = reduction_context(source.reduced)
        if ctx is not None:
            ctx.labels = ctx.stage = None
    result.seconds = round(time.perf_counter() - start, 2)
    module.eval()
    return result
