"""Issue "Hardening, second pass" through the CLI: a local-step count that would plan the machine out of memory is
one line within seconds; SIGTERM during set-up or the first round ends the process at once with one line; a resume
asking for fewer rounds than the run already did is refused in one line and rewrites nothing."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from fl_lightning.config import StepBudget
from tests.helpers.cli import FAST, ROOT, cli_in_process, one_line_error, run_cli

pytestmark = pytest.mark.slow


def test_a_billion_local_steps_is_one_line_within_seconds(tmp_path):
    t = time.time()
    p = run_cli(FAST + ["fl.local_steps=1000000000", f"hydra.run.dir={tmp_path}"], timeout=60)
    line = one_line_error(p, "fl.local_steps", "1000000")
    assert "fix: set e.g. fl.local_steps=10" in line
    assert time.time() - t < 30  # refused before torch is imported (~0.5 s idle)


def test_planning_a_long_round_holds_bounded_memory():
    """The batch plan of a round is drawn ahead in bounded chunks: a round of a million steps starts at once and
    yields the same batches as drawing the whole plan first (what the loop did before)."""
    import itertools

    import torch

    from fl_lightning.data import build_federated_data
    from tests.helpers.cli import make_cfg

    data = build_federated_data(make_cfg(FAST).data, 6, 0, "cpu")
    first = list(itertools.islice(data.client_batches(0, 3, "cpu", StepBudget(steps=10**6)), 5))
    short = list(data.client_batches(0, 3, "cpu", StepBudget(steps=5)))
    for a, b in zip(first, short):
        assert all(torch.equal(a[k], b[k]) for k in a)
    old, data.AHEAD_ROWS = data.AHEAD_ROWS, 1  # one batch per copy: the same stream
    try:
        for a, b in zip(data.client_batches(0, 3, "cpu", StepBudget(steps=5)), short):
            assert all(torch.equal(a[k], b[k]) for k in a)
    finally:
        data.AHEAD_ROWS = old


def _wait_for(pred, limit=120.0):
    deadline = time.time() + limit
    while not pred() and time.time() < deadline:
        time.sleep(0.05)


@pytest.mark.parametrize("when", ["importing", "composing", "first round"])
def test_sigterm_during_set_up_ends_at_once_with_one_line(tmp_path, when):
    d = tmp_path / "run"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("HYDRA_FULL_ERROR", None)
    proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "train.py"), *FAST, "fl.local_steps=1000000",
                             f"hydra.run.dir={d}"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        if when == "importing":
            time.sleep(0.05)
        elif when == "composing":
            time.sleep(0.6)
        else:  # the config is saved once the run is built: the loop is about to start (or in) its first round
            _wait_for(lambda: (d / "config.yaml").exists())
            time.sleep(1.0)
        proc.send_signal(signal.SIGTERM)
        t = time.time()
        _, err = proc.communicate(timeout=60)
        took = time.time() - t
    finally:
        proc.kill()
    lines = err.strip().splitlines()
    errors = [ln for ln in lines if ln.startswith("error:") or "Traceback" in ln]
    assert proc.returncode in (128 + signal.SIGTERM, -signal.SIGTERM), err[-2000:]
    if proc.returncode > 0:  # Python's handlers were in place: exactly one line says so
        assert len(errors) == 1 and errors[0].startswith("error: stopped by signal 15"), err[-2000:]
    assert took < 20, took  # at once (a few seconds on a busy 2-core machine: interpreter exit)
    assert not list((d / "checkpoints").glob("round_*")) if (d / "checkpoints").exists() else True
    if when == "first round":
        assert "while running round 1" in errors[0], errors


def test_resuming_with_fewer_rounds_than_done_is_refused_and_rewrites_nothing(tmp_path):
    d = tmp_path / "run"
    code, err = cli_in_process(FAST + ["fl.rounds=3", f"hydra.run.dir={d}"], d)
    assert code == 0, err
    before = {f: (d / f).read_bytes() for f in ("summary.json", "config.yaml", "metrics.csv")}
    code, err = cli_in_process(FAST + ["fl.rounds=2", f"resume={d}"], d)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    assert lines[0].startswith("error: config error: fl.rounds: 2 is fewer than the 3 rounds") and \
        "fix: resume with fl.rounds=3 or more" in lines[0], lines
    assert {f: (d / f).read_bytes() for f in before} == before
    code, err = cli_in_process(FAST + ["fl.rounds=3", f"resume={d}"], d)  # the fix: nothing left to run, no error
    assert code == 0, err


@pytest.mark.parametrize("overrides,named", [
    (["method.parts.aggregation.server_lr=1e30"], "method.parts.aggregation.server_lr"),
    (["method=fedadam", "method.server_lr=1e30"], "method.server_lr"),
    (["method.lr=1e30"], "method.lr"),
])
def test_a_diverging_run_names_the_learning_rate_that_grew_the_loss(tmp_path, overrides, named):
    code, err = cli_in_process(FAST + overrides + [f"hydra.run.dir={tmp_path}"], tmp_path)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    fix = lines[0].split(": lower ", 1)[1]
    assert f"({named})" in fix and fix.count("method.") == 1 + ("grad_clip" in fix), lines[0]
    assert ("server" in fix) == ("server" in named or "gamma" in named), lines[0]


def test_an_accelerator_this_machine_lacks_is_one_line(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("checks the message on a machine without the accelerator")
    for acc in ("tpu", "mps", "gpu"):
        code, err = cli_in_process(FAST + [f"trainer.accelerator={acc}", f"hydra.run.dir={tmp_path / acc}"], tmp_path)
        lines = err.strip().splitlines()
        assert code == 2 and len(lines) == 1, err
        assert lines[0].startswith("error: config error: trainer.accelerator:") and \
            "fix: use trainer.accelerator=cpu" in lines[0], lines


def test_shards_that_cannot_be_formed_advise_shard_keys_not_alpha(tmp_path):
    base = ["trainer.progress=false", "trainer.accelerator=cpu", "fl.rounds=1", "fl.local_steps=1",
            "fl.clients_per_round=2", "data/partition=shards"]
    code, err = cli_in_process(base + ["fl.num_clients=1000", f"hydra.run.dir={tmp_path / 'a'}"], tmp_path / "a")
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "alpha" not in lines[0], err
    assert lines[0].startswith("error: config error: fl.num_clients:"), lines
    assert "fix: use at most 718 clients (fl.num_clients) or data.partition.shards_per_client=1" in lines[0], lines
    for i, fix in enumerate(("fl.num_clients=718", "data.partition.shards_per_client=1")):  # either fix works
        code, err = cli_in_process(base + ["fl.num_clients=1000", fix, f"hydra.run.dir={tmp_path / str(i)}"],
                                   tmp_path / str(i))
        assert code == 0, (fix, err)


@pytest.mark.parametrize("damage", ["truncated", "not json", "no users", "x not strings"])
def test_a_malformed_leaf_file_names_the_key_and_the_file(tmp_path, damage):
    import json

    from tests.helpers.text_files import leaf_shakespeare

    root = leaf_shakespeare(str(tmp_path / "leaf"), {"A": (30, 12), "B": (25, 9)})
    path = os.path.join(root, "train", "all_data_niid_0_keep_0_train_9.json")
    text = open(path).read()
    doc = json.loads(text)
    if damage == "truncated":
        text = text[: len(text) // 2]
    elif damage == "not json":
        text = "\x00\x01 binary"
    elif damage == "no users":
        text = json.dumps({"user_data": doc["user_data"]})
    else:
        doc["user_data"]["A"]["x"][3] = [1, 2]
        text = json.dumps(doc)
    open(path, "w").write(text)
    args = ["model=char_lstm", "data=shakespeare", f"data.root={root}", "data.train_per_client=20",
            "data.test_per_client=8", "fl.num_clients=2", "fl.clients_per_round=2", "fl.local_steps=2", "fl.rounds=1",
            "data.batch_size=5", "trainer.progress=false", "trainer.accelerator=cpu", f"hydra.run.dir={tmp_path / 'r'}"]
    code, err = cli_in_process(args, tmp_path / "r")
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    assert lines[0].startswith("error: config error: data.root:") and f"{path} is not a LEAF json file" in lines[0]
    assert "fix: replace it with LEAF's file" in lines[0]


def test_more_clients_than_examples_is_refused_before_partitioning(tmp_path):
    code, err = cli_in_process(FAST + ["fl.num_clients=10000000", f"hydra.run.dir={tmp_path}"], tmp_path)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    assert lines[0] == ("error: config error: fl.num_clients: 10000000 clients but digits has 1437 training examples; "
                        "fix: use at most 1437 clients (fl.num_clients=16, say)")


def test_a_run_without_progress_bar_says_where_it_is_and_stop_after_rounds_how_to_go_on(tmp_path):
    d = tmp_path / "run"
    p = run_cli(FAST + ["stop_after_rounds=2", f"hydra.run.dir={d}"])
    assert p.returncode == 0, p.stderr[-2000:]
    last = p.stdout.strip().splitlines()[-1]
    summary = __import__("json").loads((d / "summary.json").read_text())
    assert last == (f"fedavg: 2 of 4 rounds, final test_acc {summary['final_test_acc']:.4f} "
                    f"(best {summary['best_test_acc']:.4f}); run directory {d}"), last
    assert p.stderr.strip().splitlines()[-2:] == ["stopped after round 2 (stop_after_rounds); checkpoint saved. "
                                                  "Resume with:", f"  python3 train.py resume={d}"]
