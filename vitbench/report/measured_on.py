"""What a run was measured on -- its data and evaluation images, a new classifier head, its
weights -- as the key the report compares rows by: a row is compared only with a baseline of
the same key (docs/measuring.md, "What a run's identity holds").

Records carry it as ``measured_on`` (``{"data": "fashion-mnist", "images": 16, "head": "2-way,
fitted on 4 training images", "weights": "init_seed=0"}``, the unset ones left out). A record
written before that field existed gets it from its own fields (``data``, ``num_images``,
``head``), so an old store loads and groups as it was measured; such a record cannot say what
its weights were.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Optional

__all__ = ["derive_measured_on", "describe", "in_group", "measured_on", "on_key"]

Record = Mapping[str, Any]


def _count(v: Any) -> Optional[int]:
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def derive_measured_on(rec: Record, *, limit: Optional[int] = None, weights: Optional[str] = None,
                       data_id: Optional[str] = None, img_size: Optional[int] = None) -> dict[str, Any]:
    """``measured_on`` from a record's fields: its ``data`` and, given, the folder's fingerprint
    ``data_id``; ``images``, the ``num_images`` it evaluated, else ``limit`` (``--limit``, where
    the run read data); the ``head`` it was fitted as; and ``weights`` (the run spec's:
    ``init_seed=S`` or ``sha256=...``) and the ``img_size`` the model was resized to (``--img-size``)
    when given."""
    out: dict[str, Any] = {}
    if rec.get("data") is not None:
        out["data"] = str(rec["data"])
    if data_id:
        out["data_id"] = str(data_id)
    images = _count(rec.get("num_images"))
    images = images if images is not None else _count(limit)
    if images is not None:
        out["images"] = images
    head = rec.get("head")
    if isinstance(head, Mapping):
        out["head"] = f"{head.get('num_classes')}-way, fitted on {head.get('train_images')} training images"
    if weights:
        out["weights"] = str(weights)
    if img_size:
        out["img_size"] = int(img_size)
    return out


def measured_on(rec: Record) -> dict[str, Any]:
    """The record's ``measured_on``, or for an older record the one its fields give."""
    on = rec.get("measured_on")
    return dict(on) if isinstance(on, Mapping) else derive_measured_on(rec)


def on_key(rec: Record) -> str:
    """:func:`measured_on` as a hashable, comparable key (canonical JSON)."""
    return json.dumps(measured_on(rec), sort_keys=True, default=str)


def in_group(rec: Record, key: str) -> bool:
    """Whether ``rec`` belongs with the runs measured on ``key``: the same :func:`on_key`; a run
    that did not finish, and so counted no images, matches on the rest."""
    mine, theirs = measured_on(rec), json.loads(key)
    if rec.get("status") != "ok" and "images" not in mine:
        theirs.pop("images", None)
    return mine == theirs


def describe(key: str) -> str:
    """An :func:`on_key` in words: ``16 evaluation images of fashion-mnist; head: 2-way, fitted on
    4 training images; weights: random init (seed 0)``."""
    on = json.loads(key)
    data, images = on.get("data"), on.get("images")
    if data is None:
        parts = ["random inputs (no data)" if images is None else f"{images} images"]
    else:
        parts = [f"{images} evaluation images of {data}" if images is not None else f"data {data}"]
    if on.get("data_id"):
        parts.append(f"data {on['data_id'].replace(',', ', ')}")
    if on.get("head"):
        parts.append(f"head: {on['head']}")
    weights = str(on.get("weights") or "")
    if weights.startswith("init_seed="):
        parts.append(f"weights: random init (seed {weights.partition('=')[2]})")
    elif weights.startswith("sha256="):
        parts.append(f"weights: checkpoint sha256 {weights.partition('=')[2][:12]}")
    elif weights:
        parts.append(f"weights: {weights}")
    if on.get("img_size"):
        parts.append(f"input resized to {on['img_size']}x{on['img_size']} (--img-size)")
    return "; ".join(parts)
