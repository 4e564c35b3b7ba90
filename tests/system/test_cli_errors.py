"""Bad input gives one line naming the key and the fix, a non-zero exit, and no traceback."""
from __future__ import annotations

import re


import pytest

from tests.helpers.cli import run_cli

pytestmark = pytest.mark.slow

FAST = ["fl.rounds=2", "fl.local_steps=2", "trainer.progress=false", "trainer.accelerator=cpu"]


def one_line_error(p, *needles):
    assert p.returncode != 0
    err = p.stderr.strip()
    assert "Traceback" not in err, err
    last = err.splitlines()[-1]
    assert last.startswith("error:"), err
    for n in needles:
        assert n in last, (n, last)
    return last


@pytest.mark.parametrize("group,bad", [("method", "fedfoo"), ("model", "resnet999"), ("data", "imagenet42")])
def test_unknown_group_lists_valid_names(group, bad, tmp_path):
    p = run_cli([f"{group}={bad}", f"hydra.run.dir={tmp_path}"])
    line = one_line_error(p, bad, "valid:", f"hydra.searchpath=[file://DIR] where DIR holds {group}/{bad}.yaml")
    assert len(p.stderr.strip().splitlines()) == 1 and p.returncode == 2
    assert {"method": "fedavg", "model": "cnn", "data": "digits"}[group] in line


@pytest.mark.parametrize("override,key", [
    ("fl.clients_per_round=20", "fl.clients_per_round"),
    ("data.partition.alpha=0", "data.partition.alpha"),
    ("data.partition.alpha=-1", "data.partition.alpha"),
    ("fl.rounds=0", "fl.rounds"),
    ("fl.num_clients=5000", "fl.num_clients"),   # digits has 1,437 training images: clients left with no data
    ("trainer.precision=17-mixed", "trainer.precision"),
    ("fl.rounds=abc", "fl.rounds"),
    ("fl.rounds=2.5", "fl.rounds"),
    ("seed=-1", "seed"),
    ("data.eval_batch_size=-1", "data.eval_batch_size"),
    ("trainer.devices=0", "trainer.devices"),
    ("trainer.accelerator=tpu9", "trainer.accelerator"),
    ("stop_after_rounds=0", "stop_after_rounds"),
    ("fl.num_client=5", "did you mean fl.num_clients"),     # an unknown key: one line, not Hydra's six
    ("model.hidden=64", "did you mean model.net.hidden"),
])
def test_bad_values(override, key, tmp_path):
    extra = ["data/partition=iid"] if "num_clients" in override else []
    p = run_cli(FAST + extra + [override, f"hydra.run.dir={tmp_path}"])
    one_line_error(p, key, "fix:")


@pytest.mark.parametrize("strategy", ["ddp_spawn", "ddp_fork"])
def test_launchers_that_start_processes_from_a_function_are_refused(strategy, tmp_path):
    p = run_cli(FAST + ["trainer.devices=2", f"trainer.strategy={strategy}", f"hydra.run.dir={tmp_path}"])
    one_line_error(p, "trainer.strategy", "use trainer.strategy=ddp")


def test_missing_data_dir_names_the_path(tmp_path):
    missing = tmp_path / "nowhere"
    p = run_cli(FAST + ["data=cifar10", f"data.root={missing}", f"hydra.run.dir={tmp_path / 'run'}"])
    one_line_error(p, str(missing), "cifar-10-batches-py")


def test_nan_loss_stops_and_keeps_last_good_checkpoint(tmp_path):
    d = tmp_path / "run"
    assert run_cli(FAST + [f"hydra.run.dir={d}"]).returncode == 0
    p = run_cli(FAST + ["fl.rounds=4", "method.lr=1e30", f"resume={d}", "force_resume=true", f"hydra.run.dir={tmp_path / 'h'}"])
    line = one_line_error(p, "nan", "round 3", "round_000002")
    assert "method.lr" in line
    assert (d / "checkpoints" / "round_000002" / "model.safetensors").exists()
    assert not list((d / "checkpoints").glob("round_000003*"))


def test_hydra_full_error_shows_traceback(tmp_path):
    p = run_cli(FAST + ["fl.rounds=0", f"hydra.run.dir={tmp_path}"], env={"HYDRA_FULL_ERROR": "1"})
    assert p.returncode != 0 and "Traceback" in p.stderr


@pytest.mark.parametrize("override,key", [
    ("method.parts.aggregation.rule=foo", "method.parts.aggregation.rule"),
    ("method.parts.local_optimizer.state=foo", "method.parts.local_optimizer.state"),
])
def test_part_error_is_one_line_with_full_key(override, key, tmp_path):
    p = run_cli(FAST + [override, f"hydra.run.dir={tmp_path}"])
    one_line_error(p, f"config error: {key}:", "fix:")
    assert p.returncode == 2


def test_interpolated_part_value_names_the_users_key(tmp_path):
    p = run_cli(FAST + ["method=fedmuon", "method.alpha=1.5", f"hydra.run.dir={tmp_path}"])
    one_line_error(p, "method.alpha (via method.parts.alignment.alpha)")


@pytest.mark.parametrize("arg,key,fix", [
    ("+fl.num_client=5", "fl.num_client: no such key", "did you mean fl.num_clients?"),
    ("fl.num_client=5", "fl.num_client: no such key", "did you mean fl.num_clients?"),
    ("+method.learning_rate=0.1", "method.learning_rate: nothing in method 'fedavg' reads it",
     "fix: did you mean method.lr?"),
    ("method.learning_rate=0.1", "method.learning_rate: no such key", "fix: did you mean method.lr?"),
    ("fl.rounds=abc", "fl.rounds: expected a whole number", "fl.rounds=40"),
])
def test_unknown_and_mistyped_keys_are_one_line_before_training(arg, key, fix, tmp_path):
    """The schema's checks through train.py: one line naming the key and the closest valid one (first: the + hint
    only where no key is close), exit 2."""
    p = run_cli([arg, f"hydra.run.dir={tmp_path}"])
    line = one_line_error(p, key, fix)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert "leading +" not in line, line


@pytest.mark.parametrize("overrides,key,fix", [
    # issue 32: a bad layer count was blamed on `hidden` (the LSTM) and `hidden_size` (LLaMA)
    (["model=char_lstm", "data=pydoc_chars", "model.net.layers=0"], "model.net.layers", "model.net.layers=2"),
    (["model=llama_tiny", "data=pydoc_chars", "model.net.layers=0"], "model.net.layers", "model.net.layers=8"),
    (["model=llama_60m", "data=pydoc_chars", "model.net.layers=-1"], "model.net.layers", "model.net.layers=8"),
    (["model=llama_tiny", "data=pydoc_chars", "model.net.layers=1000000000000"], "model.net.layers",
     "model.net.layers=8"),  # the builder's default (llama_tiny.yaml ships 2)
    # a non-numeric server tau named no key; a scalar betas named no key
    (["method=fedadam", "method.server_tau=abc"], "method.server_tau", "method.server_tau=0.001"),
    (["optimizer=adam", "optimizer.betas=0.9"], "optimizer.betas", "optimizer.betas=[0.9,0.999]"),
])
def test_deep_keys_name_the_key_typed_and_a_fix_that_works(overrides, key, fix, tmp_path):
    """Through the CLI (in-process): one line naming the key the user typed, exit 2; the value the fix names then
    passes validation (nothing is built)."""
    from fl_lightning.config import check_run as validate
    from tests.helpers.cli import cli_in_process, make_cfg

    code, err = cli_in_process(FAST + overrides, tmp_path / "run")
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    assert re.match(rf"error: config error: {re.escape(key)}( \(via [\w.]+\))?: ", lines[0]), lines[0]
    assert "fix: " in lines[0] and fix in lines[0].split("fix: ", 1)[1], lines[0]
    validate(make_cfg(FAST + overrides[:-1] + [fix], tmp_path / "fixed"))


def test_a_null_config_group_is_none_where_none_is_the_default_else_one_line(tmp_path):
    from tests.helpers.cli import FAST, cli_in_process

    for group in ("experiment", "arm"):  # null by default: =null keeps none
        code, err = cli_in_process([*FAST, f"{group}=null"], tmp_path / group)
        assert code == 0, err
    for group in ("method", "model", "data", "server_opt"):  # was Hydra's "Config group override must be a string"
        code, err = cli_in_process([*FAST, f"{group}=null"], tmp_path / group)
        lines = err.strip().splitlines()
        assert code == 2 and len(lines) == 1 and lines[0].startswith(f"error: config error: {group}: null is not"), err


def test_a_run_refused_after_its_folder_exists_leaves_the_reason_in_train_log(tmp_path):
    """A value refused by the config check runs after Hydra made the run folder: its train.log holds the same one
    line as the terminal (no empty log left behind), and the terminal has it once."""
    p = run_cli(["method.lr=-1", *FAST, f"hydra.run.dir={tmp_path / 'run'}"])
    line = one_line_error(p, "method.lr", "fix:")
    assert p.stderr.count("\n") == 1  # one line on the terminal
    assert (tmp_path / "run" / "train.log").read_text().strip().splitlines()[-1] == line
