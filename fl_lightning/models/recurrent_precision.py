"""An LSTM under CPU bf16 autocast where oneDNN has no bf16: run it in fp32.

Under ``trainer.precision=bf16-mixed`` on a CPU, autocast hands ``nn.LSTM`` bfloat16 inputs and torch runs it with
oneDNN's LSTM primitive. oneDNN has a bf16 LSTM only on CPUs with native bf16 (AVX512-BF16 or AMX); on an AVX2 CPU
the primitive cannot be created ("could not create a primitive descriptor for the LSTM forward propagation
primitive"). Measured on one core, a 2-layer LSTM(8 → 100) over 16 × 80 characters, forward and backward
(``tools/lstm_bf16.py``): fp32 20 ms, bf16 through oneDNN 5 ms where it exists, bf16 with oneDNN switched off (ATen's
own LSTM) 230–260 ms. So where oneDNN has no bf16, the LSTM runs in fp32 (autocast off for it, its input cast up);
the layers around it stay in bf16. On a GPU, cuDNN runs the bf16 LSTM and nothing changes.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from ..precision import onednn_has_bf16


def cpu_bf16_without_onednn(x: Tensor) -> bool:
    return (x.device.type == "cpu" and torch.is_autocast_enabled("cpu")
            and torch.get_autocast_dtype("cpu") == torch.bfloat16 and not onednn_has_bf16())


def run_lstm(lstm: nn.LSTM, x: Tensor) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    """``lstm(x)``, in fp32 where CPU bf16 autocast would hand oneDNN a bf16 LSTM it cannot run."""
    if cpu_bf16_without_onednn(x):
        with torch.autocast("cpu", enabled=False):
            return lstm(x.float())
    return lstm(x)
