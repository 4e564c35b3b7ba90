"""A real Hydra multirun from a grid declared in an experiment config (2 methods x 2 seeds x 2 rounds on digits),
its job folders named by their overrides, and the report on it: the table's numbers against the runs' own
metrics.csv, and PNGs that decode."""
from __future__ import annotations

import importlib

import csv
import statistics

import pytest

from tests.helpers.cli import run_cli

pytestmark = pytest.mark.slow


def test_a_grid_in_config_runs_as_named_jobs_and_reports(tmp_path):
    sweep = tmp_path / "sweep"
    p = run_cli(["-m", "experiment=digits_grid", "method.lr=0.05", "seed=0,1", "fl.rounds=2", "fl.num_clients=6",
                 "fl.clients_per_round=3", "fl.local_steps=3", "trainer.progress=false", "trainer.accelerator=cpu",
                 f"hydra.sweep.dir={sweep}", f"hydra.callbacks.report.out={tmp_path / 'page'}"], timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    jobs = sorted(d.name for d in sweep.iterdir() if d.is_dir())
    common = ["fl.clients_per_round=3", "fl.local_steps=3", "fl.num_clients=6",
              "fl.rounds=2", "method.lr=0.05", "trainer.accelerator=cpu"]  # Hydra sorts them by key
    want = [",".join(sorted(common + [f"method={m}", f"seed={s}"])) for m in ("fedavg", "fedavgm") for s in (0, 1)]
    assert jobs == sorted(want), jobs  # trainer.progress and the experiment, excluded from the names, are not there
    # the experiment's callback wrote its page when the sweep ended, into the sweep's own folder (not published: the
    # declared out stays untouched): the command at the top, the runs' numbers
    assert not (tmp_path / "page").exists()
    assert "hydra.callbacks.report.publish=true" in p.stdout
    page = (sweep / "digits_grid.md").read_text()
    assert page.startswith("# ") and "    python train.py -m " in page and "experiment=digits_grid" in page
    assert f"python -m fl_lightning.report {sweep} --declared" in page
    assert (sweep / "digits_grid_test_acc_vs_round.png").exists()
    from fl_lightning.report import report

    out = tmp_path / "report"
    rows = report([str(sweep)], str(out), select="val_acc")
    assert [(r.group["method"], r.n) for r in rows] == [("fedavg", 2), ("fedavgm", 2)]
    for r in rows:
        finals = []
        for d in sweep.iterdir():
            if d.is_dir() and f"method={r.group['method']}," in d.name:
                with open(d / "metrics.csv") as f:
                    finals.append(float(list(csv.DictReader(f))[-1]["test_acc"]))
        assert r.stats["final"] == pytest.approx((statistics.fmean(finals), statistics.stdev(finals)), abs=1e-12)
    md = (out / "report.md").read_text()
    assert "| fedavg |" in md and "| fedavgm |" in md
    for r in rows:  # the page has the same rows (written from the same runs)
        assert f"| {r.group['method']} | 0.05 | 2 | " in page or f"| {r.group['method']} | 2 | " in page
    from fl_lightning.report.__main__ import main

    (sweep / "digits_grid.md").unlink()
    assert main([str(sweep), "--declared"]) == 0  # the page again, as the sweep declared it (its own folder)
    assert (sweep / "digits_grid.md").read_text() == page and not (tmp_path / "page").exists()
    import matplotlib.image as mpimg

    for png in ("test_acc_vs_round.png", "test_acc_vs_uplink.png"):
        assert mpimg.imread(out / png).shape[:2] == (450, 800)


@pytest.mark.parametrize("change,key", [(["fl.rounds=2"], "fl.rounds"), (["seed=0,1"], "seed"),
                                        (["data/partition=iid"], "data.partition"),
                                        (["hydra.sweeper.params.seed=0"], "hydra.sweeper.params.seed")])
def test_publishing_a_changed_experiment_is_refused_before_any_job(change, key, tmp_path):
    """A published page holds the experiment as declared: with publish=true, a command line that changes a result
    key stops in one line naming it, exit 2, and no job runs (nothing under the sweep folder, the page untouched)."""
    sweep, page = tmp_path / "sweep", tmp_path / "page"
    p = run_cli(["-m", "experiment=digits_grid", *change, "trainer.accelerator=cpu", "trainer.progress=false",
                 f"hydra.sweep.dir={sweep}", f"hydra.callbacks.report.out={page}",
                 "hydra.callbacks.report.publish=true"], timeout=300)
    lines = [x for x in p.stderr.strip().splitlines() if x.strip()]
    assert p.returncode == 2 and len(lines) == 1, p.stderr[-2000:]
    assert lines[0].startswith("error: hydra.callbacks.report.publish:") and f"changes {key}," in lines[0], lines[0]
    assert "fix:" in lines[0] and not page.exists()
    assert not sweep.exists() or not [d for d in sweep.iterdir() if d.is_dir() and d.name != ".hydra"]


def test_parallel_local_jobs_with_the_joblib_launcher(tmp_path):
    importlib.import_module("hydra_plugins.hydra_joblib_launcher")  # the dev extra installs it: missing fails, never skips
    sweep = tmp_path / "sweep"
    p = run_cli(["-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "method=fedavg,fedavgm", "fl.rounds=2",
                 "fl.num_clients=6", "fl.clients_per_round=3", "fl.local_steps=3", "trainer.progress=false",
                 f"hydra.sweep.dir={sweep}"], timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "Joblib.Parallel(n_jobs=2" in p.stdout + p.stderr
    for m in ("fedavg", "fedavgm"):
        d = sweep / f"fl.clients_per_round=3,fl.local_steps=3,fl.num_clients=6,fl.rounds=2,method={m}"
        assert (d / "summary.json").exists() and len((d / "metrics.csv").read_text().splitlines()) == 3


def test_an_optuna_search_scores_each_trial_by_its_objective(tmp_path):
    """experiment=digits_lr_search: train.py returns each trial's final val_acc (``objective``) to Optuna, whose best
    value is the best of the trials' own metrics.csv."""
    importlib.import_module("hydra_plugins.hydra_optuna_sweeper")  # the dev and sweep extras install it: missing fails
    sweep = tmp_path / "sweep"
    p = run_cli(["-m", "experiment=digits_lr_search", "hydra.sweeper.n_trials=3", "hydra.sweeper.n_jobs=1",
                 "fl.rounds=2", "fl.num_clients=6", "fl.clients_per_round=3", "fl.local_steps=3",
                 "trainer.progress=false", f"hydra.sweep.dir={sweep}"], timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    from omegaconf import OmegaConf

    vals = {}
    for d in sweep.iterdir():
        if (d / "metrics.csv").exists():
            with open(d / "metrics.csv") as f:
                vals[d.name] = float(list(csv.DictReader(f))[-1]["val_acc"])
    assert len(vals) == 3
    best = OmegaConf.load(sweep / "optimization_results.yaml")
    assert best.best_value == pytest.approx(max(vals.values()), abs=1e-12)
    assert 0.005 <= best.best_params["method.lr"] <= 0.5


def test_a_diverged_job_leaves_its_error_and_the_sweep_goes_on(tmp_path):
    sweep = tmp_path / "sweep"
    p = run_cli(["-m", "method.lr=1e5,0.05", "fl.rounds=2", "fl.num_clients=6", "fl.clients_per_round=3",
                 "fl.local_steps=3", "trainer.progress=false", f"hydra.sweep.dir={sweep}"], timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    assert [ln for ln in p.stderr.splitlines() if ln.startswith("error:")] == [
        next(ln for ln in p.stderr.splitlines() if "training loss became nan at round 1" in ln)]
    import json

    done = {d.name.rsplit("=", 1)[1]: json.loads((d / "summary.json").read_text()) for d in sweep.iterdir() if d.is_dir()}
    assert done["0.05"]["finished"] and "error" not in done["0.05"]  # the job after the diverged one ran
    assert not done["100000.0"]["finished"] and "method.lr" in done["100000.0"]["error"]


def test_two_runs_started_together_share_an_empty_cache(tmp_path):
    """``experiment=glue_lora data=pydoc_topics`` twice at the same moment, as a joblib sweep or a Slurm array starts
    its jobs, on an empty FL_CACHE_DIR: one builds the tokenizer and the backbone, the other waits for them
    (fl_lightning/data/cache.py); both finish, with the same backbone and no .tmp left."""
    import os
    import subprocess
    import sys

    from tests.helpers.cli import ROOT

    cache = tmp_path / "cache"
    env = {**os.environ, "FL_CACHE_DIR": str(cache)}
    env.pop("HYDRA_FULL_ERROR", None)
    procs = [subprocess.Popen([sys.executable, os.path.join(ROOT, "train.py"), "experiment=glue_lora",
                               "data=pydoc_topics", "method=fedavg", "fl.rounds=1", "fl.clients_per_round=1",
                               "fl.local_steps=2", "data.pretrain.steps=20", "trainer.progress=false",
                               f"hydra.run.dir={tmp_path / f'run{i}'}"], cwd=ROOT, env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for i in range(2)]
    for p in procs:
        out, err = p.communicate(timeout=900)
        assert p.returncode == 0, err[-3000:]
    assert all((tmp_path / f"run{i}" / "summary.json").exists() for i in range(2))
    backbones = [d for d in (cache / "pydoc_topics").glob("*/roberta-mlm-*") if not d.name.endswith(".tmp")]
    assert len(backbones) == 1 and not list(cache.rglob("*.tmp"))
