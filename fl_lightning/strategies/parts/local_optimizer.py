"""LocalOptimizer: the client's optimizer, its learning-rate schedule, and whether its state persists.

``optimizer`` is a factory ``params -> torch.optim.Optimizer`` (a Hydra ``_partial_`` of any ``torch.optim`` class,
or :class:`fl_lightning.optim.Muon`). ``param_groups`` optionally maps the module to param groups (e.g. Muon's
matrix / non-matrix split). Every group key ending in ``lr`` is multiplied by the round's schedule factor.

``state``:
  * ``reset``      fresh optimizer state every round (FedAvg as usually run; seed 004's clients);
  * ``persistent`` each client keeps its own optimizer state across rounds in the ClientStateStore
                   (seed 000's LocalMuon/FedMuon keep M_i; the recommended default for its baselines, decision
                   000/A10 in docs/decisions.md).
                   The whole state travels (per-param tensors, numbers, lists of tensors, group counters: see
                   fl_lightning/optim/state.py); a state that cannot be stored as tensors is an error, never dropped.
"""
from __future__ import annotations

from typing import Callable

import torch

from ...config import blame
from ...errors import ConfigError
from ...optim.state import allocate, export_optimizer_state, import_optimizer_state, reset_in_place
from ..base import ClientContext, Part
from ..records import Field, Record



class LocalOptimizer(Part):
    reads = ("optimizer.state",)  # what its hooks read of the client's training tensors
    writes = ("optimizer.settings", "optimizer.state", "optimizer.corrections")  # it builds the optimizer
    provides_optimizer = True  # the Strategy's required slot: built before any other part's client_start
    # no step hooks; the run's one optimizer, its state zeroed in place for each client or (state=persistent) each
    # client's imported in place (optim/state.py); whether its step replays or runs batched is its optimizer's call
    # (step/graphed.py's unsupported, cohort/optimizer.py's optimizer_mode)

    def __init__(self, optimizer: Callable, state: str = "reset", param_groups: Callable | None = None):
        if not callable(optimizer):
            raise ConfigError("optimizer", f"expected an optimizer factory, got {type(optimizer).__name__}",
                              "give a _target_ with _partial_: true (e.g. optimizer=sgd)")
        try:  # hyperparameters are checked now, on a probe tensor, not at the first client
            optimizer([torch.nn.Parameter(torch.zeros(2, 2))])  # a matrix: Muon-style optimizers accept it too
        except (ValueError, TypeError) as err:
            arg = blame(optimizer, getattr(optimizer, "keywords", {}), err)
            raise ConfigError(f"optimizer.{arg}" if arg else "optimizer",
                              f"rejected by the optimizer ({' '.join(str(err).split())})",
                              "give it a valid value (lr, momentum and weight_decay >= 0)") from None
        self.factory, self.groups_fn = optimizer, param_groups
        if state not in ("reset", "persistent"):
            raise ConfigError("state", f"unknown value {state!r}", "use reset or persistent")
        self.persistent = state == "persistent"
        self._optimizer: torch.optim.Optimizer | None = None  # the run's one optimizer object (reset_in_place)

    def build(self, client: ClientContext) -> torch.optim.Optimizer:
        """The client's optimizer as the factory makes it, the round's schedule factor applied to every ``*lr``. The
        first client's object serves every later client, reset in place to the new one's values (the same
        numbers as a fresh optimizer; a compiled step guarding on the object is reused, not recompiled)."""
        opt = self.new_optimizer(client)
        if self._optimizer is not None and self._same_params(opt):
            return reset_in_place(self._optimizer, opt)
        allocate(opt)  # the run's optimizer state, allocated once (zeroed in place for each later client)
        self._optimizer = opt
        return opt

    def _same_params(self, opt: torch.optim.Optimizer) -> bool:
        """Whether the kept optimizer's groups hold exactly ``opt``'s parameters (another module gets its own)."""
        def flat(o):
            return [(i, p) for i, g in enumerate(o.param_groups) for p in g["params"]]
        new, held = flat(opt), flat(self._optimizer)
        return len(new) == len(held) and all(i == j and a is b for (i, a), (j, b) in zip(new, held))

    def client_start(self, client: ClientContext) -> None:
        client.optimizer = self.build(client)
        if self.persistent:
            state = self.State(self, client.state)
            flat = {k[len(state.prefix):]: client.state[k] for k in state.entry.keys()}
            if flat:
                import_optimizer_state(client.optimizer, flat)

    def new_optimizer(self, client: ClientContext) -> torch.optim.Optimizer:
        """A new optimizer as :meth:`build` makes it for ``client`` (the factory's, its lr scaled), not the run's
        shared one: a cohort's per-client copy (``fl_lightning/cohort/optimizer.py``)."""
        params = self.groups_fn(client.module) if self.groups_fn is not None else list(client.params.values())
        opt = self.factory(params)
        for g in opt.param_groups:
            for k in list(g):
                if k.endswith("lr") and isinstance(g[k], (int, float)):
                    g[k] = g[k] * client.lr_factor
        return opt

    class State(Record):
        entry = Field("{}")  # state=persistent: the optimizer's state, flattened (fl_lightning/optim/state.py)

    def client_end(self, client: ClientContext):
        if self.persistent:
            try:
                flat = export_optimizer_state(client.optimizer)
            except ConfigError as err:
                raise self.error(err.key, err.problem, err.fix) from None
            state = self.State(self, client.state)
            for k, v in flat.items():
                state.entry[k] = v
        return {}
