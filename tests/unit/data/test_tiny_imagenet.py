"""Tiny-ImageNet from a fabricated folder in the official layout (train/<wnid>/images/*.JPEG, val/val_annotations.txt,
wnids.txt) through the real loader, into a 2-round federated run via the CLI; missing files and bad data keys are
one-line errors naming the key and the file."""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from fl_lightning.data.tiny_imagenet import tiny_imagenet
from tests.helpers.cli import cli_in_process, one_line_error, run_cli

WNIDS = ["n01443537", "n01629819", "n01641577"]
SMALL = ["data=tiny_imagenet", "fl.num_clients=3", "fl.clients_per_round=2", "fl.rounds=2", "fl.local_steps=2",
         "fl.eval_every=1", "data.batch_size=4", "data.partition.min_size=1", "trainer.progress=false",
         "trainer.accelerator=cpu"]


def write_tiny_imagenet(root, per_class=6, val_per_class=2, side=64) -> str:
    """A miniature tiny-imagenet-200 folder: JPEGs (one greyscale per class) and the official text files."""
    from PIL import Image

    rng = np.random.default_rng(0)
    base = os.path.join(root, "tiny-imagenet-200")
    os.makedirs(os.path.join(base, "val", "images"))
    with open(os.path.join(base, "wnids.txt"), "w") as f:
        f.write("\n".join(WNIDS) + "\n")
    lines = []
    for c, w in enumerate(WNIDS):
        d = os.path.join(base, "train", w, "images")
        os.makedirs(d)
        for i in range(per_class):
            a = rng.integers(0, 256, (side, side, 3), dtype=np.uint8)
            img = Image.fromarray(a[..., 0], "L") if i == 0 else Image.fromarray(a, "RGB")
            img.save(os.path.join(d, f"{w}_{i}.JPEG"), "JPEG")
        with open(os.path.join(base, "train", w, f"{w}_boxes.txt"), "w") as f:
            f.write("")
        for i in range(val_per_class):
            name = f"val_{c * val_per_class + i}.JPEG"
            Image.fromarray(rng.integers(0, 256, (side, side, 3), dtype=np.uint8), "RGB").save(
                os.path.join(base, "val", "images", name), "JPEG")
            lines.append(f"{name}\t{w}\t0\t0\t{side - 1}\t{side - 1}")
    with open(os.path.join(base, "val", "val_annotations.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return base


def test_loader_reads_the_official_layout(tmp_path):
    write_tiny_imagenet(str(tmp_path))
    train, test, info = tiny_imagenet(str(tmp_path))
    assert info.input_shape == (3, 64, 64) and info.num_classes == 3
    assert len(train) == 18 and len(test) == 6
    assert train.tensors["x"].dtype.is_floating_point is False and sorted(set(test.labels.tolist())) == [0, 1, 2]
    assert test.labels.tolist() == [0, 0, 1, 1, 2, 2]  # val_annotations order, label = line of wnids.txt
    b = test.batch(torch.arange(2), "cpu")
    assert b["x"].shape == (2, 3, 64, 64) and b["x"].dtype.is_floating_point
    # root may be the tiny-imagenet-200 folder itself
    assert len(tiny_imagenet(str(tmp_path / "tiny-imagenet-200"))[0]) == 18


@pytest.mark.slow
def test_two_rounds_through_the_cli(tmp_path):
    write_tiny_imagenet(str(tmp_path / "data"))
    run = tmp_path / "run"
    p = run_cli([*SMALL, f"data.root={tmp_path / 'data'}", "model=cnn_fedavg", f"hydra.run.dir={run}"])
    assert p.returncode == 0, p.stderr[-3000:]
    assert len((run / "metrics.csv").read_text().splitlines()) == 3


@pytest.mark.parametrize("remove,needle", [
    ("val/val_annotations.txt", "val_annotations.txt"),
    ("wnids.txt", "wnids.txt"),
    (f"train/{WNIDS[1]}", f"train/{WNIDS[1]}/images"),
])
def test_missing_file_is_one_line_naming_it(remove, needle, tmp_path):
    import shutil

    base = write_tiny_imagenet(str(tmp_path / "data"))
    target = os.path.join(base, remove)
    shutil.rmtree(target) if os.path.isdir(target) else os.remove(target)
    p = cli_in_process([*SMALL, f"data.root={tmp_path / 'data'}", "model=cnn_fedavg"], tmp_path / "run")
    one_line_error(p, "data.root:", needle, "tiny-imagenet-200.zip")


@pytest.mark.parametrize("overrides,needle", [
    (["data=tiny_imagenet", "data.normalize=cifar"], "data.normalize:"),
    (["data=tiny_imagenet", "data.image_size=0"], "data.image_size:"),
    (["data=cifar10", "data.download=maybe"], "data.download:"),
    (["data=cifar100", "data.normalize={mean:[0.5],std:[0.5]}"], "data.normalize:"),
])
def test_bad_data_key_is_one_line(overrides, needle, tmp_path):
    write_tiny_imagenet(str(tmp_path / "data"))
    p = cli_in_process([*SMALL[1:], *overrides, f"data.root={tmp_path / 'data'}", "model=cnn_fedavg"], tmp_path / "run")
    one_line_error(p, needle, "fix:")


def test_normalize_options(tmp_path):
    from fl_lightning.data.vision import IMAGENET_MEAN_STD

    write_tiny_imagenet(str(tmp_path))
    _, test, _ = tiny_imagenet(str(tmp_path), normalize="imagenet")
    assert test.transform.mean.flatten().tolist() == pytest.approx(list(IMAGENET_MEAN_STD[0]))
    _, test, _ = tiny_imagenet(str(tmp_path), normalize={"mean": [0.5, 0.5, 0.5], "std": [0.25, 0.25, 0.25]})
    assert test.transform.std.flatten().tolist() == [0.25] * 3


@pytest.mark.slow
def test_swin_experiment_on_a_tiny_imagenet_folder(tmp_path):
    """Seed 004 Table 3's Tiny-ImageNet setting, shrunk: local weights file, fresh head, inputs resized in the net."""
    from tests.unit.models.test_vision_models import _tiny_weights

    write_tiny_imagenet(str(tmp_path / "data"))
    f = tmp_path / "w.pth"
    _tiny_weights(str(f))
    run = tmp_path / "run"
    small = [o for o in SMALL[1:] if not o.startswith("data.partition.min_size")]  # dirichlet_per_client has none
    p = run_cli(["experiment=fedmuon_swin_tiny_imagenet", *small, f"data.root={tmp_path / 'data'}",
                 "model=swin_micro", f"model.net.pretrained_path={f}", "model.net.img_size=32", "model.net.lora=true",
                 "method.ns_dtype=null", f"hydra.run.dir={run}"])
    assert p.returncode == 0, p.stderr[-3000:]
    assert len((run / "metrics.csv").read_text().splitlines()) == 3
