"""Models, datasets and partitioners are ``_target_`` nodes: a user plugs in their own from a module outside the
package, and a bad argument anywhere is one ``error:`` line naming the full key."""
from __future__ import annotations

import os
import textwrap

import pytest

from tests.conftest import FAST, run_cli
from tests.helpers.cli import cli_in_process

USER_MODULE = textwrap.dedent('''
    """A user's own model, dataset and partitioner."""
    from typing import Annotated

    import numpy as np
    import torch
    from torch import nn

    from fl_lightning.config import Range
    from fl_lightning.data import DataInfo, TensorSet
    from fl_lightning.models import ClassifierModule


    def two_layer(info, hidden: Annotated[int, Range(1)] = 16):  # hidden=0: one line naming the key
        d = int(np.prod(info.input_shape))
        net = nn.Sequential(nn.Flatten(), nn.Linear(d, hidden), nn.ReLU(), nn.Linear(hidden, info.num_classes))
        return ClassifierModule(net, info)


    def blobs(n_train=400, n_test=100, dim=6, classes=3, seed=0):
        g = torch.Generator().manual_seed(seed)
        centers = 3 * torch.randn(classes, dim, generator=g)

        def make(n):
            y = torch.randint(classes, (n,), generator=g)
            return TensorSet({"x": centers[y] + torch.randn(n, dim, generator=g), "y": y})

        return make(n_train), make(n_test), DataInfo(input_shape=(dim,), num_classes=classes)


    def round_robin(labels, num_clients, rng, offset=0):
        idx = np.arange(len(labels))
        return [idx[(idx + offset) % num_clients == j] for j in range(num_clients)]
''')

YAMLS = {
    "model/two_layer.yaml": "name: two_layer\n_target_: mymodels.two_layer\nhidden: 16\n",
    "data/blobs.yaml": ("defaults:\n  - partition: round_robin\n  - _self_\n\nname: blobs\n_target_: mymodels.blobs\n"
                        "dim: 6\nbatch_size: 16\neval_batch_size: 256\non_device: false\n"),
    "data/partition/round_robin.yaml": "name: round_robin\n_target_: mymodels.round_robin\noffset: 1\n",
}


@pytest.fixture
def user_dir(tmp_path):
    (tmp_path / "mymodels.py").write_text(USER_MODULE)
    for rel, text in YAMLS.items():
        (tmp_path / "conf" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "conf" / rel).write_text(text)
    return tmp_path


def env_with(path) -> dict:
    return {"PYTHONPATH": os.pathsep.join(p for p in (str(path), os.environ.get("PYTHONPATH")) if p)}


@pytest.mark.slow
def test_own_model_dataset_and_partitioner_train_through_the_cli(user_dir):
    run = user_dir / "run"
    p = run_cli(FAST + ["fl.eval_every=1", "model._target_=mymodels.two_layer", "~model.net", "+model.hidden=8",
                        "data._target_=mymodels.blobs", "~data.test_size", "+data.dim=6",
                        f"hydra.searchpath=[file://{user_dir / 'conf'}]", "data/partition=round_robin",
                        f"hydra.run.dir={run}"], env=env_with(user_dir))
    assert p.returncode == 0, p.stderr[-3000:]
    rows = (run / "metrics.csv").read_text().splitlines()
    assert len(rows) == 1 + 4  # header + fl.rounds=4 evaluated rounds
    assert "round_robin" in (run / "config.yaml").read_text()


@pytest.mark.slow
def test_own_yaml_configs_train_through_the_cli(user_dir):
    """``model=two_layer data=blobs`` (with its default ``partition: round_robin``) from a searchpath folder."""
    run = user_dir / "run"
    p = run_cli(FAST + [f"hydra.searchpath=[file://{user_dir / 'conf'}]", "model=two_layer", "data=blobs",
                        "model.hidden=8", f"hydra.run.dir={run}"], env=env_with(user_dir))
    assert p.returncode == 0, p.stderr[-3000:]
    assert len((run / "metrics.csv").read_text().splitlines()) == 1 + 4
    # round_robin with offset 1 over 400 examples: client j holds the i with (i + 1) % 6 == j
    assert "6 clients, sizes min/median/max = 66/67/67" in (run / "train.log").read_text()


def one_error_line(p) -> str:
    err = p.stderr.strip()
    assert p.returncode == 2, (p.returncode, err[-2000:])
    assert "Traceback" not in err, err
    lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and err.splitlines()[-1] == lines[0], err
    return lines[0]


@pytest.mark.parametrize("overrides,key", [
    (["model.net.channels=[0,64]"], "model.net.channels:"),
    (["model.net.hidden=[128,64]"], "model.net.hidden:"),
    (["+model.net.depth=3"], "model.net.depth:"),                             # a keyword small_cnn does not take
    (["model=lenet5"], "model.net:"),                                         # LeNet-5 needs >= 12x12, digits are 8x8
    (["data.test_size=5"], "data.test_size:"),
    (["data.partition.alpha=-1"], "data.partition.alpha:"),
    (["data/partition=shards", "data.partition.shards_per_client=0"], "data.partition.shards_per_client:"),
    (["data.partition.name=iid"], "data.partition.name:"),                   # the old way to switch partitioners
])
def test_bad_argument_is_one_line_naming_the_full_key(overrides, key, tmp_path):
    """train.py's path in this process (tests/system/test_cli_errors.py runs the script itself)."""
    code, err = cli_in_process(FAST + overrides, tmp_path)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error:"), err
    assert key in lines[0] and "fix:" in lines[0], lines[0]


@pytest.mark.slow
def test_bad_argument_of_a_user_builder_names_the_full_key(user_dir):
    p = run_cli(FAST + ["model._target_=mymodels.two_layer", "~model.net", "+model.hidden=0",
                        f"hydra.run.dir={user_dir / 'run'}"], env=env_with(user_dir))
    assert "model.hidden: must be >= 1, got 0" in one_error_line(p)
