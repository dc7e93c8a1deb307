"""Top-1/top-5 of a (reduced) timm model, measured by the mmengine Runner's test loop.

The model is wrapped by :func:`vitbench.mm.classifier.build_classifier` (its own head, its own
normalisation) and scored by mmpretrain's ``Accuracy`` (docs/measuring.md, "Accuracy").

Two guards keep a broken setup from reading as a bad method: every batch's logits
must be finite (a NaN logit is scored as a wrong answer, and a diverged model would show a
0.00 % row), and the model must predict exactly the data's classes (a 1000-way head scored
against a 10-class folder's labels 0-9 also gives 0.00 %).

Under a launcher the logits guard of one rank finds NaN in that rank's shard only: that rank
stops, and every rank raises the same error naming it (``... in batch 1 on rank 1 of 2``) where
they would otherwise gather the results (:func:`vitbench.host.distributed.collective_test`), instead
of the others waiting there for it until the process group's timeout.
"""
from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

import torch
from torch import nn

from vitbench.errors import DataError, ParamError, UnsupportedError
from vitbench.core.guards import check_finite
from vitbench.tasks.cls.data import ClsData, resolve_cls_data
from vitbench.data.input_config import input_config
from vitbench.core import progress
from vitbench.host import distributed
from vitbench.measure.ib import final_features_during
from vitbench.measure.precision import autocast_method
from vitbench.mm.classifier import build_classifier
from vitbench.mm.hooks import TestProgressHook, steady_rate
from vitbench.mm.runner import release, runner_kwargs, work_dir_or_temp
from vitbench.train.batches import loader_cfg

__all__ = ["ClsData", "evaluate_cls", "resolve_cls_data"]


def _positive(name: str, value: Any, *, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ParamError(f"{name} must be a positive integer, got {value!r}")


class _FiniteLogits:
    """A forward hook on the evaluated model: each batch's logits must be finite; with ``keep``,
    each image's top-1 class is kept, in the data's order."""
    def __init__(self, keep: bool = False) -> None:
        self.batch = 0
        self.top1: Optional[list[torch.Tensor]] = [] if keep else None

    def __call__(self, module: nn.Module, args: Any, output: Any) -> None:
        self.batch += 1
        check_finite(output, "evaluation: the logits", f"in batch {self.batch}")
        if self.top1 is not None:
            self.top1.append(output.detach().argmax(dim=-1).reshape(-1).cpu())


def check_class_count(model: nn.Module, data: ClsData) -> None:
    """The model's head must score ``data``'s label space (its ``classes``; ImageNet synset
    folders map into the 1000 ImageNet classes), else every prediction is scored against
    labels that mean something else."""
    n_out = getattr(model, "num_classes", None)
    if isinstance(n_out, int) and n_out > 0 and n_out != len(data.classes):
        raise DataError(f"the model predicts {n_out} classes but the data {data.name} has {len(data.classes)}; "
                        f"pass --num-classes {len(data.classes)} (fits a new head) or a --checkpoint whose "
                        f"head has {len(data.classes)} classes")


def _accuracy_metric(topk: tuple[int, ...], work_dir: Path | None) -> Any:
    """mmpretrain's ``Accuracy``. Under ``--launcher pytorch`` each rank leaves its per-image
    results in ``work_dir/collect`` (the same folder on every rank: the spec's work folder) for
    rank 0 to gather, instead of mmengine's default ``./.dist_test`` in the current folder
    (kept when there is no ``work_dir``: each rank's temporary folder would differ)."""
    from mmpretrain.evaluation import Accuracy


    return distributed.collect_in(Accuracy(topk=topk), work_dir)


#: what :func:`evaluate_cls` hands an observer per batch: final features, normalised images, labels
BatchObserver = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], None]


class _Observe:
    """Hands ``observe`` each test batch's final features and images (captured in the forward)
    with its labels (from the batch's outputs, after the step)."""
    def __init__(self, observe: BatchObserver) -> None:
        self.observe = observe
        self.pending: list[tuple[torch.Tensor, torch.Tensor]] = []

    def seen(self, features: torch.Tensor, images: torch.Tensor) -> None:
        self.pending.append((features, images))

    def hook(self) -> Any:
        from mmengine.hooks import Hook

        observer = self

        class ObserveBatches(Hook):
            priority = "VERY_LOW"

            def after_test_iter(self, runner: Any, batch_idx: int, data_batch: Any = None, outputs: Any = None) -> None:
                if len(observer.pending) != 1:
                    raise RuntimeError(f"the evaluation ran the model {len(observer.pending)} times in batch "
                                       f"{batch_idx + 1}; its features cannot be paired with the batch's labels")
                features, images = observer.pending.pop()
                labels = torch.cat([o.gt_label.reshape(-1) for o in outputs])
                observer.observe(features, images, labels)

        return ObserveBatches()


def evaluate_cls(model: nn.Module, data: ClsData, *, batch_size: int = 128, device: str = "cpu",
                 limit: int | None = None, work_dir: str | Path | None = None,
                 seed: int = 0, precision: str = "fp32", workers: int | None = None,
                 observe: Optional[BatchObserver] = None, predictions: bool = False) -> dict[str, Any]:
    """Evaluate ``model`` on ``data`` (from :func:`resolve_cls_data`); returns the metrics.

    Returns ``top1_pct``, ``top5_pct`` (``None`` when the model scores 5 classes or fewer:
    top-5 is then 100% by definition), ``num_images`` (evaluated) and ``num_classes`` (of the
    data set). ``limit`` evaluates only the first N images. The model is moved to ``device``
    and left in eval mode there. ``work_dir`` receives the runner's log (a temporary folder,
    removed afterwards, when ``None``); no checkpoint is written. Non-finite logits raise
    :class:`~vitbench.errors.NonFiniteError` (naming the batch), a head that does not match the
    data's classes :class:`~vitbench.errors.DataError`. ``precision``: the forward's autocast
    (:mod:`vitbench.measure.precision`). ``workers``: loader worker processes (``--workers``;
    None: :func:`vitbench.data.workers.workers_for`'s default). ``eval_img_s`` is the evaluation's
    images per second end to end (loading, preprocessing and the model), counted from the end of
    its first batch (:func:`~vitbench.mm.hooks.steady_rate`). ``observe(features,
    images, labels)`` is called after every batch with the final features
    (:func:`vitbench.measure.ib.final_features`) the evaluation's own forward made, so the IB
    metric needs no pass of its own; a model whose family names no feature module raises
    :class:`~vitbench.errors.UnsupportedError` then. Under ``--launcher pytorch`` (a process group is
    running) every rank must call this with the same model: mmengine's ``DefaultSampler`` gives
    each rank its part of the images and the metrics are gathered over all of them, each image
    counted once (:mod:`vitbench.host.distributed`); an error on one rank (non-finite logits in its
    shard) is raised on every rank, naming that rank. ``predictions``: also ``top1_predictions``,
    each image's top-1 class in the data's order (a tuple; outside a process group only).
    """
    from mmengine.runner import Runner


    _positive("batch_size", batch_size)
    _positive("limit", limit, allow_none=True)
    try:
        target = torch.device(device)
    except RuntimeError as exc:
        raise ParamError(f"unknown device {device!r}; use cpu, cuda or cuda:N") from exc
    if target.type == "cuda" and not torch.cuda.is_available():
        raise ParamError(f"device {device!r} asked for but CUDA is not available; use --device cpu")

    check_class_count(model, data)
    cfg = input_config(model)
    classifier = build_classifier(model, mean=cfg.mean, std=cfg.std,
                                  to_rgb=data.bgr and cfg.in_chans == 3)
    n_out = getattr(model, "num_classes", None)
    topk = (1, 5) if not isinstance(n_out, int) or n_out > 5 else (1,)
    distributed.raise_if_any_rank_failed(None)  # meets a rank that failed earlier in the run (the Runner broadcasts)
    watcher = _Observe(observe) if observe is not None else None
    with work_dir_or_temp(work_dir) as wd, progress.steps("evaluating accuracy", unit="batches") as step, \
            contextlib.ExitStack() as stack:
        runner = Runner(**runner_kwargs(
            work_dir=wd, seed=seed, model=classifier,
            test_dataloader=loader_cfg(data.dataset_cfg(limit=limit), batch_size, False, workers=workers,
                                       device=target),
            test_evaluator=[_accuracy_metric(topk, None if work_dir is None else wd)],
            test_cfg={"type": "TestLoop"},
            custom_hooks=[counted := TestProgressHook(step)] + ([watcher.hook()] if watcher is not None else []),
        ))
        logits = _FiniteLogits(keep=predictions and not distributed.is_distributed())
        guard = model.register_forward_hook(logits)
        try:
            if watcher is not None:
                features = final_features_during(model, watcher.seen)
                if features is None:
                    raise UnsupportedError(f"{type(model).__name__} names no feature module: its final features "
                                           f"cannot be read during the evaluation")
                stack.enter_context(features)
            runner.model.to(target)  # the Runner puts the model on its own choice (cuda if any)
            with autocast_method(runner.model, "test_step", precision, target):  # the loop resets an outer one
                start = time.perf_counter()
                metrics = distributed.collective_test(runner)  # a rank's error is every rank's
                seconds = time.perf_counter() - start
            num_images = len(runner.test_dataloader.dataset)
            if not distributed.is_distributed() and counted.scored != num_images:  # a rank scores its shard only
                raise DataError(f"the evaluation scored {counted.scored} predictions for its {num_images} images: "
                                f"the model's forward changed the batch; no accuracy is reported for it")
        finally:
            guard.remove()
            release(runner)
    kept = {"top1_predictions": tuple(torch.cat(logits.top1).tolist())} if logits.top1 is not None else {}
    return {
        **kept,
        "top1_pct": float(metrics["accuracy/top1"]),
        "top5_pct": float(metrics["accuracy/top5"]) if 5 in topk else None,
        "num_images": int(num_images),
        "num_classes": int(data.num_classes),
        "eval_img_s": steady_rate(counted, num_images, start + seconds)
        or (num_images / seconds if seconds > 0 else None),
    }
