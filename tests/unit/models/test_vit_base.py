"""model=vit_base (seed 001 Table 2's pretrained ViT-B/16): the real architecture's parameter count against an
independent formula, local weights (safetensors file or hub folder) loaded with a fresh head, the in-network resize,
one FL round from a weights file through the CLI machinery, and one-line errors for a missing or mismatched file.
The mechanics tests use a micro variant (dim 48, depth 2, 3 heads, patch 16 at 48 px) of the same code."""
from __future__ import annotations

import pytest
import torch

from fl_lightning.data.info import DataInfo
from fl_lightning.models import build_model
from tests.helpers.cli import build_error, cli_in_process, make_cfg
from tests.unit.data.test_real_formats import write_cifar

CIFAR10, CIFAR100 = DataInfo((3, 32, 32), 10), DataInfo((3, 32, 32), 100)
MICRO = ["model.net.embed_dim=48", "model.net.depth=2", "model.net.num_heads=3", "model.net.img_size=48"]
ONE_ROUND = ["fl.num_clients=4", "fl.clients_per_round=1", "fl.rounds=1", "fl.local_steps=1", "fl.eval_every=1",
             "trainer.progress=false", "trainer.accelerator=cpu"]


def net(info: DataInfo, *overrides: str):
    """``model=vit_base`` as the run builds it (the ResizedViT inside the ClassifierModule)."""
    return build_model(make_cfg(["model=vit_base", *overrides]).model, info).net


def vit_count(classes: int, channels=3, patch=16, dim=768, depth=12, mlp=4, img=224) -> int:
    """ViT parameters from the architecture (Dosovitskiy et al. 2021, Eq. 1-4), written out independently of timm."""
    tokens = (img // patch) ** 2 + 1                       # patches + CLS
    patch_embed = dim * channels * patch * patch + dim     # conv weight + bias
    cls_pos = dim + tokens * dim                           # cls_token, pos_embed
    block = (2 * dim                                       # LN 1
             + dim * 3 * dim + 3 * dim                     # qkv (with bias)
             + dim * dim + dim                             # attention output projection
             + 2 * dim                                     # LN 2
             + dim * mlp * dim + mlp * dim                 # MLP fc1
             + mlp * dim * dim + dim)                      # MLP fc2
    return patch_embed + cls_pos + depth * block + 2 * dim + dim * classes + classes   # final LN, head


def test_parameter_count_is_vit_b16s():
    assert vit_count(1000) == 86_567_656                   # ViT-B/16's published count (1000-class head)
    with torch.device("meta"):                             # the real architecture, without allocating 344 MB
        m1000 = net(DataInfo((3, 32, 32), 1000), "model.net.pretrained_path=null")
        m100 = net(CIFAR100, "model.net.pretrained_path=null")
    assert sum(p.numel() for p in m1000.parameters()) == 86_567_656
    assert sum(p.numel() for p in m100.parameters()) == vit_count(100) == 85_875_556
    v = m100.vit
    assert v.patch_embed.proj.kernel_size == (16, 16) and v.pos_embed.shape == (1, 197, 768) and len(v.blocks) == 12
    assert v.blocks[0].attn.num_heads == 12 and v.norm.eps == 1e-6 and m100.size == 224


def test_inputs_are_resized_inside_the_network():
    m = net(CIFAR10, *MICRO, "model.net.pretrained_path=null").eval()
    assert m.size == 48 and m.vit.patch_embed.img_size == (48, 48)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        want = m.vit(torch.nn.functional.interpolate(x, size=(48, 48), mode="bilinear", align_corners=False))
        assert torch.equal(m(x), want) and want.shape == (2, 10)
    assert net(DataInfo((3, 48, 48), 10), *MICRO, "model.net.pretrained_path=null").size is None  # already 48 px


def _weights(path, classes=10, **extra) -> dict:
    """A 'pretrained' file with timm's key names, saved from a freshly built micro ViT (+ ``extra`` tensors)."""
    sd = {k: v.contiguous() for k, v in net(DataInfo((3, 32, 32), classes), *MICRO, "model.net.pretrained_path=null")
          .vit.state_dict().items()}
    sd.update(extra)
    if str(path).endswith(".safetensors"):
        from safetensors.torch import save_file

        save_file(sd, str(path))
    else:
        torch.save(sd, str(path))
    return sd


@pytest.mark.parametrize("layout", ["file.safetensors", "hub_folder/pytorch_model.bin"])
def test_loads_local_weights_with_a_fresh_head(tmp_path, layout):
    f = tmp_path / layout
    f.parent.mkdir(exist_ok=True)
    # the original ImageNet-21k file also holds a representation layer, which timm (and this loader) drop
    sd = _weights(f, classes=10, **{"pre_logits.fc.weight": torch.ones(48, 48), "pre_logits.fc.bias": torch.ones(48)})
    where = f.parent if layout.startswith("hub_folder") else f
    m = net(CIFAR10, *MICRO, f"model.net.pretrained_path={where}").vit
    got = m.state_dict()
    body = [k for k in sd if not k.startswith(("head.", "pre_logits."))]
    assert len(body) == len(got) - 2 and all(torch.equal(got[k], sd[k]) for k in body)
    # same class count, yet the head is timm's fresh one, not the file's
    assert got["head.weight"].shape == (10, 48) and not torch.equal(got["head.weight"], sd["head.weight"])
    if layout.endswith(".safetensors"):  # another class count: the file's head does not fit and is not loaded either
        assert net(CIFAR100, *MICRO, f"model.net.pretrained_path={where}").vit.head.weight.shape == (100, 48)


def test_one_round_from_a_weights_file_on_cifar_files(tmp_path):
    """Table 2's shape at toy size: CIFAR-100 files, local weights, 32 -> 48 px resize, the weights' mean/std."""
    root = tmp_path / "data"
    root.mkdir()
    write_cifar(str(root), 100, n_test=8)
    f = tmp_path / "w.safetensors"
    _weights(f, classes=7)
    code, err = cli_in_process(["data=cifar100", f"data.root={root}", "data.batch_size=2", "data.eval_batch_size=8",
                                "data.normalize={mean: [0.5, 0.5, 0.5], std: [0.5, 0.5, 0.5]}", "model=vit_base",
                                *MICRO, f"model.net.pretrained_path={f}", "method=fedpac_soap", *ONE_ROUND],
                               tmp_path / "run")
    assert code == 0, err[-3000:]
    assert len((tmp_path / "run" / "metrics.csv").read_text().splitlines()) == 2



@pytest.mark.slow
@pytest.mark.parametrize("method", ["fedpac_muon", "scaffold"])
def test_table2_experiment_on_cifar_files(tmp_path, method):
    """conf/experiment/fedpac_vit_base_cifar100 itself, shrunk: 4 clients, 2 rounds, the micro ViT from a file."""
    root = tmp_path / "data"
    root.mkdir()
    write_cifar(str(root), 100, n_test=8)
    f = tmp_path / "w.safetensors"
    _weights(f, classes=7)
    fp32_ns = ["method.ns_dtype=null"] if method == "fedpac_muon" else []  # bf16 matmuls are emulated on most CPUs
    code, err = cli_in_process(["experiment=fedpac_vit_base_cifar100", f"method={method}", f"data.root={root}",
                                "data.batch_size=2", *MICRO, f"model.net.pretrained_path={f}", *fp32_ns, *ONE_ROUND,
                                "fl.rounds=2"], tmp_path / "run")
    assert code == 0, err[-3000:]
    assert len((tmp_path / "run" / "metrics.csv").read_text().splitlines()) == 3

def test_missing_weights_file_is_one_line_naming_the_file_and_the_download(tmp_path, monkeypatch):
    """The default is the hub id: not under $FL_WEIGHTS_ROOT and not in the Hugging Face cache, it is one line naming
    the id, the cache folder looked in and the commands that fetch it."""
    monkeypatch.setenv("FL_WEIGHTS_ROOT", str(tmp_path / "weights"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    code, err = cli_in_process(["model=vit_base", *MICRO, *ONE_ROUND], tmp_path / "run")
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert ("model.net.pretrained_path: the weights timm/vit_base_patch16_224.orig_in21k is not in the Hugging Face "
            f"cache (looked in {tmp_path}/hf/hub/models--timm--vit_base_patch16_224.orig_in21k)") in lines[0], lines[0]
    assert "download=true" in lines[0] and "hf download timm/vit_base_patch16_224.orig_in21k model.safetensors" \
        in lines[0] and "fix:" in lines[0], lines[0]


def test_mismatched_checkpoints_are_one_line(tmp_path):
    f = tmp_path / "w.safetensors"
    _weights(f)
    msg = build_error(["model=vit_base", *MICRO, "model.net.embed_dim=96", f"model.net.pretrained_path={f}",
                       *ONE_ROUND], tmp_path / "a")
    assert "model.net.pretrained_path:" in msg and "does not fit this ViT: shapes differ" in msg, msg
    from safetensors.torch import save_file

    save_file({"encoder.layer.0.weight": torch.zeros(2)}, str(tmp_path / "other.safetensors"))
    msg = build_error(["model=vit_base", *MICRO, f"model.net.pretrained_path={tmp_path / 'other.safetensors'}",
                       *ONE_ROUND], tmp_path / "b")
    assert "does not fit this ViT: missing" in msg and "fix:" in msg, msg
    (tmp_path / "empty").mkdir()
    msg = build_error(["model=vit_base", *MICRO, f"model.net.pretrained_path={tmp_path / 'empty'}", *ONE_ROUND],
                      tmp_path / "c")
    assert "holds neither model.safetensors nor pytorch_model.bin" in msg, msg


@pytest.mark.parametrize("override,needle", [
    ("model.net.img_size=40", "model.net.img_size:"),
    ("model.net.num_heads=5", "model.net.num_heads:"),
])
def test_bad_vit_base_key_is_one_line(override, needle, tmp_path):
    msg = build_error(["model=vit_base", *MICRO, "model.net.pretrained_path=null", override, *ONE_ROUND], tmp_path)
    assert needle in msg and "fix:" in msg, msg
