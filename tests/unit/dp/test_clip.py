"""DPClip (fl_lightning/dp/clip.py): the whole upload's norm is at most C (float64, exact), an upload under C is
unchanged bit for bit, every travelling message weighs 1, messages that do not travel are left alone."""
from __future__ import annotations

import math

import torch

from fl_lightning.dp.clip import COUNT_KEY, DPClip, clip_upload
from fl_lightning.messages import Msg


def _upload(scale: float, dtype=torch.float64, seed: int = 0) -> dict[str, Msg]:
    g = torch.Generator().manual_seed(seed)
    shapes = {"aggregation/conv.weight": (8, 1, 3, 3), "aggregation/fc.bias": (10,), "momentum/m/conv.weight": (8, 9)}
    return {k: Msg(scale * torch.randn(s, generator=g, dtype=torch.float64).to(dtype), weight=37.0)
            for k, s in shapes.items()}


def _norm(msgs, keys) -> float:
    """The whole upload's norm, by hand: math.fsum of the squares of every value, each as a Python float."""
    return math.sqrt(math.fsum(float(v) ** 2 for k in keys for v in msgs[k].tensor.double().reshape(-1)))


def test_whole_upload_norm_at_most_clip_exactly():
    for dtype in (torch.float64, torch.float32):
        for seed in range(20):
            for clip in (1e-3, 0.5, 3.0):
                msgs = _upload(10.0, dtype, seed)
                out, before = clip_upload(msgs, clip)
                assert before == _norm(msgs, msgs) or math.isclose(before, _norm(msgs, msgs), rel_tol=1e-14)
                after = _norm(out, msgs)
                assert after <= clip, (dtype, seed, clip, after)
                assert after >= clip * (1 - 2e-6)  # scaled onto the ball's surface, not inside it
                for k, m in out.items():  # one common factor: the direction is kept
                    assert m.weight == 1.0 and m.tensor.dtype == dtype
                    r = (m.tensor.double() / msgs[k].tensor.double())
                    assert torch.allclose(r, r.reshape(-1)[0].expand_as(r), rtol=1e-6 if dtype == torch.float32 else 1e-14)


def test_under_clip_unchanged_bit_for_bit():
    msgs = _upload(1e-3)
    out, before = clip_upload(msgs, 1.0)
    assert before < 1.0
    for k, m in msgs.items():
        assert torch.equal(out[k].tensor, m.tensor) and out[k].tensor.data_ptr() == m.tensor.data_ptr()
        assert out[k].weight == 1.0
    out, _ = clip_upload(_upload(10.0), math.inf)  # C = ∞: nothing clipped
    assert all(torch.equal(out[k].tensor, m.tensor) for k, m in _upload(10.0).items())


def test_free_messages_are_not_clipped_and_keep_their_weight():
    msgs = _upload(10.0)
    msgs["drift/sq"] = Msg(torch.tensor(1e6, dtype=torch.float64), weight=3.0, nbits=0)
    out, before = clip_upload(msgs, 1.0)
    assert out["drift/sq"] is msgs["drift/sq"]
    assert before == _norm(msgs, [k for k in msgs if k != "drift/sq"]) or math.isclose(
        before, _norm(msgs, [k for k in msgs if k != "drift/sq"]), rel_tol=1e-14)


class _Noise:
    def __init__(self, clip):
        self.clip, self.free = clip, set()

    def current_clip(self):
        return self.clip

    def note_free(self, keys):
        self.free.update(keys)


def test_adaptive_clip_sends_the_centred_bit():
    part = DPClip(_Noise(1.0), adaptive=True)
    big = part.upload(None, _upload(10.0))
    small = part.upload(None, _upload(1e-4))
    assert float(big[COUNT_KEY].tensor) == -0.5 and float(small[COUNT_KEY].tensor) == 0.5
    assert big[COUNT_KEY].bits() == 1
