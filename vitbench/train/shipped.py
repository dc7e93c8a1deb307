"""Fine-tuned method weights that ship with a plugin (``MethodSpec.weights``): a run whose
training settings equal an entry's loads them instead of fine-tuning (docs/measuring.md,
"Shipped fine-tuned weights").

An entry is ``NAME.json`` beside ``NAME.pth`` in the plugin's folder. The ``.pth`` holds the
method's state only (every ``*.reducer.*`` parameter and buffer: the trained masks and the
statistics they were trained against), the ``.json`` the settings that made it (model, the
model's weights digest, the method's parameters, training images, seed, precision), its
sha256, what it trained in words, and the command that retrains it. Loading checks the digest,
reads tensors only (``weights_only``) and refuses a file whose keys do not fit the model.
``VITBENCH_SHIPPED=off`` ignores every entry (a retrain).
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Mapping, Optional

import torch
from torch import nn

from vitbench.core.cache import atomic_write
from vitbench.engine.block import reduction_context
from vitbench.errors import CheckpointError

__all__ = ["ENV_SHIPPED", "ShippedWeights", "find_shipped", "load_shipped", "method_state", "shipped_entries",
           "write_shipped"]

#: ``off``: fine-tune even where shipped weights fit (what the retrain command sets)
ENV_SHIPPED = "VITBENCH_SHIPPED"
#: the settings an entry records and a run must equal, in this order
SETTINGS = ("model", "model_sha256", "method", "params", "train_limit", "train_backbone", "seed", "precision", "data")


@dataclass(frozen=True)
class ShippedWeights:
    """One shipped entry: its weights file, the settings that made it and its metadata."""

    path: Path
    settings: dict[str, Any]
    sha256: str
    trained: str
    meta: dict[str, Any]


def _folder(reference: str) -> Optional[Path]:
    """``"package:folder"`` as a directory, ``None`` when the package or folder is missing."""
    package, _, folder = reference.partition(":")
    try:
        root = resources.files(package)
    except (ModuleNotFoundError, TypeError):
        return None
    path = Path(str(root.joinpath(folder)))
    return path if path.is_dir() else None


def shipped_entries(reference: str) -> list[ShippedWeights]:
    """Every well-formed entry in the folder ``reference`` names (``"vitbench_plugins.ltm:weights"``)."""
    folder = _folder(reference) if reference else None
    if folder is None:
        return []
    out = []
    for meta_path in sorted(folder.glob("*.json")):
        try:
            meta = json.loads(meta_path.read_text())
            settings = {key: meta["settings"][key] for key in SETTINGS}
            out.append(ShippedWeights(meta_path.with_suffix(".pth"), settings, str(meta["sha256"]),
                                      str(meta["trained"]), meta))
        except (OSError, ValueError, KeyError, TypeError):
            continue  # not an entry of this format
    return out


def _canonical(settings: Mapping[str, Any]) -> str:
    return json.dumps({key: settings.get(key) for key in SETTINGS}, sort_keys=True, default=str)


def find_shipped(reference: str, settings: Mapping[str, Any]) -> Optional[ShippedWeights]:
    """The entry whose settings equal ``settings``; ``None`` when none does or ``VITBENCH_SHIPPED=off``."""
    if os.environ.get(ENV_SHIPPED, "").strip().lower() == "off":
        return None
    wanted = _canonical(settings)
    return next((e for e in shipped_entries(reference) if _canonical(e.settings) == wanted), None)


def method_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The method's parameters and buffers of a reduced ``model`` (keys with ``.reducer.``)."""
    return {k: v.detach().cpu().clone().contiguous() for k, v in model.state_dict().items() if ".reducer." in k}


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def load_shipped(model: nn.Module, entry: ShippedWeights) -> nn.Module:
    """Load ``entry`` into the freshly reduced ``model``: the digest checked, tensors only, every
    method key present and no other (:class:`CheckpointError` naming the file otherwise)."""
    try:
        digest = _sha256(entry.path)
    except OSError as exc:
        raise CheckpointError(f"shipped weights {entry.path} are unreadable ({exc})") from exc
    if digest != entry.sha256:
        raise CheckpointError(f"shipped weights {entry.path} have sha256 {digest[:12]}, their metadata says "
                              f"{entry.sha256[:12]}: the file is damaged; reinstall vitbench")
    state = torch.load(entry.path, map_location="cpu", weights_only=True)
    expected = {k for k in model.state_dict() if ".reducer." in k}
    if not isinstance(state, dict) or set(state) != expected:
        extra = sorted(set(state) - expected) if isinstance(state, dict) else []
        missing = sorted(expected - set(state)) if isinstance(state, dict) else []
        raise CheckpointError(f"shipped weights {entry.path} do not fit this model (missing {missing[:3]}, "
                              f"unexpected {extra[:3]})")
    ctx = reduction_context(model)
    prepare = getattr(ctx.reduction, "prepare_load", None) if ctx is not None else None
    if prepare is not None:
        prepare(model, state)
    model.load_state_dict(state, strict=False)
    return model


def write_shipped(model: nn.Module, folder: str | Path, name: str, settings: Mapping[str, Any],
                  meta: Mapping[str, Any]) -> Path:
    """Write ``model``'s method state as ``folder/NAME.pth`` and its metadata (``settings``, the
    file's sha256, ``meta``: ``trained``, ``command``, ...) as ``NAME.json``, weights first."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    pth = atomic_write(folder / f"{name}.pth", lambda tmp: torch.save(method_state(model), tmp))
    record = {**meta, "settings": {key: settings.get(key) for key in SETTINGS}, "sha256": _sha256(pth)}
    atomic_write(folder / f"{name}.json", lambda tmp: Path(tmp).write_text(json.dumps(record, indent=2) + "\n"))
    return pth
