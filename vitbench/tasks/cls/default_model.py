"""The embedded default model: a small ViT trained on Fashion-MNIST, shipped with the package.

``vitbench run --task cls`` without ``--model`` must work on a CPU laptop with no download and no
training (docs/architecture.md, "Embedded defaults"). Its weights for the default settings ship
as package data (``weights/``, with the metadata that says how they were made); other settings,
and ``vitbench default-model --retrain``, train it -- through the mmengine ``Runner``, like every
task -- into ``~/.cache/vitbench`` (``$VITBENCH_CACHE`` overrides), which is read first. The architecture is a plain timm
``VisionTransformer`` with 12 blocks, so the methods' default layer choices (e.g. blocks
3, 6, 9) exist, and 8x8 = 64 patch tokens, so token reduction has something to reduce.

Cache entries are named by a hash of the architecture and training settings: changing either
trains a new model instead of loading a stale one. Files are written to a temporary name and
moved into place (``os.replace``), weights first, metadata last, so a crash never leaves a
half-written entry that looks complete; while one process trains, others wait on a lock file.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from timm.models.vision_transformer import VisionTransformer

from vitbench.cache import ENV_CACHE, atomic_write, cache_dir, cache_lock
from vitbench.data.fashion_mnist import CLASSES, load_fashion_mnist, pad_images
from vitbench.tasks.cls import DEFAULT_MODEL

NAME = DEFAULT_MODEL
NUM_CLASSES = 10
IMG_SIZE = 32
#: timm ``VisionTransformer`` kwargs (docs/architecture.md, "Embedded defaults", says why)
ARCH: dict[str, Any] = {"img_size": IMG_SIZE, "patch_size": 4, "in_chans": 1,
                        "num_classes": NUM_CLASSES, "embed_dim": 64, "depth": 12, "num_heads": 4,
                        "mlp_ratio": 2.0, "global_pool": "token", "class_token": True}
#: mean/std of the padded training images in 0-1 scale (a test checks them against the data)
MEAN: tuple[float] = (0.2190,)
STD: tuple[float] = (0.3318,)
#: training defaults, part of the cache key (docs/architecture.md, "Embedded defaults")
EPOCHS = 1
MAX_TRAIN_IMAGES: int | None = None
BATCH_SIZE = 64
LR = 2e-3
WEIGHT_DECAY = 0.05
SEED = 0
WARMUP_FRACTION = 0.05
#: Bump when the cache format (files or metadata layout) changes.
CACHE_FORMAT = 1


def fashion_mnist_stats(data_dir: str | Path | None = None) -> tuple[float, float]:
    """Mean and std (0-1 scale) of the training images padded to 32x32."""
    images, _ = load_fashion_mnist("train", data_dir)
    padded = pad_images(images, IMG_SIZE).astype(np.float64) / 255.0
    return float(padded.mean()), float(padded.std())


def pretrained_cfg() -> dict[str, Any]:
    """timm-style ``pretrained_cfg`` for the default model, so it is read like any timm model."""
    return {"architecture": NAME, "num_classes": NUM_CLASSES, "input_size": (1, IMG_SIZE, IMG_SIZE),
            "crop_pct": 1.0, "interpolation": "bilinear", "mean": MEAN, "std": STD,
            "first_conv": "patch_embed.proj", "classifier": "head", "label_names": CLASSES}


def build_arch() -> VisionTransformer:
    """The untrained default architecture (random init, timm's own initialisation)."""
    model = VisionTransformer(**ARCH)
    model.pretrained_cfg = pretrained_cfg()  # type: ignore[assignment]  # timm sets a plain dict too
    return model


def _iters_per_epoch(num_images: int, batch_size: int) -> int:
    return -(-num_images // batch_size)


def train_config(*, epochs: int = EPOCHS, max_train_images: int | None = MAX_TRAIN_IMAGES,
                 batch_size: int = BATCH_SIZE, lr: float = LR, seed: int = SEED,
                 max_test_images: int | None = None, data_dir: str | None = None) -> dict[str, Any]:
    """The mmengine config (a plain dict) that trains the default model.

    ``configs/cls/fmnist_vit_default.py`` is this dict with the defaults, for use with
    mmengine tools; a test keeps the two equal. The validation split is the Fashion-MNIST test
    set: its top-1 is the number recorded in the cache metadata (``max_test_images`` cuts it
    short, for tests).
    """
    from vitbench.mm.classifier import classifier_cfg

    n_train = 60000 if max_train_images is None else min(int(max_train_images), 60000)
    total = _iters_per_epoch(n_train, batch_size) * epochs
    warmup = max(1, int(total * WARMUP_FRACTION))
    backbone = {"type": "vitbench.TimmVisionTransformer", **ARCH}
    return {
        "default_scope": "mmpretrain",
        "model": classifier_cfg(backbone, mean=MEAN, std=STD, to_rgb=False),
        "train_dataloader": {
            "batch_size": batch_size, "num_workers": 0, "persistent_workers": False,
            "sampler": {"type": "DefaultSampler", "shuffle": True},
            "dataset": {"type": "vitbench.OfflineFashionMNIST", "split": "train",
                        "data_dir": data_dir, "indices": max_train_images,
                        "pipeline": [{"type": "mmpretrain.PackInputs"}]},
        },
        "val_dataloader": {
            "batch_size": 256, "num_workers": 0, "persistent_workers": False,
            "sampler": {"type": "DefaultSampler", "shuffle": False},
            "dataset": {"type": "vitbench.OfflineFashionMNIST", "split": "test",
                        "data_dir": data_dir, "indices": max_test_images},
        },
        "val_evaluator": {"type": "mmpretrain.Accuracy", "topk": (1, 5)},
        "train_cfg": {"by_epoch": True, "max_epochs": epochs, "val_interval": epochs},
        "val_cfg": {},
        "optim_wrapper": {
            "optimizer": {"type": "AdamW", "lr": lr, "weight_decay": WEIGHT_DECAY,
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


def shipped_paths(cfg: dict[str, Any]) -> tuple[Path, Path]:
    """(weights, metadata) paths of the entry shipped with the package for ``cfg`` (present for the
    default settings only)."""
    stem = f"{NAME}-{config_hash(cfg)}"
    return SHIPPED_DIR / f"{stem}.pth", SHIPPED_DIR / f"{stem}.json"


def cache_paths(cfg: dict[str, Any], directory: str | Path | None = None) -> tuple[Path, Path]:
    """(weights ``.pth``, metadata ``.json``) paths of the cache entry for ``cfg``."""
    stem = f"{NAME}-{config_hash(cfg)}"
    folder = cache_dir(directory)
    return folder / f"{stem}.pth", folder / f"{stem}.json"


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


def train_default_model(*, epochs: int = EPOCHS, max_train_images: int | None = MAX_TRAIN_IMAGES,
                        batch_size: int = BATCH_SIZE, lr: float = LR, seed: int = SEED,
                        max_test_images: int | None = None, cache: str | Path | None = None,
                        data_dir: str | None = None,
                        verbose: bool = True, save: bool = True) -> tuple[VisionTransformer, dict[str, Any]]:
    """Train the default model with the mmengine ``Runner`` and (``save``) cache it.

    ``epochs``/``max_train_images`` (the first N training images) let tests train a tiny
    version. Progress goes to stderr when ``verbose``. Deterministic on CPU for a fixed seed
    and thread count. Returns ``(model in eval mode, metadata)``.
    """
    from mmengine.config import Config
    from mmengine.runner import Runner

    from vitbench.mm.hooks import ProgressHook
    from vitbench.mm.runner import release, runner_kwargs

    cfg = train_config(epochs=epochs, max_train_images=max_train_images, batch_size=batch_size,
                       lr=lr, seed=seed, max_test_images=max_test_images, data_dir=data_dir)
    weights_path, meta_path = cache_paths(cfg, cache)
    if verbose:
        n = 60000 if max_train_images is None else min(max_train_images, 60000)
        print(f"vitbench: training the default model {NAME} on {n} Fashion-MNIST images, "
              f"{epochs} epoch(s) (a few minutes on a laptop CPU for the default); this happens "
              f"once, the result is cached in {weights_path.parent}", file=sys.stderr, flush=True)
    saved_det = (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.deterministic,
                 torch.backends.cudnn.benchmark)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="vitbench-train-") as work_dir:
        kwargs = runner_kwargs(work_dir=work_dir, seed=seed, deterministic=True,
                               custom_hooks=[{"type": "vitbench.ProgressHook", "verbose": verbose,
                                              "interval": 50, "prefix": "vitbench: ",
                                              "what": "training the default model"}])
        run_cfg = Config({**cfg, **{k: v for k, v in kwargs.items() if k not in cfg}})
        runner = Runner.from_cfg(run_cfg)
        try:
            runner.train()
        finally:
            release(runner)
            torch.use_deterministic_algorithms(saved_det[0])
            torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = saved_det[1:]
        hook = next(h for h in runner.hooks if isinstance(h, ProgressHook))
        metrics = hook.val_metrics
    seconds = time.perf_counter() - start
    model: VisionTransformer = runner.model.backbone.model.cpu().eval()
    model.pretrained_cfg = pretrained_cfg()  # type: ignore[assignment]  # timm sets a plain dict too
    state = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    meta: dict[str, Any] = {
        "name": NAME, "cache_format": CACHE_FORMAT, "config_hash": config_hash(cfg), "arch": ARCH,
        "mean": list(MEAN), "std": list(STD), "input_size": [1, IMG_SIZE, IMG_SIZE], "crop_pct": 1.0,
        "num_classes": NUM_CLASSES, "classes": list(CLASSES),
        "test_top1_pct": metrics.get("accuracy/top1"), "test_top5_pct": metrics.get("accuracy/top5"),
        "test_images": 10000 if max_test_images is None else min(max_test_images, 10000),
        "train_images": 60000 if max_train_images is None else min(max_train_images, 60000),
        "epochs": epochs, "batch_size": batch_size, "lr": lr, "seed": seed, "train_seconds": round(seconds, 1),
        "torch_threads": torch.get_num_threads(), "versions": _versions(),
        "command": " ".join(shlex.quote(a) for a in sys.argv),
        "call": (f"vitbench.tasks.cls.default_model.train_default_model(epochs={epochs}, "
              f"max_train_images={max_train_images}, batch_size={batch_size}, lr={lr}, seed={seed})"),
        "config": cfg,
    }
    if save:
        atomic_write(weights_path, lambda p: _save_state(state, p))
        meta["weights"] = weights_path.name
        meta["weights_sha256"] = hashlib.sha256(weights_path.read_bytes()).hexdigest()
        atomic_write(meta_path, lambda p: p.write_text(json.dumps(meta, indent=2, default=str) + "\n"))
    if verbose:
        print(f"vitbench: {NAME} trained in {seconds:.0f} s, test top-1 {meta['test_top1_pct']:.2f}%"
              + (f"; saved {weights_path}" if save else ""), file=sys.stderr, flush=True)
    return model, meta


def _load_cached(weights_path: Path, meta_path: Path) -> tuple[VisionTransformer, dict[str, Any]]:
    """Load a cache entry (``weights_only=True``); any problem raises ``ValueError``/``OSError``."""
    meta = json.loads(meta_path.read_text())
    if meta.get("cache_format") != CACHE_FORMAT or meta.get("arch") != json.loads(json.dumps(ARCH)):
        raise ValueError("cache entry from another vitbench version")
    state = torch.load(weights_path, map_location="cpu", weights_only=True)
    model = build_arch()
    model.load_state_dict(state, strict=True)
    return model.eval(), meta


def _from_cache(weights_path: Path, meta_path: Path,
                say: bool = True) -> tuple[VisionTransformer, dict[str, Any]] | None:
    """The cache entry when there is a usable one, else ``None`` (an unusable one said when ``say``)."""
    if not (weights_path.is_file() and meta_path.is_file()):
        return None
    try:
        return _load_cached(weights_path, meta_path)
    except Exception as exc:  # noqa: BLE001 - any unreadable entry is retrained
        if say:
            print(f"vitbench: cached {weights_path} unusable ({type(exc).__name__}: {exc}); retraining",
                  file=sys.stderr, flush=True)
        return None


def load_default_model(*, cache: str | Path | None = None, verbose: bool = True,
                       **train_kwargs: Any) -> tuple[VisionTransformer, dict[str, Any]]:
    """The default model and its metadata: from the cache, else the weights shipped with the
    package (the default settings), else trained now (minutes) and cached.

    ``train_kwargs`` (``epochs``, ``max_train_images``, ``batch_size``, ``lr``, ``seed``,
    ``max_test_images``, ``data_dir``) select a non-default training; each setting has its own cache entry. A
    corrupt entry is reported and retrained. Training holds a lock file beside the entry
    (:func:`vitbench.cache.cache_lock`): a second process asking meanwhile waits, then loads
    what the first one cached instead of training again.
    """
    keys = {"epochs", "max_train_images", "batch_size", "lr", "seed", "max_test_images", "data_dir"}
    if unknown := set(train_kwargs) - keys:
        raise TypeError(f"unknown training arguments {sorted(unknown)}; valid: {sorted(keys)}")
    cfg = train_config(**train_kwargs)
    weights_path, meta_path = cache_paths(cfg, cache)
    found = _from_cache(weights_path, meta_path)  # a retrained entry (`vitbench default-model --retrain`)
    if found is None:
        found = _from_cache(*shipped_paths(cfg))
    if found is not None:
        return found
    with cache_lock(weights_path, "training the default model"):
        found = _from_cache(weights_path, meta_path, say=False)  # cached meanwhile by another process
        if found is not None:
            return found
        return train_default_model(cache=cache, verbose=verbose, **train_kwargs)


def main(argv: list[str] | None = None) -> int:
    """``python -m vitbench.tasks.cls.default_model``: train (or show) the cached default model."""
    parser = argparse.ArgumentParser(description=f"Train vitbench's default model {NAME} once and cache it.")
    parser.add_argument("--epochs", type=int, default=EPOCHS)
    parser.add_argument("--max-train-images", type=int, default=MAX_TRAIN_IMAGES)
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--cache", default=None, help=f"cache folder (default ${ENV_CACHE} or ~/.cache/vitbench)")
    parser.add_argument("--force", action="store_true", help="retrain even if cached")
    args = parser.parse_args(argv)
    kwargs = {"epochs": args.epochs, "max_train_images": args.max_train_images, "seed": args.seed}
    if args.force:
        _, meta = train_default_model(cache=args.cache, **kwargs)
    else:
        _, meta = load_default_model(cache=args.cache, **kwargs)
    weights, _ = cache_paths(train_config(**kwargs), args.cache)
    print(json.dumps({k: meta.get(k) for k in ("name", "test_top1_pct", "test_top5_pct",
                                               "train_seconds", "epochs", "train_images", "seed")}
                     | {"weights": str(weights)}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
