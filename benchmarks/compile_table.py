"""Which methods compile: for every built-in method on the default model, whether ``--compile``
compiles it in one graph or with graph breaks (counted by ``torch._dynamo.explain``, the first
break's reason), and the paired speed-up of the compiled model over the eager one at a batch size
on this machine (issue 63, item 6).

    python benchmarks/compile_table.py [--methods tome,topk] [--batch-size 32] [--rounds 10] [--write]

``--write`` puts the table into docs/measuring.md ("Which methods compile"), with the command and
machine (tests/docs/test_compile_table.py checks that the page lists every built-in method). Weights as
shipped (the default model; learnable methods untrained: their speed does not depend on training),
fp32, eager and compiled timed in turn (:func:`vitbench.measure.paired.measure_paired_speedup`).
"""
from __future__ import annotations

import argparse
import copy
import platform
import re
import sys
import time
from pathlib import Path
from typing import Any

import torch

import vitbench
from vitbench.host import get_host
from vitbench.measure.compiled import compile_for_timing
from vitbench.measure.paired import measure_paired_speedup

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "measuring.md"
BEGIN, END = "<!-- compile table: begin -->", "<!-- compile table: end -->"
HEADER = ("| method | graphs | graph breaks | first break | compiled / eager (×) |",
          "| --- | ---: | ---: | --- | ---: |")


def builtin_methods() -> list[str]:
    """Every method of vitbench's own plugins, by name (aliases left out)."""
    host = get_host()
    return [n for n in host.names("methods") if host.is_builtin("methods", n) and host.method(n).name == n]


def _first_reason(explained: Any) -> str:
    reasons = getattr(explained, "break_reasons", None) or []
    if not reasons:
        return ""
    text = str(getattr(reasons[0], "reason", reasons[0])).strip().splitlines()[0]
    return re.sub(r"\s+", " ", text).replace("|", "/")[:90]


def row(name: str, model: torch.nn.Module, images: torch.Tensor, rounds: int) -> dict[str, Any]:
    """One method's compile facts and its compiled-over-eager speed-up."""
    try:
        reduced = vitbench.apply(copy.deepcopy(model), name).eval() if name != "baseline" else copy.deepcopy(model)
    except Exception as exc:  # noqa: BLE001 - a method that does not apply to the default model says why
        return {"method": name, "note": f"does not apply: {exc}"}
    torch._dynamo.reset()
    try:
        with torch.inference_mode():
            explained = torch._dynamo.explain(reduced)(images)
    except Exception as exc:  # noqa: BLE001 - dynamo's own failures (its guards' asserts) name the row
        first = (str(exc).strip().splitlines() or [""])[0]
        return {"method": name, "note": f"torch._dynamo.explain failed ({type(exc).__name__}: {first[:80]})"}
    finally:
        torch._dynamo.reset()
    compiled = compile_for_timing(reduced, tuple(images.shape[1:]), (images.shape[0],), "cpu")
    out = {"method": name, "graphs": explained.graph_count, "breaks": explained.graph_break_count,
           "reason": _first_reason(explained)}
    if not compiled.compiled:
        return {**out, "note": compiled.fallback}
    paired = measure_paired_speedup(compiled.module, reduced, images.shape[0], tuple(images.shape[1:]),
                                    rounds=rounds, images=images)
    return {**out, "speedup": paired.speedup, "flag": paired.doubt}


def table(rows: list[dict[str, Any]]) -> str:
    lines = list(HEADER)
    for r in rows:
        if "graphs" not in r:
            lines.append(f"| {r['method']} | n/a | n/a | {r['note'].replace('|', '/')} | n/a |")
            continue
        speed = "n/a" if "speedup" not in r else f"{r['speedup']:.2f}" + (" †" if r.get("flag") else "")
        reason = r.get("note") or r["reason"] or "-"
        lines.append(f"| {r['method']} | {r['graphs']} | {r['breaks']} | {reason} | {speed} |")
    return "\n".join(lines)


def merged(written: str, text: str, names: list[str], note: str) -> tuple[str, str]:
    """The page's table (``written``, with its note) with the rows of ``names`` from ``text``
    replacing or joining its own, sorted as the script sorts them (the baseline first); the note
    is the page's, then this run's for the rows it added."""
    def rows(block: str) -> dict[str, str]:
        return {line.split("|")[1].strip(): line for line in block.splitlines()
                if line.startswith("| ") and line not in HEADER}

    old, new = rows(written), rows(text)
    old.update({name: new[name] for name in names})
    order = ["baseline"] + sorted(n for n in old if n != "baseline")
    old_note = [line for line in written.strip().splitlines() if line and not line.startswith("|")]
    return "\n".join([*HEADER, *(old[n] for n in order)]), "; ".join([*old_note, f"{', '.join(names)}: {note}"])


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", help="comma-separated (default: every built-in method)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--write", action="store_true", help="put the table into docs/measuring.md")
    args = parser.parse_args(argv)
    from vitbench.tasks.models import load_model
    from vitbench.tasks.common import input_size_of

    model = load_model("vitbench-fmnist-deit").eval()
    images = torch.randn(args.batch_size, *input_size_of(model), generator=torch.Generator().manual_seed(0))
    names = args.methods.split(",") if args.methods else builtin_methods()
    started = time.time()
    rows = []
    for name in ["baseline", *names]:
        rows.append(row(name, model, images, args.rounds))
        print(f"{name}: {rows[-1]}", file=sys.stderr)
    text = table(rows)
    command = "python benchmarks/compile_table.py" + (f" --methods {args.methods}" if args.methods else "")
    note = (f"`{command}` (batch {args.batch_size}, {args.rounds} rounds, torch {torch.__version__.split('+')[0]}, "
            f"{platform.machine()} CPU, {torch.get_num_threads()} threads, {(time.time() - started) / 60:.0f} min)")
    if args.write:
        page = PAGE.read_text()
        if BEGIN not in page or END not in page:
            raise SystemExit(f"{PAGE} has no {BEGIN} ... {END} markers")
        head, rest = page.split(BEGIN, 1)
        if args.methods:  # these rows into the page's table, the others kept; the note says which were added
            text, note = merged(rest.split(END, 1)[0], text, names, note)
        PAGE.write_text(f"{head}{BEGIN}\n{text}\n\n{note}\n{END}{rest.split(END, 1)[1]}")
    print(text + "\n\n" + note)
    return text


if __name__ == "__main__":
    main()
