"""The char LSTM's recurrent layer under CPU bf16 autocast, three ways, one thread: fp32, bf16 through oneDNN (where
the CPU has it) and bf16 with oneDNN switched off (ATen's LSTM). Backs fl_lightning/models/recurrent_precision.py.

    python tools/lstm_bf16.py
    ONEDNN_MAX_CPU_ISA=AVX2 python tools/lstm_bf16.py      # oneDNN as on an AVX2 CPU: its bf16 LSTM is missing
"""
from __future__ import annotations

import contextlib
import time

import torch


def bench(lstm, x, ctx, reps: int = 5) -> tuple[float, torch.dtype]:
    for _ in range(2):  # the first pass warms up
        t = time.perf_counter()
        for _ in range(reps):
            with ctx():
                out, _ = lstm(x)
            out.float().sum().backward()
        dt = (time.perf_counter() - t) / reps
    return dt, out.dtype


def main() -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    lstm = torch.nn.LSTM(8, 100, num_layers=2, batch_first=True)
    x = torch.randn(16, 80, 8)
    print(f"oneDNN bf16: {torch.ops.mkldnn._is_mkldnn_bf16_supported()}, "
          f"CPU capability {torch.backends.cpu.get_cpu_capability()}")

    def aten_bf16():
        stack = contextlib.ExitStack()
        stack.enter_context(torch.autocast("cpu", dtype=torch.bfloat16))
        stack.enter_context(torch.backends.mkldnn.flags(enabled=False))
        return stack

    ways = {"fp32": contextlib.nullcontext, "bf16, oneDNN": lambda: torch.autocast("cpu", dtype=torch.bfloat16),
            "bf16, ATen (oneDNN off)": aten_bf16}
    for name, ctx in ways.items():
        try:
            dt, dtype = bench(lstm, x, ctx)
            print(f"{name:26s} {dt * 1e3:7.1f} ms  (output {dtype})")
        except RuntimeError as err:
            print(f"{name:26s} fails: {str(err).splitlines()[0][:90]}")


if __name__ == "__main__":
    import argparse

    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    main()
