"""k-means clusters for the IB bounds (docs/methods.md, "The IB loss"), as the LTM authors' training code and
the DCS paper (its A = B = C clusters) use them instead of class centroids (``clusters=kmeans``
of ``ltm`` and ``dcs``): scikit-learn's :class:`sklearn.cluster.KMeans` with a fixed
``random_state``, fitted on at most :data:`KMEANS_SAMPLES` vectors."""
from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["KMEANS_INIT", "KMEANS_SAMPLES", "kmeans_centroids", "run_seed"]

#: k-means restarts (scikit-learn's ``n_init``): the best of a few runs, as cheap as that stays
KMEANS_INIT = 3
#: the most vectors a statistics pass keeps for the fit (the first ones; bounds memory on ImageNet)
KMEANS_SAMPLES = 8192


def run_seed() -> int:
    """The seed torch's default generator was last seeded with (a run's ``--seed``), read
    without drawing from it, so the k-means initialisation leaves the run's random stream as it is."""
    return int(torch.initial_seed() % (2**32))


def kmeans_centroids(vectors: torch.Tensor, k: int, seed: int, normalize: bool = True) -> torch.Tensor:
    """``[k, D]``: k-means centroids of ``vectors [n, D]`` (``random_state=seed``, ``n_init``
    :data:`KMEANS_INIT`). ``normalize``: cluster the L2-normalised vectors and return unit
    centroids (the space of :func:`~vitbench.measure.ib.soft_assign`); else the raw vectors and
    their cluster means. With fewer distinct samples than ``k``, the missing centroids repeat
    samples (an empty cluster, as a class without samples)."""
    from sklearn.cluster import KMeans

    if k < 1:
        raise ValueError(f"k-means needs k >= 1 clusters, got {k}")
    v = vectors.detach().float().cpu()
    if normalize:
        v = F.normalize(v, dim=1)
    if v.shape[0] == 0:
        raise ValueError("k-means got no samples")
    n_clusters = min(k, v.shape[0])
    km = KMeans(n_clusters=n_clusters, n_init=KMEANS_INIT, random_state=seed).fit(v.numpy())
    centroids = torch.from_numpy(km.cluster_centers_).to(torch.float32)
    if n_clusters < k:
        centroids = torch.cat([centroids, v[torch.arange(k - n_clusters) % v.shape[0]]])
    out = F.normalize(centroids, dim=1) if normalize else centroids
    return out.to(vectors.device)
