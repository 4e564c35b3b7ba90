"""What a part sees: the server's context at setup and server time, and a client's context while it trains (its
module, optimizer, private state, round states and the narrow services a part may ask for), with the helpers a step
hook written once for one client and for a cohort uses (a cohort's context has the same, per client:
:mod:`fl_lightning.cohort.context`)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Protocol

import torch
from torch import Tensor, nn

if TYPE_CHECKING:  # (in the annotations: Part, strategies/base.py, which imports this file; ClientStateStore,
    from .round_state import RoundState  # the loop's, fl_lightning/loop/client_store.py: handed over, not imported)


@dataclass
class ServerContext:
    """What parts see at setup and server time."""

    module: nn.Module
    global_params: dict[str, Tensor]      # name -> device tensor: the communicated global state (x)
    trainable: list[str]                  # names of trainable parameters (subset of global_params)
    num_clients: int
    clients_per_round: int
    rounds: int
    device: torch.device
    client_num_samples: list[int]
    owned_clients: list[int] = field(default_factory=list)  # clients whose state this process keeps
    store: "ClientStateStore | None" = None  # parts may initialise client state at setup
    probe_gradient: Callable[[int], dict[str, Tensor]] | None = None  # client -> its gradient at the global weights
    all_reduce_sum: Callable[[Tensor], Tensor] | None = None  # summed over processes (identity on one)
    lr_factor: Callable[[int], float] | None = None  # round -> schedule multiplier
    local_steps: int | None = None        # K (None when training by epochs)

    def round_lr_factor(self, r: int) -> float:
        """The schedule's multiplier of round ``r`` (1 without a schedule)."""
        return float(self.lr_factor(r)) if self.lr_factor is not None else 1.0


class ClientServices(Protocol):
    """What the loop computes for a part on request (:class:`fl_lightning.loop.services.LoopServices` provides it, not
    the loop itself): extra gradients and Hessian-vector products on the client's module, a fresh minibatch's
    gradient, and generators seeded by (seed, purpose, client, round)."""

    def gradient_at(self, weights: dict[str, Tensor] | None, batch: dict, loss_fn=None) -> dict[str, Tensor]: ...
    def hvp(self, vector: dict[str, Tensor], batch: dict, loss_fn=None) -> dict[str, Tensor]: ...
    def extra_gradient(self, client: int, round_idx: int) -> dict[str, Tensor]: ...
    def client_rng(self, purpose: str, client: int, round_idx: int) -> torch.Generator: ...


# what a part may change while a client trains (Part.writes): the module's trainable parameters, their gradients, the
# local optimizer's group settings (lr, weight decay), its per-parameter state, Muon's corrections
CLIENT_TENSORS = ("weights", "grads", "optimizer.settings", "optimizer.state", "optimizer.corrections")


@dataclass
class ClientContext:
    """One client's round: everything a part may use while the client trains. ``state`` is its private persistent
    state (device tensors while it trains); :meth:`state_of` a part's typed state of the round (its ``Round``:
    :mod:`fl_lightning.strategies.round_state`); ``services`` the loop's computations on request. A part's
    per-client work depends on these and its own state only."""

    id: int
    round: int
    module: nn.Module
    params: dict[str, nn.Parameter]       # trainable parameters of the on-device module
    local: dict[str, Tensor]              # the module's communicated tensors (same keys as global_params)
    global_params: dict[str, Tensor]      # the received global state x^r (read-only during the round)
    state: dict[str, Tensor]
    num_samples: int
    num_steps: int                        # K for this round
    lr_factor: float                      # learning-rate schedule multiplier for this round
    received: dict[str, Tensor] = field(default_factory=dict)
    optimizer: torch.optim.Optimizer | None = None
    step: int = 0                         # local steps done so far
    batch: dict | None = None             # the current minibatch (cast, on the device) during the step hooks
    loss: Tensor | None = None            # its loss (detached after backward)
    services: ClientServices | None = None  # None: a part driven without a loop (unit tests)
    _states: dict[str, "RoundState"] = field(default_factory=dict, repr=False)
    _outputs: dict[str, object] = field(default_factory=dict, repr=False)

    def put(self, part: "Part", name: str, value) -> None:
        """``part``'s per-client output ``name`` for the parts after it (declared in ``part.provides``: the one way a
        part hands another a value of this client's round, e.g. ModelAverage's ``model_update``, the reconstruction it
        uploaded, read by MagnitudeUniformity)."""
        if name not in part.provides:
            raise RuntimeError(f"{type(part).__name__} writes the client output {name!r} without declaring it in provides")
        self._outputs[name] = value

    def output(self, name: str):
        """The per-client output ``name`` an earlier part provided this round, or None (no part of the method
        provides it). A part reading it declares it in ``reads_outputs`` (the method's order is checked at build)."""
        return self._outputs.get(name)

    def start_state(self, part: "Part", state: "RoundState") -> "RoundState":
        """``part``'s state of this client's round, made by its ``client_start``: an instance of its declared
        ``Round`` (checked), which goes with the round."""
        if part.Round is None or type(state) is not part.Round:
            raise RuntimeError(f"{type(part).__name__} starts a round state of type {type(state).__name__}, "
                               f"declares {getattr(part.Round, '__name__', None)}")
        self._states[part.name] = state
        return state

    def state_of(self, part: "Part") -> "RoundState":
        """``part``'s state of this client's round (:meth:`start_state`)."""
        return self._states[part.name]

    # a step hook written once for one client and for a cohort (whose context has the same helpers)
    all_active = True
    batched = False  # the parts' per-step hooks as they are (a cohort's context: their batched forms)
    traced: bool = False  # set by the capture wrapper while a compiler traces or a CUDA graph captures the step

    def number(self, host, tensor: Tensor | None):
        """A number a part planned before the step, as the step must read it: ``host()`` (a function giving the float:
        the eager arithmetic) or, in a traced step (``torch.compile``, a CUDA graph's capture: ``traced``), its 0-d
        ``tensor`` filled in place, an input of the graph rather than a constant of it (the host value is then not
        read). The one place that tells the two apart."""
        return tensor if self.traced and tensor is not None else host()

    def clip_grad_norm_(self, max_norm: float) -> None:
        """``method.grad_clip``: the gradient scaled to norm ``max_norm`` if above it (``clip_grad_norm_``; for a
        cohort: each client's norm over all its parameters)."""
        torch.nn.utils.clip_grad_norm_(list(self.params.values()), max_norm)

    @staticmethod
    def copy_rows_(dst: list[Tensor], src: list[Tensor]) -> None:
        """``dst ← src`` (for a cohort: the rows of the clients taking this step)."""
        torch._foreach_copy_(dst, src)

    @staticmethod
    def norm_of(tensors: list[Tensor]) -> Tensor:
        """The 2-norm of all of ``tensors`` together (for a cohort: each client's, (K,))."""
        return torch.linalg.vector_norm(torch.stack(torch._foreach_norm(tensors)))

    @staticmethod
    def div_rows_(tensors: list[Tensor], x: Tensor) -> None:
        """``tensors /= x`` (for a cohort: each client's rows by its own entry of ``x`` (K,))."""
        torch._foreach_div_(tensors, x)

    def gradient_at(self, weights: dict[str, Tensor] | None = None, batch: dict | None = None,
                    loss_fn=None) -> dict[str, Tensor]:
        """The gradient of ``loss_fn(module, batch)`` (default: ``module.training_step``) at ``weights`` (a
        ``{name: tensor}`` subset of the trainable params; default: the current ones) on ``batch`` (default: the
        current minibatch). The module's weights and ``p.grad`` are left exactly as they were."""
        return self.services.gradient_at(weights, self.batch if batch is None else batch, loss_fn)

    def extra_gradient(self) -> dict[str, Tensor]:
        """The gradient at the module's current weights on a fresh minibatch of this client (its own (seed, client,
        round) stream, apart from the training batches)."""
        return self.services.extra_gradient(self.id, self.round)

    def hvp(self, vector: dict[str, Tensor], batch: dict | None = None, loss_fn=None) -> dict[str, Tensor]:
        """Hessian-vector product ``∇²f · v`` at the current weights on ``batch`` (default: the current minibatch), by
        double backward (Pearlmutter 1994); ``vector`` maps trainable-param names to tensors. ``p.grad`` is untouched."""
        return self.services.hvp(vector, self.batch if batch is None else batch, loss_fn)

    def rng(self, purpose: str) -> torch.Generator:
        """A generator on the device seeded by (seed, purpose, client, round): the same on resume, on any process
        count, whoever else was sampled (Hutchinson probes, sampled labels, stochastic rounding)."""
        return self.services.client_rng(purpose, self.id, self.round)

    def codec_rng(self) -> torch.Generator | None:
        """The generator randomized codecs draw from (``rng("codec")``), or None without a loop."""
        return self.rng("codec") if self.services is not None else None
