#!/usr/bin/env bash
# The GPU checks in one go, for a lent GPU machine (about 8 minutes on an H100, install included):
#   . .gpu/on-device.sh && bash benchmarks/gpu_session.sh        (device run, carry [".gpu"])
# .gpu/ToMe, when there, is a snapshot of facebookresearch/ToMe (its own licence; imported at run
# time by the benchmark, never copied into the project). Writes every output to
# ${OUT:-/tmp/gpu-session}/ and prints the tables. Each step has its own time limit, so one that
# hangs leaves time for the others.
#  1. the CUDA-only tests (CUDA graphs of ToMe/top-k/PPT, ATS refused) and the benchmark's smoke test;
#  2. benchmarks/gpu_reduction.py: ViT-B/16, batch 256, fp32/fp16/bf16, ToMe r=16, PPT r=50 and
#     top-k keep=0.7 against their token-count limits, batch-1 latency, eager and CUDA graph, with
#     the official ToMe beside ours;
#  3. ToMe r=16 with and without proportional attention (fp16, fp32), and fp16 against the official
#     code at batch 1 to 128 (the speed-up against batch size);
#  4. `vitbench run` with --precision fp16 --cuda-graph on the default model (records + report).
#  5. benchmarks/gpu_profile.py: ViT-B/16 bs 256 fp16, the kernels of ToMe r=16 and PPT r=50 beside
#     the baseline's (what keeps them from their limit in half precision).
set -u
OUT=${OUT:-/tmp/gpu-session}
REF=()
[ -d .gpu/ToMe/tome ] && REF=(--reference .gpu/ToMe)
mkdir -p "$OUT"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c "import torch, timm; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version(), 'timm', timm.__version__)"
} 2>&1 | tee "$OUT/gpu.txt"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/measure/test_measure_cuda_graph.py \
  tests/engine/test_fast_paths.py tests/test_gpu_benchmark.py 2>&1 | tail -15 | tee "$OUT/tests.txt"
timeout 270 python3 benchmarks/gpu_reduction.py --latency --cuda-graph "${REF[@]}" 2>&1 | tee "$OUT/vit_b16.md"
# ToMe with and without proportional attention: the bias keeps flash attention out in half precision
timeout 90 python3 benchmarks/gpu_reduction.py --precisions fp16,fp32 --methods "tome:r=16;tome:r=16,prop_attn=False" \
  --cuda-graph 2>&1 | tee "$OUT/vit_b16_prop_attn.md"
for b in 1 8 32 128; do
  timeout 40 python3 benchmarks/gpu_reduction.py --batch-size "$b" --precisions fp16 --methods "tome:r=16" \
    --cuda-graph --repeats 30 "${REF[@]}" 2>&1 | tee "$OUT/vit_b16_fp16_batch$b.md"
done
timeout 150 python3 -m vitbench run --task cls --methods tome,topk,ppt --device cuda --precision fp16 --cuda-graph \
  --metrics accuracy,gmacs,throughput,latency --out /tmp/run-fp16-graph 2>&1 | tail -30 | tee "$OUT/run.txt"
# the store's work dirs would pass the device tool's file count: only the report and records come back
mkdir -p "$OUT/run-fp16-graph" && cp /tmp/run-fp16-graph/report.* /tmp/run-fp16-graph/runs.jsonl "$OUT/run-fp16-graph/" 2>/dev/null
timeout 90 python3 benchmarks/gpu_profile.py --methods "tome:r=16;ppt:r=50" 2>&1 | tee "$OUT/profile_fp16.md" | tail -4
