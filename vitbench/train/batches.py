"""Plain ``(images, labels)`` batches of a cls data set, normalised like the model's input.

For what runs outside the mmengine loops but must see the same pixels: the fine-tuning loop's
statistics passes (LTM's centroids, DCS's Q), the IB metric on the evaluation split and GMACs
counted on real evaluation images. The data set, its pipeline and the normalisation
(mmpretrain's ``ClsDataPreprocessor``) are the ones the Runner uses.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator, Sized
from typing import Any, Optional

import torch
from torch import nn
from torch.utils.data import Sampler
from vitbench.data.input_config import input_config
from vitbench.data.workers import loader_settings, workers_for
from vitbench.mm.classifier import classifier_cfg

Batches = Callable[[], Iterator[tuple[torch.Tensor, torch.Tensor]]]

__all__ = ["Batches", "LocalSampler", "cls_batches", "data_preprocessor", "first_images", "loader_cfg"]


def data_preprocessor(model: nn.Module, bgr: bool) -> nn.Module:
    """The ``ClsDataPreprocessor`` of ``model``'s input config (mean/std, BGR->RGB)."""
    from mmengine.registry import MODELS, DefaultScope


    cfg = input_config(model)
    pre = classifier_cfg(model, mean=cfg.mean, std=cfg.std, to_rgb=bgr and cfg.in_chans == 3)
    with DefaultScope.overwrite_default_scope("mmpretrain"):
        return MODELS.build(pre["data_preprocessor"])


#: the sampler of :func:`cls_batches` (registered in mmengine's root ``DATA_SAMPLERS``)
LOCAL_SAMPLER = "VitbenchLocalSampler"


class LocalSampler(Sampler):  # type: ignore[type-arg]
    """Every index of the data set in order, on every rank: what :func:`cls_batches` feeds
    (GMACs images, IB, statistics passes) is rank 0's own work under ``--launcher pytorch``,
    not a part of the data as ``DefaultSampler`` would give each rank."""
    def __init__(self, dataset: Sized, seed: Optional[int] = None) -> None:
        self.dataset = dataset

    def __iter__(self) -> Iterator[int]:
        return iter(range(len(self.dataset)))

    def __len__(self) -> int:
        return len(self.dataset)


def _register_local_sampler() -> None:
    from mmengine.registry import DATA_SAMPLERS

    if DATA_SAMPLERS.get(LOCAL_SAMPLER) is None:
        DATA_SAMPLERS.register_module(name=LOCAL_SAMPLER, module=LocalSampler)


def loader_cfg(dataset: dict[str, Any], batch_size: int, shuffle: bool, *, local: bool = False,
               workers: Optional[int] = None, device: str | torch.device = "cpu",
               persistent: bool = False) -> dict[str, Any]:
    """An mmengine dataloader config. ``workers``: ``--workers`` (None: the default for the data
    set, :func:`vitbench.data.workers.workers_for`), kept alive across epochs when ``persistent``
    (a training stage); pinned memory on CUDA. ``local``: the whole data set in order on every
    rank (:class:`LocalSampler`; no shuffle)."""
    sampler = {"type": LOCAL_SAMPLER} if local else {"type": "DefaultSampler", "shuffle": shuffle}
    if local:
        _register_local_sampler()
    return {"batch_size": batch_size, **loader_settings(workers_for(dataset, workers), str(device), persistent=persistent),
            "sampler": sampler, "dataset": dataset}


def cls_batches(dataset: dict[str, Any], preprocessor: nn.Module, *, device: str | torch.device = "cpu",
                batch_size: int = 128, seed: int = 0, workers: Optional[int] = None) -> Batches:
    """A re-iterable source of ``(normalised images [B,C,H,W], labels [B])`` over ``dataset``
    (an mm data-set config, e.g. :meth:`ClsData.dataset_cfg` or :meth:`ClsData.train_cfg`);
    ``workers`` as in :func:`loader_cfg`."""
    from mmengine.registry import DefaultScope
    from mmengine.runner import Runner

    target = torch.device(device)

    def iterate() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        with DefaultScope.overwrite_default_scope("mmpretrain"):
            loader = Runner.build_dataloader(loader_cfg(dataset, batch_size, False, local=True, workers=workers,
                                                        device=target), seed=seed)
        preprocessor.to(target)
        for batch in loader:
            data = preprocessor(batch, False)
            labels = torch.cat([s.gt_label for s in data["data_samples"]])
            yield data["inputs"].to(target), labels.to(target)
    return iterate


def first_images(batches: Batches, n: int) -> Optional[torch.Tensor]:
    """The first ``n`` images of ``batches`` as one tensor (fewer if the data set is smaller)."""
    got: list[torch.Tensor] = []
    count = 0
    for images, _ in batches():
        got.append(images[: n - count])
        count += len(got[-1])
        if count >= n:
            break
    return torch.cat(got) if got else None
