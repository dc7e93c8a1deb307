"""``vitbench default-model [--retrain]``: where the embedded default model comes from and how it was
made; ``--retrain`` trains it again into the cache (minutes) and compares with the shipped one."""
from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("default-model", help="show (or --retrain) the embedded default model: a small "
                                             "Fashion-MNIST ViT whose weights ship with vitbench")
    p.add_argument("--retrain", action="store_true",
                   help="train it again with the default settings into the cache (used from then on)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from vitbench.tasks.cls import default_model as dm

    cfg = dm.train_config()
    cached, shipped = dm.cache_paths(cfg)[0], dm.shipped_paths(cfg)[0]
    if args.retrain:
        from vitbench import progress

        with progress.reporting(progress.sink_for()):  # a bar with the time left on a terminal
            _, meta = dm.train_default_model()
        shipped_top1 = _top1(dm.shipped_paths(cfg)[1])
        print(f"retrained {dm.NAME}: test top-1 {meta['test_top1_pct']:.2f} % (shipped: "
              f"{'none' if shipped_top1 is None else f'{shipped_top1:.2f} %'}); saved {cached}")
        return 0
    source = cached if cached.is_file() else shipped if shipped.is_file() else None
    if source is None:
        print(f"{dm.NAME}: no cached or shipped weights; the first run trains it into {cached.parent}")
        return 0
    _, meta = dm.load_default_model(verbose=False)
    versions = ", ".join(f"{k} {v}" for k, v in (meta.get("versions") or {}).items())
    print(f"{dm.NAME}: {'cached' if source == cached else 'shipped with vitbench'}: {source}\n"
          f"  test top-1 {meta['test_top1_pct']:.2f} %, top-5 {meta['test_top5_pct']:.2f} % on "
          f"{meta['test_images']} Fashion-MNIST test images\n"
          f"  trained {meta['epochs']} epoch(s) on {meta['train_images']} images, batch {meta['batch_size']}, "
          f"lr {meta['lr']}, seed {meta['seed']}, {meta.get('torch_threads')} threads; {versions}\n"
          f"  weights sha256 {meta.get('weights_sha256')}, settings hash {meta['config_hash']}")
    return 0


def _top1(meta_path) -> float | None:  # type: ignore[no-untyped-def]
    import json

    return json.loads(meta_path.read_text()).get("test_top1_pct") if meta_path.is_file() else None
