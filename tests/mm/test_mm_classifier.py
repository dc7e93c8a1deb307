"""The mm classifier wrapper: same logits as timm, weights kept, right preprocessing."""
from __future__ import annotations

import pytest
import torch
from mmpretrain.structures import DataSample
from timm.models.deit import VisionTransformerDistilled
from timm.models.vision_transformer import VisionTransformer

from vitbench.errors import ParamError
from vitbench.mm.classifier import build_classifier


def _vit(**kw) -> VisionTransformer:
    torch.manual_seed(0)
    args = {"img_size": 32, "patch_size": 8, "in_chans": 3, "num_classes": 7, "embed_dim": 32,
            "depth": 2, "num_heads": 2}
    return VisionTransformer(**{**args, **kw}).eval()


def test_predict_scores_are_timm_softmax() -> None:
    model = _vit()
    clf = build_classifier(model, mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25), to_rgb=True).eval()
    raw = torch.randint(0, 256, (2, 3, 32, 32), dtype=torch.uint8)
    batch = clf.data_preprocessor({"inputs": list(raw), "data_samples": [DataSample() for _ in range(2)]})
    preds = clf(**batch, mode="predict")
    x = (raw.flip(1).float() - 127.5) / 63.75  # BGR -> RGB, then normalise in 0-255 scale
    with torch.no_grad():
        expected = model(x).softmax(-1)
    got = torch.stack([p.pred_score for p in preds])
    torch.testing.assert_close(got, expected)


def test_distilled_head_averaging_kept() -> None:
    torch.manual_seed(0)
    model = VisionTransformerDistilled(img_size=32, patch_size=8, num_classes=5, embed_dim=32,
                                       depth=1, num_heads=2).eval()
    clf = build_classifier(model, mean=(0.0,) * 3, std=(1.0,) * 3, to_rgb=False).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        tokens = model.forward_features(x)
        averaged = (model.head(tokens[:, 0]) + model.head_dist(tokens[:, 1])) / 2
        feats = clf.extract_feat(x)
    assert len(feats) == 1
    torch.testing.assert_close(feats[0], averaged)


def test_init_weights_keeps_trained_weights() -> None:
    model = _vit()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    clf = build_classifier(model, mean=(0.5,) * 3, std=(0.5,) * 3, to_rgb=False)
    clf.init_weights()  # what Runner.train() calls
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_loss_mode() -> None:
    clf = build_classifier(_vit(), mean=(0.5,) * 3, std=(0.5,) * 3, to_rgb=False).train()
    samples = [DataSample().set_gt_label(i) for i in (1, 3)]
    losses = clf(torch.randn(2, 3, 32, 32), samples, mode="loss")
    assert set(losses) == {"loss"} and losses["loss"].requires_grad


@pytest.mark.parametrize("mean,std,match", [
    ((0.5, 0.5), (0.5, 0.5), "1 or 3 values"),
    ((123.7,), (58.4,), "0-255 values"),
    ((0.5,), (0.0,), "positive"),
])
def test_bad_stats(mean, std, match) -> None:
    with pytest.raises(ParamError, match=match):
        build_classifier(_vit(), mean=mean, std=std, to_rgb=False)
