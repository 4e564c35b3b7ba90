"""Test harness for the Muon-family methods: the real FederatedLoop + Strategy from conf/method/*.yaml, driven by a
tiny in-memory FederatedData stand-in whose minibatches are a pure function of (client, round, step)."""
from __future__ import annotations

import os
from typing import Callable

import torch
from torch import nn

from tests.helpers.cli import CONF


def method_config(name: str, overrides: list[str] = ()):
    """conf/method/<name>.yaml composed through Hydra (so the yaml itself is under test), with overrides."""
    from hydra import compose, initialize_config_dir

    from fl_lightning.config.schema import register

    register()
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        cfg = compose("config", overrides=[f"method={name}", *overrides])
    return cfg


def build(cfg):
    """The method's strategy as a run builds it: the config check of its nodes (names, types, the ranges their
    annotations state), then the parts."""
    from fl_lightning.config import check_targets
    from fl_lightning.strategies import build_strategy

    check_targets(cfg, groups=("method",))
    return build_strategy(cfg.method)


class FakeData:
    """The FederatedData interface with ``batch_fn(client, round, step) -> dict`` (round -1: the probe batch)."""

    def __init__(self, batch_fn: Callable[[int, int, int], dict], num_clients: int, test_batch: dict | None = None):
        self.batch_fn, self.n = batch_fn, num_clients
        if test_batch is None:  # every client's data: the global objective f = (1/n) Σ f_i
            parts = [batch_fn(c, -2, 0) for c in range(num_clients)]
            test_batch = {k: torch.cat([p[k] for p in parts]) for k in parts[0]}
        self.test_batch = test_batch

    @property
    def num_clients(self) -> int:
        return self.n

    def num_samples(self, client: int) -> int:
        return 10 + client  # unequal on purpose (the Muon methods weight uniformly)

    def steps_per_round(self, client, budget) -> int:
        return budget.steps_for(self.num_samples(client), self.num_samples(client))

    def client_batches(self, client, round_idx, device, budget):
        for k in range(self.steps_per_round(client, budget)):
            yield self.batch_fn(client, round_idx, k)

    def probe_batch(self, client, device) -> dict:
        return self.batch_fn(client, -1, 0)

    def test_batches(self, device):
        yield self.test_batch


class LossModule(nn.Module):
    """Wraps a net and a loss ``loss_fn(net, batch)``; evaluation reports the loss, the primary metric (min)."""

    primary_metric = ("test_loss", "min")

    def __init__(self, net: nn.Module, loss_fn: Callable):
        super().__init__()
        self.net, self.loss_fn = net, loss_fn
        self._losses: list[float] = []

    def training_step(self, batch, batch_idx=0):
        return self.loss_fn(self.net, batch)

    def sampled_label_loss(self, batch, generator=None):
        """Sophia-GNB's loss against targets drawn from the model's own predictive distribution; for the ``mse``
        loss that is N(f(x), I): ŷ = f(x) + z."""
        out = self.net(batch["x"])
        z = torch.randn(out.shape, generator=generator, dtype=out.dtype).to(out.device)
        return 0.5 * ((out - (out.detach() + z)) ** 2).sum(-1).mean()

    def validation_step(self, batch, batch_idx=0):
        loss = self.loss_fn(self.net, batch)
        self._losses.append(float(loss))
        return loss

    def compute_eval(self):
        loss = sum(self._losses) / max(1, len(self._losses))
        self._losses = []
        return {"test_loss": loss}


def make_loop(strategy, module: nn.Module, data: FakeData, run_dir: str, *, num_clients: int, per_round: int,
              rounds: int, local_steps: int, seed: int = 0, lr_schedule: str = "constant", eval_every: int = 10**6):
    from lightning.fabric import Fabric

    from fl_lightning.loop import FederatedLoop, LoopConfig
    from fl_lightning.config.schema import FL, Checkpoint

    fl = FL(num_clients=num_clients, clients_per_round=per_round, rounds=rounds, local_steps=local_steps,
            eval_every=eval_every, lr_schedule=lr_schedule)
    config = LoopConfig(fl=fl, checkpoint=Checkpoint(every=10**6), seed=seed, client_lr_key="method.lr",
                        server_lr_key=None)
    os.makedirs(run_dir, exist_ok=True)
    fabric = Fabric(accelerator="cpu", devices=1, loggers=[])
    return FederatedLoop(fabric, module, data, strategy, config, str(run_dir))


def run(strategy, module, data, run_dir, **kw):
    loop = make_loop(strategy, module, data, run_dir, **kw)
    loop.setup()
    loop.run(progress_enabled=False)
    return loop


class MLP(nn.Module):
    """Two linear layers (two Muon matrices + two biases)."""

    def __init__(self, d_in=4, hidden=5, d_out=3, seed=0, dtype=torch.float32):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.l1, self.l2 = nn.Linear(d_in, hidden), nn.Linear(hidden, d_out)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
        self.to(dtype)

    def forward(self, x):
        return self.l2(torch.tanh(self.l1(x)))


class QuadVec(nn.Module):
    """One parameter vector ``w`` (from ``x0``) for the diagonal quadratics of the server-optimizer and first-order
    identity tests (``quad_loss``)."""

    def __init__(self, x0: torch.Tensor):
        super().__init__()
        self.w = nn.Parameter(x0.clone())


def quad_loss(net, batch):
    """½ Σ a ⊙ (w − c)²: client curvatures ``a`` and minimisers ``c`` come in the batch."""
    return 0.5 * (batch["a"] * (net.w - batch["c"]) ** 2).sum()


def regression_batches(num_clients: int, d_in=4, d_out=3, batch=6, seed=0, dtype=torch.float32):
    """Heterogeneous least squares: client c's targets come from a shared linear map plus its own perturbation
    (and a client shift), so the clients disagree but a global model can fit them all fairly well."""
    shared = torch.randn(d_out, d_in, generator=torch.Generator().manual_seed(999), dtype=torch.float64)
    maps = [shared + 0.3 * torch.randn(d_out, d_in, generator=torch.Generator().manual_seed(1000 + c), dtype=torch.float64)
            for c in range(num_clients)]

    def batch_fn(c: int, r: int, k: int) -> dict:
        g = torch.Generator().manual_seed(hash((seed, c, r, k)) % (2**31))
        x = torch.randn(batch, d_in, generator=g, dtype=torch.float64)
        y = x @ maps[c].T + 0.2 * c + 0.1 * torch.randn(batch, d_out, generator=g, dtype=torch.float64)
        return {"x": x.to(dtype), "y": y.to(dtype)}

    return batch_fn


def mse(net, batch):
    return 0.5 * ((net(batch["x"]) - batch["y"]) ** 2).sum(-1).mean()


def params_of(loop) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in loop.global_params.items()}
