"""fl_lightning.report on fabricated run directories (no training): each row beside its own run's paper block in any
order of the directories, the paper's unit and metric, option names no run has, the claims' verdicts, and the about
text's placeholders."""
from __future__ import annotations

import csv
import re

import pytest

from fl_lightning.report import ReportError, report
from fl_lightning.report.__main__ import main
from fl_lightning.report.paper import read_paper
from tests.helpers.report_runs import fake_run, fake_sweep_run

PCT = {"metric": "top-1 test accuracy (%)", "key": "test_acc", "unit": "%"}


def _table(md: str) -> list[list[str]]:
    """The markdown table's rows (header first), cells stripped."""
    return [[c.strip() for c in line.strip().strip("|").split("|")] for line in md.splitlines()
            if line.startswith("| ") and not line.startswith("|---")]


def _two_sweeps(root):
    """Seed 001 Table 1's shape: the same methods and alpha on CIFAR-100 and Tiny-ImageNet, each sweep with its own
    paper block (cells keyed by method and alpha only)."""
    blocks = {"cifar100": {"source": "Table 1: CIFAR-100", **PCT,
                           "cells": [{"method": "fedavg", "data.partition.alpha": 0.1, "value": 60.17},
                                     {"method": "fedpac_muon", "data.partition.alpha": 0.1, "value": 71.85}]},
              "tiny_imagenet": {"source": "Table 1: Tiny-ImageNet", **PCT,
                                "cells": [{"method": "fedavg", "data.partition.alpha": 0.1, "value": 41.2},
                                          {"method": "fedpac_muon", "data.partition.alpha": 0.1, "value": 49.9}]}}
    acc = {("cifar100", "fedavg"): 0.55, ("cifar100", "fedpac_muon"): 0.65,
           ("tiny_imagenet", "fedavg"): 0.35, ("tiny_imagenet", "fedpac_muon"): 0.45}
    for (data, method), a in acc.items():
        for seed in (0, 1):
            fake_sweep_run(root / data / f"{method}_{seed}", method, 0.1, seed, [0.1, a + 0.01 * seed], blocks[data],
                           data=data)
    return root / "cifar100", root / "tiny_imagenet"


def test_each_row_is_beside_its_own_runs_paper_whatever_the_order_of_the_directories(tmp_path):
    a, b = _two_sweeps(tmp_path / "s")
    by = ["method", "data.partition.alpha"]
    report([str(a), str(b)], str(tmp_path / "ab"), by=by, plots=False)
    report([str(b), str(a)], str(tmp_path / "ba"), by=by, plots=False)
    md = (tmp_path / "ab" / "report.md").read_text()
    assert md == (tmp_path / "ba" / "report.md").read_text()
    assert (tmp_path / "ab" / "report.csv").read_text() == (tmp_path / "ba" / "report.csv").read_text()
    head, *rows = _table(md)
    assert head == ["method", "data.partition.alpha", "data", "n", "final test_acc", "best test_acc", "uplink MB",
                    "downlink MB", "wall s", "ours: final test_acc (%)", "paper (%)", "source"]
    got = {(r[0], r[2]): (r[-3], r[-2], r[-1]) for r in rows}
    assert got == {("fedavg", "cifar100"): ("55.50 ± 0.71", "60.17", "[1]"),
                   ("fedpac_muon", "cifar100"): ("65.50 ± 0.71", "71.85", "[1]"),
                   ("fedavg", "tiny_imagenet"): ("35.50 ± 0.71", "41.2", "[2]"),
                   ("fedpac_muon", "tiny_imagenet"): ("45.50 ± 0.71", "49.9", "[2]")}
    assert "The papers (the `source` column):\n\n1. Table 1: CIFAR-100 (top-1 test accuracy (%)); compared with " \
        "`test_acc` in %.\n2. Table 1: Tiny-ImageNet (top-1 test accuracy (%)); compared with `test_acc` in %.\n" in md
    with open(tmp_path / "ab" / "report.csv") as f:
        table = {(r["method"], r["data"]): r for r in csv.DictReader(f)}
    row = table[("fedavg", "tiny_imagenet")]
    assert (row["paper"], row["paper_source"]) == ("41.2", "2") and float(row["ours"]) == pytest.approx(35.5)


def test_runs_of_one_data_set_with_two_paper_blocks_never_share_a_row(tmp_path):
    for i, value in enumerate((60.0, 70.0)):
        paper = {"source": f"table {i}", **PCT, "cells": [{"method": "fedavg", "value": value}]}
        for seed in (0, 1):
            fake_sweep_run(tmp_path / f"s{i}" / f"r{seed}", "fedavg", 0.1, seed, [0.5 + i / 10], paper)
    rows = report([str(tmp_path / "s0"), str(tmp_path / "s1")], str(tmp_path / "o"), plots=False)
    assert [(r.n, r.source, r.stats["final"][0]) for r in rows] == [(2, 1, 0.5), (2, 2, 0.6)]
    assert [r[-3:] for r in _table((tmp_path / "o" / "report.md").read_text())[1:]] == \
        [["50.00 ± 0.00", "60", "[1]"], ["60.00 ± 0.00", "70", "[2]"]]


def test_a_row_whose_runs_the_paper_tells_apart_is_refused(tmp_path):
    paper = {"source": "s", **PCT, "cells": [{"method": "fedavg", "label": "A", "value": 50.0}]}
    for seed, label in ((0, "A"), (1, "B")):  # --by method puts both labels in one row; the cell picks one
        fake_sweep_run(tmp_path / "s" / label, "fedavg", 0.1, seed, [0.5], paper, extra={"label": label})
    with pytest.raises(ReportError, match="^report: the row method = fedavg mixes runs that the paper cell "
                       "method = fedavg, label = A tells apart; "
                       "fix: add those keys to --by$"):
        report([str(tmp_path / "s")], str(tmp_path / "o"), plots=False)


def test_units_a_fraction_stays_a_fraction_and_a_percentage_of_a_non_fraction_is_said(tmp_path):
    paper = {"source": "s", "metric": "accuracy as a fraction", "key": "test_acc", "unit": "fraction",
             "cells": [{"method": "fedavg", "value": 0.52}]}
    for seed in (0, 1):
        fake_sweep_run(tmp_path / "a" / f"r{seed}", "fedavg", 0.1, seed, [0.5 + seed / 10], paper)
    report([str(tmp_path / "a")], str(tmp_path / "o"), plots=False)
    md = (tmp_path / "o" / "report.md").read_text()
    assert _table(md)[1][-2:] == ["0.5500 ± 0.0707", "0.52"]
    assert "| ours: final test_acc (fraction) | paper (fraction) |" in md
    paper = {"source": "s", "metric": "loss in %?", "key": "train_loss", "unit": "%",
             "cells": [{"method": "fedavg", "value": 3.0}]}
    for seed in (0, 1):
        fake_sweep_run(tmp_path / "b" / f"r{seed}", "fedavg", 0.1, seed, [0.5, 0.6], paper, losses=[4.0, 3.0 + seed])
    report([str(tmp_path / "b")], str(tmp_path / "p"), plots=False)
    md = (tmp_path / "p" / "report.md").read_text()
    assert "- The paper gives `train_loss` as a percentage, which ours is not: ours is shown unconverted." in md
    assert _table(md)[1][-2:] == ["3.5000 ± 0.7071", "3"]


def test_the_papers_training_loss_gets_a_final_train_loss_column(tmp_path):
    """Seed 001's Table 3 gives the training loss of LLaMA runs whose primary metric is test_ppl."""
    paper = {"source": "Table 3", "metric": "training loss after 100 rounds", "key": "train_loss", "unit": None,
             "cells": [{"method": "fedavg", "value": 4.156}]}
    for seed, loss in enumerate((4.0, 4.2)):
        fake_sweep_run(tmp_path / "s" / f"r{seed}", "fedavg", 0.1, seed, [0.3, 0.4], paper, losses=[5.0, loss])
    rows = report([str(tmp_path / "s")], str(tmp_path / "o"), plots=False)
    assert rows[0].stats["final train_loss"] == pytest.approx((4.1, 0.1414213562))
    head, row = _table((tmp_path / "o" / "report.md").read_text())
    assert "final train_loss" in head and head[-2:] == ["ours: final train_loss", "paper"]
    assert row[head.index("final train_loss")] == "4.1000 ± 0.1414" and row[-2:] == ["4.1000 ± 0.1414", "4.156"]


def test_a_paper_metric_the_runs_did_not_log_is_one_line_and_so_is_a_missing_key(tmp_path):
    paper = {"source": "Table 3", "metric": "training loss", "key": "train_loss", "unit": None,
             "cells": [{"method": "fedavg", "value": 4.156}]}
    fake_sweep_run(tmp_path / "s" / "r0", "fedavg", 0.1, 0, [0.3], paper)  # logs test_acc only
    report([str(tmp_path / "s")], str(tmp_path / "o"), plots=False)
    md = (tmp_path / "o" / "report.md").read_text()
    assert "- The paper's metric `train_loss` (training loss) is not one these runs logged (they logged test_acc): " \
           "its numbers are shown as printed, not compared with ours." in md
    assert _table(md)[1][-2:] == ["—", "4.156"]
    del paper["key"]
    fake_sweep_run(tmp_path / "t" / "r0", "fedavg", 0.1, 0, [0.3], paper)
    report([str(tmp_path / "t")], str(tmp_path / "p"), plots=False)
    md = (tmp_path / "p" / "report.md").read_text()
    assert "- The paper declares no `key` (the run metric its numbers measure)" in md


def test_the_metrics_option_adds_a_final_column_on_the_command_line(tmp_path, capsys):
    for seed, loss in enumerate((1.0, 2.0)):
        fake_sweep_run(tmp_path / "s" / f"r{seed}", "fedavg", 0.1, seed, [0.3, 0.4], None, losses=[3.0, loss])
    assert main([str(tmp_path / "s"), "--metrics", "train_loss", "--out", str(tmp_path / "o"), "--no-plots"]) == 0
    head, row = _table((tmp_path / "o" / "report.md").read_text())
    assert row[head.index("final train_loss")] == "1.5000 ± 0.7071"


def test_a_cell_no_row_matches_is_listed(tmp_path):
    paper = {"source": "s", **PCT, "cells": [{"method": "fedavg", "data.partition.alpha": 0.1, "value": 60.17},
                                             {"method": "fedavg", "data.partition.alpha": 0.05, "value": 56.75}]}
    fake_sweep_run(tmp_path / "s" / "r0", "fedavg", 0.1, 0, [0.5], paper)
    report([str(tmp_path / "s")], str(tmp_path / "o"), by=["method", "data.partition.alpha"], plots=False)
    md = (tmp_path / "o" / "report.md").read_text()
    assert "- The paper: no run for method = fedavg, data.partition.alpha = 0.05 (the paper's 56.75)." in md
    assert "alpha = 0.1 (the paper" not in md
    paper["cells"] = paper["cells"][1:]  # no cell matches: the column goes, the line stays
    fake_sweep_run(tmp_path / "t" / "r0", "fedavg", 0.1, 0, [0.5], paper)
    report([str(tmp_path / "t")], str(tmp_path / "p"), by=["method", "data.partition.alpha"], plots=False)
    md = (tmp_path / "p" / "report.md").read_text()
    assert "paper (%)" not in md and "no run for method = fedavg, data.partition.alpha = 0.05" in md


def test_a_row_run_in_another_setting_keeps_the_papers_number_marked_and_its_claims_are_not_compared(tmp_path):
    """Issue 47: ``experiment=fedmuon_cifar100 data=digits model=cnn fl.rounds=2`` beside the paper's CIFAR-100,
    ResNet-18, 300 rounds: the row says what differs, its verdict is skipped; the rows of the paper's setting are
    compared as before."""
    paper = {"source": "seed 004, Table 2", **PCT,
             "setting": {"data.name": "cifar100", "model.name": "resnet18", "fl.rounds": 300,
                         "fl.num_clients": None},  # null: not fixed (a key a parent experiment fixes)
             "cells": [{"method": "fedavg", "value": 60.25}, {"method": "fedmuon", "value": 73.05}],
             "claims": [{"better": "fedmuon", "worse": "fedavg", "text": "FedMuon above FedAvg"}]}
    for method, acc in (("fedavg", 0.60), ("fedmuon", 0.73)):
        for seed in (0, 1):
            fake_sweep_run(tmp_path / "s" / f"{method}_{seed}", method, 0.1, seed, [0.1, acc + 0.01 * seed], paper,
                           data="cifar100", model="resnet18", extra={"fl": {"rounds": 300}})
            fake_sweep_run(tmp_path / "shrunk" / f"{method}_{seed}", method, 0.1, seed, [0.05, acc / 6], paper)
    report([str(tmp_path / "s"), str(tmp_path / "shrunk")], str(tmp_path / "o"), plots=False)
    md = (tmp_path / "o" / "report.md").read_text()
    assert md.startswith("# Report\n\n**2 of 4 rows were run in another setting than the paper's** (`paper's "
                         "setting`: differs): their numbers are not compared with the paper's, and the claims skip "
                         "them.\n")
    head, *rows = _table(md)
    assert head[-3:] == ["ours: final test_acc (%)", "paper (%)", "paper's setting"]
    what = "data.name: digits, paper: cifar100; model.name: cnn, paper: resnet18; fl.rounds: 2, paper: 300"
    off = f"differs: {what}"
    assert {(r[0], r[1]): r[-3:] for r in rows} == {
        ("fedavg", "cifar100"): ["60.50 ± 0.71", "60.25", "same"],
        ("fedmuon", "cifar100"): ["73.50 ± 0.71", "73.05", "same"],
        ("fedavg", "digits"): ["10.00 ± 0.00", "60.25", off],
        ("fedmuon", "digits"): ["12.17 ± 0.00", "73.05", off]}
    assert _claim_lines(md) == [
        "- **agrees**: FedMuon above FedAvg at data = cifar100, model = resnet18: expected fedmuon > fedavg; ours "
        "(mean ± std final test_acc): fedmuon = 0.7350 ± 0.0071, fedavg = 0.6050 ± 0.0071.",
        f"- **not compared**: FedMuon above FedAvg at data = digits, model = cnn: setting differs ({what})."]
    with open(tmp_path / "o" / "report.csv") as f:
        got = {(r["method"], r["data"]): r["setting_differs"] for r in csv.DictReader(f)}
    assert got[("fedavg", "cifar100")] == "" and got[("fedavg", "digits")] == what
    report([str(tmp_path / "s")], str(tmp_path / "p"), plots=False)  # the paper's setting only: as before
    md = (tmp_path / "p" / "report.md").read_text()
    assert "another setting" not in md and "paper's setting" not in md and _table(md)[0][-1] == "paper (%)"


def test_a_setting_key_the_config_lacks_is_one_line_before_the_run():
    from omegaconf import open_dict

    from fl_lightning.config import check_run as validate
    from fl_lightning.errors import ConfigError
    from tests.helpers.cli import make_cfg

    cfg = make_cfg(["experiment=fedmuon_cifar100"])
    validate(cfg)  # its own block reads
    with open_dict(cfg):
        cfg.paper.setting["fl.roundz"] = 300
    with pytest.raises(ConfigError, match=r"^config error: paper\.setting\.fl\.roundz: no such config key; fix: name "
                                          r"the full key of the composed config \(closest: fl\.rounds\)$"):
        validate(cfg)
    for bad, line in (({"setting": [1]}, "paper.setting: expected a table"),
                      ({"setting": {"fl.rounds": [300]}}, "paper.setting.fl.rounds: got [300]")):
        with pytest.raises(ReportError, match=rf"^config error: {re.escape(line)}.*; fix: [^\n]*$"):
            read_paper(bad)


@pytest.mark.parametrize("args, line", [
    (["--by", "metod"], "error: report: --by metod: no run has this config key; closest: method"),
    (["--select", "val_ac"], "error: report: --select val_ac: no run has this metrics.csv column; closest: val_acc"),
    (["--round-means", "precond_drfit"],
     "error: report: --round-means precond_drfit: no run has this metrics.csv column; closest: precond_drift"),
    (["--metrics", "train_los"], "error: report: --metrics train_los: no run has this metrics.csv column; "
                                 "closest: train_loss"),
])
def test_an_option_naming_what_no_run_has_is_one_line_with_the_closest(tmp_path, capsys, args, line):
    fake_sweep_run(tmp_path / "s" / "r0", "fedavg", 0.1, 0, [0.5], None, losses=[1.0])
    with open(tmp_path / "s" / "r0" / "metrics.csv", "w") as f:  # one setting: --select has nothing to choose from
        f.write("round,train_loss,test_acc,val_acc,precond_drift\n1,1.0,0.5,0.4,0.1\n")
    assert main([str(tmp_path / "s"), "--out", str(tmp_path / "o"), "--no-plots", *args]) == 2
    assert capsys.readouterr().err == line + "\n"


def test_the_hydra_callback_stops_on_a_wrong_name_with_one_line(tmp_path, capsys):
    from omegaconf import OmegaConf

    from fl_lightning.report.callback import ReportWhenDone, declared

    fake_sweep_run(tmp_path / "s" / "r0", "fedavg", 0.1, 0, [0.5], None)
    config = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path / "s")},
                                         "overrides": {"hydra": [], "task": []}}})
    with pytest.raises(SystemExit) as stop:
        ReportWhenDone(out=str(tmp_path / "o"), by=["metod"], plots=False).on_multirun_end(config)
    assert stop.value.code == 2
    assert capsys.readouterr().err == "error: report: --by metod: no run has this config key; closest: method\n"
    OmegaConf.save(OmegaConf.create({"hydra": {"callbacks": {"report": {
        "_target_": "fl_lightning.report.callback.ReportWhenDone", "out": str(tmp_path / "o"), "selct": "val_acc"}}}}),
        tmp_path / "s" / "multirun.yaml")
    with pytest.raises(ReportError, match=r"the report callback's selct: no such option; closest: select$"):
        declared(str(tmp_path / "s"))


# ---------------------------------------------------------------- claims
def _claims_sweep(root, finals, claims, alphas=(0.1,)):
    """Methods x alphas x seeds with the given final accuracies, one paper block holding ``claims``."""
    paper = {"source": "s", **PCT, "claims": claims}
    for (method, alpha), accs in finals.items():
        for seed, a in enumerate(accs):
            fake_sweep_run(root / f"{method}_{alpha}_{seed}", method, alpha, seed, [a], paper)
    return root


def _claim_lines(md: str) -> list[str]:
    return [line for line in md.split("## Claims\n\n", 1)[1].splitlines() if line.startswith("- ")]


def test_a_claim_agrees_differs_or_is_inconclusive_by_its_rows_ranges(tmp_path):
    claims = [{"better": "fedpac_muon", "worse": "local_muon", "text": "FedPAC-X beats Local-X"}]
    cases = {"agrees": [0.80, 0.82], "differs": [0.60, 0.62], "inconclusive": [0.69, 0.75]}  # local_muon: 0.70, 0.72
    for verdict, accs in cases.items():
        _claims_sweep(tmp_path / verdict, {("fedpac_muon", 0.1): accs, ("local_muon", 0.1): [0.70, 0.72]}, claims)
        report([str(tmp_path / verdict)], str(tmp_path / f"o_{verdict}"), plots=False)
        lines = _claim_lines((tmp_path / f"o_{verdict}" / "report.md").read_text())
        assert len(lines) == 1 and lines[0].startswith(f"- **{verdict}**: FedPAC-X beats Local-X: expected "
                                                       "fedpac_muon > local_muon; ours (mean ± std final test_acc): ")
    md = (tmp_path / "o_differs" / "report.md").read_text()
    assert "fedpac_muon = 0.6100 ± 0.0141, local_muon = 0.7100 ± 0.0141 (local_muon above fedpac_muon)." in md
    md = (tmp_path / "o_inconclusive" / "report.md").read_text()  # 0.72 ± 0.042 overlaps 0.71 ± 0.014
    assert "fedpac_muon = 0.7200 ± 0.0424, local_muon = 0.7100 ± 0.0141 (fedpac_muon and local_muon overlap)." in md


def test_a_claim_on_a_minimised_metric_one_run_or_no_run_is_inconclusive(tmp_path):
    claims = [{"better": "B", "worse": "A", "text": "B lower"}, {"better": "B", "worse": "Z", "text": "B below Z"}]
    paper = {"source": "s", "claims": claims}
    for lab, gs in (("A", [3.0, 3.2]), ("B", [1.0, 1.2]), ("C", [0.5])):
        for s, g in enumerate(gs):
            fake_run(tmp_path / "s" / f"{lab}{s}", lab, s, [g], paper=paper)
    report([str(tmp_path / "s")], str(tmp_path / "o"), by=["label"], plots=False)
    lines = _claim_lines((tmp_path / "o" / "report.md").read_text())
    assert lines[0].startswith("- **agrees**: B lower: expected B > A; ours (mean ± std final grad_norm): B = 1.1000")
    assert lines[1] == "- **inconclusive**: B below Z: expected B > Z; ours (mean ± std final grad_norm): " \
                       "B = 1.1000 ± 0.1414 (no run for Z)."
    paper["claims"] = [{"better": "C", "worse": "A"}]
    for lab, gs in (("A", [3.0, 3.2]), ("C", [0.5])):
        for s, g in enumerate(gs):
            fake_run(tmp_path / "t" / f"{lab}{s}", lab, s, [g], paper=paper)
    report([str(tmp_path / "t")], str(tmp_path / "p"), by=["label"], plots=False)
    assert _claim_lines((tmp_path / "p" / "report.md").read_text()) == [
        "- **inconclusive**: C > A: expected C > A; ours (mean ± std final grad_norm): C = 0.5000 (one run), "
        "A = 3.1000 ± 0.1414 (fewer than two finished runs for C)."]


def test_orderings_per_setting_with_where(tmp_path):
    """Seed 000 §7.2: T = 2 is best at beta = 0.1, T = 4 at beta = 10; T = 1 above T = 0 in both."""
    claims = [{"order": [2, [0, 1, 4]], "where": {"data.partition.alpha": 0.1}, "text": "T = 2 best"},
              {"order": [4, [0, 1, 2]], "where": {"data.partition.alpha": 10}, "text": "T = 4 best"},
              {"better": 1, "worse": 0, "text": "T = 1 above T = 0"}]
    acc = {(2, 0.1): [0.90, 0.91], (4, 0.1): [0.80, 0.81], (1, 0.1): [0.70, 0.71], (0, 0.1): [0.50, 0.51],
           (2, 10): [0.90, 0.91], (4, 10): [0.89, 0.93], (1, 10): [0.95, 0.96], (0, 10): [0.40, 0.41]}
    paper = {"source": "s", **PCT, "claims": claims}
    for (t, alpha), accs in acc.items():
        for seed, a in enumerate(accs):
            fake_sweep_run(tmp_path / "s" / f"t{t}_{alpha}_{seed}", "fedmuon_bc", alpha, seed, [a], paper,
                           extra={"method": {"ns_steps": t}})
    report([str(tmp_path / "s")], str(tmp_path / "o"), by=["method.ns_steps", "data.partition.alpha"], plots=False)
    lines = _claim_lines((tmp_path / "o" / "report.md").read_text())
    verdicts = [line.split("**")[1] + " " + line.split(": expected")[0].split("**: ")[1] for line in lines]
    assert verdicts == ["agrees T = 2 best at data.partition.alpha = 0.1",
                        "differs T = 4 best at data.partition.alpha = 10",  # T = 1 lies above T = 4
                        "agrees T = 1 above T = 0 at data.partition.alpha = 0.1",
                        "agrees T = 1 above T = 0 at data.partition.alpha = 10"]
    assert lines[1].endswith("(1 above 4).")


def test_a_converges_claim_counts_the_rows_diverged_runs(tmp_path):
    """Seed 003's C6: no FedMuon run diverges (a non-finite loss, or a final G worse than --blowup)."""
    paper = {"source": "s", "claims": [{"converges": "M", "text": "M never diverges"},
                                       {"converges": "S", "text": "S never diverges"},
                                       {"converges": "Z", "text": "Z never diverges"}]}
    for lab, gs in (("M", [1.0, 1.2, 0.9]), ("S", [1.0, 50.0])):
        for s, g in enumerate(gs):
            fake_run(tmp_path / "s" / f"{lab}{s}", lab, s, [3.0, g], paper=paper)
    fake_run(tmp_path / "s" / "S9", "S", 9, [3.0], finished=False, error="non-finite loss", paper=paper)
    report([str(tmp_path / "s")], str(tmp_path / "o"), by=["label"], plots=False, blowup=37.0)
    assert _claim_lines((tmp_path / "o" / "report.md").read_text()) == [
        "- **agrees**: M never diverges: expected no run of M diverges; ours (runs): M: 0/3 diverged.",
        "- **differs**: S never diverges: expected no run of S diverges; ours (runs): S: 2/3 diverged.",
        "- **inconclusive**: Z never diverges: expected no run of Z diverges (no run for Z)."]


def test_claim_errors_are_one_line():
    from fl_lightning.report.paper import read_paper

    for bad in ({"claims": [{"better": "a"}]}, {"claims": [{"better": "a", "worse": "b", "order": ["a"]}]},
                {"claims": [{"converges": "a", "order": ["a"]}]}, {"claims": [{"converges": "a", "worse": "b"}]},
                {"claims": [{"order": []}]}, {"claims": [{"better": "a", "worse": "b", "when": {}}]},
                {"claims": [{"better": "a", "worse": "b", "where": "x"}]}, {"unit": "percent"}, {"key": 3}):
        with pytest.raises(ReportError):
            read_paper(bad)


# ---------------------------------------------------------------- about
def test_about_placeholders_take_the_runs_values(tmp_path):
    from fl_lightning.report.about import fill, values
    from fl_lightning.report.runs import find_runs

    for seed in (0, 1, 2):
        for lr, label in ((0.03, "Local Muon"), (0.0003, "Local Sophia")):
            fake_sweep_run(tmp_path / "s" / f"{label}_{seed}", "m", 0.1, seed, [0.5] * 40, None, lr=lr,
                           extra={"label": label})
    runs = find_runs([str(tmp_path / "s")])
    text = "{{fl.rounds}} rounds, seeds {{ seed }}, lrs {{method.lr}}, Muon at {{method.lr | label=Local Muon}}; " \
           "a set {0.5, 1} and Hydra's ${fl.rounds} stay"
    assert fill(text, runs) == "40 rounds, seeds 0, 1, 2, lrs 0.0003, 0.03, Muon at 0.03; a set {0.5, 1} and " \
                               "Hydra's ${fl.rounds} stay"
    assert values(list(range(20))) == "0-19" and values([3, 0, 1, 2, 7]) == "0-3, 7" and values([None]) == "null"
    with pytest.raises(ReportError, match=r"^report: about: \{\{fl.roundz\}\}: no run has the key fl.roundz; "
                                          r"closest: fl.rounds$"):
        fill("{{fl.roundz}}", runs)
    assert fill("SOAP {{method.lr | label=Local SOAP}}", runs) == "SOAP (not run)"  # a sweep of fewer arms
    report([str(tmp_path / "s")], str(tmp_path / "o"), by=["label"], plots=False, about="Seeds {{seed}}.")
    assert "\nSeeds 0, 1, 2.\n" in (tmp_path / "o" / "report.md").read_text()
