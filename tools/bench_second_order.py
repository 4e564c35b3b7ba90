"""Cost of the second-order local optimizers per local step, against AdamW (issue 11, seed 001 §6).

One local step = forward + backward + (Sophia: the Hessian estimate on its steps) + optimizer.step(), timed on the
same batches, after a warm-up, for: AdamW, SOAP (eigenbasis refresh every f = 10 steps; the init-only first step
excluded), Sophia with Hutchinson every 10 steps (one HVP: a forward and a double backward), and Sophia with the
GNB estimator. Models: the default run's SmallCNN on 8x8 digits batches of 32, and ResNet-18-GN on 32x32x3
batches of 32 (CIFAR shape, 100 classes).

    python tools/bench_second_order.py                 # both models
    python tools/bench_second_order.py --models cnn --steps 60 --repeats 5
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fl_lightning.data.info import DataInfo  # noqa: E402
from fl_lightning.models import ClassifierModule  # noqa: E402
from fl_lightning.models.cnn import small_cnn  # noqa: E402
from fl_lightning.models.resnet import resnet18_gn  # noqa: E402
from fl_lightning.optim import SOAP, Sophia  # noqa: E402


def model(name: str):
    if name == "cnn":
        info = DataInfo(num_classes=10, input_shape=(1, 8, 8))
        return ClassifierModule(small_cnn, info), (1, 8, 8), 10
    info = DataInfo(num_classes=100, input_shape=(3, 32, 32))
    return ClassifierModule(resnet18_gn, info), (3, 32, 32), 100


def hutchinson(module, batch, gen):
    params = [p for p in module.parameters() if p.requires_grad]
    loss = module.training_step(batch)
    grads = torch.autograd.grad(loss, params, create_graph=True)
    us = [(torch.randint(0, 2, p.shape, generator=gen) * 2 - 1).to(p.dtype) for p in params]
    hv = torch.autograd.grad(sum((g * u).sum() for g, u in zip(grads, us)), params)
    return {p: u * h for p, u, h in zip(params, us, hv)}


def gnb(module, batch, gen):
    params = [p for p in module.parameters() if p.requires_grad]
    g = torch.autograd.grad(module.sampled_label_loss(batch, gen), params)
    return {p: len(batch["y"]) * t.square() for p, t in zip(params, g)}


def bench(name: str, kind: str, steps: int, warmup: int, clock=time.process_time) -> float:
    torch.manual_seed(0)
    module, shape, classes = model(name)
    params = list(module.parameters())
    opt = {"adamw": lambda: torch.optim.AdamW(params, lr=3e-4, weight_decay=0.01),
           "soap": lambda: SOAP(params, lr=3e-3),
           "sophia_hutchinson": lambda: Sophia(params, lr=3e-4),
           "sophia_gnb": lambda: Sophia(params, lr=3e-4)}[kind]()
    gen = torch.Generator().manual_seed(1)
    batches = [{"x": torch.randn(32, *shape, generator=gen), "y": torch.randint(0, classes, (32,), generator=gen)}
               for _ in range(8)]
    times = []
    for k in range(warmup + steps):
        batch = batches[k % len(batches)]
        t0 = clock()
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(module(batch["x"]), batch["y"]).backward()
        if kind.startswith("sophia") and (k + 1) % 10 == 0:
            est = (hutchinson if kind == "sophia_hutchinson" else gnb)(module, batch, gen)
            opt.update_hessian(est)
        opt.step()
        if k >= warmup:
            times.append(clock() - t0)
    return statistics.mean(times) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["cnn", "resnet18_gn"], choices=["cnn", "resnet18_gn"])
    ap.add_argument("--steps", type=int, default=40, help="timed steps (a multiple of 10 covers the periodic work)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3, help="interleaved repetitions; the median of their means is shown")
    ap.add_argument("--clock", choices=["cpu", "wall"], default="cpu",
                    help="cpu: the process's CPU time (robust on a shared host; with 1 thread it is the step's compute "
                         "time); wall: perf_counter")
    args = ap.parse_args()
    kinds = ("adamw", "soap", "sophia_hutchinson", "sophia_gnb")
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; {args.clock} ms per local step: the median over "
          f"{args.repeats} interleaved repetitions of the mean over {args.steps} steps")
    print("| model | AdamW | SOAP | Sophia (Hutchinson / 10) | Sophia (GNB / 10) |")
    print("| --- | --- | --- | --- | --- |")
    for name in args.models:
        runs = {k: [] for k in kinds}
        for _ in range(args.repeats):  # interleaved, so a busy spell on a shared host hits every optimizer alike
            for k in kinds:
                runs[k].append(bench(name, k, args.steps, args.warmup, clock))
        ms = {k: statistics.median(v) for k, v in runs.items()}
        base = ms["adamw"]
        cells = [f"{ms['adamw']:.1f}"] + [f"{ms[k]:.1f} ({ms[k] / base:.2f}×)" for k in kinds[1:]]
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
