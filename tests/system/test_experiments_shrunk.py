"""Every ``experiment=`` config runs end to end, shrunk: its own method, model family, data loader, partition and
tables, on tiny files in the real formats where the real data would be (two rounds of two clients, a few steps,
tiny widths). A paper table must not crash after hours on a cluster because of a setting no test ran."""
from __future__ import annotations

import os

import pytest

from tests.helpers.cli import CONF, cli_in_process, make_cfg
from tests.helpers.text_files import bpe_tokenizer, c4_shards, leaf_shakespeare

pytestmark = pytest.mark.slow

EXPERIMENTS = sorted(f[:-5] for f in os.listdir(os.path.join(CONF, "experiment")) if f.endswith(".yaml"))
SMALL = ["fl.rounds=2", "fl.num_clients=4", "fl.clients_per_round=2", "fl.local_steps=3", "fl.local_epochs=null", "fl.eval_every=1",
         "trainer.progress=false", "trainer.accelerator=cpu", "trainer.threads=1", "data.batch_size=4"]
# per model family: tiny widths (what could break is the wiring, not the size)
MODELS = {
    "cnn_fedsmu": ["model.net.filters=4", "model.net.hidden=[8,8]"],
    "resnet18": ["model.net.width=4"],
    "resnet18_gn": ["model.net.width=4"],
    "vit_tiny": ["model.net.depth=1", "model.net.embed_dim=24", "model.net.num_heads=2"],
    "vit_tiny_fedpac": ["model.net.depth=1", "model.net.embed_dim=24", "model.net.num_heads=2"],
    "swin_t": ["model.net.pretrained_path=null", "model.net.embed_dim=12", "model.net.depths=[1]",
               "model.net.num_heads=[1]", "model.net.window_size=4", "model.net.img_size=32"],
    "vit_base": ["model.net.pretrained_path=null", "model.net.embed_dim=24", "model.net.depth=1",
                 "model.net.num_heads=2", "model.net.img_size=32"],
    "elman_rnn": ["model.net.hidden=8", "model.net.embed_dim=8"],
    "char_lstm": ["model.net.hidden=8"],
    "llama_60m": ["model.net.layers=1", "model.net.hidden_size=16", "model.net.heads=2",
                  "model.net.intermediate_size=32"],
}


def experiment_setting(name: str):
    cfg = make_cfg([f"experiment={name}"], "unused")
    return str(cfg.data.name), str(cfg.model.name), cfg


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Every dataset the experiments read, tiny, in its real format (written once)."""
    from tests.unit.data.test_real_formats import write_cifar, write_idx
    from tests.unit.data.test_text import _glue_dir, _sentiment140, _tiny_roberta, _tokenizer
    from tests.unit.data.test_tiny_imagenet import write_tiny_imagenet

    root = tmp_path_factory.mktemp("data")
    vision = root / "vision"
    vision.mkdir()
    write_cifar(str(vision), 10)
    write_cifar(str(vision), 100)
    write_idx(str(vision), "FashionMNIST")
    write_idx(str(vision), "MNIST")
    write_tiny_imagenet(str(vision))
    _glue_dir(str(root / "glue"))
    _tokenizer(root / "tok")
    _tiny_roberta(root / "roberta", root / "tok")
    _sentiment140(str(root / "s140"))
    roles = {"A": (30, 12), "B": (25, 9), "C": (22, 10)}
    return {"vision": str(vision), "glue": str(root / "glue"), "roberta": str(root / "roberta"),
            "s140": str(root / "s140"), "leaf": leaf_shakespeare(str(root / "leaf"), roles),
            "c4": c4_shards(str(root / "c4")), "c4_tok": bpe_tokenizer(str(root / "c4tok")),
            "cache": str(root / "cache")}


def data_overrides(data: str, files: dict, cfg) -> list[str]:
    if data in ("cifar10", "cifar100", "fashion_mnist", "mnist", "tiny_imagenet"):
        # a Dirichlet partition of 100 images: let a client hold a single one
        return [f"data.root={files['vision']}", *(["data.partition.min_size=1"] if "min_size" in cfg.data.partition else [])]
    if data == "glue":
        return ["data.source=tsv", f"data.root={files['glue']}", f"data.tokenizer_path={files['roberta']}", "data.task=mrpc",
                f"data.cache_dir={files['cache']}", f"model.net.pretrained_path={files['roberta']}"]
    if data == "sentiment140":
        return [f"data.root={files['s140']}", "data.fraction=0.5", f"data.cache_dir={files['cache']}"]
    if data == "shakespeare":
        return [f"data.root={files['leaf']}", "data.train_per_client=20", "data.test_per_client=8", "fl.num_clients=3"]
    if data == "c4":
        return ["data.source=files", f"data.root={files['c4']}", f"data.tokenizer_path={files['c4_tok']}",
                f"data.cache_dir={files['cache']}",
                "data.seq_len=16", "data.eval_sequences=8"]
    return []  # digits: embedded


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_experiment_runs_shrunk(experiment, files, tmp_path):
    data, model, cfg = experiment_setting(experiment)
    over = [f"experiment={experiment}", *SMALL, *data_overrides(data, files, cfg), *MODELS.get(model, [])]
    run = tmp_path / "run"
    code, err = cli_in_process(over, run)
    assert code == 0, f"{experiment} ({data}, {model}): {err[-3000:]}"
    lines = (run / "metrics.csv").read_text().splitlines()
    assert len(lines) == 3, lines  # header + 2 evaluated rounds
    assert (run / "summary.json").exists()
