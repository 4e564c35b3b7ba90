"""Every experiment's config hash as it was before hub ids and ``data.source`` (issue 62), recorded from that commit
in experiment_hashes.json: unchanged, except the six whose new defaults (a hub id for the pretrained weights or the
tokenizer, ``data.source: hub``) change what they read, named in docs/decisions.md. A run of any other experiment
resumes across the change."""
from __future__ import annotations

import glob
import json
import os

import pytest

from tests.helpers.cli import CONF, make_cfg

HASHES = json.load(open(os.path.join(os.path.dirname(__file__), "experiment_hashes.json")))
CHANGED = {"fedmuon_swin_cifar100", "fedmuon_swin_tiny_imagenet", "fedpac_llama_c4", "fedpac_vit_base_cifar100",
           "fedpac_vit_base_tiny_imagenet", "glue_lora"}


@pytest.fixture(autouse=True)
def no_env(monkeypatch):
    """The yamls' ${oc.env:...} defaults as on a machine that sets none."""
    for k in list(os.environ):
        if k.startswith("FL_"):
            monkeypatch.delenv(k)


def test_the_record_covers_every_experiment():
    names = {os.path.relpath(p, os.path.join(CONF, "experiment"))[:-5]
             for p in glob.glob(os.path.join(CONF, "experiment", "**", "*.yaml"), recursive=True)}
    unsweepable = {"results/seed003_lr_grid"}  # its method.lr reads a table keyed by the sweep's method: no plain compose
    assert names - unsweepable == set(HASHES["unchanged"]) | set(HASHES["changed"])
    assert set(HASHES["changed"]) == CHANGED


@pytest.mark.slow
def test_every_experiment_hash_is_unchanged_but_the_named_six():
    from fl_lightning.config import config_hash

    for name, before in HASHES["unchanged"].items():
        assert config_hash(make_cfg([f"experiment={name}"])) == before, name
    for name, pair in HASHES["changed"].items():
        now = config_hash(make_cfg([f"experiment={name}"]))
        assert now == pair["after"] and now != pair["before"], name
