"""Cohort: a round's clients trained K at a time in one batched step (``trainer.cohort=K``).

The sequential loop pays a step's few dozen small kernels once per client. A cohort stacks K clients' trainable
parameters along a leading client dimension and runs their local steps as one: the forward and backward through
``torch.func`` (``functional_call`` under ``vmap``, one backward over the sum of the K losses: the clients are
independent, so each row's gradient is its own client's), the parts' step hooks on the stacked tensors, and the
local optimizer over the stacked parameters (an elementwise optimizer, whose update of one row reads only that row,
or Muon, which orthogonalizes each row's matrix on its own). K clients' steps cost about one client's launches
(FedAvg on the default CNN: 8 ops per client-step at K = 8 against 33 sequential): the GPU path for the small
models of cross-device work (docs/benchmarks.md, "A cohort of clients"). On a CPU it is no faster, so the default
is 1. Under ``trainer.compile=step`` each client's loss and gradient are functions (``vmap(grad_and_value)``),
compiled into one graph.

Each client keeps what makes it itself: its batches come from its own (seed, client, round) stream and are padded to
the data's batch size with a 0/1 row mask (its loss is the mean over its real rows, as in the sequential step), its
start and end (state checked out, the parts' ``client_start`` and ``client_end``, the upload) run as in the
sequential loop, one client at a time, and a client with fewer steps than the others is frozen once it is done (its
rows of the parameters and optimizer state are kept as they were). The uploads are added in the sequential order,
so the server's side and the checkpoints are the same; the result equals the sequential run up to the rounding of
the batched kernels (tests/system/test_cohort.py: 1e-12 relative in float64).

A part runs batched when it has no per-step hooks, or declares ``batched = True``: its ``Round`` state
(``strategies/round_state.py``) is stacked, its step hooks run on the stacked tensors (the same functions, or its
own ``cohort_after_backward`` / ``cohort_after_step``), and a finished client's rows of its state stay as they were.
The optimizer is one over the stacked parameters, or each client's own on its rows (``cohort/optimizer.py``). A
method with a part that cannot, a model without per-example losses (``sample_losses``), with float buffers (batch
norm) or a random layer other than ``nn.Dropout`` (whose masks each client draws from its own stream:
``cohort/dropout.py``), and a K whose stacked copies do not fit the free memory are refused in one line naming what
stops it.
"""
from __future__ import annotations

import contextlib
import logging
import math
from dataclasses import dataclass, field
from typing import Iterator

import torch
from torch import Tensor, nn

from ..errors import ConfigError, NonFiniteLossError
from ..optim.state import PY, export_optimizer_state, import_optimizer_state, is_fresh
from ..services import twice_differentiable
from ..strategies.base import ClientContext, Part
from ..strategies.parts.local_optimizer import COHORT_KEY
from ..strategies.round_state import RoundState
from .dropout import CohortDropout, dropout_sites
from .memory import AUTO_FRACTION, STACKED_COPIES, check_cohort_memory, client_bytes  # noqa: F401
from .optimizer import ClientByClient, copy_of
from .rows import flat_rows, scale_rows_

KEY = COHORT_KEY
log = logging.getLogger("fl_lightning")


def part_batches(part: Part) -> bool:
    """Whether ``part`` can run in a cohort: it declares the cohort hooks, or it has no per-step hooks at all."""
    if getattr(part, "batched", False):
        return True
    hooks = ("before_step", "after_backward", "after_step")
    return all(getattr(type(part), h) is getattr(Part, h) for h in hooks)


def check_cohort(strategy, module: nn.Module, size: int, compiled: str | None = None) -> None:
    """Refuse, in one line naming what stops it, a run that cannot train its clients ``size`` at a time."""
    if size <= 1:
        return
    if compiled == "graphs":
        raise ConfigError(KEY, "trainer.compile=graphs does not replay a cohort's step yet",
                          "use trainer.compile=step (or none) with trainer.cohort, or trainer.cohort=1")
    for p in strategy.parts:
        if p.provides_optimizer:
            mode, reason = p.cohort_mode()
            if mode is None:
                raise ConfigError(KEY, f"method {strategy.name!r}: its local optimizer cannot run batched ({reason})",
                                  "use trainer.cohort=1")
        elif not part_batches(p):
            raise ConfigError(KEY, f"method {strategy.name!r}: part {p.name!r} ({type(p).__name__}) has per-step "
                              "hooks without a batched form", "use trainer.cohort=1 for this method")
        elif getattr(p, "batched", False) and (why := p.cohort_check(module)):
            raise ConfigError(KEY, f"method {strategy.name!r}: part {p.name!r} ({type(p).__name__}): {why}",
                              "use trainer.cohort=1 for this method")
    if not callable(getattr(module, "sample_losses", None)):
        raise ConfigError(KEY, f"model {type(module).__name__} has no per-example losses (sample_losses)",
                          "use trainer.cohort=1 for this model")
    for name, m in module.named_modules():
        if type(m) is nn.Dropout:  # drawn per client from its own stream (cohort/dropout.py)
            continue
        p = getattr(m, "p", None) if "Dropout" in type(m).__name__ else getattr(m, "drop_prob", None)
        if isinstance(p, float) and p > 0:
            raise ConfigError(KEY, f"the model's {name or 'root'} ({type(m).__name__}) draws {type(m).__name__} "
                              "randomness, which a cohort does not draw per client (only torch.nn.Dropout)",
                              "use trainer.cohort=1, or a model without it")
        drop = getattr(getattr(m, "attn_drop", None), "p", 0.0)
        if getattr(m, "fused_attn", False) is True and drop > 0:
            raise ConfigError(KEY, f"the model's {name} draws attention dropout inside the fused attention kernel, "
                              "which a cohort cannot draw per client", "use trainer.cohort=1, or attention dropout 0")
    if compiled == "step" and dropout_sites(module):
        raise ConfigError(KEY, "a cohort draws each client's dropout masks on the host, which trainer.compile=step "
                          "does not trace", "use trainer.compile=none with a cohort of this model, or trainer.cohort=1")
    floats = [n for n, b in module.named_buffers() if b.is_floating_point()]
    if floats:
        raise ConfigError(KEY, f"the model has float buffers ({floats[0]}: batch-norm statistics), which a cohort does "
                          "not stack", "use trainer.cohort=1, or a model with group norm")


def load_rows(opt, template, states: list, corrections: list, stacked: dict, names: list, params: dict) -> set:
    """Each client's optimizer state as its start left it (``states``: a flat export, None for a fresh one) and its
    corrections (``Muon.set_correction``), stacked into ``opt`` over the stacked parameters. A per-parameter entry of
    the parameter's shape is stacked along the client dimension, and so is a counter ``opt`` holds per client
    (``cohort_counters``: RowAdam's and Sophia's ``step``, (K,)); any other entry must be the same for every client
    of the cohort. Returns the flat keys that were stacked."""
    rowed: set = set()
    if any(s is not None for s in states):
        shapes = {str(i): params[n].shape for i, n in enumerate(_order(template, params))}
        counters = set(getattr(opt, "cohort_counters", ()))
        keys = {k for s in states if s is not None for k in s}
        flat = {}
        for key in keys:
            vals = [s[key] if s is not None else None for s in states]
            head, entry = key.split("/", 1)
            ref = next(v for v in vals if v is not None)
            rows = [v if v is not None else torch.zeros_like(ref) for v in vals]  # a fresh client's: zeros
            if head in shapes and ref.shape == shapes[head]:
                flat[key] = torch.stack(rows)
                rowed.add(key)
            elif head in shapes and entry.removesuffix(PY) in counters and ref.dim() == 0:  # one count per client
                flat[f"{head}/{entry.removesuffix(PY)}"] = torch.stack(rows)
                rowed.add(key)
            else:
                if any(v is not None and not torch.equal(v, ref) for v in vals):
                    raise ConfigError(KEY, f"the clients of a cohort hold different optimizer counters ({key})",
                                      "use trainer.cohort=1 for this method")
                flat[key] = ref
        import_optimizer_state(opt, flat)
    if any(corrections):
        by_param = {id(p): n for n, p in params.items()}
        corr = {}
        for p in corrections[next(i for i, c in enumerate(corrections) if c)]:
            n = by_param[id(p)]
            rows = [c.get(p) for c in corrections]
            ref = next(c for c in rows if c is not None)
            corr[stacked[n]] = torch.stack([c if c is not None else torch.zeros_like(ref) for c in rows])
        opt.corrections = corr
    return rowed


def _order(opt, params: dict) -> list[str]:
    """The names of ``opt``'s parameters in its state-dict order."""
    by_param = {id(p): n for n, p in params.items()}
    return [by_param[id(p)] for g in opt.param_groups for p in g["params"]]


class _Losses(nn.Module):
    """``module.sample_outputs`` (or, for a model without it, ``module.sample_losses``) as a forward, for
    ``functional_call``."""

    def __init__(self, module: nn.Module):
        super().__init__()
        self.m = module
        self.split = callable(getattr(module, "sample_outputs", None))

    def forward(self, batch: dict) -> Tensor:
        return self.m.sample_outputs(batch) if self.split else self.m.sample_losses(batch)


@dataclass
class CohortContext:
    """K clients' round in one batched step: what a part's cohort hooks see. ``params``: the stacked trainable
    parameters (K, ...) (``.grad`` after backward); ``active``: which clients take this step (a client whose steps
    are done is frozen); ``step``: the steps taken so far; ``clients``: each client's own context (its round states,
    state, received tensors), started by the parts' ``client_start``; :meth:`state_of` a part's round states, stacked.
    The helpers a step hook written for one client uses (``copy_rows_``, ``norm_of``, ``div_rows_``,
    ``gradient_at``) act per client."""

    clients: list[ClientContext]
    params: dict[str, Tensor]
    global_params: dict[str, Tensor]
    active: Tensor
    step: int = 0
    optimizer: torch.optim.Optimizer | None = None  # the local optimizer over ``params``
    batch: dict | None = None  # the step's stacked batch (K, B, ...), its 0/1 row mask and real rows, during the hooks
    mask: Tensor | None = None
    count: Tensor | None = None
    services: object | None = None  # the Cohort: gradients, Hessian-vector products over the stacked batch
    all_active: bool = True  # every client takes this step (host flag)
    _states: dict[str, RoundState] = field(default_factory=dict, repr=False)

    @property
    def round(self) -> int:
        return self.clients[0].round

    def state_of(self, part: Part) -> RoundState:
        """``part``'s Round state of the K clients, stacked (``round_state.RoundState.stacked``)."""
        return self._states[part.name]

    def copy_rows_(self, dst: list[Tensor], src: list[Tensor]) -> None:
        """``dst ← src`` in the rows of the clients taking this step (a finished client's rows stay)."""
        if self.all_active:
            torch._foreach_copy_(dst, src)
            return
        for d, t in zip(dst, src):
            d.copy_(torch.where(self.active_like(t), t, d))

    @staticmethod
    def norm_of(tensors: list[Tensor]) -> Tensor:
        """Each client's 2-norm over all of ``tensors`` (K, ...): (K,)."""
        K = tensors[0].shape[0]
        return torch.linalg.vector_norm(torch.cat([t.reshape(K, -1) for t in tensors], dim=1), dim=1)

    @staticmethod
    def div_rows_(tensors: list[Tensor], x: Tensor) -> None:
        """Each client's rows of ``tensors`` (K, ...) divided by its entry of ``x`` (K,) (a fixed number of kernels:
        ``cohort/rows.py``)."""
        scale_rows_(tensors, x, "div")

    @staticmethod
    def mul_rows_(tensors: list[Tensor], x: Tensor) -> None:
        """Each client's rows of ``tensors`` (K, ...) multiplied by its entry of ``x`` (K,) (``cohort/rows.py``)."""
        scale_rows_(tensors, x, "mul")

    def gradient_at(self, weights: dict[str, Tensor]) -> dict[str, Tensor]:
        """Each client's gradient at ``weights`` on its own minibatch of the step (``Cohort.gradient_at``), as
        ``ClientContext.gradient_at`` for one client."""
        return self.services.gradient_at(self, weights)

    def per_client(self, values: list, dtype=torch.float32) -> Tensor:
        """Host numbers, one per client, as a (K,) tensor on the clients' device, without waiting for the device
        (pinned memory, an asynchronous copy on CUDA): FAFED's 1 − α and η, a mask of the clients at their last step."""
        device = self.active.device
        t = torch.tensor(values, dtype=dtype)
        return t.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else t.to(device)

    def active_like(self, t: Tensor) -> Tensor:
        """``active`` shaped to broadcast against a stacked tensor ``t`` (K, ...)."""
        return self.active.view(-1, *([1] * (t.dim() - 1)))


class Cohort:
    """Trains a process's sampled clients ``size`` at a time (see the module docstring); built by the loop."""

    def __init__(self, loop, size: int, compiled: str | None = None, backend: str = "inductor"):
        """``compiled``: ``trainer.compile`` (``step``: the cohort's forward and backward compiled once, one graph)."""
        check_cohort(loop.strategy, loop.module, size, compiled)
        self.loop, self.size = loop, int(size)
        self.grads = None
        if compiled == "step":
            from ..compiled_step import compile_cache

            compile_cache()  # inductor's code cached per CPU ISA under the package's cache folder
            self.grads = torch.compile(self._grads, backend=backend)
        if loop.device.type == "cpu":  # torch has no vmap rule for the CPU's fused attention (it would loop over the
            for m in loop.module.modules():  # clients): timm's attention written out instead, batched matmuls
                if isinstance(getattr(m, "fused_attn", None), bool):
                    m.fused_attn = False
        self.losses = _Losses(loop.module)
        mode, why = loop.strategy.optimizer_part().cohort_mode()
        self.per_client = mode == "per_client"  # each client's own optimizer on its rows (cohort/optimizer.py)
        if self.per_client and getattr(loop, "rank", 0) == 0:
            log.info("trainer.cohort: the local optimizer steps each client's rows with its own optimizer (%s)", why)
        self.dropout = CohortDropout(loop.module, loop.device)  # each client's masks from its own stream
        self._rows: list[int] = []  # each client's real rows in this step (host numbers)
        self.names = list(loop.params)
        self._buffers: tuple[int, dict[str, Tensor]] = (0, {})  # (K, the stacked parameters) of the last cohort size

    def train(self, cids: list[int], r: int, received: dict[str, Tensor], lr_f: float) -> Iterator[tuple[int, dict, float]]:
        """``(client, uploads, mean loss)`` for each of ``cids``, in order."""
        for i in range(0, len(cids), self.size):
            yield from self._train_cohort(cids[i:i + self.size], r, received, lr_f)

    # ---------------------------------------------------------------------------------------------- one cohort
    def _train_cohort(self, cids, r, received, lr_f):
        loop, strategy = self.loop, self.loop.strategy
        opt_part = strategy.optimizer_part()
        real = len(cids)
        phantoms = self.size - real if self.pad_remainder else 0
        K, device = real + phantoms, loop.device
        stacked = self._stacked(K)
        clients, hparams, states, corrections, own = [], [], [], [], []
        self.dropout.start()
        for i, cid in enumerate(cids + cids[:1] * phantoms):  # each client's start as in the sequential loop, then
            if i >= real:  # its values as row i; a phantom row: the first client's start again, no steps, no upload
                client = self._phantom(cid, r, received, lr_f)
            else:
                client = loop.start_client(cid, r, received, lr_f)
            if self.dropout:
                self.dropout.keep()  # its stream as its start left it
            opt = client.optimizer
            with torch.no_grad():  # the weights as its start left them (the global model, or a part's first move)
                torch._foreach_copy_([stacked[n][i] for n in self.names], [loop.params[n] for n in self.names])
            if self.per_client:  # a copy of the optimizer its start built (settings, state, corrections)
                own.append(copy_of(opt, opt_part.new_optimizer(client)))
            else:
                hparams.append([{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups])
                states.append(None if is_fresh(opt) else {k: v.clone() for k, v in export_optimizer_state(opt).items()})
                corrections.append(dict(getattr(opt, "corrections", None) or {}))
            clients.append(client)
        steps = [c.num_steps for c in clients]
        if self.per_client:
            optimizer = ClientByClient(own, [loop.params[n] for n in self.names], [stacked[n] for n in self.names])
        else:
            optimizer = opt_part.cohort_optimizer(clients[-1].optimizer, hparams, stacked, self.names, loop.params)
            load_rows(optimizer, clients[-1].optimizer, states, corrections, stacked, self.names, loop.params)
        ctx = CohortContext(clients, stacked, loop.global_params, torch.ones(K, dtype=torch.bool, device=device),
                            optimizer=optimizer, services=self)
        for p in strategy.parts:
            if p is not opt_part and getattr(p, "batched", False):
                if p.Round is not None:  # the clients' round states, stacked (their rows fields)
                    ctx._states[p.name] = p.Round.stacked([c.state_of(p) for c in clients])
                p.cohort_start(ctx)
        batches = loop.data.cohort_batches([c.id for c in clients[:real]], r, device, loop.budget)
        if batches is None:  # a transform drawing per batch: each client's own batches, stacked here
            batches = self._stacked_batches(clients[:real], steps[:real], r)
        if phantoms:
            batches = self._padded(batches, phantoms)
        loss_sum = torch.zeros(K, device=device)
        first = None
        ends: dict[int, list[int]] = {}
        for i, s in enumerate(steps):
            ends.setdefault(s, []).append(i)
        finished: dict[int, dict] = {}
        for k, (batch, mask, count, active, rows) in enumerate(batches):
            batch = loop.services.cast_floats(batch)
            self._rows = rows
            if self.per_client:
                optimizer.active = [n > 0 for n in rows]
            ctx.active, ctx.step, ctx.batch, ctx.mask, ctx.count = active, k, batch, mask, count
            for c, n in zip(clients, steps):  # the steps each client has done (what its sequential hooks see)
                c.step = min(k, n)
            loss = self._step(ctx, optimizer, batch, mask, count, k < min(steps), opt_part, strategy)
            loss_sum += loss.float()  # a finished client's loss is exactly 0 (no rows: 0 / 1)
            if k == 0:
                first = loss
            if k + 1 in ends and k + 1 < max(steps) and optimizer.state:  # clients done before the others: the
                counters = self._counters(optimizer, stacked)  # optimizer's shared counters (Adam's step) as theirs
                for i in ends[k + 1]:
                    finished[i] = counters
        if first is None or k + 1 != max(steps):  # the data's batches and the clients' step counts disagree
            raise RuntimeError(f"cohort of clients {[c.id for c in clients]}: the data gave "
                               f"{0 if first is None else k + 1} steps, the clients take up to {max(steps)}")
        flat, counts = {}, {}
        if optimizer.state:  # each client's optimizer state goes back for the parts that read it at its end
            order = _order(optimizer, {n: stacked[n] for n in self.names})
            counters = set(getattr(optimizer, "cohort_counters", ()))

            def rowed(k: str, v: Tensor) -> bool:
                head, entry = k.split("/", 1)
                return head.isdigit() and (v.shape == stacked[order[int(head)]].shape
                                           or (entry in counters and v.shape == (K,)))
            flat = {k: (v, rowed(k, v)) for k, v in export_optimizer_state(optimizer).items()}
            python = {k.removesuffix(PY) for s in states if s is not None for k in s if k.endswith(PY)}
            counts = {k: v.tolist() for k, (v, r) in flat.items() if r and k in python}  # a client's Python counter
        means = [x / max(1, s) for x, s in zip(loss_sum.tolist(), steps)]  # one read per cohort
        firsts = first.tolist() if first is not None else [0.0] * K
        for i, client in enumerate(clients[:real]):
            mean_loss = means[i]
            if not math.isfinite(mean_loss):
                raise NonFiniteLossError(loop._divergence(r, client.id, mean_loss, float(firsts[i])))
            with torch.no_grad():  # the client's trained weights into the module, where its client_end reads them
                torch._foreach_copy_([loop.params[n] for n in self.names], [stacked[n][i] for n in self.names])
            client.step = steps[i]
            if self.per_client:
                optimizer.hand_back(i, client.optimizer)
            elif flat:
                kept = finished.get(i, {})
                mine = {k: (v[i] if r else kept.get(k, v)) for k, (v, r) in flat.items() if k not in counts}
                mine.update({k + PY: torch.tensor(c[i]) for k, c in counts.items()})
                import_optimizer_state(client.optimizer, mine)
            for p in strategy.parts:
                if p is not opt_part and getattr(p, "batched", False):
                    if p.Round is not None:  # its rows back into the client's own round state
                        ctx.state_of(p).unstack_into(i, client.state_of(p))
                    p.cohort_end(ctx, i, client)
            if self.dropout:
                self.dropout.resume(i)
            msgs = strategy.client_end(client)
            loop.store.checkin(client.id, client.state)
            client.optimizer = None
            yield client.id, msgs, mean_loss  # added to the round's sums before the next client ends (an upload may
                                              # be a view of the one optimizer's state, as in the sequential loop)

    # a remainder cohort (fewer clients than K) padded to K rows by phantom rows that take no step (row masks keep
    # their weights and optimizer state as they were): one shape a run, the groundwork of a captured cohort step
    pad_remainder = False

    def _phantom(self, cid: int, r: int, received, lr_f) -> ClientContext:
        """A phantom row's context: client ``cid``'s start again (the global generators as they were), no steps."""
        loop = self.loop
        cpu = torch.random.get_rng_state()
        cuda = torch.cuda.get_rng_state_all() if loop.device.type == "cuda" else None
        client = loop.start_client(cid, r, received, lr_f)
        torch.random.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)
        client.num_steps = 0
        return client

    @staticmethod
    def _padded(batches, phantoms: int):
        """The cohort's batches with ``phantoms`` rows more: no real rows (mask 0, count 1), never active."""
        for batch, mask, count, active, rows in batches:
            batch = {k: torch.cat([v, v.new_zeros((phantoms, *v.shape[1:]))]) for k, v in batch.items()}
            yield (batch, torch.cat([mask, mask.new_zeros((phantoms, *mask.shape[1:]))]),
                   torch.cat([count, count.new_ones(phantoms)]), torch.cat([active, active.new_zeros(phantoms)]),
                   list(rows) + [0] * phantoms)

    def _stacked(self, K: int) -> dict[str, Tensor]:
        """The cohort's stacked parameters (K, ...), allocated once per cohort size and refilled for each cohort."""
        if self._buffers[0] != K:
            params = self.loop.params
            self._buffers = (K, {n: torch.empty((K, *params[n].shape), dtype=params[n].dtype, device=params[n].device)
                                 for n in self.names})
        stacked = self._buffers[1]
        for t in stacked.values():
            t.grad = None
            t.requires_grad_(True)
        return stacked

    def _stacked_batches(self, clients: list[ClientContext], steps: list[int], r: int):
        """:meth:`FederatedData.cohort_batches` for data whose transform draws per batch: each client's own
        batches (:meth:`FederatedData.client_batches`), padded to the batch size and stacked, step by step."""
        loop, device = self.loop, self.loop.device
        streams = [loop.data.client_batches(c.id, r, device, loop.budget) for c in clients]
        for k in range(max(steps)):
            batches = [next(s) if k < n else None for s, n in zip(streams, steps)]
            template = next(b for b in batches if b is not None)
            rows = [0 if b is None else len(next(iter(b.values()))) for b in batches]
            B = max(loop.data.batch_size, *rows)
            out = {}
            for key, t in template.items():
                parts = []
                for b, n in zip(batches, rows):
                    v = b[key] if b is not None else t[:0]
                    parts.append(torch.cat([v, v.new_zeros((B - n, *t.shape[1:]))]) if n < B else v)
                out[key] = torch.stack(parts)
            n = torch.tensor(rows, device=device)
            yield out, (torch.arange(B, device=device) < n[:, None]).float(), n.clamp(min=1), n > 0, rows

    def _step(self, ctx: CohortContext, optimizer, batch: dict, mask: Tensor, count: Tensor, all_active: bool,
              opt_part, strategy) -> Tensor:
        stacked = ctx.params
        ctx.all_active = all_active
        frozen = None if all_active else self._snapshot(stacked, optimizer)
        held = None if all_active else {id(v) for st in optimizer.state.values() for v in st.values()}

        if self.grads is not None:  # trainer.compile=step: the gradients as a function, compiled (one graph)
            grads, loss = self.grads({n: t.detach() for n, t in stacked.items()}, batch, mask, count)
            for n, t in stacked.items():
                t.grad = grads[n]
        else:
            loss = self.client_losses(stacked, batch, mask, count)
            loss.sum().backward()
        for p in strategy.parts:
            if p is not opt_part and getattr(p, "batched", False):
                p.cohort_after_backward(ctx)
        clip = strategy.grad_clip
        if clip:
            self._clip(stacked, float(clip))
        optimizer.step()
        for p in strategy.parts:
            if p is not opt_part and getattr(p, "batched", False):
                p.cohort_after_step(ctx)
        for t in stacked.values():
            t.grad = None
        if frozen is not None:
            self._restore(ctx, frozen)
            self._fresh_rows(ctx, optimizer, held)
        return loss.detach()

    def client_losses(self, params: dict[str, Tensor], batch: dict, mask: Tensor, count: Tensor,
                      only: list[bool] | None = None) -> Tensor:
        """Each client's loss at its rows of ``params`` (K, ...): the mean over its real rows of the batch (K, B, ...),
        as its sequential step's loss. The model under ``vmap``; its per-example loss on all K*B rows at once when it
        splits them (``sample_outputs`` / ``sample_losses_of``: a vmapped cross-entropy takes twice the kernels).
        ``only``: the clients whose sequential step runs this forward (the others' losses are not used, and their
        dropout streams do not draw); default: the step's active clients."""
        with self.loop.fabric.autocast():
            out = self.client_outputs(params, batch, only)
            if self.losses.split:
                out = self._sample_losses(out, batch)
            return (out * mask).sum(1) / count

    def client_outputs(self, params: dict[str, Tensor], batch: dict, only: list[bool] | None = None) -> Tensor:
        """The model's outputs (``sample_outputs``, or the per-example losses of a model without it) of each client at
        its rows of ``params``, on its rows of ``batch``: (K, B, ...), under ``vmap`` (``only``: :meth:`client_losses`)."""
        def outputs(ps, b, masks=()):
            with self.dropout.apply(masks) if masks else contextlib.nullcontext():
                return torch.func.functional_call(self.losses, {f"m.{n}": t for n, t in ps.items()}, (b,),
                                                  strict=False)

        def one_client():  # the dropout calls' shapes: one client's forward
            outputs({n: t[0] for n, t in params.items()}, {k: v[0] for k, v in batch.items()})

        if self.dropout and self.loop.module.training:
            rows = self._rows if only is None else [n if o else 0 for n, o in zip(self._rows, only)]
            with self.dropout.forward(one_client, batch, rows, len(next(iter(batch.values()))[0])) as masks:
                return torch.vmap(outputs)(params, batch, masks)
        return torch.vmap(outputs)(params, batch)

    def _sample_losses(self, out: Tensor, batch: dict) -> Tensor:
        """The per-example losses (K, B) of the outputs (K, B, ...), on all K·B rows at once."""
        K, B = out.shape[:2]
        flat = {k: v.reshape(K * B, *v.shape[2:]) for k, v in batch.items()}
        return self.loop.module.sample_losses_of(out.reshape(K * B, *out.shape[2:]), flat).view(K, B)

    def sampled_label_gradient(self, cohort: CohortContext, generators: list) -> dict[str, Tensor]:
        """Each client's gradient of its loss against labels drawn from its own softmax (``module.sampled_labels``
        over its real rows, from ``generators[i]``; None: a client that takes none, whose rows are unused), as
        ``module.sampled_label_loss`` gives one client: Sophia's Gauss-Newton-Bartlett estimate."""
        only = [g is not None for g in generators]
        params = {n: cohort.params[n].detach().requires_grad_(True) for n in self.names}
        module, batch = self.loop.module, cohort.batch
        with self.loop.fabric.autocast():
            out = self.client_outputs(params, batch, only)
            labels = torch.zeros(out.shape[:2], dtype=torch.long, device=out.device)
            for i, g in enumerate(generators):
                if g is not None:
                    n = self._rows[i]
                    labels[i, :n] = module.sampled_labels(out[i, :n], g)
            losses = self._sample_losses(out, {**batch, "y": labels})
            loss = ((losses * cohort.mask).sum(1) / cohort.count).sum()
        grads = torch.autograd.grad(loss, [params[n] for n in self.names])
        return dict(zip(self.names, grads))

    def _grads(self, params: dict[str, Tensor], batch: dict, mask: Tensor, count: Tensor):
        """``(gradients (K, ...), losses (K,))``: each client's loss and its gradient as functions of the stacked
        parameters (``torch.func.grad_and_value`` under ``vmap``), what ``trainer.compile=step`` compiles."""
        loss_of = self.loop.module.sample_losses_of if self.losses.split else None

        def one(ps, b, m, c):
            out = torch.func.functional_call(self.losses, {f"m.{n}": t for n, t in ps.items()}, (b,), strict=False)
            return ((loss_of(out, b) if loss_of is not None else out) * m).sum() / c

        with self.loop.fabric.autocast():
            return torch.vmap(torch.func.grad_and_value(one))(params, batch, mask, count)

    def gradient_at(self, cohort: CohortContext, weights: dict[str, Tensor],
                    only: list[bool] | None = None) -> dict[str, Tensor]:
        """Each client's gradient on the step's batch at ``weights`` (stacked (K, ...), or one tensor every client
        shares), the other trainable parameters at the clients' own rows; ``.grad`` untouched. ``only``: the clients
        that take it (:meth:`client_losses`)."""
        K = len(cohort.clients)
        params = {n: (weights[n].expand(K, *cohort.params[n].shape[1:]) if n in weights and weights[n].dim() <
                      cohort.params[n].dim() else weights.get(n, cohort.params[n])).detach().requires_grad_(True)
                  for n in self.names}
        names = [n for n in self.names if n in weights]
        with torch.enable_grad():
            loss = self.client_losses(params, cohort.batch, cohort.mask, cohort.count, only).sum()
            grads = torch.autograd.grad(loss, [params[n] for n in names])
        return dict(zip(names, grads))

    def hvp(self, cohort: CohortContext, vector: dict[str, Tensor], only: list[bool] | None = None) -> dict[str, Tensor]:
        """Each client's Hessian-vector product ∇²f_i · v_i at its rows, on the step's batch (double backward; the
        clients' losses are independent, so one product of their sum is every client's). ``only``: the clients that
        take it (:meth:`client_losses`)."""
        names = [n for n in self.names if n in vector]
        params = {n: cohort.params[n].detach().requires_grad_(True) for n in self.names}
        with twice_differentiable():
            loss = self.client_losses(params, cohort.batch, cohort.mask, cohort.count, only).sum()
            grads = torch.autograd.grad(loss, [params[n] for n in names], create_graph=True)
            dot = sum((g * vector[n].to(g.dtype)).sum() for n, g in zip(names, grads))
            hv = torch.autograd.grad(dot, [params[n] for n in names])
        return {n: h.detach() for n, h in zip(names, hv)}

    def _counters(self, optimizer, stacked: dict[str, Tensor]) -> dict[str, Tensor]:
        """The entries of the optimizer's state that are not one row per client (step counts), copied."""
        return {k: v.clone() for k, v in export_optimizer_state(optimizer).items() if v.dim() == 0}

    @staticmethod
    @torch.no_grad()
    def _clip(stacked: dict[str, Tensor], max_norm: float) -> None:
        """``clip_grad_norm_`` per client: each row's gradient norm over all parameters, scaled to ``max_norm``."""
        grads = [t.grad for t in stacked.values() if t.grad is not None]
        K = grads[0].shape[0]
        flat = flat_rows(grads)  # (K, P): the norms' input, scaled there and copied back (cohort/rows.py)
        norms = torch.linalg.vector_norm(flat if flat is not None else torch.cat([g.reshape(K, -1) for g in grads],
                                                                                 dim=1), dim=1)
        coef = (max_norm / (norms + 1e-6)).clamp(max=1.0)
        scale_rows_(grads, coef, "mul", flat)

    @staticmethod
    def _snapshot(stacked: dict[str, Tensor], optimizer) -> list[tuple[Tensor, Tensor]]:
        """The tensors a step changes whose leading dimension is the client's: parameters and optimizer state."""
        out = [(t, t.detach().clone()) for t in stacked.values()]
        K = next(iter(stacked.values())).shape[0]
        for st in optimizer.state.values():
            for v in st.values():
                if isinstance(v, Tensor) and v.dim() > 0 and v.shape[0] == K:
                    out.append((v, v.clone()))
        return out

    @staticmethod
    @torch.no_grad()
    def _fresh_rows(ctx: CohortContext, optimizer, held: set) -> None:
        """Optimizer state the step created (its first: SGD's momentum) is zero in the rows of the clients that did
        not take it (a phantom row's state as a fresh one's, zeros), not their gradient's."""
        K = ctx.active.shape[0]
        for st in optimizer.state.values():
            for v in st.values():
                if isinstance(v, Tensor) and id(v) not in held and v.dim() > 0 and v.shape[0] == K:
                    v.copy_(torch.where(ctx.active_like(v), v, torch.zeros_like(v)))

    @staticmethod
    @torch.no_grad()
    def _restore(ctx: CohortContext, frozen: list[tuple[Tensor, Tensor]]) -> None:
        """A finished client's rows back as they were before the step."""
        for t, old in frozen:
            t.copy_(torch.where(ctx.active_like(t), t, old))
