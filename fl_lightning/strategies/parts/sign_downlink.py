"""SignDownlink: D-Lion's downlink — the aggregated sign step instead of the model (Liu, Wu, Chen, Ye, Gong, Liu &
Liu, "Communication Efficient Distributed Training with Distributed Lion", NeurIPS 2024, arXiv 2404.00438, Alg. 1;
a baseline of seed 002, App. G.3, Tables 13–14, not written out there; decision 002/#14 in docs/decisions.md).

In D-Lion every worker keeps its own copy of the model and applies x ← x − ε(Δ + λ·x) itself; the server only
relays Δ: the mean of the n_S workers' signs (``rule: mean``, values in {−1, −1 + 2/n_S, …, 1}: ⌈log₂(n_S + 1)⌉ bits
per coordinate) or their majority vote (``rule: majority_vote``, 1 bit). Every worker must apply every Δ to stay in
sync, so Δ goes to ALL clients. Starting from the same x_0 and applying the same Δ, the copies equal the server's
mirror x, so the server keeps x (``ModelAverage`` with server SGD lr ε, weight_decay λ does the step); this part
charges the downlink: round 0 the dense x_0 to every client, then each round the previous round's Δ (the last
round's Δ would reach the workers only with a next round, so it is not charged). Buffers (norm statistics) travel
dense. Exact zeros of torch.sign are counted as the ±1 code's bits (decision 002/#15).
"""
from __future__ import annotations

import math

import torch

from ...errors import ConfigError
from ..base import MODEL_KEY, Msg, Part, ServerContext


class SignDownlink(Part):
    RULES = ("mean", "majority_vote")

    def __init__(self, rule: str = "mean"):
        if rule not in self.RULES:
            raise ConfigError("rule", f"unknown rule {rule!r}", f"use one of {', '.join(self.RULES)}")
        self.rule = rule

    def setup(self, server: ServerContext) -> None:
        self.server = server
        gp = server.global_params
        self.dense_bits = sum(t.numel() * t.element_size() * 8 for t in gp.values())
        per_coord = 1 if self.rule == "majority_vote" else math.ceil(math.log2(server.clients_per_round + 1))
        d = sum(gp[n].numel() for n in server.trainable)
        buffers = sum(t.numel() * t.element_size() * 8 for n, t in gp.items() if n not in server.trainable)
        self.step_bits = per_coord * d + buffers

    def broadcast(self, round_idx: int) -> dict[str, Msg]:
        bits = self.dense_bits if round_idx == 0 else self.step_bits
        return {MODEL_KEY: Msg(torch.empty(0, device=self.server.device), nbits=bits, to="all")}
