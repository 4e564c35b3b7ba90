"""User-level DP (fl_lightning/dp/, conf/dp/) end to end on digits, each against an independent computation: the
reductions (z = 0, C = ∞ is dp=none with uniform weights; z = 0 with a finite C is clipping by hand, a part written
here), the noise's std in the model itself (chi-square), the paths (cohort, resume, two processes) against the
sequential uninterrupted run, Poisson's empty rounds, the privacy budget's stop and resume, and the CLI's lines."""
from __future__ import annotations

import logging
import math
import os

import pytest
import torch
from scipy.stats import chi2

from fl_lightning.messages import Msg
from fl_lightning.strategies.base import Part
from tests.helpers.cli import build_loop, cli_in_process, metric_rows, one_line_error, run_cli, saved_model

slow = pytest.mark.slow
BASE = ["fl.num_clients=8", "fl.clients_per_round=4", "fl.local_steps=2", "trainer.progress=false",
        "trainer.accelerator=cpu", "trainer.threads=1", "trainer.precision=64-true", "data.partition.alpha=0.5"]
OFF = ["dp=central", "dp.noise_multiplier=0", "dp.clip=inf"]  # the mechanism with nothing to do


def _params(overrides, path, rounds=2):
    loop = build_loop(BASE + overrides, path)
    rows = [loop.run_round(r) for r in range(rounds)]
    return {k: v.detach().clone() for k, v in loop.global_params.items()}, rows, loop


def test_no_noise_no_clip_is_dp_none_with_uniform_weights(tmp_path):
    ov = ["method=fedavg", "method.parts.aggregation.weighting=uniform"]
    ref, _, _ = _params(ov, tmp_path / "none")
    got, rows, loop = _params(ov + OFF, tmp_path / "dp")
    assert [p.name for p in loop.strategy.parts][-2:] == ["dp_clip", "dp_noise"]
    assert all(torch.equal(ref[k], got[k]) for k in ref)  # bit for bit: the same sums over the same weights
    assert "dp_epsilon" not in rows[-1]  # z = 0: no privacy, no ε


@slow
def test_no_noise_no_clip_is_dp_none_for_every_method_dp_accepts(tmp_path):
    """Every method config whose codecs DP accepts (found by its codecs, conf/method/ listed), on a small MLP (~0.6 s a
    method): z = 0, C = ∞ under fixed sampling is the method with uniform weights, bit for bit."""
    from fl_lightning.dp.mechanism import refused_codec
    from fl_lightning.strategies import build_strategy
    from tests.helpers.cli import CONF, make_cfg

    small = ["fl.num_clients=4", "fl.clients_per_round=2", "model=mlp", "model.net.hidden=[16]"]
    accepted, differ = [], []
    for m in sorted(f[:-5] for f in os.listdir(os.path.join(CONF, "method")) if f.endswith(".yaml")):
        cfg = make_cfg([f"method={m}"], tmp_path)
        if refused_codec(build_strategy(cfg.method)):
            continue
        accepted.append(m)
        ov = [f"method={m}", *small]
        if "weighting" in (cfg.method.parts.get("aggregation") or {}):
            ov.append("method.parts.aggregation.weighting=uniform")
        if "ns_dtype" in cfg.method:
            ov.append("method.ns_dtype=null")
        ref, _, _ = _params(ov, tmp_path / f"{m}_none")
        got, _, _ = _params(ov + OFF, tmp_path / f"{m}_dp")
        if not all(torch.equal(ref[k], got[k]) for k in ref):
            differ.append(m)
    assert len(accepted) >= 35 and not differ, differ


class HandClip(Part):
    """Clipping by hand, for the reduction test: the whole upload's norm as math.fsum of Python floats, each message
    scaled by min(1, C/‖u‖), weight 1."""

    def __init__(self, clip: float):
        self.clip = clip

    def upload(self, client, msgs):
        norm = math.sqrt(math.fsum(float(v) ** 2 for m in msgs.values() for v in m.tensor.reshape(-1).tolist()))
        f = min(1.0, self.clip / norm)
        return {k: Msg(m.tensor * f, 1.0, nbits=m.nbits) for k, m in msgs.items()}


def test_no_noise_with_a_clip_is_clipping_by_hand(tmp_path):
    clip = 0.05  # below most clients' update norms
    hand = ["method.parts.aggregation.weighting=uniform",
            f"+method.parts.hand={{_target_: tests.system.test_dp.HandClip, clip: {clip}}}"]
    ref, _, _ = _params(hand, tmp_path / "hand")
    got, _, _ = _params(["dp=central", "dp.noise_multiplier=0", f"dp.clip={clip}"], tmp_path / "dp")
    base, _, _ = _params(["method.parts.aggregation.weighting=uniform"], tmp_path / "none")
    assert max(float((ref[k] - base[k]).abs().max()) for k in ref) > 1e-4  # the clip does something here
    for k in ref:
        assert torch.allclose(got[k], ref[k], rtol=0, atol=1e-12 * float(ref[k].abs().max())), k


def test_noise_in_the_model_has_std_z_clip_over_clients(tmp_path):
    """One round of FedAvg with z = 1.1, C = 0.3 against the same round with z = 0: the model differs by the noise
    over the expected clients, N(0, (zC/S)²) in each of its 53k values (chi-square, at a fixed seed)."""
    z, clip, s = 1.1, 0.3, 4
    quiet, _, _ = _params(["dp=central", "dp.noise_multiplier=0", f"dp.clip={clip}"], tmp_path / "z0", rounds=1)
    noisy, _, _ = _params(["dp=central", f"dp.noise_multiplier={z}", f"dp.clip={clip}"], tmp_path / "z", rounds=1)
    dev = torch.cat([((noisy[k] - quiet[k]) * s / (z * clip)).reshape(-1) for k in quiet])
    stat, df = float(dev.square().sum()), dev.numel()
    assert df > 50_000 and 0.001 < chi2.cdf(stat, df) < 0.999, (stat / df)


ADAPTIVE = ["dp=central_adaptive", "dp.noise_multiplier=0.8", "dp.count_noise=0.5", "fl.sampling=poisson",
            "method=fedmuon", "method.ns_dtype=null"]


@slow
def test_cohort_equals_the_sequential_clients(tmp_path):
    seq, rows, loop = _params(ADAPTIVE, tmp_path / "seq", rounds=3)
    coh, crows, cloop = _params(ADAPTIVE + ["trainer.cohort=3"], tmp_path / "coh", rounds=3)
    assert cloop.cohort is not None
    assert max(float((seq[k] - coh[k]).abs().max() / seq[k].abs().max()) for k in seq) <= 1e-12
    assert [r["dp_clip"] for r in rows] == pytest.approx([r["dp_clip"] for r in crows], rel=1e-12)
    assert rows[-1]["dp_clip"] != rows[0]["dp_clip"]  # the clip adapted


def test_resume_equals_the_uninterrupted_run(tmp_path):
    args = BASE + ADAPTIVE[:4] + ["fl.rounds=3"]
    one, two = tmp_path / "one", tmp_path / "two"
    assert cli_in_process(args + [f"hydra.run.dir={one}"], one)[0] == 0
    assert cli_in_process(args + [f"hydra.run.dir={two}", "stop_after_rounds=1"], two)[0] == 0
    assert cli_in_process(args + [f"hydra.run.dir={two}", f"resume={two}"], two)[0] == 0
    a, b = saved_model(one, 3), saved_model(two, 3)
    assert all(torch.equal(a[k], b[k]) for k in a)  # the same noise, the same adapted clip, the same accounting
    assert metric_rows(one) == metric_rows(two)


@slow
def test_two_processes_equal_one(tmp_path):
    """fl.sampling=poisson and the adaptive clip on two processes sharing the device (trainer.processes_per_device=2,
    gloo): the noise and the clip are drawn the same on both, and the model is the one-process model (float64)."""
    args = BASE + ADAPTIVE[:4] + ["fl.rounds=2"]
    one, two = tmp_path / "one", tmp_path / "two"
    p1 = run_cli(args + [f"hydra.run.dir={one}"])
    p2 = run_cli(args + [f"hydra.run.dir={two}", "trainer.processes_per_device=2"])
    assert p1.returncode == 0 and p2.returncode == 0, (p1.stderr[-2000:], p2.stderr[-2000:])
    assert "Starting with 2 processes" in p2.stderr + p2.stdout
    a, b = saved_model(one, 2), saved_model(two, 2)
    assert max(float((a[k] - b[k]).abs().max() / a[k].abs().max()) for k in a) <= 1e-12


def test_poisson_empty_rounds(tmp_path, caplog):
    """q = 1/8 over 8 clients: rounds 0 and 2 of seed 0 sample nobody. Without DP they change nothing; with DP the
    noise is still released once the upload's layout is known."""
    from fl_lightning import seeding

    ov = ["fl.sampling=poisson", "fl.clients_per_round=1"]
    empty = [r for r in range(12) if not seeding.round_clients(0, r, 8, 1, "poisson")]
    assert empty and empty[-1] > 0
    loop = build_loop(BASE + ov, tmp_path / "none")
    loop_dp = build_loop(BASE + ov + ["dp=central", "dp.noise_multiplier=1", "dp.clip=1"], tmp_path / "dp")
    caplog.set_level(logging.INFO, logger="fl_lightning")
    seen = False  # an upload came before: the layout is known
    for r in range(empty[-1] + 1):
        before = {k: v.clone() for k, v in loop.global_params.items()}
        before_dp = {k: v.clone() for k, v in loop_dp.global_params.items()}
        row, row_dp = loop.run_round(r), loop_dp.run_round(r)
        if r in empty:
            assert row["round_clients"] == 0 and "train_loss" not in row
            assert all(torch.equal(before[k], loop.global_params[k]) for k in before)
            moved = any(not torch.equal(before_dp[k], loop_dp.global_params[k]) for k in before_dp)
            assert moved == seen and "dp_epsilon" in row_dp
        seen = seen or r not in empty
    assert seen and "no client sampled" in caplog.text


def test_max_epsilon_stops_before_passing_it_and_resumes(tmp_path, caplog):
    from fl_lightning.dp import accountant as A

    caplog.set_level(logging.INFO, logger="fl_lightning")
    z = 2.0
    eps2 = A.epsilon(z, 2, 8 ** -1.1, 8, 4, "fixed")
    args = BASE + ["dp=central", f"dp.noise_multiplier={z}", "fl.rounds=4"]
    full, part = tmp_path / "full", tmp_path / "part"
    assert cli_in_process(args + [f"hydra.run.dir={full}"], full)[0] == 0
    code, err = cli_in_process(args + [f"hydra.run.dir={part}", f"dp.max_epsilon={eps2 * 1.0001}"], part)
    assert code == 0 and "stopped after round 2 (dp.max_epsilon)" in err, err[-1500:]
    assert "the run stops after round 2 (resume with dp.max_epsilon=" in caplog.text
    code, err = cli_in_process(args + [f"hydra.run.dir={part}", f"resume={part}", f"dp.max_epsilon={eps2 * 1.0001}"], part)
    one_line_error((code, err), "dp.max_epsilon", "or more")
    assert cli_in_process(args + [f"hydra.run.dir={part}", f"resume={part}", "dp.max_epsilon=100"], part)[0] == 0
    a, b = saved_model(full, 4), saved_model(part, 4)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_bad_inputs_are_one_line(tmp_path):
    one_line_error(cli_in_process(["dp=central", "dp.clip=0", "dp.noise_multiplier=1"], tmp_path), "dp.clip")
    one_line_error(cli_in_process(BASE + ["dp=central", "dp.noise_multiplier=1", "method=fedsmu",
                                          f"hydra.run.dir={tmp_path / 'r'}"], tmp_path / "r"), "LionMomentum(Sign) codec", "method=fedavg")


@slow
def test_the_documented_command_prints_epsilon(tmp_path):
    """python3 train.py dp=central dp.target_epsilon=8 on the default task, shrunk to 2 rounds."""
    p = run_cli(["dp=central", "dp.target_epsilon=8", "fl.rounds=2", f"hydra.run.dir={tmp_path}"])
    assert p.returncode == 0, p.stderr[-2000:]
    assert "calibrated for ε=8" in p.stderr and "ε" in p.stdout + p.stderr
    rows = metric_rows(tmp_path)
    eps = [float(r["dp_epsilon"]) for r in rows]
    assert eps == sorted(eps) and 7.9 <= eps[-1] <= 8.0
    import json

    assert json.load(open(os.path.join(tmp_path, "summary.json")))["final_dp_epsilon"] == pytest.approx(eps[-1])
