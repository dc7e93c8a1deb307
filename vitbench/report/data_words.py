"""What a report's rows were evaluated on, in words for headings and plot titles: the data's name,
how a folder was read, its classes and the image size the model reads (``fashion-mnist, 10 classes,
28x28 images``; ``DIR (flat folder, meta/val.txt, labels 0-9), 10 classes, 224x224 images``)."""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from vitbench.report.words import distinct

__all__ = ["data_words"]


def _size(value: Any) -> str | None:
    """``[1, 28, 28]`` -> ``28x28 images``; None for anything else."""
    if isinstance(value, (list, tuple)) and len(value) == 3 and all(isinstance(v, int) for v in value):
        return f"{value[1]}x{value[2]} images"
    return None


def data_words(records: Iterable[Mapping[str, Any]]) -> str:
    """The data names, class counts and image sizes the records hold, each distinct, joined with
    commas; empty when they hold none."""
    records = list(records)
    parts = distinct(f"{r.get('data')} ({r['data_layout']})" if r.get("data_layout") else r.get("data")
                     for r in records)
    parts += [f"{n} classes" for n in distinct(r.get("num_classes") for r in records)]
    parts += distinct(_size(r.get("input_size")) for r in records)
    return ", ".join(parts)
