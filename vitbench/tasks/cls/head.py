"""A new classifier head for the data's classes, fitted by a linear probe.

``--num-classes N`` on a model whose head predicts other classes (an ImageNet model, a
10-class folder) gives it a new, randomly initialised N-way head. Scored as it is, that head
measures noise -- every row near chance, and a learnable method fine-tuned on top of it --
so vitbench fits it once, before any run: the backbone frozen, only the head trained, by
multinomial logistic regression on the backbone's features of the data's ``train/`` split.
This is the linear-probe protocol of representation-learning papers; like CLIP's (Radford et
al., 2021, appendix A.3) it solves the convex problem with full-batch L-BFGS on features
extracted once, which is deterministic and needs no learning rate or epoch count to tune.

The fitted model is saved under ``OUT/checkpoints/`` (a plain state dict, usable as
``--checkpoint``), reused by later commands with the same inputs, and the baseline and every
method of the plan start from it (its inputs are in every run's ``RunSpec.head``, so
``--resume`` re-measures when they change); records and report say how it was made.
"""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from vitbench.errors import DataError, UnsupportedError
from vitbench.core.guards import check_finite
from vitbench.tasks.models import classifier_keys, load_checkpoint
from vitbench.data.image_folder import MissingSplitError
from vitbench.train.batches import cls_batches, data_preprocessor
from vitbench.train.checkpoint import save_trained

__all__ = ["HeadFit", "classifier_layers", "fit_linear_head", "fitted_head", "probe_features"]

#: L-BFGS iterations (each one pass over the cached features; the loss is convex)
PROBE_ITERATIONS = 200
#: L2 penalty on the head's weights (``PROBE_L2 * ||W||^2`` added to the mean cross-entropy)
PROBE_L2 = 1e-4
FEATURE_BATCH = 128


@dataclass
class HeadFit:
    """How a head was fitted: what the record's ``head`` field holds."""
    num_classes: int
    method: str
    train_images: int
    train_top1_pct: float
    iterations: int
    l2: float
    seconds: float
    data: str
    checkpoint_path: Optional[str] = None
    reused: bool = False

    def record(self) -> dict[str, Any]:
        return asdict(self)


def classifier_layers(model: nn.Module) -> list[nn.Linear]:
    """The linear layer(s) ``model.get_classifier()`` returns (two for DeiT's distilled
    models, whose eval forward averages both heads)."""
    get = getattr(model, "get_classifier", None)
    head = get() if callable(get) else None
    layers = list(head) if isinstance(head, (tuple, list)) else [head]
    if not layers or not all(isinstance(layer, nn.Linear) for layer in layers):
        raise UnsupportedError(f"{type(model).__name__}'s classifier ({type(head).__name__}) is not a linear "
                               "layer, so --num-classes cannot fit a new head for it; pass a --checkpoint "
                               "whose head has the data's classes")
    return layers


def probe_features(model: nn.Module, batches: Callable[[], Any], device: str | torch.device = "cpu"
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(features [n, D_total], labels [n])``: what enters the classifier layer(s) for every
    image of ``batches()`` (the inputs of several heads concatenated), in eval mode."""
    layers = classifier_layers(model)
    captured: list[torch.Tensor] = []
    handles = [layer.register_forward_pre_hook(lambda mod, args: captured.append(args[0].detach().float()))
               for layer in layers]
    feats, labels = [], []
    model.eval().to(device)
    try:
        with torch.inference_mode():
            for images, y in batches():
                captured.clear()
                model(images.to(device))
                feats.append(torch.cat(captured, dim=1).cpu())
                labels.append(y.cpu())
    finally:
        for handle in handles:
            handle.remove()
    if not feats:
        raise DataError("the training split holds no images to fit the head on")
    return torch.cat(feats), torch.cat(labels)


def fit_linear_head(features: torch.Tensor, labels: torch.Tensor, num_classes: int, *,
                    iterations: int = PROBE_ITERATIONS, l2: float = PROBE_L2) -> nn.Linear:
    """Multinomial logistic regression ``features -> labels`` by full-batch L-BFGS, from zero
    weights (the problem is convex: the result does not depend on a seed)."""
    x = features.float()
    head = nn.Linear(x.shape[1], num_classes)
    nn.init.zeros_(head.weight)
    nn.init.zeros_(head.bias)
    opt = torch.optim.LBFGS(head.parameters(), lr=1.0, max_iter=iterations, history_size=20,
                            tolerance_grad=1e-7, tolerance_change=1e-10, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = F.cross_entropy(head(x), labels) + l2 * head.weight.pow(2).sum()
        loss.backward()
        return loss

    with torch.enable_grad():
        opt.step(closure)
    check_finite(dict(head.named_parameters()), "linear probe: the fitted head", "")
    return head


def _install(model: nn.Module, fitted: nn.Linear) -> None:
    """Copy the fitted head into the model's classifier layer(s): with ``k`` averaged heads each
    gets ``k`` times its block of the weights and the same bias, so the average is the fit."""
    layers = classifier_layers(model)
    k, start = len(layers), 0
    with torch.no_grad():
        for layer in layers:
            width = layer.in_features
            layer.weight.copy_(k * fitted.weight[:, start:start + width])
            layer.bias.copy_(fitted.bias)
            start += width


def _key(fields: dict[str, Any]) -> str:
    return hashlib.sha1(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()[:12]


def _weights_digest(model: nn.Module) -> str:
    """A digest of the backbone's weights (pretrained, a checkpoint's or a random init)."""
    h = hashlib.sha1()
    skip = classifier_keys(model)
    for name, tensor in sorted(model.state_dict().items()):
        if name not in skip:
            h.update(name.encode())
            h.update(tensor.detach().cpu().double().sum().numpy().tobytes())
    return h.hexdigest()[:12]


def fitted_head(model: nn.Module, data: Any, out_dir: Path, *, model_name: str, limit: Optional[int] = None,
                device: str = "cpu", progress: Optional[Callable[[str], None]] = None) -> HeadFit:
    """Fit ``model``'s new head on ``data``'s training split (a
    :class:`~vitbench.tasks.cls.data.ClsData`; ``limit``: its first N images), in place, or load
    the fit a previous command saved under ``out_dir`` for the same backbone weights and data."""
    n = len(data.classes)
    classifier_layers(model)  # unsupported heads fail before the data is read

    try:
        train = data.train_cfg(limit=limit)
    except MissingSplitError as exc:  # other data errors (an empty class folder) say what they are
        raise DataError(f"--num-classes {n} fits a new head on the data's train/ split, which {data.name} "
                        f"lacks ({exc}); add ROOT/train/<class>/<image> or pass a --checkpoint whose head "
                        f"has {n} classes") from exc
    import timm

    key = _key({"model": model_name, "weights": _weights_digest(model), "data": data.name, "classes": list(data.classes),
                "limit": limit, "iterations": PROBE_ITERATIONS, "l2": PROBE_L2, "timm": timm.__version__})
    path = out_dir / f"head-{model_name}-{n}cls-{key}.pth"
    meta = path.with_suffix(".json")
    if path.is_file() and meta.is_file():
        load_checkpoint(model, path, name=model_name)
        if progress:
            progress(f"reusing the {n}-way head fitted earlier: {path}")
        return HeadFit(**{**json.loads(meta.read_text()), "reused": True})
    if progress:
        progress(f"fitting a new {n}-way head (linear probe, backbone frozen) on the train split of {data.name}")
    start = time.perf_counter()
    batches = cls_batches(train, data_preprocessor(model, data.bgr), device=device, batch_size=FEATURE_BATCH)
    features, labels = probe_features(model, batches, device)
    check_finite(features, "linear probe: the backbone's features", "on the train split")
    fitted = fit_linear_head(features, labels, n)
    with torch.no_grad():
        top1 = float((fitted(features).argmax(1) == labels).float().mean() * 100)
    _install(model, fitted)
    model.eval()
    fit = HeadFit(num_classes=n, method="linear probe (L-BFGS logistic regression, backbone frozen)",
                  train_images=int(labels.numel()), train_top1_pct=round(top1, 2), iterations=PROBE_ITERATIONS,
                  l2=PROBE_L2, seconds=round(time.perf_counter() - start, 2), data=data.name,
                  checkpoint_path=str(path))
    save_trained(model, path)
    meta.write_text(json.dumps(fit.record(), indent=1))
    if progress:
        progress(f"head fitted in {fit.seconds:.0f} s on {fit.train_images} images "
                 f"(train top-1 {fit.train_top1_pct:.1f} %); saved to {path}")
    return fit
