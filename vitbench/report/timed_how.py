"""How each row's timings ran, where a run asked for more than the eager model: ``--compile``
and ``--cuda-graph`` each fall back, per run, when a model cannot take them (a compiler failure;
a method whose shapes depend on the data, or a CPU run), and the record says why
(``compile_fallback``, ``cuda_graph_fallback``; :mod:`vitbench.measure.compiled`,
:mod:`vitbench.measure.cuda_graph`). A table whose rows were timed differently compares unlike
with unlike, so the note under it names every row that fell back, and why.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["timed_how_notes"]

_FALLBACKS = (("compile_fallback", "timed without torch.compile"),
              ("cuda_graph_fallback", "timed without a CUDA graph"))


def timed_how_notes(labels: Sequence[str], rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """Markdown lines under a table naming the rows timed without what the run asked for (empty
    when every row was timed as asked)."""
    items = []
    for label, row in zip(labels, rows):
        for rec in row.get("per_seed") or [row]:
            for key, what in _FALLBACKS:
                if rec.get(key):
                    items.append(f"- {label}: {what}: {rec[key]}")
    items = list(dict.fromkeys(items))  # several seeds usually fall back for the same reason
    return ["Rows timed differently from the rest:", ""] + items + [""] if items else []
