#!/usr/bin/env bash
# One call on a lent GPU machine (the device tool gives ~15 minutes of device time, ≤ 10 minutes a call): the
# bench_gpu.py runs that answer the GPU targets, most important first, then the GPU tests. Every stage writes JSON
# lines under ${OUT:-/tmp/gpu_check} as it goes and gets at most what is left of BUDGET_S (default 540 s), so a slow
# stage cannot eat the others' time and what finished comes back even if the call is cut. Eight files at most (the
# device tool returns no more): device.txt, stages.txt, errors.txt, four .jsonl, gpu_tests.txt.
#
#   1. FedMuon ViT-Tiny (2 rounds, 500 local steps of 64): bare loop and eager, fp32 and bf16-mixed
#   2. the default run, W1 and W2 (eager, fp32) with 1 and 4 processes on the device
#   3. ViT with trainer.compile=step, fp32 (on an H100 with torch 2.11 it spent ~140 s compiling)
#   4. ViT bf16-mixed with trainer.compile=step and graphs
#   5. the GPU tests (compiled step on CUDA against eager)
# Seen on an H100 (2026-11-27): stages 1-2 take ~100 s and ~230 s. A machine without hydra-core/omegaconf gets them
# as wheels: `pip download --no-deps -d .whl hydra-core omegaconf` (+ `pip wheel antlr4-python3-runtime==4.9.3`), then
# `pip install --no-deps --target /tmp/site .whl/*.whl; PYTHONPATH=/tmp/site:$PWD bash tools/gpu_check.sh`.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_check}
BUDGET_S=${BUDGET_S:-540}
END=$((SECONDS + BUDGET_S))
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
left() { local l=$((END - SECONDS)); [ "$l" -lt "$1" ] && echo "$l" || echo "$1"; }
stage() {  # stage NAME LIMIT_S ARGS...: one bench_gpu.py invocation, JSON lines to $OUT/NAME.jsonl
  local name=$1 lim; lim=$(left "$2"); shift 2
  if [ "$lim" -lt 20 ]; then echo "$name: skipped, no time left" >> "$OUT/stages.txt"; return; fi
  local t=$SECONDS
  echo "== $name" >> "$OUT/errors.txt"
  timeout "$lim" python3 tools/bench_gpu.py "$@" --work /tmp/gpu_work >> "$OUT/$name.jsonl" 2>>"$OUT/errors.txt"
  echo "$name: rc=$? in $((SECONDS - t)) s (limit $lim)" >> "$OUT/stages.txt"
}
{ nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv
  python3 -c "import torch, lightning, hydra; print(torch.__version__, torch.version.cuda, lightning.__version__, hydra.__version__)"
  nproc; uptime; } > "$OUT/device.txt" 2>&1
VIT=(--only vit --set fl.rounds=2 fl.eval_every=2)
stage vit 150 "${VIT[@]}" --precision 32-true bf16-mixed --compile none
stage small 240 --only default w1 w2 --precision 32-true --compile none --processes-per-device 1 4
stage vit_compile 170 "${VIT[@]}" --precision 32-true --compile step --no-bare
stage vit_bf16_compile 150 "${VIT[@]}" --precision bf16-mixed --compile step graphs --no-bare
lim=$(left 120)
if [ "$lim" -ge 30 ]; then
  timeout "$lim" python3 -m pytest -q -n 0 -p no:cacheprovider -m gpu tests/unit/loop > "$OUT/gpu_tests.txt" 2>&1
  echo "gpu tests: rc=$? (limit $lim)" >> "$OUT/stages.txt"
fi
cat "$OUT"/stages.txt "$OUT"/*.jsonl
