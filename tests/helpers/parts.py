"""Parts used by tests through the command line (``+method.parts.<name>._target_=tests.helpers.parts.<Class>``)."""
from __future__ import annotations


import torch

from fl_lightning.strategies.base import Part


class UpdateNorm(Part):
    """Reports the norm of the round's global update and the number of clients that uploaded (open metrics)."""

    def setup(self, server):
        self.server = server
        self.prev = {k: v.clone() for k, v in server.global_params.items()}

    def server_update(self, round_idx, agg):
        x = self.server.global_params
        sq = sum(float((x[k] - self.prev[k]).double().pow(2).sum()) for k in x)
        self.prev = {k: v.clone() for k, v in x.items()}
        return {f"{self.name}/update_norm": sq ** 0.5, f"{self.name}/clients": float(agg.num_sampled)}

    def state_dict(self):
        return {f"prev/{k}": v for k, v in self.prev.items()}

    def load_state_dict(self, state):
        self.prev = {k: state[f"prev/{k}"].clone() for k in self.server.global_params}


class ServerMomentum(Part):
    """An own part as docs/extending.md writes one: a server momentum after the aggregation, m ← β m + (x̄ − x) and
    x ← x̄ + β m (x the model the round started from, x̄ the average), its m saved by ``state_dict``."""

    def __init__(self, beta: float = 0.9):
        self.beta = float(beta)

    def setup(self, server):
        self.server = server
        self.m = {n: torch.zeros_like(server.global_params[n]) for n in server.trainable}

    def server_update(self, round_idx, agg):
        for n, m in self.m.items():  # the round's move of the model (ModelAverage ran before), as a momentum
            m.mul_(self.beta).add_(self.server.global_params[n] - self._before[n])
            self.server.global_params[n].add_(m, alpha=self.beta)

    def broadcast(self, round_idx):
        self._before = {n: self.server.global_params[n].clone() for n in self.m}
        return {}

    scratch = ("_before",)

    def state_dict(self):
        return {f"m/{n}": m for n, m in self.m.items()}

    def load_state_dict(self, state):
        for n, m in self.m.items():
            m.copy_(state[f"m/{n}"])


class ServerMomentumUnsaved(ServerMomentum):
    """The same with its ``state_dict`` removed (the mistake the unsaved-state check catches)."""

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass
