"""An embedded model's card: where its weights come from, how well it classifies and the recipe
that made it (``vitbench default-model``), and its retraining by that recipe (``--retrain``)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from vitbench.tasks.cls import default_model as dm

__all__ = ["card", "describe", "retrain"]


def card(name: str) -> str:
    """Where the embedded model ``name``'s weights are (cached or shipped) and how it was made."""
    cfg = dm.train_config(model=name)
    cached, shipped = dm.cache_paths(cfg, model=name)[0], dm.shipped_paths(cfg, name)[0]
    source = cached if cached.is_file() else shipped if shipped.is_file() else None
    if source is None:
        return f"{name}: no cached or shipped weights; the first run trains it into {cached.parent}"
    _, meta = dm.load_default_model(model=name, verbose=False)
    return (f"{name}: {'cached' if source == cached else 'shipped with vitbench'}: {source}\n"
            f"{describe(meta)}\n  weights {source.stat().st_size / 1e6:.1f} MB, sha256 "
            f"{meta.get('weights_sha256')}, settings hash {meta['config_hash']}")


def retrain(name: str) -> str:
    """Train ``name`` again by its recipe into the cache; what it scored against the shipped weights."""
    cfg = dm.train_config(model=name)
    _, meta = dm.train_default_model(model=name)
    shipped_top1 = _top1(dm.shipped_paths(cfg, name)[1])
    return (f"retrained {name}: test top-1 {meta['test_top1_pct']:.2f} % (shipped: "
            f"{'none' if shipped_top1 is None else f'{shipped_top1:.2f} %'}); saved {dm.cache_paths(cfg, model=name)[0]}")


def describe(meta: dict[str, Any]) -> str:
    """The model, its accuracy and the recipe that made it, in a few indented lines."""
    versions = ", ".join(f"{k} {v}" for k, v in (meta.get("versions") or {}).items())
    return (f"  {_architecture(meta)}\n"
            f"  test top-1 {meta['test_top1_pct']:.2f} %, top-5 {meta['test_top5_pct']:.2f} % on "
            f"{meta['test_images']} Fashion-MNIST test images\n"
            f"  recipe: {_recipe_line(meta)}\n"
            + _parents(meta)
            + (f"  trained: {meta['trained_on']}\n" if meta.get("trained_on") else
               f"  trained in {meta.get('train_seconds', 0) / 60:.0f} min on {meta.get('torch_threads')} threads; ")
            + f"{'  versions: ' if meta.get('trained_on') else ''}{versions}\n  again: {meta.get('command', 'vitbench default-model --retrain')}")


def _architecture(meta: dict[str, Any]) -> str:
    """What the model is: a ViT's layout, or a timm model's name and input (the dense backbones)."""
    arch = meta["arch"]
    if meta.get("timm_name"):
        channels, height, width = meta["input_size"]
        stored = f", stored in {meta['stored_dtype']}" if meta.get("stored_dtype", "float32") != "float32" else ""
        return (f"timm {meta['timm_name']} ({', '.join(f'{k}={v}' for k, v in arch.items())}): {height}x{width} "
                f"input, {channels} channels (the grey image repeated){stored}")
    side = arch["img_size"] // arch["patch_size"]
    tokens = side * side + (1 if arch.get("class_token", True) else 0)
    return (f"timm VisionTransformer: {arch['img_size']}x{arch['img_size']} input, patch {arch['patch_size']}, "
            f"{tokens} tokens ({side}x{side} patches + class token), width {arch['embed_dim']}, "
            f"{arch['depth']} blocks, {arch['num_heads']} heads, MLP ratio {arch['mlp_ratio']:g}")


def _recipe_line(meta: dict[str, Any]) -> str:
    """One entry's recipe: epochs, images, optimiser and what else it used."""
    recipe = meta.get("recipe") or {}
    extras = []
    if recipe.get("augment"):
        extras.append("random crops (2-pixel padding) and flips")
    if recipe.get("label_smoothing"):
        extras.append(f"label smoothing {recipe['label_smoothing']}")
    if recipe.get("patch_drop"):
        extras.append(f"patch dropout per epoch {', '.join(f'{r:g}' for r in recipe['patch_drop'])}")
    return (f"{meta['epochs']} epoch(s) on {meta['train_images']} images, batch {meta['batch_size']}, "
            f"AdamW lr {meta['lr']} (warm-up, cosine), seed {meta['seed']}" + (f"; {'; '.join(extras)}" if extras else ""))


def _parents(meta: dict[str, Any]) -> str:
    """A line per shipped entry the training continued from (``Recipe.start_from``), nearest first."""
    lines, stem = [], (meta.get("recipe") or {}).get("start_from")
    while stem:
        path = dm.SHIPPED_DIR / f"{stem}.json"
        if not path.is_file():
            lines.append(f"  continued from {stem} (its metadata is not in this package)\n")
            break
        parent = json.loads(path.read_text())
        lines.append(f"  continued from {stem} ({parent['test_top1_pct']:.2f} %), made by: {_recipe_line(parent)}\n")
        stem = (parent.get("recipe") or {}).get("start_from")
    return "".join(lines)


def _top1(meta_path: Path) -> float | None:
    return json.loads(meta_path.read_text()).get("test_top1_pct") if meta_path.is_file() else None
