"""The embedded models: small ViTs and the dense backbones trained on Fashion-MNIST, shipped with vitbench.

``vitbench run --task cls`` without ``--model`` must work on a CPU laptop with no download and no
training (docs/architecture.md, "Embedded defaults"). The default, :data:`FMNIST_DEIT`, has DeiT's
layout: 196 patch tokens of 2x2 pixels and a class token, 12 blocks, so the methods' default layer
choices (e.g. blocks 3, 6, 9) exist and token reduction saves time as it does on DeiT. Each
model's weights ship as package data (``weights/``, with the metadata that says how they were
made). Other settings, and ``vitbench default-model --retrain``, train it -- through the mmengine
``Runner``, like every task -- into ``~/.cache/vitbench`` (``$VITBENCH_CACHE`` overrides), which is
read first. Training saves a checkpoint after every epoch and resumes from it when restarted.

Cache entries are named by a hash of the architecture and training settings: changing either
trains a new model instead of loading a stale one. Files are written to a temporary name and
moved into place (``os.replace``), weights first, metadata last, so a crash never leaves a
half-written entry that looks complete; while one process trains, others wait on a lock file.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import timm
from timm.models.vision_transformer import VisionTransformer
from torch import nn

from vitbench.core.cache import ENV_CACHE, atomic_write, cache_dir, cache_lock
from vitbench.data.fashion_mnist import CLASSES, load_fashion_mnist, pad_images
from vitbench.errors import choices_error
from vitbench.tasks.embedded import DEFAULT_MODEL, DEIT_MODEL, EFFICIENTVIT_MODEL, LEGACY_MODEL, MOBILEVIT_MODEL
from vitbench.tasks.embedded import EMBEDDED_NUM_CLASSES
from vitbench.mm.classifier import classifier_cfg
from vitbench.mm.hooks import ProgressHook
from vitbench.mm.runner import release, runner_kwargs


@dataclass(frozen=True)
class Recipe:
    """How an embedded model is trained; every field is part of its cache key."""

    #: passes over the training images
    epochs: int
    batch_size: int
    #: AdamW's peak learning rate: linear warm-up, then cosine decay to 1 % of it
    lr: float
    weight_decay: float = 0.05
    #: share of the iterations spent warming up
    warmup_fraction: float = 0.05
    #: label smoothing of the cross-entropy (0: plain cross-entropy)
    label_smoothing: float = 0.0
    #: random crops (2-pixel zero padding) and horizontal flips of the training images
    augment: bool = False
    #: patch dropout rate per epoch (the last rate holds for later epochs); empty: none
    patch_drop: tuple[float, ...] = ()
    #: the stem of shipped weights training continues from (empty: timm's random initialisation)
    start_from: str = ""
    #: validate on the test set after every epoch (False: after the last only)
    validate_every_epoch: bool = False


@dataclass(frozen=True)
class EmbeddedModel:
    """A small timm model trained on Fashion-MNIST whose weights ship with vitbench."""

    name: str
    #: the timm model's kwargs (a ``VisionTransformer``'s, or ``timm.create_model``'s for ``timm_name``)
    arch: dict[str, Any]
    #: mean/std of the training images in 0-1 scale (a test checks them against the data)
    mean: tuple[float, ...]
    std: tuple[float, ...]
    recipe: Recipe
    #: a timm architecture built by ``timm.create_model(timm_name, **arch)``; empty: a ``VisionTransformer``
    timm_name: str = ""
    #: side the 32-pixel (zero-padded) images are resized to, for a model that takes any size
    resize_to: int = 0
    #: the dtype its floating-point weights are stored in (``float16`` halves a file the package carries)
    stored_dtype: str = "float32"

    @property
    def img_size(self) -> int:
        """Side of the square input: Fashion-MNIST's 28 pixels, zero-padded where larger (or resized)."""
        return int(self.arch.get("img_size", self.resize_to))

    @property
    def in_chans(self) -> int:
        """Input channels: 1 (grey), or 3 for a backbone whose stem takes RGB (the grey image repeated)."""
        return int(self.arch.get("in_chans", 3))

    @property
    def tokens(self) -> int | None:
        """Tokens entering the first block of a ViT: the patches and the class token (None: not a ViT)."""
        if "patch_size" not in self.arch:
            return None
        return (self.img_size // int(self.arch["patch_size"])) ** 2 + 1


NUM_CLASSES = EMBEDDED_NUM_CLASSES
#: the first stage's recipe: vitbench-fmnist-deit-5977878523d7 (only its metadata still ships)
DEIT_FIRST_STAGE = Recipe(epochs=9, batch_size=128, lr=2e-3, patch_drop=(0.75,) * 6 + (0.0,) * 3)
#: the recipes of the shipped entries the default continues, oldest first (each the next one's ``start_from``)
DEIT_EARLIER_STAGES = (
    DEIT_FIRST_STAGE,
    Recipe(epochs=3, batch_size=64, lr=5e-4, start_from="vitbench-fmnist-deit-5977878523d7",
           validate_every_epoch=True),  # vitbench-fmnist-deit-62ab2bd80658
    Recipe(epochs=2, batch_size=64, lr=2.5e-4, start_from="vitbench-fmnist-deit-62ab2bd80658",
           validate_every_epoch=True),  # vitbench-fmnist-deit-6450bc5f477d
    Recipe(epochs=3, batch_size=64, lr=2.5e-4, label_smoothing=0.1,
           start_from="vitbench-fmnist-deit-6450bc5f477d", validate_every_epoch=True),  # vitbench-fmnist-deit-045611e9ba74
)
#: DeiT's layout at width 96 (docs/architecture.md, "Embedded defaults", says why)
FMNIST_DEIT = EmbeddedModel(
    name=DEIT_MODEL,
    arch={"img_size": 28, "patch_size": 2, "in_chans": 1, "num_classes": NUM_CLASSES, "embed_dim": 96,
          "depth": 12, "num_heads": 3, "mlp_ratio": 4.0, "global_pool": "token", "class_token": True},
    mean=(0.2860,), std=(0.3530,),
    recipe=Recipe(epochs=2, batch_size=64, lr=1.5e-4, label_smoothing=0.1,
                  start_from="vitbench-fmnist-deit-045611e9ba74", validate_every_epoch=True))
#: the first default (64 patch tokens of 4x4 pixels at width 64), kept so older stores still report
FMNIST_VIT = EmbeddedModel(
    name=LEGACY_MODEL,
    arch={"img_size": 32, "patch_size": 4, "in_chans": 1, "num_classes": NUM_CLASSES, "embed_dim": 64,
          "depth": 12, "num_heads": 4, "mlp_ratio": 2.0, "global_pool": "token", "class_token": True},
    mean=(0.2190,), std=(0.3318,),
    recipe=Recipe(epochs=1, batch_size=64, lr=2e-3))
#: the dense backbones' recipe (docs/architecture.md, "Embedded defaults", says why 128 pixels)
DENSE_RECIPE = Recipe(epochs=1, batch_size=64, lr=2e-3)
FMNIST_MOBILEVIT = EmbeddedModel(
    name=MOBILEVIT_MODEL, timm_name="mobilevit_xs", arch={"in_chans": 3, "num_classes": NUM_CLASSES},
    resize_to=128, mean=(0.2190,) * 3, std=(0.3191,) * 3, recipe=DENSE_RECIPE)
#: EfficientViT-B1 under a narrow classifier, stored in float16: within the package's 10 MB a model
FMNIST_EFFICIENTVIT = EmbeddedModel(
    name=EFFICIENTVIT_MODEL, timm_name="efficientvit_b1",
    arch={"in_chans": 3, "num_classes": NUM_CLASSES, "head_widths": (256, 256)},
    resize_to=128, mean=(0.2190,) * 3, std=(0.3191,) * 3, recipe=DENSE_RECIPE, stored_dtype="float16")
EMBEDDED: dict[str, EmbeddedModel] = {m.name: m for m in (FMNIST_DEIT, FMNIST_VIT, FMNIST_MOBILEVIT,
                                                          FMNIST_EFFICIENTVIT)}

SEED = 0
#: Bump when the cache format (files or metadata layout) changes.
CACHE_FORMAT = 1


def embedded(name: str | EmbeddedModel = DEFAULT_MODEL) -> EmbeddedModel:
    """The embedded model called ``name``; an unknown name raises :class:`~vitbench.errors.UnknownNameError`."""
    if isinstance(name, EmbeddedModel):
        return name
    if name not in EMBEDDED:
        raise choices_error("embedded model", name, EMBEDDED)
    return EMBEDDED[name]


def fashion_mnist_stats(model: str | EmbeddedModel = DEFAULT_MODEL,
                        data_dir: str | Path | None = None) -> tuple[float, float]:
    """Mean and std (0-1 scale) of the training images as ``model`` sees them (padded to its size,
    or padded to 32 and resized bilinearly)."""
    m = embedded(model)
    images, _ = load_fashion_mnist("train", data_dir)
    padded = pad_images(images, 32 if m.resize_to else m.img_size)
    total, squares, count = 0.0, 0.0, 0
    for start in range(0, len(padded), 5000):  # resized, the whole split would not fit in memory
        chunk = torch.from_numpy(padded[start:start + 5000]).double().div_(255.0)[:, None]
        if m.resize_to:
            chunk = nn.functional.interpolate(chunk, size=(m.resize_to, m.resize_to), mode="bilinear")
        total, squares, count = total + float(chunk.sum()), squares + float(chunk.square().sum()), count + chunk.numel()
    mean = total / count
    return mean, (squares / count - mean * mean) ** 0.5


def pretrained_cfg(model: str | EmbeddedModel = DEFAULT_MODEL) -> dict[str, Any]:
    """timm-style ``pretrained_cfg`` for an embedded model, so it is read like any timm model."""
    m = embedded(model)
    layers = {"first_conv": "patch_embed.proj", "classifier": "head"}
    if m.timm_name:
        timm_cfg = timm.models.get_pretrained_cfg(m.timm_name)
        layers = {"first_conv": timm_cfg.first_conv, "classifier": timm_cfg.classifier}
    return {"architecture": m.name, "num_classes": NUM_CLASSES, "input_size": (m.in_chans, m.img_size, m.img_size),
            "crop_pct": 1.0, "interpolation": "bilinear", "mean": m.mean, "std": m.std, **layers,
            "label_names": CLASSES}


def build_arch(model: str | EmbeddedModel = DEFAULT_MODEL) -> nn.Module:
    """The untrained architecture of an embedded model (random init, timm's own initialisation)."""
    m = embedded(model)
    net = timm.create_model(m.timm_name, **m.arch) if m.timm_name else VisionTransformer(**m.arch)
    net.pretrained_cfg = pretrained_cfg(m)  # type: ignore[assignment]  # timm sets a plain dict too
    return net


def _iters_per_epoch(num_images: int, batch_size: int) -> int:
    return -(-num_images // batch_size)


def _resize(m: EmbeddedModel) -> list[dict[str, Any]]:
    """The 32-pixel images resized to a ``resize_to`` model's side, as the cls task's data path does."""
    if not m.resize_to:
        return []
    return [{"type": "mmpretrain.Resize", "scale": (m.resize_to, m.resize_to), "backend": "pillow",
             "interpolation": "bilinear"}]


def _train_pipeline(m: EmbeddedModel) -> list[dict[str, Any]]:
    augment = [{"type": "mmpretrain.RandomCrop", "crop_size": m.img_size, "padding": 2},
               {"type": "mmpretrain.RandomFlip", "prob": 0.5, "direction": "horizontal"}]
    return [*_resize(m), *(augment if m.recipe.augment else []), {"type": "mmpretrain.PackInputs"}]


def train_config(*, model: str | EmbeddedModel = DEFAULT_MODEL, epochs: int | None = None,
                 max_train_images: int | None = None, batch_size: int | None = None,
                 lr: float | None = None, seed: int = SEED, max_test_images: int | None = None,
                 data_dir: str | None = None) -> dict[str, Any]:
    """The mmengine config (a plain dict) that trains an embedded model by its recipe.

    ``epochs``, ``batch_size`` and ``lr`` override the recipe's (None: the recipe's).
    ``configs/cls/fmnist_deit_default.py`` is this dict for the default model, for use with
    mmengine tools; a test keeps the two equal. The validation split is the Fashion-MNIST test
    set: its top-1 is the number recorded in the cache metadata (``max_test_images`` cuts it
    short, for tests).
    """
    m = embedded(model)
    recipe = m.recipe
    epochs = recipe.epochs if epochs is None else epochs
    batch_size = recipe.batch_size if batch_size is None else batch_size
    lr = recipe.lr if lr is None else lr
    n_train = 60000 if max_train_images is None else min(int(max_train_images), 60000)
    total = _iters_per_epoch(n_train, batch_size) * epochs
    warmup = max(1, int(total * recipe.warmup_fraction))
    backbone = ({"type": "vitbench.TimmModel", "model_name": m.timm_name, **m.arch} if m.timm_name
                else {"type": "vitbench.TimmVisionTransformer", **m.arch})
    if recipe.patch_drop:
        backbone["patch_drop_rate"] = max(recipe.patch_drop)
    classifier = classifier_cfg(backbone, mean=m.mean, std=m.std, to_rgb=False)
    if recipe.label_smoothing:
        classifier["head"]["loss"] = {"type": "mmpretrain.LabelSmoothLoss",
                                      "label_smooth_val": recipe.label_smoothing, "loss_weight": 1.0}
    padded = {} if m.img_size == 32 or m.resize_to else {"pad_to": m.img_size}  # 32 is the data set's default
    if m.in_chans != 1:
        padded["channels"] = m.in_chans
    cfg: dict[str, Any] = {
        "default_scope": "mmpretrain",
        "model": classifier,
        "train_dataloader": {
            "batch_size": batch_size, "num_workers": 0, "persistent_workers": False,
            "sampler": {"type": "DefaultSampler", "shuffle": True},
            "dataset": {"type": "vitbench.OfflineFashionMNIST", "split": "train",
                        "data_dir": data_dir, "indices": max_train_images, **padded,
                        "pipeline": _train_pipeline(m)},
        },
        "val_dataloader": {
            "batch_size": 256, "num_workers": 0, "persistent_workers": False,
            "sampler": {"type": "DefaultSampler", "shuffle": False},
            "dataset": {"type": "vitbench.OfflineFashionMNIST", "split": "test",
                        "data_dir": data_dir, "indices": max_test_images, **padded,
                        **({"pipeline": [*_resize(m), {"type": "mmpretrain.PackInputs"}]} if m.resize_to else {})},
        },
        "val_evaluator": {"type": "mmpretrain.Accuracy", "topk": (1, 5)},
        "train_cfg": {"by_epoch": True, "max_epochs": epochs,
                      "val_interval": 1 if recipe.validate_every_epoch else epochs},
        "val_cfg": {},
        "optim_wrapper": {
            "optimizer": {"type": "AdamW", "lr": lr, "weight_decay": recipe.weight_decay,
                          "betas": (0.9, 0.999)},
            "clip_grad": {"max_norm": 1.0},
            "paramwise_cfg": {"norm_decay_mult": 0.0, "bias_decay_mult": 0.0,
                              "custom_keys": {".pos_embed": {"decay_mult": 0.0},
                                              ".cls_token": {"decay_mult": 0.0}}},
        },
        "param_scheduler": [
            {"type": "LinearLR", "start_factor": 0.01, "by_epoch": False, "begin": 0, "end": warmup},
            {"type": "CosineAnnealingLR", "by_epoch": False, "begin": warmup, "end": total,
             "T_max": total - warmup, "eta_min": lr * 0.01},
        ],
        "randomness": {"seed": seed, "deterministic": True},
    }
    hooks = []
    if recipe.start_from:
        hooks.append({"type": "vitbench.StartFromWeights", "file": f"tasks/cls/weights/{recipe.start_from}.pth",
                      "sha256": _shipped_sha256(recipe.start_from)})
    if recipe.patch_drop:
        hooks.append({"type": "vitbench.PatchDropSchedule", "rates": list(recipe.patch_drop)})
    if hooks:
        cfg["custom_hooks"] = hooks
    return cfg


def _shipped_sha256(stem: str) -> str:
    """The recorded sha256 of the shipped weights ``stem`` (from their metadata)."""
    meta = SHIPPED_DIR / f"{stem}.json"
    if not meta.is_file():
        raise ValueError(f"no shipped weights {stem!r} to start from (no {meta.name} in the package)")
    return str(json.loads(meta.read_text())["weights_sha256"])


def config_hash(cfg: dict[str, Any]) -> str:
    """Short stable hash of a training config (the cache key); data paths are not part of it."""
    def scrub(obj: Any) -> Any:
        if isinstance(obj, dict):
            return {k: scrub(v) for k, v in obj.items() if k != "data_dir"}
        if isinstance(obj, (list, tuple)):
            return [scrub(v) for v in obj]
        return obj

    blob = json.dumps({"format": CACHE_FORMAT, "cfg": scrub(cfg)}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


#: the weights that ship with the package (package data), for the default settings
SHIPPED_DIR = Path(__file__).with_name("weights")


def _stem(cfg: dict[str, Any], model: str | EmbeddedModel) -> str:
    return f"{embedded(model).name}-{config_hash(cfg)}"


def shipped_paths(cfg: dict[str, Any], model: str | EmbeddedModel = DEFAULT_MODEL) -> tuple[Path, Path]:
    """(weights, metadata) paths of the entry shipped with the package for ``cfg`` (present for each
    embedded model's own recipe only)."""
    stem = _stem(cfg, model)
    return SHIPPED_DIR / f"{stem}.pth", SHIPPED_DIR / f"{stem}.json"


def cache_paths(cfg: dict[str, Any], directory: str | Path | None = None,
                model: str | EmbeddedModel = DEFAULT_MODEL) -> tuple[Path, Path]:
    """(weights ``.pth``, metadata ``.json``) paths of the cache entry for ``cfg``."""
    stem = _stem(cfg, model)
    folder = cache_dir(directory)
    return folder / f"{stem}.pth", folder / f"{stem}.json"


def checkpoint_dir(cfg: dict[str, Any], directory: str | Path | None = None,
                   model: str | EmbeddedModel = DEFAULT_MODEL) -> Path:
    """The folder where training ``cfg`` keeps its per-epoch checkpoints until it is done."""
    return cache_dir(directory) / "training" / _stem(cfg, model)


def _save_state(state: dict[str, torch.Tensor], path: Path) -> None:
    """``torch.save`` through a file object: the archive's inner name is then fixed, so the same
    tensors give the same bytes (a path names it after the temporary file)."""
    with open(path, "wb") as f:
        torch.save(state, f)


def _versions() -> dict[str, str]:
    import mmengine
    import mmpretrain
    import timm

    import vitbench
    return {"torch": torch.__version__, "timm": timm.__version__, "mmengine": mmengine.__version__,
            "mmpretrain": mmpretrain.__version__, "vitbench": vitbench.__version__,
            "numpy": np.__version__}


def _command(m: EmbeddedModel, **settings: Any) -> str:
    """The command that trains this entry again, naming no path of this machine."""
    given = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in settings.items() if v is not None)
    return f"python -m vitbench.tasks.cls.default_model --model {m.name} --force" + (f" {given}" if given else "")


def _runner_config(cfg: dict[str, Any], work_dir: Path, seed: int, verbose: bool) -> Any:
    """``cfg`` with vitbench's quiet runner settings, progress lines and a checkpoint per epoch."""
    from mmengine.config import Config

    progress_hook = {"type": "vitbench.ProgressHook", "verbose": verbose, "interval": 50,
                     "prefix": "vitbench: ", "what": "training the default model"}
    kwargs = runner_kwargs(work_dir=work_dir, seed=seed, deterministic=True,
                           custom_hooks=[*cfg.get("custom_hooks", []), progress_hook], resume=True)
    kwargs["default_hooks"]["checkpoint"] = {"type": "CheckpointHook", "interval": 1, "max_keep_ckpts": 1}
    return Config({**{k: v for k, v in cfg.items() if k != "custom_hooks"},
                   **{k: v for k, v in kwargs.items() if k not in cfg or k == "custom_hooks"}})


def train_default_model(*, model: str | EmbeddedModel = DEFAULT_MODEL, epochs: int | None = None,
                        max_train_images: int | None = None, batch_size: int | None = None,
                        lr: float | None = None, seed: int = SEED, max_test_images: int | None = None,
                        cache: str | Path | None = None, data_dir: str | None = None,
                        verbose: bool = True, save: bool = True) -> tuple[VisionTransformer, dict[str, Any]]:
    """Train an embedded model with the mmengine ``Runner`` and (``save``) cache it.

    ``epochs``/``max_train_images`` (the first N training images) let tests train a tiny
    version. A checkpoint is kept after every epoch (:func:`checkpoint_dir`); a training that
    was stopped resumes from it and the folder goes once the model is saved. Progress goes to
    stderr when ``verbose``. Deterministic on CPU for a fixed seed and thread count when not
    interrupted. Returns ``(model in eval mode, metadata)``.
    """
    from mmengine.runner import Runner

    m = embedded(model)
    cfg = train_config(model=m, epochs=epochs, max_train_images=max_train_images, batch_size=batch_size,
                       lr=lr, seed=seed, max_test_images=max_test_images, data_dir=data_dir)
    weights_path, meta_path = cache_paths(cfg, cache, m)
    work_dir = checkpoint_dir(cfg, cache, m)
    n_train = 60000 if max_train_images is None else min(max_train_images, 60000)
    n_epochs = cfg["train_cfg"]["max_epochs"]
    if verbose:
        resumed = " (resuming from its last checkpoint)" if (work_dir / "last_checkpoint").is_file() else ""
        print(f"vitbench: training {m.name} on {n_train} Fashion-MNIST images, {n_epochs} epoch(s)"
              f"{resumed}; this happens once, the result is cached in {weights_path.parent}",
              file=sys.stderr, flush=True)
    saved_det = (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.deterministic,
                 torch.backends.cudnn.benchmark)
    start = time.perf_counter()
    work_dir.mkdir(parents=True, exist_ok=True)
    runner = Runner.from_cfg(_runner_config(cfg, work_dir, seed, verbose))
    try:
        runner.train()
    finally:
        release(runner)
        torch.use_deterministic_algorithms(saved_det[0])
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = saved_det[1:]
    hook = next(h for h in runner.hooks if isinstance(h, ProgressHook))
    metrics = hook.val_metrics
    seconds = time.perf_counter() - start
    net: VisionTransformer = runner.model.backbone.model.cpu().eval()
    net.pretrained_cfg = pretrained_cfg(m)  # type: ignore[assignment]  # timm sets a plain dict too
    stored = getattr(torch, m.stored_dtype)
    state = {k: v.detach().to(stored if v.is_floating_point() else v.dtype).contiguous()
             for k, v in net.state_dict().items()}
    recipe = json.loads(json.dumps(asdict(m.recipe))) | {"epochs": n_epochs, "batch_size": cfg["train_dataloader"]["batch_size"],
                                 "lr": cfg["optim_wrapper"]["optimizer"]["lr"], "seed": seed}
    meta: dict[str, Any] = {
        "name": m.name, "cache_format": CACHE_FORMAT, "config_hash": config_hash(cfg), "arch": m.arch,
        "tokens": m.tokens, "mean": list(m.mean), "std": list(m.std),
        "timm_name": m.timm_name or None, "input_size": [m.in_chans, m.img_size, m.img_size], "crop_pct": 1.0,
        "stored_dtype": m.stored_dtype,
        "num_classes": NUM_CLASSES, "classes": list(CLASSES),
        "test_top1_pct": metrics.get("accuracy/top1"), "test_top5_pct": metrics.get("accuracy/top5"),
        "test_images": 10000 if max_test_images is None else min(max_test_images, 10000),
        "train_images": n_train, "epochs": n_epochs, "batch_size": recipe["batch_size"],
        "lr": recipe["lr"], "seed": seed, "recipe": recipe,
        "train_seconds": round(seconds, 1), "torch_threads": torch.get_num_threads(), "versions": _versions(),
        "command": _command(m, epochs=epochs, max_train_images=max_train_images, seed=seed or None),
        "config": cfg,
    }
    if save:
        atomic_write(weights_path, lambda p: _save_state(state, p))
        meta["weights"] = weights_path.name
        meta["weights_sha256"] = hashlib.sha256(weights_path.read_bytes()).hexdigest()
        atomic_write(meta_path, lambda p: p.write_text(json.dumps(meta, indent=2, default=str) + "\n"))
    shutil.rmtree(work_dir, ignore_errors=True)
    if verbose:
        print(f"vitbench: {m.name} trained in {seconds:.0f} s, test top-1 {meta['test_top1_pct']:.2f}%"
              + (f"; saved {weights_path}" if save else ""), file=sys.stderr, flush=True)
    return net, meta


def _load_cached(weights_path: Path, meta_path: Path,
                 m: EmbeddedModel) -> tuple[VisionTransformer, dict[str, Any]]:
    """Load a cache entry (``weights_only=True``); any problem raises ``ValueError``/``OSError``."""
    meta = json.loads(meta_path.read_text())
    if meta.get("cache_format") != CACHE_FORMAT or meta.get("arch") != json.loads(json.dumps(m.arch)):
        raise ValueError("cache entry from another vitbench version")
    state = torch.load(weights_path, map_location="cpu", weights_only=True)
    net = build_arch(m)
    net.load_state_dict(state, strict=True)
    return net.eval(), meta


def _from_cache(weights_path: Path, meta_path: Path, m: EmbeddedModel,
                say: bool = True) -> tuple[VisionTransformer, dict[str, Any]] | None:
    """The cache entry when there is a usable one, else ``None`` (an unusable one said when ``say``)."""
    if not (weights_path.is_file() and meta_path.is_file()):
        return None
    try:
        return _load_cached(weights_path, meta_path, m)
    except Exception as exc:  # noqa: BLE001 - any unreadable entry is retrained
        if say:
            print(f"vitbench: cached {weights_path} unusable ({type(exc).__name__}: {exc}); retraining",
                  file=sys.stderr, flush=True)
        return None


def load_default_model(*, model: str | EmbeddedModel = DEFAULT_MODEL, cache: str | Path | None = None,
                       verbose: bool = True, **train_kwargs: Any) -> tuple[VisionTransformer, dict[str, Any]]:
    """An embedded model and its metadata: from the cache, else the weights shipped with the
    package (its own recipe), else trained now and cached.

    ``train_kwargs`` (``epochs``, ``max_train_images``, ``batch_size``, ``lr``, ``seed``,
    ``max_test_images``, ``data_dir``) select a non-default training; each setting has its own cache entry. A
    corrupt entry is reported and retrained. Training holds a lock file beside the entry
    (:func:`vitbench.core.cache.cache_lock`): a second process asking meanwhile waits, then loads
    what the first one cached instead of training again.
    """
    keys = {"epochs", "max_train_images", "batch_size", "lr", "seed", "max_test_images", "data_dir"}
    if unknown := set(train_kwargs) - keys:
        raise TypeError(f"unknown training arguments {sorted(unknown)}; valid: {sorted(keys)}")
    m = embedded(model)
    cfg = train_config(model=m, **train_kwargs)
    weights_path, meta_path = cache_paths(cfg, cache, m)
    found = _from_cache(weights_path, meta_path, m)  # a retrained entry (`vitbench default-model --retrain`)
    if found is None:
        found = _from_cache(*shipped_paths(cfg, m), m)
    if found is not None:
        return found
    with cache_lock(weights_path, f"training {m.name}"):
        found = _from_cache(weights_path, meta_path, m, say=False)  # cached meanwhile by another process
        if found is not None:
            return found
        return train_default_model(model=m, cache=cache, verbose=verbose, **train_kwargs)


def main(argv: list[str] | None = None) -> int:
    """``python -m vitbench.tasks.cls.default_model``: train (or show) a cached embedded model."""
    parser = argparse.ArgumentParser(description="Train one of vitbench's embedded models once and cache it.")
    parser.add_argument("--model", default=DEFAULT_MODEL, choices=sorted(EMBEDDED))
    parser.add_argument("--epochs", type=int, default=None, help="default: the model's recipe")
    parser.add_argument("--max-train-images", type=int, default=None)
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--cache", default=None, help=f"cache folder (default ${ENV_CACHE} or ~/.cache/vitbench)")
    parser.add_argument("--force", action="store_true", help="retrain even if cached")
    args = parser.parse_args(argv)
    kwargs = {"epochs": args.epochs, "max_train_images": args.max_train_images, "seed": args.seed}
    if args.force:
        _, meta = train_default_model(model=args.model, cache=args.cache, **kwargs)
    else:
        _, meta = load_default_model(model=args.model, cache=args.cache, **kwargs)
    weights, _ = cache_paths(train_config(model=args.model, **kwargs), args.cache, args.model)
    print(json.dumps({k: meta.get(k) for k in ("name", "test_top1_pct", "test_top5_pct",
                                               "train_seconds", "epochs", "train_images", "seed")}
                     | {"weights": str(weights)}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
