"""The markdown report, the plot and write_report."""
from __future__ import annotations

import os

import pytest

from vitbench.report import plot_accuracy_vs_gmacs, render_markdown, write_report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_header_environment_command_and_methodology(records):
    md = render_markdown(records, title="Demo", command="vitbench report runs -o demo.md")
    assert md.startswith("# Demo\n")
    for text in ("torch 2.4.1", "timm 1.0.9", "mmengine 0.10.5", "mmcv 2.1.0", "mmdet 3.3.0",
                 "mmpretrain 1.2.0", "vitbench 0.1.0", "Device: cpu (Intel Xeon)", "Threads: 2",
                 "Precision: fp32", "Git revision: 3af5c5a", "Plugins: ibtm 0.1.0, tome 0.1.0"):
        assert text in md
    # the given command and the run command recorded in env
    assert "vitbench report runs -o demo.md" in md
    assert "vitbench run --methods ibtm,tome,ppt,topk --task cls" in md
    assert "FlopCounterMode" in md and "batch 1" in md and "speed-up / GMACs ratio" in md
    assert md.index("## Environment") < md.index("## Methodology") < md.index("## cls")


def test_one_table_per_task_and_model_with_baseline_first(records):
    md = render_markdown(records)
    assert md.index("## cls · vitbench-fmnist-vit") < md.index("## det · deit_small_patch16_224")
    cls_part = md[md.index("## cls"):md.index("## det")]
    table = [line for line in cls_part.splitlines() if line.startswith("|")]
    assert table[0].startswith("| Method") and "ΔTop-1 (pp)" in table[0]
    assert table[2].startswith("| baseline")
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in table]
    tome = dict(zip(cells[0], cells[3]))
    assert tome["Method"] == "tome (r=13)"
    assert (tome["ΔTop-1 (pp)"], tome["GMACs ↓ (%)"]) == ("-0.52", "41.2")
    assert all(c.endswith(":") and not c.startswith(":") for c in cells[1][1:])  # numbers right
    assert "Box mAP" in md[md.index("## det"):]


def test_failed_and_skipped_runs_listed_with_their_message(records):
    md = render_markdown(records)
    cls_part = md[md.index("## cls"):md.index("## det")]
    failed = cls_part[cls_part.index("Failed runs:"):]
    # multi-line messages are folded into one list item
    message = "RuntimeError: shapes [1, 197] and [1, 96] differ in block 4"
    assert f"- ppt (r=0.5, threshold=7): {message}" in failed
    assert "- topk (keep=0.7): needs attention probabilities the family does not expose" in cls_part
    # ibtm's old error was superseded by its successful retry
    assert "first try failed" not in md


def test_attention_kernels_are_reported(records):
    md = render_markdown(records)
    assert "- baseline: fused (SDPA)" in md
    assert "- ibtm (r=0.7): unfused in blocks 3,6,9" in md
    assert "Attention kernel: fused (SDPA) in every row." in md  # the det group


def test_near_chance_baseline_warns(make_record):
    def report(top1, **extra):
        return render_markdown([make_record("b", "baseline", top1_pct=top1, **extra)])

    md = report(14.0)  # 10 classes: chance 10 %, warn up to 15 %
    warning = next(line for line in md.splitlines() if "Warning" in line)
    assert "14.00%" in warning and "chance" in warning and "vitbench-fmnist-vit" in warning
    assert md.index("Warning") < md.index("## Methodology")
    assert "Warning" not in report(16.0)
    rec = make_record("b", "baseline", top1_pct=9.0)
    del rec["num_classes"]
    assert "Warning" not in render_markdown([rec])  # unknown class count: no check


def test_no_successful_baseline_is_said(make_record):
    md = render_markdown([make_record("b", "baseline", status="error", error="OOM"),
                          make_record("t", "tome", {"r": 4}, top1_pct=70.0)])
    assert "No successful baseline" in md and "- baseline: OOM" in md


def test_environment_differences_are_flagged(records):
    other = dict(records[1], spec_id="x", env=dict(records[1]["env"], threads=8))
    md = render_markdown(records + [other])
    assert "Threads: 2; 8 (differs between records)" in md


def test_a_run_on_uncommitted_code_is_said(records):
    assert "Uncommitted code" not in render_markdown(records)
    dirty = [dict(r, env=dict(r["env"], git_rev="3af5c5a-dirty")) for r in records]
    md = render_markdown(dirty)
    assert "Git revision: 3af5c5a-dirty" in md
    assert "- Uncommitted code: a revision marked `-dirty` ran with changes to vitbench's code" in md


def test_empty_store_still_renders(tmp_path):
    md = render_markdown([])
    assert "## Methodology" in md and "Runs: none" in md
    md_path, png_path = write_report([], tmp_path / "empty.md")
    assert png_path is None and sorted(os.listdir(tmp_path)) == ["empty.md"]  # nothing to draw: no plot
    assert "## Plot" not in md_path.read_text(encoding="utf-8")


def test_plot_is_a_png(records, tmp_path):
    path = plot_accuracy_vs_gmacs(records, tmp_path / "plot.png")
    assert path == tmp_path / "plot.png"
    assert path.read_bytes().startswith(PNG_MAGIC)


def test_write_report_writes_markdown_and_png_beside_it(records, tmp_path):
    out = tmp_path / "reports" / "demo run.md"
    md_path, png_path = write_report(records, out, command="vitbench report runs -o demo.md")
    assert (md_path, png_path) == (out, tmp_path / "reports" / "demo run.png")
    assert png_path.read_bytes().startswith(PNG_MAGIC)
    md = md_path.read_text(encoding="utf-8")
    assert "![Accuracy vs GMACs and vs throughput](demo%20run.png)" in md
    assert "| baseline" in md
    # no temp files left behind
    assert sorted(os.listdir(out.parent)) == ["demo run.md", "demo run.png"]


def test_write_report_replaces_an_old_report(records, tmp_path):
    out = tmp_path / "r.md"
    out.write_text("old")
    write_report(records[:2], out)
    assert out.read_text(encoding="utf-8").startswith("# vitbench report")


def test_a_failed_render_leaves_the_old_report_and_plot_whole(records, tmp_path, monkeypatch):
    import vitbench.report as report

    out = tmp_path / "r.md"
    write_report(records, out)
    old_md, old_png = out.read_bytes(), out.with_suffix(".png").read_bytes()

    def broken(*args, **kwargs):
        raise RuntimeError("render failed")

    monkeypatch.setattr(report, "render_markdown", broken)
    with pytest.raises(RuntimeError, match="render failed"):
        write_report(records[:2], out)
    assert out.read_bytes() == old_md and out.with_suffix(".png").read_bytes() == old_png
    assert sorted(os.listdir(tmp_path)) == ["r.md", "r.png"]  # no temp file left


def test_fine_tuned_rows_say_how_they_were_trained(make_record):
    from vitbench.report.markdown import render_markdown

    stages = [{"name": "finetune", "epochs": 1, "iters": 157, "images": 10000}]
    recs = [make_record("b", "baseline", top1_pct=80.0, gmacs=1.0),
            make_record("l", "ltm", top1_pct=81.0, gmacs=0.7, trained="fine-tuned", train_s=95.4,
                        train_images=10000, trainable_params=12345, train_stages=stages),
            make_record("r", "ltmp", top1_pct=79.0, gmacs=0.8, trained="checkpoint",
                        checkpoint_path="out/checkpoints/r.pth")]
    md = render_markdown(recs)
    assert ("- ltm: finetune: 1 epoch(s), 157 iterations on 10000 training images in 95 s, "
            "12,345 trainable parameters (backbone frozen)") in md
    assert "- ltmp: reloaded from out/checkpoints/r.pth (--resume)" in md
    whole = [{**stages[0], "backbone": True}]  # a stage that trains the backbone itself (cropr, algm)
    md = render_markdown([recs[0], make_record("c", "cropr", top1_pct=79.0, gmacs=0.7, trained="fine-tuned",
                                               train_s=95.4, train_images=10000, trainable_params=12345,
                                               train_stages=whole)])
    assert "12,345 trainable parameters (backbone trained)" in md
    # a stage without epochs says what its callbacks reported (LTMP's calibration)
    calibrated = [{"name": "thresholds", "epochs": 1, "iters": 16, "images": 1000},
                  {"name": "calibration", "epochs": 0, "iters": 0, "calibration_alpha": 0.16057,
                   "calibration_ratio": 0.80043, "calibration_images": 256, "seconds": 20.0}]
    md = render_markdown([recs[0], make_record("m", "ltmp", top1_pct=79.0, gmacs=0.7, trained="fine-tuned",
                                               train_s=40.0, train_images=1000, trainable_params=24,
                                               train_stages=calibrated)])
    assert ("- ltmp: thresholds: 1 epoch(s), 16 iterations; calibration: alpha 0.1606, ratio 0.8004, "
            "images 256 on 1000 training images") in md


def test_plot_without_accuracy_draws_throughput_vs_gmacs(tmp_path, monkeypatch):
    """A GMACs/throughput-only run plots what it measured, not two empty "no data" panels."""
    import vitbench.report.plot as plot

    points, texts = [], []
    real_bar, real_text = plot.Axes.errorbar, plot.Axes.text
    monkeypatch.setattr(plot.Axes, "errorbar", lambda self, x, y, **kw: points.append((x, y)) or real_bar(self, x, y, **kw))
    monkeypatch.setattr(plot.Axes, "text", lambda self, x, y, s, **kw: texts.append(s) or real_text(self, x, y, s, **kw))
    recs = [{"spec_id": m, "task": "cls", "model": "deit_tiny_patch16_224", "method": m, "params": {}, "seed": 0,
             "status": "ok", "gmacs": g, "throughput_img_s": t, "batch_size": 32}
            for m, g, t in (("baseline", 1.25, 13.7), ("tome", 0.62, 25.0))]
    plot.plot_accuracy_vs_gmacs(recs, tmp_path / "p.png")
    assert points == [(1.25, 13.7), (0.62, 25.0)]
    assert not texts  # one throughput-vs-GMACs panel, no placeholder panel
    assert [[panel[4:] for panel in row] for row in plot.planned_panels(recs)] == [
        [("gmacs", "gmacs_std", "throughput_img_s")]]


def test_the_stores_skipped_lines_are_named_in_the_report(records, tmp_path):
    from vitbench.results import ResultStore

    store = ResultStore(tmp_path)
    for rec in records:
        store.append(rec)
    with open(store.path, "a") as f:
        f.write('{"status": "ok", "method": "tome"}\n{"spec_id": "trunc\n')
    kept = store.records()
    skipped = [c.describe() for c in store.corrupt_lines]
    md = render_markdown(kept, skipped=skipped)
    n = len(records)
    assert "**2 line(s) of the store are no run record and were skipped:**" in md
    assert f"- `runs.jsonl line {n + 1} (no string 'spec_id'): " in md
    assert f"- `runs.jsonl line {n + 2} (not a complete JSON object): " in md
    assert "## None" not in md


def test_a_method_slower_than_the_baseline_is_said_in_words(make_record):
    base = make_record("b", "baseline", gmacs=0.35, throughput_img_s=100.0, batch_size=32, latency_ms=10.0)
    fast = make_record("t", "tome", {"r": 8}, gmacs=0.29, throughput_img_s=120.0, batch_size=32, latency_ms=9.0)
    slow = make_record("p", "ppt", {"r": 8}, gmacs=0.29, throughput_img_s=80.0, batch_size=32, latency_ms=12.5)
    md = render_markdown([base, fast, slow])
    assert "**Slower than the baseline**" in md
    assert "- ppt (r=8): 0.80x the baseline's throughput at batch 32 and 1.25x its latency at batch 1." in md
    assert "- tome" not in md.split("**Slower than the baseline**")[1].split("\n\n")[0]
    assert "Slower than the baseline" not in render_markdown([base, fast])


def test_a_paired_speedup_decides_whether_a_method_is_called_slower(make_record):
    base = make_record("b", "baseline", gmacs=0.35, throughput_img_s=100.0, batch_size=32)
    # its own throughput, timed minutes later on a slower machine, is below the baseline's
    level = make_record("t", "tome", {"r": 8}, gmacs=0.29, throughput_img_s=80.0, batch_size=32,
                        speedup=1.05, speedup_paired=True)
    slow = make_record("p", "ppt", {"r": 8}, gmacs=0.29, throughput_img_s=120.0, batch_size=32,
                       speedup=0.9, speedup_paired=True)
    md = render_markdown([base, level, slow])
    said = md.split("**Slower than the baseline**")[1].split("\n\n")[0]
    assert "- ppt (r=8): 0.90x the baseline's speed at batch 32 (timed in turn with it)." in said
    assert "- tome" not in said
