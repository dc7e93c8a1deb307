"""Loading classification backbones: timm models by name, and checkpoints.

Every failure a user can cause (a misspelt name, a corrupt or mismatched checkpoint, weights
that cannot be downloaded offline) becomes one :mod:`vitbench.errors` error naming the bad
value and what to do instead.
"""
from __future__ import annotations

import pickle
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import timm
import torch
from torch import nn

from vitbench.errors import CheckpointError, ParamError
from vitbench.mm.compat import apply_compat
from vitbench.mm.registry import MODELS
from vitbench.tasks.embedded import DEFAULT_MODEL as DEFAULT_MODEL_NAME
from vitbench.tasks.embedded import EMBEDDED_MODELS, EMBEDDED_NUM_CLASSES, load_embedded_model
from vitbench.tasks.model_names import unknown_model

# Prefixes that wrappers put before the timm model's own keys, longest first: mmengine
# checkpoints of vitbench's classifier, DDP/EMA wrappers, plain ``model.`` wrappers.
_PREFIXES = ("backbone.model.", "module.", "model.")
# Top-level keys under which training frameworks nest the state dict (mmengine, timm, DeiT).
_NESTED_KEYS = ("state_dict", "model", "state_dict_ema", "model_ema")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def read_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """Read a checkpoint safely (``weights_only=True``) and return the timm model's state dict.

    Accepts a plain state dict or one nested under ``state_dict`` (mmengine) / ``model``
    (timm, DeiT), with vitbench's mm prefix ``backbone.model.`` or ``module.``/``model.``
    removed; the classifier's other entries (``data_preprocessor.*``) are dropped.
    """
    path = Path(path).expanduser()
    if path.is_dir():
        raise CheckpointError(f"checkpoint {path} is a folder (pass the path of a .pth file)")
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} not found (pass the path of a .pth file)")
    apply_compat()  # registers the safe globals that mmengine checkpoints need
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError, ValueError, TypeError,
            AttributeError, ImportError, IndexError, KeyError, zipfile.BadZipFile) as exc:
        raise CheckpointError(f"cannot read checkpoint {path}: {_first_line(exc)} (pass a state dict saved by "
                              f"torch.save, a .pth file)") from exc
    if isinstance(obj, Mapping):
        for key in _NESTED_KEYS:
            if isinstance(obj.get(key), Mapping):
                obj = obj[key]
                break
    if not isinstance(obj, Mapping) or not obj:
        raise CheckpointError(f"checkpoint {path} holds no state dict (a {type(obj).__name__})")
    state = {k: v for k, v in obj.items() if isinstance(v, torch.Tensor)}
    if not state:
        raise CheckpointError(f"checkpoint {path} holds no tensors (keys: {', '.join(list(obj)[:5])})")
    for prefix in _PREFIXES:
        if any(k.startswith(prefix) for k in state):
            state = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
    return state


def classifier_keys(model: nn.Module) -> set[str]:
    """The state-dict keys of the classifier layer(s) timm's ``get_classifier()`` names."""
    get = getattr(model, "get_classifier", None)
    head = get() if callable(get) else None
    layers = head if isinstance(head, (tuple, list)) else [head]
    ids = {id(layer) for layer in layers if isinstance(layer, nn.Module)}
    return {f"{name}.{key}" for name, module in model.named_modules() if id(module) in ids
            for key in module.state_dict()}


def load_checkpoint(model: nn.Module, path: str | Path, *, name: str = "model", except_head: bool = False) -> None:
    """Load ``path`` into ``model`` strictly; a key or shape mismatch is a :class:`CheckpointError`.

    ``except_head``: the classifier's entries (:func:`classifier_keys`) are neither loaded nor
    required (a backbone checkpoint under a new head)."""
    state = read_state_dict(path)
    own = model.state_dict()
    if except_head:
        skip = classifier_keys(model)
        state = {k: v for k, v in state.items() if k not in skip}
        own = {k: v for k, v in own.items() if k not in skip}
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    shapes = [k for k in own if k in state and tuple(state[k].shape) != tuple(own[k].shape)]
    if missing or unexpected or shapes:
        raise CheckpointError(f"checkpoint {path} does not fit {name}: "
                              f"{_mismatch(model, name, state, own, missing, unexpected, shapes)}")
    model.load_state_dict(state, strict=not except_head)


def _mismatch(model: nn.Module, name: str, state: Mapping[str, torch.Tensor], own: Mapping[str, torch.Tensor],
              missing: list[str], unexpected: list[str], shapes: list[str]) -> str:
    """What differs between a checkpoint's state dict and the model's, and which flag fixes it:
    ``--num-classes N`` when only the classifier head differs, else another ``--model``."""
    head = classifier_keys(model)
    bits = [f"{k} is {list(state[k].shape)} in the checkpoint, {list(own[k].shape)} in the model" for k in shapes[:3]]
    if not missing and not unexpected and set(shapes) <= head:
        weights = [k for k in shapes if state[k].dim() == 2 and own[k].dim() == 2]
        same_width = all(state[k].shape[1] == own[k].shape[1] for k in weights)
        classes = {int(state[k].shape[0]) for k in weights}
        if weights and same_width and len(classes) == 1:
            n = classes.pop()
            return (f"only the classifier head differs ({'; '.join(bits)}): the checkpoint is for {n} classes, "
                    f"the model predicts {int(own[weights[0]].shape[0])}; pass --num-classes {n}")
    if missing:
        bits.insert(0, f"{len(missing)} keys of the model are missing ({', '.join(missing[:3])}"
                       f"{', ...' if len(missing) > 3 else ''})")
    if unexpected:
        bits.insert(0, f"{len(unexpected)} keys are not the model's ({', '.join(unexpected[:3])}"
                       f"{', ...' if len(unexpected) > 3 else ''})")
    shape_of = f"; the checkpoint is {_architecture(state)}, {name} {_architecture(own)}"
    return (f"this checkpoint is for another architecture: {'; '.join(bits)}"
            f"{shape_of if _architecture(state) != _architecture(own) else ''}; pass the --model it was "
            f"saved from (`vitbench list models`)")


def _architecture(state: Mapping[str, torch.Tensor]) -> str:
    """A ViT-like state dict's depth and width as words (``a 12-block model of width 192``), for errors."""
    blocks = {int(k.split(".")[1]) for k in state if k.startswith("blocks.") and k.split(".")[1].isdigit()}
    width = next((int(state[k].shape[-1]) for k in ("cls_token", "pos_embed") if k in state), None)
    if width is None and "patch_embed.proj.weight" in state:
        width = int(state["patch_embed.proj.weight"].shape[0])
    of_width = f" of width {width}" if width is not None else ""
    return f"a {max(blocks) + 1}-block model{of_width}" if blocks else f"a model without blocks.N keys{of_width}"


def _checkpoint_classes(model: nn.Module, path: str | Path) -> int | None:
    """The class count of the checkpoint's classifier when it differs from ``model``'s (same
    feature width), else ``None``."""
    state, own = read_state_dict(path), model.state_dict()
    weights = [k for k in classifier_keys(model) if k.endswith("weight") and own[k].dim() == 2]
    if not weights or not all(k in state and state[k].dim() == 2 and state[k].shape[1] == own[k].shape[1]
                              for k in weights):
        return None
    counts = {int(state[k].shape[0]) for k in weights}
    n = counts.pop() if len(counts) == 1 else None
    return n if n is not None and n != int(own[weights[0]].shape[0]) else None


def _checkpoint_head_fits(model: nn.Module, path: str | Path) -> bool:
    """Whether the checkpoint's classifier entries have the shapes of ``model``'s."""
    state, own = read_state_dict(path), model.state_dict()
    return all(k in state and tuple(state[k].shape) == tuple(own[k].shape) for k in classifier_keys(model))


def load_model(name: str, *, pretrained: bool = False, checkpoint: str | Path | None = None,
               num_classes: int | None = None, seed: int = 0) -> nn.Module:
    """Build classification model ``name`` in eval mode.

    ``name`` is a timm model name (``timm.create_model``) or one of the embedded models
    (``vitbench-fmnist-deit``, the default, or ``vitbench-fmnist-vit``; their weights ship with
    vitbench, so ``pretrained`` is implied).
    ``pretrained=True`` downloads timm's weights from the hub (fails offline: use
    ``checkpoint``). ``checkpoint`` is a local ``.pth`` read with ``weights_only=True``
    (see :func:`read_state_dict`); without ``num_classes`` the model takes the class count of
    the checkpoint's head. ``num_classes`` resizes the classifier head; the head is then
    new (random) unless the checkpoint holds one of that size (a checkpoint with another head
    still gives its backbone), and the model is marked ``vitbench_new_head = True``: its head
    must be fitted before it means anything (:mod:`vitbench.tasks.cls.head`). Random weights
    (no ``pretrained``/``checkpoint``, a new head) are drawn from ``seed``: the same command
    builds the same model.
    """
    if num_classes is not None and (not isinstance(num_classes, int) or num_classes < 1):
        raise ParamError(f"num_classes must be a positive integer, got {num_classes!r}")
    if name in EMBEDDED_MODELS:
        if num_classes not in (None, EMBEDDED_NUM_CLASSES):
            raise ParamError(f"{name} has {EMBEDDED_NUM_CLASSES} classes, got num_classes={num_classes}")
        model: nn.Module = load_embedded_model(name)
    else:
        if not timm.is_model(name):
            raise unknown_model(name, DEFAULT_MODEL_NAME)
        kwargs: dict[str, Any] = {} if num_classes is None else {"num_classes": num_classes}
        try:
            with torch.random.fork_rng():  # seeded random init; the caller's RNG state is untouched
                torch.manual_seed(seed)
                model = timm.create_model(name, pretrained=pretrained, **kwargs)
        except Exception as exc:
            if not pretrained:
                raise
            raise CheckpointError(f"cannot get timm's pretrained weights for {name!r} "
                                  f"({_first_line(exc)}); offline, pass a local checkpoint "
                                  "(--checkpoint PATH) instead of --pretrained") from exc
    new_head = num_classes is not None and name not in EMBEDDED_MODELS and not (
        pretrained and num_classes == (getattr(model, "pretrained_cfg", None) or {}).get("num_classes"))
    if checkpoint is not None and num_classes is None and name not in EMBEDDED_MODELS:
        classes = _checkpoint_classes(model, checkpoint)
        if classes is not None:  # the checkpoint's own head (e.g. fine-tuned on 10 classes)
            with torch.random.fork_rng():
                torch.manual_seed(seed)
                model.reset_classifier(classes)
    if checkpoint is not None:
        keep_head = not new_head or _checkpoint_head_fits(model, checkpoint)
        load_checkpoint(model, checkpoint, name=name, except_head=not keep_head)
        new_head = not keep_head
    if new_head:
        model.vitbench_new_head = True
    return model.eval()


@MODELS.register_module(name="ClsModel")
def cls_model(name: str, pretrained: bool = False, checkpoint: str | None = None,
              num_classes: int | None = None) -> nn.Module:
    """:func:`load_model` for config files: ``dict(type="vitbench.ClsModel", name=...)``."""
    return load_model(name, pretrained=pretrained, checkpoint=checkpoint, num_classes=num_classes)


def resize_input(model: nn.Module, size: int) -> nn.Module:
    """``model`` taking ``size x size`` images (``--img-size``): timm's ``set_input_size`` on a
    ViT/DeiT resamples the position embedding to the new patch grid; another model, or a side
    that is no multiple of the patch, is a :class:`~vitbench.errors.ParamError` naming the valid ones."""
    embed = getattr(model, "patch_embed", None)
    resize = getattr(model, "set_input_size", None)
    if embed is None or resize is None or not hasattr(embed, "patch_size"):
        raise ParamError(f"--img-size {size}: {type(model).__name__} cannot change its input size here; it works "
                         f"with timm ViT/DeiT models (VisionTransformer.set_input_size)")
    patch = int(embed.patch_size[0])
    if size % patch:
        below, above = size - size % patch, size - size % patch + patch
        raise ParamError(f"--img-size {size} is not a multiple of the model's patch size {patch}; valid near it: "
                         f"{', '.join(str(s) for s in (below, above) if s >= patch)}")
    resize(img_size=(size, size))
    return model
