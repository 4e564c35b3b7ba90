"""Seed 003's "ViT" (Zhang & Gao, "On Provable Benefits of Muon in Federated Learning", App. A.1, Table 2):
the ViT of the vision-transformers-cifar10 repository (Yoshioka), in the layout of lucidrains' vit-pytorch, trained
from scratch on CIFAR. A different network from ``vit_tiny``:

patch 4 -> Linear(C*4*4 -> 512) patch embedding, learned positions (1, T+1, 512) and CLS token (both N(0, 1) at
init), embedding dropout 0.1; 6 pre-LayerNorm blocks of attention (8 heads x 64 = 512, ``to_qkv`` without bias,
output Linear + dropout 0.1) and MLP (Linear 512 -> 512, GELU, dropout, Linear 512 -> 512, dropout); CLS pooling;
head LayerNorm + Linear. 9,523,722 parameters at 32x32, 3 channels, 10 classes (derived from that layout; the
paper gives no count). Linear layers keep PyTorch's default init (the repository's).
"""
from __future__ import annotations

from typing import Annotated

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..data.info import DataInfo
from ..config import Range
from ._args import Depth, Dropout, Width, image_shape, positive_ints
from .vit import resolve_patch


class Attention(nn.Module):
    # False: softmax(q kᵀ · scale) v written out (what a cohort of clients runs on a CPU, whose fused kernel has no
    # vmap rule: fl_lightning/cohort/), True: the fused kernel (as timm's ``fused_attn``)
    fused_attn = True

    def __init__(self, dim: int, heads: int, dim_head: int, dropout: float):
        super().__init__()
        inner = heads * dim_head
        self.heads, self.scale = heads, dim_head ** -0.5
        self.to_qkv = nn.Linear(dim, 3 * inner, bias=False)
        self.to_out = nn.Sequential(nn.Linear(inner, dim), nn.Dropout(dropout))

    def forward(self, x: Tensor) -> Tensor:
        b, n, _ = x.shape
        q, k, v = self.to_qkv(x).view(b, n, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        if self.fused_attn:
            out = F.scaled_dot_product_attention(q, k, v, scale=self.scale)
        else:
            out = torch.softmax((q * self.scale) @ k.transpose(-2, -1), dim=-1) @ v
        return self.to_out(out.transpose(1, 2).reshape(b, n, -1))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, dim_head: int, mlp_dim: int, dropout: float):
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(dim), Attention(dim, heads, dim_head, dropout)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp_dim), nn.GELU(), nn.Dropout(dropout), nn.Linear(mlp_dim, dim),
                                 nn.Dropout(dropout))

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class ViTCifar(nn.Module):
    def __init__(self, in_channels: int, num_classes: int, image_hw: tuple[int, int], patch: int, dim: int = 512,
                 depth: int = 6, heads: int = 8, dim_head: int = 64, mlp_dim: int = 512, dropout: float = 0.1,
                 emb_dropout: float = 0.1):
        super().__init__()
        self.patch = patch
        tokens = (image_hw[0] // patch) * (image_hw[1] // patch)
        self.patch_embed = nn.Linear(in_channels * patch * patch, dim)
        self.pos_embed = nn.Parameter(torch.randn(1, tokens + 1, dim))
        self.cls_token = nn.Parameter(torch.randn(1, 1, dim))
        self.emb_drop = nn.Dropout(emb_dropout)
        self.blocks = nn.Sequential(*[Block(dim, heads, dim_head, mlp_dim, dropout) for _ in range(depth)])
        self.head = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, num_classes))

    def forward(self, x: Tensor) -> Tensor:
        b, c, h, w = x.shape
        p = self.patch
        # (b, c, h, w) -> (b, h/p * w/p, p*p*c), pixel order (p1 p2 c) as in the repository's Rearrange
        x = x.view(b, c, h // p, p, w // p, p).permute(0, 2, 4, 3, 5, 1).reshape(b, (h // p) * (w // p), p * p * c)
        x = torch.cat([self.cls_token.expand(b, -1, -1), self.patch_embed(x)], dim=1) + self.pos_embed
        x = self.blocks(self.emb_drop(x))
        return self.head(x[:, 0])


def vit_cifar(info: DataInfo, patch_size: Annotated[int | str, Range(1, 1 << 10, words=("auto",))] = "auto",
              dim: Width = 512, depth: Depth = 6, heads: Depth = 8, dim_head: Width = 64, mlp_dim: Width = 512,
              dropout: Dropout = 0.1, emb_dropout: Dropout = 0.1) -> ViTCifar:
    """Seed 003's ViT for ``info``'s images; ``patch_size: auto`` = 4 at >= 32 px (the paper's), 2 below."""
    c, _ = image_shape(info, "vit_cifar", min_side=2, square=False)
    h, w = info.input_shape[1:]
    p = resolve_patch(patch_size, h, w)
    vals = {k: positive_ints(v, k, 1, str(d))[0] for k, v, d in
            (("dim", dim, 512), ("depth", depth, 6), ("heads", heads, 8), ("dim_head", dim_head, 64), ("mlp_dim", mlp_dim, 512))}
    return ViTCifar(c, info.num_classes, (h, w), p, vals["dim"], vals["depth"], vals["heads"], vals["dim_head"],
                    vals["mlp_dim"], float(dropout), float(emb_dropout))
