"""The papers' vision models (issue 8): parameter counts against the papers' (or derived) figures, forward shapes,
Muon's parameter split on the ViT, BatchNorm statistics in the communicated state, one-line errors for every
builder key, and 1-round CLI runs on the digits or on tiny CIFAR files in the real format."""
from __future__ import annotations

import pytest
import torch

from fl_lightning.data.info import DataInfo
from fl_lightning.models import build_model
from tests.helpers.cli import build_error, cli_in_process, make_cfg, one_line_error, run_cli
from tests.unit.data.test_real_formats import write_cifar

CIFAR10, CIFAR100, DIGITS = DataInfo((3, 32, 32), 10), DataInfo((3, 32, 32), 100), DataInfo((1, 8, 8), 10)
ONE_ROUND = ["fl.num_clients=4", "fl.clients_per_round=2", "fl.rounds=1", "fl.local_steps=2", "fl.eval_every=1",
             "trainer.progress=false", "trainer.accelerator=cpu"]


def net(model: str, info: DataInfo, *overrides: str):
    """The ``model=<name>`` yaml built as the run builds it; returns the network inside the ClassifierModule."""
    return build_model(make_cfg([f"model={model}", *overrides]).model, info).net


def n_params(m, trainable_only=False) -> int:
    return sum(p.numel() for p in m.parameters() if p.requires_grad or not trainable_only)


def n_weights(m) -> int:
    """Weights without biases: the count seed 002 reports (App. E.4)."""
    return sum(p.numel() for n, p in m.named_parameters() if not n.endswith("bias"))


# ---------------------------------------------------------------------------------------------- parameter counts

@pytest.mark.parametrize("model,info,overrides,count", [
    ("vit_tiny", CIFAR100, [], 2_710_948),                        # seed 004 Table 2 (issue 8 figure)
    ("vit_cifar", CIFAR10, [], 9_523_722),                        # seed 003's ViT (derived from its layout)
    ("cnn_fedavg", CIFAR10, [], 878_538),                         # McMahan et al.'s CNN on CIFAR-10
    ("cnn_fedavg", DataInfo((1, 28, 28), 10), ["model.net.padding=2"], 1_663_370),  # ... the paper's MNIST count
    ("resnet18", CIFAR100, ["model.net.norm=bn"], 11_220_132),
    ("resnet18", CIFAR100, ["model.net.norm=gn_stem_bn_blocks"], 11_220_132),
    ("resnet18_gn", CIFAR100, [], 11_220_132),
    ("resnet18", CIFAR10, ["model.net.stem=imagenet"], 11_181_642),  # = torchvision resnet18(num_classes=10)
])
def test_parameter_count(model, info, overrides, count):
    assert n_params(net(model, info, *overrides)) == count


@pytest.mark.parametrize("model,weights,with_biases", [("cnn_fedsmu", 797_248, 797_962), ("cnn_fedsmu_128", 1_723_648, None)])
def test_fedsmu_cnn_counts_weights_without_biases(model, weights, with_biases):
    """Seed 002's d1 / d2 (App. E.4, Table 9) count weights only; the test checks that count (and the total)."""
    m = net(model, CIFAR10)
    assert n_weights(m) == weights
    if with_biases:
        assert n_params(m) == with_biases


def test_resnet18_imagenet_stem_matches_torchvision():
    import torchvision

    assert n_params(net("resnet18", CIFAR10, "model.net.stem=imagenet", "model.net.norm=bn")) == \
        n_params(torchvision.models.resnet18(num_classes=10))


# ---------------------------------------------------------------------------------------------- ViT specifics

def test_vit_tiny_is_seed_004s_transformer():
    m = net("vit_tiny", CIFAR100)
    assert m.patch_embed.patch_size == (4, 4) and m.patch_embed.num_patches == 64
    assert len(m.blocks) == 6 and m.embed_dim == 192 and m.blocks[0].attn.num_heads == 3
    assert m.blocks[0].mlp.fc1.out_features == 4 * 192 and m.blocks[0].attn.qkv.bias is not None
    assert m.cls_token is not None and m.pos_embed.shape == (1, 65, 192) and m.norm.eps == 1e-6
    w = m.blocks[0].attn.qkv.weight.detach()
    assert abs(float(w.std()) - 0.02) < 0.002  # timm's trunc_normal_(std=0.02) (cut at +-2, i.e. 100 std)
    assert float(m.blocks[0].attn.qkv.bias.detach().abs().max()) == 0.0


def test_vit_tiny_on_digits_uses_patch_2_and_the_data_channels():
    m = net("vit_tiny", DIGITS)
    assert m.patch_embed.patch_size == (2, 2) and m.patch_embed.num_patches == 16
    assert m.patch_embed.proj.in_channels == 1
    assert m(torch.randn(3, 1, 8, 8)).shape == (3, 10)


def test_vit_tiny_depth_12_is_deit_tiny_depth():
    assert len(net("vit_tiny", CIFAR100, "model.net.depth=12").blocks) == 12


def test_vit_tiny_fedpac_variant():
    """Seed 001: fixed sinusoidal positions (frozen: not trained, not communicated), Xavier, dropout 0.1."""
    m = net("vit_tiny_fedpac", CIFAR100)
    assert not m.pos_embed.requires_grad
    assert torch.allclose(m.pos_embed[0, 0, 0::2], torch.zeros(96)) and torch.allclose(m.pos_embed[0, 0, 1::2], torch.ones(96))
    assert n_params(m, trainable_only=True) == 2_710_948 - 65 * 192
    assert m.blocks[0].attn.attn_drop.p == 0.1 and m.blocks[0].mlp.drop1.p == 0.1
    w = m.blocks[0].mlp.fc1.weight.detach()
    bound = (6 / (w.shape[0] + w.shape[1])) ** 0.5
    assert float(w.abs().max()) <= bound and float(w.abs().max()) > 0.9 * bound  # Xavier-uniform


def test_muon_split_of_vit_follows_seed_004s_code():
    """Every ndim >= 2 param in Muon (patch-embed conv, cls_token, pos_embed, block and head weights), the rest in
    AdamW (spec 004 §3.1); a frozen sincos table is in neither."""
    from fl_lightning.optim.muon import muon_param_names

    m = net("vit_tiny", DIGITS)
    muon, aux = muon_param_names(m)
    assert {"patch_embed.proj.weight", "cls_token", "pos_embed", "blocks.0.attn.qkv.weight", "head.weight"} <= set(muon)
    assert all(p.ndim >= 2 for n, p in m.named_parameters() if n in muon)
    assert {"patch_embed.proj.bias", "blocks.0.norm1.weight", "head.bias"} <= set(aux)
    assert len(muon) + len(aux) == len(list(m.parameters()))
    f = net("vit_tiny_fedpac", DIGITS)
    muon, aux = muon_param_names(f)
    assert "pos_embed" not in muon + aux


def test_vit_trains_one_muon_step_with_3d_params():
    from fl_lightning.optim.muon import Muon, split_muon_params

    m = net("vit_tiny", DIGITS, "model.net.depth=1")
    opt = Muon(split_muon_params(m), lr=0.01, aux="adamw", ns_dtype=torch.float32)
    before = {n: p.detach().clone() for n, p in m.named_parameters()}
    torch.nn.functional.cross_entropy(m(torch.randn(4, 1, 8, 8)), torch.tensor([0, 1, 2, 3])).backward()
    opt.step()
    assert not torch.equal(before["pos_embed"], m.pos_embed) and not torch.equal(before["cls_token"], m.cls_token)


@pytest.mark.parametrize("model,info,shape", [
    ("vit_cifar", CIFAR10, (2, 10)), ("cnn_fedsmu", CIFAR100, (2, 100)), ("cnn_fedavg", CIFAR10, (2, 10)),
    ("resnet18", CIFAR10, (2, 10)),
])
def test_forward_shape(model, info, shape):
    m = net(model, info)
    assert m(torch.randn(2, *info.input_shape)).shape == shape


# ---------------------------------------------------------------------------------------------- BatchNorm in FL

def test_bn_running_statistics_are_communicated_and_averaged(tmp_path):
    """The loop's communicated state holds BN's float buffers; after a round the global running mean moved away
    from its initial zeros (the server averaged the clients' statistics)."""
    from tests.helpers.cli import build_loop

    root = tmp_path / "data"
    root.mkdir()
    write_cifar(str(root), 10)
    loop = build_loop(["data=cifar10", f"data.root={root}", "model=resnet18", "model.net.norm=bn", "model.net.width=8",
                       "data.batch_size=8", *ONE_ROUND], tmp_path / "run")
    keys = [k for k in loop.keys if "running_mean" in k or "running_var" in k]
    assert len(keys) == 2 * 20 and not any("num_batches_tracked" in k for k in loop.keys)
    k = "net.stem.1.running_mean" if "net.stem.1.running_mean" in loop.keys else keys[0]
    before = loop.global_params[k].clone()
    loop.run(progress_enabled=False)
    assert not torch.equal(before, loop.global_params[k])


# ---------------------------------------------------------------------------------------------- one-line errors

@pytest.mark.parametrize("overrides,needle", [
    (["model=vit_tiny", "model.net.patch_size=3"], "model.net.patch_size: 3 does not divide"),
    (["model=vit_tiny", "model.net.depth=0"], "model.net.depth:"),
    (["model=vit_tiny", "model.net.embed_dim=0"], "model.net.embed_dim:"),
    (["model=vit_tiny", "model.net.num_heads=5"], "model.net.num_heads:"),
    (["model=vit_tiny", "model.net.mlp_ratio=-1"], "model.net.mlp_ratio:"),
    (["model=vit_tiny", "model.net.pos_embed=rope"], "model.net.pos_embed:"),
    (["model=vit_tiny", "model.net.init=kaiming"], "model.net.init:"),
    (["model=vit_tiny", "model.net.dropout=1.5"], "model.net.dropout:"),
    (["model=vit_cifar", "model.net.dim_head=0"], "model.net.dim_head:"),
    (["model=vit_cifar", "model.net.emb_dropout=-0.1"], "model.net.emb_dropout:"),
    (["model=cnn_fedsmu"], "model.net: cnn_fedsmu needs"),                       # 8x8 digits are too small
    (["model=cnn_fedsmu", "model.net.filters=0"], "model.net"),
    (["model=cnn_fedavg"], "model.net.padding: 0 leaves no features"),           # digits need padding 2
    (["model=cnn_fedavg", "model.net.padding=7"], "model.net.padding:"),
    (["model=resnet18", "model.net.norm=ln"], "model.net.norm:"),
    (["model=resnet18", "model.net.stem=vgg"], "model.net.stem:"),
])
def test_bad_model_key_is_one_line(overrides, needle, tmp_path):
    msg = build_error([*overrides, *ONE_ROUND], tmp_path)
    assert needle in msg and "fix:" in msg, msg


# ---------------------------------------------------------------------------------------------- 1 round via the CLI

@pytest.mark.parametrize("overrides", [
    ["model=vit_tiny", "model.net.depth=2"],
    ["model=vit_tiny_fedpac", "model.net.depth=2"],
    ["model=cnn_fedavg", "model.net.padding=2"],
])
def test_one_round_on_the_digits(overrides, tmp_path):
    code, err = cli_in_process([*overrides, *ONE_ROUND], tmp_path)
    assert code == 0, err[-3000:]
    assert len((tmp_path / "metrics.csv").read_text().splitlines()) == 2


@pytest.mark.parametrize("overrides", [
    ["model=cnn_fedsmu"], ["model=cnn_fedsmu_128", "data=cifar100"], ["model=cnn_fedavg"],
    ["model=vit_cifar", "model.net.dim=64", "model.net.depth=1", "model.net.mlp_dim=64", "model.net.heads=2",
     "model.net.dim_head=32"],
    ["model=vit_tiny", "model.net.depth=1"],
    pytest.param(["model=resnet18", "model.net.norm=bn", "model.net.width=8"], marks=pytest.mark.slow),
    pytest.param(["model=resnet18", "model.net.norm=gn_stem_bn_blocks", "model.net.width=8", "data=cifar100"],
                 marks=pytest.mark.slow),
    pytest.param(["model=resnet18", "model.net.stem=imagenet", "model.net.width=8"], marks=pytest.mark.slow),
])
def test_one_round_on_tiny_cifar_files(overrides, tmp_path):
    root = tmp_path / "data"
    root.mkdir()
    data = next((o.split("=")[1] for o in overrides if o.startswith("data=")), "cifar10")
    write_cifar(str(root), 100 if data == "cifar100" else 10)
    code, err = cli_in_process([f"data={data}", *[o for o in overrides if not o.startswith("data=")],
                                f"data.root={root}", "data.batch_size=8", *ONE_ROUND], tmp_path / "run")
    assert code == 0, err[-3000:]
    assert len((tmp_path / "run" / "metrics.csv").read_text().splitlines()) == 2


@pytest.mark.slow
def test_fedmuon_vit_tiny_one_round_on_the_digits(tmp_path):
    """docs/models.md's ViT-Tiny command, 1 round (fp32 Newton-Schulz: bf16 matmuls are emulated and slow on most CPUs)."""
    p = run_cli(["method=fedmuon", "model=vit_tiny", "method.ns_dtype=null", *ONE_ROUND, f"hydra.run.dir={tmp_path}"])
    assert p.returncode == 0, p.stderr[-3000:]


# ---------------------------------------------------------------------------------------------- Swin

def test_swin_t_count_and_lora_trainables():
    assert n_params(net("swin_t", CIFAR100, "model.net.pretrained_path=null")) == 27_596_254
    m = net("swin_t_lora", CIFAR100, "model.net.pretrained_path=null")
    trainable = [n for n, p in m.named_parameters() if p.requires_grad]
    assert all("lora_" in n or n.startswith("swin.head.") for n in trainable)
    assert any(n.endswith("attn.qkv.lora_A.default.weight") for n in trainable)
    assert any(n.endswith("attn.proj.lora_B.default.weight") for n in trainable)
    # 96 C per block (qkv: r*C + 3C*r, proj: 2 r*C, r = 16) over the 12 blocks, plus the 768 -> 100 head
    assert n_params(m, trainable_only=True) == 96 * (2 * 96 + 2 * 192 + 6 * 384 + 2 * 768) + 768 * 100 + 100


def test_swin_resizes_to_224_inside_the_network():
    m = net("swin_t", CIFAR10, "model.net.pretrained_path=null", "model.net.depths=[2]", "model.net.num_heads=[3]")
    assert m.size == 224 and m.swin.patch_embed.img_size == (224, 224)
    assert m(torch.randn(1, 3, 32, 32)).shape == (1, 10)


def _tiny_weights(path, classes=7, suffix=".pth"):
    """A 'pretrained' file saved from a random swin_micro (another head size, so the fresh head is exercised)."""
    src = net("swin_micro", DataInfo((3, 32, 32), classes))
    sd = src.swin.state_dict()
    if suffix == ".pth":
        torch.save({"model": sd}, path)
    else:
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in sd.items()}, path)
    return sd


@pytest.mark.parametrize("suffix", [".pth", ".safetensors"])
def test_swin_loads_local_weights_with_a_fresh_head(tmp_path, suffix):
    f = tmp_path / f"w{suffix}"
    sd = _tiny_weights(str(f), suffix=suffix)
    m = net("swin_micro", CIFAR10, f"model.net.pretrained_path={f}", "model.net.lora=true")
    base = m.swin.layers[0].blocks[0].attn.qkv.base_layer.weight
    assert torch.equal(base, sd["layers.0.blocks.0.attn.qkv.weight"]) and not base.requires_grad
    assert m.swin.head.fc.weight.shape == (10, 96) and m.swin.head.fc.weight.requires_grad


@pytest.mark.slow
def test_swin_weights_of_another_variant_are_one_line(tmp_path):
    f = tmp_path / "w.pth"
    _tiny_weights(str(f))
    one_line_error(run_cli(["model=swin_micro", f"model.net.pretrained_path={f}", "model.net.embed_dim=96",
                            *ONE_ROUND, f"hydra.run.dir={tmp_path / 'run'}"]),
                   "model.net.pretrained_path:", "does not fit this Swin")


@pytest.mark.parametrize("overrides,needle", [
    (["model=swin_t", "model.net.pretrained_path=/nowhere/swin_tiny_patch4_window7_224.pth"],
     "model.net.pretrained_path: no weights file at /nowhere/swin_tiny_patch4_window7_224.pth"),
    (["model=swin_micro", "model.net.lora=true", "model.net.lora_r=0"], "model.net.lora_r:"),
    (["model=swin_micro", "model.net.lora=true", "model.net.lora_alpha=-1"], "model.net.lora_alpha:"),
    (["model=swin_micro", "model.net.lora=true", "model.net.lora_dropout=2"], "model.net.lora_dropout:"),
    (["model=swin_micro", "model.net.lora=true", "model.net.lora_targets=[attn.nothing]"], "model.net.lora_targets:"),
    (["model=swin_micro", "model.net.lora=yes"], "model.net.lora:"),
    (["model=swin_micro", "model.net.resize=nearest"], "model.net.resize:"),
    (["model=swin_micro", "model.net.img_size=30"], "model.net.img_size:"),
    (["model=swin_micro", "model.net.num_heads=[3]"], "model.net.num_heads:"),
    (["model=swin_micro", "model.net.num_heads=[5,6]"], "model.net.num_heads:"),
    (["model=swin_micro", "model.net.window_size=0"], "model.net.window_size:"),
    (["model=swin_micro", "model.net.drop_path=1"], "model.net.drop_path:"),
])
def test_bad_swin_key_is_one_line(overrides, needle, tmp_path):
    msg = build_error([*overrides, *ONE_ROUND], tmp_path)
    assert needle in msg and "fix:" in msg, msg


@pytest.mark.slow
def test_a_model_key_error_through_the_cli(tmp_path):
    one_line_error(run_cli(["model=vit_tiny", "model.net.depth=0", *ONE_ROUND, f"hydra.run.dir={tmp_path}"]),
                   "model.net.depth:", "fix:")


@pytest.mark.slow
def test_swin_micro_one_round_on_the_digits(tmp_path):
    p = run_cli(["model=swin_micro", *ONE_ROUND, f"hydra.run.dir={tmp_path}"])
    assert p.returncode == 0, p.stderr[-3000:]


@pytest.mark.slow
def test_swin_lora_from_a_weights_file_two_rounds_on_cifar_files(tmp_path):
    """The Table 3 shape at toy size: local weights, LoRA, only adapters + head communicated."""
    root = tmp_path / "data"
    root.mkdir()
    write_cifar(str(root), 100)
    f = tmp_path / "w.pth"
    _tiny_weights(str(f))
    run = tmp_path / "run"
    p = run_cli(["data=cifar100", f"data.root={root}", "data.normalize=imagenet", "data.batch_size=8", "model=swin_micro",
                 f"model.net.pretrained_path={f}", "model.net.lora=true", "model.net.resize=resize_crop",
                 "model.net.img_size=64", *ONE_ROUND, "fl.rounds=2", f"hydra.run.dir={run}"])
    assert p.returncode == 0, p.stderr[-3000:]
    import json

    summary = json.loads((run / "summary.json").read_text())
    lora_head = n_params(net("swin_micro", CIFAR100, "model.net.lora=true"), trainable_only=True)
    # uplink per client and round = the trainable tensors only (float32), never the frozen backbone
    assert summary["uplink_bits"] == 2 * 2 * lora_head * 32
