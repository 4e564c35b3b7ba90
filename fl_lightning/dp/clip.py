"""DPClip: the client-side step of user-level DP, on the client's WHOLE upload (every part's Msgs, after their codecs).

DP-FedAvg's clip (McMahan, Ramage, Talwar & Zhang, "Learning Differentially Private Recurrent Language Models", ICLR
2018, arXiv:1710.06963, Alg. 1 ``ClipFn``): the upload u_i, all tensors it sends together as one vector, becomes
u_i · min(1, C/‖u_i‖₂), so one client moves the round's sum by at most C (add/remove) or 2C (replace-one). A method
that uploads optimizer state (momenta, preconditioner statistics, control variates) is clipped on all of it: its
sensitivity is that of the whole upload. Every clipped message weighs 1 (a sample-count weight would publish the
client's size); the noise part divides the noised sum by the expected number of clients.

A message that does not travel (``nbits=0``: a logged diagnostic) is neither clipped nor noised: it is not part of
what the mechanism releases, and the metrics computed from it are not private (the line at start names them).

With ``dp=central_adaptive`` the clip also uploads one bit, b_i − ½ with b_i = 1[‖u_i‖ ≤ C] (Andrew, Thakkar, McMahan
& Ramaswamy, "Differentially Private Learning with Adaptive Clipping", NeurIPS 2021, arXiv:1905.03871, Alg. 1; the
centred bit has sensitivity ½), noised by the noise part with its own std σ_b.
"""
from __future__ import annotations

import torch

from ..messages import Msg
from ..strategies.base import ClientContext, Part

COUNT_KEY = "dp_clip/below"  # the adaptive clip's bit: b_i − ½


def travelling(msgs: dict[str, Msg]) -> list[str]:
    """The keys of the messages that travel (``nbits`` not 0) and hold floats: what the clip bounds."""
    return [k for k, m in msgs.items() if m.nbits != 0 and m.tensor.is_floating_point()]


def upload_norm(msgs: dict[str, Msg], keys: list[str] | None = None) -> float:
    """‖u‖₂ over the given (default: travelling) messages together, summed in float64."""
    keys = travelling(msgs) if keys is None else keys
    if not keys:
        return 0.0
    norms = torch._foreach_norm([msgs[k].tensor.detach() for k in keys], 2, dtype=torch.float64)  # one op, no fp64 copy
    return float(torch.linalg.vector_norm(torch.stack(norms)))


def clip_factor(norm: float, clip: float, dtypes) -> float | None:
    """The scale that brings an upload of norm ``norm`` within ``clip`` (None: it is within already, unchanged bit for
    bit). C/‖u‖ shrunk by 8 ulps of the widest rounding among ``dtypes``, so the rounded result's norm, summed in
    float64, stays at most C."""
    if norm <= clip:
        return None
    eps = max(torch.finfo(d).eps for d in dtypes)
    return clip / norm * (1.0 - 8.0 * eps)


def clip_upload(msgs: dict[str, Msg], clip: float) -> tuple[dict[str, Msg], float]:
    """``(msgs with every travelling message scaled to a whole norm ≤ clip and weight 1, the norm before)``."""
    keys = travelling(msgs)
    norm = upload_norm(msgs, keys)
    factor = clip_factor(norm, clip, {msgs[k].tensor.dtype for k in keys})
    out = dict(msgs)
    scaled = [msgs[k].tensor for k in keys] if factor is None else torch._foreach_mul([msgs[k].tensor for k in keys], factor)
    for k, t in zip(keys, scaled):
        m = msgs[k]
        out[k] = Msg(t, 1.0, nbits=m.nbits, to=m.to)
    return out, norm


class DPClip(Part):
    """Clips the client's whole upload to the current C (read from the noise part: fixed, or adapted each round)."""

    def __init__(self, noise: Part, adaptive: bool = False):
        self.noise, self.adaptive = noise, adaptive

    def upload(self, client: ClientContext, msgs: dict[str, Msg]) -> dict[str, Msg]:
        clip = self.noise.current_clip()
        sent = set(travelling(msgs))
        self.noise.note_free(k for k in msgs if k not in sent)
        out, norm = clip_upload(msgs, clip)
        if self.adaptive:
            b = 1.0 if norm <= clip else 0.0
            dev = next(iter(msgs.values())).tensor.device if msgs else "cpu"
            out[COUNT_KEY] = Msg(torch.tensor(b - 0.5, dtype=torch.float64, device=dev), 1.0, nbits=1)
        return out
