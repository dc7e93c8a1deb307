"""The linear probe behind ``--num-classes``: features, the fit, the install into one or two
heads, the saved fit reused, and its errors."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from timm.models.deit import VisionTransformerDistilled
from torch import nn

from vitbench.errors import DataError, UnsupportedError
from vitbench.tasks.cls.data import resolve_cls_data
from vitbench.tasks.cls.evaluate import evaluate_cls
from vitbench.tasks.cls.head import classifier_layers, fit_linear_head, fitted_head, probe_features


def _folder(root: Path, writer, splits=("val", "train")) -> Path:
    for split in splits:
        for k, name in enumerate(["ant", "bee", "cat"]):
            writer(root / split, {name: 3}, size=(36, 36), seed=k + (10 if split == "train" else 0))
    return root


def test_fit_is_deterministic_and_separates_separable_classes() -> None:
    gen = torch.Generator().manual_seed(0)
    centres = torch.randn(4, 16, generator=gen) * 3
    labels = torch.arange(4).repeat_interleave(25)
    features = centres[labels] + 0.3 * torch.randn(100, 16, generator=gen)
    a, b = fit_linear_head(features, labels, 4), fit_linear_head(features, labels, 4)
    assert torch.equal(a.weight, b.weight) and torch.equal(a.bias, b.bias)
    assert (a(features).argmax(1) == labels).all()


def test_fitted_head_is_installed_saved_and_reused(make_model, folder_writer, tmp_path: Path) -> None:
    root = _folder(tmp_path / "data", folder_writer)
    model = make_model(num_classes=3)
    data = resolve_cls_data(str(root), model)
    said: list[str] = []
    fit = fitted_head(model, data, tmp_path / "ckpt", model_name="tiny", progress=said.append)
    assert fit.num_classes == 3 and fit.train_images == 9 and not fit.reused
    assert fit.train_top1_pct == 100.0  # 9 images, 96 features: separable
    assert Path(fit.checkpoint_path).is_file() and Path(fit.checkpoint_path).parent == tmp_path / "ckpt"
    assert json.loads(Path(fit.checkpoint_path).with_suffix(".json").read_text())["train_images"] == 9
    features, labels = probe_features(model, lambda: iter([(torch.randn(2, 3, 32, 32), torch.zeros(2))]))
    assert features.shape == (2, model.head.in_features)
    again = make_model(num_classes=3)  # same backbone weights (seeded): the saved fit is reused
    fit2 = fitted_head(again, data, tmp_path / "ckpt", model_name="tiny", progress=said.append)
    assert fit2.reused and fit2.train_top1_pct == fit.train_top1_pct
    assert torch.equal(again.head.weight, model.head.weight)
    assert any("reusing" in s for s in said)
    other = make_model(num_classes=3, seed=1)  # other backbone weights: fitted anew
    assert not fitted_head(other, data, tmp_path / "ckpt", model_name="tiny").reused
    assert evaluate_cls(model, data)["num_images"] == 9


def test_two_averaged_heads_get_the_fit_together(folder_writer, tmp_path: Path) -> None:
    """DeiT's distilled model averages two heads in eval: the probe fits them as one."""
    torch.manual_seed(0)
    model = VisionTransformerDistilled(img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2,
                                       num_classes=3).eval()
    model.pretrained_cfg = {"input_size": (3, 32, 32), "crop_pct": 1.0, "interpolation": "bilinear",
                            "mean": (0.5, 0.5, 0.5), "std": (0.5, 0.5, 0.5)}
    assert len(classifier_layers(model)) == 2
    data = resolve_cls_data(str(_folder(tmp_path / "data", folder_writer)), model)
    fit = fitted_head(model, data, tmp_path / "ckpt", model_name="distilled")
    from vitbench.train.batches import cls_batches, data_preprocessor

    batches = cls_batches(data.train_cfg(), data_preprocessor(model, data.bgr))
    features, labels = probe_features(model, batches)
    assert features.shape[1] == 64  # both heads' inputs
    logits = torch.cat([model(x) for x, _ in batches()])
    assert (logits.argmax(1) == labels).float().mean() * 100 == pytest.approx(fit.train_top1_pct)


def test_no_train_split_is_a_clear_error(make_model, folder_writer, tmp_path: Path) -> None:
    root = _folder(tmp_path / "data", folder_writer, splits=("val",))
    model = make_model(num_classes=3)
    with pytest.raises(DataError, match=r"--num-classes 3 fits a new head on the data's train/ split, which "
                                        r".* lacks .*; add ROOT/train/<class>/<image> or pass a --checkpoint"):
        fitted_head(model, resolve_cls_data(str(root), model), tmp_path / "ckpt", model_name="tiny")
    assert not (tmp_path / "ckpt").exists()


def test_a_head_that_is_not_linear_is_unsupported() -> None:
    class Odd(nn.Module):
        def get_classifier(self) -> nn.Module:
            return nn.Sequential(nn.Linear(2, 2), nn.ReLU())

    with pytest.raises(UnsupportedError, match="Odd's classifier \\(Sequential\\) is not a linear layer"):
        classifier_layers(Odd())
