"""SophiaHessian: the Hessian-diagonal estimate ĥ that feeds Sophia's curvature EMA, every ``every`` local steps.

Sophia (Liu et al., ICLR 2024, arXiv 2305.14342) and seed 001 FedPAC (appendix Algs. 8 / 9): on a step whose
index t is a multiple of f_h (``every``, default 10), an estimate ĥ of diag(∇²f) on the current minibatch is passed
to the optimizer's ``update_hessian`` (h ← β2 h + (1−β2) max(ĥ, 0)). Which step index t (``counter``):

* ``global`` (default; FedPAC's Alg. 8 / 9, "(rK + k) mod f_h = 0"): t = rK + k, k = 1..K the local step of round r;
* ``client``: t counts the steps this client has taken over all its rounds (kept in its state). Fed-Sophia
  (Elbakary et al., arXiv 2406.06655) writes every quantity of device i with the device's own iteration index,
  m_t^(i), v̂_t^(i) = β2·v̂_{t−τ}^(i) + (1−β2)·GNB(θ_t^(i)) when t mod τ = 0; its server averages all N devices every
  round, so there this is also rK + k. Under partial participation the two differ, and only the device's own count
  keeps v̂_{t−τ}^(i) τ of the device's own steps back (our reading; ``conf/method/fed_sophia.yaml``);
* ``round``: t = k, restarting every round (the counter of the released FedPAC code's SOAP eigenbasis refresh;
  decision 001/#7 in docs/decisions.md).

``estimator``:

* ``hutchinson`` (default; Alg. 8 and Liu et al. Alg. 1): ĥ = u ⊙ (∇²f u) with Rademacher u (``probes`` of them,
  averaged), the Hessian-vector product by double backward through the current minibatch
  (``client.hvp``; the loop never switches ``create_graph`` on). Probes come from ``client.rng("hutchinson")``.
* ``gnb`` (Gauss–Newton–Bartlett, Liu et al. Alg. 2, SophiaG): ĥ = B·ĝ⊙ĝ, ĝ the gradient of the mean loss
  against labels sampled from the model's own softmax (``module.sampled_label_loss``), B the minibatch size.
* ``empirical``: ĥ = g⊙g of the ordinary minibatch gradient, what the released FedPAC code's Local Sophia does
  (``update_hessian()`` after every backward; decision 001/#12); use with ``every: 1`` to match it.

Costs one extra forward and a double backward (hutchinson) or one forward/backward (gnb) per estimate.
"""
from __future__ import annotations

from dataclasses import dataclass

from typing import Annotated

import torch

from ...errors import ConfigError
from ...optim.capabilities import SampledLabelLoss, TakesHessianEstimates
from ...config import Range
from ..base import ClientContext, Part
from ..round_state import RoundState, own
from ..records import Field, Record


class SophiaHessian(Part):
    reads = ("grads", "weights", "optimizer.state")  # what its hooks read of the client's training tensors
    writes = ("optimizer.state",)  # what its hooks change of the client's training tensors
    ESTIMATORS = ("hutchinson", "gnb", "empirical")
    # whether a step refreshes ĥ is planned before it (before_step): the regular steps do nothing here (a captured step
    # replays them), a refresh step draws from its own generator and backpropagates twice (in a cohort: each client's
    # probes from its own stream, one Hessian-vector product for all; GNB: each client's labels, one gradient)
    step_plan = ("refresh",)
    COUNTERS = ("global", "client", "round")

    def __init__(self, estimator: str = "hutchinson", every: Annotated[int, Range(1, 10**9)] = 10,
                 probes: Annotated[int, Range(1, 1 << 14)] = 1, counter: str = "global"):
        if estimator not in self.ESTIMATORS:
            raise ConfigError("estimator", f"unknown estimator {estimator!r}", f"use one of {', '.join(self.ESTIMATORS)}")
        if counter not in self.COUNTERS:
            raise ConfigError("counter", f"unknown counter {counter!r}", f"use one of {', '.join(self.COUNTERS)}")
        self.counter = counter
        self.estimator, self.every, self.probes = estimator, every, probes

    def cohort_check(self, module) -> str | None:
        if self.estimator == "gnb" and not (callable(getattr(module, "sampled_labels", None))
                                            and callable(getattr(module, "sample_outputs", None))):
            return (f"estimator=gnb needs the model's outputs and its sampled labels apart (sample_outputs, "
                    f"sampled_labels; {type(module).__name__} has not both)")
        return None

    class State(Record):
        steps = Field("steps")  # counter=client: the local steps this client took in its earlier rounds

    def client_start(self, client: ClientContext) -> None:
        if not isinstance(client.optimizer, TakesHessianEstimates):
            raise self.error("estimator", f"{type(client.optimizer).__name__} takes no Hessian estimates",
                             "use the Sophia local optimizer (optimizer=sophia) or drop this part")
        if self.estimator == "gnb" and not isinstance(client.module, SampledLabelLoss):
            raise self.error("estimator", f"estimator=gnb needs a model with sampled_label_loss "
                             f"({type(client.module).__name__} has none)", "use estimator=hutchinson")
        if self.counter == "global":
            t0 = client.round * client.num_steps
        elif self.counter == "client":  # the steps this client took in its earlier rounds
            done = self.State(self, client.state).steps.get()
            t0 = 0 if done is None else int(done)
        else:
            t0 = 0
        client.start_state(self, self.Round(t0=t0))

    @dataclass
    class Round(RoundState):  # a cohort reads each client's own (its refresh steps from its own count)
        t0: int = own(0)                         # the step count the round starts from (``counter``)
        rng: torch.Generator | None = own()      # the probes' (or sampled labels') stream of this (client, round)
        refresh: bool = own(False)               # this step refreshes ĥ (decided before the step)

    def client_end(self, client: ClientContext) -> dict:
        if self.counter == "client":
            t = client.state_of(self).t0 + client.step
            dev = next(iter(client.global_params.values())).device
            self.State(self, client.state).steps.set(torch.tensor(t, dtype=torch.int64, device=dev))
        return {}

    def _generator(self, client: ClientContext) -> torch.Generator:
        st = client.state_of(self)
        if st.rng is None:  # one stream per (client, round), drawn from step to step
            st.rng = client.rng(self.estimator)
        return st.rng

    def estimate(self, client: ClientContext) -> dict[str, torch.Tensor]:
        """ĥ per trainable parameter name, on the current minibatch at the current weights."""
        params = client.params
        if self.estimator == "empirical":
            return {n: p.grad.detach().square() for n, p in params.items() if p.grad is not None}
        gen = self._generator(client)
        if self.estimator == "gnb":
            g = client.gradient_at(loss_fn=lambda module, batch: module.sampled_label_loss(batch, gen))
            size = len(next(iter(client.batch.values())))
            return {n: size * t.square() for n, t in g.items()}
        est = {n: torch.zeros_like(p) for n, p in params.items()}
        for _ in range(self.probes):
            u = {n: (torch.randint(0, 2, p.shape, generator=gen, device=p.device) * 2 - 1).to(p.dtype)
                 for n, p in params.items()}
            hv = client.hvp(u)
            for n in est:
                est[n].add_(u[n] * hv[n], alpha=1.0 / self.probes)
        return est

    def before_step(self, client: ClientContext) -> None:
        st = client.state_of(self)
        if client.batched:  # a cohort: each client's own count (a finished client refreshes nothing)
            st.refresh = [client.step < c.num_steps and (c.state_of(self).t0 + client.step + 1) % self.every == 0
                          for c in client.clients]
            return
        st.refresh = (st.t0 + client.step + 1) % self.every == 0  # the step being taken: k = client.step + 1

    def after_backward(self, client: ClientContext) -> None:
        if not client.state_of(self).refresh:  # decided before the step (a compiled step guards on no step count)
            return
        est = self.estimate(client)
        client.optimizer.update_hessian({client.params[n]: h for n, h in est.items()})

    @torch.no_grad()
    def cohort_after_backward(self, cohort) -> None:
        """The clients whose step k is a refresh step (their own counters) get ĥ at their rows; the others' curvature
        EMA rows stay as they were."""
        refresh = cohort.state_of(self).refresh  # planned by before_step
        if not any(refresh):
            return
        params = cohort.params
        if self.estimator == "empirical":
            est = {n: t.grad.detach().square() for n, t in params.items() if t.grad is not None}
        elif self.estimator == "gnb":  # B_i·ĝ_i², ĝ_i the gradient against labels from client i's own softmax
            gens = [self._generator(c) if r else None for c, r in zip(cohort.clients, refresh)]
            with torch.enable_grad():
                g = cohort.services.sampled_label_gradient(cohort, gens)
            size = cohort.count.to(next(iter(g.values())).dtype)  # each client's real rows
            est = {n: t.square() * size.view(-1, *([1] * (t.dim() - 1))) for n, t in g.items()}
        else:
            est = {n: torch.zeros_like(t) for n, t in params.items()}
            for _ in range(self.probes):  # each client's probes from its own stream, in the sequential order
                u = {n: torch.zeros_like(t) for n, t in params.items()}
                for i, c in enumerate(cohort.clients):
                    if refresh[i]:
                        gen = self._generator(c)
                        for n, t in params.items():
                            u[n][i] = (torch.randint(0, 2, t.shape[1:], generator=gen, device=t.device) * 2 - 1).to(t.dtype)
                with torch.enable_grad():
                    hv = cohort.services.hvp(cohort, u, only=refresh)
                for n in est:
                    est[n].add_(u[n] * hv[n], alpha=1.0 / self.probes)
        opt = cohort.optimizer
        mask = cohort.per_client(refresh, torch.bool)
        kept = {p: opt._state(p)["hessian"].clone() for p in (params[n] for n in est)}
        opt.update_hessian({params[n]: h for n, h in est.items()})
        for p, old in kept.items():
            h = opt._state(p)["hessian"]
            h.copy_(torch.where(mask.view(-1, *([1] * (h.dim() - 1))), h, old))
