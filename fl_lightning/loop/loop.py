"""FederatedLoop: rounds of client sampling, local training with swapped-in client state and streaming aggregation,
on Lightning Fabric (in the spirit of Fabric's build-your-own-trainer example).

One module lives on the device. The global state ``x`` (trainable parameters + float buffers) is kept beside it;
for each sampled client the loop copies ``x`` into the module, checks the client's private state out of the
:class:`ClientStateStore`, runs K local steps through ``module.training_step`` with the strategy's hooks around
backward and ``optimizer.step``, then adds the client's upload to streaming sums and checks its state back in.
With several Fabric processes each process trains the sampled clients it owns (``assign_clients``: by local work,
greedy longest-first) and the sums are all-reduced before ``strategy.server_update``. The loop never looks at which method it runs.

Two components are fed the loop's stateful objects: the :class:`~fl_lightning.checkpoint.Checkpointer` (atomic,
strict checkpoints) and the :class:`~fl_lightning.recorder.RunRecorder` (metric rows, counters, summary).
"""
from __future__ import annotations

import logging
import os
import signal
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from .. import seeding
from ..dist import signals
from ..checkpoint import Checkpointer, TensorDict, TorchRNG
from .client_store import ClientStateStore
from ..cohort import Cohort, CohortRun
from ..step import Capture, ClientStep, check_finite, counts as capture_counts, mean_losses, run_steps
from ..strategies import unsaved
from ..errors import ConfigError, NonFiniteLossError, ResumeError, StopRequested  # noqa: F401 (StopRequested: re-exported)
from ..progress import RoundProgress
from ..recorder import RunRecorder
from ..schedule import lr_factor
from ..config import FL, Checkpoint
from .divergence import divergence_line
from .placement import assign_clients
from .services import LoopServices
from ..strategies.base import MODEL_KEY, Aggregate, ClientContext, ServerContext, Strategy

log = logging.getLogger("fl_lightning")


@dataclass
class LoopConfig:
    """What the loop needs to know, every value typed and checked by the schema (no default is stated here): the
    ``fl`` and ``checkpoint`` groups (:class:`fl_lightning.config.schema.FL`, :class:`~fl_lightning.config.schema.Checkpoint`),
    the seed, the keys a user types for the clients' and the server's learning rate (a diverging run's message
    names the one that grew the loss; ``build.lr_keys`` finds them), and how the local step is run (``trainer.compile``,
    resolved: :class:`~fl_lightning.step.capture.Capture`)."""

    fl: FL
    checkpoint: Checkpoint
    seed: int
    client_lr_key: str | None
    server_lr_key: str | None
    capture: Capture = field(default_factory=Capture)  # the resolved trainer.compile: how the local step runs


class FederatedLoop:
    def __init__(self, fabric, module, data, strategy: Strategy, config: LoopConfig, run_dir: str, *,
                 store: ClientStateStore | None = None, checkpointer: Checkpointer | None = None,
                 recorder: RunRecorder | None = None, cohort: int = 1):
        self.fabric, self.module, self.data, self.strategy, self.config = fabric, module, data, strategy, config
        self.run_dir = run_dir
        self.fl = config.fl
        self.budget = config.fl.budget  # each client's local steps (K, or E epochs of its data)
        self.n, self.S, self.R = config.fl.num_clients, config.fl.clients_per_round, config.fl.rounds
        self.seed = config.seed
        self.rank, self.world = fabric.global_rank, fabric.world_size
        self.device = fabric.device

        sd = module.state_dict()
        self.trainable = [n for n, p in module.named_parameters() if p.requires_grad]
        buffers = {n for n, b in module.named_buffers() if b.is_floating_point()}
        # the communicated state: trainable params + float buffers (frozen params, e.g. a LoRA backbone, stay put)
        self.keys = [k for k in sd if k in set(self.trainable) or k in buffers]
        self.local: dict[str, Tensor] = {k: sd[k] for k in self.keys}
        self.params = {n: p for n, p in module.named_parameters() if p.requires_grad}
        self.services = LoopServices(fabric, module, self.params, data, self.seed)  # what parts may ask of the loop
        self.global_params: dict[str, Tensor] = {k: v.detach().clone() for k, v in self.local.items()}
        self.work = [float(data.steps_per_round(c, self.budget)) for c in range(self.n)]
        # home processes (balanced over all clients): who sets up clients' states and hands idle clients to the strategy
        self.owner = assign_clients(self.work, self.world)
        self.owned = [c for c in range(self.n) if self.owner[c] == self.rank]
        # the process holding each client's state (-1: none; the client trains where the round's balance puts it),
        # the same on every process: found after setup, kept by one flag per sampled client in each round's reduction
        self.pinned = [-1] * self.n
        self.store = store or ClientStateStore(self.device)
        self.checkpointer = checkpointer or Checkpointer(os.path.join(run_dir, "checkpoints"), rank=self.rank,
                                                         world_size=self.world, barrier=fabric.barrier)
        self.checkpointer.claim = lambda cid: self.owner[cid] == self.rank  # from a checkpoint of another world size
        self.recorder = recorder or RunRecorder(run_dir, primary=getattr(module, "primary_metric", ("test_acc", "max")),
                                                rank=self.rank, log_fn=fabric.log_dict)
        self.model_bits = sum(v.numel() * v.element_size() * 8 for v in self.global_params.values())
        capture = config.capture
        if capture.mode != "none":  # what a part asks for inside a compiled or replayed step runs eagerly
            self.services.eager_under_compile()
        # trainer.cohort: the sampled clients trained K at a time in one batched step (fl_lightning/cohort/);
        # otherwise one at a time, each through the one local step (fl_lightning/step/), run as trainer.compile says
        self.cohort = Cohort(CohortRun(
            fabric=fabric, module=module, params=self.params, global_params=self.global_params, strategy=strategy,
            data=data, budget=self.budget, start_client=self.start_client, checkin=self.store.checkin,
            cast=self.services.cast_floats, divergence=self._divergence, rank=self.rank), cohort, capture) \
            if cohort > 1 else None
        self.step = ClientStep(fabric, module, strategy, self.params)
        self.client_step = capture.wrap(self.step) if self.cohort is None else None
        self.round = 0  # rounds completed
        self._stop_signal: int | None = None
        self._first_round = -1  # the round this invocation started at (set by run)
        self._part_baseline: dict | None = None  # the parts' state once set up (setup): the unsaved-state check

    # ------------------------------------------------------------------ helpers
    def _load_global_into_module(self) -> None:
        with torch.no_grad():  # one multi-tensor copy
            torch._foreach_copy_(list(self.local.values()), [self.global_params[k] for k in self.local])

    def _all_reduce(self, t: Tensor) -> Tensor:
        return self.fabric.all_reduce(t, reduce_op="sum") if self.world > 1 else t

    def _gather_object(self, obj: Any) -> list:
        if self.world == 1:
            return [obj]
        import torch.distributed as dist

        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def _probe_gradient(self, cid: int) -> dict[str, Tensor]:
        """Minibatch gradient of client ``cid`` at the current global weights (a fixed probe stream)."""
        self._load_global_into_module()
        return self.services.gradient(self.data.probe_batch(cid, self.device))

    def lr_factor(self, r: int) -> float:
        c = self.fl
        return lr_factor(r, self.R, c.lr_schedule, c.lr_min_factor, c.warmup_rounds)

    def server_context(self) -> ServerContext:
        return ServerContext(
            module=self.module, global_params=self.global_params, trainable=self.trainable, num_clients=self.n,
            clients_per_round=self.S, rounds=self.R, device=self.device,
            client_num_samples=[self.data.num_samples(i) for i in range(self.n)], owned_clients=self.owned,
            store=self.store, probe_gradient=self._probe_gradient, all_reduce_sum=self._all_reduce,
            lr_factor=self.lr_factor, local_steps=self.budget.fixed,
        )

    # ------------------------------------------------------------------ one client
    def start_client(self, cid: int, r: int, received: dict[str, Tensor], lr_f: float) -> ClientContext:
        """Client ``cid``'s round begins: the global state in the module, its private state checked out, its
        optimizer and the parts' per-client state built (``client_start``), torch's generator seeded."""
        self._load_global_into_module()
        torch.manual_seed(seeding.derive(self.seed, seeding.CLIENT_TORCH, cid, r))  # dropout etc.: (seed, client, round)
        client = ClientContext(
            id=cid, round=r, module=self.module, params=self.params, local=self.local, global_params=self.global_params,
            state=self.store.checkout(cid), num_samples=self.data.num_samples(cid),
            num_steps=self.data.steps_per_round(cid, self.budget), lr_factor=lr_f,
            received=received, services=self.services,
        )
        self.strategy.client_start(client)
        self.module.train()
        return client

    def train_client(self, cid: int, r: int, received: dict[str, Tensor], lr_f: float) -> tuple[dict, float]:
        """Client ``cid``'s round: its start, its K local steps (:func:`~fl_lightning.step.local.run_steps`), the
        divergence check, its end (the upload) and its state checked back in."""
        client = self.start_client(cid, r, received, lr_f)
        batches = (self.services.cast_floats(b) for b in self.data.client_batches(cid, r, self.device, self.budget))
        loss_sum, first, _ = run_steps(client, batches, self.client_step, self.strategy.before_step)
        (mean_loss,) = mean_losses(loss_sum, [client.step])
        check_finite(cid, mean_loss, first, 0, lambda c, m, f: self._divergence(r, c, m, f))
        client.batch = client.loss = None
        msgs = self.strategy.client_end(client)
        self.store.checkin(cid, client.state)
        client.optimizer = None
        return msgs, mean_loss

    def train_clients(self, cids: list[int], r: int, received: dict[str, Tensor], lr_f: float):
        """``(client, uploads, mean loss)`` for each of ``cids`` in order: one at a time, or a cohort at a time."""
        if self.cohort is not None:
            yield from self.cohort.train(cids, r, received, lr_f)
            return
        for cid in cids:
            yield (cid, *self.train_client(cid, r, received, lr_f))

    def _divergence(self, r: int, cid: int, mean_loss: float, first_loss: float) -> str:
        return divergence_line(self.config, self.checkpointer.newest(), r, cid, mean_loss, first_loss)

    # ------------------------------------------------------------------ one round
    def run_round(self, r: int, progress: RoundProgress | None = None) -> dict[str, float]:
        """Sample, train the sampled clients this process owns, aggregate, update the server. Returns the round's
        metrics (train loss, lr factor and whatever the strategy's parts report)."""
        sampled = seeding.round_clients(self.seed, r, self.n, self.S, self.fl.sampling)  # fixed | poisson (may be none)
        if not sampled:  # nothing changes, unless a part releases something all the same (DP's noise)
            log.info("round %d: no client sampled (fl.sampling=poisson)%s", r + 1, ": the noise is released all the "
                     "same" if self.strategy.releases_empty_rounds else ": nothing changes")
            if not self.strategy.releases_empty_rounds:
                return {"lr_factor": self.lr_factor(r), "round_clients": 0, "round_uplink_bits": 0, "round_downlink_bits": 0}
        owner = assign_clients(self.work, self.world, sampled, self.pinned) if self.world > 1 else {}
        mine = [c for c in sampled if owner.get(c, 0) == self.rank]
        lr_f = self.lr_factor(r)
        down = self.strategy.broadcast(r)
        received = {k: m.tensor for k, m in down.items()}
        down_bits = sum(m.bits() * (self.n if m.to == "all" else len(sampled)) for m in down.values())
        if MODEL_KEY not in down:  # the dense global model to every sampled client
            down_bits += self.model_bits * len(sampled)
        agg = Aggregate(self.n)
        up_bits, loss_total = 0, 0.0
        if progress:
            progress.start_round(r, len(mine))
        for cid, msgs, loss in self.train_clients(mine, r, received, lr_f):
            self.recorder.client_done()
            up_bits += sum(m.bits() for m in msgs.values())
            loss_total += loss
            agg.add(msgs, steps=self.data.steps_per_round(cid, self.budget))
            if progress:
                progress.client_done()
        if self.strategy.uses_idle_clients:  # paid only by methods that ask (FedSMUM)
            self.idle_clients(r, set(sampled), received, lr_f)
        if self.world > 1:
            agg.all_reduce(self._all_reduce, self._gather_object, self.device)
        pins = [float(self.rank + 1) if c in mine and self.pinned[c] < 0 and self.store.layout(c) else 0.0
                for c in sampled] if self.world > 1 else []  # clients that now hold state, reduced with the totals
        tot = self._all_reduce(torch.tensor([float(up_bits), loss_total] + pins, dtype=torch.float64, device=self.device))
        for c, p in zip(sampled, tot[2:].tolist()):
            if p:  # it trains on that process from now on
                self.pinned[c] = int(p) - 1
        part_metrics = self.strategy.server_update(r, agg)
        self.recorder.add(uplink_bits=int(tot[0]), downlink_bits=down_bits)
        size = {"round_clients": len(sampled)} if self.fl.sampling == "poisson" else {}
        return {**({"train_loss": float(tot[1]) / len(sampled)} if sampled else {}), **part_metrics, "lr_factor": lr_f,
                **size, "round_uplink_bits": int(tot[0]), "round_downlink_bits": down_bits}

    def idle_clients(self, r: int, sampled: set[int], received: dict[str, Tensor], lr_f: float) -> None:
        """Hand every owned, non-sampled client to the strategy's ``client_idle`` with its state checked out."""
        for cid in self.owned:
            if cid in sampled:
                continue
            client = ClientContext(
                id=cid, round=r, module=self.module, params=self.params, local=self.local,
                global_params=self.global_params, state=self.store.checkout(cid), num_samples=self.data.num_samples(cid),
                num_steps=0, lr_factor=lr_f, received=received, services=self.services)
            self.strategy.client_idle(client)
            self.store.checkin(cid, client.state)

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """The global model on the test set (and the validation set, as ``val_*``). With several processes and a module whose metrics sync themselves
        across processes (``syncs_eval_metrics``: torchmetrics states, gathered in ``compute``), each process takes
        every world-th example of each test batch; otherwise every process evaluates the whole set."""
        self._load_global_into_module()
        self.module.eval()
        out = self._evaluate_batches(self.data.test_batches(self.device))
        if getattr(self.data, "val", None) is not None:  # data.val_fraction: the held-out rows' metrics, as val_*
            val = self._evaluate_batches(self.data.test_batches(self.device, "val"))
            out.update({"val_" + k.removeprefix("test_"): v for k, v in val.items()})
        return out

    def _evaluate_batches(self, batches) -> dict[str, float]:
        shard = self.world > 1 and getattr(self.module, "syncs_eval_metrics", False)
        for i, batch in enumerate(batches):
            if shard:
                batch = {k: v[self.rank::self.world] for k, v in batch.items()}
                if len(next(iter(batch.values()))) == 0:
                    continue
            with self.fabric.autocast():
                self.module.validation_step(self.services.cast_floats(batch), i)
        return self.module.compute_eval()

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        return {"round": self.round}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.round = int(state["round"])

    def stateful(self) -> dict[str, Any]:
        """Everything a checkpoint holds, by name (see fl_lightning/checkpoint/); a model wrapper may add its own
        objects through ``checkpoint_objects()`` (e.g. the fingerprint of a frozen pretrained backbone, which refuses
        a resume onto another base model)."""
        objects = {"loop": self, "model": TensorDict(self.global_params), "strategy": self.strategy,
                   "clients": self.store, "rng": TorchRNG(), "recorder": self.recorder}
        extra = getattr(self.module, "checkpoint_objects", None)
        for name, obj in (extra() if callable(extra) else {}).items():
            if name in objects:
                raise ValueError(f"{type(self.module).__name__}.checkpoint_objects() reuses the name {name!r}")
            objects[name] = obj
        return objects

    def setup(self, resume: str | None = None, force: bool = False) -> None:
        self.strategy.setup(self.server_context())
        self._part_baseline = unsaved.snapshot(self.strategy.parts)  # what the parts hold once set up
        if resume:
            root = os.path.join(resume, "checkpoints")
            path = self.checkpointer.load_latest_good(self.stateful(), force=force, root=root)
            if path is None:
                raise ResumeError(f"resume: no checkpoint under {root}; "
                                  "point resume= at a run directory that has checkpoints/round_*")
            if self.round > self.R:  # refused before anything (metrics, summary, config) is rewritten
                raise ConfigError("fl.rounds", f"{self.R} is fewer than the {self.round} rounds this run already did "
                                  f"({path}); resuming would rewrite its summary as if it had stopped there",
                                  f"resume with fl.rounds={self.round} or more, or start a new run elsewhere")
            self.recorder.write_csv()
            log.info("resumed from %s (round %d)", path, self.round)
        self._find_pins()

    def _find_pins(self) -> None:
        """Which process holds each client's state, after setup or a resume (one all-reduce with several processes).
        A strategy that hands idle clients their state keeps every client on its home process."""
        if self.world == 1:
            return
        if self.strategy.uses_idle_clients:
            self.pinned = list(self.owner)
            return
        held = torch.zeros(self.n, dtype=torch.float64)
        for c in self.store.clients():
            if self.store.layout(c):
                held[c] = self.rank + 1
        self.pinned = [int(p) - 1 for p in self._all_reduce(held.to(self.device)).tolist()]

    # ------------------------------------------------------------------ run
    def _on_signal(self, signum, frame):  # first signal: stop at the next safe point; second: abort
        if self.round == self._first_round:  # no round of this invocation done: nothing to save, stop at once
            signals.set_phase(f"running round {self.round + 1}, before this invocation finished a round")
            signals.stop_now(signum)
        if self._stop_signal is not None:
            raise KeyboardInterrupt
        self._stop_signal = signum
        log.warning("signal %d received: will checkpoint and stop after this round (again to abort now)", signum)

    def _agreed_stop(self) -> int:
        """The stop signal, agreed by every process after each round (a signal reaches the launcher only, or one
        rank first): all ranks checkpoint the same round and stop together instead of one waiting in a collective
        the others never enter. One 8-byte all-reduce per round with several processes; 0 means go on."""
        signum = self._stop_signal or 0
        if self.world > 1:
            t = torch.tensor([signum], dtype=torch.int64, device=self.fabric.device)
            signum = int(self.fabric.all_reduce(t, reduce_op="max").item())
        return signum

    def run(self, stop_after_rounds: int | None = None, progress_enabled: bool = True) -> dict:
        every = self.config.checkpoint.every
        self._first_round = self.round
        self.recorder.start_clock()
        old = {s: signal.getsignal(s) for s in signals.SIGNALS}
        try:
            for s in old:
                signal.signal(s, self._on_signal)
        except ValueError:  # not the main thread: no signal handling
            old = {}
        end = self.R if stop_after_rounds is None else min(self.R, self.round + int(stop_after_rounds))
        end = self.strategy.round_limit(self.round, end)  # a privacy budget (dp.max_epsilon): stop before passing it
        primary = self.recorder.primary[0]
        try:
            with RoundProgress(self.R, self.round, progress_enabled and self.rank == 0, primary) as progress:
                while self.round < end:
                    r = self.round
                    metrics = self.run_round(r, progress)
                    self.recorder.stamp_round()
                    self.round = r + 1
                    evaluated = self.round % self.fl.eval_every == 0 or self.round == self.R
                    if evaluated:
                        metrics.update(self.evaluate())
                    row = self.recorder.record(self.round, metrics, keep=evaluated)
                    progress.end_round(r, {**row, primary: self.recorder.last(primary), "evaluated": evaluated})
                    signum = self._agreed_stop()
                    if self.round % every == 0 or self.round == end or signum:
                        if self._part_baseline is not None:  # else a resume would not be exact
                            unsaved.check(self.strategy.parts, self._part_baseline)
                        self.checkpointer.save(self.round, self.stateful())
                        signum = signum or self._agreed_stop()  # a signal that arrived during the save: stop now
                    if signum and self.round < end:  # at the end the run finishes normally (summary and all)
                        raise StopRequested(self.round, signum)
                self.checkpointer.wait()  # the last checkpoint is in place before the run reports
                summary = self.summary()
                for lg in self.fabric.loggers:
                    lg.finalize("success")
                progress.summary(summary)
        except NonFiniteLossError as err:  # the rounds that ran stay in metrics.csv; summary.json says why it stopped
            self.checkpointer.wait(quiet=True)
            self.summary(error=str(err))
            raise
        except BaseException:
            self.checkpointer.wait(quiet=True)  # one being written behind still lands (its own error only logged)
            raise
        finally:
            for s, h in old.items():
                signal.signal(s, h)
        return summary

    def summary(self, **extra) -> dict:
        done = capture_counts(self.cohort.step if self.cohort is not None else self.client_step)
        if done is not None:  # trainer.compile: what was compiled or captured (the cohort's step too), logged once
            extra["compile"] = done
        return self.recorder.summary(
            method=self.strategy.name, rounds_done=self.round, rounds=self.R, finished=self.round >= self.R,
            num_params=sum(p.numel() for p in self.params.values()), config_hash=self.checkpointer.config_hash,
            run_dir=self.run_dir, **extra)
