"""The report's declarations in conf/experiment: every ``paper:`` block reads and says what its numbers measure
(``key``, ``unit``) and the setting they hold for (``setting``: the experiment's own values), every claim names values
the page's grid has, and every results page's about text fills from its own config (its placeholders name keys the
composed config has, its filters labels or methods the grid runs)."""
from __future__ import annotations

import functools
import glob
import os

import pytest
import yaml

from fl_lightning.report.about import PLACEHOLDER
from fl_lightning.report.paper import read_paper, same

CONF = os.path.join(os.path.dirname(__file__), "..", "..", "..", "conf")


@functools.lru_cache(maxsize=None)
def _load(path: str) -> dict:
    """A yaml file as plain data (PyYAML's C loader: OmegaConf's parser is slow on the long paper blocks)."""
    with open(path) as f:
        return yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) or {}


PAPERS = sorted(f for f in glob.glob(os.path.join(CONF, "experiment", "**", "*.yaml"), recursive=True)
                if "\npaper:" in open(f).read())
PAGES = sorted(glob.glob(os.path.join(CONF, "experiment", "results", "*.yaml"))) + \
    [os.path.join(CONF, "experiment", "digits_grid.yaml")]


def _name(path: str) -> str:
    return os.path.relpath(path, os.path.join(CONF, "experiment"))[:-5]


def _at(cfg: dict, key: str):
    for part in key.split("."):
        cfg = cfg.get(part) if isinstance(cfg, dict) else None
    return cfg


def _merge(*dicts: dict) -> dict:
    out: dict = {}
    for d in dicts:
        for k, v in d.items():
            out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _method(name: str) -> dict:
    """A method yaml over the method yamls its defaults list names."""
    m = _load(os.path.join(CONF, "method", f"{name}.yaml"))
    return _merge(*[_method(d) for d in m.get("defaults") or [] if isinstance(d, str) and d != "_self_"], m)


def _grid(cfg: dict) -> tuple[dict[str, list[str]], dict[tuple[str, str], tuple[str, dict]]]:
    """The sweep's axes as text values, each arm's label and method name under ``label`` and ``method``; and, per
    (``label`` or ``method``, value), the method yaml those runs use and the keys the arm sets on it."""
    params = _at(cfg, "hydra.sweeper.params") or {}
    grid = {k: [v.strip() for v in str(v).split(",")] for k, v in params.items()}
    runs = {("method", m): (m, {}) for m in grid.get("method", []) if "(" not in m}  # not glob(*)
    for arm in grid.pop("arm", []):
        a = _load(os.path.join(CONF, "arm", f"{arm}.yaml"))
        m = next(d["override /method"] for d in a["defaults"] if isinstance(d, dict) and "override /method" in d)
        grid.setdefault("label", []).append(str(a["label"]))
        grid.setdefault("method", []).append(m)
        runs[("label", str(a["label"]))] = (m, a.get("method") or {})
        runs.setdefault(("method", m), (m, {}))
    return grid, runs


@pytest.mark.parametrize("path", PAPERS, ids=_name)
def test_a_paper_block_says_what_its_numbers_measure_and_its_claims_name_the_grids_values(path):
    cfg = _load(path)
    paper = read_paper(cfg["paper"])
    assert paper.source and paper.metric and paper.key and "unit" in cfg["paper"], \
        f"{_name(path)}: a paper block gives source, metric, key and unit"
    assert paper.unit != "%" or paper.key.endswith("acc"), f"{_name(path)}: a percentage of {paper.key}"
    by = _at(cfg, "hydra.callbacks.report.by") or ["method"]
    grid, _ = _grid(cfg)
    for claim in paper.claims + ([{"order": paper.ordering}] if paper.ordering else []):
        named = [claim["converges"]] if "converges" in claim else \
            [v for t in claim.get("order", [claim.get("better"), claim.get("worse")])
             for v in (t if isinstance(t, list) else [t])]
        if by[0] in grid:  # a fixed first key (a method set by the experiment) has no axis to check against
            assert all(any(same(v, g) for g in grid[by[0]]) for v in named), f"{_name(path)}: {named} vs {grid[by[0]]}"
        for k, v in (claim.get("where") or {}).items():
            assert k in by[1:] and any(same(v, g) for g in grid.get(k, [v])), f"{_name(path)}: where {k} = {v}"


TABLES = sorted(_name(f) for f in glob.glob(os.path.join(CONF, "experiment", "*.yaml")))  # the papers' settings
GROUP_KEYS = {"data": "data.name", "model": "model.name", "data/partition": "data.partition.name"}


@functools.lru_cache(maxsize=None)
def _composed(name: str):
    from hydra import compose, initialize_config_dir

    from fl_lightning.config.schema import register

    register()
    with initialize_config_dir(config_dir=os.path.abspath(CONF), version_base="1.3"):
        return compose("config", overrides=[f"experiment={name}"], return_hydra_config=True)


@pytest.mark.parametrize("name", TABLES)
def test_a_paper_blocks_setting_is_its_experiments_own_and_no_axis_of_its_table(name):
    """Issue 47: the ``setting`` a paper's numbers hold for names keys of the composed config at the experiment's own
    values (the sweep's one value where its grid sets the key), never a key the table varies (a swept key, a ``by``
    key, a cell key); an experiment writing into another's sweep folder carries the same block (one page)."""
    from omegaconf import OmegaConf

    cfg = _composed(name)
    if cfg.get("paper") is None:
        return
    paper = read_paper(cfg.paper, cfg)  # every key is a config key
    assert {"data.name", "model.name"} & set(paper.setting), f"{name}: a setting without the data or the model"
    params = {GROUP_KEYS.get(k, k): str(v) for k, v in (OmegaConf.select(cfg, "hydra.sweeper.params") or {}).items()}
    axes = {GROUP_KEYS.get(b, b) for b in OmegaConf.select(cfg, "hydra.callbacks.report.by") or ["method"]} | \
        {k for c in paper.cells for k in c if k != "value"}
    for k, v in paper.setting.items():
        assert k not in axes and "," not in params.get(k, ""), f"{name}: setting {k} is an axis of the table"
        ours = yaml.safe_load(params[k]) if k in params else OmegaConf.select(cfg, k)
        assert same(ours, v), f"{name}: setting {k}: {v}, the experiment runs {ours}"
    folder = os.path.basename(str(OmegaConf.select(cfg, "hydra.sweep.dir")))
    if folder != name and folder in TABLES:
        assert cfg.paper == _composed(folder).paper, f"{name}: not the block of {folder}, whose folder it writes into"


def test_the_papers_claims_under_test():
    """Seed 001 Table 1 (FedPAC-X above Local-X for Muon, SOAP, Sophia at both lrs) and seed 000 §7.2 (the best T
    per setting, T = 1 above T = 0), as the results pages state them."""
    pac = read_paper(_load(os.path.join(CONF, "experiment", "results", "fedpac_small_scale.yaml"))["paper"])
    pairs = {(c["better"], c["worse"]) for c in pac.claims}
    assert {("FedPAC-Muon", "Local Muon"), ("FedPAC-SOAP", "Local SOAP"),
            ("FedPAC-Sophia (lr 3e-4)", "Local Sophia (lr 3e-4)"),
            ("FedPAC-Sophia (lr 3e-3)", "Local Sophia (lr 3e-3)")} <= pairs
    ns = read_paper(_load(os.path.join(CONF, "experiment", "results", "fedmuon_ns_steps.yaml"))["paper"])
    assert not ns.ordering  # no one order holds at both alphas
    assert [(c.get("order"), c.get("where")) for c in ns.claims[:2]] == \
        [([2, [0, 1, 4]], {"data.partition.alpha": 0.1}), ([4, [0, 1, 2]], {"data.partition.alpha": 10})]
    assert (ns.claims[2]["better"], ns.claims[2]["worse"]) == (1, 0) and "where" not in ns.claims[2]


def test_the_pages_that_choose_an_lr_choose_it_on_a_validation_split():
    for name in ("fedsmu_small_scale", "seed003_comparison", "fedsmu_lr_grid", "seed003_lr_grid",
                 "fedpac_sophia_lr_grid"):
        cfg = _load(os.path.join(CONF, "experiment", "results", f"{name}.yaml"))
        assert cfg["data"]["val_fraction"] > 0 and _at(cfg, "hydra.callbacks.report.select") == "val_acc", name
    for path in PAGES:  # and no page selects on anything but a validation metric
        select = _at(_load(path), "hydra.callbacks.report.select")
        assert select is None or str(select).startswith("val_"), f"{_name(path)} selects on {select}"


@pytest.mark.parametrize("path", PAGES, ids=_name)
def test_a_pages_about_text_fills_from_its_config(path):
    from hydra import compose, initialize_config_dir

    from fl_lightning.report.about import fill
    from fl_lightning.report.runs import Run
    from fl_lightning.config.schema import register

    raw = _load(path)
    about = str(_at(raw, "hydra.callbacks.report.about"))
    places = PLACEHOLDER.findall(about)
    assert places, f"{_name(path)}: its about text takes nothing from the runs"
    grid, methods = _grid(raw)
    for key, other, want in places:  # a filter's runs: a method of the grid, or an arm's label; its method has key
        if other:
            assert other in ("label", "method") and want in grid.get(other, []), f"{_name(path)}: | {other}={want}"
            if key.startswith("method."):
                method, arm = methods[(other, want)]
                assert _at(_merge(_method(method), arm), key[len("method."):]) is not None, \
                    f"{_name(path)}: {{{{{key} | {other}={want}}}}}"
    register()
    arm = str(_at(raw, "hydra.sweeper.params").get("arm", "")).split(",")[0]
    with initialize_config_dir(config_dir=os.path.abspath(CONF), version_base="1.3"):
        cfg = compose("config", overrides=[f"experiment={_name(path)}", "run_dir=x"] + ([f"arm={arm}"] if arm else []))
    run = Run("x", cfg, [])
    unfiltered = PLACEHOLDER.sub(lambda m: "" if m.group(2) and m.group(1).startswith("method.") else
                                 "{{" + m.group(1) + "}}", about)  # a filtered method key: checked above
    text = fill(unfiltered, [run])
    assert "{{" not in text and "}}" not in text
