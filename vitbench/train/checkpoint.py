"""Fine-tuned models as checkpoints beside the result store, reloaded on ``--resume``.

A checkpoint is the reduced timm model's plain state dict (tensors only: the method's
parameters and buffers under ``blocks.i.reducer.*``, the timm weights under their own keys)
written atomically, so it loads with ``torch.load(weights_only=True)``: nothing is unpickled
but tensors. Reloading applies the method to a fresh model, lets the method reshape it
(``Reduction.prepare_load``: DCS's shrunk MLPs) and loads with ``strict=True``.
"""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from vitbench.core.cache import atomic_write
from vitbench.engine.block import reduction_context
from vitbench.errors import CheckpointError

__all__ = ["load_trained", "save_trained"]


def save_trained(model: nn.Module, path: str | Path) -> Path:
    """Write ``model``'s state dict to ``path`` (temp file + rename: never half-written), with
    the mode a plain ``open()`` gives (0666 less the umask: a shared ``--out`` stays readable)."""
    state = {k: v.detach().cpu().clone().contiguous() for k, v in model.state_dict().items()}
    return atomic_write(path, lambda tmp: torch.save(state, tmp))


def load_trained(model: nn.Module, path: str | Path) -> nn.Module:
    """Load a checkpoint written by :func:`save_trained` into the freshly reduced ``model``.

    Raises :class:`CheckpointError` naming the file when it is unreadable, not a state dict,
    or does not fit the model (another method, other parameters, another backbone).
    """
    path = Path(path)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unreadable file is the same user error
        raise CheckpointError(f"fine-tuned checkpoint {path} is unreadable ({type(exc).__name__}: "
                              f"{exc}); delete it to fine-tune again") from exc
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"fine-tuned checkpoint {path} is not a state dict of tensors; "
                              "delete it to fine-tune again")
    ctx = reduction_context(model)
    prepare = getattr(ctx.reduction, "prepare_load", None) if ctx is not None else None
    try:
        if prepare is not None:
            prepare(model, state)
        model.load_state_dict(state, strict=True)
    except (RuntimeError, KeyError, ValueError) as exc:
        raise CheckpointError(f"fine-tuned checkpoint {path} does not fit this model "
                              f"({str(exc).splitlines()[0]}); delete it to fine-tune again") from exc
    return model
