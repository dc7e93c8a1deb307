"""The models whose weights ship with vitbench (the embedded defaults): their names, which one is
``--model``'s default, and the fine-tuning budget each comes with (docs/architecture.md,
"Embedded defaults"). Commands and reports name them from here; the ``cls`` task loads and trains them.
"""
from __future__ import annotations

import importlib
import os
import sys
from typing import Any

__all__ = ["DEFAULT_MODEL", "DEIT_MODEL", "DENSE_BACKBONES", "EFFICIENTVIT_MODEL", "EMBEDDED_MODELS", "EMBEDDED_NUM_CLASSES",
           "EMBEDDED_TRAIN_LIMIT", "ENV_DEFAULT_MODEL", "LEGACY_MODEL", "MOBILEVIT_MODEL", "load_embedded_model",
           "model_card", "retrain_model"]

#: the embedded model of DeiT's layout (:mod:`vitbench.tasks.cls.default_model`): 197 tokens
DEIT_MODEL = "vitbench-fmnist-deit"
#: the first embedded model (65 tokens), still loadable by name so older stores report
LEGACY_MODEL = "vitbench-fmnist-vit"
#: MobileViT-XS trained on Fashion-MNIST at 128 pixels: the det task's pretrained backbone
MOBILEVIT_MODEL = "vitbench-fmnist-mobilevit-xs"
#: EfficientViT-B1 trained on Fashion-MNIST at 128 pixels: the seg task's pretrained backbone
EFFICIENTVIT_MODEL = "vitbench-fmnist-efficientvit-b1"
#: the models whose weights ship with vitbench, each in words
EMBEDDED_MODELS: dict[str, str] = {
    DEIT_MODEL: "a ViT of DeiT's layout, 197 tokens, trained 19 epochs on Fashion-MNIST",
    LEGACY_MODEL: "a ViT of 65 tokens at width 64, trained one epoch on Fashion-MNIST (the first default)",
    MOBILEVIT_MODEL: "timm's mobilevit_xs trained one epoch on Fashion-MNIST at 128 pixels (the dense backbone)",
    EFFICIENTVIT_MODEL: "timm's efficientvit_b1 trained one epoch on Fashion-MNIST at 128 pixels (the dense backbone)",
}
#: names another embedded model as ``--model``'s default (the test suite's plumbing tests use it)
ENV_DEFAULT_MODEL = "VITBENCH_DEFAULT_MODEL"


def _default_model() -> str:
    """``$VITBENCH_DEFAULT_MODEL`` when it names an embedded model, else :data:`DEIT_MODEL` (a
    name it does not know is one warning line, not a failure of every command)."""
    named = os.environ.get(ENV_DEFAULT_MODEL, "").strip()
    if named and named not in EMBEDDED_MODELS:
        print(f"vitbench: warning: ${ENV_DEFAULT_MODEL}={named!r} is not an embedded model (valid: "
              f"{', '.join(EMBEDDED_MODELS)}); using {DEIT_MODEL}", file=sys.stderr)
        return DEIT_MODEL
    return named or DEIT_MODEL


#: ``--model``'s default: :data:`DEIT_MODEL` unless ``$VITBENCH_DEFAULT_MODEL`` names another
DEFAULT_MODEL = _default_model()
#: the embedded dense backbone of each timm name (det/seg on the embedded data start from it)
DENSE_BACKBONES: dict[str, str] = {"mobilevit_xs": MOBILEVIT_MODEL, "efficientvit_b1": EFFICIENTVIT_MODEL}
#: ``--train-limit``'s default with each embedded model (docs/architecture.md, "Embedded defaults")
EMBEDDED_TRAIN_LIMIT: dict[str, int] = {DEIT_MODEL: 1000, LEGACY_MODEL: 10000, MOBILEVIT_MODEL: 1000,
                                        EFFICIENTVIT_MODEL: 1000}
#: the classes of every embedded model's head (Fashion-MNIST's)
EMBEDDED_NUM_CLASSES = 10
#: the cls task's loader of the embedded models, by reference: this module and its importers stay light
_LOADER = "vitbench.tasks.cls.default_model:load_default_model"
#: the cls task's module of the embedded models' cards and retraining, by reference as :data:`_LOADER`
_CARD = "vitbench.tasks.cls.model_card"


def load_embedded_model(name: str) -> Any:
    """The embedded model ``name`` with its weights (shipped, cached, or trained now), in eval mode."""
    module, _, function = _LOADER.partition(":")
    return getattr(importlib.import_module(module), function)(model=name)[0]


def model_card(name: str) -> str:
    """Where the embedded model ``name``'s weights come from and how it was made, in a few lines."""
    return importlib.import_module(_CARD).card(name)


def retrain_model(name: str) -> str:
    """Train the embedded model ``name`` again by its recipe into the cache; a line on the result."""
    return importlib.import_module(_CARD).retrain(name)
