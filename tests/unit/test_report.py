"""fl_lightning.report on real runs (digits, a few rounds): the table's numbers against the runs' own metrics.csv
computed here by hand, selection on the validation metric, the CSV, and PNGs that decode."""
from __future__ import annotations

import csv
import math
import statistics

import pytest

from fl_lightning.report import ReportError, report
from fl_lightning.report.__main__ import main
from tests.helpers.cli import FAST, cli_in_process

BASE = FAST + ["fl.rounds=3", "data.val_fraction=0.2"]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    root = tmp_path_factory.mktemp("sweep")
    for method in ("fedavg", "fedavgm"):
        for lr in ("0.05", "0.3"):
            for seed in (0, 1):
                d = _dir(root, method, lr, seed)
                code, err = cli_in_process(BASE + [f"method={method}", f"method.lr={lr}", f"seed={seed}",
                                                   f"hydra.run.dir={d}"], d)
                assert code == 0, err
    return root


def _dir(root, method, lr, seed):
    return root / f"{method}_lr{lr}_s{seed}"


def _column(run_dir, name):
    with open(run_dir / "metrics.csv") as f:
        return [float(r[name]) for r in csv.DictReader(f) if r[name] not in ("", "nan")]


def test_each_setting_is_a_row_with_mean_and_std_over_seeds(sweep, tmp_path):
    rows = report([str(sweep)], str(tmp_path), target=0.15)
    assert [(r.group["method"], r.setting["method.lr"], r.n) for r in rows] == \
        [("fedavg", 0.05, 2), ("fedavg", 0.3, 2), ("fedavgm", 0.05, 2), ("fedavgm", 0.3, 2)]
    for r in rows:
        dirs = [_dir(sweep, r.group["method"], r.setting["method.lr"], s) for s in (0, 1)]
        finals = [_column(d, "test_acc")[-1] for d in dirs]
        bests = [max(_column(d, "test_acc")) for d in dirs]
        up = [_column(d, "uplink_mb")[-1] for d in dirs]
        assert r.stats["final"] == pytest.approx((statistics.fmean(finals), statistics.stdev(finals)), abs=1e-12)
        assert r.stats["best"] == pytest.approx((statistics.fmean(bests), statistics.stdev(bests)), abs=1e-12)
        assert r.stats["uplink_mb"][0] == pytest.approx(statistics.fmean(up))
        hits = [next((i + 1 for i, v in enumerate(_column(d, "test_acc")) if v >= 0.15), math.nan) for d in dirs]
        want = [h for h in hits if not math.isnan(h)]
        got = r.stats["rounds_to_target"][0]
        assert (math.isnan(got) and not want) or got == pytest.approx(statistics.fmean(want))
    md = (tmp_path / "report.md").read_text()
    assert md.count("\n| fedavg |") == 2 and "method.lr" in md and "rounds to 0.15" in md
    with open(tmp_path / "report.csv") as f:
        table = list(csv.DictReader(f))
    assert float(table[0]["final_mean"]) == rows[0].stats["final"][0]  # unrounded
    import matplotlib.image as mpimg

    for name in ("test_acc_vs_round.png", "test_acc_vs_uplink.png"):
        img = mpimg.imread(tmp_path / name)
        assert img.shape[:2] == (450, 800) and img.std() > 0.01  # decodes, 800 px wide, not blank


def test_select_keeps_the_best_validation_setting_and_reports_its_test_metric(sweep, tmp_path):
    rows = report([str(sweep)], str(tmp_path), select="val_acc", plots=False)
    assert [r.group["method"] for r in rows] == ["fedavg", "fedavgm"]
    for r in rows:
        score = {}
        for lr in ("0.05", "0.3"):
            dirs = [_dir(sweep, r.group["method"], lr, s) for s in (0, 1)]
            score[float(lr)] = statistics.fmean(_column(d, "val_acc")[-1] for d in dirs)
        best = max(score, key=score.get)
        assert r.setting == {"method.lr": best} and r.candidates == 2
        dirs = [_dir(sweep, r.group["method"], best, s) for s in (0, 1)]
        assert r.stats["final"][0] == pytest.approx(statistics.fmean(_column(d, "test_acc")[-1] for d in dirs))
    assert "val_acc (selection)" in (tmp_path / "report.md").read_text()


def test_the_command_line(sweep, tmp_path, capsys):
    assert main([str(sweep), "--by", "method", "method.lr", "--out", str(tmp_path / "o"), "--no-plots"]) == 0
    assert "4 rows from 8 runs" in capsys.readouterr().out
    assert main([str(tmp_path / "nothing_here")]) == 2
    assert "is not a directory" in capsys.readouterr().err
    with pytest.raises(ReportError, match="no run"):
        report([str(tmp_path / "o")], str(tmp_path / "p"))


def _fake_run(path, method, alpha, seed, accs, paper):
    """A run directory as the trainer writes it (config.yaml, metrics.csv, summary.json), without training."""
    import json

    from omegaconf import OmegaConf

    path.mkdir(parents=True)
    OmegaConf.save(OmegaConf.create({"seed": seed, "method": {"name": method, "lr": 0.1},
                                     "data": {"name": "digits", "partition": {"name": "dirichlet", "alpha": alpha}},
                                     "paper": paper}), path / "config.yaml")
    with open(path / "metrics.csv", "w") as f:
        f.write("round,test_acc\n" + "".join(f"{i + 1},{a}\n" for i, a in enumerate(accs)))
    (path / "summary.json").write_text(json.dumps({"primary_metric": "test_acc", "primary_mode": "max"}))


def test_paper_block_puts_the_papers_numbers_beside_ours_and_checks_its_ordering(tmp_path):
    paper = {"source": "seed 002 (FedSMU), Table 2", "metric": "top-1 test accuracy (%)",
             "cells": [{"method": "fedsmu", "data.partition.alpha": 0.25, "value": 51.79},
                       {"method": "fedavg", "data.partition.alpha": 0.25, "value": 42.29}],
             "ordering": ["fedsmu", ["fedavg", "scaffold"]]}
    final = {("fedsmu", 0.25): 0.6, ("fedavg", 0.25): 0.4, ("scaffold", 0.25): 0.5,   # agrees (fedavg vs scaffold free)
             ("fedsmu", 0.6): 0.3, ("fedavg", 0.6): 0.5, ("scaffold", 0.6): 0.4}       # differs: fedsmu last
    for (method, alpha), acc in final.items():
        for seed in (0, 1):
            _fake_run(tmp_path / "sweep" / f"{method}_{alpha}_{seed}", method, alpha, seed, [0.1, acc], paper)
    rows = report([str(tmp_path / "sweep")], str(tmp_path / "out"), by=["method", "data.partition.alpha"], plots=False)
    assert len(rows) == 6
    md = (tmp_path / "out" / "report.md").read_text()
    assert "Paper: seed 002 (FedSMU), Table 2 (top-1 test accuracy (%))." in md
    assert next(line for line in md.splitlines() if line.startswith("| method")).endswith("| paper: top-1 test accuracy (%) |")
    table = {tuple(c.strip() for c in line.strip("|").split("|")[:2]): line.strip("|").split("|")[-1].strip()
             for line in md.splitlines() if line.startswith("| fed") or line.startswith("| scaffold")}
    assert table[("fedsmu", "0.25")] == "51.79" and table[("fedavg", "0.25")] == "42.29"
    assert table[("scaffold", "0.25")] == "—" and table[("fedsmu", "0.6")] == "—"
    assert "The paper's ordering (best first; {...}: not ordered within): fedsmu > {fedavg, scaffold}." in md
    assert "Ours at data.partition.alpha = 0.25 (mean final test_acc): fedsmu > scaffold > fedavg: agrees." in md
    assert "Ours at data.partition.alpha = 0.6 (mean final test_acc): fedavg > scaffold > fedsmu: differs." in md
    with open(tmp_path / "out" / "report.csv") as f:
        papers = {(r["method"], r["data.partition.alpha"]): r["paper"] for r in csv.DictReader(f)}
    assert float(papers[("fedsmu", "0.25")]) == 51.79 and papers[("scaffold", "0.25")] == ""


def test_paper_block_errors_are_one_line():
    from fl_lightning.report.paper import read_paper

    for bad in ({"cells": [{"method": "fedavg"}]}, {"ordering": "fedavg"}, {"ordering": ["fedavg", []]},
                {"cells": [], "table": 2}):
        with pytest.raises(ReportError):
            read_paper(bad)
    assert read_paper({"source": "s", "ordering": ["a", ["b", "c"]]}).ordering == ["a", ["b", "c"]]
