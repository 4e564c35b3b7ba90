"""Invariants every method yaml must keep, parametrized over conf/method/*.yaml (a new method is covered the day its
yaml lands) and the method/*.yaml of the conf folder ``$FL_METHOD_CONF`` names (your own methods, docs/extending.md):
it composes into a Strategy, it lowers the loss of a small heterogeneous problem, it resumes bit-exactly, and it
reports the communication its yaml declares (``comm``)."""
from __future__ import annotations

import glob
import os

import pytest
import torch

from tests.helpers.cli import CONF
from tests.helpers.comm import config, measured_and_declared, own_methods
from tests.helpers.cover import cases
from tests.helpers.harness import FakeData, LossModule, MLP, build, make_loop, mse, params_of, regression_batches, run

METHODS = sorted(os.path.basename(f)[:-5] for f in glob.glob(os.path.join(CONF, "method", "*.yaml"))) + own_methods()
EXPERIMENTS = sorted(os.path.relpath(f, os.path.join(CONF, "experiment"))[:-5]  # results/<name> too
                     for f in glob.glob(os.path.join(CONF, "experiment", "**", "*.yaml"), recursive=True))

# the yaml lrs are tuned for the digits CNN; this tiny MLP regression wants larger steps for some of them
LEARN_LR = {"local_muon": ["method.lr=0.05"], "fedmuon_bc": ["method.lr=0.05"], "scaffold_adam": ["method.lr=0.01"],
            "fedavg_adam": ["method.lr=0.01"], "local_adamw": ["method.lr=0.01"], "local_soap": ["method.lr=0.01"],
            "local_sophia": ["method.lr=0.01"],
            "fedpac_soap": ["method.lr=0.01"], "fedpac_sophia": ["method.lr=0.01"],
            "fedpac_soap_light": ["method.lr=0.01"], "fedpac_sophia_light": ["method.lr=0.01"],
            "fedpac_soap_align_only": ["method.lr=0.01"], "fedpac_soap_correct_only": ["method.lr=0.01"],
            "fedpm": ["method.lr=0.01"], "fed_sophia": ["method.lr=0.01"],
            # FedAvg-M's 0.9 momentum across rounds overshoots within these 8 rounds (it is an EMA per ROUND)
            "fedavgm": ["method.global_momentum=0.5"], "scaffold_m": ["method.beta=0.5"],
            # sign / b-bit uploads move each coordinate by at most gamma1 per round (0.015 in the yaml)
            "fedsmu_3bit": ["method.gamma1=0.05"], "fedsmu_8bit": ["method.gamma1=0.05"],
            "fedsmum": ["method.gamma1=0.05"], "fedsmumc": ["method.gamma1=0.05"],
            "fed_globallion": ["method.gamma1=0.05"], "fedlion": ["method.lr=0.02"]}


def test_every_method_is_covered():
    assert {"fedavg", "fedmuon_bc", "fedmuon_avg", "fedmuon", "scaffold"} <= set(METHODS)


@pytest.mark.parametrize("name", cases(METHODS))  # fast subset: the cover (tests/helpers/cover.py)
def test_method_composes_and_learns(tmp_path, name):
    """The yaml builds a Strategy that lowers the loss of a small heterogeneous regression."""
    cfg = config(name, LEARN_LR.get(name, []))
    assert cfg.method.name == name
    n = 4
    data = FakeData(regression_batches(n), n)
    module = LossModule(MLP(), mse)
    with torch.no_grad():
        before = float(mse(module.net, data.test_batch))
    loop = run(build(cfg), module, data, tmp_path, num_clients=n, per_round=2, rounds=8, local_steps=5)
    after = loop.evaluate()["test_loss"]
    assert after < 0.8 * before, f"{name}: loss {before:.3f} -> {after:.3f}"


@pytest.mark.parametrize("name", cases(METHODS))
def test_resume_is_exact(tmp_path, name):
    """DESIGN invariant 2 for every part's state: R rounds in one go == R/2, checkpoint, a fresh loop (other initial
    weights) resumed from it, R/2 more; bit-identical."""
    _resume_exact(tmp_path, name)


@pytest.mark.parametrize("name", ["local_soap", "local_sophia"])
def test_resume_is_exact_with_persistent_second_order_state(tmp_path, name):
    """SOAP's L, R, Q, M, V and Sophia's m, h kept per client across rounds (state: persistent) survive the
    checkpoint exactly (issue 11: save, load, the next steps equal an uninterrupted run)."""
    often = {"local_soap": "method.precondition_frequency=2", "local_sophia": "method.parts.hessian.every=3"}
    _resume_exact(tmp_path, name, ["method.parts.local_optimizer.state=persistent", often[name]])


def _resume_exact(tmp_path, name, overrides=()):
    def cfg():
        return config(name, list(overrides))

    n, rounds = 4, 4
    data = FakeData(regression_batches(n), n)
    kw = dict(num_clients=n, per_round=2, rounds=rounds, local_steps=2)
    full = run(build(cfg()), LossModule(MLP(), mse), data, tmp_path / "full", **kw)

    first = make_loop(build(cfg()), LossModule(MLP(), mse), data, tmp_path / "half", **kw)
    first.setup()
    first.run(stop_after_rounds=rounds // 2, progress_enabled=False)
    second = make_loop(build(cfg()), LossModule(MLP(seed=5), mse), data, tmp_path / "half2", **kw)
    second.setup(resume=str(tmp_path / "half"))
    assert second.round == rounds // 2
    second.run(progress_enabled=False)
    a, b = params_of(full), params_of(second)
    for key in a:
        assert torch.equal(a[key], b[key]), key
    assert full.recorder.totals == second.recorder.totals


@pytest.mark.parametrize("name", METHODS)
def test_bytes_are_what_the_yaml_declares(tmp_path, name):
    cfg = config(name)
    assert "comm" in cfg.method, f"method {name} declares no comm: uplink/downlink"
    for direction, (measured, declared_bits) in measured_and_declared(cfg, tmp_path).items():
        assert measured == declared_bits, f"{name}: a run sent {measured} {direction} bits, comm declares {declared_bits}"


@pytest.mark.parametrize("name,overrides", [
    ("fedmuon_bc", ["method.correct_1d=false"]),
    ("fedmuon_svd", ["method.svd_mode=storage_frac", "method.svd_frac=0.5"]),
    ("fedmuon_svd", ["method.svd_mode=rank_frac", "method.svd_frac=0.4"]),
    ("fedmuon_svd", ["method.svd_mode=rank_frac", "method.svd_frac=1.0"]),
    ("fedpac_soap_light", ["method.svd_frac=0.6"]),
    ("fedpac_sophia_light", ["method.svd_frac=0.6"]),
])
def test_bytes_follow_the_options(tmp_path, name, overrides):
    measured, declared_bits = measured_and_declared(config(name, overrides), tmp_path)["uplink"]
    assert measured == declared_bits


@pytest.mark.slow  # every experiment composed (~50 s); the fast subset composes the methods
@pytest.mark.parametrize("exp", EXPERIMENTS)
def test_experiment_configs_compose(exp):
    from hydra import compose, initialize_config_dir

    from fl_lightning.config.schema import register

    from omegaconf import OmegaConf

    register()  # the schema node 'fl_lightning' (other tests register it too; -k experiment runs only these)
    grid = OmegaConf.select(OmegaConf.load(os.path.join(CONF, "experiment", f"{exp}.yaml")), "hydra.sweeper.params")
    arms = str(grid.get("arm")).split(",") if grid is not None and grid.get("arm") else [None]  # a study: every arm
    for arm in arms:
        with initialize_config_dir(config_dir=CONF, version_base="1.3"):
            cfg = compose("config", overrides=[f"experiment={exp}"] + ([f"arm={arm}"] if arm else []))
        build(cfg)
        assert cfg.fl.num_clients >= cfg.fl.clients_per_round
        assert arm is None or cfg.label, f"{exp}: arm {arm} sets no label (the report's row name)"
    _check_paper_block(exp, cfg)


def _method_names():
    from omegaconf import OmegaConf

    return {OmegaConf.load(f).get("name") for f in glob.glob(os.path.join(CONF, "method", "*.yaml"))}


def _check_paper_block(exp, cfg):
    """An experiment's ``paper:`` block (docs/reproduction.md): it reads, each cell's ``method`` (and each ordered value
    of a ``method``-keyed report) names a method config, and its other keys select a value in the composed config, so
    that the cell can match a report row. A cell of another partition (an ``_iid`` sibling writing into the same sweep
    folder: ``data.partition.name: iid`` beside ``data.partition.alpha`` cells) is checked against that partition only."""
    from omegaconf import OmegaConf

    from fl_lightning.report.paper import read_paper

    if cfg.get("paper") is None:
        return
    paper = read_paper(cfg.paper)
    assert paper.source and paper.metric, f"{exp}: paper.source and paper.metric say where the numbers come from"
    assert paper.cells or paper.ordering or paper.claims, f"{exp}: a paper block without cells, an ordering or claims"
    methods = _method_names()
    partition = cfg.data.partition
    for cell in paper.cells:
        assert "method" not in cell or cell["method"] in methods, f"{exp}: {cell['method']} is no method config's name"
        if cell.get("data.partition.name", partition.name) != partition.name:
            continue  # the sibling config's column (same sweep folder)
        if "data.partition.alpha" in cell and "alpha" not in partition:
            continue  # a Dirichlet column seen from the _iid sibling
        for key in cell:
            if key not in ("value", "method", "label"):
                assert OmegaConf.select(cfg, key) is not None, f"{exp}: cell key {key} selects nothing ({cell})"
    if not paper.ordering:
        return
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        by = OmegaConf.select(compose("config", overrides=[f"experiment={exp}"], return_hydra_config=True),
                              "hydra.callbacks.report.by")
    assert by, f"{exp}: an ordering needs the report callback's by (its first key is what the ordering ranks)"
    if by[0] == "method":
        flat = [v for t in paper.ordering for v in (t if isinstance(t, list) else [t])]
        assert set(flat) <= methods, f"{exp}: ordering names {set(flat) - methods}, not method configs"
