#!/usr/bin/env bash
# One call on a lent GPU machine (the device tool gives ~15 minutes of device time, ≤ 10 minutes a call): the
# bench_gpu.py runs that answer the GPU targets, most important first, then the GPU tests. Every stage writes JSON
# lines under ${OUT:-/tmp/gpu_check} as it goes and gets at most what is left of BUDGET_S (default 540 s), so a slow
# stage cannot eat the others' time and what finished comes back even if the call is cut.
#
#   1. FedMuon ViT-Tiny (2 rounds, 500 local steps of 64): bare loop and eager, fp32 and bf16-mixed
#   2. the same, trainer.compile=step, fp32
#   3. the default run (eager, fp32), W1 and W2 with 1 and 4 processes on the device
#   4. ViT bf16-mixed with trainer.compile=step and graphs
#   5. the GPU tests (compiled step on CUDA against eager)
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
  if [ "$lim" -lt 20 ]; then echo "skipped: no time left" > "$OUT/$name.err"; return; fi
  local t=$SECONDS
  timeout "$lim" python3 tools/bench_gpu.py "$@" --work /tmp/gpu_work >> "$OUT/$name.jsonl" 2>"$OUT/$name.err"
  echo "$name: rc=$? in $((SECONDS - t)) s (limit $lim)" >> "$OUT/stages.txt"
}
{ nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv
  python3 -c "import torch, lightning, hydra; print(torch.__version__, torch.version.cuda, lightning.__version__, hydra.__version__)"
  nproc; uptime; } > "$OUT/device.txt" 2>&1
VIT=(--only vit --set fl.rounds=2 fl.eval_every=2)
stage vit 150 "${VIT[@]}" --precision 32-true bf16-mixed --compile none
stage vit_compile 170 "${VIT[@]}" --precision 32-true --compile step --no-bare
stage small 150 --only default w1 w2 --precision 32-true --compile none --processes-per-device 1 4
stage vit_bf16_compile 150 "${VIT[@]}" --precision bf16-mixed --compile step graphs --no-bare
lim=$(left 120)
if [ "$lim" -ge 30 ]; then
  timeout "$lim" python3 -m pytest -q -n 0 -p no:cacheprovider -m gpu tests/unit/loop > "$OUT/gpu_tests.txt" 2>&1
  echo "gpu tests: rc=$? (limit $lim)" >> "$OUT/stages.txt"
fi
cat "$OUT"/stages.txt "$OUT"/*.jsonl
