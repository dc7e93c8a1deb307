"""The information-bottleneck estimate's pieces a method trains on (LTM's bound, DCS's IB
score): the feature source, class centroids and soft assignments, ``log Q(a|y)``, the IB terms,
and the k-means clusters (docs/methods.md, "The IB loss")."""
from __future__ import annotations

from vitbench.measure.clusters import KMEANS_SAMPLES, kmeans_centroids, run_seed
from vitbench.measure.ib import (
    ClassSums, class_centroids, feature_source, ib_terms, input_vectors, log_q_given_y, module_features,
    pooled_features, soft_assign,
)

__all__ = ["KMEANS_SAMPLES", "ClassSums", "class_centroids", "feature_source", "ib_terms", "input_vectors",
           "kmeans_centroids", "log_q_given_y", "module_features", "pooled_features", "run_seed", "soft_assign"]
