"""data.val_fraction: a seeded hold-out of the training pool before partitioning, evaluated as val_* beside test_*."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from fl_lightning.data import VALIDATION_SEED, hold_out
from fl_lightning.data.tensors import TensorSet
from tests.helpers.cli import FAST, build_loop, cli_in_process


def _set(n=50):
    return TensorSet({"x": torch.arange(n).float()[:, None], "y": torch.arange(n) % 3})


def test_hold_out_is_a_seeded_partition_of_the_pool():
    train, val = hold_out(_set(), "eval", 0.2, seed=7)
    assert len(val) == 10 and len(train) == 40 and val.transform == "eval" and train.transform is None
    rows = sorted(val.tensors["x"][:, 0].long().tolist() + train.tensors["x"][:, 0].long().tolist())
    assert rows == list(range(50))  # disjoint, nothing lost
    want = np.sort(np.random.default_rng([7, VALIDATION_SEED]).permutation(50)[:10])  # the documented draw
    assert val.tensors["x"][:, 0].long().tolist() == want.tolist()
    assert hold_out(_set(), None, 0.2, seed=8)[1].tensors["x"].tolist() != val.tensors["x"].tolist()
    assert hold_out(_set(), None, 0.0, seed=7)[1] is None and len(hold_out(_set(), None, 0.0, 7)[0]) == 50
    assert len(hold_out(_set(), None, 0.001, seed=7)[1]) == 1  # at least one row


def test_the_validation_rows_train_nobody_and_val_metrics_are_the_global_models(tmp_path):
    loop = build_loop(FAST + ["fl.rounds=1", "data.val_fraction=0.2"], tmp_path)
    data = loop.data
    assert len(data.val) == round(0.2 * 1437) and len(data.train) == 1437 - len(data.val)
    assert sorted(int(i) for c in data.client_indices for i in c) == list(range(len(data.train)))
    whole = build_loop(FAST + ["fl.rounds=1"], tmp_path / "whole").data.train.tensors["x"]
    order = np.random.default_rng([0, VALIDATION_SEED]).permutation(len(whole))
    held = np.sort(order[: len(data.val)])
    assert torch.equal(data.val.tensors["x"], whole[held])  # the held-out rows, and the rest is the training pool
    assert torch.equal(data.train.tensors["x"], whole[np.setdiff1d(np.arange(len(whole)), held)])
    loop.run(progress_enabled=False)
    metrics = loop.evaluate()
    module = loop.module
    with torch.no_grad():
        x = data.val.tensors["x"].float()
        logits = module(x if data.val.transform is None else data.val.batch(torch.arange(len(data.val)), "cpu")["x"])
    acc = (logits.argmax(-1) == data.val.tensors["y"]).float().mean().item()
    assert metrics["val_acc"] == pytest.approx(acc, abs=1e-6) and 0 <= metrics["test_acc"] <= 1
    last = (tmp_path / "metrics.csv").read_text().splitlines()
    cols = dict(zip(last[0].split(","), last[-1].split(",")))
    assert float(cols["val_acc"]) == pytest.approx(metrics["val_acc"], abs=1e-7)  # the logged value is this one


def test_val_fraction_is_logged_and_bad_values_are_one_line(tmp_path):
    code, err = cli_in_process(FAST + ["fl.rounds=1", "data.val_fraction=0.1", f"hydra.run.dir={tmp_path}"], tmp_path)
    assert code == 0, err
    header = (tmp_path / "metrics.csv").read_text().splitlines()[0].split(",")
    assert {"val_acc", "val_loss", "test_acc", "test_loss"} <= set(header)
    for bad in ("1", "-0.1", "abc", "null"):
        code, err = cli_in_process(FAST + [f"data.val_fraction={bad}", f"hydra.run.dir={tmp_path / 'b'}"], tmp_path)
        lines = err.strip().splitlines()
        assert code == 2 and len(lines) == 1 and "data.val_fraction" in lines[0] and "fix:" in lines[0], err
