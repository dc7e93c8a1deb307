"""One ``det``/``seg`` run spec: put the backbone the executor reduced in the trained detector,
fine-tune a learnable method on the detection loss, measure (docs/measuring.md).

As in ``cls``, the baseline detector is trained once (:func:`trained_weights`, cached) and
every run's reduced backbone goes into it; learnable methods fine-tune under the dense
fine-tuning protocol (:mod:`vitbench.tasks.dense.protocol`). Measured: box (and mask)
mAP/AP50/AP75 with CocoMetric; GMACs of the whole detector and of the backbone alone;
parameters; throughput, latency and peak memory of the detector's tensor forward (no NMS).
Under a launcher every rank trains and evaluates together; a detector trained on N ranks is
cached under its own key (:meth:`DenseWorkspace.weights_key`); rank 0 alone counts and times."""
from __future__ import annotations

import contextlib
import copy
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import torch
from torch import nn

from vitbench import measure
from vitbench.core.cache import atomic_write, cache_lock
from vitbench.engine import reduction_context
from vitbench.measure.precision import trains_in
from vitbench.errors import VitbenchError
from vitbench.tasks.common import measure_timings
from vitbench.tasks.dense.data import DetData
from vitbench.tasks.dense.detectors import MEAN, STD, build_detector
from vitbench.engine import token_rules
from vitbench.host import distributed
from vitbench.measure.calibrate import prepared_as_trained
from vitbench.task import CONTROL, Workspace
from vitbench.tasks.models import load_checkpoint
from vitbench.tasks.dense.backbone import is_plain_vit
from vitbench.tasks.dense.evaluate import evaluate_detector, first_val_images
from vitbench.tasks.dense.protocol import DEFAULT_PROTOCOL, dense_finetune_for
from vitbench.tasks.dense.schedule import schedule_for
from vitbench.tasks.dense.train import finetune_control, finetune_method, train_detector
from vitbench.tasks.embedded import load_embedded_model
from vitbench.tasks.identity import weights_from
from vitbench.tasks.model_names import unknown_model

Progress = Callable[[str], None]
TRAIN_BATCH = 8


@dataclass
class DenseWorkspace(Workspace):
    """What the runs of one det/seg plan share: the unreduced backbone, the data and the
    detector's trained weights (trained on first use)."""

    task: str
    model: nn.Module  # the unreduced timm backbone (``vitbench_input_size`` set)
    model_name: str
    data: DetData
    #: the detector's input normalisation, 0-255 RGB (ImageNet's; an embedded backbone's own)
    mean: tuple[float, ...] = MEAN
    std: tuple[float, ...] = STD
    width: str = "full"
    epochs: int = 12
    train_limit: Optional[int] = None
    work_dir: Optional[Path] = None
    cache_dir: Optional[Path] = None  # where trained detector weights are kept
    eval_limit: Optional[int] = None
    gmacs_images: int = 16
    throughput_repeats: int = 10
    latency_repeats: int = 20
    verbose_training: bool = True
    #: the trained baseline detector's weights, per seed (``--seeds``: each seed its own detector)
    _weights: dict[int, dict[str, torch.Tensor]] = field(default_factory=dict, repr=False)
    #: matched compute: one cached GMACs counter per seed (:func:`vitbench.run.execute.gmacs_counter`)
    counters: dict = field(default_factory=dict, repr=False)
    #: how each seed's baseline detector was trained (or which cache file it came from)
    training_infos: dict[int, dict[str, Any]] = field(default_factory=dict)

    def gmacs_of(self, spec: Any, progress: Progress) -> Callable[[nn.Module], float]:
        """:func:`dense_gmacs`."""
        return dense_gmacs(self, spec.seed, progress)

    @property
    def training_info(self) -> dict[str, Any]:
        """The training facts of the detector trained (or loaded) last ({} before any)."""
        return next(reversed(self.training_infos.values()), {})

    @property
    def masks(self) -> bool:
        return self.task == "seg"

    @property
    def input_size(self) -> tuple[int, int, int]:
        return (3, self.data.input_size, self.data.input_size)

    def weights_key(self, seed: int) -> str:
        """What the trained detector depends on, hashed (its cache file name). Under a launcher
        with N > 1 ranks the key holds ``ranks``: a detector trained with DDP on N ranks is not
        the single-process one (each rank's BatchNorm normalises its own share of the batch, and
        mmdet normalises some loss terms by each rank's own positive anchors), so it is cached
        apart; one process's key has no ``ranks`` (the key of caches written before launchers
        trained detectors)."""
        import mmdet
        import timm

        fields = {"task": self.task, "model": self.model_name, "data": self.data.name, "width": self.width,
                  "classes": list(self.data.classes),
                  "epochs": self.epochs, "limit": self.train_limit, "batch": TRAIN_BATCH, "seed": seed,
                  "input": self.data.input_size, "timm": timm.__version__, "mmdet": mmdet.__version__,
                  "backbone": _state_digest(self.model)}
        if (self.mean, self.std) != (MEAN, STD):
            fields["normalise"] = [list(self.mean), list(self.std)]
        ranks = _world_size()
        if ranks > 1:
            fields["ranks"] = ranks
        return hashlib.sha1(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:12]


def _state_digest(model: nn.Module) -> str:
    """A digest of the backbone's initial weights (a --checkpoint changes the trained detector)."""
    h = hashlib.sha1()
    for name, tensor in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(tensor.detach().cpu().float().sum().numpy().tobytes())
    return h.hexdigest()[:12]


def trained_weights(ws: DenseWorkspace, seed: int, progress: Progress) -> dict[str, torch.Tensor]:
    """The baseline detector of ``seed``'s weights after the default training: kept in the
    workspace, else from the cache file when there is one, else trained now and saved
    atomically. Each seed has its own (the seed is part of the cache key).

    Under a launcher (a process group of more than one rank) every rank calls this at the same
    point -- the first run of the seed that needs the detector, every rank running every spec in
    the same order -- and the ranks decide together whether to load the cache (only when every
    rank finds the file, :func:`~vitbench.host.distributed.all_ranks`) or to train the detector
    together with DDP (:func:`~vitbench.tasks.dense.train.train_detector`); rank 0 alone writes the
    cache file and its ``.json``, and the others wait for it. A detector trained on N > 1 ranks
    has its own cache key (:meth:`DenseWorkspace.weights_key`): it is not the single-process one.
    Training holds the cache file's lock (:func:`_training_lock`): another vitbench process
    that needs the same detector meanwhile waits, then loads it instead of training it again."""
    if seed in ws._weights:
        return ws._weights[seed]
    path = ws.cache_dir / f"{ws.task}-{ws.model_name}-{ws.weights_key(seed)}.pth" if ws.cache_dir else None
    if _load_cached(ws, seed, path, progress):
        return ws._weights[seed]
    with _training_lock(ws, path, distributed.is_main()):
        if _load_cached(ws, seed, path, progress):  # trained meanwhile by another vitbench process
            return ws._weights[seed]
        detector = build_detector(ws.task, copy.deepcopy(ws.model), ws.data.num_classes, width=ws.width, mean=ws.mean, std=ws.std)
        ranks = _world_size()
        progress(f"training the {ws.task} detector ({ws.width} heads) for {ws.epochs} epoch(s) on "
                 f"{ws.data.name}: the default training, once"
                 + (f", with DDP on {ranks} ranks" if ranks > 1 else ""))
        info = train_detector_weights(ws, detector, seed)
        weights = {k: v.detach().cpu().clone() for k, v in detector.state_dict().items()}
        ws._weights[seed] = weights
        ws.training_infos[seed] = info
        if path is not None:
            _save_on_rank_0(weights, info, path, distributed.is_main())
    progress(f"detector trained in {info['seconds']:.0f} s ({info['iters']} iterations"
             + (f"; {ranks} ranks x {info['rank_batch_size']} images a step" if "rank_batch_size" in info else "")
             + ")")
    return weights


def _load_cached(ws: DenseWorkspace, seed: int, path: Optional[Path], progress: Progress) -> bool:
    """Load ``seed``'s trained detector from the cache file ``path`` into ``ws`` when every rank
    finds it (a collective under a launcher: the ranks load or train together)."""
    if not distributed.all_ranks(path is not None and path.is_file()):
        return False
    assert path is not None
    progress(f"loading the trained {ws.task} detector {path}")
    ws._weights[seed] = torch.load(path, map_location="cpu", weights_only=True)
    meta = path.with_suffix(".json")
    ws.training_infos[seed] = json.loads(meta.read_text()) if meta.is_file() else {"cached": str(path)}
    return True


def _training_lock(ws: DenseWorkspace, path: Optional[Path], main: bool) -> contextlib.AbstractContextManager:
    """The cache file's lock (:func:`vitbench.core.cache.cache_lock`) while the detector is trained:
    another vitbench process training the same detector is waited for, then its file loaded.
    Under a launcher rank 0 alone takes it (the others wait for rank 0 in the collectives)."""
    if path is None or not main:
        return contextlib.nullcontext(False)
    return cache_lock(path, f"training the {ws.task} detector")


def _world_size() -> int:
    from mmengine.dist import get_world_size

    return get_world_size()


def _save_on_rank_0(weights: dict[str, torch.Tensor], info: dict[str, Any], path: Path, main: bool) -> None:
    """Rank 0 (or the one process) writes the trained detector to ``path``, atomically, and its
    training facts beside it; under a launcher the others wait until it has (the outcome is
    shared, :func:`~vitbench.host.distributed.all_ranks`, so a failed write fails every rank)."""
    failure: Optional[BaseException] = None
    if main:
        try:
            atomic_write(path, lambda tmp: torch.save(weights, tmp))  # the modes a plain open() gives
            atomic_write(path.with_suffix(".json"), lambda tmp: tmp.write_text(json.dumps(info, indent=1)))
        except Exception as exc:  # noqa: BLE001 - re-raised below, after the other ranks know
            failure = exc
    written = distributed.all_ranks(failure is None)  # the barrier after rank 0's write (a collective under a launcher)
    if failure is not None:
        raise failure
    if not written:
        raise VitbenchError(f"rank 0 could not write the trained detector to {path}")


def train_detector_weights(ws: DenseWorkspace, detector: nn.Module, seed: int) -> dict[str, Any]:

    return train_detector(detector, ws.data, masks=ws.masks, epochs=ws.epochs, batch_size=TRAIN_BATCH,
                          limit=ws.train_limit, seed=seed, verbose=ws.verbose_training,
                          work_dir=ws.work_dir / f"detector-{ws.task}" if ws.work_dir else None)


def load_detector_weights(detector: nn.Module, weights: dict[str, torch.Tensor]) -> None:
    """Load the trained detector into one built around a reduced backbone: every detector
    weight must load; only the method's own parameters (``.reducer.``) may be missing."""
    try:
        result = detector.load_state_dict(weights, strict=False)
    except RuntimeError as exc:  # shapes differ: other classes, widths or backbone
        raise VitbenchError(f"the trained detector's weights do not fit this detector: {exc}") from exc
    missing = [k for k in result.missing_keys if ".reducer." not in k]
    if missing or result.unexpected_keys:
        raise VitbenchError(f"the trained detector does not fit the reduced one: missing {missing[:5]}, "
                            f"unexpected {result.unexpected_keys[:5]}")


class DetectorForward(nn.Module):
    """The detector's tensor forward (backbone, neck, heads; no post-processing): what GMACs,
    throughput, latency and memory are measured on."""

    def __init__(self, detector: nn.Module) -> None:
        super().__init__()
        self.detector = detector

    def forward(self, images: torch.Tensor) -> Any:
        from mmdet.structures import DetDataSample

        h, w = images.shape[-2:]
        meta = {"img_shape": (h, w), "ori_shape": (h, w), "pad_shape": (h, w), "batch_input_shape": (h, w),
                "scale_factor": (1.0, 1.0)}
        # Mask R-CNN's RPN needs each image's shape to place its proposals
        return self.detector._forward(images, [DetDataSample(metainfo=meta) for _ in range(images.shape[0])])


def dense_gmacs(ws: DenseWorkspace, seed: int, progress: Progress) -> Callable[[nn.Module], float]:
    """The GMACs of a (reduced) backbone inside ``seed``'s trained detector, on the images
    :func:`run_dense_spec` counts on (matched compute, :mod:`vitbench.measure.calibrate`)."""
    weights = trained_weights(ws, seed, progress)

    def detector_of(backbone: nn.Module) -> nn.Module:
        detector = build_detector(ws.task, backbone, ws.data.num_classes, width=ws.width, mean=ws.mean, std=ws.std)
        load_detector_weights(detector, weights)
        return detector.eval()

    images = first_val_images(detector_of(copy.deepcopy(ws.model)), ws.data, ws.gmacs_images)
    return lambda backbone: measure.count_gmacs(detector_of(prepared_as_trained(backbone, images)).backbone,
                                                images).mean


def run_dense_spec(spec: Any, ws: DenseWorkspace, backbone: nn.Module, progress: Progress) -> dict[str, Any]:
    """Everything one det/seg spec measures of ``backbone``, the copy the executor reduced (raises
    on failure; the executor records it). Under a launcher every rank builds the detector, fine-tunes it with the others (DDP, a
    learnable method or the control) and takes part in the mAP evaluation (a collective); rank 0
    alone counts and times it (:func:`_measure`)."""
    weights = trained_weights(ws, spec.seed, progress)

    embedded = f"embedded {spec.weights}" if spec.weights else None  # weights_from reads the others
    out: dict[str, Any] = {"batch_size": spec.batch_size, "detector": _detector_name(ws),
                           "detector_training": ws.training_infos[spec.seed], "weights_from": weights_from(spec, embedded)}
    detector = build_detector(ws.task, backbone, ws.data.num_classes, width=ws.width, mean=ws.mean, std=ws.std)
    load_detector_weights(detector, weights)
    ctx = reduction_context(backbone)
    trains = spec.method == CONTROL or (ctx is not None and ctx.reduction is not None and bool(ctx.reduction.train))
    epochs = spec.finetune_epochs or schedule_for(spec.data).finetune_epochs[ws.task]
    settings = dense_finetune_for(ws.task, spec.dense_finetune or DEFAULT_PROTOCOL, epochs)
    work_dir = ws.work_dir / spec.spec_id / "train" if ws.work_dir else None
    precision = spec.precision_name
    train_precision = trains_in(precision)
    training = dict(masks=ws.masks, settings=settings, limit=spec.train_limit, device=spec.device, seed=spec.seed,
                    verbose=ws.verbose_training, progress=progress, work_dir=work_dir, precision=train_precision)
    if spec.method == CONTROL:  # the baseline detector, fine-tuned as the methods' detectors are
        out.update(finetune_control(detector, ws.data, **training), train_precision=train_precision)
    elif trains:
        out.update(finetune_method(detector, backbone, ws.data, **training), train_precision=train_precision)
    detector.eval()
    if ctx is not None:  # a broken token rule is an error, not a row (one forward of 4 images, model kept)

        token_rules.check_token_rules(backbone, first_val_images(detector, ws.data, 4))
    out.update(_measure(spec, ws, detector, backbone, progress))
    return out


def _accuracy(spec: Any, ws: DenseWorkspace, detector: nn.Module, backbone: nn.Module,
              progress: Progress) -> dict[str, Any]:
    """Box (and mask) mAP when ``accuracy`` is measured (a collective evaluation under a launcher:
    every rank scores its part of the images, every rank gets the metrics); every reduction step
    of a reduced ``backbone`` is checked as it runs (docs/reliability.md, "Token rules are checked")."""
    if "accuracy" not in spec.metrics:
        return {}

    progress("evaluating mAP")
    traced = token_rules.token_rules_traced(backbone, spec.method) if reduction_context(backbone) is not None else contextlib.nullcontext()
    with traced:
        return evaluate_detector(detector, ws.data, masks=ws.masks, limit=ws.eval_limit, device=spec.device,
                                 seed=spec.seed, precision=spec.precision_name,
                                 work_dir=ws.work_dir / spec.spec_id if ws.work_dir else None)


def _measure(spec: Any, ws: DenseWorkspace, detector: nn.Module, backbone: nn.Module,
             progress: Progress) -> dict[str, Any]:
    """GMACs, parameters, mAP, throughput, latency and memory of the (eval-mode) detector. Under
    a launcher the ranks other than 0 take part in the mAP evaluation only, then wait at the
    executor's barrier while rank 0 times (the pattern of ``cls``,
    :func:`vitbench.tasks.cls.run._measure`)."""
    if not distributed.is_main():
        return _accuracy(spec, ws, detector.to(spec.device), backbone, progress)
    detector.to(spec.device)
    # the collective evaluation first: whatever fails in rank 0's own measurements below then
    # fails after every rank left the evaluation, and the executor's barrier still pairs up
    out: dict[str, Any] = _accuracy(spec, ws, detector, backbone, progress)
    out.update(resized_maps(detector.backbone))
    forward = DetectorForward(detector)
    if "gmacs" in spec.metrics:
        progress("counting GMACs (detector and backbone)")
        images = first_val_images(detector, ws.data, ws.gmacs_images)
        full = measure.count_gmacs(forward, images, what="counting GMACs (detector)")
        back = measure.count_gmacs(detector.backbone, images, what="counting GMACs (backbone)")
        out.update(gmacs=full.mean, gmacs_std=full.std, gmacs_images=full.n, gmacs_on="evaluation images",
                   backbone_gmacs=back.mean, backbone_gmacs_std=back.std,
                   gmacs_input=f"{ws.data.input_size}x{ws.data.input_size}")
    if "params" in spec.metrics:
        out["params_m"] = measure.count_params_m(detector)
        out["backbone_params_m"] = measure.count_params_m(backbone)
    out.update(measure_timings(spec, forward, ws.input_size, progress, throughput_repeats=ws.throughput_repeats,
                               latency_repeats=ws.latency_repeats))  # eager, --compile's or --cuda-graph's
    return out


def resized_maps(maps: nn.Module) -> dict[str, Any]:
    """``resized_maps``: the backbone maps that the method made smaller in the last forward (the
    evaluation's) and that :class:`~vitbench.tasks.dense.backbone.FeatureMaps` resized back to
    their strides for the heads, ``[{"stride", "size", "nominal"}]``; nothing when none was."""
    resized = getattr(maps, "resized", None) or {}
    return {"resized_maps": [{"stride": stride, "size": list(size), "nominal": list(nominal)}
                             for stride, (size, nominal) in sorted(resized.items())]} if resized else {}


def _detector_name(ws: DenseWorkspace) -> str:
    head = "SSDLite (SSDNeck + depthwise SSDHead)" if ws.task == "det" else "Mask R-CNN + FPN"
    return f"{head}, {ws.width} heads, {ws.data.input_size}x{ws.data.input_size}"


def check_model_name(name: str) -> None:
    """A clear error for a name timm does not know (with the closest names)."""
    import timm


    if not timm.is_model(name):
        raise unknown_model(name)


def load_backbone(name: str, num_classes: int, input_size: int, *, pretrained: bool = False,
                  checkpoint: Optional[str] = None, seed: int = 0, embedded: Optional[str] = None) -> nn.Module:
    """The timm backbone of a dense task: ``name`` at ``input_size`` (plain ViTs are built for
    it, and so is Swin; hybrids take any size), weights from ``--pretrained``/``--checkpoint`` (an ImageNet
    classifier's state dict), and a classifier head resized to the data's classes -- unused by
    the detector, but what methods with class statistics (LTM, DCS's IB bound) count classes by.
    Random weights are drawn from ``seed``; ``embedded`` names the embedded model whose weights
    it starts from instead (:func:`~vitbench.tasks.dense.data.embedded_backbone`).
    """
    import timm


    check_model_name(name)
    kwargs: dict[str, Any] = {}
    if name.startswith(("vit_", "deit", "swin")):  # built for the size (Swin: its window masks)
        kwargs["img_size"] = input_size
    if embedded is not None:
        model = load_embedded_model(embedded)
    else:
        with torch.random.fork_rng():  # a seeded random init: the same command trains the same detector
            torch.manual_seed(seed)
            model = timm.create_model(name, pretrained=pretrained, **kwargs)
    if checkpoint is not None:
        load_checkpoint(model, checkpoint, name=name)
    if is_plain_vit(model) and tuple(model.patch_embed.img_size) != (input_size, input_size):
        raise VitbenchError(f"{name} is built for {tuple(model.patch_embed.img_size)} images; the dense tasks "
                            f"need {input_size}x{input_size}")
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model.reset_classifier(num_classes)
    model.vitbench_input_size = (input_size, input_size)  # what family adapters size token grids by
    return model.eval()
