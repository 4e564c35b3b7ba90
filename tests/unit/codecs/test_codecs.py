"""Codecs: the receiver's reconstruction and the exact bits, checked against direct formulas, and through the real
loop (a 1-bit upload of d scalars costs exactly d bits per client; broadcasts are charged per recipient)."""
from __future__ import annotations

import math

import pytest
import torch

from fl_lightning.codecs import Dense, ErrorFeedback, LionMomentum, Quantize, ScaledSign, Sign, TopK
from fl_lightning.config.args import checked
from fl_lightning.errors import ConfigError
from fl_lightning.strategies.base import MODEL_KEY, Msg, Part
from tests.helpers.harness import FakeData, LossModule, MLP, build, method_config, mse, regression_batches, run
from tests.helpers.spies import Recorder

V = torch.tensor([[0.5, -2.0, 0.0], [3.0, -0.25, 1.0]])


def test_dense_is_identity_and_counts_element_bits():
    m = Dense().encode(V)
    assert torch.equal(m.tensor, V) and m.nbits == 6 * 32 and m.bits() == 6 * 32
    assert Dense().encode(V.double()).nbits == 6 * 64


def test_sign_one_bit_per_coordinate():
    m = Sign().encode(V)
    assert torch.equal(m.tensor, torch.tensor([[1.0, -1.0, 0.0], [1.0, -1.0, 1.0]]))  # ternary: sign(0) = 0 (no vote)
    assert m.nbits == 6                                                               # ... still 1 bit (002/#15)
    p = Sign(sign_zero="+1").encode(V)
    assert torch.equal(p.tensor, torch.tensor([[1.0, -1.0, 1.0], [1.0, -1.0, 1.0]])) and p.nbits == 6
    s = Sign("l1").encode(V)
    assert torch.allclose(s.tensor, m.tensor * (6.75 / 6)) and s.nbits == 6 + 32


def test_sign_zero_random_draws_from_the_clients_generator():
    v = torch.zeros(4000)
    v[:10] = torch.arange(1, 11.0)
    a = Sign(sign_zero="random").encode(v, rng=torch.Generator().manual_seed(1)).tensor
    b = Sign(sign_zero="random").encode(v, rng=torch.Generator().manual_seed(1)).tensor
    assert torch.equal(a, b) and torch.equal(a[:10], torch.ones(10))
    assert set(a[10:].tolist()) == {-1.0, 1.0} and abs(float(a[10:].mean())) < 0.1  # fair coin
    with pytest.raises(ValueError, match="generator"):
        Sign(sign_zero="random").encode(v)


def test_scaled_sign_is_l1_over_d_per_tensor_plus_32_bits():
    """Karimireddy et al. 2019 Alg. 1: C(v) = (||v||_1 / d) sign(v); spec 002 §4: d bits + 32 per tensor."""
    m = ScaledSign().encode(V)
    torch.testing.assert_close(m.tensor, V.sign() * (V.abs().sum() / 6))
    assert m.nbits == 6 + 32


def test_topk_default_rule_is_one_percent_with_log2_indices():
    """The written-down rule: k = ceil(1% d), bits k (32 + ceil(log2 d)) for fp32."""
    v = torch.randn(1000, generator=torch.Generator().manual_seed(0))
    m = TopK().encode(v)
    assert int((m.tensor != 0).sum()) == 10 and m.nbits == 10 * (32 + 10)


@pytest.mark.parametrize("frac,index_bits,k,bits", [(0.5, 32, 3, 3 * 64), (0.1, 32, 1, 64), (0.5, "log2", 3, 3 * (32 + 3))])
def test_topk_keeps_largest_magnitudes(frac, index_bits, k, bits):
    m = TopK(frac, index_bits).encode(V)
    kept = m.tensor != 0
    assert int(kept.sum()) == k and m.nbits == bits
    assert torch.equal(m.tensor[kept], V[kept])
    assert V[~kept].abs().max() <= V[kept].abs().min()


def test_error_feedback_keeps_the_residual():
    """EF (Karimireddy et al. 2019, Alg. 1): p_t = v_t + e_t, send C(p_t), e_{t+1} = p_t - C(p_t); hand recursion."""
    state: dict = {}
    ef = ErrorFeedback(TopK(1 / 6))
    g = torch.Generator().manual_seed(0)
    e = torch.zeros(2, 3)
    sent_total, v_total = torch.zeros(2, 3), torch.zeros(2, 3)
    for _ in range(5):
        v = torch.randn(2, 3, generator=g)
        p = v + e
        flat = p.reshape(-1)
        i = int(flat.abs().argmax())
        c = torch.zeros(6)
        c[i] = flat[i]
        c = c.view(2, 3)
        e = p - c
        m = ef.encode(v, state)
        torch.testing.assert_close(m.tensor, c)
        torch.testing.assert_close(state["ef"], e)
        sent_total += m.tensor
        v_total += v
    torch.testing.assert_close(sent_total + state["ef"], v_total)  # nothing is lost, only delayed


@pytest.mark.parametrize("bits", [1, 3, 8])
def test_quantize_levels_written_out(bits):
    """b-bit symmetric uniform (grid all_codes): levels -1 + 2j/(2^b - 1) of v / max|v|, the nearest chosen."""
    v = torch.randn(3, 50, generator=torch.Generator().manual_seed(bits))
    s = v.abs().max()
    levels = torch.tensor([-1 + 2 * j / (2 ** bits - 1) for j in range(2 ** bits)])
    nearest = levels[(v.reshape(-1, 1) / s - levels).abs().argmin(dim=1)].view_as(v)
    m = Quantize(bits, scale="none").encode(v)
    torch.testing.assert_close(m.tensor, nearest)
    assert m.nbits == bits * 150
    mm = Quantize(bits, scale="max").encode(v)
    torch.testing.assert_close(mm.tensor, nearest * s)
    assert mm.nbits == bits * 150 + 32
    assert len(torch.unique(m.tensor)) <= 2 ** bits


def test_quantize_one_bit_is_sign_and_zero_grid_has_zero():
    v = torch.tensor([0.3, -2.0, 1e-3, -1e-3, 2.0])
    torch.testing.assert_close(Quantize(1, scale="none").encode(v).tensor, Sign().encode(v).tensor)
    z = Quantize(2, scale="none", grid="zero").encode(v).tensor  # levels -1, 0, 1
    torch.testing.assert_close(z, torch.tensor([0.0, -1.0, 0.0, 0.0, 1.0]))
    assert torch.equal(Quantize(3).encode(torch.zeros(4)).tensor, torch.zeros(4))


def test_lion_momentum_recursion_written_out():
    """Spec 002 Alg. 1 lines 11-12: u = sign(b1 m + (1 - b1) g), then m = b2 m + (1 - b2) g (the old m in u)."""
    b1, b2 = 0.9, 0.99
    codec = LionMomentum(Sign(), b1, b2)
    state: dict = {}
    m = torch.zeros(2, 3)
    gen = torch.Generator().manual_seed(0)
    for _ in range(6):
        g = torch.randn(2, 3, generator=gen)
        out = codec.encode(g, state)
        torch.testing.assert_close(out.tensor, torch.sign(b1 * m + (1 - b1) * g))
        m = b2 * m + (1 - b2) * g
        torch.testing.assert_close(state["lion_m"], m)
        assert out.nbits == 6


@pytest.mark.parametrize("inner,bits", [(Sign(), 6), (ScaledSign(), 6 + 32), (TopK(0.5), 3 * (32 + 3)),
                                        (Quantize(3, scale="none"), 18), (Quantize(8), 48 + 32)])
def test_every_codec_works_under_error_feedback(inner, bits):
    """EF(C): what is sent plus the residual equals everything fed in (nothing lost), bits are C's."""
    ef, state = ErrorFeedback(inner), {}
    gen = torch.Generator().manual_seed(0)
    total, sent = torch.zeros(2, 3), torch.zeros(2, 3)
    for _ in range(4):
        v = torch.randn(2, 3, generator=gen)
        m = ef.encode(v, state, rng=gen)
        assert m.nbits == bits
        total += v
        sent += m.tensor
    torch.testing.assert_close(sent + state["ef"], total)


def test_codec_errors_name_their_argument():
    """Ranges are the annotations' (checked with the config, or by ``checked`` in Python); other rules the
    constructor's."""
    with pytest.raises(ConfigError, match="frac"):
        checked(TopK, 0)
    with pytest.raises(ConfigError, match="scale"):
        Sign("l2")
    with pytest.raises(ConfigError, match="inner"):
        ErrorFeedback("topk")
    with pytest.raises(ConfigError, match="sign_zero"):
        Sign(sign_zero="-1")
    with pytest.raises(ConfigError, match="bits"):
        checked(Quantize, 0)
    with pytest.raises(ConfigError, match="bits"):
        checked(Quantize, 1, grid="zero")
    with pytest.raises(ConfigError, match="beta2"):
        checked(LionMomentum, beta2=1.0)


def test_one_bit_momentum_upload_costs_one_bit_per_coordinate_through_the_loop(tmp_path):
    cfg = method_config("fedmuon", ["+method.parts.momentum.codec._target_=fl_lightning.codecs.Sign"])
    rounds, s = 3, 2
    loop = run(build(cfg), LossModule(MLP(), mse), FakeData(regression_batches(4), 4), tmp_path,
               num_clients=4, per_round=s, rounds=rounds, local_steps=2)
    ps = list(MLP().parameters())
    d_matrices = sum(p.numel() for p in ps if p.ndim >= 2)
    dense_delta = sum(p.numel() * 32 for p in ps)
    assert loop.recorder.totals["uplink_bits"] == rounds * s * (dense_delta + d_matrices)


class Broadcaster(Recorder):
    """Sends one 10-bit message to every client and replaces the model downlink by a 7-bit one."""

    def broadcast(self, round_idx):
        return {f"{self.name}/all": Msg(torch.zeros(4), nbits=10, to="all"), MODEL_KEY: Msg(torch.zeros(1), nbits=7)}


def test_broadcast_recipients_are_each_charged(tmp_path):
    strategy = build(method_config("fedavg"))
    b = Broadcaster()
    b.name = "b"
    strategy.parts.append(b)
    n, s, rounds = 5, 2, 3
    loop = run(strategy, LossModule(MLP(), mse), FakeData(regression_batches(n), n), tmp_path,
               num_clients=n, per_round=s, rounds=rounds, local_steps=1)
    assert loop.recorder.totals["downlink_bits"] == rounds * (10 * n + 7 * s)
    assert math.isclose(loop.recorder.summary()["downlink_mb"], rounds * (10 * n + 7 * s) / 8e6)


def _d(net) -> int:
    return sum(p.numel() for p in net.parameters())


@pytest.mark.parametrize("method,overrides,bits_per_client", [
    ("fedsmu", [], lambda ps: sum(p.numel() for p in ps)),                                   # d bits
    ("fedsmu_mv", [], lambda ps: sum(p.numel() for p in ps)),
    ("fedsmu_3bit", [], lambda ps: 3 * sum(p.numel() for p in ps)),                          # b d
    ("fedsmu_8bit", ["method.quant_scale=max"], lambda ps: sum(8 * p.numel() + 32 for p in ps)),
    ("fedavg", ["+method.parts.aggregation.codec._target_=fl_lightning.codecs.TopK"],          # k (32 + ceil log2 d)
     lambda ps: sum(math.ceil(0.01 * p.numel()) * (32 + max(1, math.ceil(math.log2(p.numel())))) for p in ps)),
    ("fedavg", ["+method.parts.aggregation.codec._target_=fl_lightning.codecs.ScaledSign"],
     lambda ps: sum(p.numel() + 32 for p in ps)),
])
def test_upload_bits_through_the_loop_equal_the_formulas(tmp_path, method, overrides, bits_per_client):
    """Spec 002 §4 through the real loop: a sign upload of a model with d trainable scalars costs exactly d bits per
    client per round; b-bit, top-k and scaled-sign uploads cost their formulas; the downlink stays the dense model."""
    rounds, s = 3, 2
    loop = run(build(method_config(method, overrides)), LossModule(MLP(), mse), FakeData(regression_batches(4), 4),
               tmp_path, num_clients=4, per_round=s, rounds=rounds, local_steps=2)
    ps = list(MLP().parameters())
    assert loop.recorder.totals["uplink_bits"] == rounds * s * bits_per_client(ps)
    assert loop.recorder.totals["downlink_bits"] == rounds * s * 32 * _d(MLP())
    assert loop.recorder.rows[-1]["round_uplink_bits"] == s * bits_per_client(ps)


def test_a_codec_sees_only_its_own_state_under_the_tensors_key():
    """A part hands a codec ``CodecState(client.state, key)``: the codec reads and writes its short names ("ef"),
    stored in the client's state as "<key>/ef" (the names checkpoints hold), and sees no other entry."""
    from fl_lightning.codecs.base import CodecState

    client_state = {"aggregation/w/ef": torch.ones(3), "aggregation/b/ef": torch.zeros(1), "other/c": torch.ones(1)}
    own = CodecState(client_state, "aggregation/w")
    assert dict(own) == {"ef": client_state["aggregation/w/ef"]} and len(own) == 1
    m = ErrorFeedback(Dense()).encode(torch.full((3,), 2.0), own)
    torch.testing.assert_close(m.tensor, torch.full((3,), 3.0))  # v + e, sent whole
    torch.testing.assert_close(client_state["aggregation/w/ef"], torch.zeros(3))  # nothing left over
    assert set(client_state) == {"aggregation/w/ef", "aggregation/b/ef", "other/c"}
    del own["ef"]
    assert "aggregation/w/ef" not in client_state and "ef" not in own
