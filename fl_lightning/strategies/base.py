"""Strategy: a federated method as an ordered list of parts with callback hooks.

The loop owns *when* things happen; a strategy owns *what* a method does at each moment (docs/design.md, "One
round" and "Writing a method"). A named method (FedAvg, SCAFFOLD, FedMuon, ...) is a config that lists its parts,
e.g. FedAvg = local optimizer + model averaging, SCAFFOLD = the same + control variates. Every hook of
:class:`Strategy` calls the same hook of each part in order. The moments, in the spirit of Lightning callbacks
and Flower's Strategy:

    setup(server)                 once, with the global parameters; create server state
    broadcast(round) -> Msgs      extra tensors every sampled client receives (the weights always travel)
    client_start(client, recv)    the module holds the global weights; build optimizer, load client state
    after_backward(client)        gradients are in p.grad: corrections (SCAFFOLD), clipping comes after
    after_step(client)            after optimizer.step(): alignment terms, extra updates
    client_end(client) -> Msgs    what the client uploads; write persistent client state to client.state
    client_idle(client)           (parts with ``uses_idle_clients``) an owned client not sampled this round
    server_update(round, agg)     consume the aggregated uploads; update global params + server state; may return
                                  ``{metric: float}`` for the round's row (Flower's ``aggregate_fit`` metrics)
    state_dict / load_state_dict  everything needed for exact resume (tensors only; loaded strictly: every key a
                                  part reads must be there and every saved key must be read)

Uploads are aggregated as streaming sums (no list of client models is kept): each :class:`Msg` carries its
weight, and ``agg.mean(key)`` is ``sum_i w_i t_i / sum_i w_i``. Bytes on the wire are counted per message after
the part's codec (``Msg.nbits``, exact; defaults to the dense size). A part may replace what the global model
costs on the way down by broadcasting a Msg under ``MODEL_KEY`` (sign updates, a compressed model).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Iterable

from torch import Tensor, nn

from ..errors import ConfigError
from ..messages import MODEL_KEY, Msg  # noqa: F401 (re-exported: the parts' and codecs' common currency)
from .aggregate import Aggregate  # noqa: F401 (re-exported)
from .context import CLIENT_TENSORS, ClientContext, ClientServices, ServerContext  # noqa: F401 (re-exported)

if TYPE_CHECKING:
    from .round_state import RoundState


class Part:
    """A composable piece of a method. Override the hooks you need; ``name`` namespaces its keys and state, which it
    declares as records of named fields (:mod:`fl_lightning.strategies.records`)."""

    name: str = "part"
    # its per-client state of a round, a RoundState dataclass (fl_lightning/strategies/round_state.py); None: none
    Round: "type[RoundState] | None" = None

    def setup(self, server: ServerContext) -> None: ...
    def broadcast(self, round_idx: int) -> dict[str, Msg]:
        return {}
    def client_start(self, client: ClientContext) -> None: ...
    def before_step(self, client: ClientContext) -> None:
        """Before each local step, outside it (a compiled or replayed step never sees it): decide from the step
        count what the step will do (Sophia's refresh every τ steps), so the step itself reads no changing number."""
    def after_backward(self, client: ClientContext) -> None: ...
    def after_step(self, client: ClientContext) -> None: ...
    def client_end(self, client: ClientContext) -> dict[str, Msg]:
        return {}
    def server_update(self, round_idx: int, agg: Aggregate) -> dict[str, float] | None: ...

    # What its step hooks read of its round state's host values, planned before the step by before_step (Sophia's
    # refresh, the last step of seed 003's order); () none. Declaring it says the step hooks read no other changing
    # host number and write only tensors that keep their memory for the run (their own buffers filled in place, the
    # server's tensors): then the same hooks run over a cohort's stacked tensors and replay in a captured graph. None:
    # they may read anything, and run one client at a time, eagerly. Any other host number they read is a 0-d tensor
    # filled in place, read through ``ClientContext.number``. How this decides the executors: fl_lightning/step/plan.py
    step_plan: tuple[str, ...] | None = None

    # A cohort stacks the clients' Round states (rows fields, round_state.py) before the step and hands each client its
    # rows back before its end; the step hooks below default to the part's own after_backward / after_step called
    # with the cohort's context (the same function over stacked tensors). A part overrides one only where its
    # batched form differs (per-client host numbers, a step the sequential loop takes by setting lr = 0).
    def cohort_check(self, module: nn.Module) -> str | None:
        """What its batched form needs of ``module`` that it lacks (checked at build), or None."""
        return None

    def cohort_rows(self) -> int:
        """How many model-sized tensors per client its Round's ``rows`` fields hold in a cohort (what
        ``cohort/memory.py`` counts before allocating); default: one per tensor ``rows`` field."""
        from .round_state import rows_fields

        return rows_fields(self)

    def cohort_start(self, cohort) -> None:
        """After every client started and the Round states were stacked: anything more to gather."""
    def cohort_after_backward(self, cohort) -> None:
        """``after_backward`` for the cohort: ``cohort.params[n].grad`` is (K, ...); a client not in
        ``cohort.active`` has a zero gradient and its rows are restored after the step."""
        self.after_backward(cohort)
    def cohort_after_step(self, cohort) -> None:
        """``after_step`` for the cohort, on ``cohort.params`` (K, ...)."""
        self.after_step(cohort)
    def cohort_end(self, cohort, i: int, client: ClientContext) -> None:
        """Just before client ``i``'s ``client_end``, after its rows went back to its Round state."""

    provides_optimizer: bool = False  # True: the part that builds client.optimizer (the strategy's required slot)
    # attributes a resume does not need (a buffer refilled for each client, a value recomputed each round from the
    # saved state): the unsaved-state check at each checkpoint leaves them alone (strategies/unsaved.py)
    scratch: tuple[str, ...] = ()

    def step_tensors(self, client: ClientContext) -> list[Tensor] | None:
        """The tensors this part's per-step hooks read (a replayed step checks their addresses at each client's
        start); None: every tensor of the part's attributes and of its round state."""
        return None

    # what the part's client-side hooks (client_start, the step hooks, client_end) read and change of the client's
    # training tensors, from CLIENT_TENSORS; every method's parts are held to both (tests/system/test_part_writes.py)
    reads: tuple[str, ...] = ()
    writes: tuple[str, ...] = ()

    # per-client outputs this part writes at its client_end (ClientContext.put) for the parts after it, and those of
    # earlier parts it reads (ClientContext.output): a reader listed before its writer is refused at build
    provides: tuple[str, ...] = ()
    reads_outputs: tuple[str, ...] = ()

    def reads_parts(self) -> dict[str, str]:
        """The other parts whose state this one reads, ``{its argument: the part's name}`` (FedSMU-M's ``momentum_of``),
        checked when the method is built, which then hands them over (:meth:`link`)."""
        return {}

    def link(self, parts: dict[str, "Part"]) -> None:
        """The parts :meth:`reads_parts` named, ``{its argument: the part}``, given once the method is built."""

    uses_idle_clients: bool = False  # True: the loop calls client_idle for every owned client not sampled this round
    def client_idle(self, client: ClientContext) -> None:
        """A client that was not sampled (no training, no upload) may still update its state from the received
        broadcast (seed 002 Alg. 7, FedSMUM: momentum completion). ``client.state`` is checked out and back in."""

    def state_dict(self) -> dict[str, Tensor]:
        return {}
    def load_state_dict(self, state: Mapping[str, Tensor]) -> None: ...

    # Hooks around the whole round's upload, for a step on all parts' uploads at once (user-level DP, fl_lightning/dp/)
    def upload(self, client: ClientContext, msgs: dict[str, Msg]) -> dict[str, Msg]:
        """After every part's ``client_end``: the client's whole upload (every part's Msgs, after their codecs), to
        change and return (DP's clip on the whole upload)."""
        return msgs
    def aggregate(self, round_idx: int, agg: Aggregate) -> None:
        """After the sums are complete (all-reduced across processes), before every part's ``server_update``: change
        the round's sums in place (DP's noise on the aggregate)."""
    releases_empty_rounds: bool = False  # True: a round nobody was sampled in still runs broadcast and server_update
    def round_limit(self, rounds_done: int, end: int) -> int | None:
        """The most rounds this run may complete (a privacy budget; below ``end``, the part logs why); None: no limit."""
        return None

    config_key: str = ""  # where the part's config sits (``method.parts.<name>``; set by build_strategy)

    def error(self, arg: str, problem: str, fix: str) -> ConfigError:
        """A one-line config error about this part's argument ``arg``, named by its full key."""
        return ConfigError(f"{self.config_key or self.name}.{arg}", problem, fix)


class Strategy:
    """An ordered composition of :class:`Part` objects (see module docstring)."""

    def __init__(self, name: str, parts: dict[str, Part] | Iterable[Part], grad_clip: float | None = None):
        if isinstance(parts, dict):
            for n, p in parts.items():
                p.name = n
            parts = list(parts.values())
        self.name, self.parts, self.grad_clip = name, list(parts), grad_clip
        self.server: ServerContext | None = None
        for p in self.parts:
            for kind in ("reads", "writes"):
                unknown = [w for w in getattr(p, kind) if w not in CLIENT_TENSORS]
                if unknown:
                    raise ConfigError("method.parts", f"part {p.name!r} ({type(p).__name__}) declares {kind} "
                                      f"{unknown[0]!r}", f"declare some of {', '.join(CLIENT_TENSORS)}")
        for i, p in enumerate(self.parts):  # an output is read after the part that writes it (client_end runs in order)
            for out in p.reads_outputs:
                later = [q for q in self.parts[i + 1:] if out in q.provides]
                if later:
                    raise ConfigError("method.parts", f"part {p.name!r} reads the client output {out!r}, which part "
                                      f"{later[0].name!r} writes after it", f"list {later[0].name} before {p.name}")

    def setup(self, server: ServerContext) -> None:
        self.server = server
        self.optimizer_part()  # fail at setup, not at the first client, when the slot is empty
        for p in self.parts:
            p.setup(server)

    def broadcast(self, round_idx: int) -> dict[str, Msg]:
        out: dict[str, Msg] = {}
        for p in self.parts:
            out.update(p.broadcast(round_idx))
        return out

    def optimizer_part(self) -> Part:
        """The required slot: the one part that builds ``client.optimizer`` (``provides_optimizer = True``)."""
        found = [p for p in self.parts if p.provides_optimizer]
        if len(found) != 1:
            raise ConfigError("method.parts", f"method {self.name!r} has {len(found)} local-optimizer parts, needs one",
                              "add local_optimizer: {_target_: fl_lightning.strategies.parts.LocalOptimizer, "
                              "optimizer: ${optimizer}}")
        return found[0]

    def client_start(self, client: ClientContext) -> None:
        """The local optimizer is built first, whatever its place in the list; then every other part in order."""
        first = self.optimizer_part()
        first.client_start(client)
        for p in self.parts:
            if p is not first:
                p.client_start(client)

    def before_step(self, client: ClientContext) -> None:
        for p in self._before:
            p.before_step(client)

    @property
    def _before(self) -> list[Part]:
        return [p for p in self.parts if overrides(p, "before_step")]

    # the step hooks: a cohort's context (``batched``) gets each part's batched form (Part.cohort_after_backward, which
    # defaults to after_backward on the stacked tensors)
    def after_backward(self, client: ClientContext) -> None:
        for p in self.parts:
            (p.cohort_after_backward if client.batched else p.after_backward)(client)

    def after_step(self, client: ClientContext) -> None:
        for p in self.parts:
            (p.cohort_after_step if client.batched else p.after_step)(client)

    def client_end(self, client: ClientContext) -> dict[str, Msg]:
        out: dict[str, Msg] = {}
        for p in self.parts:
            out.update(p.client_end(client))
        for p in self.parts:  # then the steps on the whole upload (Part.upload: DP's clip)
            if overrides(p, "upload"):
                out = p.upload(client, out)
        return out

    def add_parts(self, parts: dict[str, Part]) -> None:
        """Append parts built outside the method's yaml (the ``dp`` group's clip and noise), named as given."""
        for n, p in parts.items():
            if any(q.name == n for q in self.parts):
                raise ConfigError("method.parts", f"the method has a part named {n!r}, a name the run adds", "rename it")
            p.name = n
            self.parts.append(p)

    @property
    def releases_empty_rounds(self) -> bool:
        return any(p.releases_empty_rounds for p in self.parts)

    def round_limit(self, rounds_done: int, end: int) -> int:
        """The rounds this invocation may complete: ``end``, or less where a part sets a limit (:meth:`Part.round_limit`)."""
        return min([end, *(lim for p in self.parts if (lim := p.round_limit(rounds_done, end)) is not None)])

    @property
    def uses_idle_clients(self) -> bool:
        return any(p.uses_idle_clients for p in self.parts)

    def client_idle(self, client: ClientContext) -> None:
        for p in self.parts:
            if p.uses_idle_clients:
                p.client_idle(client)

    def server_update(self, round_idx: int, agg: Aggregate) -> dict[str, float]:
        """Every part's server step; returns the metrics they report (keys as given: name them after the part)."""
        metrics: dict[str, float] = {}
        for p in self.parts:  # the steps on the complete sums first (Part.aggregate: DP's noise)
            if overrides(p, "aggregate"):
                p.aggregate(round_idx, agg)
        for p in self.parts:
            metrics.update(p.server_update(round_idx, agg) or {})
        return metrics

    def state_dict(self) -> dict[str, Tensor]:
        return {f"{p.name}/{k}": v for p in self.parts for k, v in p.state_dict().items()}

    def load_state_dict(self, state: Mapping[str, Tensor]) -> None:
        """Each part reads its slice ``"<part>/..."``; with a :class:`~fl_lightning.checkpoint.TrackedState` the
        checkpointer then refuses missing and unread keys (strict resume)."""
        device = self.server.device if self.server is not None else None
        for p in self.parts:
            pre = f"{p.name}/"
            view = state.sub(pre) if hasattr(state, "sub") else {k[len(pre):]: v for k, v in state.items() if k.startswith(pre)}
            p.load_state_dict(_OnDevice(view, device) if device is not None else view)


class _OnDevice(Mapping):
    """A lazy view of saved state that moves each tensor to the device as a part reads it."""

    def __init__(self, state: Mapping, device):
        self._state, self._device = state, device

    def __getitem__(self, key):
        v = self._state[key]
        return v.to(self._device) if isinstance(v, Tensor) else v

    def __contains__(self, key):
        return key in self._state

    def __iter__(self):
        return iter(self._state)

    def __len__(self):
        return len(self._state)


STEP_HOOKS = ("after_backward", "after_step")  # what runs inside the local step (before_step runs outside it)


def overrides(part: Part, hook: str) -> bool:
    """Whether ``part`` does something at ``hook`` (its class overrides :class:`Part`'s no-op): the one rule the
    step, the cohort, the capture wrapper and the tables read."""
    return getattr(type(part), hook) is not getattr(Part, hook)


def steps_inside(part: Part) -> bool:
    """Whether ``part`` does work inside the local step (``after_backward`` / ``after_step``)."""
    return any(overrides(part, h) for h in STEP_HOOKS)

