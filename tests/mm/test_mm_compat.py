"""apply_compat: idempotent, and mmengine checkpoints load with weights_only=True."""
from __future__ import annotations

import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from vitbench.mm.compat import apply_compat, deterministic_cublas


def test_idempotent() -> None:
    apply_compat()
    before = set(map(str, torch.serialization.get_safe_globals()))
    apply_compat()
    assert set(map(str, torch.serialization.get_safe_globals())) == before


def test_mmengine_message_hub_checkpoint_loads_weights_only(tmp_path: Path) -> None:
    from mmengine.logging import MessageHub

    apply_compat()
    hub = MessageHub.get_instance("vitbench-test-compat")
    for i in range(3):
        hub.update_scalar("train/loss", 0.5 / (i + 1))
        hub.update_scalar("train/lr", np.float64(1e-3))
    hub.update_info("epoch", 2)
    ckpt = {"meta": {"epoch": 2, "seed": np.int64(0), "acc": np.float32(0.9)},
            "state_dict": {"w": torch.ones(2)}, "message_hub": hub.state_dict()}
    path = tmp_path / "mm.pth"
    torch.save(ckpt, path)
    loaded = torch.load(path, weights_only=True)
    assert loaded["meta"]["seed"] == 0
    assert loaded["message_hub"]["log_scalars"]["train/loss"].current() == hub.get_scalar("train/loss").current()


class _AsksForGetattr:
    """Pickles as ``getattr(HistoryBuffer, "update")``: not one of the allowed statistics."""

    def __reduce__(self):
        from mmengine.logging.history_buffer import HistoryBuffer

        return getattr, (HistoryBuffer, "update")


def test_getattr_stays_restricted(tmp_path: Path) -> None:
    apply_compat()
    path = tmp_path / "evil.pth"
    torch.save({"x": _AsksForGetattr()}, path)
    with pytest.raises(pickle.UnpicklingError, match="only mmengine HistoryBuffer statistics"):
        torch.load(path, weights_only=True)


def test_deterministic_cublas_respects_user_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
    deterministic_cublas()
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG")
    deterministic_cublas()
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
