"""Clamp: a codec wrapper that clamps what the receiver rebuilds to [min, max] (the inner codec's bits, unchanged).

FedPAC_Sophia_light (Liu et al., "Taming Preconditioner Drift", FedPAC, ICML submission: Table 11; decision
001/#16 in docs/decisions.md) uploads Sophia's Hessian-diagonal EMA h as a truncated SVD; a low-rank reconstruction
of a non-negative matrix can have negative entries, and a negative h would turn Sophia's m / max(γh, ε) around.
``Clamp(LowRankSVD(...), min=0)`` rebuilds max(Û, 0). This clamp is our choice, not the paper's (the paper does not
say how h is compressed). Nothing extra travels: the receiver clamps its own reconstruction, so ``Msg.nbits`` is the
inner codec's.
"""
from __future__ import annotations

from torch import Tensor

from .base import check_codec
from ..errors import ConfigError
from ..messages import Msg
from ..config import NonNegative


class Clamp:
    def __init__(self, inner, min: NonNegative | None = 0.0,  # noqa: A002 (torch's names)
                 max: NonNegative | None = None):  # noqa: A002
        check_codec(inner, "inner", "fl_lightning.codecs.LowRankSVD")
        if min is None and max is None:
            raise ConfigError("min", "neither min nor max is set", "set min (e.g. 0.0) and/or max")
        if min is not None and max is not None and float(min) > float(max):
            raise ConfigError("min", f"min {min} > max {max}", "give min <= max")
        self.inner = inner
        self.min = None if min is None else float(min)
        self.max = None if max is None else float(max)

    def encode(self, tensor: Tensor, state=None, rng=None) -> Msg:
        msg = self.inner.encode(tensor, state, rng=rng)
        return Msg(msg.tensor.clamp(min=self.min, max=self.max), weight=msg.weight, nbits=msg.bits(), to=msg.to)
