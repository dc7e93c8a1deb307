"""Where the default model's weights came from, in words, for a record's ``weights_from``
(:func:`vitbench.tasks.identity.weights_from`): the shipped entry or a retrain in the cache."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from vitbench.tasks.cls import DEFAULT_MODEL

__all__ = ["default_model_sha256", "default_model_weights"]


def _sha(meta_path: Path) -> Optional[str]:
    try:
        return str(json.loads(meta_path.read_text())["weights_sha256"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def default_model_sha256(name: str = DEFAULT_MODEL) -> Optional[str]:
    """The sha256 of the embedded model's weights that
    :func:`~vitbench.tasks.cls.default_model.load_default_model` reads (the cache first, then
    the shipped entry); ``None`` when neither metadata file says."""
    # torch: the default model's module, when its weights are named
    from vitbench.tasks.cls import default_model as dm

    cfg = dm.train_config(model=name)
    cached_pth, cached_meta = dm.cache_paths(cfg, model=name)
    cached = _sha(cached_meta) if cached_pth.is_file() else None
    return cached or _sha(dm.shipped_paths(cfg, name)[1])


def default_model_weights(name: str = DEFAULT_MODEL) -> str:
    """An embedded model's weights in words, from the metadata of the entry
    :func:`~vitbench.tasks.cls.default_model.load_default_model` reads (the cache first, then the
    shipped one): ``embedded default vitbench-fmnist-deit (sha256 fe042ea1786f)``, or ``retrained
    here`` when the cache holds other weights than the shipped ones."""
    # torch: the default model's module, when its weights are named
    from vitbench.tasks.cls import default_model as dm

    cfg = dm.train_config(model=name)
    cached_pth, cached_meta = dm.cache_paths(cfg, model=name)
    shipped = _sha(dm.shipped_paths(cfg, name)[1])
    cached = _sha(cached_meta) if cached_pth.is_file() else None
    if cached is not None and cached != shipped:
        return f"default {name} retrained here (sha256 {cached[:12]}, in {cached_pth.parent})"
    digest = cached or shipped
    return f"embedded default {name} (sha256 {digest[:12]})" if digest else f"embedded default {name}"
