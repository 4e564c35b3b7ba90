"""Cohort: a round's clients trained K at a time in one batched step (``trainer.cohort=K``).

The sequential loop pays a step's few dozen small kernels once per client. A cohort stacks K clients' trainable
parameters along a leading client dimension and runs their local steps as one: the forward and backward through
``torch.func`` (``functional_call`` under ``vmap``, one backward over the sum of the K losses: the clients are
independent, so each row's gradient is its own client's), the parts' step hooks on the stacked tensors, and the
local optimizer over the stacked parameters (an elementwise optimizer, whose update of one row reads only that row,
or Muon, which orthogonalizes each row's matrix on its own). K clients' steps cost about one client's launches
(FedAvg on the default CNN: 8 ops per client-step at K = 8 against 33 sequential): the GPU path for the small
models of cross-device work (docs/benchmarks.md, "A cohort of clients"). On a CPU it is no faster, so the default
is 1. The step is the one local step (``fl_lightning/step/``) with a batched loss (``cohort/step.py``), run
through the one capture wrapper: under ``trainer.compile=step`` the whole cohort step is compiled, once a run (its
optimizer is the run's one object over the stacked parameters, reset in place for each cohort).

Each client keeps what makes it itself: its batches come from its own (seed, client, round) stream and are padded to
the data's batch size with a 0/1 row mask (its loss is the mean over its real rows, as in the sequential step), its
start and end (state checked out, the parts' ``client_start`` and ``client_end``, the upload) run as in the
sequential loop, one client at a time, and a client with fewer steps than the others is frozen once it is done (its
rows of the parameters and optimizer state are kept as they were). The uploads are added in the sequential order,
so the server's side and the checkpoints are the same; the result equals the sequential run up to the rounding of
the batched kernels (tests/system/test_cohort.py: 1e-12 relative in float64).

A part runs batched when it has no per-step hooks, or declares its step plan (``step/plan.py``): its ``Round`` state
(``strategies/round_state.py``) is stacked, its step hooks run on the stacked tensors (the same functions, or its
own ``cohort_after_backward`` / ``cohort_after_step``), and a finished client's rows of its state stay as they were.
The optimizer is one over the stacked parameters, or each client's own on its rows (``cohort/optimizer.py``). A
method with a part that cannot, a model without per-example losses (``sample_losses``), with float buffers (batch
norm) or a random layer other than ``nn.Dropout`` (whose masks each client draws from its own stream:
``cohort/dropout.py``), and a K whose stacked copies do not fit the free memory are refused in one line naming what
stops it.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Iterator

import torch
from torch import Tensor, nn

from ..errors import ConfigError
from ..optim.state import PY, export_optimizer_state, import_optimizer_state, is_fresh
from ..step import Capture, check_finite, mean_losses, run_steps
from ..step.plan import cohort_refusal, in_step
from ..strategies.base import ClientContext
from .context import CohortContext
from .dropout import CohortDropout, dropout_sites
from .forward import CohortServices, StackedForward
from .memory import AUTO_FRACTION, KEY, STACKED_COPIES, check_cohort_memory, client_bytes  # noqa: F401
from .optimizer import ClientByClient, copy_of, optimizer_mode, stacked_optimizer
from .step import CohortStep

log = logging.getLogger("fl_lightning")


def check_cohort(strategy, module: nn.Module, size: int, compiled: str | None = None) -> None:
    """Refuse, in one line naming what stops it, a run that cannot train its clients ``size`` at a time."""
    if size <= 1:
        return
    for p in strategy.parts:
        if p.provides_optimizer:
            mode, reason = optimizer_mode(p)
            if mode is None:
                raise ConfigError(KEY, f"method {strategy.name!r}: its local optimizer cannot run batched ({reason})",
                                  "use trainer.cohort=1")
        elif why := cohort_refusal(p, module):
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


@dataclass
class CohortRun:
    """What the cohort engine needs of the run, handed over by the loop (never the loop itself): the device's
    module and its trainable parameters, Fabric, the strategy and the data with each client's step budget; a client's
    start (``start_client(cid, r, received, lr_f) -> ClientContext``) and state check-in (``checkin(cid, state)``),
    the batches' cast (``cast``) and the line a diverged client stops the run with (``divergence(r, cid, mean, first)``)."""

    fabric: object
    module: nn.Module
    params: dict[str, Tensor]
    global_params: dict[str, Tensor]
    strategy: object
    data: object
    budget: object
    start_client: Callable
    checkin: Callable
    cast: Callable
    divergence: Callable
    rank: int = 0


class Cohort:
    """Trains a process's sampled clients ``size`` at a time (see the module docstring); built by the loop."""

    def __init__(self, run: CohortRun, size: int, capture: Capture = Capture()):
        """``capture``: how the step runs (``trainer.compile``; ``step``: the cohort's forward and backward compiled
        once, one graph)."""
        check_cohort(run.strategy, run.module, size, capture.mode)
        self.run, self.size, self.device = run, int(size), run.fabric.device
        self.names = list(run.params)
        # torch has no vmap rule for the CPU's fused attention (it would loop over the clients): while a cohort trains,
        # timm's attention is written out instead (batched matmuls); evaluation keeps the fused kernel
        self._fused = [m for m in run.module.modules() if getattr(m, "fused_attn", None) is True] \
            if self.device.type == "cpu" else []
        self.dropout = CohortDropout(run.module, self.device)  # each client's masks from its own stream
        self.forward = StackedForward(run.fabric, run.module, self.names, self.dropout)
        self.services = CohortServices(self.forward)  # what the parts may ask for, nothing more
        self.step = capture.wrap(CohortStep(self.forward, run.strategy))  # the one capture wrapper (trainer.compile)
        mode, why = optimizer_mode(run.strategy.optimizer_part())
        self.per_client = mode == "per_client"  # each client's own optimizer on its rows (cohort/optimizer.py)
        if self.per_client and run.rank == 0:
            log.info("trainer.cohort: the local optimizer steps each client's rows with its own optimizer (%s)", why)
        self._buffers: tuple[int, dict[str, Tensor]] = (0, {})  # (K, the stacked parameters) of the last cohort size
        self._optimizers: dict[int, torch.optim.Optimizer] = {}  # K -> the optimizer over those stacked parameters
        self._round_states: dict = {}  # part -> the stacked round state, filled in place for each cohort
        self._rows_of_step: dict[str, Tensor] = {}  # the step's row mask, real-row counts and active flags, in place

    def train(self, cids: list[int], r: int, received: dict[str, Tensor], lr_f: float) -> Iterator[tuple[int, dict, float]]:
        """``(client, uploads, mean loss)`` for each of ``cids``, in order."""
        for m in self._fused:
            m.fused_attn = False
        try:
            for i in range(0, len(cids), self.size):
                yield from self._train_cohort(cids[i:i + self.size], r, received, lr_f)
        finally:
            for m in self._fused:
                m.fused_attn = True

    # ---------------------------------------------------------------------------------------------- one cohort
    def _train_cohort(self, cids, r, received, lr_f):
        run, strategy = self.run, self.run.strategy
        opt_part = strategy.optimizer_part()
        real = len(cids)
        phantoms = self.size - real if self.pad_remainder else 0
        K, device = real + phantoms, self.device
        stacked = self.stacked(K)
        clients, hparams, states, corrections, own = [], [], [], [], []
        self.dropout.start()
        for i, cid in enumerate(cids + cids[:1] * phantoms):  # each client's start as in the sequential loop, then
            if i >= real:  # its values as row i; a phantom row: the first client's start again, no steps, no upload
                client = self._phantom(cid, r, received, lr_f)
            else:
                client = run.start_client(cid, r, received, lr_f)
            if self.dropout:
                self.dropout.keep()  # its stream as its start left it
            opt = client.optimizer
            with torch.no_grad():  # the weights as its start left them (the global model, or a part's first move)
                torch._foreach_copy_([stacked[n][i] for n in self.names], [run.params[n] for n in self.names])
            if self.per_client:  # a copy of the optimizer its start built (settings, state, corrections)
                own.append(copy_of(opt, opt_part.new_optimizer(client)))
            else:
                hparams.append([{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups])
                states.append(None if is_fresh(opt) else {k: v.clone() for k, v in export_optimizer_state(opt).items()})
                corrections.append(dict(getattr(opt, "corrections", None) or {}))
            clients.append(client)
        steps = [c.num_steps for c in clients]
        if self.per_client:
            optimizer = ClientByClient(own, [run.params[n] for n in self.names], [stacked[n] for n in self.names])
        else:
            optimizer = stacked_optimizer(opt_part, clients[-1].optimizer, hparams, stacked, run.params,
                                          self._optimizers.get(K))
            self._optimizers[K] = optimizer  # the run's one optimizer of this cohort size, reset in place
            load_rows(optimizer, clients[-1].optimizer, states, corrections, stacked, self.names, run.params)
        ctx = CohortContext(clients, stacked, run.global_params, torch.ones(K, dtype=torch.bool, device=device),
                            optimizer=optimizer, services=self.services)
        for p in strategy.parts:
            if in_step(p):
                if p.Round is not None:  # the clients' round states, stacked into the run's (their rows fields)
                    ctx._states[p.name] = self._round_states[p.name] = p.Round.stacked_into(
                        self._round_states.get(p.name), [c.state_of(p) for c in clients])
                p.cohort_start(ctx)
        batches = run.data.cohort_batches([c.id for c in clients[:real]], r, device, run.budget)
        if batches is None:  # a transform drawing per batch: each client's own batches, stacked here
            batches = self._stacked_batches(clients[:real], steps[:real], r)
        if phantoms:
            batches = self._padded(batches, phantoms)
        ends: dict[int, list[int]] = {}
        for i, s in enumerate(steps):
            ends.setdefault(s, []).append(i)
        finished: dict[int, dict] = {}

        def begin(k: int, item) -> dict:
            """Step k's set-up on the host: who takes it, each client's step count, its real rows."""
            batch, mask, count, active, rows = item
            if k in ends and k < max(steps) and optimizer.state:  # clients done before the others: the optimizer's
                counters = self._counters(optimizer, stacked)  # shared counters (Adam's step) as theirs
                for i in ends[k]:
                    finished[i] = counters
            batch = run.cast(batch)
            self.forward.rows = rows
            if self.per_client:
                optimizer.active = [n > 0 for n in rows]
            ctx.active, ctx.mask, ctx.count = (self._held(name, t) for name, t in
                                               (("active", active), ("mask", mask), ("count", count)))
            ctx.step, ctx.batch = k, batch
            ctx.all_active = k < min(steps)
            for c, n in zip(clients, steps):  # the steps each client has done (what its sequential hooks see)
                c.step = min(k, n)
            return batch

        loss_sum, first, taken = run_steps(ctx, batches, self.step, strategy.before_step, begin, rows=(K,))
        if first is None or taken != max(steps):  # the data's batches and the clients' step counts disagree
            raise RuntimeError(f"cohort of clients {[c.id for c in clients]}: the data gave "
                               f"{taken} steps, the clients take up to {max(steps)}")
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
        means = mean_losses(loss_sum, steps)  # one read per cohort
        for i, client in enumerate(clients[:real]):
            mean_loss = means[i]
            check_finite(client.id, mean_loss, first, i, lambda c, m, f: run.divergence(r, c, m, f))
            with torch.no_grad():  # the client's trained weights into the module, where its client_end reads them
                torch._foreach_copy_([run.params[n] for n in self.names], [stacked[n][i] for n in self.names])
            client.step = steps[i]
            if self.per_client:
                optimizer.hand_back(i, client.optimizer)
            elif flat:
                kept = finished.get(i, {})
                mine = {k: (v[i] if r else kept.get(k, v)) for k, (v, r) in flat.items() if k not in counts}
                mine.update({k + PY: torch.tensor(c[i]) for k, c in counts.items()})
                import_optimizer_state(client.optimizer, mine)
            for p in strategy.parts:
                if in_step(p):
                    if p.Round is not None:  # its rows back into the client's own round state
                        ctx.state_of(p).unstack_into(i, client.state_of(p))
                    p.cohort_end(ctx, i, client)
            if self.dropout:
                self.dropout.resume(i)
            msgs = strategy.client_end(client)
            run.checkin(client.id, client.state)
            client.optimizer = None
            yield client.id, msgs, mean_loss  # added to the round's sums before the next client ends (an upload may
                                              # be a view of the one optimizer's state, as in the sequential loop)

    def _held(self, name: str, t: Tensor) -> Tensor:
        """``t`` copied into the run's buffer of its name and shape (allocated once a cohort size: a replayed step
        reads the step's row mask and counts there)."""
        held = self._rows_of_step.get(name)
        if held is None or held.shape != t.shape or held.dtype != t.dtype:
            held = self._rows_of_step[name] = t.clone()
            return held
        return held.copy_(t)

    # a remainder cohort (fewer clients than K) padded to K rows by phantom rows that take no step (row masks keep
    # their weights and optimizer state as they were): one shape a run, the groundwork of a captured cohort step
    pad_remainder = False

    def _phantom(self, cid: int, r: int, received, lr_f) -> ClientContext:
        """A phantom row's context: client ``cid``'s start again (the global generators as they were), no steps."""
        cpu = torch.random.get_rng_state()
        cuda = torch.cuda.get_rng_state_all() if self.device.type == "cuda" else None
        client = self.run.start_client(cid, r, received, lr_f)
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

    def stacked(self, K: int) -> dict[str, Tensor]:
        """The cohort's stacked parameters (K, ...), allocated once per cohort size and refilled for each cohort."""
        if self._buffers[0] != K:
            params = self.run.params
            self._buffers = (K, {n: torch.empty((K, *params[n].shape), dtype=params[n].dtype, device=params[n].device)
                                 for n in self.names})
            self._optimizers.clear()  # over the buffers of another size
            self._round_states.clear()
            self._rows_of_step.clear()
        stacked = self._buffers[1]
        for t in stacked.values():
            t.grad = None
            t.requires_grad_(True)
        return stacked

    def _stacked_batches(self, clients: list[ClientContext], steps: list[int], r: int):
        """:meth:`FederatedData.cohort_batches` for data whose transform draws per batch: each client's own
        batches (:meth:`FederatedData.client_batches`), padded to the batch size and stacked, step by step."""
        run, device = self.run, self.device
        streams = [run.data.client_batches(c.id, r, device, run.budget) for c in clients]
        for k in range(max(steps)):
            batches = [next(s) if k < n else None for s, n in zip(streams, steps)]
            template = next(b for b in batches if b is not None)
            rows = [0 if b is None else len(next(iter(b.values()))) for b in batches]
            B = max(run.data.batch_size, *rows)
            out = {}
            for key, t in template.items():
                parts = []
                for b, n in zip(batches, rows):
                    v = b[key] if b is not None else t[:0]
                    parts.append(torch.cat([v, v.new_zeros((B - n, *t.shape[1:]))]) if n < B else v)
                out[key] = torch.stack(parts)
            n = torch.tensor(rows, device=device)
            yield out, (torch.arange(B, device=device) < n[:, None]).float(), n.clamp(min=1), n > 0, rows

    def _counters(self, optimizer, stacked: dict[str, Tensor]) -> dict[str, Tensor]:
        """The entries of the optimizer's state that are not one row per client (step counts), copied."""
        return {k: v.clone() for k, v in export_optimizer_state(optimizer).items() if v.dim() == 0}
