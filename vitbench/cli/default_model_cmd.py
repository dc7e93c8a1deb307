"""``vitbench default-model [--model NAME] [--retrain]``: where an embedded model comes from and how it
was made; ``--retrain`` trains it again into the cache and compares with the shipped one."""
from __future__ import annotations

import argparse

from vitbench.core import progress
from vitbench.tasks.embedded import DEFAULT_MODEL, EMBEDDED_MODELS, model_card, retrain_model


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("default-model", help="show (or --retrain) an embedded model: a small Fashion-MNIST "
                                             "ViT or dense backbone whose weights ship with vitbench")
    p.add_argument("--model", default=DEFAULT_MODEL, choices=list(EMBEDDED_MODELS),
                   help=f"which embedded model (default: {DEFAULT_MODEL})")
    p.add_argument("--retrain", action="store_true",
                   help="train it again by its recipe into the cache (used from then on); an "
                        "interrupted retrain resumes from its last epoch")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if args.retrain:
        with progress.reporting(progress.sink_for()):  # a bar with the time left on a terminal
            print(retrain_model(args.model))
        return 0
    print(model_card(args.model))
    return 0
