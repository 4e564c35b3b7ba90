"""Seed 002's character LSTM for Shakespeare (FedSMU App. A names only input, hidden and output layers; the layout
is FedDyn's model, Acar et al., ICLR 2021, taken from the cited original):
``Embedding(80, 8) → 2-layer LSTM(hidden 100) → Linear(100, 80)`` on the last time step of an 80-character window,
predicting the next character (under CPU bf16 autocast the LSTM runs in fp32 where oneDNN has no bf16 LSTM:
``recurrent_precision.py``); 133,520 parameters with the 80-symbol vocabulary (asserted in
``tests/unit/models/test_language_models.py``). Wrapped by :class:`~fl_lightning.models.ClassifierModule` (``input_key:
input_ids``, labels = the next character), so the metric is next-character accuracy.
"""
from __future__ import annotations

from torch import Tensor, nn

from ..data.info import DataInfo
from ..errors import ConfigError
from ._args import Depth, Width, positive_ints
from .recurrent_precision import run_lstm


class CharLSTM(nn.Module):
    def __init__(self, vocab_size: int, embed_dim: int, hidden: int, layers: int):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, embed_dim)
        self.lstm = nn.LSTM(embed_dim, hidden, num_layers=layers, batch_first=True)
        self.fc = nn.Linear(hidden, vocab_size)

    def forward(self, ids: Tensor) -> Tensor:
        out, _ = run_lstm(self.lstm, self.embedding(ids.long()))  # fp32 where the CPU has no bf16 LSTM
        return self.fc(out[:, -1])


def char_lstm(info: DataInfo, embed_dim: Width = 8, hidden: Width = 100, layers: Depth = 2) -> CharLSTM:
    """The LSTM over ``info``'s characters (the output has one class per vocabulary symbol)."""
    if not info.vocab_size or info.num_classes != info.vocab_size:
        raise ConfigError("", f"the character LSTM needs a next-character dataset (vocabulary {info.vocab_size}, "
                          f"classes {info.num_classes})", "use data=shakespeare or data=pydoc_chars")
    (embed_dim,) = positive_ints(embed_dim, "embed_dim", 1, "8")
    (hidden,) = positive_ints(hidden, "hidden", 1, "100")
    (layers,) = positive_ints(layers, "layers", 1, "2")
    return CharLSTM(info.vocab_size, embed_dim, hidden, layers)
