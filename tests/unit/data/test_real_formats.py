"""The real loaders on tiny files written in the real on-disk formats (CIFAR python pickles, FashionMNIST idx),
driven through the paper experiment configs with small overrides."""
from __future__ import annotations

import os
import pickle
import struct

import numpy as np
import pytest

from tests.helpers.cli import cli_in_process

SMALL = ["fl.num_clients=4", "fl.clients_per_round=2", "fl.rounds=2", "fl.local_steps=2", "fl.eval_every=1",
         "data.batch_size=8", "trainer.progress=false", "trainer.accelerator=cpu"]


def write_cifar(root, n_classes: int, n_train=100, n_test=40):
    rng = np.random.default_rng(0)
    if n_classes == 10:
        folder, train_files, test_file, key, meta = "cifar-10-batches-py", [f"data_batch_{i}" for i in range(1, 6)], "test_batch", "labels", "batches.meta"
    else:
        folder, train_files, test_file, key, meta = "cifar-100-python", ["train"], "test", "fine_labels", "meta"
    d = os.path.join(root, folder)
    os.makedirs(d)
    per = n_train // len(train_files)
    for f in train_files:
        with open(os.path.join(d, f), "wb") as fh:
            pickle.dump({"data": rng.integers(0, 256, (per, 3072), dtype=np.uint8), key: rng.integers(0, n_classes, per).tolist()}, fh)
    with open(os.path.join(d, test_file), "wb") as fh:
        pickle.dump({"data": rng.integers(0, 256, (n_test, 3072), dtype=np.uint8), key: rng.integers(0, n_classes, n_test).tolist()}, fh)
    names_key = "label_names" if n_classes == 10 else "fine_label_names"
    with open(os.path.join(d, meta), "wb") as fh:
        pickle.dump({names_key: [f"c{i}" for i in range(n_classes)]}, fh)


def write_idx(root, folder="FashionMNIST", n_train=80, n_test=30):
    rng = np.random.default_rng(0)
    raw = os.path.join(root, folder, "raw")
    os.makedirs(raw)
    for split, n in (("train", n_train), ("t10k", n_test)):
        imgs = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
        labels = rng.integers(0, 10, n, dtype=np.uint8)
        with open(os.path.join(raw, f"{split}-images-idx3-ubyte"), "wb") as f:
            f.write(struct.pack(">IIII", 2051, n, 28, 28) + imgs.tobytes())
        with open(os.path.join(raw, f"{split}-labels-idx1-ubyte"), "wb") as f:
            f.write(struct.pack(">II", 2049, n) + labels.tobytes())


@pytest.mark.parametrize("experiment,writer,extra", [
    ("fedmuon_avg_cifar10", lambda r: write_cifar(r, 10), ["model.net.width=8"]),                  # iid
    ("fedmuon_cifar100", lambda r: write_cifar(r, 100), ["model.net.width=8", "fl.eval_every=1"]),  # dirichlet_per_client
    ("fedmuon_bc_fmnist", write_idx, ["data.partition.min_size=1"]),                               # dirichlet
    # issue 8's vision settings, shrunk (fp32 Newton-Schulz: bf16 matmuls are emulated on most CPUs)
    pytest.param("fedmuon_bc_cifar10", lambda r: write_cifar(r, 10), ["model.net.width=8", "data.partition.min_size=1"],
                 marks=pytest.mark.slow),
    pytest.param("fedmuon_vit_tiny_cifar100", lambda r: write_cifar(r, 100),
                 ["model.net.depth=1", "method.ns_dtype=null"], marks=pytest.mark.slow),
    pytest.param("fedmuon_swin_cifar100", lambda r: write_cifar(r, 100),
                 ["model.net.pretrained_path=null", "model.net.embed_dim=48", "model.net.depths=[2]",
                  "model.net.num_heads=[3]", "model.net.window_size=4", "model.net.img_size=32",
                  "method.ns_dtype=null", "data.batch_size=4"], marks=pytest.mark.slow),
    pytest.param("fedpac_cifar100", lambda r: write_cifar(r, 100), ["model.net.width=8"], marks=pytest.mark.slow),
    pytest.param("fedpac_vit_tiny_cifar100", lambda r: write_cifar(r, 100), ["model.net.depth=1"],
                 marks=pytest.mark.slow),
])
def test_experiment_runs_on_tiny_real_format_data(experiment, writer, extra, tmp_path):
    root = tmp_path / "data"
    root.mkdir()
    writer(str(root))
    run = tmp_path / "run"
    code, err = cli_in_process([f"experiment={experiment}", f"data.root={root}", *SMALL, *extra], run)
    assert code == 0, err[-3000:]
    lines = (run / "metrics.csv").read_text().splitlines()
    assert len(lines) == 3  # header + 2 evaluated rounds
    assert (run / "summary.json").exists()


def test_fake_cifar_needs_no_files_has_the_real_shapes_and_is_seeded(tmp_path):
    """``data.fake=true``: CIFAR's shapes and sizes from a fixed seed, nothing read from ``root``; the same images
    every time; a run's config hash with ``fake: false`` is the hash it had before the key existed."""
    import torch
    from omegaconf import OmegaConf

    from fl_lightning.config import config_hash
    from fl_lightning.data.vision import cifar10, cifar100

    train, test, info = cifar100(str(tmp_path / "nothing_here"), fake=True)
    assert tuple(train.tensors["x"].shape) == (50_000, 3, 32, 32) and tuple(test.tensors["x"].shape) == (10_000, 3, 32, 32)
    assert info.num_classes == 100 and int(train.tensors["y"].max()) < 100 and train.tensors["x"].dtype == torch.uint8
    again, _, _ = cifar10(str(tmp_path), fake=True)
    first, _, _ = cifar10(str(tmp_path), fake=True)
    assert torch.equal(again.tensors["x"], first.tensors["x"]) and not os.listdir(tmp_path)
    base = OmegaConf.create({"data": {"name": "cifar10", "batch_size": 32}, "fl": {"rounds": 3}})
    with_key = OmegaConf.create({"data": {"name": "cifar10", "batch_size": 32, "fake": False}, "fl": {"rounds": 3}})
    assert config_hash(base) == config_hash(with_key)
    assert config_hash(OmegaConf.merge(base, {"data": {"fake": True}})) != config_hash(base)


def test_fake_cifar_runs_an_experiment_end_to_end(tmp_path):
    code, err = cli_in_process(["data=cifar10", "data.fake=true", "model=cnn_fedavg", "fl.rounds=1", "fl.local_steps=2",
                                "fl.num_clients=4", "fl.clients_per_round=2", "trainer.progress=false",
                                "trainer.accelerator=cpu"], tmp_path / "run")
    assert code == 0, err
    code, err = cli_in_process(["data=cifar10", "data.fake=maybe"], tmp_path / "bad")
    assert code == 2 and "data.fake" in err.strip().splitlines()[-1], err


@pytest.mark.parametrize("name, shape, sizes, classes", [
    ("mnist", (1, 28, 28), (60_000, 10_000), 10),
    ("fashion_mnist", (1, 28, 28), (60_000, 10_000), 10),
    ("tiny_imagenet", (3, 64, 64), (100_000, 10_000), 200),
])
def test_fake_image_sets_need_no_files_have_the_real_shapes_and_are_seeded(tmp_path, name, shape, sizes, classes):
    """``data.fake=true`` for the other image sets that need files: the real shapes, sizes and classes, nothing read
    from ``root``, the training images numpy's ``default_rng(0)`` draws (the test set's ``default_rng(1)``)."""
    import torch
    from hydra.utils import get_method
    from omegaconf import OmegaConf

    from fl_lightning.config import config_hash
    from tests.helpers.cli import CONF, make_cfg

    node = OmegaConf.load(os.path.join(CONF, "data", f"{name}.yaml"))
    assert node.fake is False
    cfg = make_cfg([f"data={name}"])
    before = OmegaConf.to_container(cfg)  # the config as it was before the key existed: the same hash
    del before["data"]["fake"]
    assert config_hash(cfg) == config_hash(OmegaConf.create(before))
    load = get_method(node._target_)
    train, test, info = load(str(tmp_path / "nothing_here"), fake=True)
    assert not os.listdir(tmp_path)
    assert tuple(train.tensors["x"].shape) == (sizes[0], *shape) and tuple(test.tensors["x"].shape) == (sizes[1], *shape)
    assert info.input_shape == shape and info.num_classes == classes
    for s in (train, test):
        y = s.tensors["y"]
        assert s.tensors["x"].dtype == torch.uint8 and int(y.min()) == 0 and int(y.max()) == classes - 1
    hwc = (*shape[1:], shape[0]) if shape[0] == 3 else shape[1:]
    want = torch.from_numpy(np.random.default_rng(1).integers(0, 256, (sizes[1], *hwc), dtype=np.uint8))
    want = want.permute(0, 3, 1, 2) if shape[0] == 3 else want.unsqueeze(1)
    assert torch.equal(test.tensors["x"], want)
    if name == "tiny_imagenet":  # image_size sets the side; the same images every time
        small, _, info = load(str(tmp_path), image_size=8, fake=True)
        again, _, _ = load(str(tmp_path), image_size=8, fake=True)
        assert tuple(small.tensors["x"].shape) == (100_000, 3, 8, 8) and info.input_shape == (3, 8, 8)
        assert torch.equal(small.tensors["x"], again.tensors["x"]) and torch.equal(small.tensors["y"], again.tensors["y"])


@pytest.mark.parametrize("data", ["mnist", "fashion_mnist", "tiny_imagenet"])
def test_a_fake_that_is_not_a_bool_is_one_line(tmp_path, data):
    for bad in ("maybe", "null", "1"):
        code, err = cli_in_process([f"data={data}", f"data.fake={bad}", *SMALL], tmp_path / bad)
        last = err.strip().splitlines()[-1]
        assert code == 2 and last.startswith("error: ") and "data.fake: " in last and "true or false" in last, err
        assert "Traceback" not in err


def test_fake_fashion_mnist_runs_an_experiment_end_to_end(tmp_path):
    code, err = cli_in_process(["experiment=fedmuon_bc_fmnist", "data.fake=true", *SMALL], tmp_path / "run")
    assert code == 0, err[-3000:]
    assert len((tmp_path / "run" / "metrics.csv").read_text().splitlines()) == 3
