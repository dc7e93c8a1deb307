"""``vitbench visualize --method M[,M2] [--param M.KEY=VALUE ...] [--model NAME] [--image PATH |
--index N] [--blocks 3,6,9] --out DIR``: which patches each method merged or pruned after each
chosen block, for one image, as one PNG (docs/visualize.md). Bad input exits 2 in one line before
the model loads."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Optional
from vitbench.core.cache import atomic_write
from vitbench.errors import ParamError, UnsupportedError, VitbenchError
from vitbench.run.plan import parse_param_overrides
from vitbench.task import REFERENCES
from vitbench.tasks.embedded import DEFAULT_MODEL


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("visualize", help="draw which patches methods merge or prune, block by block, on one image")
    p.add_argument("--method", required=True, help="comma-separated method names: one row each (e.g. tome,topk)")
    p.add_argument("--param", action="append", default=[], metavar="METHOD.KEY=VALUE",
                   help="method parameter, e.g. tome.r=4 (repeatable)")
    p.add_argument("--model", default=None,
                   help="timm ViT/DeiT name (random weights unless --checkpoint); default: the embedded "
                        "default model with its shipped weights")
    p.add_argument("--checkpoint", default=None, help="local weights file for --model (.pth state dict)")
    source = p.add_mutually_exclusive_group()
    source.add_argument("--image", default=None, help="an image file, resized to the model's input")
    source.add_argument("--index", default=None, help="a Fashion-MNIST test image (default 0)")
    p.add_argument("--blocks", default=None,
                   help="0-based blocks to draw after, e.g. 3,6,9 (default: four spread over the depth)")
    p.add_argument("--seed", default=None, help="seed of random weights and method initialisations (default 0)")
    p.add_argument("--out", required=True, help="folder to write visualize-<methods>.png into")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from vitbench.visualize import Choice, parse_blocks, visualize  # matplotlib and torch: when it draws

    if args.model is not None and not args.model.strip():
        raise ParamError(f"--model '' is empty; give a timm ViT/DeiT name or leave --model out for {DEFAULT_MODEL}")
    methods = [m.strip() for m in args.method.split(",") if m.strip()]
    params = parse_param_overrides(args.param)
    if unused := [m for m in params if m not in methods]:
        raise ParamError(f"--param names method {unused[0]!r}, which --method does not list "
                         f"({', '.join(methods) or 'none'})")
    png = visualize([Choice(m, params.get(m, {})) for m in dict.fromkeys(methods)], args.out,
                    model=args.model or DEFAULT_MODEL, image=args.image,
                    index=_integer("--index", args.index, 0), blocks=parse_blocks(args.blocks),
                    checkpoint=args.checkpoint, seed=_integer("--seed", args.seed, 0))
    print(f"wrote {png}")
    return 0


def _integer(flag: str, text: Optional[str], default: int) -> int:
    """An integer option (kept as text by argparse so that a bad one is this one-line error)."""
    if text is None:
        return default
    try:
        number = int(text.strip())
    except ValueError:
        raise ParamError(f"{flag} {text!r} is not an integer; give an integer, e.g. {flag} {default}") from None
    if flag == "--seed" and not 0 <= number < 2**32:
        raise ParamError(f"--seed {number} is out of range; it must be in 0 .. {2**32 - 1}")
    return number


def check_run_visualize(args: argparse.Namespace, task: str) -> None:
    """``vitbench run --visualize``: refuse another task or a model that is no ViT/DeiT before the run."""
    # torch/pandas: when this command runs; `vitbench --help` stays light
    from vitbench.visualize.inputs import check_vit_name

    if task != "cls":
        raise UnsupportedError(f"--visualize draws classification runs of ViT/DeiT models; got --task {task} "
                               f"(use --task cls, or `vitbench visualize --model ...` on the backbone)")
    check_vit_name(args.model or DEFAULT_MODEL)


def visualize_run(results: Any) -> Optional[Path]:
    """The figure of a finished run's methods (their recorded parameters) on Fashion-MNIST test
    image 0, written into the run's folder and linked from its report.md; a failure here is a
    warning (the run's records are kept), returned as ``None``."""
    import json

    # torch/pandas: when this command runs; `vitbench --help` stays light
    from vitbench.visualize import Choice, visualize

    options = results.options
    chosen: dict[tuple[str, str], Choice] = {}
    for rec in results.records:
        if rec.get("status") == "ok" and rec.get("method") not in REFERENCES:
            key = (rec["method"], json.dumps(rec.get("params") or {}, sort_keys=True))
            chosen.setdefault(key, Choice(rec["method"], rec.get("params") or {}, rec.get("label")))
    if not chosen:
        print("vitbench: warning: --visualize: no method run finished; no figure drawn", file=sys.stderr)
        return None
    seed = options.seed if options.seed is not None else (options.seeds or (0,))[0]
    try:
        png = visualize(list(chosen.values()), results.out, model=options.model or DEFAULT_MODEL,
                        checkpoint=options.checkpoint, pretrained=options.pretrained, seed=seed)
        link_in_report(results.report, png)
    except (VitbenchError, ValueError, OSError) as exc:
        print(f"vitbench: warning: --visualize: no figure drawn: {exc}", file=sys.stderr)
        return None
    print(f"figure: {png}")
    return png


def link_in_report(md: Path, png: Path) -> None:
    """Add one image line for ``png`` under report.md's "## Plot" section (a new section if none);
    ``vitbench report`` adds it again from the file (:mod:`vitbench.report.attached`)."""
    # torch/pandas: when this command runs; `vitbench --help` stays light
    from vitbench.report.attached import with_figure

    text = with_figure(md.read_text(encoding="utf-8"), png.name)
    atomic_write(md, lambda tmp: tmp.write_text(text, encoding="utf-8", errors="backslashreplace"))
