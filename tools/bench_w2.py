"""W2: start-up and time per round, the framework side by side with a bare PyTorch loop.

W2 is pfl-research's CIFAR-10 benchmark scaled down: a fake CIFAR-10 written in torchvision's pickle format (random
pixels and labels, 50,000 / 10,000, :func:`tools.bench.write_fake_cifar10`), 1,000 clients of exactly 50 images each
(the IID partition, ``data/partition=iid``: 50,000 / 1,000), 50 clients sampled per round, 1 local epoch of plain
SGD (FedAvg, lr 0.01, batch 10: 5 steps per client), the FedAvg CNN (``model=cnn_fedavg``, 878,538 parameters), no
augmentation, 3 rounds, the test set evaluated once, after the last round.

* framework: ``python train.py data=cifar10 data/partition=iid model=cnn_fedavg method=fedavg ...`` with its
  defaults otherwise (a checkpoint every round, metrics.csv, summary.json);
* bare: ``python tools/bench_w2.py --bare``: torch and numpy only, the same network built from ``torch.nn`` by hand,
  the same clients' images (the framework's partition and sampler, computed before the timing and handed over as
  an index file), the same local steps, size-weighted averaging. It reads the pickles into uint8 tensors and
  normalizes each batch as it is used, as the framework does (converting all 50,000 images to float up front would
  add seconds of start-up that the framework does not have).

Each side runs in a fresh subprocess with one thread (``trainer.threads=1``; ``torch.set_num_threads(1)``), the sides
interleaved (framework, bare, framework, bare, ...). Measured:

* start-up: from spawn (this parent's ``time.time()`` just before ``subprocess.Popen``) to the end of the first
  client's local training (its 5 optimizer steps), on the same wall clock: the framework's ``first_client_unix`` in
  its summary.json, the bare loop's own ``time.time()`` printed after its first client. The first client's optimizer
  and steps are part of the start-up on both sides because of what they load on first use: ``torch._dynamo`` is
  imported by the bare loop's first ``torch.optim.SGD(...)`` (2.8 s on the busy 2-core machine of
  docs/benchmarks.md), but by the framework before its loop (``lightning.fabric`` imports it at import), so a
  start-up that ended before the first client would charge that import to the framework alone.
* spawn -> round 1 begins: the same clock up to ``loop_start_unix`` (the ``time.time()`` at which
  ``FederatedLoop.run`` starts its round loop: after the config, the imports, the data set, the partition, the
  model, Fabric and the strategy's set-up) and the bare loop's stamp just before its first round (data and network
  ready). No optimizer step has been taken on either side; shown for where the time goes.
* round time: from one round's start to the next (the framework's ``round_end_unix``: the ``time.time()`` after each
  round's training and server update, before evaluation and the checkpoint, which fall into the next round; the bare
  loop prints the same moments). "round 1" is the first round alone; "rounds 2-R" the median of the later ones.
* end to end: spawn to exit (including the final evaluation and, for the framework, the last checkpoint).

Each figure in the table is the median over ``--repeats``.

    python tools/bench_w2.py --repeats 3
    python tools/bench_w2.py --repeats 3 trainer.cohort=50    # the framework with extra overrides
"""
from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
W2 = dict(num_clients=1000, per_round=50, epochs=1, lr=0.01, batch=10, rounds=3, seed=0)
CIFAR10_MEAN, CIFAR10_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)  # as data=cifar10 normalizes


def overrides(root: str, rounds: int) -> list[str]:
    return ["data=cifar10", "data/partition=iid", f"data.root={root}", "data.augment=false", "model=cnn_fedavg",
            "method=fedavg", f"method.lr={W2['lr']}", f"fl.num_clients={W2['num_clients']}",
            f"fl.clients_per_round={W2['per_round']}", "fl.local_steps=null", f"fl.local_epochs={W2['epochs']}",
            f"data.batch_size={W2['batch']}", f"fl.rounds={rounds}", f"fl.eval_every={rounds}", f"seed={W2['seed']}",
            "trainer.accelerator=cpu", "trainer.threads=1", "trainer.progress=false"]


def framework_plan(root: str, out: str, rounds: int) -> None:
    """The clients' indices and the sampled clients of each round, exactly as the framework computes them, saved for
    the bare loop (set-up, not timed)."""
    sys.path.insert(0, ROOT)
    from hydra import compose, initialize_config_dir

    from fl_lightning import seeding
    from fl_lightning.data import build_federated_data
    from fl_lightning.config.schema import register

    register()
    with initialize_config_dir(config_dir=os.path.join(ROOT, "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides(root, rounds))
    n = W2["num_clients"]
    data = build_federated_data(cfg.data, n, W2["seed"], "cpu")
    sizes = {len(i) for i in data.client_indices}
    if sizes != {50_000 // n}:
        raise SystemExit(f"W2 wants {50_000 // n} images per client, the partition gave sizes {sorted(sizes)}")
    sampled = [seeding.sample_clients(W2["seed"], r, n, W2["per_round"]) for r in range(rounds)]
    np.savez(out, sampled=np.array(sampled), clients=np.stack([np.asarray(i) for i in data.client_indices]))


# ---------------------------------------------------------------------------------------------- the bare loop
def bare(root: str, plan: str) -> None:
    """A plain PyTorch FedAvg loop over the plan's clients; prints ``W2_LOOP_START <unix>`` before round 1,
    ``W2_FIRST_CLIENT <unix>`` after the first client's local steps and ``W2_ROUND_END <unix>`` after each round's
    averaging (before the final evaluation)."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    torch.set_num_threads(1)
    torch.manual_seed(W2["seed"])

    def read(names):  # the CIFAR-10 python pickles, as torchvision's reader does (without its md5 check)
        parts = []
        for n in names:
            with open(os.path.join(root, "cifar-10-batches-py", n), "rb") as f:
                parts.append(pickle.load(f, encoding="latin1"))
        pix = torch.from_numpy(np.concatenate([q["data"] for q in parts]).reshape(-1, 3, 32, 32))
        return pix, torch.tensor(sum((q["labels"] for q in parts), []))

    mean, std = torch.tensor(CIFAR10_MEAN).view(1, 3, 1, 1), torch.tensor(CIFAR10_STD).view(1, 3, 1, 1)

    def floats(pix):  # uint8 images kept as read, normalized per batch (as the framework does)
        return (pix.float().div_(255) - mean) / std

    x, y = read([f"data_batch_{i}" for i in range(1, 6)])
    xt, yt = read(["test_batch"])
    p = np.load(plan)
    sampled, clients = p["sampled"], torch.from_numpy(p["clients"])
    net = nn.Sequential(nn.Conv2d(3, 32, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(32, 64, 5), nn.ReLU(),
                        nn.MaxPool2d(2), nn.Flatten(), nn.Linear(64 * 5 * 5, 512), nn.ReLU(), nn.Linear(512, 10))
    glob = [t.detach().clone() for t in net.parameters()]
    print(f"W2_LOOP_START {time.time():.6f}", flush=True)
    first = True
    for r in range(len(sampled)):
        total, weight = [torch.zeros_like(t) for t in glob], 0.0
        for c in (int(c) for c in sampled[r]):
            idx = clients[c]
            with torch.no_grad():
                for q, t in zip(net.parameters(), glob):
                    q.copy_(t)
            opt = torch.optim.SGD(net.parameters(), lr=W2["lr"])
            g = torch.Generator().manual_seed(1000 * r + c)
            for _ in range(W2["epochs"]):
                perm = idx[torch.randperm(len(idx), generator=g)]
                for s in range(0, len(perm), W2["batch"]):
                    b = perm[s:s + W2["batch"]]
                    opt.zero_grad(set_to_none=True)
                    F.cross_entropy(net(floats(x[b])), y[b]).backward()
                    opt.step()
            if first:
                print(f"W2_FIRST_CLIENT {time.time():.6f}", flush=True)
                first = False
            for a, q in zip(total, net.parameters()):
                a.add_(q.detach(), alpha=len(idx))
            weight += len(idx)
        glob = [a / weight for a in total]
        print(f"W2_ROUND_END {time.time():.6f}", flush=True)
    with torch.no_grad():
        for q, t in zip(net.parameters(), glob):
            q.copy_(t)
        acc = sum(int((net(floats(xt[s:s + 1000])).argmax(-1) == yt[s:s + 1000]).sum()) for s in range(0, len(yt), 1000))
    print(f"bare: test acc {acc / len(yt):.4f}")


# ---------------------------------------------------------------------------------------------- timing
def spawn(cmd: list[str]) -> tuple[float, float, str]:
    """Run ``cmd`` in a fresh process with one OpenMP thread: (spawn time, exit time, stdout), wall clock."""
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env.pop("HYDRA_FULL_ERROR", None)
    t0 = time.time()
    p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = p.communicate()
    t1 = time.time()
    if p.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed (exit {p.returncode}):\n{err[-3000:]}")
    return t0, t1, out


def figures(t_spawn: float, t_exit: float, loop_start: float, first_client: float,
            round_ends: list[float]) -> dict[str, float]:
    d = np.diff([loop_start, *round_ends]).tolist()
    return {"startup": loop_start - t_spawn, "first_client": first_client - t_spawn, "round1": d[0],
            "rounds": statistics.median(d[1:]) if len(d) > 1 else float("nan"), "total": t_exit - t_spawn}


def run_framework(data: str, rounds: int, run_dir: str, extra: tuple = ()) -> dict[str, float]:
    t0, t1, _ = spawn([sys.executable, "train.py", *overrides(data, rounds), f"hydra.run.dir={run_dir}",
                       "overwrite=true", *extra])
    with open(os.path.join(run_dir, "summary.json")) as f:
        s = json.load(f)
    return figures(t0, t1, s["loop_start_unix"], s["first_client_unix"], s["round_end_unix"])


def run_bare(work: str) -> dict[str, float]:
    t0, t1, out = spawn([sys.executable, os.path.abspath(__file__), "--bare", f"--work={work}"])
    marks = {}
    for line in out.splitlines():
        if line.startswith("W2_"):
            k, v = line.split()
            marks.setdefault(k, []).append(float(v))
    return figures(t0, t1, marks["W2_LOOP_START"][0], marks["W2_FIRST_CLIENT"][0], marks["W2_ROUND_END"])


ROWS = [("first_client", "start-up (spawn -> 1st client trained)"), ("startup", "spawn -> round 1 begins"),
        ("round1", "round 1"), ("rounds", "round, median of 2..R"), ("total", "end to end (spawn -> exit)")]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=W2["rounds"])
    ap.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "fl_bench_w2"))
    ap.add_argument("--bare", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("overrides", nargs="*", help="extra train.py overrides for the framework (e.g. trainer.cohort=50)")
    args = ap.parse_args(argv)
    data, plan = os.path.join(args.work, "data"), os.path.join(args.work, "plan.npz")
    if args.bare:
        bare(data, plan)
        return 0
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench import write_fake_cifar10

    write_fake_cifar10(data)
    framework_plan(data, plan, args.rounds)
    with open("/proc/loadavg") as f:
        print(f"load average at start: {f.read().split()[:3]}, {os.cpu_count()} CPUs", flush=True)
    fw, br = [], []
    for k in range(args.repeats):
        fw.append(run_framework(data, args.rounds, os.path.join(args.work, f"run{k}"), tuple(args.overrides)))
        br.append(run_bare(args.work))
        print(f"repeat {k + 1}: " + "; ".join(f"{key} framework {fw[-1][key]:.2f} s, bare {br[-1][key]:.2f} s"
                                                for key, _ in ROWS), flush=True)
    print(f"\nW2, 1 process x 1 thread, median of {args.repeats}:")
    print(f"| {'':38} | framework | bare    | ratio |")
    for key, label in ROWS:
        f_s, b_s = statistics.median(r[key] for r in fw), statistics.median(r[key] for r in br)
        print(f"| {label:38} | {f_s:7.2f} s | {b_s:5.2f} s | {f_s / b_s:5.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
