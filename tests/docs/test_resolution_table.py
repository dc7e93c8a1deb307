"""docs/measuring.md's resolution table is benchmarks/resolution_sweep.py's table of the kept
store reports/resolution, and the script renders a row per record, baseline first per side."""
from __future__ import annotations

from pathlib import Path

from scripts_support import load_script  # tests/scripts_support.py

ROOT = Path(__file__).resolve().parents[2]


def test_the_page_holds_the_stores_table():
    script = load_script("resolution_sweep")
    page = (ROOT / "docs" / "measuring.md").read_text()
    written = page.split(script.BEGIN, 1)[1].split(script.END, 1)[0].strip()
    assert written == script.table(script.records()), "re-make it: python benchmarks/resolution_sweep.py --write"
    sides = {line.split("|")[1].strip() for line in written.splitlines()[2:]}
    assert sides == {"224×224", "384×384", "512×512"}


def test_a_row_per_record_with_its_tokens_and_a_doubted_speedup_marked():
    script = load_script("resolution_sweep")
    rows = [{"method": "tome", "label": "tome (r=61)", "img_size": 512, "gmacs": 18.97, "throughput_img_s": 3.21,
             "speedup": 1.512, "speedup_paired": True, "speedup_spread": 0.3, "speedup_flagged": True,
             "speedup_flag_reason": "spread 20 % of the median (limit 10 %)"},
            {"method": "baseline", "img_size": 512, "gmacs": 31.75, "throughput_img_s": 2.1, "speedup": None},
            {"method": "baseline", "img_size": 224, "gmacs": 4.61, "throughput_img_s": 40.0}]
    lines = script.table(rows).splitlines()
    assert lines[:2] == list(script.HEADER)
    assert lines[2] == "| 224×224 | 197 | baseline | 4.61 | 40.0 | 1.00 |"
    assert lines[3] == "| 512×512 | 1025 | baseline | 31.75 | 2.1 | 1.00 |"
    assert lines[4] == "| 512×512 | 1025 | tome (r=61) | 18.97 | 3.2 | 1.51 † |"
