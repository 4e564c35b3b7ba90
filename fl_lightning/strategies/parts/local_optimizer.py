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
from ...optim.row_adam import RowAdam
from ...optim.state import allocate, export_optimizer_state, import_optimizer_state, reset_in_place
from ..base import ClientContext, Part
from ..records import Field, Record


COHORT_KEY = "trainer.cohort"
ROW_ADAM_COUNTERS = RowAdam.cohort_counters
# torch.optim optimizers whose update of an entry reads only that entry's gradient and state (and shared numbers):
# run over a cohort's stacked parameters (fl_lightning/cohort/), each client's rows take exactly its own step
ELEMENTWISE = ("SGD", "Adam", "AdamW", "Adamax", "NAdam", "RAdam", "RMSprop", "Adagrad")


class LocalOptimizer(Part):
    reads = ("optimizer.state",)  # what its hooks read of the client's training tensors
    writes = ("optimizer.settings", "optimizer.state", "optimizer.corrections")  # it builds the optimizer
    provides_optimizer = True  # the Strategy's required slot: built before any other part's client_start
    # trainer.compile=graphs: no step hooks; the run's one optimizer, its state zeroed in place for each client or (state=
    # persistent) each client's imported in place (optim/state.py); whether its step replays is its adapter's call
    # (graphed_step.unsupported: state allocated once, counts on the device)
    graph_safe = True

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

    def cohort_mode(self) -> tuple[str, str]:
        """How a cohort (``trainer.cohort``) steps this optimizer: ``("stacked", "")``, one optimizer over the stacked
        parameters (an elementwise ``torch.optim`` optimizer, or one with ``cohort_form`` 'elementwise' / 'rows';
        under ``state=persistent`` its per-client counters held per client: RowAdam for Adam/AdamW, the optimizer's
        own ``cohort_counters``), or ``("per_client", why)``: each client's own optimizer on its rows."""
        probe = torch.nn.Parameter(torch.zeros(2, 2))
        opt = self.factory([probe])
        cls = type(opt)
        if self.persistent:  # the clients' own counters (Adam's step) differ with their rounds
            probe.grad = torch.zeros_like(probe)
            opt.step()
            counters = [k for st in opt.state.values() for k, v in st.items()
                        if isinstance(v, (int, float)) or (isinstance(v, torch.Tensor) and v.dim() == 0)]
            rowed = ROW_ADAM_COUNTERS if self._row_adam(opt) else getattr(cls, "cohort_counters", ())
            counters = [k for k in counters if k not in rowed]
            if counters:
                return "per_client", (f"state=persistent with {cls.__name__}'s per-client counter {counters[0]!r}, "
                                      "which one stacked state cannot hold")
        torch_elementwise = cls.__module__.split(".")[:2] == ["torch", "optim"] and cls.__name__ in ELEMENTWISE
        if not torch_elementwise and getattr(cls, "cohort_form", None) not in ("elementwise", "rows"):
            return "per_client", f"{cls.__name__} has no batched form"
        return "stacked", ""

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

    @staticmethod
    def _row_adam(opt: torch.optim.Optimizer) -> bool:
        """Whether a cohort steps ``opt``'s clients with :class:`RowAdam` (each client's step count its own): torch's
        Adam or AdamW without AMSGrad or ``maximize``."""
        return type(opt) in (torch.optim.Adam, torch.optim.AdamW) and not any(
            g.get("amsgrad") or g.get("maximize") for g in opt.param_groups)

    def cohort_optimizer(self, template: torch.optim.Optimizer, hparams: list[list[dict]], stacked: dict,
                         names: list[str], params: dict) -> torch.optim.Optimizer:
        """The optimizer over a cohort's stacked parameters (``fl_lightning/cohort/``): ``template``'s class and
        groups, each group's settings as every client's start left them (``hparams``, one list per client: the
        same for all, or refused), its state fresh as :meth:`build` makes it. An elementwise optimizer's step of a
        row is that client's step."""
        def same(a, b):
            return len(a) == len(b) and all(ga.keys() == gb.keys() and all(
                torch.equal(ga[k], gb[k]) if isinstance(ga[k], torch.Tensor) else ga[k] == gb[k] for k in ga)
                for ga, gb in zip(a, b))
        if any(not same(h, hparams[0]) for h in hparams[1:]):
            raise ConfigError(COHORT_KEY, "the clients of a round start with different optimizer settings",
                              "use trainer.cohort=1 for this method")
        name_of = {id(p): n for n, p in params.items()}
        groups = [{**h, "params": [stacked[name_of[id(p)]] for p in g["params"]]}
                  for g, h in zip(template.param_groups, hparams[0])]
        cls = type(template)
        if self.persistent and self._row_adam(template):  # the clients' step counts differ: one per row
            opt = RowAdam(groups, template.defaults)
        elif getattr(cls, "cohort_form", None) is None:  # torch.optim: its constructor takes complete groups
            opt = cls(groups)
        else:  # the groups as the template's constructor made them; its other attributes fresh
            opt = cls.__new__(cls)
            torch.optim.Optimizer.__init__(opt, groups, template.defaults)
            for k, v in vars(template).items():
                if k not in ("param_groups", "state", "defaults") and not k.startswith("_"):
                    setattr(opt, k, {} if isinstance(v, dict) else v)
            if cls.cohort_form == "rows":
                opt.rows = len(next(iter(stacked.values())))
        allocate(opt)
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
