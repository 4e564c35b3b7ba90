"""Dropout in a cohort: each client's masks from its own stream, as in the sequential loop.

The sequential loop seeds the device's generator per (seed, client, round) at each client's start, so a client's
dropout masks are the draws of its own stream, in the order its forwards call dropout, each of its real batch's
shape. A cohort (fl_lightning/cohort/) keeps that: each client's generator state is kept from its start; before
each batched forward (the step's, and any a part asks for: a gradient elsewhere, a Hessian-vector product) every
active client's masks are drawn from its own state with the very function its sequential forward calls
(``F.dropout`` of a tensor of ones of that client's rows: the same kernel, the same draws, the mask scaled by
1/(1 − p)), padded to the cohort's batch with ones and stacked (K, B, ...); under ``vmap`` each ``nn.Dropout`` of
the model multiplies its input by its client's mask (``x * (1·mask)`` is the sequential ``x * mask`` exactly). The
result therefore does not depend on K. The shapes of the calls are read once per batch shape by a forward of one
client that draws nothing.

Only ``torch.nn.Dropout`` draws this way (a module or a builder with another random layer, e.g. timm's DropPath or
attention dropout inside a fused kernel, is refused by :func:`fl_lightning.cohort.check_cohort`). The draws swap the
device generator's state per client on the host: not traceable, so a cohort of a model with dropout runs eagerly.
"""
from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def dropout_sites(module: nn.Module) -> list[nn.Dropout]:
    """The model's ``nn.Dropout`` modules that draw (p > 0)."""
    return [m for m in module.modules() if type(m) is nn.Dropout and m.p > 0]


class CohortDropout:
    """The per-client dropout streams of one cohort (see the module docstring)."""

    def __init__(self, module: nn.Module, device: torch.device):
        self.sites = dropout_sites(module)
        self.device = device
        self.gen = (torch.cuda.default_generators[device.index if device.index is not None else torch.cuda.current_device()]
                    if device.type == "cuda" else torch.default_generator)
        self.states: list[Tensor] = []           # each client's generator state
        self._calls: dict[tuple, list[tuple[float, tuple, torch.dtype]]] = {}  # batch shape -> (p, row shape, dtype)
        self._masks: list[Tensor] | None = None  # the masks of the forward running now, in call order

    def __bool__(self) -> bool:
        return bool(self.sites)

    # ------------------------------------------------------------------ the clients' streams
    def start(self) -> None:
        self.states = []

    def keep(self) -> None:
        """The state the device generator holds now is the next client's (called right after its start)."""
        self.states.append(self.gen.get_state())

    def resume(self, i: int) -> None:
        """Client ``i``'s stream back into the device generator (before its end, which the sequential loop runs
        from the state its training left)."""
        self.gen.set_state(self.states[i])

    # ------------------------------------------------------------------ one forward
    @contextlib.contextmanager
    def forward(self, probe, batch: dict, rows: list[int], B: int):
        """While a batched forward runs: every ``nn.Dropout`` multiplies by its client's mask. ``probe()`` runs one
        client's forward (it reads the calls' shapes, once per batch shape); ``rows``: each client's real rows this
        step (0: a client that has finished, which draws nothing)."""
        key = tuple((k, tuple(v.shape[2:]), v.dtype) for k, v in batch.items())
        if key not in self._calls:
            self._calls[key] = self._record(probe, B)
        masks = self._draw(self._calls[key], rows, B)
        self._masks = masks
        yield masks
        self._masks = None

    def apply(self, masks: list[Tensor]):
        """Inside the vmapped forward: each dropout call takes the next of ``masks`` (this client's row of them)."""
        it = iter(masks)

        def forward(m: nn.Dropout, x: Tensor) -> Tensor:
            return x * next(it) if m.training else x

        return self._patched(forward)

    @contextlib.contextmanager
    def _patched(self, forward):
        for m in self.sites:
            m.forward = forward.__get__(m)
        try:
            yield
        finally:
            for m in self.sites:
                del m.forward

    def _record(self, probe, B: int) -> list[tuple[float, tuple, torch.dtype]]:
        calls = []

        def record(m: nn.Dropout, x: Tensor) -> Tensor:
            if m.training:
                if x.dim() == 0 or x.shape[0] != B:
                    raise RuntimeError(f"a cohort draws dropout per batch row; a dropout of the model takes a tensor "
                                       f"of shape {tuple(x.shape)}, whose first dimension is not the batch ({B})")
                calls.append((float(m.p), tuple(x.shape[1:]), x.dtype))
            return x

        with self._patched(record), torch.no_grad():
            probe()
        return calls

    def _draw(self, calls, rows: list[int], B: int) -> list[Tensor]:
        K = len(rows)
        masks = [torch.ones((K, B, *shape), dtype=dtype, device=self.device) for _, shape, dtype in calls]
        if not calls:
            return masks
        outer = self.gen.get_state()
        for i, n in enumerate(rows):
            if n == 0:
                continue
            self.gen.set_state(self.states[i])
            for mask, (p, shape, dtype) in zip(masks, calls):
                mask[i, :n] = F.dropout(torch.ones((n, *shape), dtype=dtype, device=self.device), p, training=True)
            self.states[i] = self.gen.get_state()
        self.gen.set_state(outer)
        return masks
