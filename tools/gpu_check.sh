#!/usr/bin/env bash
# One call on a lent GPU machine (the device tool gives ~15 minutes of device time, ≤ 10 minutes a call): the
# bench_gpu.py runs that answer the GPU targets, most important first, each after and (where BEFORE names an earlier
# commit's tree) before on the same machine, then the GPU tests. Every stage writes JSON lines under
# ${OUT:-/tmp/gpu_check} as it goes and gets at most what is left of BUDGET_S (default 540 s), so a slow stage cannot
# eat the others' time and what finished comes back even if the call is cut. Seven files (the device tool returns
# eight at most): device.txt, stages.txt, errors.txt, vit.jsonl, small.jsonl, compile.jsonl, gpu_tests.txt.
#
#   1. FedMuon ViT-Tiny (2 rounds, 500 local steps of 64): bare loop and eager, fp32 and bf16-mixed; then BEFORE's
#   2. the default run and W2 (eager, fp32, one process); then BEFORE's
#   3. the GPU tests (tests marked gpu under tests/unit/loop and tests/unit/optim)
#   4. ViT with trainer.compile=step, fp32 (compiles once per run now; 4 compiles on torch 2.11 before)
#
#   git archive REV fl_lightning conf train.py | tar -x -C .before      # an earlier commit, beside this tree
#   (device tool: carry [".whl", ".before"]; command: OUT=$OUT bash tools/gpu_check.sh)
#
# A machine without hydra-core/omegaconf gets them as wheels carried in .whl/: `pip download --no-deps -d .whl
# hydra-core omegaconf==2.3.1` and `pip wheel --no-deps -w .whl antlr4-python3-runtime==4.9.3` here.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_check}
BUDGET_S=${BUDGET_S:-540}
BEFORE=${BEFORE:-.before}
END=$((SECONDS + BUDGET_S))
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if ! python3 -c "import hydra, omegaconf" 2>/dev/null && ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-deps --target /tmp/site .whl/*.whl >> "$OUT/errors.txt" 2>&1
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
left() { local l=$((END - SECONDS)); [ "$l" -lt "$1" ] && echo "$l" || echo "$1"; }
stage() {  # stage FILE LIMIT_S ARGS...: one bench_gpu.py invocation, JSON lines appended to $OUT/FILE.jsonl
  local name=$1 lim; lim=$(left "$2"); shift 2
  if [ "$lim" -lt 20 ]; then echo "$name $*: skipped, no time left" >> "$OUT/stages.txt"; return; fi
  local t=$SECONDS
  echo "== $name $*" >> "$OUT/errors.txt"
  timeout "$lim" python3 tools/bench_gpu.py "$@" --work /tmp/gpu_work >> "$OUT/$name.jsonl" 2>>"$OUT/errors.txt"
  echo "$name $*: rc=$? in $((SECONDS - t)) s (limit $lim)" >> "$OUT/stages.txt"
}
{ nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv
  python3 -c "import torch, lightning, hydra; print(torch.__version__, torch.version.cuda, lightning.__version__, hydra.__version__)"
  nproc; uptime; } > "$OUT/device.txt" 2>&1
VIT=(--only vit --set fl.rounds=2 fl.eval_every=2)
stage vit 150 "${VIT[@]}" --precision 32-true bf16-mixed --compile none
[ -d "$BEFORE" ] && stage vit 80 "${VIT[@]}" --precision 32-true bf16-mixed --compile none --no-bare --tree "$BEFORE"
stage small 90 --only default w2 --precision 32-true --compile none
[ -d "$BEFORE" ] && stage small 60 --only default w2 --precision 32-true --compile none --no-bare --tree "$BEFORE"
lim=$(left 120)
if [ "$lim" -ge 30 ]; then
  timeout "$lim" python3 -m pytest -q -n 0 -p no:cacheprovider -m gpu tests/unit/loop tests/unit/optim \
    > "$OUT/gpu_tests.txt" 2>&1
  echo "gpu tests: rc=$? (limit $lim)" >> "$OUT/stages.txt"
fi
stage compile 200 "${VIT[@]}" --precision 32-true --compile step --no-bare
cat "$OUT"/stages.txt "$OUT"/*.jsonl
