"""Kernel-launching ATen ops per local step, counted on the CPU as a proxy for a GPU step's launches.

    python tools/opcount.py method=fedmuon model=vit_tiny            # any overrides of train.py
    python tools/opcount.py --by-op method=fedmuon model=vit_tiny    # and the ops that dominate the step
    python tools/opcount.py --table                                  # every method on the default CNN, markdown
    python tools/opcount.py --table model=vit_tiny method=fedmuon method=fedpac_soap   # those methods on ViT-Tiny

``trainer.cohort=K`` counts per client-step: K clients a round (one cohort), and 2K for the per-client cost.

Runs ``train.py``'s loop in this process (one round of 2 clients) under a ``TorchDispatchMode`` that counts every
dispatched op except views and allocations, with CUDA's defaults in place of the CPU's: torch.optim's foreach, and
Newton–Schulz in one zero-padded batch (``ns_batching: auto``);
once with ``fl.local_steps=2`` and once with ``=6``. The difference over the 4 extra steps is the count per local
step, so whatever happens once per client, round or run cancels. A third run with 4 clients a round gives what a
client costs beyond its steps (checkout, upload, aggregation): the difference from the 2-client run, per client, less
its 2 steps.
"""
from __future__ import annotations

import collections
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

ALLOCATIONS = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "detach", "lift_fresh",
               "alias", "_unsafe_view", "set_",
               "_record_function_enter_new", "_record_function_exit",  # the profiler's markers (no kernel)
               "_local_scalar_dense"}  # a number read to the host (.item()): torch.optim's CPU step counts, the loop's
# one read of a client's mean loss; no launch (on a GPU a read of a device tensor is a wait instead: the sync tests)


class OpCounter(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if not (func.is_view or name in ALLOCATIONS):
            self.ops[name] += 1
        return func(*args, **(kwargs or {}))


def count(overrides: list[str], steps: int, clients: int = 2) -> collections.Counter:
    import importlib
    import pkgutil

    from tests.helpers.cli import build_loop

    # each torch.optim module holds its own reference to the default chooser: replace it in every one
    modules = [importlib.import_module(f"torch.optim.{m.name}") for m in pkgutil.iter_modules(torch.optim.__path__)]
    saved = {m: m._default_to_fused_or_foreach for m in modules if hasattr(m, "_default_to_fused_or_foreach")}
    for m in saved:
        m._default_to_fused_or_foreach = lambda params, differentiable, use_fused=False: (False, True)
    from fl_lightning.optim import muon_math
    muon_math.PAD_DEVICES.add("cpu")  # and Newton-Schulz batched as on CUDA (ns_batching: auto pads there)
    try:
        with tempfile.TemporaryDirectory() as d:
            loop = build_loop([*overrides, "fl.rounds=1", f"fl.clients_per_round={clients}", f"fl.local_steps={steps}",
                               "fl.local_epochs=null", "trainer.progress=false", "trainer.accelerator=cpu",
                               "checkpoint.every=1000"], d)
            counter = OpCounter()
            with counter:
                loop.run(progress_enabled=False)
            return counter.ops
    finally:
        muon_math.PAD_DEVICES.discard("cpu")
        for m, f in saved.items():
            m._default_to_fused_or_foreach = f


def per_step(overrides: list[str]) -> tuple[float, float, collections.Counter]:
    """(ops per local step, ops per client beyond its steps, per-op counts per step). With ``trainer.cohort=K`` a
    round of K clients (one cohort) and one of 2K: per client-step and per client, what a cohort costs shared by
    its K clients."""
    k = next((int(a.split("=", 1)[1]) for a in overrides if a.startswith("trainer.cohort=")), 0) or 2
    a, b, c = count(overrides, 2, clients=k), count(overrides, 6, clients=k), count(overrides, 2, clients=2 * k)
    step = (sum(b.values()) - sum(a.values())) / (4 * k)  # 4 more steps for each of the k clients
    by_op = collections.Counter({n: (b[n] - a[n]) / (4 * k) for n in set(a) | set(b) if b[n] != a[n]})
    return step, (sum(c.values()) - sum(a.values())) / k - 2 * step, by_op


def table(methods: list[str], extra: list[str]) -> None:
    """A markdown table, one row per method, each counted in its own interpreter (a fresh dispatcher and caches)."""
    import subprocess

    print("| method | ops per local step | ops per client beyond its steps |\n| --- | --- | --- |", flush=True)
    for m in methods:
        p = subprocess.run([sys.executable, __file__, f"method={m}", *extra], capture_output=True, text=True)
        line = p.stdout.strip().splitlines()[-1] if p.returncode == 0 and p.stdout.strip() else ""
        if ": " in line:
            step, client = line.split(": ", 1)[1].split(" ops per local step, ")
            print(f"| {m} | {step} | {client.split()[0]} |", flush=True)
        else:
            print(f"| {m} | failed: {(p.stderr.strip().splitlines() or ['?'])[-1][:80]} | |", flush=True)


def main(argv: list[str]) -> None:
    if "--table" in argv:  # every method (or those named with method=...), the other overrides for all
        names = [a.split("=", 1)[1] for a in argv if a.startswith("method=")]
        conf = os.path.join(ROOT, "conf", "method")
        names = names or sorted(f[:-5] for f in os.listdir(conf) if f.endswith(".yaml"))
        return table(names, [a for a in argv if not a.startswith(("--", "method="))])
    by_op = "--by-op" in argv
    overrides = [a for a in argv if not a.startswith("--")]
    step, client, ops = per_step(overrides)
    print(f"{' '.join(overrides) or '(defaults)'}: {step:.0f} ops per local step, {client:.0f} per client beyond "
          "its steps")
    if by_op:
        for name, n in ops.most_common(40):
            print(f"  {name:32s} {n:7.1f}")


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--by-op", action="store_true", help="also the 40 ops that dominate the step")
    ap.add_argument("--table", action="store_true", help="a markdown table: every method, or those named method=...")
    ap.add_argument("overrides", nargs="*", help="train.py overrides")
    a = ap.parse_intermixed_args()
    torch.set_num_threads(1)
    main(a.overrides + ["--by-op"] * a.by_op + ["--table"] * a.table)
