"""An experiment's group member swapped on the command line (issue 65, item 1): ``experiment=glue_lora
data=pydoc_topics data/partition=iid`` is a run, not a refusal. Hydra merges an experiment's values for a group's
node (glue_lora's ``data.partition.alpha: 0.8``) after whichever member the command line chose; what the chosen
member's target does not take and the command line did not type is dropped (``config.groups.drop_left_behind``),
and a ``paper.setting`` key the command line removed or replaced makes the run one of another setting, which the
report marks as it marks a shrunk run. Checked as ``train.py`` checks before it builds anything (no training)."""
from __future__ import annotations

import csv
import json

import pytest
from omegaconf import OmegaConf, open_dict

from tests.helpers.cli import make_cfg
from tests.helpers.fixes import fix_defects, verdict

# docs/text.md: "one client holding all the data", a run of experiment=glue_lora data=pydoc_topics
ONE_CLIENT = ["experiment=glue_lora", "data=pydoc_topics", "method=local_adamw", "method.lr=1e-3", "fl.num_clients=1",
              "fl.clients_per_round=1", "fl.rounds=10", "fl.eval_every=2"]


def checked(argv: list[str]):
    """The config ``train.py argv`` runs: composed, then ``check_run`` with the command line's overrides."""
    from fl_lightning.config import check_run

    cfg = make_cfg(argv)
    check_run(cfg, argv)
    return cfg


@pytest.mark.parametrize("ways", [["data/partition=iid"], ["data/partition=iid", "~data.partition.alpha"]],
                         ids=["choose iid", "choose iid, delete alpha"])
def test_an_experiments_partition_can_be_switched(ways):
    """Each way of asking for IID under the experiment runs: the experiment's alpha is not handed to the IID
    partition, and its ``paper.setting`` (which names ``data.partition.alpha: 0.8``) stops nothing."""
    assert verdict(ONE_CLIENT + ways) is None
    cfg = checked(ONE_CLIENT + ways)
    assert OmegaConf.to_container(cfg.data.partition) == {"name": "iid", "_target_": "fl_lightning.data.partition.iid"}
    assert cfg.paper.setting["data.partition.alpha"] == 0.8  # the paper's setting, unchanged: the run is another's


def test_a_key_the_command_line_types_is_still_refused_and_its_fix_works():
    """``data/partition=iid data.partition.alpha=null``: the user typed a key the IID partition does not take:
    refused, and following the fix (remove it) runs."""
    argv = ONE_CLIENT + ["data/partition=iid", "data.partition.alpha=null"]
    line = verdict(argv)
    assert line is not None and line.startswith(
        "error: config error: data.partition.alpha: is not an argument of fl_lightning.data.partition.iid; "
        "fix: remove it"), line
    assert not fix_defects(argv, line)


@pytest.mark.parametrize("argv", [
    ["experiment=fedmuon_bc_cifar10_homog", "data/partition=iid"],  # alpha 10 from the experiment it extends
    ["experiment=results/first_order", "data/partition=shards"],  # the Dirichlet's alpha: shards take another key
    ["experiment=fedpac_cifar100", "data/partition=dirichlet"],  # per-class Dirichlet: takes alpha, keeps 0.1
], ids=["inherited alpha, iid", "results page, shards", "another Dirichlet"])
def test_any_experiments_partition_can_be_switched(argv):
    cfg = checked(argv)
    chosen = argv[-1].split("=")[1]
    assert cfg.data.partition.name == chosen
    if chosen == "dirichlet":
        assert cfg.data.partition.alpha == 0.1  # a member that takes the key keeps the experiment's value
    else:
        assert "alpha" not in cfg.data.partition


def test_a_setting_key_the_command_line_did_not_touch_is_still_refused():
    """The paper block's own typo is refused with the command line's overrides too (they touch other keys)."""
    from fl_lightning.config import check_run
    from fl_lightning.errors import ConfigError

    argv = ["experiment=glue_lora", "data=pydoc_topics", "data/partition=iid"]
    cfg = make_cfg(argv)
    with open_dict(cfg):
        cfg.paper.setting["fl.roundz"] = 100
    with pytest.raises(ConfigError, match=r"^config error: paper\.setting\.fl\.roundz: no such config key"):
        check_run(cfg, argv)


def test_the_run_is_marked_as_another_setting_in_the_report(tmp_path):
    """As a shrunk run is: the report's row says what differs from the paper's setting, the dropped alpha too."""
    from fl_lightning.report import report

    run = tmp_path / "sweep" / "run"
    run.mkdir(parents=True)
    cfg = checked(ONE_CLIENT + ["data/partition=iid"])
    with open_dict(cfg):
        cfg.run_dir = str(run)
    OmegaConf.save(cfg, run / "config.yaml", resolve=True)  # as train.py saves it
    (run / "metrics.csv").write_text("round,test_acc\n1,0.2\n2,0.3\n")
    (run / "summary.json").write_text(json.dumps({"primary_metric": "test_acc", "primary_mode": "max",
                                                  "finished": True, "rounds_done": 2}))
    report([str(tmp_path / "sweep")], str(tmp_path / "out"), plots=False)
    with open(tmp_path / "out" / "report.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 1
    differs = rows[0]["setting_differs"]
    for part in ("data.partition.name: iid, paper: dirichlet_per_client", "data.partition.alpha: null, paper: 0.8",
                 "fl.num_clients: 1, paper: 4"):
        assert part in differs, differs
    assert "run in another setting than the paper's" in (tmp_path / "out" / "report.md").read_text()
