"""The worked example of docs/extending.md ("Your own strategy part"): examples/fednova, a part and a method yaml kept
outside the package, run through train.py with ``hydra.searchpath`` as a user would and resumed with the command the
run prints. FedNova: Wang, Liu, Liang, Joshi & Poor, NeurIPS 2020, arXiv 2007.07481."""
from __future__ import annotations

import math
import os
import shlex
import subprocess
import sys

import pytest
import torch
from omegaconf import OmegaConf

from tests.helpers.cli import ROOT, build_loop, metric_rows, run_cli, saved_model

EXAMPLE = os.path.join(ROOT, "examples", "fednova")
SEARCH = f"hydra.searchpath=[file://{os.path.join(EXAMPLE, 'conf')}]"
SMALL = ["fl.num_clients=4", "fl.clients_per_round=3", "fl.rounds=2", "fl.local_steps=3", "trainer.progress=false",
         "trainer.accelerator=cpu"]


@pytest.fixture
def fednova(monkeypatch):
    """The example's module, imported as train.py imports it (``PYTHONPATH=examples/fednova``)."""
    monkeypatch.syspath_prepend(EXAMPLE)
    import fednova

    return fednova


# ------------------------------------------------------------------------------------------ the part, toy tensors
def _client(cid, x, local, n, tau, rho=0.0, opt=torch.optim.SGD):
    from fl_lightning.strategies import ClientContext

    p = torch.nn.Parameter(local["w"].clone())
    c = ClientContext(id=cid, round=0, module=None, params={"w": p}, local=local, global_params=x, state={},
                      num_samples=n, num_steps=tau, lr_factor=1.0)
    c.optimizer = opt([p], lr=0.1, momentum=rho) if opt is torch.optim.SGD else opt([p], lr=0.1)
    c.step = tau
    return c


def _server(x):
    from fl_lightning.strategies import ServerContext

    return ServerContext(module=torch.nn.Module(), global_params=x, trainable=["w"], num_clients=3, clients_per_round=3,
                         rounds=1, device=torch.device("cpu"), client_num_samples=[10, 30, 20])


def _round(part, x, locals_, sizes, taus, rho=0.0):
    """One round of ``part`` alone on the given client models: uploads aggregated, server step; returns x."""
    from fl_lightning.strategies import Aggregate

    part.name = "aggregation"
    part.setup(_server(x))
    agg = Aggregate(num_clients=3)
    for i, (loc, n, tau) in enumerate(zip(locals_, sizes, taus)):
        c = _client(i, x, loc, n, tau, rho)
        part.client_start(c)
        agg.add(part.client_end(c))
    metrics = part.server_update(0, agg) or {}
    return x, metrics


def test_two_clients_by_hand(fednova):
    """x = 1; client 1 ran 1 step to 0, client 2 ran 3 steps to 0, equal weights. FedAvg: 0. FedNova: d = (1, 1/3),
    tau_eff = 2, x <- 1 - 2 * (1 + 1/3) / 2 = -1/3 (the client that ran 3 steps counts as much as the other)."""
    x = {"w": torch.ones(1, dtype=torch.float64)}
    locs = [{"w": torch.zeros(1, dtype=torch.float64)} for _ in range(2)]
    x, m = _round(fednova.FedNova(weighting="uniform"), x, locs, [5, 7], [1, 3])
    assert m == {"tau_eff": 2.0}
    assert x["w"].item() == pytest.approx(-1 / 3, abs=1e-7)  # a_i travels as fp32


@pytest.mark.parametrize("rho", [0.0, 0.9])
@pytest.mark.parametrize("weighting", ["num_samples", "uniform"])
def test_one_server_step_against_a_hand_computation(fednova, rho, weighting):
    g = torch.Generator().manual_seed(0)
    f64 = {"generator": g, "dtype": torch.float64}
    x0 = {"w": torch.randn(2, 3, **f64), "bn": torch.randn(3, **f64)}  # bn: a float buffer (not trainable)
    locs = [{k: v + 0.1 * torch.randn(v.shape, **f64) for k, v in x0.items()} for _ in range(3)]
    sizes, taus = [10, 30, 20], [2, 5, 3]
    x, m = _round(fednova.FedNova(weighting=weighting), {k: v.clone() for k, v in x0.items()}, locs, sizes, taus, rho)
    # by hand: a_i = sum over the tau_i steps of the weight heavy-ball momentum puts on each step's gradient
    a = [sum((1 - rho ** (tau - k)) / (1 - rho) for k in range(tau)) for tau in taus]
    w = sizes if weighting == "num_samples" else [1, 1, 1]
    p = [wi / sum(w) for wi in w]
    tau_eff = sum(pi * ai for pi, ai in zip(p, a))
    want_w = x0["w"] - tau_eff * sum(pi * (x0["w"] - loc["w"]) / ai for pi, loc, ai in zip(p, locs, a))
    want_bn = x0["bn"] + sum(pi * (loc["bn"] - x0["bn"]) for pi, loc in zip(p, locs))  # buffers: FedAvg's mean
    assert m["tau_eff"] == pytest.approx(tau_eff, rel=1e-6)
    torch.testing.assert_close(x["w"], want_w, rtol=0, atol=1e-6)
    torch.testing.assert_close(x["bn"], want_bn, rtol=0, atol=1e-12)
    plain = sum(pi * loc["w"] for pi, loc in zip(p, locs))  # FedAvg: unequal a_i must move away from it
    assert (x["w"] - plain).abs().max() > 1e-3


def test_equal_steps_is_modelaverage(fednova):
    """Equal tau_i: FedNova's step is the package's ModelAverage (FedAvg) step on the same client models."""
    from fl_lightning.strategies.parts import ModelAverage

    g = torch.Generator().manual_seed(1)
    x0 = {"w": torch.randn(4, 5, generator=g)}
    locs = [{"w": x0["w"] + torch.randn(4, 5, generator=g)} for _ in range(3)]
    nova, _ = _round(fednova.FedNova(), {"w": x0["w"].clone()}, locs, [10, 30, 20], [4, 4, 4])
    avg, _ = _round(ModelAverage(), {"w": x0["w"].clone()}, locs, [10, 30, 20], [4, 4, 4])
    torch.testing.assert_close(nova["w"], avg["w"], rtol=0, atol=1e-6)


@pytest.mark.parametrize("tau", [1, 4, 7])
@pytest.mark.parametrize("rho", [0.0, 0.5, 0.9])
def test_local_work_is_what_momentum_sgd_does(fednova, tau, rho):
    """tau steps of torch's heavy-ball SGD on a constant gradient g move x by lr * a * g: a is local_work."""
    p = torch.nn.Parameter(torch.zeros(1, dtype=torch.float64))
    opt = torch.optim.SGD([p], lr=0.1, momentum=rho)
    for _ in range(tau):
        p.grad = torch.ones_like(p)
        opt.step()
    assert -p.item() / 0.1 == pytest.approx(fednova.local_work(tau, rho), rel=1e-12)


def test_what_the_part_refuses(fednova):
    from fl_lightning.errors import ConfigError

    with pytest.raises(ConfigError, match="weighting"):
        fednova.FedNova(weighting="size")
    x = {"w": torch.zeros(2)}
    with pytest.raises(ConfigError, match="^config error: optimizer: .*Adam"):
        fednova.FedNova().client_start(_client(0, x, {"w": torch.zeros(2)}, 1, 1, opt=torch.optim.Adam))
    c = _client(0, x, {"w": torch.zeros(2)}, 1, 1, rho=0.9)
    c.optimizer.state[c.params["w"]]["momentum_buffer"] = torch.ones(2)  # carried over: state=persistent
    with pytest.raises(ConfigError, match="method.parts.local_optimizer.state"):
        fednova.FedNova().client_start(c)


def test_the_yamls_comm_is_what_a_run_sends(fednova, tmp_path):
    """fednova.yaml's ``comm:`` (P+4 up: d_i and a_i; P down) against the bits of a run, as tests/system/test_methods.py
    checks every method of the package (and the example's with FL_METHOD_CONF=examples/fednova/conf)."""
    from tests.helpers.comm import measured_and_declared
    from tests.helpers.harness import method_config

    for direction, (measured, declared) in measured_and_declared(method_config("fednova", [SEARCH]), tmp_path).items():
        assert measured == declared, f"{direction}: measured {measured} bits, fednova.yaml declares {declared}"


# ------------------------------------------------------------------------------------------ the CLI's part
def test_searchpath_is_saved_absolute(tmp_path, monkeypatch):
    from fl_lightning.run.run_dir import absolute_searchpath

    monkeypatch.chdir(tmp_path)
    assert absolute_searchpath("hydra.searchpath=[file://my conf,pkg://a.b]") == \
        f"hydra.searchpath=['file://{tmp_path}/my conf',pkg://a.b]"
    assert absolute_searchpath("hydra.searchpath=[file:///abs/conf]") == "hydra.searchpath=[file:///abs/conf]"


def test_resume_command_names_the_pythonpath_of_the_runs_own_code(fednova, monkeypatch):
    from fl_lightning.run.run_dir import resume_command

    cfg = OmegaConf.create({"method": {"parts": {"a": {"_target_": "fednova.FedNova"},
                                                 "b": {"_target_": "fl_lightning.strategies.parts.LocalOptimizer"}}}})
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(["/elsewhere", EXAMPLE, ROOT]))
    d = os.path.abspath("d")  # absolute paths: the command works from any folder
    assert resume_command("d", cfg) == f"PYTHONPATH={shlex.quote(EXAMPLE)} python3 train.py resume={d}"
    del cfg.method.parts["a"]  # the package's parts only (ROOT holds fl_lightning): nothing to add
    assert resume_command("d", cfg) == f"python3 train.py resume={d}"
    monkeypatch.delenv("PYTHONPATH")
    assert resume_command("d", None) == f"python3 train.py resume={d}"


# ------------------------------------------------------------------------------------------ through train.py
def _final(loop) -> dict:
    return {k: v.detach().cpu().clone() for k, v in loop.global_params.items()}


# float64 where a run is compared with another method's: equal up to float order, which in fp32 depends on the CPU
F64 = "trainer.precision=64-true"


def _diff(a: dict, b: dict) -> float:
    """The largest absolute difference of two state dicts."""
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def _run_inprocess(overrides, run_dir):
    loop = build_loop(overrides, run_dir)
    loop.run(None, False)
    return _final(loop)


@pytest.mark.slow
def test_fednova_through_train_py_equals_fedavg_and_resumes_with_the_printed_command(fednova, tmp_path):
    d = tmp_path / "nova"
    user = SMALL + [F64, "hydra.searchpath=[file://examples/fednova/conf]", "method=fednova", "stop_after_rounds=1",
                    f"hydra.run.dir={d}"]
    p = run_cli(user, env={"PYTHONPATH": "examples/fednova"})  # cwd: the repository root, relative paths as typed
    assert p.returncode == 0, p.stderr[-2000:]
    lines = p.stderr.splitlines()
    command = lines[lines.index(next(x for x in lines if x.endswith("Resume with:"))) + 1].strip()
    assert command == f"PYTHONPATH={EXAMPLE} python3 train.py resume={d}"  # absolute, as typed relative
    assert f"hydra.searchpath=[file://{EXAMPLE}/conf]" in OmegaConf.load(d / "overrides.yaml")
    words = shlex.split(command)  # run it as printed: its own PYTHONPATH, nothing inherited
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "HYDRA_FULL_ERROR")}
    env.update(w.split("=", 1) for w in words[:words.index("python3")])
    q = subprocess.run([sys.executable, *words[words.index("python3") + 1:]], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=300)
    assert q.returncode == 0, q.stderr[-2000:]
    resumed = saved_model(d, 2)

    straight = _run_inprocess(SMALL + [F64, SEARCH, "method=fednova"], tmp_path / "straight")
    avg = _run_inprocess(SMALL + [F64, "method=fedavg"], tmp_path / "avg")
    assert resumed.keys() == straight.keys() == avg.keys()
    assert all(v.dtype == torch.float64 for v in resumed.values() if v.is_floating_point())
    for k in resumed:
        assert torch.equal(resumed[k], straight[k]), k  # the resumed run is the run that never stopped
    assert _diff(resumed, avg) <= 1e-12  # equal tau_i = 3: FedAvg (float64: 1e-17 measured; fp32: 3e-8)
    assert any(not torch.equal(resumed[k], torch.zeros_like(resumed[k])) for k in resumed)
    nova_rows, avg_rows = metric_rows(d), metric_rows(tmp_path / "avg")
    assert [float(r["tau_eff"]) for r in nova_rows] == [3.0, 3.0]
    for rn, ra in zip(nova_rows, avg_rows):  # d_i is model-sized, plus a_i as one fp32 per sampled client
        assert int(rn["round_uplink_bits"]) == int(ra["round_uplink_bits"]) + 3 * 32
        assert float(rn["test_acc"]) == pytest.approx(float(ra["test_acc"]), abs=1e-6)


@pytest.mark.slow
def test_unequal_local_steps_make_fednova_differ_from_fedavg(fednova, tmp_path):
    """``fl.local_epochs=1`` with unequal client sizes: client i runs ceil(n_i / 32) steps; tau_eff is their
    data-weighted mean and the global model moves away from FedAvg's."""
    epochs = ["fl.num_clients=4", "fl.clients_per_round=4", "fl.rounds=1", "fl.local_steps=null", "fl.local_epochs=1",
              "trainer.progress=false", "trainer.accelerator=cpu"]
    loop = build_loop(epochs + [SEARCH, "method=fednova"], tmp_path / "nova")
    loop.run(None, False)
    nova = _final(loop)
    sizes = [loop.data.num_samples(i) for i in range(4)]
    steps = [math.ceil(n / 32) for n in sizes]
    assert len(set(steps)) > 1, sizes
    want = sum(n * s for n, s in zip(sizes, steps)) / sum(sizes)
    assert float(metric_rows(tmp_path / "nova")[0]["tau_eff"]) == pytest.approx(want, rel=1e-6)
    avg = _run_inprocess(epochs + ["method=fedavg"], tmp_path / "avg")
    diff = max((nova[k] - avg[k]).abs().max().item() for k in nova)
    assert diff > 1e-3, diff
