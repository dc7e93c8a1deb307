"""What the ``cls`` task (:class:`~vitbench.tasks.cls.task.ClsTask`) runs: load the model and data,
fit a new classifier head when asked, and per run spec fine-tune the model the executor reduced
when its method learns, evaluate top-1/top-5 with mmpretrain and measure (docs/measuring.md).
"""
from __future__ import annotations

import copy
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

import torch
from torch import nn

from vitbench import measure
from vitbench.measure.calibrate import prepared_as_trained
from vitbench.measure.overhead import has_limit, measure_overhead
from vitbench.measure.paired import PAIRED_ROUNDS
from vitbench.measure.sdpa_backend import sdpa_backends
from vitbench.catalog import WorkspaceRequest
from vitbench.engine import reduction_context
from vitbench.host.apply import check_applies
from vitbench.errors import ParamError, VitbenchError
from vitbench.measure.precision import autocast, trains_in
from vitbench.task import BASELINE, Workspace
from vitbench.tasks.cls import EMBEDDED_MODELS
from vitbench.tasks.common import TIMING_METRICS, Progress, attention_kernel, input_size_of, measure_timings
from vitbench.tasks.cls.weights_from import default_model_weights
from vitbench.tasks.identity import first_seed, weights_from
from vitbench.core.cache import atomic_write
from vitbench.core.params import params_dict, training_params
from vitbench.data.decoded import decode_once
from vitbench.data.workers import usable_cores
from vitbench.engine import token_rules
from vitbench.host import get_host
from vitbench.host.distributed import all_ranks, is_distributed, is_main
from vitbench.measure.ib import IBSamples, feature_source, measure_ib
from vitbench.measure.load import machine_load, wait_for_quiet
from vitbench.measure.speed import timing_doubt
from vitbench.report.measured_on import derive_measured_on
from vitbench.tasks.cls.data import resolve_cls_data
from vitbench.tasks.cls.evaluate import evaluate_cls
from vitbench.tasks.cls.head import fitted_head
from vitbench.tasks.models import load_model, resize_input
from vitbench.tasks.cls.weights_from import default_model_sha256
from vitbench.tasks.cls.finetune import finetune
from vitbench.train import load_trained, save_trained
from vitbench.train.batches import cls_batches, data_preprocessor, first_images
from vitbench.train.shipped import find_shipped, load_shipped

if TYPE_CHECKING:  # pragma: no cover
    from vitbench.host.spec import RunSpec

__all__ = ["ClsWorkspace", "cls_workspace", "run_cls_spec"]


#: the evaluation's batch per device type: on a CPU a batch of 128 runs a quarter slower per image than 32
EVAL_BATCH_SIZE = {"cpu": 32, "cuda": 128}


@dataclass
class ClsWorkspace(Workspace):
    """What the runs of one cls plan share: the unreduced model, its data and input size."""

    model: nn.Module
    input_size: tuple[int, int, int]
    data: Any = None  # a ClsData when accuracy is measured
    work_dir: Optional[Path] = None
    gmacs_images: int = 16
    eval_batch_size: int = 128
    eval_limit: Optional[int] = None
    throughput_repeats: int = 10
    latency_repeats: int = 20
    #: rounds of a method's speed-up timed in turn with the baseline (the report's speed-up column)
    paired_rounds: int = PAIRED_ROUNDS
    #: fine-tuned models are saved here (``<spec_id>.pth``) and reloaded on ``--resume``
    checkpoint_dir: Optional[Path] = None
    resume: bool = False
    verbose_training: bool = False
    #: how a new classifier head was fitted (``--num-classes``; :mod:`vitbench.tasks.cls.head`)
    head: Optional[dict] = None
    #: matched compute: one cached GMACs counter per seed (:func:`vitbench.run.execute.match_compute`)
    counters: dict = field(default_factory=dict)
    #: what every record of the plan was measured on (:mod:`vitbench.report.measured_on`)
    measured_on: dict = field(default_factory=dict)
    #: loader worker processes (``--workers``; None: :func:`vitbench.data.workers.workers_for`'s default)
    workers: Optional[int] = None
    #: images decoded into the decoded-image cache for this plan, not yet told in a record
    decoded_untold: int = 0
    #: each seed's baseline top-1 predictions, in the data's order, once its run evaluated them
    baseline_top1: dict = field(default_factory=dict)

    def record_fields(self) -> dict[str, Any]:
        """What every cls record carries, a failed run's too: the head fitted once (``--num-classes``)
        and what the plan measures on (a run's own record says how many images it evaluated)."""
        return {**({"head": self.head} if self.head is not None else {}), "measured_on": self.measured_on}

    def gmacs_of(self, spec: RunSpec, progress: Progress) -> Callable[[nn.Module], float]:
        """A reduced copy's GMACs on the images the report counts it on (matched compute,
        :mod:`vitbench.measure.calibrate`), its training stages' callbacks run first."""
        images = _gmacs_images(spec, self)
        return lambda model: measure.count_gmacs(prepared_as_trained(model, images).eval(), images).mean


def _eval_batches(ws: ClsWorkspace, model: nn.Module, device: str, limit: Optional[int] = None):  # type: ignore[no-untyped-def]
    n = ws.eval_limit if limit is None else (limit if ws.eval_limit is None else min(limit, ws.eval_limit))
    return cls_batches(ws.data.dataset_cfg(limit=n), data_preprocessor(model, ws.data.bgr),
                       device=device, batch_size=ws.eval_batch_size, workers=ws.workers)


def _ib_labels(ws: ClsWorkspace) -> Callable[[torch.Tensor], torch.Tensor]:
    """Labels 0..K-1 over the data's K classes for the IB metric: ImageNet synset folders carry
    labels in the 1000-class space, and the IB clusters are the classes present (docs/methods.md,
    "The IB loss"), not 1000 mostly empty ones."""
    used = sorted(set((ws.data.dataset.get("label_map") or {}).values()))
    if not used or used == list(range(ws.data.num_classes)):
        return lambda labels: labels
    index = torch.full((max(used) + 1,), -1, dtype=torch.long)
    index[used] = torch.arange(len(used))
    return lambda labels: index[labels.cpu()].to(labels.device)


def _ib_batches(ws: ClsWorkspace, model: nn.Module, device: str):  # type: ignore[no-untyped-def]
    """Evaluation batches for the IB metric, labelled as :func:`_ib_labels` says."""
    relabel = _ib_labels(ws)
    return ((images, relabel(labels)) for images, labels in _eval_batches(ws, model, device)())


def _first_eval_images(ws: ClsWorkspace, n: int) -> Optional[torch.Tensor]:
    """The first ``n`` evaluation images as the model takes them (None without data)."""
    if ws.data is None:
        return None

    return first_images(_eval_batches(ws, ws.model, "cpu", n), n)


def _gmacs_images(spec: RunSpec, ws: ClsWorkspace) -> torch.Tensor:
    """The images GMACs are counted on: the first evaluation images when there is data (input-
    dependent methods are averaged over real images, docs/measuring.md), else seeded noise."""
    images = _first_eval_images(ws, ws.gmacs_images)
    if images is not None:
        return images
    gen = torch.Generator().manual_seed(spec.seed)
    return torch.randn(ws.gmacs_images, *ws.input_size, generator=gen)


#: the most evaluation images a timing batch holds; a larger batch takes them again in turn
TIMING_IMAGES = 256


def _timing_images(spec: RunSpec, ws: ClsWorkspace) -> Optional[torch.Tensor]:
    """The images every timing runs on: the first evaluation images, as many as the largest timed
    batch (at most :data:`TIMING_IMAGES`), so that an input-dependent method (PPT's per-image
    choice, ATS's and LTMP's token counts) is timed choosing as it does on data; None (seeded
    noise) without data."""
    if not any(m in spec.metrics for m in TIMING_METRICS):
        return None
    largest = max([spec.batch_size, *(getattr(spec, "batch_sizes", None) or ())])
    return _first_eval_images(ws, min(largest, TIMING_IMAGES))


def shipped_settings(spec: RunSpec, values: Any) -> dict[str, Any]:
    """What a run's fine-tuning depends on, as shipped weights record it (:mod:`vitbench.train.shipped`);
    ``values`` the run's parameter dataclass (a matched knob set)."""
    method = get_host().method(spec.method)
    return {"model": spec.model,
            "model_sha256": default_model_sha256(spec.model) if spec.model in EMBEDDED_MODELS and not spec.weights
            else spec.weights,
            "method": method.name, "params": dict(sorted(training_params(method.params, params_dict(values)).items())),
            "train_limit": spec.train_limit, "train_backbone": spec.train_backbone, "seed": spec.seed,
            "precision": trains_in(spec.precision_name), "data": spec.data}


def _load_shipped(spec: RunSpec, model: nn.Module, values: Any, progress: Progress) -> Optional[dict[str, Any]]:
    """Load the method's shipped weights when the run's settings equal theirs; what the record
    says of them, or ``None`` (the run fine-tunes)."""
    entry = find_shipped(get_host().method(spec.method).weights, shipped_settings(spec, values))
    if entry is None:
        return None
    progress(f"loading the shipped fine-tuned weights {entry.path.name} ({entry.trained})")
    load_shipped(model, entry)
    meta = entry.meta
    return {"trained": "shipped", "shipped_weights": entry.path.name, "shipped_sha256": entry.sha256,
            "shipped_trained": entry.trained,
            **{k: meta[k] for k in ("train_s", "train_images", "trainable_params", "train_stages") if k in meta}}


def _train(spec: RunSpec, ws: ClsWorkspace, model: nn.Module, progress: Progress) -> dict[str, Any]:
    """Fine-tune a learnable method (or load its shipped weights when the run's settings equal
    theirs, or reload its checkpoint on ``--resume``). Under a launcher
    every rank fine-tunes (DDP, :mod:`vitbench.tasks.cls.finetune`), the ranks reload a checkpoint
    only when every one of them finds it (a decision they take together), and rank 0 alone
    writes it."""
    path = ws.checkpoint_dir / f"{spec.spec_id}.pth" if ws.checkpoint_dir else None
    if all_ranks(ws.resume and path is not None and path.is_file()):
        progress(f"loading the fine-tuned checkpoint {path}")
        load_trained(model, path)
        return {"trained": "checkpoint", "checkpoint_path": str(path)}
    shipped = _load_shipped(spec, model, reduction_context(model).params, progress)
    if shipped is not None:
        return shipped
    if ws.data is None:
        raise VitbenchError(f"{spec.method} needs training data to fine-tune: pass --data PATH "
                            f"(with a train/ split) or use the default model")
    result = finetune(model, ws.data, train_backbone=spec.train_backbone, limit=spec.train_limit,
                      device=spec.device, seed=spec.seed, verbose=ws.verbose_training,
                      work_dir=ws.work_dir / spec.spec_id / "train" if ws.work_dir else None,
                      progress=progress, precision=trains_in(spec.precision_name), workers=ws.workers)
    out: dict[str, Any] = {"trained": "fine-tuned", "train_precision": trains_in(spec.precision_name),
                           "train_s": result.seconds,
                           "train_images": result.train_images,
                           "trainable_params": result.trainable_params, "train_stages": result.stages}
    if path is not None:
        if is_main():  # the ranks' weights are the same (DDP); one writer
            save_trained(model, path)
        out["checkpoint_path"] = str(path)
    return out


def _accuracy(spec: RunSpec, ws: ClsWorkspace, model: nn.Module, progress: Progress,
              ib: Optional[IBSamples] = None) -> dict[str, Any]:
    """Top-1/top-5 when ``accuracy`` is measured (a collective evaluation under ``--launcher
    pytorch``: every rank scores its part of the data, every rank gets the metrics); ``ib``
    gathers the IB metric's samples from the same forwards."""
    if "accuracy" not in spec.metrics:
        return {}

    timed = any(m in spec.metrics for m in TIMING_METRICS)  # its end-to-end speed is then a timing too
    load = _quiet_load("the timed evaluation") if timed else None
    progress("evaluating accuracy" + (" (and the IB metric's features)" if ib is not None else ""))
    relabel = _ib_labels(ws) if ib is not None else None
    reduced = reduction_context(model) is not None
    traced = token_rules.token_rules_traced(model, spec.method) if reduced else nullcontext()
    with traced:  # every scored step keeps the token rules (docs/measuring.md); a broken one is the run's error
        acc = evaluate_cls(model, ws.data, batch_size=ws.eval_batch_size, device=spec.device,
                           limit=ws.eval_limit, seed=spec.seed, precision=spec.precision_name, workers=ws.workers,
                           work_dir=ws.work_dir / spec.spec_id if ws.work_dir else None,
                           observe=(lambda f, x, y: ib.add(f, x, relabel(y))) if ib is not None else None,
                           predictions=True)
    out = {k: acc.get(k) for k in ("top1_pct", "top5_pct", "num_images", "num_classes")}
    out.update(_agreement(spec, ws, acc.get("top1_predictions")))
    if load is not None:  # a speed only where timing was asked for, with the load it started under
        out.update(eval_img_s=acc.get("eval_img_s"), eval_batch_size=ws.eval_batch_size, **load)
    return out


def _quiet_load(what: str) -> dict[str, Any]:
    """Wait for a quiet machine (inside a run), then the load the evaluation starts under and why
    its end-to-end speed is not to be trusted: the load before only (the evaluation's own loader
    workers raise the load after it)."""
    waited = wait_for_quiet(what)
    before = machine_load()
    return {"eval_load_before": before.load_1min, "eval_cores": before.cores,
            "eval_flag_reason": timing_doubt(None, None, before.load_1min, None, before.cores),
            **({"eval_waited_s": round(waited, 1)} if waited else {})}


def _baseline_top1_file(spec: RunSpec, ws: ClsWorkspace) -> Optional[Path]:
    """Where the baseline of ``spec``'s seed keeps its predictions: named by what decides them
    (the model, seed, precision and what the workspace measures on), so that an ``--isolate``
    child and a ``--resume`` find them."""
    import hashlib
    import json

    if ws.work_dir is None:
        return None
    key = json.dumps([spec.model, spec.seed, spec.precision_name, ws.measured_on], sort_keys=True, default=str)
    return ws.work_dir / "baseline-top1" / f"{hashlib.sha1(key.encode()).hexdigest()[:16]}.json"


def _agreement(spec: RunSpec, ws: ClsWorkspace, top1: Optional[tuple[int, ...]]) -> dict[str, Any]:
    """Agreement with the unreduced model ("loyalty"): the share of evaluation images whose top-1
    class equals the baseline's of the same seed (same weights, same images), in %. The baseline's
    run keeps its predictions (in the workspace and, for ``--resume`` and ``--isolate``, in the work
    folder); a row without them (a process group, a baseline that never evaluated) has none."""
    import json

    path = _baseline_top1_file(spec, ws)
    if top1 is None:
        return {}
    if spec.method == BASELINE:
        ws.baseline_top1[spec.seed] = top1
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(path, lambda tmp: tmp.write_text(json.dumps(top1)))
        return {}
    base = ws.baseline_top1.get(spec.seed)
    if base is None and path is not None and path.is_file():
        base = ws.baseline_top1[spec.seed] = tuple(json.loads(path.read_text()))
    if base is None or len(base) != len(top1):
        return {}
    same = sum(a == b for a, b in zip(top1, base))
    return {"agreement_pct": 100.0 * same / len(top1)}


def _measure(spec: RunSpec, ws: ClsWorkspace, model: nn.Module, progress: Progress) -> dict[str, Any]:

    if not is_main():  # --launcher pytorch: the other ranks take part in the evaluation only
        return _accuracy(spec, ws, model.to(spec.device), progress)
    out: dict[str, Any] = {"attention_kernel": attention_kernel(model), "batch_size": spec.batch_size}
    device, precision = spec.device, spec.precision_name
    model.to(device)
    # the collective evaluation first: whatever fails in rank 0's own measurements below then
    # fails after every rank left the evaluation, and the executor's barrier still pairs up
    samples = _shared_ib_samples(spec, ws, model)
    out.update(_accuracy(spec, ws, model, progress, samples))
    if "gmacs" in spec.metrics:
        progress("counting GMACs")
        images = _gmacs_images(spec, ws)
        result = measure.count_gmacs(model, images, what="counting GMACs")
        out.update(gmacs=result.mean, gmacs_std=result.std, gmacs_images=result.n,
                   gmacs_on="evaluation images" if ws.data is not None else "random images")
    if "params" in spec.metrics:
        out["params_m"] = measure.count_params_m(model)
    if "ib" in spec.metrics and ws.data is not None:
        if samples is not None:
            ib = samples.terms(ws.data.num_classes)  # from the accuracy pass's forwards
        else:
            progress("measuring IB loss and bound")

            with autocast(precision, device):
                ib = measure_ib(model, _ib_batches(ws, model, device), ws.data.num_classes, device=device)
        out.update(ib_loss=float(ib.loss), ib_bound=float(ib.bound),
                   ib_input_constant=float(ib.input_constant))
    # eager, --compile's or --cuda-graph's; a method's speed-up timed in turn with the unreduced model
    paired = spec.method != BASELINE and "throughput" in spec.metrics
    unreduced = copy.deepcopy(ws.model).to(device) if paired else None
    images = _timing_images(spec, ws)
    if any(m in spec.metrics for m in TIMING_METRICS):  # which fused kernel the timed forwards run
        probe = images[:spec.batch_size] if images is not None else torch.randn(spec.batch_size, *ws.input_size)
        out["sdpa_backend"] = sdpa_backends(model, probe, precision)
    out.update(measure_timings(spec, model, ws.input_size, progress, throughput_repeats=ws.throughput_repeats,
                               latency_repeats=ws.latency_repeats, paired_rounds=ws.paired_rounds,
                               baseline=unreduced, images=images))
    if out.get("speedup_paired") and _reduces_tokens(spec) and has_limit(ws.model):
        progress(f"timing the method against its token counts' limit (batch {spec.batch_size})")
        try:
            out.update(measure_overhead(model, unreduced, spec.batch_size, ws.input_size, device=device,
                                        method_ms=1000.0 * spec.batch_size / out["throughput_img_s"],
                                        rounds=spec.repeats or ws.throughput_repeats, precision=precision,
                                        images=images))
        except ParamError as exc:  # counts the limit cannot run (a plugin's own block layout): no column
            out["overhead_skipped"] = str(exc)
    return out


def _reduces_tokens(spec: RunSpec) -> bool:
    """Whether ``spec``'s method reduces tokens (merging, pruning, both, or a control that drops
    them), so that its own time is its forward's beyond the token-count limit's."""
    return get_host().method(spec.method).kind in ("merging", "pruning", "hybrid", "control")


def _shared_ib_samples(spec: RunSpec, ws: ClsWorkspace, model: nn.Module) -> Optional[IBSamples]:
    """Where the IB metric can read the accuracy pass's own forwards (one process, accuracy
    measured, a model whose family names its feature module): an empty :class:`IBSamples` for it."""
    shared = ("ib" in spec.metrics and "accuracy" in spec.metrics and ws.data is not None
              and not is_distributed() and feature_source(model) is not None)
    return IBSamples() if shared else None


def run_cls_spec(spec: RunSpec, ws: ClsWorkspace, model: nn.Module, progress: Progress) -> dict[str, Any]:
    """Everything one cls spec measures of ``model``, the copy the executor reduced (raises on
    failure; the executor records it): fine-tuned when its method trains, then measured."""
    out: dict[str, Any] = {}
    if spec.method != BASELINE:
        context = reduction_context(model)
        if context is not None and context.reduction is not None and context.reduction.train:
            out.update(_train(spec, ws, model, progress))

        # a broken rule is an error, not a row: one forward of 4 images, the model kept as it was
        token_rules.check_token_rules(model, _gmacs_images(spec, ws))
    out.update(_measure(spec, ws, model.eval(), progress))
    if spec.method != BASELINE:  # and again after every timed forward: a step that changes as it runs
        token_rules.check_token_rules(model, _gmacs_images(spec, ws))

    out["input_size"] = list(ws.input_size)  # the image size the reports name beside the data
    if ws.data is not None and ws.data.layout:  # how a folder was read: its layout and class count
        out["data_layout"] = ws.data.layout
    out["measured_on"] = derive_measured_on({"data": spec.data, "head": ws.head, "num_images": out.get("num_images")},
                                            limit=spec.limit, weights=spec.weights, data_id=spec.data_id,
                                            img_size=spec.img_size)
    out["weights_from"] = weights_from(spec, default_model_weights(spec.model) if spec.model in EMBEDDED_MODELS else None)
    if ws.data is not None and ws.data.decoded is not None:  # the first record tells what the plan decoded
        out["images_decoded"], ws.decoded_untold = ws.decoded_untold, 0
    return out


def cls_workspace(request: WorkspaceRequest, reads_data: bool) -> ClsWorkspace:
    """What the runs of a cls plan share (:meth:`vitbench.tasks.cls.task.ClsTask.workspace`): the model
    (the default one is trained once and cached), every method checked to apply, the data when the
    plan ``reads_data`` (accuracy is measured or a method trains), a new head fitted when asked."""
    options, setup, plan = request.options, request.setup, request.plan
    request.note(f"loading model {setup.model}")
    model = load_model(setup.model, pretrained=options.pretrained, checkpoint=options.checkpoint,
                       num_classes=options.num_classes, seed=first_seed(options))  # random: the first seed
    if setup.plan.get("img_size") is not None:
        model = resize_input(model, setup.plan["img_size"])
    check_applies(plan, model, isolated=options.isolated)
    cls_data, decoded = None, 0
    if reads_data:
        cls_data = resolve_cls_data(setup.data, model)  # a head of another class count is refused here
        if setup.plan.get("data_id"):  # a folder: decoded once, read by every run of the plan
            cls_data, decoded = _decoded(cls_data, setup.plan["data_id"], options, request.note)
    out = request.out
    out.mkdir(parents=True, exist_ok=True)
    head = None
    if cls_data is not None and getattr(model, "vitbench_new_head", False):
        head = fitted_head(model, cls_data, out / "checkpoints", model_name=setup.model,
                           limit=setup.plan.get("train_limit"), device=options.device,
                           progress=request.note).record()

    measured_on = derive_measured_on({"data": setup.data, "head": head}, limit=setup.plan.get("limit"),
                                     data_id=setup.plan.get("data_id"),
                                     weights=setup.plan.get("weights"), img_size=setup.plan.get("img_size"))
    return ClsWorkspace(model=model, input_size=input_size_of(model), data=cls_data, work_dir=out / "work",
                        eval_limit=options.limit, checkpoint_dir=out / "checkpoints", resume=request.resume,
                        eval_batch_size=EVAL_BATCH_SIZE[str(options.device).split(":")[0]],
                        head=head, measured_on=measured_on, workers=options.workers,
                        decoded_untold=decoded if cls_data is not None and cls_data.decoded else 0)


def _decoded(data: Any, data_id: str, options: Any, note: Callable[[str], None]) -> tuple[Any, int]:
    """``data`` reading its evaluation images from the decoded-image cache (filled now unless an
    entry exists; :mod:`vitbench.data.decoded`), and how many images were decoded now."""
    import dataclasses

    workers = options.workers if options.workers is not None else min(8, usable_cores())  # nothing else runs yet
    cfg, decoded = decode_once(data.dataset_cfg(limit=options.limit), data_id, workers=workers, note=note)
    if cfg is None:
        return data, 0
    note(f"evaluation images: decoded now ({decoded})" if decoded else
         "evaluation images: read from the decoded-image cache (decoded by an earlier run)")
    return dataclasses.replace(data, decoded=cfg), decoded
