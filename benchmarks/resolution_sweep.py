"""Speed-up against token count: DeiT-S (random weights) at input sides 224, 384 and 512 pixels
(``--img-size``: 197, 577 and 1,025 tokens), each method matched to 0.6x the baseline's GMACs at
each size, GMACs and throughput (issue 63, item 4).

    python benchmarks/resolution_sweep.py            # run it into reports/resolution (resumes)
    python benchmarks/resolution_sweep.py --write    # put its table into docs/measuring.md

Run it with nothing else on the machine: the report is a kept one (docs/results.md). ``--write``
renders the store's records as the table under "Speed-up against resolution" in docs/measuring.md
(tests/docs/test_resolution_table.py checks that the page and the store agree).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from vitbench.report.doubts import row_doubts

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "reports" / "resolution"
PAGE = ROOT / "docs" / "measuring.md"
BEGIN, END = "<!-- resolution table: begin -->", "<!-- resolution table: end -->"
MODEL = "deit_small_patch16_224"
SIZES = (224, 384, 512)
METHODS = "tome,topk,random"
#: the fraction of the baseline's GMACs every method is matched to
MATCH = 0.6
HEADER = ("| input | tokens | method | GMACs | img/s | speed-up (×) |",
          "| --- | ---: | --- | ---: | ---: | ---: |")


def command(size: int) -> list[str]:
    """The ``vitbench run`` of one input side (batch 8: a 512-pixel batch of 32 takes minutes here)."""
    return [sys.executable, "-m", "vitbench", "run", "--task", "cls", "--model", MODEL, "--img-size", str(size),
            "--methods", METHODS, "--match-gmacs", str(MATCH), "--metrics", "gmacs,throughput",
            "--batch-size", "8", "--out", str(OUT), "--resume"]


def records(out: Path = OUT) -> list[dict[str, Any]]:
    """The store's finished records."""
    path = out / "runs.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []
    return [r for r in rows if r.get("status") == "ok"]


def _tokens(rec: dict[str, Any]) -> int:
    side = int(rec.get("img_size") or 224)
    return (side // 16) ** 2 + 1


def _label(rec: dict[str, Any]) -> str:
    return rec.get("label") or rec["method"]


def table(rows: list[dict[str, Any]]) -> str:
    """One line per record, by input side then the baseline first; a speed-up the report doubts
    (its spread, the machine's load, or more than its GMACs allow: :func:`row_doubts`) is marked †."""
    order = {"baseline": 0}
    rows = sorted(rows, key=lambda r: (int(r.get("img_size") or 224), order.get(r["method"], 1), r["method"]))
    bases = {int(r.get("img_size") or 224): r for r in rows if r["method"] == "baseline"}
    lines = list(HEADER)
    for r in rows:
        side = int(r.get("img_size") or 224)
        speed = r.get("speedup")
        doubts = row_doubts(r, bases.get(side))
        mark = " †" if doubts.derived or doubts.throughput else ""
        speed_text = "1.00" if r["method"] == "baseline" else (f"{speed:.2f}{mark}" if speed is not None else "n/a")
        lines.append(f"| {side}×{side} | {_tokens(r)} | {_label(r)} | {r['gmacs']:.2f} | "
                     f"{r['throughput_img_s']:.1f} | {speed_text} |")
    return "\n".join(lines)


def write(text: str) -> None:
    """Replace the table between :data:`BEGIN` and :data:`END` in docs/measuring.md."""
    page = PAGE.read_text()
    head, rest = page.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    PAGE.write_text(f"{head}{BEGIN}\n{text}\n{END}{tail}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="put the store's table into docs/measuring.md")
    args = parser.parse_args(argv)
    if args.write:
        write(table(records()))
        return 0
    for size in SIZES:
        done = subprocess.run(command(size), cwd=ROOT)
        if done.returncode:
            return done.returncode
    print(table(records()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
