"""Weights by hub id (issue 62): a tiny random RoBERTa, ViT and Swin saved under cache-shaped folders
(``models--org--name/snapshots/<rev>/`` + ``refs/main``) in a temporary ``HF_HOME`` are found by their ``org/name``
ids with no socket opened; ``$FL_WEIGHTS_ROOT/<name>`` still comes first; local files keep working."""
from __future__ import annotations

import socket

import pytest
import torch

from fl_lightning.data.info import DataInfo
from fl_lightning.models import build_model
from tests.helpers.cli import make_cfg
from tests.unit.data.test_hub_sources import snapshot

CIFAR10 = DataInfo((3, 32, 32), 10)
VIT_MICRO = ["model.net.embed_dim=48", "model.net.depth=2", "model.net.num_heads=3", "model.net.img_size=48"]
SWIN_MICRO = ["model.net.embed_dim=48", "model.net.depths=[2,2]", "model.net.num_heads=[3,6]",
              "model.net.window_size=4", "model.net.patch_size=auto", "model.net.img_size=auto"]


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("FL_WEIGHTS_ROOT", str(tmp_path / "weights"))
    monkeypatch.setenv("FL_DOWNLOAD", "0")

    def refuse(*args, **kwargs):
        raise AssertionError("a socket was opened")

    monkeypatch.setattr(socket, "socket", refuse)
    return tmp_path / "hf"


def net(model: str, *overrides: str, info: DataInfo = CIFAR10):
    return build_model(make_cfg([f"model={model}", *overrides]).model, info).net


def save(state: dict, path) -> None:
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in state.items()}, str(path))


@pytest.mark.parametrize("model, repo, micro, inner", [
    ("vit_base", "timm/vit_base_patch16_224.orig_in21k", VIT_MICRO, "vit"),
    ("swin_t", "timm/swin_tiny_patch4_window7_224.ms_in1k", SWIN_MICRO, "swin")])
def test_timm_ids_resolve_from_the_cache(home, model, repo, micro, inner):
    """The default id of model=vit_base / swin_t (no path given) loads the cached model.safetensors: every tensor but
    the fresh head equals the saved one."""
    src = getattr(net(model, *micro, "model.net.pretrained_path=null", info=DataInfo((3, 32, 32), 7)), inner)
    save(src.state_dict(), f"{snapshot(home, 'model', repo)}/model.safetensors")
    cfg = make_cfg([f"model={model}", *micro])
    assert cfg.model.net.pretrained_path == repo  # the paper's weights by default, as a hub id
    got = getattr(build_model(cfg.model, CIFAR10).net, inner).state_dict()
    want = src.state_dict()
    compared = [k for k in want if not k.startswith("head.") and "relative_position_index" not in k
                and "attn_mask" not in k]
    assert len(compared) > 10
    for k in compared:
        assert torch.equal(got[k], want[k]), k
    assert got["head.weight" if "head.weight" in got else "head.fc.weight"].shape[0] == 10


def test_fl_weights_root_comes_first(home, tmp_path):
    """``$FL_WEIGHTS_ROOT/<name>/model.safetensors`` wins over the cache (the old default's place)."""
    repo = "timm/vit_base_patch16_224.orig_in21k"
    cached = net("vit_base", *VIT_MICRO, "model.net.pretrained_path=null").vit.state_dict()
    save(cached, f"{snapshot(home, 'model', repo)}/model.safetensors")
    torch.manual_seed(1)
    local = net("vit_base", *VIT_MICRO, "model.net.pretrained_path=null").vit.state_dict()
    (tmp_path / "weights" / "vit_base_patch16_224.orig_in21k").mkdir(parents=True)
    save(local, tmp_path / "weights" / "vit_base_patch16_224.orig_in21k" / "model.safetensors")
    got = net("vit_base", *VIT_MICRO).vit.state_dict()
    assert torch.equal(got["blocks.0.attn.qkv.weight"], local["blocks.0.attn.qkv.weight"])
    assert not torch.equal(got["blocks.0.attn.qkv.weight"], cached["blocks.0.attn.qkv.weight"])


def test_swin_old_local_file_name_still_comes_first(home, tmp_path):
    """The old default ``$FL_WEIGHTS_ROOT/swin_tiny_patch4_window7_224.pth`` (the Microsoft checkpoint's name) is
    read before the cache when the id is the default."""
    src = net("swin_t", *SWIN_MICRO, "model.net.pretrained_path=null").swin
    (tmp_path / "weights").mkdir()
    torch.save({"model": src.state_dict()}, tmp_path / "weights" / "swin_tiny_patch4_window7_224.pth")
    got = net("swin_t", *SWIN_MICRO).swin.state_dict()
    assert torch.equal(got["layers.0.blocks.0.attn.qkv.weight"], src.state_dict()["layers.0.blocks.0.attn.qkv.weight"])


def test_roberta_by_org_name_id(home, tmp_path):
    """``FacebookAI/roberta-base`` (the hub's current name, with a slash) loads from the cache offline; the frozen
    backbone equals the saved weights."""
    from transformers import AutoModelForSequenceClassification

    from fl_lightning.models.roberta_lora import roberta_lora
    from tests.unit.data.test_text import _tiny_roberta, _tokenizer

    _tokenizer(tmp_path / "tok")
    snap = snapshot(home, "model", "FacebookAI/roberta-base")
    _tiny_roberta(snap, tmp_path / "tok")
    model = roberta_lora(DataInfo(num_classes=2), "FacebookAI/roberta-base")
    src = AutoModelForSequenceClassification.from_pretrained(snap, local_files_only=True)
    w = model.base_model.model.roberta.encoder.layer[1].attention.self.key.base_layer.weight
    assert torch.equal(w, src.roberta.encoder.layer[1].attention.self.key.weight)


def test_a_local_file_keeps_working(home, tmp_path):
    src = net("vit_base", *VIT_MICRO, "model.net.pretrained_path=null").vit.state_dict()
    save(src, tmp_path / "w.safetensors")
    got = net("vit_base", *VIT_MICRO, f"model.net.pretrained_path={tmp_path / 'w.safetensors'}").vit.state_dict()
    assert torch.equal(got["pos_embed"], src["pos_embed"])
