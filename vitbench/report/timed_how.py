"""How each row's timings ran, where a run asked for more than the eager model: ``--compile``
and ``--cuda-graph`` each fall back, per run, when a model cannot take them (a compiler failure;
a method whose shapes depend on the data, or a CPU run), and the record says why
(``compile_fallback``, ``cuda_graph_fallback``; :mod:`vitbench.measure.compiled`,
:mod:`vitbench.measure.cuda_graph`). A table whose rows were timed differently compares unlike
with unlike, so the note under it names every row that fell back, and why; and it says when
the timings ran with ``--quick`` or ``--repeats N`` instead of the default repeats, or paired a
speed-up over fewer rounds (``--limit``: a cheap run).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from vitbench.measure.paired import PAIRED_ROUNDS

__all__ = ["repeats_notes", "timed_how_notes"]

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
    lines = ["Rows timed differently from the rest:", ""] + items + [""] if items else []
    return lines + repeats_notes(labels, rows) + _rounds_notes(rows)


#: the repeats of ``--quick`` (:data:`vitbench.measure.speed.QUICK_REPEATS`) and the fewest the defaults use
_QUICK, _DEFAULT = 3, 10


def repeats_notes(labels: Sequence[str], rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """A sentence under the table when its timings ran with ``--quick``/``--repeats N``
    (``timing_repeats`` in the records): how many repeats, and that few are a fast look."""
    asked = {label: {rec.get("timing_repeats") for rec in row.get("per_seed") or [row]} - {None}
             for label, row in zip(labels, rows)}
    counts = sorted({n for ns in asked.values() for n in ns})
    if not counts:
        return []

    def how(n: int) -> str:
        flag = "--quick" if n == _QUICK else f"--repeats {n}"
        fast = ": a fast look, not for publication" if n < _DEFAULT else ""
        return f"{n} repeat{'s' if n != 1 else ''} ({flag}){fast}"

    if len(counts) == 1 and all(asked.values()):
        return [f"Timed with {how(counts[0])}.", ""]
    return (["Timed with fewer or more repeats than the defaults (10 throughput, 20 latency, 30 paired rounds):", ""]
            + [f"- {label}: {how(n)}" for label, ns in asked.items() for n in sorted(ns)] + [""])


def _rounds_notes(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """A sentence when speed-ups were paired over fewer rounds than the default without
    ``--quick``/``--repeats`` (a run evaluated with ``--limit``)."""
    counts = sorted({rec["speedup_rounds"] for row in rows for rec in row.get("per_seed") or [row]
                     if rec.get("speedup_rounds") and rec["speedup_rounds"] < PAIRED_ROUNDS
                     and rec.get("timing_repeats") is None})
    if not counts:
        return []
    rounds = " or ".join(str(n) for n in counts)
    return [f"Speed-ups timed in turn over {rounds} rounds instead of {PAIRED_ROUNDS} (`--limit`: a cheap run, "
            f"its speed-ups noisier).", ""]
