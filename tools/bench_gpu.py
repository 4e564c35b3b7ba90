"""Training speed on one GPU through ``train.py``: wall time (interpreter start to exit) and loop time
(``summary.json``'s ``wall_s``: the rounds, evaluation and checkpoints, without start-up) of a few workloads, each in
fp32 (``32-true``) and ``bf16-mixed``, and the peak GPU memory the process used (``nvidia-smi`` sampled every 0.2 s).

* ``default``: the README's first command (FedAvg, the 53k-parameter CNN on the embedded digits, 40 rounds);
* ``w1``: tools/bench.py's W1 on a fake CIFAR-10 (100 clients, 10 a round, 5 local epochs, the 879k-parameter FedAvg
  CNN, 5 rounds);
* ``vit``: FedMuon (seed 004's method) with ViT-Tiny (2.7 M parameters) on the fake CIFAR-10: 20 clients, 5 a round,
  50 local steps of batch 64, 5 rounds;
* ``w2``: pfl-research's benchmark scaled as in tools/bench_w2.py: 1,000 clients × 50 images (iid), 50 a round,
  1 epoch of batch 10, the FedAvg CNN, 3 rounds.

The fake CIFAR-10 is random pixels in torchvision's format (the speed of a step does not depend on the values).
Each row also runs tools/bare_gpu.py's bare loop (the same model, local optimizer and step counts in plain PyTorch)
once per workload and precision: ``ratio`` is the framework's rounds (``train_s``: loop start to the last round's
end, without the final evaluation) over the bare loop's time, and ``roofline`` the fraction of the device's peak rate
for that precision that the framework's local steps reach (FLOPs of one forward + backward × steps / ``train_s`` /
peak; the optimizer's arithmetic is not counted).

    python tools/bench_gpu.py                        # every workload, fp32 and bf16-mixed, on the GPU
    python tools/bench_gpu.py --compile none step graphs --processes-per-device 1 4 --only w2
    python tools/bench_gpu.py --only default --accelerator cpu    # the same runs on the CPU
    python tools/bench_gpu.py --only vit --tree /tmp/before --no-bare  # an earlier commit's train.py, same machine
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))

from bench import overrides, write_fake_cifar10  # noqa: E402
from bench_w2 import overrides as w2_overrides  # noqa: E402


def workloads(data: str) -> dict[str, list[str]]:
    w1 = [o for o in overrides(data, 1) if not o.startswith(("trainer.accelerator", "trainer.threads"))]
    return {
        "default": [],
        "w1": w1,
        "vit": ["data=cifar10", f"data.root={data}", "data.augment=false", "model=vit_tiny", "method=fedmuon",
                "fl.num_clients=20", "fl.clients_per_round=5", "fl.local_steps=50", "data.batch_size=64",
                "fl.rounds=5", "fl.eval_every=5"],
        "w2": [o for o in w2_overrides(data, 3) if not o.startswith(("trainer.accelerator", "trainer.threads",
                                                                      "trainer.progress"))],
    }


class PeakMemory(threading.Thread):
    """The most GPU memory in use (MiB, all processes: the run is the only one) while the run lasts."""

    def __init__(self):
        super().__init__(daemon=True)
        self.peak, self.base, self._halt = 0, None, threading.Event()

    def read(self) -> int | None:
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                                 capture_output=True, text=True, timeout=10).stdout
            return int(out.split()[0])
        except Exception:
            return None

    def run(self):
        self.base = self.read()
        while not self._halt.is_set():
            m = self.read()
            if m is not None:
                self.peak = max(self.peak, m)
            self._halt.wait(0.2)

    def stop(self) -> int | None:
        self._halt.set()
        self.join()
        return None if self.base is None else self.peak - self.base


def timed(args: list[str], run_dir: str, gpu: bool, tree: str = ROOT) -> dict:
    mem = PeakMemory() if gpu else None
    if mem:
        mem.start()
    t = time.perf_counter()
    p = subprocess.run([sys.executable, "train.py", *args, "trainer.progress=false", f"hydra.run.dir={run_dir}"],
                       cwd=tree, capture_output=True, text=True)
    wall = time.perf_counter() - t
    peak = mem.stop() if mem else None
    if p.returncode != 0:  # the whole stderr beside the run; in the row, the error's own lines, not Dynamo's advice
        os.makedirs(run_dir, exist_ok=True)
        with open(os.path.join(run_dir, "stderr.txt"), "w") as f:
            f.write(p.stderr)
        lines = [x for x in p.stderr.strip().splitlines() if x.strip() and "TORCHDYNAMO_VERBOSE" not in x
                 and "TORCH_LOGS" not in x]
        return {"error": " | ".join(lines[-6:]) if lines else f"exit {p.returncode}"}
    with open(os.path.join(run_dir, "summary.json")) as f:
        s = json.load(f)
    train = s["round_end_unix"][-1] - s["loop_start_unix"]  # the rounds without the evaluation after the last one
    return {"wall_s": round(wall, 1), "loop_s": s["wall_s"], "train_s": round(train, 3), "final": s["final"],
            "peak_mib": peak, "compiled": s.get("compile")}


def bare(name: str, data: str, precision: str, device: str, extra: list[str]) -> dict:
    """tools/bare_gpu.py's bare loop for this workload, in its own process: its JSON line."""
    p = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "bare_gpu.py"), name, f"--precision={precision}",
                        f"--device={device}", f"--data={data}", "--set", *extra], cwd=ROOT, capture_output=True, text=True)
    line = next((x for x in p.stdout.splitlines() if x.startswith("{")), None)
    return json.loads(line) if line else {"error": (p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[-1]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("--accelerator", default="gpu")
    ap.add_argument("--precision", nargs="*", default=["32-true", "bf16-mixed"])
    ap.add_argument("--compile", nargs="*", default=["none"], help="trainer.compile values to run (none step graphs)")
    ap.add_argument("--processes-per-device", nargs="*", type=int, default=[1], help="trainer.processes_per_device values")
    ap.add_argument("--no-bare", action="store_true", help="skip the bare reference")
    ap.add_argument("--set", nargs="*", default=[], help="overrides added to every run (e.g. fl.rounds=1)")
    ap.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "fl_bench_gpu"))
    ap.add_argument("--tree", default=ROOT, help="the source tree whose train.py runs (e.g. an earlier commit's, "
                    "`git archive REV | tar -x -C DIR`): before/after on one machine")
    a = ap.parse_args()
    data = os.path.join(a.work, "data")
    write_fake_cifar10(data)
    gpu = a.accelerator in ("gpu", "cuda")
    loads = workloads(data)
    for name in a.only or loads:  # in the order given
        args = loads[name] + list(a.set)
        for prec in a.precision:
            ref = {} if a.no_bare else bare(name, data, prec, "cuda" if gpu else "cpu", list(a.set))
            if ref:
                print(json.dumps({"workload": name, "precision": prec, "bare": ref}), flush=True)
            tag = "" if os.path.abspath(a.tree) == ROOT else "-" + os.path.basename(os.path.abspath(a.tree))
            for comp in a.compile:
                for ppd in a.processes_per_device:
                    run_dir = os.path.join(a.work, f"{name}-{prec}-{comp}-{ppd}{tag}")
                    r = timed([*args, f"trainer.accelerator={a.accelerator}", f"trainer.precision={prec}",
                               f"trainer.compile={comp}", f"trainer.processes_per_device={ppd}", "overwrite=true"],
                              run_dir, gpu, a.tree)
                    if "train_s" in r and "bare_loop_s" in ref:  # rounds only: the bare loop evaluates nothing
                        r["ratio"] = round(r["train_s"] / ref["bare_loop_s"], 3)
                        r["ms_per_step"] = round(1e3 * r["train_s"] / ref["steps"], 3)
                        if ref.get("peak_tflops"):
                            flops = ref["gflop_per_step"] * 1e9 * ref["steps"]
                            r["roofline"] = round(flops / r["train_s"] / (ref["peak_tflops"] * 1e12), 5)
                    print(json.dumps({"workload": name, "tree": a.tree, "precision": prec, "accelerator": a.accelerator,
                                      "compile": comp, "processes_per_device": ppd, **r}), flush=True)


if __name__ == "__main__":
    main()
