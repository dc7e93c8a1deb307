#!/usr/bin/env bash
# The kept sweep (`make sweep-demo`: tome, ppt, topk, ltmp and ltm at five matched budgets, with
# the controls) on a lent GPU, for a second device call after gpu_session.sh:
#   . .gpu/on-device.sh && OUT=$OUT bash benchmarks/gpu_sweep.sh        (device run, carry [".gpu"])
# About 7 minutes on an H200 (18 of its 36 runs took 208 s). The store is written to /tmp/sweep-gpu
# (resumed there if the machine is still warm) and its records, report and plots are copied to
# ${OUT:-/tmp/gpu-session}/sweep/ even when the time limit stops it part-way.
set -u
OUT=${OUT:-/tmp/gpu-session}
mkdir -p "$OUT/sweep"
timeout "${SWEEP_LIMIT_S:-540}" python3 -m vitbench sweep --task cls --methods tome,ppt,topk,ltmp,ltm \
  --budgets 0.9,0.8,0.7,0.6,0.5 --device cuda --out /tmp/sweep-gpu --resume 2>&1 | tail -40 | tee "$OUT/sweep.txt"
cp /tmp/sweep-gpu/runs.jsonl /tmp/sweep-gpu/report.md /tmp/sweep-gpu/*.png "$OUT/sweep/" 2>/dev/null
ls "$OUT/sweep"
