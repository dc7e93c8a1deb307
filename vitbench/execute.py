"""Executes a run plan: each spec reduces a fresh copy of the model, measures it, and appends
one record to the store as it ends (docs/architecture.md, layers 5-7).

A run that fails is recorded as ``error`` with its message and the other runs go on; records
are appended whole, so an interrupted plan never leaves a half-written result, and
``--resume`` skips finished specs and retries failed ones.
"""
from __future__ import annotations

import copy
import random
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import torch
from torch import nn

from vitbench import measure
from vitbench.engine import apply, reduction_context
from vitbench.calibrate import Calibration, GmacsCounter, calibrate, not_matchable, off_pct, prepared_as_trained
from vitbench.errors import VitbenchError
from vitbench.measure.precision import autocast, trains_in
from vitbench.plan import BASELINE, DENSE_TASKS, REFERENCES, RunSpec
from vitbench.plugins import get_host
from vitbench.results import ResultStore

Progress = Callable[[str], None]


@dataclass
class Workspace:
    """What the runs of one plan share: the unreduced model, its data and input size."""

    model: nn.Module
    input_size: tuple[int, int, int]
    data: Any = None  # a ClsData when accuracy is measured
    work_dir: Optional[Path] = None
    gmacs_images: int = 16
    eval_batch_size: int = 128
    eval_limit: Optional[int] = None
    throughput_repeats: int = 10
    latency_repeats: int = 20
    #: fine-tuned models are saved here (``<spec_id>.pth``) and reloaded on ``--resume``
    checkpoint_dir: Optional[Path] = None
    resume: bool = False
    verbose_training: bool = False
    #: how a new classifier head was fitted (``--num-classes``; :mod:`vitbench.tasks.cls.head`)
    head: Optional[dict] = None
    #: matched compute: one cached GMACs counter per seed (:func:`match_compute`)
    counters: dict = field(default_factory=dict)


def input_size_of(model: nn.Module) -> tuple[int, int, int]:
    """``(channels, height, width)`` a timm model takes: a ViT's patch embedding, else (hybrids)
    the size the family adapter describes it at (``vitbench_input_size``) or timm's config."""
    embed = getattr(model, "patch_embed", None)
    if embed is not None and getattr(embed, "img_size", None) is not None:
        return (int(embed.proj.in_channels), int(embed.img_size[0]), int(embed.img_size[1]))
    cfg = getattr(model, "pretrained_cfg", None) or {}
    c, h, w = cfg.get("input_size", (3, 224, 224))
    h, w = getattr(model, "vitbench_input_size", None) or (h, w)
    return (int(c), int(h), int(w))


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def attention_kernel(model: nn.Module) -> str:
    """Which attention kernel each block ran (docs/measuring.md: baseline and method must match)."""
    if not hasattr(model, "blocks"):  # hybrids: conv stages around their attention blocks
        from vitbench.engine.block import ReducingBlock

        reducing = [m for m in model.modules() if isinstance(m, ReducingBlock)]
        if not reducing:
            return "timm default"
        unfused = [blk.index for blk in reducing if not blk.fused]
        return "fused (SDPA)" if not unfused else "unfused in blocks " + ",".join(map(str, unfused))
    if reduction_context(model) is not None:
        unfused = [blk.index for blk in model.blocks if not blk.fused]
    else:
        unfused = [i for i, blk in enumerate(model.blocks) if not getattr(blk.attn, "fused_attn", False)]
    if not unfused:
        return "fused (SDPA)"
    if len(unfused) == len(model.blocks):
        return "unfused (explicit softmax)"
    return "fused (SDPA); unfused in blocks " + ",".join(str(i) for i in unfused)


def _eval_batches(ws: Workspace, model: nn.Module, device: str, limit: Optional[int] = None):  # type: ignore[no-untyped-def]
    from vitbench.tasks.cls.batches import cls_batches, data_preprocessor

    n = ws.eval_limit if limit is None else (limit if ws.eval_limit is None else min(limit, ws.eval_limit))
    return cls_batches(ws.data.dataset_cfg(limit=n), data_preprocessor(model, ws.data.bgr),
                       device=device, batch_size=ws.eval_batch_size)


def _ib_batches(ws: Workspace, model: nn.Module, device: str):  # type: ignore[no-untyped-def]
    """Evaluation batches for the IB metric with labels 0..K-1 over the data's K classes: ImageNet
    synset folders carry labels in the 1000-class space, and the IB clusters are the classes
    present (docs/methods.md §6), not 1000 mostly empty ones."""
    used = sorted(set((ws.data.dataset.get("label_map") or {}).values()))
    batches = _eval_batches(ws, model, device)()
    if not used or used == list(range(ws.data.num_classes)):
        return batches
    index = torch.full((max(used) + 1,), -1, dtype=torch.long)
    index[used] = torch.arange(len(used))
    return ((images, index[labels.cpu()].to(labels.device)) for images, labels in batches)


def _gmacs_images(spec: RunSpec, ws: Workspace) -> torch.Tensor:
    """The images GMACs are counted on: the first evaluation images when there is data (input-
    dependent methods are averaged over real images, docs/measuring.md), else seeded noise."""
    if ws.data is not None:
        from vitbench.tasks.cls.batches import first_images

        images = first_images(_eval_batches(ws, ws.model, "cpu", ws.gmacs_images), ws.gmacs_images)
        if images is not None:
            return images
    gen = torch.Generator().manual_seed(spec.seed)
    return torch.randn(ws.gmacs_images, *ws.input_size, generator=gen)


def _cls_counter(spec: RunSpec, ws: Workspace) -> GmacsCounter:
    """Counts a reduced copy of the workspace's model on the images the report counts it on."""
    images = _gmacs_images(spec, ws)

    def count(method: Optional[str], params: dict[str, Any]) -> float:
        model = copy.deepcopy(ws.model)
        if method is not None:
            model = prepared_as_trained(apply(model, method, **params), images)
        return measure.count_gmacs(model.eval(), images).mean

    return GmacsCounter(count)


def match_compute(spec: RunSpec, ws: Any, progress: Progress) -> Calibration:
    """Choose ``spec``'s budget knob so that its GMACs land at ``spec.match_gmacs`` x the
    baseline's, counted as the report counts them (det/seg: the backbone's GMACs, the part the
    methods reduce). Raises :class:`~vitbench.errors.BudgetError` when it cannot."""
    method = get_host().method(spec.method)
    knob = method.budget
    if knob is None:  # before counting anything: a det/seg counter trains the detector first
        raise not_matchable(spec.method)
    counters = ws.counters
    if spec.seed not in counters:
        if spec.task in DENSE_TASKS:
            from vitbench.tasks.det.run import dense_gmacs_counter

            counters[spec.seed] = dense_gmacs_counter(ws, spec.seed, progress)
        else:
            counters[spec.seed] = _cls_counter(spec, ws)
    how = "setting" if knob.mode == "fraction" else "searching"
    progress(f"{how} {spec.method}.{knob.param} for {spec.match_gmacs:g}x the baseline's GMACs")
    info = get_host().family_of(ws.model).describe(ws.model)
    result = calibrate(method, spec.params, spec.match_gmacs, counters[spec.seed], info)
    if result.calibrated_gmacs is not None:
        progress(f"{result.param}={result.value}: {result.calibrated_gmacs:.4g} GMACs, "
                 f"{off_pct(result.calibrated_gmacs, result.target_gmacs):+.2f} % from the target "
                 f"{result.target_gmacs:.4g} ({result.counts} settings evaluated)")
    return result


def _landed(spec: RunSpec, record: dict[str, Any]) -> None:
    """Where a matched run's measured GMACs landed against its target (after any fine-tuning)."""
    budget = record.get("budget")
    gmacs = record.get("backbone_gmacs" if spec.task in DENSE_TASKS else "gmacs")
    if not budget or gmacs is None:
        return
    off = off_pct(gmacs, budget["target_gmacs"])
    budget.update(counted="backbone" if spec.task in DENSE_TASKS else "model", landed_gmacs=gmacs,
                  landed_off_pct=off, landed_within=abs(off) <= budget["tolerance_pct"])


def _train(spec: RunSpec, ws: Workspace, model: nn.Module, progress: Progress) -> dict[str, Any]:
    """Fine-tune a learnable method (or reload its checkpoint on ``--resume``)."""
    from vitbench.train import finetune, load_trained, save_trained

    path = ws.checkpoint_dir / f"{spec.spec_id}.pth" if ws.checkpoint_dir else None
    if ws.resume and path is not None and path.is_file():
        progress(f"loading the fine-tuned checkpoint {path}")
        load_trained(model, path)
        return {"trained": "checkpoint", "checkpoint_path": str(path)}
    if ws.data is None:
        raise VitbenchError(f"{spec.method} needs training data to fine-tune: pass --data PATH "
                            f"(with a train/ split) or use the default model")
    result = finetune(model, ws.data, train_backbone=spec.train_backbone, limit=spec.train_limit,
                      device=spec.device, seed=spec.seed, verbose=ws.verbose_training,
                      work_dir=ws.work_dir / spec.spec_id / "train" if ws.work_dir else None,
                      progress=progress, precision=trains_in(spec.precision_name))
    out: dict[str, Any] = {"trained": "fine-tuned", "train_precision": trains_in(spec.precision_name),
                           "train_s": result.seconds,
                           "train_images": result.train_images,
                           "trainable_params": result.trainable_params, "train_stages": result.stages}
    if path is not None:
        save_trained(model, path)
        out["checkpoint_path"] = str(path)
    return out


def _measure(spec: RunSpec, ws: Workspace, model: nn.Module, baseline: Optional[dict],
             progress: Progress) -> dict[str, Any]:
    out: dict[str, Any] = {"attention_kernel": attention_kernel(model), "batch_size": spec.batch_size}
    device, precision = spec.device, spec.precision_name
    if "gmacs" in spec.metrics:
        progress("counting GMACs")
        images = _gmacs_images(spec, ws)
        result = measure.count_gmacs(model, images)
        out.update(gmacs=result.mean, gmacs_std=result.std, gmacs_images=result.n,
                   gmacs_on="evaluation images" if ws.data is not None else "random images")
    if "params" in spec.metrics:
        out["params_m"] = measure.count_params_m(model)
    model.to(device)
    if "accuracy" in spec.metrics:
        from vitbench.tasks.cls.evaluate import evaluate_cls

        progress("evaluating accuracy")
        acc = evaluate_cls(model, ws.data, batch_size=ws.eval_batch_size, device=device,
                           limit=ws.eval_limit, seed=spec.seed, precision=precision,
                           work_dir=ws.work_dir / spec.spec_id if ws.work_dir else None)
        out.update({k: acc.get(k) for k in ("top1_pct", "top5_pct", "num_images", "num_classes")})
    timed = timed_model(spec, model, ws.input_size, progress)  # the eager model, or --compile's
    out.update(timed.record())
    if "throughput" in spec.metrics:
        progress(f"timing throughput (batch {spec.batch_size})")
        tp = measure.measure_throughput(timed.module, spec.batch_size, ws.input_size, device=device,
                                        repeats=ws.throughput_repeats, precision=precision)
        out.update(tp.fields())  # median, spread and the load/cores/threads it ran under
    if "latency" in spec.metrics:
        progress("timing latency (batch 1)")
        lat = measure.measure_latency(timed.module, ws.input_size, device=device, repeats=ws.latency_repeats,
                                      precision=precision)
        out.update(lat.fields())
    if "ib" in spec.metrics and ws.data is not None:
        progress("measuring IB loss and bound")
        from vitbench.measure.ib import measure_ib

        with autocast(precision, device):
            ib = measure_ib(model, _ib_batches(ws, model, device), ws.data.num_classes, device=device)
        out.update(ib_loss=float(ib.loss), ib_bound=float(ib.bound),
                   ib_input_constant=float(ib.input_constant))
    if "memory" in spec.metrics:
        progress("measuring peak memory")
        out["peak_mem_mb"] = measure.measure_peak_memory(timed.module, spec.batch_size, ws.input_size,
                                                         device=device, precision=precision)
    return out


def timed_model(spec: RunSpec, model: nn.Module, input_size: tuple[int, int, int], progress: Progress) -> Any:
    """What the timing loops run: ``model``, or with ``--compile`` the ``torch.compile``d model
    (compiled here for the loops' batch sizes; a model that does not compile is timed eagerly,
    the reason recorded: :mod:`vitbench.measure.compiled`)."""
    from vitbench.measure.compiled import CompiledForTiming, compile_for_timing

    timings = [m for m in ("throughput", "latency", "memory") if m in spec.metrics]
    if not spec.compile or not timings:
        return CompiledForTiming(model, False)
    progress("compiling the model for the timings (torch.compile)")
    batches = tuple(1 if m == "latency" else spec.batch_size for m in timings)
    timed = compile_for_timing(model, input_size, batches, spec.device, spec.precision_name)
    if timed.fallback:
        progress(timed.fallback)
    return timed


def _relative(spec: RunSpec, out: dict[str, Any], baseline: Optional[dict]) -> dict[str, Any]:
    """Speed-up and efficiency against the plan's baseline (docs/measuring.md)."""
    if spec.method == BASELINE:
        if out.get("throughput_img_s"):
            out.update(speedup=1.0, efficiency=1.0 if out.get("gmacs") else None)
    elif baseline and baseline.get("throughput_img_s") and out.get("throughput_img_s"):
        out["speedup"] = measure.speedup(out["throughput_img_s"], baseline["throughput_img_s"])
        if baseline.get("gmacs") and out.get("gmacs"):
            out["efficiency"] = measure.efficiency(out["speedup"], baseline["gmacs"], out["gmacs"])
    return out


def run_spec(spec: RunSpec, ws: Any, baseline: Optional[dict], env: dict[str, Any],
             progress: Progress) -> dict[str, Any]:
    """Run one spec and return its record (status ``ok`` or ``error``, never raising)."""
    started = time.perf_counter()
    record: dict[str, Any] = {
        "spec_id": spec.spec_id, "task": spec.task, "model": spec.model, "data": spec.data,
        "method": spec.method, "label": spec.label, "params": spec.params, "seed": spec.seed, "status": "ok",
        "error": None, "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    if spec.match_gmacs is not None:
        record["match_gmacs"] = spec.match_gmacs
    record["precision"] = spec.precision_name
    try:
        seed_everything(spec.seed)
        params = spec.params
        if spec.match_gmacs is not None and spec.method not in REFERENCES:
            matched = match_compute(spec, ws, progress)
            params = matched.params
            record.update(params=params, label=spec.matched_label(params), budget=matched.record())
            seed_everything(spec.seed)  # the search must not change what the run draws
        if spec.task in DENSE_TASKS:
            from vitbench.tasks.det.run import run_dense_spec

            record.update(_relative(spec, run_dense_spec(spec, ws, baseline, progress, params=params), baseline))
        else:
            if ws.head is not None:
                record["head"] = ws.head
            model = copy.deepcopy(ws.model)
            if spec.method != BASELINE:
                progress("applying the method")
                model = apply(model, spec.method, **params)
                context = reduction_context(model)
                if context is not None and context.reduction is not None and context.reduction.train:
                    record.update(_train(spec, ws, model, progress))
            record.update(_relative(spec, _measure(spec, ws, model.eval(), baseline, progress), baseline))
        _landed(spec, record)
    except VitbenchError as exc:
        record.update(status="error", error=str(exc))
    except Exception as exc:  # noqa: BLE001 - one failed run must not take the others down
        record.update(status="error", error=f"{type(exc).__name__}: {exc}")
    record["finished_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    record["wall_s"] = round(time.perf_counter() - started, 3)
    record["env"] = env
    return record


def execute_plan(plan: list[RunSpec], ws: Workspace, store: ResultStore, *, resume: bool,
                 env: dict[str, Any], progress: Callable[[int, int, str, str], None]) -> list[dict]:
    """Run every spec of ``plan`` in order, appending each record to ``store`` as it ends.

    Speed-up and efficiency pair each method run with the baseline of the same seed (a plan
    with ``--seeds`` holds one baseline per seed); on ``--resume`` a finished baseline of the
    store serves its seed."""
    host = get_host()
    latest = store.latest() if resume else {}
    finished = store.finished_ids() if resume else set()
    baselines: dict[int, dict] = {}  # seed -> that seed's successful baseline record
    for spec in plan:
        if spec.method == BASELINE and spec.spec_id in finished and latest[spec.spec_id]["status"] == "ok":
            baselines[spec.seed] = latest[spec.spec_id]
    records = []
    for i, spec in enumerate(plan, start=1):
        if spec.spec_id in finished:
            progress(i, len(plan), spec.label, "already finished (resume): skipped")
            records.append(latest[spec.spec_id])
            continue
        host.run_started(spec)
        record = run_spec(spec, ws, baselines.get(spec.seed), env,
                          lambda what: progress(i, len(plan), spec.label, what))
        store.append(record)
        host.run_finished(spec, record)
        if spec.method == BASELINE and record["status"] == "ok":
            baselines[spec.seed] = record
        outcome = "done" if record["status"] == "ok" else f"FAILED: {record['error']}"
        progress(i, len(plan), spec.label, f"{outcome} ({record['wall_s']:.1f} s)")
        records.append(record)
    return records
