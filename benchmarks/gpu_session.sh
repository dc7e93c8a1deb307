#!/usr/bin/env bash
# Issue 11's GPU checks in one go, for a lent GPU machine (about 15 minutes on an H100):
#   . .gpu/on-device.sh && bash benchmarks/gpu_session.sh        (device run, carry [".gpu"])
# Writes every output to ${OUT:-/tmp/gpu-session}/ and prints the tables.
#  1. the CUDA-only tests (CUDA graphs of ToMe/top-k/PPT, ATS refused);
#  2. benchmarks/gpu_reduction.py: ViT-B/16, batch 256, fp32/fp16/bf16, with batch-1 latency,
#     eager and CUDA graph; then fp16 with proportional attention as a float mask (the old kernel)
#     for comparison with the extra channel;
#  3. DeiT-S r=13 fp16 (the second case);
#  4. `vitbench run` with --precision fp16 --cuda-graph on the default model (records + report).
set -u
OUT=${OUT:-/tmp/gpu-session}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/gpu.txt"
python3 -m pytest -q -p no:cacheprovider tests/measure/test_measure_cuda_graph.py tests/engine/test_fast_paths.py \
  2>&1 | tail -15 | tee "$OUT/tests.txt"
python3 benchmarks/gpu_reduction.py --latency --cuda-graph 2>&1 | tee "$OUT/vit_b16.md"
python3 benchmarks/gpu_reduction.py --precisions fp16 --bias-channel never --methods "tome:r=16" 2>&1 \
  | tee "$OUT/vit_b16_fp16_mask.md"
python3 benchmarks/gpu_reduction.py --model deit_small_patch16_224 --precisions fp16 --methods "tome:r=13" \
  --latency --cuda-graph 2>&1 | tee "$OUT/deit_s.md"
python3 -m vitbench run --task cls --methods tome,topk,ppt --device cuda --precision fp16 --cuda-graph \
  --metrics accuracy,gmacs,throughput,latency --out "$OUT/run-fp16-graph" 2>&1 | tail -30 | tee "$OUT/run.txt"
