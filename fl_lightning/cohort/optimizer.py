"""The local optimizer of a cohort whose optimizer has no batched form: one optimizer per client.

A cohort (``trainer.cohort``, fl_lightning/cohort/) steps its clients' stacked parameters with one optimizer when
the optimizer's update of a client's row reads only that row (an elementwise ``torch.optim`` optimizer, Lion,
Sophia, Adam with per-client step counts: RowAdam) or each row's matrix on its own (Muon). SOAP keeps per client
Kronecker factors and eigenbases refreshed at the client's own step counts (Vyas et al., ICLR 2025, arXiv
2409.11321, Alg. 3), and an optimizer that keeps a per-client counter without declaring it (NAdam's ``mu_product``)
cannot share one state. For those, :class:`ClientByClient` keeps each client's own optimizer, a copy of the one its
start built (settings, state, corrections), and steps it on the client's rows: rows copied into the module's
parameters, one step, rows copied back. The forward, backward and parts of the step stay batched; the optimizer's
launches are K times one client's. Each client's step is its sequential step exactly (the same optimizer on the same
numbers).
"""
from __future__ import annotations

import copy

import torch
from torch import Tensor

from ..errors import ConfigError
from ..optim.row_adam import RowAdam
from ..optim.state import allocate, is_fresh, mark_imported, reset_in_place
from .memory import KEY

# torch.optim optimizers whose update of an entry reads only that entry's gradient and state (and shared numbers):
# run over a cohort's stacked parameters, each client's rows take exactly its own step
ELEMENTWISE = ("SGD", "Adam", "AdamW", "Adamax", "NAdam", "RAdam", "RMSprop", "Adagrad")


def optimizer_mode(part) -> tuple[str | None, str]:
    """How a cohort steps the optimizer ``part`` builds (the part that ``provides_optimizer``): ``("stacked", "")``,
    one optimizer over the stacked parameters (an elementwise ``torch.optim`` optimizer, or one with ``cohort_form``
    'elementwise' / 'rows'; under ``state=persistent`` its per-client counters held per client: RowAdam for Adam/AdamW,
    the optimizer's own ``cohort_counters``), ``("per_client", why)``: each client's own optimizer on its rows
    (:class:`ClientByClient`; the part gives ``new_optimizer(client)``), or ``(None, why)``: not at all (a part that
    does not declare its optimizer's ``factory``; refused at build)."""
    factory = getattr(part, "factory", None)
    if factory is None or not callable(getattr(part, "new_optimizer", None)):
        return None, "it declares no optimizer factory"
    probe = torch.nn.Parameter(torch.zeros(2, 2))
    opt = factory([probe])
    cls = type(opt)
    if getattr(part, "persistent", False):  # the clients' own counters (Adam's step) differ with their rounds
        probe.grad = torch.zeros_like(probe)
        opt.step()
        counters = [k for st in opt.state.values() for k, v in st.items()
                    if isinstance(v, (int, float)) or (isinstance(v, torch.Tensor) and v.dim() == 0)]
        rowed = RowAdam.cohort_counters if _row_adam(opt) else getattr(cls, "cohort_counters", ())
        counters = [k for k in counters if k not in rowed]
        if counters:
            return "per_client", (f"state=persistent with {cls.__name__}'s per-client counter {counters[0]!r}, "
                                  "which one stacked state cannot hold")
    torch_elementwise = cls.__module__.split(".")[:2] == ["torch", "optim"] and cls.__name__ in ELEMENTWISE
    if not torch_elementwise and getattr(cls, "cohort_form", None) not in ("elementwise", "rows"):
        return "per_client", f"{cls.__name__} has no batched form"
    return "stacked", ""


def _row_adam(opt: torch.optim.Optimizer) -> bool:
    """Whether a cohort steps ``opt``'s clients with :class:`RowAdam` (each client's step count its own): torch's
    Adam or AdamW without AMSGrad or ``maximize``."""
    return type(opt) in (torch.optim.Adam, torch.optim.AdamW) and not any(
        g.get("amsgrad") or g.get("maximize") for g in opt.param_groups)


def stacked_optimizer(part, template: torch.optim.Optimizer, hparams: list[list[dict]], stacked: dict,
                      params: dict, kept: torch.optim.Optimizer | None = None) -> torch.optim.Optimizer:
    """The optimizer over a cohort's stacked parameters: ``template``'s class and groups, each group's settings as
    every client's start left them (``hparams``, one list per client: the same for all, or refused), its state fresh
    as the part's ``build`` makes it. An elementwise optimizer's step of a row is that client's step. ``kept``: the
    run's optimizer over the same stacked parameters (an earlier cohort's), reset in place to these values and
    returned (allocated once a run: a compiled or captured step reads the same object and state tensors)."""
    def same(a, b):
        return len(a) == len(b) and all(ga.keys() == gb.keys() and all(
            torch.equal(ga[k], gb[k]) if isinstance(ga[k], torch.Tensor) else ga[k] == gb[k] for k in ga)
            for ga, gb in zip(a, b))
    if any(not same(h, hparams[0]) for h in hparams[1:]):
        raise ConfigError(KEY, "the clients of a round start with different optimizer settings",
                          "use trainer.cohort=1 for this method")
    name_of = {id(p): n for n, p in params.items()}
    groups = [{**h, "params": [stacked[name_of[id(p)]] for p in g["params"]]}
              for g, h in zip(template.param_groups, hparams[0])]
    cls = type(template)
    if getattr(part, "persistent", False) and _row_adam(template):  # the clients' step counts differ: one per row
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
    if kept is not None and type(kept) is type(opt):
        try:
            return reset_in_place(kept, opt)
        except ValueError:  # other parameters: a new one
            pass
    allocate(opt)
    return opt


class ClientByClient:
    """K clients' optimizers, each stepped on its client's rows of the stacked parameters (see the module docstring)."""

    cohort_form = "per_client"

    def __init__(self, optimizers: list[torch.optim.Optimizer], params: list[Tensor], stacked: list[Tensor]):
        self.optimizers, self.params, self.stacked = optimizers, params, stacked
        self.state: dict = {}  # no stacked state: each client's is its own optimizer's (a finished one's untouched)
        self.active: list[bool] = [True] * len(optimizers)  # the clients taking this step (host flags)

    @property
    def param_groups(self) -> list[dict]:
        return self.optimizers[0].param_groups

    @torch.no_grad()
    def step(self) -> None:
        grads = [s.grad for s in self.stacked]
        for i, opt in enumerate(self.optimizers):
            if not self.active[i]:
                continue
            torch._foreach_copy_(self.params, [s[i] for s in self.stacked])
            for p, g in zip(self.params, grads):
                p.grad = g[i] if g is not None else None
            opt.step()
            torch._foreach_copy_([s[i] for s in self.stacked], self.params)
        for p in self.params:
            p.grad = None

    def hand_back(self, i: int, optimizer: torch.optim.Optimizer) -> None:
        """Client ``i``'s optimizer state moved into ``optimizer`` (the client's own, over the same parameters, read by
        its ``client_end``): its entries as they are (no cast, no copy; this cohort is done with them)."""
        own = self.optimizers[i]
        optimizer.state.clear()
        for p, st in own.state.items():
            optimizer.state[p] = st
        mark_imported(optimizer)
        if getattr(own, "corrections", None) is not None:
            optimizer.corrections = own.corrections


def copy_of(optimizer: torch.optim.Optimizer, fresh: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """``fresh`` (the factory's new optimizer over the same parameters) made a copy of ``optimizer``: its groups'
    settings, its state entry by entry (tensors cloned, numbers as they are: no cast) and its corrections."""
    for g, h in zip(fresh.param_groups, optimizer.param_groups):
        g.update({k: v for k, v in h.items() if k != "params"})
    if not is_fresh(optimizer):
        for p, st in optimizer.state.items():
            if st:
                fresh.state[p] = {k: v.clone() if isinstance(v, Tensor) else copy.deepcopy(v) for k, v in st.items()}
        mark_imported(fresh)
    if getattr(optimizer, "corrections", None):
        fresh.corrections = dict(optimizer.corrections)
    return fresh
