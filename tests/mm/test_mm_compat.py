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


def _fake_transformers(root, version: str):
    """A ``transformers`` distribution of ``version`` with none of the modules mmpretrain's
    multimodal models import (as with transformers 5, where several of them moved)."""
    package = root / "transformers"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(f'__version__ = "{version}"\n')
    info = root / f"transformers-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: transformers\nVersion: {version}\n")
    return root


def _import_in_subprocess(code: str, path) -> "subprocess.CompletedProcess[str]":
    import os
    import subprocess
    import sys

    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(path), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)


def test_mmpretrain_imports_where_transformers_5_is_installed(tmp_path):
    """Issue 11: with transformers >= 5, mmpretrain 1.2's BLIP module fails at import
    (``NoneType takes no arguments``); vitbench.mm loads mmpretrain without its multimodal
    models, and the classifier path works."""
    fake = _fake_transformers(tmp_path, "5.0.0")
    plain = _import_in_subprocess("import mmpretrain.models", fake)
    # the simulated break (the real transformers 5 fails in BLIP, this stand-in a few imports on)
    assert plain.returncode != 0 and "transformers" in plain.stderr.splitlines()[-1]
    code = ("import vitbench.mm\n"
            "from mmpretrain.utils.dependency import WITH_MULTIMODAL\n"
            "import mmpretrain.models\n"
            "from mmpretrain.registry import MODELS\n"
            "from vitbench.mm.classifier import build_classifier\n"
            "print('multimodal', WITH_MULTIMODAL, 'ImageClassifier' in MODELS.module_dict)\n")
    fixed = _import_in_subprocess(code, fake)
    assert fixed.returncode == 0, fixed.stderr[-2000:]
    assert "multimodal False True" in fixed.stdout


def test_transformers_4_keeps_mmpretrain_untouched(tmp_path):
    """Below transformers 5 nothing is preloaded: mmpretrain decides on its multimodal models itself."""
    fake = _fake_transformers(tmp_path, "4.40.0")
    code = ("import sys\nimport vitbench.mm\nfrom vitbench.mm import compat\n"
            "print(compat._transformers_major(), 'mmpretrain.utils.dependency' in sys.modules)\n")
    result = _import_in_subprocess(code, fake)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["4", "False"]
