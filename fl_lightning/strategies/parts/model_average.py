"""ModelAverage: clients upload x_i - x; the server moves x along the aggregated delta.

Rules (``rule``):
  * ``mean``       x <- x + server_lr * sum_i w_i (x_i - x) / sum_i w_i        (FedAvg, McMahan et al. 2017;
                   w_i = client data size with ``weighting=num_samples``, 1 with ``uniform``)
  * ``n_minus_s``  x <- ((n-S)/n) x + (1/n) sum_{i in S} x_i = x + (1/n) sum_i (x_i - x)
                   (seed 000, Alg. 1 line 18, Alg. 3 line 10, Alg. 4 line 15; uniform weights)
  * ``majority_vote``  D = sign(sum_i w_i u_i) on the trainable parameters, ties -> 0 (signSGD with majority vote,
                   Bernstein et al., ICLR 2019, arXiv 1810.05291; seed 002's FedSMU-MV, App. G.3, described in words
                   only, our reading, decision 002/#20 in docs/decisions.md: with server_opt SGD lr gamma1,
                   weight_decay gamma2 it is x <- x + gamma1 (sign(sum_i u_i) - gamma2 x)); buffers: mean
Uploading the delta instead of x_i is the same sum and keeps the streaming accumulator well conditioned.

``codec``: a codec (``fl_lightning/codecs/``) applied to each trainable parameter's delta x_i - x before upload,
with the client's persistent state (codecs with memory: ``ErrorFeedback``, ``LionMomentum``) and generator (and
the client itself for codecs with ``uses_client``: ``SignSteps`` reads K and the lr factor); the
server aggregates what the codec rebuilds and the wire carries its exact bits. ``null`` = dense. Float buffers
(norm statistics) always travel dense. FedSMU (seed 002 Alg. 1) is ``codec: LionMomentum(Sign())`` with uniform
weights and server SGD (lr gamma1, weight_decay gamma2); FedEF-Sign is ``codec: ErrorFeedback(ScaledSign())``.
What was uploaded (the reconstruction, per parameter name) is its per-client output ``model_update``
(``client.output("model_update")``) for diagnostics in later parts (``MagnitudeUniformity``).

``server_opt``: a factory ``{name: tensor} -> ServerOptimizer`` (:mod:`fl_lightning.server_opt`, conf/server_opt/).
With one, the rule's step D (above, without server_lr) becomes the pseudo-gradient g = -D of a server optimizer
step on the trainable parameters (FedOpt: Reddi et al., "Adaptive Federated Optimization", ICLR 2021, arXiv
2003.00295, Alg. 1-2); float buffers (norm statistics) still take x <- x + D. Its state is this part's
``server_opt/...`` state. ``None`` (the default) is plain averaging, unchanged. ``server_lr`` must stay 1 then
(the optimizer's ``lr`` is the server step size).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated

import torch
from torch import Tensor

from ...codecs.base import CodecState
from ...config import Range, Validate, check_call
from ...codecs.base import check_codec
from ...errors import ConfigError
from ..base import Aggregate, ClientContext, Msg, Part, ServerContext
from ..records import Field, Record

_OPT = "server_opt/"


def one_server_step(server_lr, server_opt) -> bool:
    """With a server optimizer, its lr is the server step: server_lr stays 1 (a rule tying two arguments)."""
    return server_opt is None or float(server_lr) == 1.0


ServerLr = Annotated[float, Range(0.0), Validate(one_server_step, "{server_lr} with a server optimizer, whose lr is the "
                                                 "server step", "leave server_lr at 1.0 and set the server optimizer's lr")]


class ModelAverage(Part):
    reads = ("weights",)  # what its hooks read of the client's training tensors
    provides = ("model_update",)  # what it uploaded for the model, per name (the codec's reconstruction)
    RULES = ("mean", "n_minus_s", "majority_vote")

    def __init__(self, rule: str = "mean", weighting: str = "num_samples", server_lr: ServerLr = 1.0, server_opt=None,
                 codec=None):
        if rule not in self.RULES:
            raise ConfigError("rule", f"unknown rule {rule!r}", f"use one of {', '.join(self.RULES)}")
        check_codec(codec, example="fl_lightning.codecs.Sign", null="dense")
        self.codec = codec
        if weighting not in ("num_samples", "uniform"):
            raise ConfigError("weighting", f"unknown weighting {weighting!r}", "use num_samples or uniform")
        self.rule, self.weighting, self.server_lr = rule, weighting, float(server_lr)
        self.server_opt_factory, self.opt = server_opt, None
        if server_opt is not None:
            if not callable(server_opt):
                raise ConfigError("server_opt", f"expected a server optimizer factory, got {type(server_opt).__name__}",
                                  "give a _target_ with _partial_: true (e.g. server_opt=adam), or null")
            try:  # the factory's arguments against their annotations now (it gets its tensors at setup)
                check_call(server_opt, [])
                server_opt([])
            except ConfigError as err:
                raise ConfigError(f"server_opt.{err.key}", err.problem, err.fix) from None

    def setup(self, server: ServerContext) -> None:
        self.server = server
        if self.server_opt_factory is not None:
            self.opt = self.server_opt_factory({n: server.global_params[n] for n in server.trainable})

    class Up(Record):
        delta = Field("{}")  # per parameter: the model's change y_i − x (as the codec sent it)

    def codec_state(self, state: dict[str, Tensor], n: str) -> CodecState:
        """The codec's memory for parameter ``n`` of the client whose persistent ``state`` this is (what FedSMU-M's
        parts read and write: the Lion momentum)."""
        return CodecState(state, self.Up(self, None).delta.path(n))

    def client_end(self, client: ClientContext) -> dict[str, Msg]:
        w = float(client.num_samples) if (self.weighting == "num_samples" and self.rule != "n_minus_s") else 1.0
        out, sent = self.Up(self, {}), {}
        rng = client.codec_rng() if self.codec is not None else None
        extra = {"client": client} if getattr(self.codec, "uses_client", False) else {}
        names = list(client.global_params)
        deltas = torch._foreach_sub([client.local[n].detach() for n in names], [client.global_params[n] for n in names])
        for n, delta in zip(names, deltas):  # the deltas in one multi-tensor op, then each through the codec
            if self.codec is not None and n in client.params:
                m = self.codec.encode(delta, self.codec_state(client.state, n), rng=rng, **extra)
                out.delta[n] = Msg(m.tensor, w, nbits=m.bits())
            else:
                out.delta[n] = Msg(delta, w)
            sent[n] = out.delta[n].tensor
        client.put(self, "model_update", sent)
        return out.container

    def _step(self, agg: Aggregate, n: str):
        up = self.Up(self, agg).delta
        if self.rule == "majority_vote":
            return up.sum(n).sign() if n in self.server.trainable else up.mean(n)
        return up.mean(n) if self.rule == "mean" else up.sum(n) / agg.num_clients

    def server_update(self, round_idx: int, agg: Aggregate) -> None:
        if self.opt is None:
            for n, x in self.server.global_params.items():
                x.add_(self._step(agg, n).to(x.dtype), alpha=self.server_lr)
            return
        grads = {}
        for n, x in self.server.global_params.items():
            if n in self.opt.params:
                grads[n] = self._step(agg, n).neg()  # the pseudo-gradient -Delta
            else:
                x.add_(self._step(agg, n).to(x.dtype))
        self.opt.step(grads)

    def state_dict(self):
        if self.opt is None:
            return {}
        return {_OPT + k: v for k, v in self.opt.state_dict().items()}

    def load_state_dict(self, state) -> None:
        if self.opt is not None:
            self.opt.load_state_dict(_Prefixed(state, _OPT))


class _Prefixed(Mapping):
    """``state[prefix + key]`` as ``view[key]`` (reads go through, so strict tracking sees them)."""

    def __init__(self, state: Mapping, prefix: str):
        self._state, self._prefix = state, prefix

    def __getitem__(self, key):
        return self._state[self._prefix + key]

    def __contains__(self, key):
        return (self._prefix + key) in self._state

    def __iter__(self):
        n = len(self._prefix)
        return (k[n:] for k in self._state if k.startswith(self._prefix))

    def __len__(self):
        return sum(1 for _ in self)
