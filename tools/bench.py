"""The W1 workload, through ``train.py`` and through a bare PyTorch loop doing the same local steps (issue 18 item 5).

W1: a fake CIFAR-10 written here in torchvision's pickle format (random pixels and labels, 50,000 / 10,000), 100
clients, Dirichlet 0.5 (per class), 10 sampled per round, 5 local epochs of plain SGD (lr 0.01, batch 50, no
augmentation), the FedAvg CNN (878,538 parameters), 5 rounds, the test set evaluated after round 5.

* framework: ``python train.py data=cifar10 model=cnn_fedavg method=fedavg ...`` (checkpoints, metrics and all);
* bare: ``python tools/bench.py --bare ...``: torch and numpy only, the same clients (the framework's partition
  and sampler, computed beforehand and handed over as index files), the same local steps, size-weighted averaging.

Both are timed from interpreter start to exit, interleaved (framework, bare, framework, bare, ...), with one thread
per process; the peak resident memory of each whole process tree is sampled from /proc, as the sum of the
processes' RSS (a page shared by two processes counted twice) and of their PSS (counted once in all). With ``--processes 2``
the framework runs ``trainer.devices=2`` (gloo) and the bare loop two 1-thread processes, each training the clients
the framework's per-round assignment gives its rank.

    python tools/bench.py                   # 1 process, 2 repetitions
    python tools/bench.py --processes 2
"""
from __future__ import annotations

import argparse
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
W1 = dict(num_clients=100, per_round=10, epochs=5, lr=0.01, batch=50, rounds=5, alpha=0.5, seed=0)


# ---------------------------------------------------------------------------------------------- data
def write_fake_cifar10(root: str, n_train: int = 50_000, n_test: int = 10_000) -> None:
    d = os.path.join(root, "cifar-10-batches-py")
    if os.path.exists(os.path.join(d, "test_batch")):
        return
    os.makedirs(d, exist_ok=True)
    rng = np.random.default_rng(0)
    per = n_train // 5
    for i in range(1, 6):
        with open(os.path.join(d, f"data_batch_{i}"), "wb") as f:
            pickle.dump({"data": rng.integers(0, 256, (per, 3072), dtype=np.uint8),
                         "labels": rng.integers(0, 10, per).tolist()}, f)
    with open(os.path.join(d, "test_batch"), "wb") as f:
        pickle.dump({"data": rng.integers(0, 256, (n_test, 3072), dtype=np.uint8),
                     "labels": rng.integers(0, 10, n_test).tolist()}, f)
    with open(os.path.join(d, "batches.meta"), "wb") as f:
        pickle.dump({"label_names": [f"c{i}" for i in range(10)]}, f)


def framework_plan(root: str, out: str, world: int) -> None:
    """The clients, their indices, the sampled clients of each round and the process training each, exactly as the
    framework computes them, saved for the bare loop (this is set-up, not timed)."""
    sys.path.insert(0, ROOT)
    from hydra import compose, initialize_config_dir

    from fl_lightning import seeding
    from fl_lightning.config import StepBudget
    from fl_lightning.data import build_federated_data
    from fl_lightning.loop import assign_clients

    from fl_lightning.config.schema import register

    register()  # the config schema, conf/config.yaml's first default
    with initialize_config_dir(config_dir=os.path.join(ROOT, "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides(root, world))
    data = build_federated_data(cfg.data, W1["num_clients"], W1["seed"], "cpu")
    n = W1["num_clients"]
    work = [float(data.steps_per_round(c, StepBudget(epochs=W1["epochs"]))) for c in range(n)]
    sampled = [seeding.sample_clients(W1["seed"], r, n, W1["per_round"]) for r in range(W1["rounds"])]
    # per round, as the loop places clients that hold no state (plain SGD keeps none)
    owner = [[assign_clients(work, world, list(s), [-1] * n).get(c, -1) for c in range(n)] for s in sampled]
    np.savez(os.path.join(out, "plan.npz"), owner=np.array(owner), sampled=np.array(sampled),
             **{f"c{c}": np.asarray(data.client_indices[c]) for c in range(n)})


def overrides(root: str, world: int) -> list[str]:
    return ["data=cifar10", f"data.root={root}", "data.augment=false", "model=cnn_fedavg", "method=fedavg",
            f"method.lr={W1['lr']}", f"fl.num_clients={W1['num_clients']}", f"fl.clients_per_round={W1['per_round']}",
            "fl.local_steps=null", f"fl.local_epochs={W1['epochs']}", f"data.batch_size={W1['batch']}",
            f"fl.rounds={W1['rounds']}", f"fl.eval_every={W1['rounds']}", f"data.partition.alpha={W1['alpha']}",
            "data.partition.min_size=1", "trainer.accelerator=cpu", "trainer.threads=1", "trainer.progress=false",
            *(["trainer.devices=2", "trainer.strategy=ddp"] if world == 2 else [])]


# ---------------------------------------------------------------------------------------------- the bare loop
def bare(root: str, plan: str, rank: int, world: int) -> None:
    import torch
    import torch.nn.functional as F
    from torch import nn
    torch.set_num_threads(1)
    torch.manual_seed(0)

    def read(names):  # the CIFAR-10 python pickles, as torchvision's reader does (without its md5 check)
        parts = [pickle.load(open(os.path.join(root, "cifar-10-batches-py", n), "rb"), encoding="latin1") for n in names]
        pix = np.concatenate([q["data"] for q in parts]).reshape(-1, 3, 32, 32)
        return torch.from_numpy(pix).float().div(255), torch.tensor(sum((q["labels"] for q in parts), []))

    x, y = read([f"data_batch_{i}" for i in range(1, 6)])
    xt, yt = read(["test_batch"])
    mean, std = x.mean((0, 2, 3), keepdim=True), x.std((0, 2, 3), keepdim=True)
    x.sub_(mean).div_(std)
    xt.sub_(mean).div_(std)
    p = np.load(plan)
    owner, sampled = p["owner"], p["sampled"]
    net = nn.Sequential(nn.Conv2d(3, 32, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(32, 64, 5), nn.ReLU(),
                        nn.MaxPool2d(2), nn.Flatten(), nn.Linear(64 * 5 * 5, 512), nn.ReLU(), nn.Linear(512, 10))
    glob = [t.detach().clone() for t in net.parameters()]
    for r in range(len(sampled)):
        total, weight = [torch.zeros_like(t) for t in glob], 0.0
        for c in (int(c) for c in sampled[r] if owner[r][int(c)] == rank):
            idx = torch.from_numpy(p[f"c{c}"])
            with torch.no_grad():
                for q, t in zip(net.parameters(), glob):
                    q.copy_(t)
            opt = torch.optim.SGD(net.parameters(), lr=W1["lr"])
            g = torch.Generator().manual_seed(1000 * r + c)
            for _ in range(W1["epochs"]):
                perm = idx[torch.randperm(len(idx), generator=g)]
                for s in range(0, len(perm), W1["batch"]):
                    b = perm[s:s + W1["batch"]]
                    opt.zero_grad(set_to_none=True)
                    F.cross_entropy(net(x[b]), y[b]).backward()
                    opt.step()
            for a, q in zip(total, net.parameters()):
                a.add_(q.detach(), alpha=len(idx))
            weight += len(idx)
        glob = [a / max(weight, 1.0) for a in total]
    with torch.no_grad():
        for q, t in zip(net.parameters(), glob):
            q.copy_(t)
        acc = sum(int((net(xt[s:s + 1024]).argmax(-1) == yt[s:s + 1024]).sum()) for s in range(0, len(yt), 1024))
    print(f"bare rank {rank}: test acc {acc / len(yt):.4f}")


# ---------------------------------------------------------------------------------------------- timing
def tree_memory(pid: int, pss: bool = False) -> int:
    """Resident bytes of ``pid`` and all its descendants (from /proc): the sum of their RSS, or with ``pss`` of their
    proportional set sizes (a page shared by k processes, such as torch's libraries, counted 1/k in each)."""
    field, path = ("Pss:", "smaps_rollup") if pss else ("VmRSS:", "status")
    total, stack = 0, [pid]
    while stack:
        p = stack.pop()
        try:
            with open(f"/proc/{p}/{path}") as f:
                total += next(int(line.split()[1]) * 1024 for line in f if line.startswith(field))
            for t in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{t}/children") as f:
                    stack += [int(c) for c in f.read().split()]
        except (OSError, StopIteration, ValueError):
            continue
    return total


def timed(cmds: list[list[str]]) -> tuple[float, int, int]:
    """Start every command at once; seconds until the last one exits, and the peak summed RSS and PSS of their trees
    (RSS every 50 ms; PSS, dearer to read, every 0.5 s)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env.pop("HYDRA_FULL_ERROR", None)
    t0 = time.perf_counter()
    procs = [subprocess.Popen(c, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for c in cmds]
    peak, done = [0, 0], threading.Event()

    def sample():
        k = 0
        while not done.is_set():
            peak[0] = max(peak[0], sum(tree_memory(p.pid) for p in procs))
            if k % 10 == 0:
                peak[1] = max(peak[1], sum(tree_memory(p.pid, pss=True) for p in procs))
            k += 1
            time.sleep(0.05)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    outs = [p.communicate() for p in procs]
    elapsed = time.perf_counter() - t0
    done.set()
    th.join()
    for p, (out, err) in zip(procs, outs):
        if p.returncode:
            raise SystemExit(f"{' '.join(p.args)} failed:\n{err[-3000:]}")
    return elapsed, peak[0], peak[1]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--processes", type=int, choices=[1, 2], default=1)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "fl_bench_w1"))
    ap.add_argument("--bare", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    data, world = os.path.join(args.work, "data"), args.processes
    if args.bare:
        bare(data, os.path.join(args.work, f"plan{world}", "plan.npz"), args.rank, world)
        return 0
    write_fake_cifar10(data)
    plan_dir = os.path.join(args.work, f"plan{world}")
    os.makedirs(plan_dir, exist_ok=True)
    framework_plan(data, plan_dir, world)
    fw, br = [], []
    for k in range(args.repeats):
        run_dir = os.path.join(args.work, f"run{world}_{k}")
        fw.append(timed([[sys.executable, "train.py", *overrides(data, world), f"hydra.run.dir={run_dir}",
                          "overwrite=true"]]))
        br.append(timed([[sys.executable, os.path.abspath(__file__), "--bare", f"--processes={world}",
                          f"--rank={r}", f"--work={args.work}"] for r in range(world)]))
        print(f"repeat {k + 1}: framework {fw[-1][0]:.1f} s, RSS {fw[-1][1] / 2**20:.0f} MiB, PSS "
              f"{fw[-1][2] / 2**20:.0f} MiB; bare {br[-1][0]:.1f} s, RSS {br[-1][1] / 2**20:.0f} MiB, PSS "
              f"{br[-1][2] / 2**20:.0f} MiB", flush=True)
    f_s, b_s = statistics.median(r[0] for r in fw), statistics.median(r[0] for r in br)
    print(f"W1, {world} process(es) x 1 thread, median of {args.repeats}: framework {f_s:.1f} s (peak tree memory: "
          f"RSS {max(r[1] for r in fw) / 2**20:.0f} MiB, PSS {max(r[2] for r in fw) / 2**20:.0f} MiB), bare "
          f"{b_s:.1f} s (RSS {max(r[1] for r in br) / 2**20:.0f} MiB, PSS {max(r[2] for r in br) / 2**20:.0f} MiB)")
    print(f"ratio {f_s / b_s:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
