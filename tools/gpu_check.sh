#!/usr/bin/env bash
# One call on a lent GPU machine (the device tool gives ~15 minutes): the GPU tests, then tools/bench_gpu.py eager
# against trainer.compile and trainer.processes_per_device, fp32 and bf16-mixed, with the bare reference and the
# roofline. Results as JSON lines under ${OUT:-/tmp/gpu_check}; each stage has its own time limit so a slow one
# cannot eat the others' time.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv > "$OUT/device.csv" 2>&1
python3 -c "import torch, lightning; print(torch.__version__, torch.version.cuda, lightning.__version__)" > "$OUT/versions.txt" 2>&1
timeout 240 python3 -m pytest -q -n 0 -m gpu tests/unit/loop > "$OUT/gpu_tests.txt" 2>&1
echo "gpu tests rc=$?" >> "$OUT/gpu_tests.txt"
# the ViT/FedMuon step and W2 per round, eager vs compiled, one process vs four on the GPU
timeout 420 python3 tools/bench_gpu.py --only vit --compile none step graphs --work "$OUT/work" > "$OUT/vit.jsonl" 2>"$OUT/vit.err"
timeout 300 python3 tools/bench_gpu.py --only w2 default w1 --compile none step --processes-per-device 1 4 \
  --precision 32-true --work "$OUT/work" > "$OUT/small.jsonl" 2>"$OUT/small.err"
cat "$OUT"/*.jsonl
