#!/usr/bin/env bash
# One call on a lent GPU machine (15 minutes of device time in all, ≤ 10 minutes a call, at most 8 files back):
# issue 61's GPU run. First tools/bench_gpu.py: the papers' workloads (the default run, W2 over 10 rounds, seed 004's
# ResNet-18 on CIFAR-100 with GroupNorm and as it is, seed 001's ViT FedPAC-SOAP), each sequential (the framework and
# the bare loop), with trainer.processes_per_device=4, as a cohort of 8 and as the automatic choice, within
# BENCH_S (default 330 s: the script's budget plus its last stage). Then, if TESTS_S > 0 (default 0: a second call),
# the GPU tests (marked gpu under tests/unit/loop and tests/unit/optim). Files under ${OUT:-/tmp/gpu_check}:
# device.txt, rows.jsonl, table.md, stages.log (every stage's whole stderr and train.log), gpu_tests.txt.
#
#   (device tool: carry [".whl"] where the machine lacks hydra-core; command: OUT=$OUT bash tools/gpu_check.sh)
#   TESTS_S=200 BENCH_S=0 bash tools/gpu_check.sh      # the GPU tests alone
#
# A machine without hydra-core/omegaconf gets them as wheels carried in .whl/: `pip download --no-deps -d .whl
# hydra-core omegaconf==2.3.1` and `pip wheel --no-deps -w .whl antlr4-python3-runtime==4.9.3` here.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_check}
BENCH_S=${BENCH_S:-330}
TESTS_S=${TESTS_S:-0}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if ! python3 -c "import hydra, omegaconf" 2>/dev/null && ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-deps --target /tmp/site .whl/*.whl >> "$OUT/device.txt" 2>&1
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
{ nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv
  python3 -c "import torch, lightning, hydra; print(torch.__version__, torch.version.cuda, lightning.__version__, hydra.__version__)"
  nproc; uptime; } > "$OUT/device.txt" 2>&1
if [ "$BENCH_S" -gt 60 ]; then  # the script stops starting stages after its budget; a stage takes at most 90 s
  timeout "$BENCH_S" python3 tools/bench_gpu.py --out "$OUT" --work /tmp/gpu_work --budget-s $((BENCH_S - 95)) \
    --stage-timeout 90 >> "$OUT/device.txt" 2>&1
  echo "bench_gpu: rc=$? (limit $BENCH_S s)" >> "$OUT/device.txt"
fi
if [ "$TESTS_S" -gt 30 ]; then
  timeout "$TESTS_S" python3 -m pytest -q -n 0 -p no:cacheprovider -m gpu tests/unit/loop tests/unit/optim \
    > "$OUT/gpu_tests.txt" 2>&1
  echo "gpu tests: rc=$? (limit $TESTS_S s)" >> "$OUT/device.txt"
fi
cat "$OUT/device.txt" "$OUT/table.md" 2>/dev/null
