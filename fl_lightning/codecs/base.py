"""Codecs: what a tensor costs on the wire and what the receiver rebuilds.

A codec is an object a part is given (built from a ``_target_`` config): ``encode(key, tensor, state) -> Msg``
returns the :class:`~fl_lightning.strategies.base.Msg` whose ``tensor`` is the receiver's dense reconstruction and
whose ``nbits`` is the exact number of bits that travelled. ``state`` is the sending client's persistent state
(a ``{name: tensor}`` dict kept in the ClientStateStore), for codecs with memory such as
:class:`~fl_lightning.codecs.error_feedback.ErrorFeedback`; ``key`` names the tensor (codecs with memory keep their
entries under it). ``rng`` is the sending client's generator (``client.rng``), for randomized codecs (``Sign``'s
``sign_zero=random``); wrappers pass it on. Codecs never change the message weight; the part sets it.
"""
from __future__ import annotations

from typing import Protocol

from torch import Generator, Tensor

from ..strategies.base import Msg


class Codec(Protocol):
    def encode(self, key: str, tensor: Tensor, state: dict[str, Tensor] | None = None,
               rng: Generator | None = None) -> Msg: ...


def dense_bits(t: Tensor) -> int:
    return t.numel() * t.element_size() * 8


class Dense:
    """No compression: the tensor as it is (``numel · bits per element``)."""

    def encode(self, key: str, tensor: Tensor, state: dict[str, Tensor] | None = None,
               rng: Generator | None = None) -> Msg:
        t = tensor.detach()
        return Msg(t, nbits=dense_bits(t))
