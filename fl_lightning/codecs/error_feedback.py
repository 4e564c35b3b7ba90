"""ErrorFeedback: compress ``v + e`` and keep what was lost, ``e ← v + e − C(v + e)``, in the client's state
(Seide et al. 2014; Karimireddy et al., ICML 2019, arXiv 1901.09847, Alg. 1 "EF-SGD"; Stich et al. 2018).

Wraps any codec (``inner``): ``ErrorFeedback(TopK(0.01))`` is FedEF-TopK, ``ErrorFeedback(ScaledSign())`` is
EF-SignSGD's compressor (FedEF-Sign: FedEF-SGD, Alg. 3 of the FedSMU paper, anonymous, under review, App. H). The
residual is the codec's own state ``"ef"`` (the client's persistent ``"<key>/ef"``, so it is checkpointed and
resumed with the client), starting at zero; it never travels.
"""
from __future__ import annotations

from torch import Tensor

from .base import check_codec
from ..messages import Msg


class ErrorFeedback:
    def __init__(self, inner):
        check_codec(inner, "inner", "fl_lightning.codecs.TopK")
        self.inner = inner

    RESIDUAL = "ef"  # its entry in the codec's state

    def encode(self, tensor: Tensor, state=None, rng=None) -> Msg:
        if state is None:
            raise ValueError("ErrorFeedback needs the client's state to keep its residual")
        v = tensor.detach()
        e = state.get(self.RESIDUAL)
        corrected = v + e.to(v.dtype) if e is not None else v.clone()
        msg = self.inner.encode(corrected, state, rng=rng)
        state[self.RESIDUAL] = (corrected - msg.tensor).detach()
        return msg
