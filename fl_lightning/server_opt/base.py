"""ServerOptimizer: the stateful shell around a pure update function, and the argument checks they share.

A server optimizer holds the global tensors ``x`` (a dict ``name -> tensor``, or a list, named "0", "1", ...) and
per-tensor state (fp32 at least). ``step(grads)`` takes the round's pseudo-gradient ``g = -(mean_i x_i - x)`` per
tensor and applies ``x <- x - lr * update(g, state)`` in place (descent convention, as torch.optim; Reddi et al.'s
Alg. 2 writes the same step as ``x + eta * m / (sqrt(v) + tau)`` with ``Delta = -g``). ``state_dict()`` is flat
(``"<name>/<state>"`` tensors plus ``"step"``, a 0-d int64 tensor) and ``load_state_dict`` reads every key it saved
(the checkpointer's strict resume). Constructors state their arguments' ranges in their annotations
(:mod:`fl_lightning.config.ranges`), checked with the config before anything is built (in Python:
``fl_lightning.config.args.check_call``); they accept an empty ``params`` so a caller can validate a factory before
it has tensors.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from ..config import Positive


def state_dtype(x: Tensor) -> torch.dtype:
    """Optimizer state is kept in at least fp32 (bf16 / fp16 global weights get fp32 moments)."""
    return torch.promote_types(x.dtype, torch.float32)


class ServerOptimizer:
    """Base class: ``state_names`` lists the per-tensor state; subclasses set it and implement :meth:`update`."""

    state_names: tuple[str, ...] = ()

    def __init__(self, params: Mapping[str, Tensor] | Sequence[Tensor], lr: Positive):
        self.lr = float(lr)
        if isinstance(params, Mapping):
            self.params = dict(params)
        else:
            self.params = {str(i): p for i, p in enumerate(params)}
        self.t = 0  # server steps taken (rounds)
        self.state: dict[str, dict[str, Tensor]] = {}

    def _init_state(self) -> None:
        """Create every state tensor now (so ``state_dict`` has all keys before the first step)."""
        for n, x in self.params.items():
            self.state[n] = {s: self.initial(s, x) for s in self.state_names}

    def initial(self, name: str, x: Tensor) -> Tensor:
        return torch.zeros(x.shape, dtype=state_dtype(x), device=x.device)

    def update(self, g: Tensor, state: dict[str, Tensor], x: Tensor) -> Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    @torch.no_grad()
    def step(self, grads: Mapping[str, Tensor]) -> None:
        """One server step: ``x <- x - lr * update(g)`` for every tensor (``grads`` has the same names)."""
        self.t += 1
        for n, x in self.params.items():
            g = grads[n].to(device=x.device, dtype=state_dtype(x))
            u = self.update(g, self.state.get(n, {}), x)
            x.add_(u.to(x.dtype), alpha=-self.lr)

    def state_dict(self) -> dict[str, Tensor]:
        out = {f"{n}/{s}": t for n, st in self.state.items() for s, t in st.items()}
        out["step"] = torch.tensor(self.t, dtype=torch.int64)
        return out

    @torch.no_grad()
    def load_state_dict(self, state: Mapping[str, Tensor]) -> None:
        for n, st in self.state.items():
            for s, t in st.items():
                t.copy_(state[f"{n}/{s}"])
        self.t = int(state["step"])
