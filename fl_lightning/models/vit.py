"""ViT-Tiny as seeds 004 and 001 train it from scratch: timm's ``VisionTransformer`` (Dosovitskiy et al., "An Image
is Worth 16x16 Words", ICLR 2021, arXiv 2010.11929; the Tiny width of Touvron et al., "DeiT", ICML 2021, arXiv
2012.12877).

* Seed 004 (Liu et al., "FedMuon: Accelerating Federated Learning with Matrix Orthogonalization", no arXiv id;
  Table 2; the layout is the authors' ``models/DeiTTiny.py``, the paper gives none): dim 192, **depth 6** (DeiT-Tiny
  has 12: ``depth: 12``), 3 heads, MLP ratio 4, qkv bias, CLS token, learned positions, LayerNorm eps 1e-6,
  trunc-normal(0.02) linear weights with zero bias (timm's default init), patch 4 on 32x32 (64 tokens + CLS).
  2,710,948 parameters at 32x32, 3 channels, 100 classes.
* Seed 001 (Liu et al., "Taming Preconditioner Drift" (FedPAC), ICML submission, Table 1 ViT-Tiny; App. D.4): the
  same width and depth with sinusoidal positions (``pos_embed: sincos``), Xavier-uniform linear weights
  (``init: xavier``) and dropout 0.1 on attention and MLP (``dropout: 0.1``); MLP ratio and CLS pooling are not
  given and kept as above (``conf/model/vit_tiny_fedpac.yaml``).

Channels and image size come from the dataset (``DataInfo.input_shape``); ``patch_size: auto`` is 4 when the
shorter side is >= 32, else 2 (16 tokens on the 8x8 digits). Muon (``split_muon_params``) puts every ndim >= 2
parameter in its Muon group, as seed 004's code does (its ``muon.py``; decision 004/AMBIG-4): the patch-embedding
conv (as out x in*kh*kw), ``cls_token`` (1, 1, 192) and ``pos_embed`` (1, T+1, 192) (3-D: orthogonalized over their
last two dims), every block's linear weights and the head; biases and LayerNorm affines go to the auxiliary AdamW.
A fixed ``sincos`` position table is a frozen parameter: neither trained, communicated nor given to an optimizer.
"""
from __future__ import annotations

import math
from functools import partial
from typing import Annotated

import torch
from torch import nn

from ..data.info import DataInfo
from ..errors import ConfigError
from ..config import OneOf, Range
from ._args import Depth, Dropout, MlpRatio, Width, attention_dims, choice, image_shape, positive_ints

POS_EMBEDS = ("learn", "sincos")
INITS = ("trunc_normal", "xavier")


def auto_patch(side: int) -> int:
    """``patch_size: auto``: 4 for sides >= 32 (CIFAR, Tiny-ImageNet), 2 below (8x8 digits: 16 tokens)."""
    return 4 if side >= 32 else 2


def resolve_patch(patch_size, h: int, w: int) -> int:
    if patch_size == "auto":
        p = auto_patch(min(h, w))
    else:
        (p,) = positive_ints(patch_size, "patch_size", 1, "auto or 4")
    if h % p or w % p:
        raise ConfigError("patch_size", f"{p} does not divide the dataset's {h}x{w} images",
                          f"use auto ({auto_patch(min(h, w))} here) or a divisor of {math.gcd(h, w)}")
    return p


def sincos_table(tokens: int, dim: int) -> torch.Tensor:
    """(1, tokens, dim) 1-D sinusoidal positions (Vaswani et al., NeurIPS 2017, Sec. 3.5): sin on even, cos on odd
    channels, CLS at position 0."""
    pos = torch.arange(tokens, dtype=torch.float64)[:, None]
    freq = torch.exp(-math.log(10000.0) * torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    table = torch.zeros(tokens, dim, dtype=torch.float64)
    table[:, 0::2] = torch.sin(pos * freq)
    table[:, 1::2] = torch.cos(pos * freq)[:, : dim // 2]
    return table.float()[None]


def vit_tiny(info: DataInfo, patch_size: Annotated[int | str, Range(1, 1 << 10, words=("auto",))] = "auto",
             depth: Depth = 6, embed_dim: Width = 192, num_heads: Depth = 3,
             mlp_ratio: MlpRatio = 4.0,
             pos_embed: Annotated[str, OneOf(*POS_EMBEDS)] = "learn",
             init: Annotated[str, OneOf(*INITS)] = "trunc_normal",
             dropout: Dropout = 0.0) -> nn.Module:
    """timm VisionTransformer for ``info``'s images; defaults = seed 004's ViT-Tiny (see the module docstring)."""
    from timm.models.vision_transformer import VisionTransformer

    c, _ = image_shape(info, "vit_tiny", min_side=2, square=False)
    h, w = info.input_shape[1:]
    p = resolve_patch(patch_size, h, w)
    (depth,) = positive_ints(depth, "depth", 1, "6 (seed 004) or 12 (DeiT-Tiny)")
    (embed_dim,) = positive_ints(embed_dim, "embed_dim", 1, "192")
    (num_heads,) = positive_ints(num_heads, "num_heads", 1, "3")
    mlp_ratio = attention_dims(embed_dim, num_heads, mlp_ratio, "use 3 with 192")
    pos_embed, init = choice(pos_embed, "pos_embed", POS_EMBEDS), choice(init, "init", INITS)
    drop = float(dropout)

    net = VisionTransformer(
        img_size=(h, w), patch_size=p, in_chans=c, num_classes=info.num_classes, embed_dim=embed_dim, depth=depth,
        num_heads=num_heads, mlp_ratio=mlp_ratio, qkv_bias=True, class_token=True, global_pool="token",
        norm_layer=partial(nn.LayerNorm, eps=1e-6), attn_drop_rate=drop, proj_drop_rate=drop)
    if init == "xavier":
        for m in net.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                nn.init.zeros_(m.bias)
    if pos_embed == "sincos":
        with torch.no_grad():
            net.pos_embed.copy_(sincos_table(net.pos_embed.shape[1], embed_dim))
        net.pos_embed.requires_grad_(False)
    return net
