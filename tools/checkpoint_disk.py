"""Disk size of incremental checkpoints over a long run, with and without compaction (``checkpoint.compact``).

    python tools/checkpoint_disk.py                      # 1,000 clients, 10 changed per checkpoint, 1,500 checkpoints
    python tools/checkpoint_disk.py --clients 1000 --per-round 100 --rounds 600

The real Checkpointer and ClientStateStore, no training: every client gets a state (1 KB: 256 float32) before the
first checkpoint, then each checkpoint follows ``--per-round`` clients sampled uniformly (as ``fl.clients_per_round``)
getting a new state. Prints, per ``compact`` value, the bytes of client files in ``checkpoints/`` against the bytes
of the n current states (at the end and the largest seen over the second half of the checkpoints) and the mean
clients written per checkpoint over the second half (``per-round`` without compaction).
"""
from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from fl_lightning.checkpoint import Checkpointer, TensorDict  # noqa: E402
from fl_lightning.loop.client_store import ClientStateStore  # noqa: E402


def client_bytes(root: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(root) for f in files
               if f.startswith("clients.") and f.endswith(".safetensors"))


def run(n: int, per_round: int, rounds: int, compact: float, work: str) -> tuple[float, float, float]:
    rnd, store = random.Random(0), ClientStateStore("cpu")
    ck = Checkpointer(os.path.join(work, f"ck{compact}"), keep_last=2, compact=compact)
    objects = {"model": TensorDict({"w": torch.zeros(4)}), "clients": store}
    for c in range(n):
        store.put(c, {"m": torch.full((256,), float(c))})
    ck.save(0, objects)
    state = n * (256 * 4)
    ratios, written = [], []
    for r in range(1, rounds + 1):
        for c in rnd.sample(range(n), per_round):
            store.put(c, {"m": torch.full((256,), float(r))})
        ck.save(r, objects)
        if r > rounds // 2:
            ratios.append(client_bytes(ck.root) / state)
            written.append(sum(1 for g in ck._index["clients"][0].values() if g == f"round_{r:06d}"))
    return ratios[-1], max(ratios), sum(written) / len(written)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=1000)
    ap.add_argument("--per-round", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=1500)
    ap.add_argument("--compact", type=float, nargs="+", default=[0.0, 0.25, 0.5])
    a = ap.parse_args(argv)
    print("compact  client files / states (end, max over 2nd half)  clients written per checkpoint")
    with tempfile.TemporaryDirectory() as work:
        for compact in a.compact:
            end, peak, written = run(a.clients, a.per_round, a.rounds, compact, work)
            print(f"{compact:>7}  {end:>10.2f}× {peak:>6.2f}×{'':>30}{written:>8.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
