"""Issue 35, item 6: what the data path costs an ImageNet-style evaluation, and what decoding once saves.

    python benchmarks/data_path.py [--folder /tmp/vitbench-imagenet-like] [--images 5000] [--classes 100]
        [--eval-images 1000] [--model deit_tiny_patch16_224] [--batch-size 64] [--workers N] [--threads 2]

Generates (once; kept in ``--folder``) an ImageNet-like validation folder: ``--images`` JPEGs of
500x375 pixels in ``--classes`` synset folders, with photo-like content (smooth colour fields,
edges and grain, JPEG quality 90) so that decoding costs what real photographs cost. Then prints
images per second over the first ``--eval-images`` of them for: the loader alone (decode, resize,
centre crop at the model's input config) with 0 and N workers; the model alone (random weights,
``--batch-size``, the forward of :func:`vitbench.measure.measure_throughput`); the evaluation end
to end (:func:`vitbench.tasks.cls.evaluate.evaluate_cls`: loading, preprocessing, model and
scoring) cold, decoding every image, with 0 and N workers; decoding into the decoded-image
cache (:mod:`vitbench.data.decoded`, a fresh temporary one); and end to end from that cache.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from PIL import Image, ImageFilter

SIZE = (500, 375)


def photo_like(rng: np.random.Generator) -> Image.Image:
    """A 500x375 RGB image with a photograph's statistics: smooth colour fields, a few hard
    edges and sensor-like grain (a JPEG of it decodes as slowly as a photo of the same size)."""
    w, h = SIZE
    coarse = rng.integers(0, 256, size=(6, 8, 3), dtype=np.uint8)
    field = np.asarray(Image.fromarray(coarse).resize((w, h), Image.BICUBIC), dtype=np.float32)
    yy, xx = np.mgrid[0:h, 0:w]
    for _ in range(3):  # objects: discs of another colour
        cy, cx, r = rng.integers(0, h), rng.integers(0, w), rng.integers(20, 120)
        field[(yy - cy) ** 2 + (xx - cx) ** 2 < r * r] = rng.integers(0, 256, size=3)
    field += rng.normal(0, 12, size=field.shape)
    image = Image.fromarray(np.clip(field, 0, 255).astype(np.uint8))
    return image.filter(ImageFilter.GaussianBlur(0.6))


def make_folder(root: Path, images: int, classes: int, seed: int = 0) -> Path:
    """``root/val/<synset>/<n>.JPEG``, ``images`` in all over the first ``classes`` ImageNet synsets
    (kept: a folder that already holds as many images is used as it is)."""
    from timm.data import ImageNetInfo

    val = root / "val"
    if val.is_dir() and sum(1 for _ in val.rglob("*.JPEG")) == images:
        return root
    synsets = list(ImageNetInfo().label_names())[:classes]
    rng = np.random.default_rng(seed)
    for i in range(images):
        folder = val / synsets[i % classes]
        folder.mkdir(parents=True, exist_ok=True)
        photo_like(rng).save(folder / f"ILSVRC2012_val_{i + 1:08d}.JPEG", quality=90)
    return root


def _rate(n: int, seconds: float) -> float:
    return n / seconds if seconds > 0 else float("nan")


def loader_rate(data: Any, n: int, workers: int, batch_size: int) -> float:
    """Images per second of the evaluation loader alone (every batch built, nothing run on it)."""
    from mmengine.registry import DefaultScope
    from mmengine.runner import Runner

    from vitbench.train.batches import loader_cfg

    with DefaultScope.overwrite_default_scope("mmpretrain"):
        loader = Runner.build_dataloader(loader_cfg(data.dataset_cfg(limit=n), batch_size, False, workers=workers),
                                         seed=0)
    start = time.perf_counter()
    seen = sum(len(batch["inputs"]) for batch in loader)
    return _rate(seen, time.perf_counter() - start)


def main(argv: list[str] | None = None) -> pd.DataFrame:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", default=os.path.join(tempfile.gettempdir(), "vitbench-imagenet-like"))
    parser.add_argument("--images", type=int, default=5000)
    parser.add_argument("--classes", type=int, default=100)
    parser.add_argument("--eval-images", type=int, default=1000)
    parser.add_argument("--model", default="deit_tiny_patch16_224")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--workers", type=int, default=None, help="the N of the N-worker rows (default: the usable cores)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)

    import timm

    from vitbench.data.decoded import decode_once
    from vitbench.data.fingerprint import folder_fingerprint
    from vitbench.data.workers import usable_cores
    from vitbench.host.environment import device_name
    from vitbench.measure import measure_throughput
    from vitbench.tasks.cls.data import resolve_cls_data
    from vitbench.tasks.cls.evaluate import evaluate_cls

    torch.set_num_threads(args.threads)
    workers = args.workers if args.workers is not None else usable_cores()
    start = time.perf_counter()
    root = make_folder(Path(args.folder), args.images, args.classes)
    made = time.perf_counter() - start
    torch.manual_seed(0)
    model = timm.create_model(args.model, pretrained=False).eval()
    data = resolve_cls_data(str(root), model)
    n = min(args.eval_images, args.images)
    rows: list[dict[str, Any]] = []

    def row(what: str, workers_used: Any, rate: float) -> None:
        rows.append({"what": what, "workers": workers_used, "img/s": rate})
        print(f"  {what}, workers {workers_used}: {rate:.1f} img/s", flush=True)

    for w in (0, workers):
        row("loader alone (decode, resize, crop)", w, loader_rate(data, n, w, args.batch_size))
    tp = measure_throughput(model, args.batch_size, (3, 224, 224), repeats=10)
    row(f"model alone (bs {args.batch_size})", "-", tp.median_img_s)
    for w in (0, workers):
        acc = evaluate_cls(model, data, batch_size=args.batch_size, limit=n, workers=w)
        row("end to end, decoding every image", w, acc["eval_img_s"])
    with tempfile.TemporaryDirectory() as cache:
        os.environ["VITBENCH_DECODED_CACHE"] = cache
        fingerprint = folder_fingerprint(root)
        start = time.perf_counter()
        decoded_cfg, count = decode_once(data.dataset_cfg(limit=n), fingerprint, workers=workers)
        row("decoding once into the cache", workers, _rate(count, time.perf_counter() - start))
        cached = dataclasses.replace(data, decoded=decoded_cfg)
        acc = evaluate_cls(model, cached, batch_size=args.batch_size, limit=n)
        row("end to end, from the decoded cache", 0, acc["eval_img_s"])
    df = pd.DataFrame(rows)
    df["of model alone"] = df["img/s"] / tp.median_img_s
    print(f"\n{args.model}, {n} of {args.images} JPEGs ({SIZE[0]}x{SIZE[1]}, {args.classes} classes; made in "
          f"{made:.0f} s), batch {args.batch_size}, {device_name('cpu')}, {args.threads} threads, torch "
          f"{torch.__version__}")
    print(df.to_markdown(index=False, floatfmt=".2f"))
    return df


if __name__ == "__main__":
    main()
