"""Checkpoint cost at scale: bytes and seconds per checkpoint against the round's time, at 100 and 1,000 clients.

    python tools/bench_checkpoint.py                                  # 100 and 1,000 clients, memory and disk store
    python tools/bench_checkpoint.py --clients 1000 --stores disk --hidden 40
    python tools/bench_checkpoint.py --set checkpoint.background_mb=0  # every checkpoint written before the next round

W1's fake CIFAR-10 (tools/bench.py writes it: 50,000 random 32×32×3 images), ``method=fedavg_adam`` (Adam state kept
per client: exp_avg, exp_avg_sq, step), an MLP with one hidden layer (``--hidden``, 40: 123,290 weights, 0.99 MB of
Adam state per client; an MLP does the least compute per byte of state, so it is the worst case for the checkpoint's
share of a round; ``--model`` takes another), 10 clients sampled per round, the defaults otherwise (K = 10 local steps of batch 50, a
checkpoint every round, two kept). Every client is given a state first (the template of a client that trained, so
the checkpoint holds the state of all n clients, as after a long run). Then ``--blocks`` interleaved pairs of blocks of
``--rounds`` rounds run through ``FederatedLoop.run_round``: one without checkpoints, one with the loop's
``Checkpointer.save`` after every round (and, at the block's end, the wait for the last one written behind), after
an untimed checkpoint of what the rounds without checkpoints changed (so each timed one writes one round's clients,
as in a run with ``checkpoint.every=1``). The cost
of checkpointing is the difference of the two per-round times, so it includes what a checkpoint written behind the
next round slows that round down, not only the time ``save()`` blocks. Each configuration runs in its own process with
one thread, so its peak resident memory is its own. Prints per configuration (medians over the blocks): the round
without and with a checkpoint (training + aggregation, no evaluation), the median time ``save()`` blocked, the bytes
a checkpoint wrote, the cost as a share of the round, the first checkpoint after the fill, and the peak resident
memory.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def _dir_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))


def one(n: int, store: str, rounds: int, blocks: int, model: list[str], work: str, extra: list[str]) -> dict:
    from hydra import compose, initialize_config_dir
    from omegaconf import open_dict

    from fl_lightning.run.build import build
    from tools.bench import write_fake_cifar10

    data = os.path.join(work, "data")
    if not os.path.isdir(os.path.join(data, "cifar-10-batches-py")):
        write_fake_cifar10(data)
    run = os.path.join(work, f"run_{n}_{store}")
    shutil.rmtree(run, ignore_errors=True)
    ov = ["method=fedavg_adam", *model, "data=cifar10", f"data.root={data}",
          "data.augment=false", "data.batch_size=50", "data/partition=iid", f"fl.num_clients={n}",
          "fl.clients_per_round=10", f"fl.rounds={2 * rounds * blocks + 2}", "trainer.accelerator=cpu", "trainer.progress=false",
          "trainer.threads=1", *extra] + ([f"store.offload_dir={os.path.join(work, f'store_{n}')}"] if store == "disk" else [])
    from fl_lightning.config.schema import register

    register()  # the config schema, conf/config.yaml's first default
    with initialize_config_dir(config_dir=os.path.join(ROOT, "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=ov)
    with open_dict(cfg):
        cfg.run_dir = run
    loop = build(cfg, run)
    loop.setup()
    loop.run_round(0)
    loop.round = 1
    template = loop.store.get(loop.store.clients()[0])
    for c in range(n):  # every client holds a state, as after a long run
        if c not in loop.store.clients():
            loop.store.put(c, template)
    ck = loop.checkpointer
    t = time.perf_counter()
    first = ck.save(1, loop.stateful())
    ck.wait()
    first_s, first_b = time.perf_counter() - t, _dir_bytes(first)
    plain, saved, blocked, save_b = [], [], [], []
    r = 1
    for _ in range(blocks):  # interleaved: rounds without checkpoints, then the same number each followed by one
        t0 = time.perf_counter()
        for _ in range(rounds):
            loop.run_round(r)
            r += 1
            loop.round = r
        plain.append((time.perf_counter() - t0) / rounds)
        ck.save(loop.round, loop.stateful())  # not timed: the clients those rounds changed, so that the block
        ck.wait()  # below sees the steady state (each checkpoint writes the ~10 clients of one round)
        t0 = time.perf_counter()
        for _ in range(rounds):
            loop.run_round(r)
            r += 1
            loop.round = r
            t1 = time.perf_counter()
            path = ck.save(loop.round, loop.stateful())
            blocked.append(time.perf_counter() - t1)
        ck.wait()  # the last one written behind is part of this block's cost
        saved.append((time.perf_counter() - t0) / rounds)
        save_b.append(_dir_bytes(path))
    state_mb = sum(v.numel() * v.element_size() for v in template.values()) / 1e6
    ckpt_dir = os.path.join(run, "checkpoints")
    on_disk = sum(_dir_bytes(os.path.join(ckpt_dir, d)) for d in os.listdir(ckpt_dir))
    return {"clients": n, "store": store, "state_mb": state_mb, "round_s": statistics.median(plain),
            "with_s": statistics.median(saved), "blocked_s": statistics.median(blocked),
            "save_mb": statistics.median(save_b) / 1e6, "first_s": first_s, "first_mb": first_b / 1e6,
            "ckpt_dir_mb": on_disk / 1e6, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, nargs="+", default=[100, 1000])
    ap.add_argument("--stores", nargs="+", default=["memory", "disk"], choices=["memory", "disk"])
    ap.add_argument("--rounds", type=int, default=10, help="rounds per block")
    ap.add_argument("--blocks", type=int, default=3, help="interleaved blocks of rounds without and with checkpoints")
    ap.add_argument("--set", nargs="+", default=[], help="more overrides, e.g. checkpoint.background_mb=0")
    ap.add_argument("--hidden", type=int, default=40, help="the MLP's hidden width")
    ap.add_argument("--model", nargs="+", default=None,
                    help="model overrides instead of the MLP, e.g. model=cnn model.net.channels=[8,16] model.net.hidden=32")
    ap.add_argument("--work", default=None, help="a folder for the data, runs and stores (default: a temporary one)")
    ap.add_argument("--one", nargs=2, metavar=("N", "STORE"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.one:
        model = a.model or ["model=mlp", f"model.net.hidden=[{a.hidden}]"]
        print(json.dumps(one(int(a.one[0]), a.one[1], a.rounds, a.blocks, model, a.work, a.set)))
        return 0
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    with tempfile.TemporaryDirectory() as tmp:
        work = a.work or tmp
        print("clients  store   state/client  round    round+ckpt  save() blocks  written   cost/round  first ckpt"
              "          checkpoints on disk  peak RSS")
        for n in a.clients:
            for store in a.stores:
                cmd = [sys.executable, __file__, "--one", str(n), store, "--rounds", str(a.rounds), "--blocks", str(a.blocks), "--hidden",
                       str(a.hidden), "--work", work] + (["--model", *a.model] if a.model else []) + (["--set", *a.set] if a.set else [])
                p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
                if p.returncode != 0:
                    print(p.stderr[-3000:], file=sys.stderr)
                    return 1
                s = json.loads(p.stdout.strip().splitlines()[-1])
                cost = 100 * (s["with_s"] - s["round_s"]) / s["round_s"]
                print(f"{n:>7}  {store:<6}  {s['state_mb']:>8.2f} MB  {s['round_s']:>6.3f} s  {s['with_s']:>8.3f} s  "
                      f"{s['blocked_s']:>10.4f} s  {s['save_mb']:>7.1f} MB  {cost:>8.1f} %  "
                      f"{s['first_s']:>6.2f} s {s['first_mb']:>7.0f} MB  {s['ckpt_dir_mb']:>12.0f} MB  "
                      f"{s['peak_rss_mb']:>7.0f} MB", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
