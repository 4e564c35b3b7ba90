"""fl_lightning.report on real runs (digits, a few rounds): the table's numbers against the runs' own metrics.csv
computed here by hand, selection on the validation metric, the CSV, and PNGs that decode."""
from __future__ import annotations

import csv
import math
import re
import statistics

import pytest

from fl_lightning.report import ReportError, report
from fl_lightning.report.__main__ import main
from tests.helpers.cli import FAST, cli_in_process
from tests.helpers.report_runs import fake_run, fake_sweep_run

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


# ---------------------------------------------------------------- fake run directories (no training)
@pytest.fixture()
def fakes(tmp_path):
    """Three labels x five seeds: A ends at 1, 2, 4, 3 and one run stopped on a non-finite loss (its summary.json names
    the error, as the trainer writes it); B at 0.5 .. 4.5; C at 1, 2, 3, 100 (finished, above the blow-up 37) and 5."""
    root = tmp_path / "sweep"
    for s, g in enumerate([1.0, 2.0, 4.0, 3.0]):
        fake_run(root / f"a_s{s}", "A", s, [9.0, g, g])
    fake_run(root / "a_s4", "A", 4, [9.0, 7.0], finished=False, error="training loss became nan at round 3, client 1")
    for s, g in enumerate([0.5, 1.5, 2.5, 3.5, 4.5]):
        fake_run(root / f"b_s{s}", "B", s, [8.0, 0.25, g])  # its best (0.25) is not its final
    for s, g in enumerate([1.0, 2.0, 3.0, 100.0, 5.0]):
        fake_run(root / f"c_s{s}", "C", s, [9.0, g, g], error=None)
    return root


def test_quantile_is_linear_between_order_statistics_and_an_infinite_neighbour_wins():
    from fl_lightning.report.table import quantile

    assert quantile([3.0, 1.0, 2.0, 5.0, 4.0], 0.5) == 3.0
    assert quantile([0.5, 1.5, 2.5, 3.5, 4.5], 0.9) == pytest.approx(4.1)  # pos 0.9 * 4 = 3.6: 3.5 + 0.6 * 1
    assert quantile([1.0, 2.0], 0.5) == 1.5
    assert quantile([1.0, 2.0, 3.0, 4.0, math.inf], 0.9) == math.inf
    assert quantile([1.0, 2.0, 3.0, 4.0, math.inf], 0.5) == 3.0
    assert quantile([1.0, math.nan], 0.5) == 1.0 and math.isnan(quantile([], 0.5))


def test_median_and_90th_percentile_with_diverged_runs_as_the_worst(fakes, tmp_path):
    rows = report([str(fakes)], str(tmp_path), by=["label"], stat="median", blowup=37.0, plots=False, name="ht")
    got = {r.group["label"]: r for r in rows}
    assert [r.group["label"] for r in rows] == ["A", "B", "C"] and all(r.n == 5 for r in rows)
    # A: 1, 2, 3, 4 and the diverged run as +inf; B: 0.5 .. 4.5; C: 1, 2, 3, 5 and 100 > 37 as +inf
    assert got["A"].stats["median"][0] == 3.0 and got["A"].stats["p90"][0] == math.inf and got["A"].diverged == 1
    assert got["B"].stats["median"][0] == 2.5 and got["B"].stats["p90"][0] == pytest.approx(4.1)
    assert got["B"].diverged == 0
    assert got["C"].stats["median"][0] == 3.0 and got["C"].stats["p90"][0] == math.inf and got["C"].diverged == 1
    assert "final" not in got["B"].stats and got["B"].stats["uplink_mb"][0] == 3.0  # other columns: mean ± std
    md = (tmp_path / "ht.md").read_text()
    assert "| label | n | median final grad_norm | 90th pct final grad_norm | uplink MB |" in md
    assert "| diverged |" in md and "| B | 5 | 2.5000 | 4.1000 | 3.0 ± 0.0 |" in md and "| 0/5 |" in md
    assert "| A | 5 | 3.0000 | inf |" in md and "| 1/5 |" in md and "ended worse than 37" in md
    with open(tmp_path / "ht.csv") as f:
        table = list(csv.DictReader(f))
    assert table[1]["median"] == "2.5" and float(table[1]["p90"]) == pytest.approx(4.1)
    assert [t["diverged"] for t in table] == ["1", "0", "1"] and "final_mean" not in table[0]


def test_mean_counts_diverged_runs_and_takes_a_minimised_primary_metrics_best_as_its_minimum(fakes, tmp_path):
    rows = report([str(fakes)], str(tmp_path), by=["label"], plots=False)
    got = {r.group["label"]: r for r in rows}
    finals_a = [1.0, 2.0, 4.0, 3.0]  # the mean is over the runs that finished; the diverged one is counted apart
    assert got["A"].stats["final"] == pytest.approx((statistics.fmean(finals_a), statistics.stdev(finals_a)))
    assert got["B"].stats["best"][0] == 0.25 and got["A"].stats["best"][0] == pytest.approx(statistics.fmean(
        finals_a))  # min over rounds: grad_norm's summary says min (the diverged run is left out)
    assert [r.diverged for r in rows] == [1, 0, 0]  # no blow-up value: only the non-finite loss
    md = (tmp_path / "report.md").read_text()
    assert "| diverged |" in md and "| A | 5 |" in md and "stopped on a non-finite loss" in md
    assert "| stopped |" not in md


def test_no_diverged_column_when_every_run_finished(tmp_path):
    for s, g in enumerate([1.0, 2.0]):
        fake_run(tmp_path / "sweep" / f"b_s{s}", "B", s, [g])
    report([str(tmp_path / "sweep")], str(tmp_path / "o"), by=["label"], plots=False)
    assert "diverged" not in (tmp_path / "o" / "report.md").read_text()


def test_a_summary_that_names_an_error_is_a_divergence_one_that_says_unfinished_a_stop(tmp_path):
    fake_run(tmp_path / "s" / "x0", "X", 0, [1.0], finished=False)  # stop_after_rounds: no error
    fake_run(tmp_path / "s" / "x1", "X", 1, [1.0], error="training loss became nan at round 2, client 0")
    fake_run(tmp_path / "s" / "x2", "X", 2, [1.0])
    fake_run(tmp_path / "s" / "x3", "X", 3, [2.0])
    rows = report([str(tmp_path / "s")], str(tmp_path / "o"), by=["label"], stat="median", plots=False)
    assert rows[0].diverged == 1 and rows[0].stopped == 1
    assert rows[0].stats["median"][0] == 2.0  # 1, 2 and the diverged run as +inf; the stopped one left out


def test_a_run_stopped_by_a_signal_is_counted_as_stopped_not_diverged(tmp_path):
    """Issue 65 item 12: a run stopped by SIGTERM and never resumed (metrics.csv, no summary.json) is no divergence
    (the page says that column is a non-finite loss): a ``stopped`` column counts it, and it is left out of the mean,
    the median and the curves; a run whose summary.json names its error stays diverged."""
    for s, g in enumerate([1.0, 2.0, 3.0, 4.0]):
        fake_run(tmp_path / "s" / f"a{s}", "A", s, [9.0, g, g])
    fake_run(tmp_path / "s" / "a4", "A", 4, [9.0, 100.0], summary=False)  # SIGTERM after round 2
    fake_run(tmp_path / "s" / "b0", "B", 0, [9.0, 1.0, 1.0])
    fake_run(tmp_path / "s" / "b1", "B", 1, [9.0], finished=False,
             error="training loss became nan at round 2, client 0")
    rows = report([str(tmp_path / "s")], str(tmp_path / "o"), by=["label"], plots=False)
    got = {r.group["label"]: r for r in rows}
    assert (got["A"].n, got["A"].diverged, got["A"].stopped) == (5, 0, 1)
    assert (got["B"].n, got["B"].diverged, got["B"].stopped) == (2, 1, 0)
    assert got["A"].stats["final"] == pytest.approx((2.5, statistics.stdev([1.0, 2.0, 3.0, 4.0])))
    md = (tmp_path / "o" / "report.md").read_text()
    assert "| label | n | final grad_norm |" in md and "| diverged | stopped |" in md
    assert re.search(r"^\| A \| 5 \| 2\.5000 .*\| 0/5 \| 1/5 \|$", md, re.M), md
    assert re.search(r"^\| B \| 2 \| .*\| 1/2 \| 0/2 \|$", md, re.M), md
    assert "`stopped`: runs that ended before their last round without an error" in md
    with open(tmp_path / "o" / "report.csv") as f:
        table = list(csv.DictReader(f))
    assert [(t["label"], t["diverged"], t["stopped"]) for t in table] == [("A", "0", "1"), ("B", "1", "0")]
    rows = report([str(tmp_path / "s")], str(tmp_path / "m"), by=["label"], stat="median", plots=False)
    assert rows[0].stats["median"][0] == 2.5 and rows[0].stats["p90"][0] == pytest.approx(3.7)  # 1..4, not +inf
    from fl_lightning.report.plots import curve

    assert curve(rows[0], None)[1] == [9.0, 2.5, 2.5]  # rounds 1-3 of the four that finished


def test_paper_ordering_with_a_tier_whose_order_is_not_stated(tmp_path):
    paper = {"source": "somewhere", "ordering": ["B", ["A", "C"]]}
    for lab, gs in (("A", [3.0, 4.0]), ("B", [1.0, 2.0]), ("C", [5.0, 6.0])):
        for s, g in enumerate(gs):
            fake_run(tmp_path / "s" / f"{lab}{s}", lab, s, [g], paper=paper)
    report([str(tmp_path / "s")], str(tmp_path / "o"), by=["label"], stat="median", plots=False)
    md = (tmp_path / "o" / "report.md").read_text()
    # lower grad_norm is better: B 1.5 ± 0.71 lies above A 3.5 ± 0.71 and C 5.5 ± 0.71 (A vs C: not stated)
    assert "- **agrees**: the paper's ordering: expected B > {A, C}; ours (mean ± std final grad_norm): " \
        "B = 1.5000 ± 0.7071, A = 3.5000 ± 0.7071, C = 5.5000 ± 0.7071." in md
    paper["ordering"] = ["A", ["B", "C"]]
    for lab, gs in (("A", [3.0, 3.2]), ("B", [1.0, 1.2]), ("C", [5.0, 5.2])):
        for s, g in enumerate(gs):
            fake_run(tmp_path / "s2" / f"{lab}{s}", lab, s, [g], paper=paper)
    report([str(tmp_path / "s2")], str(tmp_path / "o"), by=["label"], plots=False)
    assert "- **differs**: the paper's ordering: expected A > {B, C}; ours (mean ± std final grad_norm): " \
        "A = 3.1000 ± 0.1414, B = 1.1000 ± 0.1414, C = 5.1000 ± 0.1414 (B above A)." in \
        (tmp_path / "o" / "report.md").read_text()


def test_stat_and_blowup_on_the_command_line_and_the_callback(fakes, tmp_path, capsys):
    from omegaconf import OmegaConf

    from fl_lightning.report.callback import ReportWhenDone

    assert main([str(fakes), "--by", "label", "--stat", "median", "--blowup", "37", "--out", str(tmp_path / "o"),
                 "--no-plots"]) == 0
    assert "3 rows from 15 runs" in capsys.readouterr().out
    md = (tmp_path / "o" / "report.md").read_text()
    assert "--stat median --blowup 37" in md and "| C | 5 | 3.0000 | inf |" in md
    cb = ReportWhenDone(out=str(tmp_path / "cb"), name="ht", by=["label"], stat="median", blowup=37.0, plots=False,
                        publish=True)
    cb.on_multirun_end(OmegaConf.create({"hydra": {"sweep": {"dir": str(fakes)},
                                                   "overrides": {"hydra": [], "task": ["seed=0,1"]}}}))
    assert "| C | 5 | 3.0000 | inf |" in (tmp_path / "cb" / "ht.md").read_text()
    # not published: the page goes into the sweep's own folder, the declared out stays as it was
    ReportWhenDone(out=str(tmp_path / "cb2"), name="ht", by=["label"], plots=False).on_multirun_end(
        OmegaConf.create({"hydra": {"sweep": {"dir": str(fakes)}, "overrides": {"hydra": [], "task": []}}}))
    assert (fakes / "ht.md").exists() and not (tmp_path / "cb2").exists()
    with pytest.raises(ReportError, match="expected mean or median"):
        report([str(fakes)], str(tmp_path / "x"), stat="average")


def test_paper_block_puts_the_papers_numbers_beside_ours_and_checks_its_ordering(tmp_path):
    paper = {"source": "seed 002 (FedSMU), Table 2", "metric": "top-1 test accuracy (%)", "key": "test_acc",
             "unit": "%",
             "cells": [{"method": "fedsmu", "data.partition.alpha": 0.25, "value": 51.79},
                       {"method": "fedavg", "data.partition.alpha": 0.25, "value": 42.29}],
             "ordering": ["fedsmu", ["fedavg", "scaffold"]]}
    final = {("fedsmu", 0.25): 0.6, ("fedavg", 0.25): 0.4, ("scaffold", 0.25): 0.5,   # agrees (fedavg vs scaffold free)
             ("fedsmu", 0.6): 0.3, ("fedavg", 0.6): 0.5, ("scaffold", 0.6): 0.4}       # differs: fedsmu last
    for (method, alpha), acc in final.items():
        for seed in (0, 1):
            fake_sweep_run(tmp_path / "sweep" / f"{method}_{alpha}_{seed}", method, alpha, seed,
                           [0.1, acc + 0.01 * seed], paper)
    rows = report([str(tmp_path / "sweep")], str(tmp_path / "out"), by=["method", "data.partition.alpha"], plots=False)
    assert len(rows) == 6
    md = (tmp_path / "out" / "report.md").read_text()
    assert "Paper: seed 002 (FedSMU), Table 2 (top-1 test accuracy (%))." in md
    assert next(line for line in md.splitlines() if line.startswith("| method")).endswith(
        "| ours: final test_acc (%) | paper (%) |")
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in md.splitlines()
             if line.startswith("| fed") or line.startswith("| scaffold")]
    table = {tuple(c[:2]): c[-2:] for c in cells}  # (method, alpha): [ours in %, the paper's]
    assert table[("fedsmu", "0.25")] == ["60.50 ± 0.71", "51.79"]
    assert table[("fedavg", "0.25")] == ["40.50 ± 0.71", "42.29"]
    assert table[("scaffold", "0.25")] == ["—", "—"] and table[("fedsmu", "0.6")] == ["—", "—"]
    assert "- **agrees**: the paper's ordering at data.partition.alpha = 0.25: expected fedsmu > {fedavg, scaffold}; " \
        "ours (mean ± std final test_acc): fedsmu = 0.6050 ± 0.0071, fedavg = 0.4050 ± 0.0071, " \
        "scaffold = 0.5050 ± 0.0071." in md
    assert "- **differs**: the paper's ordering at data.partition.alpha = 0.6: expected fedsmu > {fedavg, scaffold}; " \
        "ours (mean ± std final test_acc): fedsmu = 0.3050 ± 0.0071, fedavg = 0.5050 ± 0.0071, " \
        "scaffold = 0.4050 ± 0.0071 " \
        "(fedavg above fedsmu)." in md
    assert "no run for" not in md
    with open(tmp_path / "out" / "report.csv") as f:
        got = {(r["method"], r["data.partition.alpha"]): r for r in csv.DictReader(f)}
    assert float(got[("fedsmu", "0.25")]["paper"]) == 51.79 and got[("scaffold", "0.25")]["paper"] == ""
    assert float(got[("fedsmu", "0.25")]["ours"]) == pytest.approx(60.5)
    assert got[("fedsmu", "0.25")]["paper_unit"] == "%"


def test_paper_block_errors_are_one_line():
    from fl_lightning.report.paper import read_paper

    for bad in ({"cells": [{"method": "fedavg"}]}, {"ordering": "fedavg"}, {"ordering": ["fedavg", []]},
                {"cells": [], "table": 2}):
        with pytest.raises(ReportError):
            read_paper(bad)
    assert read_paper({"source": "s", "ordering": ["a", ["b", "c"]]}).ordering == ["a", ["b", "c"]]


def test_runs_that_repeat_a_seed_are_marked_without_a_std_and_dedupe_keeps_the_newest(tmp_path, capsys):
    """Two runs of seed 0 (a run repeated) are no independent draws: the row says so and shows no ± std; with
    ``--dedupe newest`` only the newer one counts (its own number, n = 1)."""
    import os
    import time

    root = tmp_path / "runs"
    fake_run(root / "old", "A", 0, [9.0, 1.0])
    fake_run(root / "new", "A", 0, [9.0, 3.0])
    t = time.time()
    for f in ("metrics.csv", "summary.json"):
        os.utime(root / "old" / f, (t - 100, t - 100))
    rows = report([str(root)], str(tmp_path / "o"), by=["label"], plots=False)
    assert rows[0].repeated_seeds and rows[0].n == 2 and math.isnan(rows[0].stats["final"][1])
    md = (tmp_path / "o" / "report.md").read_text()
    assert "| A | 2 (seeds repeat) | 2.0000 |" in md and "`(seeds repeat)`" in md and "± 1.4142" not in md
    capsys.readouterr()
    assert main([str(root), "--by", "label", "--dedupe", "newest", "--out", str(tmp_path / "d"), "--no-plots"]) == 0
    shown = capsys.readouterr().out  # the table on the terminal too, drawn by rich
    assert re.search(r"│ A +│ 1 +│ 3\.0000 +│", shown) and "| A |" not in shown, shown
    md = (tmp_path / "d" / "report.md").read_text()
    assert "| A | 1 | 3.0000 |" in md and "seeds repeat" not in md
    fake_run(root / "other_seed", "A", 1, [9.0, 5.0])  # distinct seeds: the std is back
    rows = report([str(root)], str(tmp_path / "o2"), by=["label"], plots=False, dedupe="newest")
    assert not rows[0].repeated_seeds and rows[0].stats["final"] == pytest.approx((4.0, math.sqrt(2)))


def test_a_mistyped_option_is_one_line_with_the_closest_and_val_without_a_split_says_how(fakes, capsys):
    with pytest.raises(SystemExit) as e:
        main([str(fakes), "--slect", "val_acc"])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and "fix: did you mean --select?" in err[0], err
    assert main([str(fakes), "--select", "val_acc", "--no-plots"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "data.val_fraction" in err[0] and "closest: test_acc" not in err[0], err


@pytest.mark.parametrize("value", ["maybe", None, 1])
def test_publish_must_be_true_or_false(value, tmp_path, capsys):
    from omegaconf import OmegaConf

    from fl_lightning.report.callback import ReportWhenDone

    cfg = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}, "overrides": {"hydra": [], "task": []}}})
    with pytest.raises(SystemExit) as e:
        ReportWhenDone(out=str(tmp_path / "p"), publish=value).on_multirun_start(cfg)
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and err[0].startswith("error: hydra.callbacks.report.publish:")
