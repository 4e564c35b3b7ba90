"""Swin Transformer (Liu et al., "Swin Transformer: Hierarchical Vision Transformer using Shifted Windows", ICCV 2021,
arXiv 2103.14030) as seed 004 fine-tunes it (its Table 3; the variant is not stated, decision 004/AMBIG-13 in
docs/decisions.md): timm's ``SwinTransformer``, Swin-T (patch 4, window 7, 224x224, embed 96, depths 2-2-6-2, heads
3-6-12-24; 27,596,254 parameters with 100 classes), ImageNet weights (``pretrained_path``: a local file, or a hub
id, by default ``timm/swin_tiny_patch4_window7_224.ms_in1k``, read from ``$FL_WEIGHTS_ROOT`` if there, else from the
Hugging Face cache; fetched only with ``download=true``), a fresh head for the dataset's classes, and optionally
LoRA (Hu et al., ICLR 2022, arXiv 2106.09685) through ``peft``: r 16, alpha 32, dropout 0.05 on ``attn.qkv`` and
``attn.proj`` (the authors' ``--lora 1``); then only the LoRA factors and the head are trainable, so only they are
trained, communicated and averaged (the frozen backbone stays put on every client).

``pretrained_path`` takes the official Microsoft checkpoint (``swin_tiny_patch4_window7_224.pth``, the authors'
default, ``{"model": state_dict}``) or timm's ``model.safetensors``; timm's ``checkpoint_filter_fn`` maps the
official layout. The head and the non-persistent buffers are not loaded; any other missing or unexpected tensor is a
one-line error.

Inputs are resized inside the network to ``img_size`` (224 for the pretrained model; ``auto`` = the data's side),
as the authors' loaders do: ``resize: bilinear`` resizes every batch to ``img_size`` (their Tiny-ImageNet
``Resize((224, 224))``; also their CIFAR test transform); ``resize: resize_crop`` resizes training batches to
``img_size * 256/224`` and centre-crops ``img_size`` (their CIFAR train ``Resize(256) + CenterCrop(224)``),
evaluation batches plainly. Per-channel normalisation commutes with bilinear resizing, so normalising at the data's
size first (``data.normalize: imagenet`` for pretrained weights) is the same as normalising after.
"""
from __future__ import annotations

import os
from typing import Annotated

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..data.info import DataInfo
from ..errors import ConfigError
from ..config import OneOf, Positive, Range
from ._args import Depths, Dropout, Width, choice, image_shape, lora_args, positive_ints

RESIZES = ("bilinear", "resize_crop")
HUB_ID = "timm/swin_tiny_patch4_window7_224.ms_in1k"  # conf/model/swin_t.yaml's default
WEIGHTS_HINT = ("swin_tiny_patch4_window7_224.pth from github.com/microsoft/Swin-Transformer (release v1.0.0) or "
                "timm's swin_tiny_patch4_window7_224.ms_in1k model.safetensors")


class ResizedSwin(nn.Module):
    """``swin`` applied to inputs resized to ``size`` (see the module docstring)."""

    def __init__(self, swin: nn.Module, size: int | None, mode: str = "bilinear"):
        super().__init__()
        self.swin, self.size, self.mode = swin, size, mode

    def forward(self, x: Tensor) -> Tensor:
        if self.size is not None and tuple(x.shape[-2:]) != (self.size, self.size):
            if self.mode == "resize_crop" and self.training:
                big = self.size * 256 // 224
                x = F.interpolate(x, size=(big, big), mode="bilinear", align_corners=False)
                o = (big - self.size) // 2
                x = x[..., o : o + self.size, o : o + self.size]
            else:
                x = F.interpolate(x, size=(self.size, self.size), mode="bilinear", align_corners=False)
        return self.swin(x)


def _read_state(path: str) -> dict[str, Tensor]:
    try:
        if path.endswith(".safetensors"):
            from safetensors.torch import load_file

            return load_file(path)
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - any unreadable file is the user's to fix
        raise ConfigError("pretrained_path", f"cannot read {path} ({type(err).__name__}: {' '.join(str(err).split())[:200]})",
                          f"give a torch checkpoint (.pth) or a .safetensors file: {WEIGHTS_HINT}") from None
    for key in ("model", "state_dict"):
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
    if not isinstance(state, dict) or not all(isinstance(v, Tensor) for v in state.values()):
        raise ConfigError("pretrained_path", f"{path} holds no state dict of tensors", f"use {WEIGHTS_HINT}")
    return state


def load_pretrained(swin: nn.Module, path: str) -> None:
    """Backbone weights from ``path`` into ``swin`` (the head stays freshly initialised)."""
    from timm.models.swin_transformer import checkpoint_filter_fn

    from .vit_base import hub_weights

    path = hub_weights(path, also=("swin_tiny_patch4_window7_224.pth",) if path == HUB_ID else ())
    if os.path.isdir(path) and os.path.isfile(os.path.join(path, "model.safetensors")):  # a hub snapshot folder
        path = os.path.join(path, "model.safetensors")
    if not os.path.isfile(path):
        raise ConfigError("pretrained_path", f"no weights file at {path}",
                          f"put {WEIGHTS_HINT} there (download it on a connected machine), point pretrained_path at "
                          f"it, or set it to null to train from scratch")
    raw, own = _read_state(path), swin.state_dict()
    # timm's filter would silently resample a patch embedding or position-bias table of another size: refuse instead
    wrong = [f"{k} {tuple(v.shape)} vs {tuple(own[k].shape)}" for k, v in raw.items()
             if k in own and v.shape != own[k].shape and not k.startswith("head.")]
    state = {} if wrong else checkpoint_filter_fn(raw, swin)
    state = {k: v for k, v in state.items() if not k.startswith("head.")}
    wrong += [f"{k} {tuple(v.shape)} vs {tuple(own[k].shape)}" for k, v in state.items() if k in own and v.shape != own[k].shape]
    missing = [k for k in own if k not in state and not k.startswith("head.") and "relative_position_index" not in k
               and "attn_mask" not in k]
    unexpected = [k for k in state if k not in own]
    if wrong or missing or unexpected:
        what = (f"shapes differ ({', '.join(wrong[:2])})" if wrong else
                f"missing {len(missing)} tensors ({', '.join(missing[:2])})" if missing else
                f"{len(unexpected)} unexpected tensors ({', '.join(unexpected[:2])})")
        raise ConfigError("pretrained_path", f"{path} does not fit this Swin: {what}",
                          "use the weights of the same variant (embed_dim, depths, num_heads, window_size, patch_size)")
    swin.load_state_dict(state, strict=False)


def add_lora(swin: nn.Module, r: int, alpha: float, dropout: float, targets) -> None:
    """LoRA adapters (peft, injected in place) on ``targets``; freeze everything but the adapters and the head."""
    try:
        from peft import LoraConfig, inject_adapter_in_model
    except ImportError:
        raise ConfigError("lora", "needs the peft package", "python3 -m pip install peft") from None
    cfg = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, bias="none", target_modules=list(targets))
    try:
        inject_adapter_in_model(cfg, swin)
    except ValueError as err:
        raise ConfigError("lora_targets", " ".join(str(err).split())[:200], "use [attn.qkv, attn.proj]") from None
    for name, p in swin.named_parameters():
        p.requires_grad_("lora_" in name or name.startswith("head."))


def swin(info: DataInfo, embed_dim: Width = 96, depths: Annotated[list[int], Range(1, 64)] = (2, 2, 6, 2),
         num_heads: Depths = (3, 6, 12, 24), window_size: Annotated[int, Range(1, 1 << 10)] = 7,
         patch_size: Annotated[int | str, Range(1, 1 << 10, words=("auto",))] = "auto",
         img_size: Annotated[int | str, Range(1, 1 << 13, words=("auto",))] = 224,
         resize: Annotated[str, OneOf(*RESIZES)] = "bilinear",
         mlp_ratio: Annotated[float, Range(0.0, 64.0, open_low=True)] = 4.0,
         drop_path: Dropout = 0.1, pretrained_path: str | None = None, lora: bool = False,
         lora_r: Annotated[int, Range(1, 1 << 12)] = 16, lora_alpha: Positive = 32, lora_dropout: Dropout = 0.05,
         lora_targets: list[str] = ("attn.qkv", "attn.proj")) -> ResizedSwin:
    """Swin for ``info``'s images; defaults = Swin-T at 224 (see the module docstring). ``patch_size: auto`` is 4 at
    sides >= 32 (after resizing), else 2; ``img_size: auto`` keeps the data's side."""
    from timm.models.swin_transformer import SwinTransformer

    c, side = image_shape(info, "swin", min_side=2)
    (embed_dim,) = positive_ints(embed_dim, "embed_dim", 1, "96")
    depths = positive_ints(depths, "depths", None, "[2, 2, 6, 2]")
    num_heads = positive_ints(num_heads, "num_heads", len(depths), f"one head count per stage, e.g. {[3, 6, 12, 24][:len(depths)]}")
    bad = [(i, h) for i, h in enumerate(num_heads) if (embed_dim * 2 ** i) % h]
    if bad:
        raise ConfigError("num_heads", f"stage {bad[0][0]} has {embed_dim * 2 ** bad[0][0]} channels, not divisible by "
                          f"{bad[0][1]} heads", "use heads that divide embed_dim * 2^stage, e.g. [3, 6, 12, 24] with 96")
    (window_size,) = positive_ints(window_size, "window_size", 1, "7")
    size = side if img_size == "auto" else positive_ints(img_size, "img_size", 1, "224 or auto")[0]
    p = (4 if size >= 32 else 2) if patch_size == "auto" else positive_ints(patch_size, "patch_size", 1, "auto or 4")[0]
    tokens = size // p
    if size % p or tokens % 2 ** (len(depths) - 1):
        raise ConfigError("img_size", f"{size} px with patch {p} gives {size / p:g} tokens per side, which "
                          f"{len(depths) - 1} patch mergings cannot halve evenly",
                          f"use an img_size divisible by {p * 2 ** (len(depths) - 1)} (224 for Swin-T)")
    resize = choice(resize, "resize", RESIZES)
    drop_path, mlp_ratio = float(drop_path), float(mlp_ratio)
    if not isinstance(lora, bool):
        raise ConfigError("lora", f"must be true or false, got {lora!r}", "use false (full fine-tuning) or true")

    net = SwinTransformer(img_size=size, patch_size=p, in_chans=c, num_classes=info.num_classes, embed_dim=embed_dim,
                          depths=depths, num_heads=num_heads, window_size=window_size, mlp_ratio=mlp_ratio,
                          drop_path_rate=drop_path)
    if pretrained_path:
        load_pretrained(net, pretrained_path)
    if lora:
        add_lora(net, *lora_args(lora_r, lora_alpha, lora_dropout, lora_targets, ("attn.qkv", "attn.proj")))
    return ResizedSwin(net, None if size == side else size, resize)
