"""kill -9 trials (issue "Reliability" item 6): start a run, SIGKILL it at a random moment (a random
round k, then a random fraction of a round later: inside training, evaluation or a checkpoint write), resume it from its directory alone, and compare
the finished run with one that never stopped: bit-identical model and identical metric rows.

    python tools/kill9_trials.py --trials 8                       # in-memory and offload stores, 1 process
    python tools/kill9_trials.py --trials 4 --processes 2         # two Fabric processes (gloo)

Prints one row per trial (store, processes, kill time, rounds done at the kill, resumed, bit-identical) and a
summary line ``tried N, resumed N, bit-identical N``. A trial killed before its first checkpoint resumes as a fresh
run (``resume=`` has nothing to load) and is counted as resumed only when the run directory allowed it.
"""
from __future__ import annotations

import argparse
import csv
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from safetensors.torch import load_file

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BASE = ["fl.num_clients=12", "fl.clients_per_round=4", "fl.local_steps=5", "trainer.progress=false",
        "trainer.accelerator=cpu", "method.momentum=0.9", "method.parts.local_optimizer.state=persistent"]


def train(args: list[str], **kw) -> subprocess.Popen:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("HYDRA_FULL_ERROR", None)
    return subprocess.Popen([sys.executable, os.path.join(ROOT, "train.py"), *args], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, **kw)


def rows(run_dir: str) -> list[dict]:
    with open(os.path.join(run_dir, "metrics.csv")) as f:
        return [{k: v for k, v in r.items() if k != "wall_s"} for r in csv.DictReader(f)]


def final(run_dir: str, rounds: int) -> dict:
    return load_file(os.path.join(run_dir, "checkpoints", f"round_{rounds:06d}", "model.safetensors"))


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(bool((a[k] == b[k]).all()) for k in a)


def wait_rows(run_dir: str, p: subprocess.Popen, k: int = 1, timeout: float = 600) -> float:
    """Block until the run has written ``k`` metric rows (round k done); the seconds waited."""
    t0 = time.perf_counter()
    path = os.path.join(run_dir, "metrics.csv")
    while time.perf_counter() - t0 < timeout and p.poll() is None:
        try:
            with open(path) as f:
                if sum(1 for _ in f) - 1 >= k:
                    break
        except OSError:
            pass
        time.sleep(0.01)
    return time.perf_counter() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=8, help="trials per store mode")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--processes", type=int, default=1)
    ap.add_argument("--stores", nargs="+", default=["memory", "offload"], choices=["memory", "offload"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--keep", action="store_true", help="keep the run directories")
    args = ap.parse_args(argv)
    rng = random.Random(args.seed)
    work = tempfile.mkdtemp(prefix="kill9_")
    procs = ["trainer.devices=2", "trainer.strategy=ddp"] if args.processes == 2 else []
    base = BASE + procs + [f"fl.rounds={args.rounds}"]

    ref = os.path.join(work, "straight")
    p = train(base + [f"hydra.run.dir={ref}"])
    wait_rows(ref, p)
    t0 = time.perf_counter()
    _, err = p.communicate()
    if p.returncode:
        raise SystemExit(f"the reference run failed:\n{err[-2000:]}")
    duration = time.perf_counter() - t0  # from the end of round 1 to the end of the run
    ref_rows, ref_model = rows(ref), final(ref, args.rounds)
    print(f"reference run: {duration:.1f} s from round 1 to the end of {args.rounds} rounds ({args.processes} process(es))")
    print("| trial | store | killed (s after a round's row) | rounds done at the kill | resumed | bit-identical |")
    print("| --- | --- | --- | --- | --- | --- |")
    tried = resumed = identical = 0
    for store in args.stores:
        for t in range(args.trials):
            d = os.path.join(work, f"{store}_{t}")
            extra = [f"store.offload_dir={os.path.join(d, 'store')}"] if store == "offload" else []
            p = train(base + extra + [f"hydra.run.dir={d}"], start_new_session=True)
            # after round k's row (k random), a random fraction of a round later: inside training, evaluation or a
            # checkpoint write (the row is recorded before the round's checkpoint is saved)
            k = rng.randint(1, args.rounds - 2)
            at = rng.uniform(0.0, 1.0) * duration / (args.rounds - 1)
            wait_rows(d, p, k)
            time.sleep(at)
            os.killpg(p.pid, signal.SIGKILL)  # the launcher and its children, with no chance to clean up
            p.wait()
            tried += 1
            done = len(rows(d)) if os.path.exists(os.path.join(d, "metrics.csv")) else 0
            has_ckpt = os.path.isdir(os.path.join(d, "checkpoints")) and any(
                n.startswith("round_") and not n.endswith((".tmp", ".parts")) for n in os.listdir(os.path.join(d, "checkpoints")))
            cmd = [f"resume={d}"] if has_ckpt else base + extra + [f"hydra.run.dir={d}", "overwrite=true"]
            q = train(cmd)
            _, err = q.communicate()
            ok = q.returncode == 0
            resumed += ok
            good = ok and rows(d) == ref_rows and same(final(d, args.rounds), ref_model)
            identical += good
            print(f"| {tried} | {store} | {at:.1f} | {done} | {'yes' if ok else 'no: ' + err.strip()[-200:]} "
                  f"| {'yes' if good else 'NO'} |", flush=True)
    print(f"\ntried {tried}, resumed {resumed}, bit-identical {identical}")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if identical == tried else 1


if __name__ == "__main__":
    sys.exit(main())
