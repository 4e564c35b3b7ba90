"""ViT-B/16 fine-tuned from ImageNet-21k weights, as seed 001 uses it for its Table 2 (Liu et al., "Taming
Preconditioner Drift: Unlocking the Potential of Second-Order Optimizers for Federated Learning on Non-IID Data"
(FedPAC), ICML submission, no arXiv id; Table 2, App. D.5, Table 9): "initialize from official ImageNet-22K
pre-trained weights (Dosovitskiy et al.)", "fine-tune all layers", images "resize[d] ... to 224x224 using bilinear
interpolation".

The network is timm's ``VisionTransformer`` with ``vit_base_patch16_224``'s layout (Dosovitskiy et al., "An Image is
Worth 16x16 Words", ICLR 2021, arXiv 2010.11929): patch 16, dim 768, depth 12, 12 heads, MLP ratio 4, qkv bias, CLS
token, learned positions, LayerNorm eps 1e-6; built locally (nothing from the hub), 86,567,656 parameters with a
1000-class head, 85,875,556 with CIFAR-100's 100 classes. Every weight is trained and communicated.

``pretrained_path``: a hub id (the default, ``timm/vit_base_patch16_224.orig_in21k``: its ``model.safetensors``
from ``$FL_WEIGHTS_ROOT/<name>/`` if there, else from the Hugging Face cache, fetched only with ``download=true``;
:mod:`fl_lightning.data.hub`), a local file, or a folder holding one (``model.safetensors``, else
``pytorch_model.bin``: a timm hub snapshot); ``.safetensors`` is read with safetensors, ``.bin`` / ``.pth`` / ``.pt`` with ``torch.load(...,
weights_only=True)`` (never a pickle of code). The default is timm's ``vit_base_patch16_224.orig_in21k`` (the
original Google ImageNet-21k ViT-B/16, the file the authors' ``vit_model.py`` names,
``jx_vit_base_patch16_224_in21k``); ``vit_base_patch16_224.augreg_in21k`` (what timm's old name
``vit_base_patch16_224_in21k`` now maps to) has the same tensor names and shapes. The classifier head (``head.*``, 0
or 21,843 classes in those files) and the original checkpoint's representation layer (``pre_logits.*``, which timm
dropped and the authors' code kept; see docs/decisions.md) are not loaded: the head is timm's fresh one for the
dataset's classes. Any other missing, unexpected or differently shaped tensor (another variant, another
``img_size`` or ``patch_size``, 1-channel data) is a one-line error, never a silent resample.

Inputs are resized inside the network (``F.interpolate``, bilinear) to ``img_size``, so the data stays on the device
at its own size (uint8 32x32 or 64x64, augmented and normalised there) and every batch has one static shape. Both
ImageNet-21k files expect mean = std = (0.5, 0.5, 0.5); per-channel normalisation commutes with bilinear resizing,
so normalising at the data's size (``data.normalize: {mean: [0.5, 0.5, 0.5], std: [0.5, 0.5, 0.5]}``) is the same
as after.
"""
from __future__ import annotations

import os
from functools import partial
from typing import Annotated

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..data.info import DataInfo
from ..errors import ConfigError
from ..config import Range
from ._args import Depth, Dropout, MlpRatio, Width, attention_dims, image_shape, positive_ints

VARIANT = "vit_base_patch16_224.orig_in21k"
HUB_FILES = ("model.safetensors", "pytorch_model.bin")   # what a timm hub snapshot folder holds
SKIPPED = ("head.", "pre_logits.")                      # never loaded: the fresh head; the original's representation layer


def download_hint(path: str) -> str:
    """How to get the default weights (a path: the file or the folder that should hold model.safetensors)."""
    return (f"set pretrained_path=timm/{VARIANT} (read from the Hugging Face cache; add download=true on a connected "
            f"machine to fetch it), or point it at such a model.safetensors or its folder (null: train from scratch)")


def hub_weights(path: str, key: str = "pretrained_path", also: tuple[str, ...] = ()) -> str:
    """``path``, or for a hub id (``timm/<variant>``) its weights file: ``$FL_WEIGHTS_ROOT/<name>`` (or ``also``)
    if there, else the cache's ``model.safetensors`` (:mod:`fl_lightning.data.hub`)."""
    from ..data import hub

    path = os.path.expanduser(str(path))
    if not hub.is_hub_id(path):
        return path
    return hub.local_first(path, also) or hub.resolve_file(path, "model.safetensors", key)


class ResizedViT(nn.Module):
    """``vit`` applied to inputs resized (bilinear) to ``size`` x ``size``; ``size`` None: as they come."""

    def __init__(self, vit: nn.Module, size: int | None):
        super().__init__()
        self.vit, self.size = vit, size

    def forward(self, x: Tensor) -> Tensor:
        if self.size is not None and tuple(x.shape[-2:]) != (self.size, self.size):
            x = F.interpolate(x, size=(self.size, self.size), mode="bilinear", align_corners=False)
        return self.vit(x)


def weights_file(path: str) -> str:
    """``path`` itself, or the hub file inside the folder ``path``; a one-line error when there is none."""
    path = os.path.expanduser(str(path))
    if os.path.isdir(path):
        for name in HUB_FILES:
            if os.path.isfile(os.path.join(path, name)):
                return os.path.join(path, name)
        raise ConfigError("pretrained_path", f"the folder {path} holds neither {' nor '.join(HUB_FILES)}",
                          download_hint(path))
    if not os.path.isfile(path):
        raise ConfigError("pretrained_path", f"no weights file at {path}", download_hint(path))
    return path


def read_state(path: str) -> dict[str, Tensor]:
    """The tensors of a safetensors file or a torch state dict (``weights_only``; ``{"model": ...}`` unwrapped)."""
    if path.endswith(".npz"):
        raise ConfigError("pretrained_path", f"{path} is a JAX .npz checkpoint, which is not read here",
                          f"use timm's model.safetensors of it: {download_hint(os.path.dirname(path) or '.')}")
    try:
        if path.endswith(".safetensors"):
            from safetensors.torch import load_file

            state = load_file(path)
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - any unreadable file is the user's to fix
        raise ConfigError("pretrained_path", f"cannot read {path} ({type(err).__name__}: "
                          f"{' '.join(str(err).split())[:200]})",
                          f"give a .safetensors file or a torch state dict (.bin/.pth); {download_hint(path)}") from None
    for key in ("model", "state_dict"):
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
    if not isinstance(state, dict) or not state or not all(isinstance(v, Tensor) for v in state.values()):
        raise ConfigError("pretrained_path", f"{path} holds no state dict of tensors", download_hint(path))
    return state


def load_pretrained(vit: nn.Module, path: str) -> None:
    """Every tensor but the head from ``path`` (a file, a hub folder or a hub id) into ``vit``; the head stays fresh."""
    path = weights_file(hub_weights(path))
    state = {k: v for k, v in read_state(path).items() if not k.startswith(SKIPPED)}
    own = {k: v for k, v in vit.state_dict().items() if not k.startswith(SKIPPED)}
    wrong = [f"{k} {tuple(v.shape)} vs {tuple(own[k].shape)}" for k, v in state.items() if k in own and v.shape != own[k].shape]
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    if wrong or missing or unexpected:
        what = (f"shapes differ ({', '.join(wrong[:2])})" if wrong else
                f"missing {len(missing)} tensors ({', '.join(missing[:2])})" if missing else
                f"{len(unexpected)} unexpected tensors ({', '.join(unexpected[:2])})")
        raise ConfigError("pretrained_path", f"{path} does not fit this ViT: {what}",
                          f"use ViT-B/16 weights at img_size 224 on RGB data (timm's {VARIANT}), or set the "
                          f"variant's patch_size, embed_dim, depth, num_heads and img_size")
    vit.load_state_dict(state, strict=False)


def vit_base(info: DataInfo, patch_size: Annotated[int, Range(1, 1 << 10)] = 16, embed_dim: Width = 768,
             depth: Depth = 12, num_heads: Depth = 12, mlp_ratio: MlpRatio = 4.0,
             img_size: Annotated[int | str, Range(1, 1 << 13, words=("auto",))] = 224,
             drop_path: Dropout = 0.0, dropout: Dropout = 0.0, pretrained_path: str | None = None) -> ResizedViT:
    """ViT-B/16 for ``info``'s images, resized to ``img_size`` (``auto``: the data's side), with the weights at
    ``pretrained_path`` (see the module docstring). ``dropout``: attention and MLP dropout; ``drop_path``: stochastic
    depth (both 0 in timm's ViT-B/16 and unstated in the paper)."""
    from timm.models.vision_transformer import VisionTransformer

    if not info.num_classes:
        raise ConfigError("", "needs a dataset with class labels", "use data=cifar100 or data=tiny_imagenet")
    c, side = image_shape(info, "vit_base", min_side=1, square=False)
    size = side if img_size == "auto" else positive_ints(img_size, "img_size", 1, "224 or auto")[0]
    (p,) = positive_ints(patch_size, "patch_size", 1, "16")
    if size % p:
        raise ConfigError("img_size", f"{size} px is not a multiple of patch_size {p}", "use 224 with patch 16")
    (embed_dim,) = positive_ints(embed_dim, "embed_dim", 1, "768")
    (depth,) = positive_ints(depth, "depth", 1, "12")
    (num_heads,) = positive_ints(num_heads, "num_heads", 1, "12")
    mlp_ratio = attention_dims(embed_dim, num_heads, mlp_ratio, "use 12 with 768")
    drop_path, drop = float(drop_path), float(dropout)

    net = VisionTransformer(img_size=size, patch_size=p, in_chans=c, num_classes=info.num_classes,
                            embed_dim=embed_dim, depth=depth, num_heads=num_heads, mlp_ratio=mlp_ratio, qkv_bias=True,
                            class_token=True, global_pool="token", norm_layer=partial(nn.LayerNorm, eps=1e-6),
                            attn_drop_rate=drop, proj_drop_rate=drop, drop_path_rate=drop_path)
    if pretrained_path:
        load_pretrained(net, pretrained_path)
    h, w = info.input_shape[1:]
    return ResizedViT(net, None if (h, w) == (size, size) else size)
