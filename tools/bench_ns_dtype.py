"""Newton-Schulz per dtype on ViT-Tiny's Muon matrix shapes, one thread: five steps of ``orthogonalize`` (Keller
Jordan's quintic), best of 5, and the error against float64. Backs fl_lightning/precision.py (``ns_dtype: auto``).

    python tools/bench_ns_dtype.py                              # this CPU as it is
    ONEDNN_MAX_CPU_ISA=AVX2 python tools/bench_ns_dtype.py      # bf16 as on a CPU without native bf16
"""
from __future__ import annotations

import time

import torch

from fl_lightning import precision
from fl_lightning.optim.newton_schulz import orthogonalize

# ViT-Tiny (embed 192, MLP 768, patch 16x16x3): qkv, attention proj, fc1, fc2, patch embedding (as out x in*kh*kw)
SHAPES = {"qkv 576x192": (576, 192), "proj 192x192": (192, 192), "fc1 768x192": (768, 192),
          "fc2 192x768": (192, 768), "patch 192x768": (192, 768)}


def best(fn, reps: int = 5) -> float:
    fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    print(f"CPU capability {torch.backends.cpu.get_cpu_capability()}, native bf16: {precision.cpu_has_native_bf16()}, "
          f"auto -> {precision.auto_dtype('cpu')}")
    print(f"{'shape':16s} {'fp32 ms':>8s} {'bf16 ms':>8s} {'bf16/fp32':>9s} {'err fp32':>9s} {'err bf16':>9s}")
    for name, shape in SHAPES.items():
        G = torch.randn(*shape)
        ref = orthogonalize(G.double(), 5, "muon")
        row = []
        for dtype in (None, "bfloat16"):
            t = best(lambda: orthogonalize(G, 5, "muon", dtype=dtype))
            err = float((orthogonalize(G, 5, "muon", dtype=dtype).double() - ref).norm() / ref.norm())
            row.append((t, err))
        (t32, e32), (t16, e16) = row
        print(f"{name:16s} {t32 * 1e3:8.2f} {t16 * 1e3:8.2f} {t16 / t32:9.1f} {e32:9.1e} {e16:9.1e}")


if __name__ == "__main__":
    import argparse

    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    main()
