"""Codecs: what a tensor costs on the wire and what the receiver rebuilds.

A codec is an object a part is given (built from a ``_target_`` config): ``encode(tensor, state, rng) -> Msg``
returns the :class:`~fl_lightning.messages.Msg` whose ``tensor`` is the receiver's dense reconstruction and
whose ``nbits`` is the exact number of bits that travelled. ``state`` is the codec's own memory for this tensor of
this client (a :class:`CodecState`: the sending client's persistent entries under the tensor's key, so kept in the
ClientStateStore and checkpointed), for codecs with memory such as
:class:`~fl_lightning.codecs.error_feedback.ErrorFeedback` (``state["ef"]``); a codec sees nothing else of the
client. ``rng`` is the sending client's generator (``client.rng``), for randomized codecs (``Sign``'s
``sign_zero=random``); wrappers pass both on. Codecs never change the message weight; the part sets it.

One rule for bits, every codec: a value (a coordinate, a scale, a factor entry) is charged at the width it travels
in, the tensor's dtype (:func:`value_bits`: 32 for fp32, 64 for fp64, 16 for bf16); an index into d entries costs
⌈log₂ d⌉ bits (:func:`index_bits`; 0 for d = 1, where nothing needs naming; decision 002/#7).
"""
from __future__ import annotations

import math
from collections.abc import Iterator, MutableMapping
from typing import Protocol, runtime_checkable

from torch import Generator, Tensor

from ..errors import ConfigError
from ..messages import Msg


@runtime_checkable
class Codec(Protocol):
    """What every codec has: ``encode`` (see the module docstring). Optional members a part looks for:
    ``omega`` (:class:`UnbiasedCodec`: unbiased compressors, read by ``Scallion``) and ``uses_client = True`` (the
    part passes ``client=`` to ``encode``: ``SignSteps``, read by ``ModelAverage``)."""

    def encode(self, tensor: Tensor, state: MutableMapping[str, Tensor] | None = None,
               rng: Generator | None = None) -> Msg: ...


def check_codec(codec, key: str = "codec", example: str = "fl_lightning.codecs.Sign", null: str | None = None) -> None:
    """The one check that ``codec`` is a codec (has ``encode``), for every part and codec that takes one: a one-line
    :class:`ConfigError` naming ``key``. ``null``: what ``null`` means there (None: a codec is required)."""
    if codec is None and null is not None:
        return
    if codec is None or isinstance(codec, (str, bytes)) or not callable(getattr(codec, "encode", None)):
        shown = type(codec).__name__ if not isinstance(codec, (str, bytes, int, float, type(None))) else repr(codec)
        or_null = f" (or null for {null})" if null is not None else ""
        raise ConfigError(key, f"expected a codec, got {shown}", f"give a _target_ such as {example}{or_null}")


class CodecState(MutableMapping):
    """A codec's own memory for one tensor of one client: the entries of the client's persistent state under
    ``"<key>/"`` (``key``: the tensor's name in the part's uploads), by their short names (``"ef"`` is
    ``state["<key>/ef"]`` on disk). A part hands a codec this view, never the client's whole state."""

    def __init__(self, state: MutableMapping[str, Tensor], key: str):
        self.state, self.prefix = state, f"{key}/"

    def __getitem__(self, name: str) -> Tensor:
        return self.state[self.prefix + name]

    def __setitem__(self, name: str, value: Tensor) -> None:
        self.state[self.prefix + name] = value

    def __delitem__(self, name: str) -> None:
        del self.state[self.prefix + name]

    def __iter__(self) -> Iterator[str]:
        return (k[len(self.prefix):] for k in list(self.state) if k.startswith(self.prefix))

    def __len__(self) -> int:
        return sum(1 for _ in self)


@runtime_checkable
class UnbiasedCodec(Codec, Protocol):
    """An unbiased compressor C (E[C(v)] = v) that states its variance: :class:`Dense` (ω = 0) and
    :class:`~fl_lightning.codecs.randk.RandK` (ω = d/k − 1). ``Scallion`` (strategies/parts/scallion.py) takes its
    default α = 1/(1 + ω(d)) per tensor from it."""

    def omega(self, d: int) -> float:
        """The variance parameter ω of C on a tensor of d entries: E‖C(v) − v‖² ≤ ω‖v‖²."""
        ...


def value_bits(t: Tensor) -> int:
    """Bits of one value of ``t`` on the wire: its dtype's width."""
    return t.element_size() * 8


def index_bits(d: int) -> int:
    """Bits of one index into d entries: ⌈log₂ d⌉ (0 for d = 1)."""
    return math.ceil(math.log2(d)) if d > 1 else 0


def dense_bits(t: Tensor) -> int:
    return t.numel() * value_bits(t)


class Dense:
    """No compression: the tensor as it is (``numel · bits per element``)."""

    def omega(self, d: int) -> float:
        """Variance parameter of an unbiased compressor, E‖C(v) − v‖² ≤ ω‖v‖²: 0 (exact)."""
        return 0.0

    def encode(self, tensor: Tensor, state=None, rng: Generator | None = None) -> Msg:
        t = tensor.detach()
        return Msg(t, nbits=dense_bits(t))
