"""Cost of one client's checkout + checkin through the ClientStateStore (CPU), per client.

    OMP_NUM_THREADS=1 python tools/bench_store.py
    OMP_NUM_THREADS=1 python tools/bench_store.py --models mlp --clients 8 --repeats 9

The state is a persistent Adam state as the loop stores it (``export_optimizer_state``: exp_avg, exp_avg_sq and a
0-d step per parameter) of ResNet-18-GN (CIFAR stem, 100 classes: 11.2 M weights, 62 tensors, 89 MB of state) or
of an MLP 784-128-10 (4 tensors, 0.8 MB). For each client: ``checkout`` (what training receives), then ``checkin``
of the exported state (what training hands back). Prints, per model and store (memory, or ``offload_dir`` on disk), the
median over ``--repeats`` passes over ``--clients`` clients of the process CPU time per client, in ms.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fl_lightning.loop.client_store import ClientStateStore  # noqa: E402
from fl_lightning.data.info import DataInfo  # noqa: E402
from fl_lightning.models.cnn import mlp  # noqa: E402
from fl_lightning.models.resnet import resnet18_gn  # noqa: E402
from fl_lightning.optim.state import export_optimizer_state  # noqa: E402


def adam_state(name: str) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    net = (resnet18_gn(DataInfo(num_classes=100, input_shape=(3, 32, 32))) if name == "resnet18_gn"
           else mlp(DataInfo(num_classes=10, input_shape=(1, 28, 28)), hidden=[128]))
    opt = torch.optim.Adam(net.parameters())
    for p in net.parameters():
        p.grad = torch.randn_like(p)
    opt.step()
    return {f"local_optimizer/{k}": v for k, v in export_optimizer_state(opt).items()}


def one_pass(store: ClientStateStore, state: dict, clients: int) -> float:
    t0 = time.process_time()
    for c in range(clients):
        checked_out = store.checkout(c)  # alive until after checkin, as client.state in the loop
        store.checkin(c, state)
        checked_out.clear()
    return (time.process_time() - t0) / clients * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["resnet18_gn", "mlp"])
    ap.add_argument("--stores", nargs="+", default=["memory", "disk"])
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=7)
    a = ap.parse_args()
    for name in a.models:
        state = adam_state(name)
        mb = sum(v.numel() * v.element_size() for v in state.values()) / 1e6
        for kind in a.stores:
            with tempfile.TemporaryDirectory() as d:
                store = ClientStateStore("cpu", d if kind == "disk" else None)
                for c in range(a.clients):
                    store.put(c, state)
                times = [one_pass(store, state, a.clients) for _ in range(a.repeats)]
                print(f"{name:12s} {kind:6s} {len(state):4d} tensors {mb:7.2f} MB  checkout+checkin "
                      f"{statistics.median(times):8.2f} ms/client (min {min(times):.2f}, max {max(times):.2f})",
                      flush=True)
                del store


if __name__ == "__main__":
    main()
