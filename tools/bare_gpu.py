"""The bare reference for tools/bench_gpu.py: the same local steps as a workload of ``train.py``, in a plain PyTorch
loop on any device, and the arithmetic of one step (its roofline).

For each sampled client of each round: copy the global weights into the model, build the local optimizer, take the
client's local steps (forward, cross-entropy, backward, ``optimizer.step``), add the weights to a running sum; then
average. The model, the local optimizer and the clients' step counts are the framework's own, taken from the
workload's composed config (``build_model``, the ``optimizer`` group, the partition's client sizes and
``seeding.sample_clients``), so both sides run the same arithmetic; what the bare loop leaves out is the framework:
the strategy's parts (FedMuon's momentum aggregation and alignment, a few elementwise ops per step), client state,
evaluation, checkpoints, metrics. The batches are random tensors resident on the device (the workloads' data are
random pixels too), so no input pipeline is timed on either side.

FLOPs of a step: ``torch.utils.flop_counter.FlopCounterMode`` over one forward and backward at the workload's batch
size (matrix multiplies and convolutions; the optimizer's own arithmetic, e.g. Newton–Schulz, is not counted, so the
roofline fraction is a lower bound). Peak rates: the vendor's dense figures for fp32 without tensor cores (torch's
default for fp32 matmuls) and bf16 with them; unknown devices get none.

    python tools/bare_gpu.py vit --precision 32-true          # one JSON line
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

# dense peak TFLOPS (NVIDIA data sheets): fp32 on CUDA cores, bf16 on tensor cores
PEAKS = {"H100 PCIe": {"32-true": 51.2, "bf16-mixed": 756.0}, "H100": {"32-true": 66.9, "bf16-mixed": 989.4},
         "H200": {"32-true": 66.9, "bf16-mixed": 989.4}, "A100": {"32-true": 19.5, "bf16-mixed": 312.0}}


def peak_tflops(device, precision: str) -> float | None:
    import torch

    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for key in sorted(PEAKS, key=len, reverse=True):  # "H100 PCIe" before "H100"
        if key in name:
            return PEAKS[key].get(precision)
    return None


def compose(overrides: list[str]):
    from hydra import compose as hydra_compose, initialize_config_dir

    from fl_lightning.config.schema import register

    register()
    with initialize_config_dir(config_dir=os.path.join(ROOT, "conf"), version_base="1.3"):
        return hydra_compose(config_name="config", overrides=list(overrides))


def plan(cfg, device):
    """The model, the optimizer factory, and for each round the sampled clients' step counts, as the framework has them."""
    import torch
    from hydra.utils import instantiate

    from fl_lightning import seeding
    from fl_lightning.config import StepBudget
    from fl_lightning.data import build_federated_data
    from fl_lightning.models import build_model

    fl = cfg.fl
    data = build_federated_data(cfg.data, int(fl.num_clients), int(cfg.seed), device)
    torch.manual_seed(int(cfg.seed))
    module = build_model(cfg.model, data.info).to(device)
    rounds = [[data.steps_per_round(c, StepBudget(fl.local_steps, fl.local_epochs))
               for c in seeding.sample_clients(int(cfg.seed), r, int(fl.num_clients), int(fl.clients_per_round))]
              for r in range(int(fl.rounds))]
    groups = cfg.method.parts.local_optimizer.get("param_groups")
    return module, instantiate(cfg.optimizer), (instantiate(groups) if groups is not None else None), rounds, data.info


def step_flops(module, x, y) -> int:
    import torch.nn.functional as F
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        F.cross_entropy(module(x), y).backward()
    for p in module.parameters():
        p.grad = None
    return int(counter.get_total_flops())


def run(overrides: list[str], precision: str, device_name: str) -> dict:
    import torch
    import torch.nn.functional as F

    device = torch.device(device_name)
    cfg = compose(overrides)
    module, factory, groups_fn, rounds, info = plan(cfg, device)
    batch = int(cfg.data.batch_size)
    shape = tuple(info.input_shape) if getattr(info, "input_shape", None) else (3, 32, 32)
    gen = torch.Generator(device="cpu").manual_seed(0)
    pool = [(torch.randn(batch, *shape, generator=gen).to(device),
             torch.randint(0, int(info.num_classes), (batch,), generator=gen).to(device)) for _ in range(16)]
    params = [p for p in module.parameters() if p.requires_grad]
    if device.type == "cpu":  # the threads trainer.threads=auto gives the framework (one below 1M parameters)
        from fl_lightning.threads import auto_threads

        torch.set_num_threads(auto_threads(1, sum(p.numel() for p in module.parameters())))
    flops = step_flops(module, *pool[0])
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16-mixed")
    glob = [p.detach().clone() for p in params]
    steps = 0
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for counts in rounds:
        total = [torch.zeros_like(t) for t in glob]
        for k in counts:
            with torch.no_grad():
                for p, t in zip(params, glob):
                    p.copy_(t)
            opt = factory(groups_fn(module) if groups_fn is not None else params)
            for s in range(k):
                x, y = pool[(steps + s) % len(pool)]
                with autocast:
                    loss = F.cross_entropy(module(x), y)
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
            steps += k
            torch._foreach_add_(total, [p.detach() for p in params])
        glob = [t / len(counts) for t in total]
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    loop_s = time.perf_counter() - t0
    peak = peak_tflops(device, precision)
    achieved = flops * steps / loop_s / 1e12
    return {"bare_loop_s": round(loop_s, 3), "rounds": len(rounds), "steps": steps, "ms_per_step": round(1e3 * loop_s / steps, 3),
            "gflop_per_step": round(flops / 1e9, 3), "tflops": round(achieved, 3), "peak_tflops": peak,
            "roofline": round(achieved / peak, 5) if peak else None,
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else device.type}


def main(argv=None) -> int:
    from fl_lightning.threads import passive_wait

    passive_wait()  # idle OpenMP threads sleep, as train.py makes them (before torch loads)
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    from bench_gpu import workloads

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("workload")
    ap.add_argument("--precision", default="32-true", choices=["32-true", "bf16-mixed"])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--data", default=None, help="the fake CIFAR-10 folder (tools/bench_gpu.py writes it)")
    ap.add_argument("--set", nargs="*", default=[], help="more overrides (e.g. fl.rounds=1 for a quick check)")
    a = ap.parse_args(argv)
    overrides = workloads(a.data or os.path.join(ROOT, ".bench_data"))[a.workload] + list(a.set)
    print(json.dumps({"workload": a.workload, "precision": a.precision, **run(overrides, a.precision, a.device)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
