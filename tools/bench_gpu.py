"""The papers' workloads on one GPU, each timed in one call as the sequential loop (bare and the framework), as
several processes per GPU (pfl-research's and the seeds' Ray way: ``trainer.processes_per_device=4``), as a cohort of
8 and as the automatic choice (``trainer.cohort=auto trainer.compile=auto``, the defaults): issue 61's one GPU script.

Workloads (the data fake where the real set is absent: random pixels of CIFAR's shapes, ``data.fake=true``, or
tools/bench.py's fake CIFAR-10 files; a step's speed does not depend on the values):

* ``default``: the README's first command (FedAvg, the 53k-parameter CNN on the embedded digits, 8 clients a round);
* ``w2``: pfl-research's benchmark as tools/bench_w2.py scales it (1,000 clients × 50 images, 50 a round, batch 10,
  the FedAvg CNN), over 10 rounds;
* ``r18``: seed 004's Table 2 setting (``experiment=fedmuon_cifar100``: CIFAR-100, ResNet-18 with BatchNorm in its
  blocks, 100 clients, 10 a round, 50 local steps of 50) as it is: a cohort refuses BatchNorm buffers, so K = 1;
* ``r18gn``: the same with ``model.net.norm=gn`` (all GroupNorm), which runs as a cohort;
* ``vit_soap``: seed 001's ViT FedPAC-SOAP (``experiment=fedpac_vit_tiny_cifar100 model=vit_cifar``, dropout 0.1,
  10 clients a round).

Settings (``--settings``): ``bare`` (tools/bare_gpu.py's plain PyTorch loop: the same model, optimizer and steps),
``seq`` (``trainer.cohort=1 trainer.compile=none``: the sequential eager loop), ``ppd4``
(``trainer.processes_per_device=4``, sequential in each), ``k8`` (``trainer.cohort=8 trainer.compile=none``, where
the workload can run batched) and ``auto`` (the defaults: the start-up probe's choice, its line kept in the row).

Each row: ``train_s`` (summary.json: the first round's start to the last round's end, so start-up, the probe and the
final evaluation are out), rounds per second, the ratio to ``seq`` and, for the paper's table, the GPU-hours it
projects: the experiment's grid (the product of its sweeper's values: methods × partitions × seeds) × its
``fl.rounds`` / rounds per second (the timed method's speed for every method of the grid). Every stage's whole
stderr and its train.log (the probe's line is there) are kept in one file, ``<out>/stages.log`` (``--out``, default
``$OUT``: three files in all, as a lent GPU machine returns at most eight), the rows in ``<out>/rows.jsonl`` and the
table in ``<out>/table.md``. ``--budget-s`` stops starting stages once spent (the
device time is fixed); each stage has its own timeout.

    python tools/bench_gpu.py                                  # every workload and setting on the GPU (~6 min)
    python tools/bench_gpu.py --only r18gn vit_soap --settings seq auto
    python tools/bench_gpu.py --smoke                          # tiny sizes on the CPU: the script itself works
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))

from bench import write_fake_cifar10  # noqa: E402
from bench_w2 import overrides as w2_overrides  # noqa: E402

SETTINGS = ("seq", "auto", "k8", "ppd4", "bare")  # in the order run (a spent budget cuts the last)
PINNED = {"seq": ["trainer.cohort=1", "trainer.compile=none"],
          "ppd4": ["trainer.cohort=1", "trainer.compile=none", "trainer.processes_per_device=4"],
          "k8": ["trainer.cohort=8", "trainer.compile=none"], "auto": []}
# the workloads a cohort cannot run (BatchNorm buffers): no k8 row
NO_COHORT = {"r18"}
# each workload's experiment (its grid and rounds make the paper projection), and its timed rounds
EXPERIMENT = {"r18": "fedmuon_cifar100", "r18gn": "fedmuon_cifar100", "vit_soap": "fedpac_vit_tiny_cifar100"}
SMOKE = ["fl.rounds=1", "fl.local_steps=2", "fl.local_epochs=null", "data.batch_size=4", "fl.num_clients=16",
         "fl.clients_per_round=8", "fl.eval_every=100", "checkpoint.every=100"]
SMOKE_MODEL = {"r18": ["model.net.width=4"], "r18gn": ["model.net.width=4"],  # the evaluation of 10,000 fake images
               "vit_soap": ["model.net.dim=16", "model.net.depth=2", "model.net.heads=2", "model.net.dim_head=8",
                            "model.net.mlp_dim=16"]}


def workloads(data: str) -> dict[str, list[str]]:
    """Each workload's train.py overrides (``data``: the fake CIFAR-10 folder, for W2)."""
    w2 = [o for o in w2_overrides(data, 10) if not o.startswith(("trainer.accelerator", "trainer.threads",
                                                                  "trainer.progress"))]
    r18 = ["experiment=fedmuon_cifar100", "data.fake=true", "fl.rounds=2", "fl.eval_every=100"]
    return {  # in the order run: the targets' workloads first
        "default": [],
        "w2": w2,
        "r18gn": r18 + ["model.net.norm=gn"],
        "r18": r18,
        "vit_soap": ["experiment=fedpac_vit_tiny_cifar100", "model=vit_cifar", "data.fake=true", "fl.rounds=1",
                     "fl.eval_every=100"],
    }


def paper_runs(workload: str, timed_rounds: int) -> tuple[int, int, str]:
    """(runs, rounds each, where from) of the paper's table for ``workload``: its experiment's sweep grid × its
    ``fl.rounds``; a workload without one: one run of the rounds timed."""
    from omegaconf import OmegaConf

    name = EXPERIMENT.get(workload)
    if name is None:
        return 1, timed_rounds, "one run"
    cfg = OmegaConf.load(os.path.join(ROOT, "conf", "experiment", f"{name}.yaml"))
    params = OmegaConf.select(cfg, "hydra.sweeper.params", default={}) or {}
    runs = 1
    for v in params.values():
        runs *= len(str(v).split(","))
    return runs, int(cfg.fl.rounds), f"experiment={name}: {runs} runs x {int(cfg.fl.rounds)} rounds"


class PeakMemory(threading.Thread):
    """The most GPU memory in use (MiB, all processes) while a stage lasts (``nvidia-smi`` every 0.2 s)."""

    def __init__(self):
        super().__init__(daemon=True)
        self.peak, self.base, self._halt = 0, None, threading.Event()

    @staticmethod
    def read() -> int | None:
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


def keep(out: str, title: str, path: str) -> None:
    """``path``'s whole text appended to ``<out>/stages.log`` under ``title``."""
    if os.path.exists(path):
        with open(os.path.join(out, "stages.log"), "a") as f, open(path, errors="replace") as src:
            f.write(f"\n===== {title}\n")
            shutil.copyfileobj(src, f)


def run_stage(cmd: list[str], cwd: str, stderr_path: str, timeout: float, gpu: bool) -> tuple[int, float, str, int | None]:
    """Run one stage: ``(exit code, seconds, stdout, peak MiB)``, its whole stderr written to ``stderr_path``."""
    mem = PeakMemory() if gpu else None
    if mem:
        mem.start()
    t = time.perf_counter()
    with open(stderr_path, "w") as err:
        try:
            p = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=err, text=True, timeout=timeout)
            code, out = p.returncode, p.stdout
        except subprocess.TimeoutExpired as stop:
            code, out = 124, (stop.stdout or b"").decode() if isinstance(stop.stdout, bytes) else (stop.stdout or "")
            err.write(f"\n[bench_gpu] stopped after the stage's {timeout:.0f} s\n")
    return code, time.perf_counter() - t, out, (mem.stop() if mem else None)


def last_lines(path: str, n: int = 4) -> str:
    lines = [x for x in open(path).read().strip().splitlines() if x.strip() and "TORCHDYNAMO_VERBOSE" not in x]
    return " | ".join(lines[-n:])


def framework(name: str, setting: str, args: list[str], a, out: str, gpu: bool) -> dict:
    run_dir = os.path.join(a.work, f"{name}-{setting}")
    err = os.path.join(a.work, f"{name}-{setting}.stderr.txt")
    cmd = [sys.executable, "train.py", *args, *PINNED[setting], f"trainer.accelerator={a.accelerator}",
           "trainer.progress=false", "overwrite=true", f"hydra.run.dir={run_dir}"]
    code, wall, _, peak = run_stage(cmd, a.tree, err, a.stage_timeout, gpu)
    keep(out, f"{name} {setting}: stderr (exit {code}): {' '.join(cmd[1:])}", err)
    log = os.path.join(run_dir, "train.log")
    keep(out, f"{name} {setting}: train.log", log)
    row: dict = {"wall_s": round(wall, 1), "peak_mib": peak}
    if code != 0:
        return {**row, "error": f"exit {code}: {last_lines(err)}"}
    with open(os.path.join(run_dir, "summary.json")) as f:
        s = json.load(f)
    rounds = len(s["round_end_unix"])
    train = s["round_end_unix"][-1] - s["loop_start_unix"]
    row.update(train_s=round(train, 3), rounds=rounds, rounds_per_s=round(rounds / train, 4), compile=s.get("compile"))
    if setting == "auto":  # the probe's line (or the resolution's) as the run said it
        said = [x.split("[INFO] - ", 1)[-1] for x in (open(log).read().splitlines() if os.path.exists(log) else [])
                if "trainer.compile=auto ->" in x or "trainer.cohort/compile=auto" in x]
        row["auto"] = said[-1] if said else None
    return row


def bare(name: str, args: list[str], a, out: str, gpu: bool, precision: str) -> dict:
    err = os.path.join(a.work, f"{name}-bare.stderr.txt")
    cmd = [sys.executable, os.path.join(ROOT, "tools", "bare_gpu.py"), name, f"--precision={precision}",
           f"--device={'cuda' if gpu else 'cpu'}", f"--data={a.data}", "--set", *args]
    code, wall, stdout, peak = run_stage(cmd, ROOT, err, a.stage_timeout, gpu)
    keep(out, f"{name} bare: stderr (exit {code}), stdout {stdout.strip()[-300:]}", err)
    line = next((x for x in stdout.splitlines() if x.startswith("{")), None)
    if code != 0 or line is None:
        return {"wall_s": round(wall, 1), "error": f"exit {code}: {last_lines(err)}"}
    ref = json.loads(line)
    rounds = int(ref.get("rounds") or 0)
    return {"wall_s": round(wall, 1), "train_s": ref["bare_loop_s"], "rounds": rounds,
            "rounds_per_s": round(rounds / ref["bare_loop_s"], 4) if rounds else None, "ms_per_step": ref["ms_per_step"],
            "steps": ref["steps"], "peak_mib": peak}


def table(rows: list[dict]) -> str:
    """The markdown table of the rows: rounds per second, the ratio to the sequential framework, GPU-hours."""
    head = ("| workload | setting | train s | rounds/s | x seq | paper GPU-h | probe / auto | error |\n"
            "| --- | --- | --- | --- | --- | --- | --- | --- |")
    lines = [head]
    seq = {r["workload"]: r.get("rounds_per_s") for r in rows if r["setting"] == "seq"}
    for r in rows:
        rps, base = r.get("rounds_per_s"), seq.get(r["workload"])
        ratio = f"{rps / base:.2f}" if rps and base else ""
        hours = f"{r['paper_gpu_h']:.1f}" if r.get("paper_gpu_h") is not None else ""
        lines.append(f"| {r['workload']} | {r['setting']} | {r.get('train_s', '')} | {rps or ''} | {ratio} | {hours} | "
                     f"{(r.get('auto') or '')[:140]} | {(r.get('error') or '')[:160]} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", default=None, help="workloads, in this order (default: all)")
    ap.add_argument("--settings", nargs="*", default=list(SETTINGS), choices=SETTINGS)
    ap.add_argument("--accelerator", default="gpu")
    ap.add_argument("--precision", default="32-true", choices=["32-true", "bf16-mixed"])
    ap.add_argument("--set", nargs="*", default=[], help="overrides added to every stage (e.g. fl.rounds=1)")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU (the script works; figures mean "
                    "nothing; a budget of 1500 s at least)")
    ap.add_argument("--budget-s", type=float, default=330.0, help="start no stage after this many seconds")
    ap.add_argument("--stage-timeout", type=float, default=150.0, help="seconds one stage may take")
    ap.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "fl_bench_gpu"))
    ap.add_argument("--out", default=os.environ.get("OUT") or None, help="where the rows, table and stderr go")
    ap.add_argument("--tree", default=ROOT, help="the source tree whose train.py runs (an earlier commit's, for "
                    "before/after on one machine)")
    a = ap.parse_args(argv)
    if a.smoke:
        a.accelerator, a.set, a.budget_s = "cpu", SMOKE + list(a.set), max(a.budget_s, 1500.0)
        PINNED["ppd4"] = [o.replace("processes_per_device=4", "processes_per_device=2") for o in PINNED["ppd4"]]
    out = a.out or os.path.join(a.work, "out")
    os.makedirs(out, exist_ok=True)
    os.makedirs(a.work, exist_ok=True)
    open(os.path.join(out, "stages.log"), "w").close()
    a.data = os.path.join(a.work, "data")
    write_fake_cifar10(a.data, *((2000, 400) if a.smoke else ()))
    gpu = a.accelerator in ("gpu", "cuda")
    loads = workloads(a.data)
    start, rows = time.perf_counter(), []
    with open(os.path.join(out, "rows.jsonl"), "w") as jl:
        for name, setting in itertools.product(a.only or list(loads), a.settings):
            if setting == "k8" and name in NO_COHORT:
                continue
            row = {"workload": name, "setting": setting, "precision": a.precision, "accelerator": a.accelerator}
            if time.perf_counter() - start > a.budget_s:
                row["error"] = f"not run: the {a.budget_s:.0f} s budget was spent"
            else:
                args = loads[name] + [f"trainer.precision={a.precision}"] + list(a.set) + (
                    SMOKE_MODEL.get(name, []) if a.smoke else [])
                if setting == "bare":
                    row.update(bare(name, [x for x in args if not x.startswith("trainer.")], a, out, gpu, a.precision))
                else:
                    row.update(framework(name, setting, args, a, out, gpu))
            if row.get("rounds_per_s"):
                runs, rounds, where = paper_runs(name, int(row.get("rounds") or 0))
                row.update(paper=where, paper_gpu_h=round(runs * rounds / row["rounds_per_s"] / 3600, 2))
            rows.append(row)
            jl.write(json.dumps(row) + "\n")
            jl.flush()
            print(json.dumps(row), flush=True)
    text = table(rows)
    with open(os.path.join(out, "table.md"), "w") as f:
        f.write(text + "\n")
    print(text)
    print(f"[bench_gpu] {time.perf_counter() - start:.0f} s; rows.jsonl, table.md and stages.log (every stage's "
          f"stderr and log) in {out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
