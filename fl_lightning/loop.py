"""FederatedLoop: rounds of client sampling, local training with swapped-in client state, streaming aggregation,
evaluation, logging and checkpoints, on Lightning Fabric.

One module lives on the device. The global state ``x`` (trainable parameters + float buffers) is kept beside it;
for each sampled client the loop copies ``x`` into the module, checks the client's private state out of the
:class:`ClientStateStore`, runs K local steps through ``module.training_step`` with the strategy's hooks around
backward and ``optimizer.step``, then adds the client's upload to streaming sums and checks its state back in.
With several Fabric processes each process trains the sampled clients it owns (``client % world_size == rank``)
and the sums are all-reduced before ``strategy.server_update``. The loop never looks at which method it runs.
"""
from __future__ import annotations

import csv
import json
import logging
import math
import os
import shutil
import signal
import time
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor

from . import seeding
from .checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from .client_store import ClientStateStore
from .errors import NonFiniteLossError, ResumeError
from .progress import RoundProgress
from .schedule import lr_factor
from .strategies.base import Aggregate, ClientContext, ServerContext, Strategy

log = logging.getLogger("fl_lightning")

METRIC_COLUMNS = ["round", "train_loss", "test_loss", "test_acc", "uplink_bytes", "downlink_bytes", "lr_factor", "wall_s"]


class StopRequested(Exception):
    """Raised after a checkpoint was written in response to SIGINT/SIGTERM."""

    def __init__(self, round_done: int, signum: int):
        self.round_done, self.signum = round_done, signum
        super().__init__(f"stopped by signal {signum} after round {round_done}")


class FederatedLoop:
    def __init__(self, fabric, module, data, strategy: Strategy, cfg, run_dir: str, config_hash: str = ""):
        self.fabric, self.module, self.data, self.strategy, self.cfg = fabric, module, data, strategy, cfg
        self.run_dir, self.config_hash = run_dir, config_hash
        fl = cfg.fl
        self.n, self.S, self.R = int(fl.num_clients), int(fl.clients_per_round), int(fl.rounds)
        self.local_steps = fl.get("local_steps")
        self.local_epochs = fl.get("local_epochs")
        self.eval_every = int(fl.get("eval_every", 1))
        self.seed = int(cfg.seed)
        self.rank, self.world = fabric.global_rank, fabric.world_size
        self.device = fabric.device
        self.ckpt_root = os.path.join(run_dir, "checkpoints")
        self.metrics_path = os.path.join(run_dir, "metrics.csv")

        sd = module.state_dict()
        self.trainable = [n for n, p in module.named_parameters() if p.requires_grad]
        buffers = {n for n, b in module.named_buffers() if b.is_floating_point()}
        # the communicated state: trainable params + float buffers (frozen params, e.g. a LoRA backbone, stay put)
        self.keys = [k for k in sd if k in set(self.trainable) or k in buffers]
        self.local: dict[str, Tensor] = {k: sd[k] for k in self.keys}
        self.params = {n: p for n, p in module.named_parameters() if p.requires_grad}
        self.param_dtype = next(iter(self.params.values())).dtype
        self.global_params: dict[str, Tensor] = {k: v.detach().clone() for k, v in self.local.items()}
        self.owned = [c for c in range(self.n) if c % self.world == self.rank]
        offload = cfg.get("store", {}).get("offload_dir") if cfg.get("store") else None
        if offload and self.world > 1:
            offload = os.path.join(offload, f"rank{self.rank}")
        self.store = ClientStateStore(self.device, offload)
        self.model_bytes = sum(v.numel() * v.element_size() for v in self.global_params.values())

        self.round = 0  # rounds completed
        self.rows: list[dict] = []
        self.uplink = self.downlink = 0
        self.wall_before = 0.0
        self._stop_signal: int | None = None
        self.last_ckpt: str | None = None

    # ------------------------------------------------------------------ helpers
    def _load_global_into_module(self) -> None:
        with torch.no_grad():
            for k, t in self.local.items():
                t.copy_(self.global_params[k])

    def _cast_floats(self, batch: dict) -> dict:
        """Float inputs in the parameters' dtype (needed under the "-true" precisions; a no-op otherwise)."""
        dtype = self.param_dtype
        return {k: (v.to(dtype) if v.is_floating_point() and v.dtype != dtype else v) for k, v in batch.items()}

    def _all_reduce(self, t: Tensor) -> Tensor:
        return self.fabric.all_reduce(t, reduce_op="sum") if self.world > 1 else t

    def _gradient(self, batch: dict) -> dict[str, Tensor]:
        """Gradient of ``training_step(batch)`` at the module's current weights; leaves ``p.grad`` as it was."""
        saved = {n: p.grad for n, p in self.params.items()}
        was_training = self.module.training
        self.module.train()
        for p in self.params.values():
            p.grad = None
        with self.fabric.autocast():
            loss = self.module.training_step(self._cast_floats(batch), 0)
        self.fabric.backward(loss)
        grads = {n: (p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)) for n, p in self.params.items()}
        for n, p in self.params.items():
            p.grad = saved[n]
        self.module.train(was_training)
        return grads

    def _probe_gradient(self, cid: int) -> dict[str, Tensor]:
        """Minibatch gradient of client ``cid`` at the current global weights (a fixed probe stream)."""
        self._load_global_into_module()
        return self._gradient(self.data.probe_batch(cid, self.device))

    def server_context(self) -> ServerContext:
        return ServerContext(
            module=self.module, global_params=self.global_params, trainable=self.trainable, num_clients=self.n,
            clients_per_round=self.S, rounds=self.R, device=self.device,
            client_num_samples=[self.data.num_samples(c) for c in range(self.n)], owned_clients=self.owned,
            store=self.store, probe_gradient=self._probe_gradient, all_reduce_sum=self._all_reduce,
            lr_factor=self.lr_factor, local_steps=int(self.local_steps) if self.local_steps else None,
        )

    def lr_factor(self, r: int) -> float:
        fl = self.cfg.fl
        return lr_factor(r, self.R, fl.get("lr_schedule", "constant"), float(fl.get("lr_min_factor", 0.0)),
                         int(fl.get("warmup_rounds", 0)))

    # ------------------------------------------------------------------ one client
    def train_client(self, cid: int, r: int, received: dict[str, Tensor], lr_f: float) -> tuple[dict, float]:
        self._load_global_into_module()
        torch.manual_seed(seeding.derive(self.seed, seeding.CLIENT_TORCH, cid, r))  # dropout etc.: (seed, client, round)
        client = ClientContext(
            id=cid, round=r, module=self.module, params=self.params, local=self.local, global_params=self.global_params,
            state=self.store.checkout(cid), num_samples=self.data.num_samples(cid),
            num_steps=self.data.steps_per_round(cid, self.local_steps, self.local_epochs), lr_factor=lr_f,
            received=received,
            extra_gradient=lambda: self._gradient(self.data.extra_batch(cid, r, self.device)),
        )
        self.strategy.client_start(client)
        self.module.train()
        clip = self.strategy.grad_clip
        loss_sum = torch.zeros((), device=self.device)
        for k, batch in enumerate(self.data.client_batches(cid, r, self.device, self.local_steps, self.local_epochs)):
            batch = self._cast_floats(batch)
            with self.fabric.autocast():
                loss = self.module.training_step(batch, k)
            self.fabric.backward(loss)
            self.strategy.after_backward(client)
            if clip:
                torch.nn.utils.clip_grad_norm_(list(self.params.values()), float(clip))
            client.optimizer.step()
            client.step += 1
            self.strategy.after_step(client)
            client.optimizer.zero_grad(set_to_none=True)
            loss_sum += loss.detach().float()
        mean_loss = float(loss_sum) / max(1, client.step)
        if not math.isfinite(mean_loss):
            where = f"; last good checkpoint: {self.last_ckpt}" if self.last_ckpt else "; no checkpoint was written yet"
            raise NonFiniteLossError(
                f"training loss became {mean_loss} at round {r + 1}, client {cid}: lower the learning rate "
                f"(method.lr) or set method.grad_clip{where}"
            )
        msgs = self.strategy.client_end(client)
        self.store.checkin(cid, client.state)
        client.optimizer = None
        return msgs, mean_loss

    # ------------------------------------------------------------------ one round
    def _reduce_aggregate(self, agg: Aggregate) -> None:
        if self.world == 1:
            return
        import torch.distributed as dist

        meta = {k: (tuple(v.shape), str(v.dtype)) for k, v in agg.sums.items()}
        gathered: list[Any] = [None] * self.world
        dist.all_gather_object(gathered, meta)
        union: dict[str, tuple] = {}
        for g in gathered:
            union.update(g)
        for k in sorted(union):
            shape, dtype = union[k]
            if k not in agg.sums:
                agg.sums[k] = torch.zeros(shape, dtype=getattr(torch, dtype.split(".")[-1]), device=self.device)
                agg.weights[k] = 0.0
            agg.sums[k] = self._all_reduce(agg.sums[k])
        keys = sorted(union)
        w = self._all_reduce(torch.tensor([agg.weights[k] for k in keys] + [agg.num_sampled], dtype=torch.float64, device=self.device))
        for i, k in enumerate(keys):
            agg.weights[k] = float(w[i])
        agg.num_sampled = int(w[-1])

    def run_round(self, r: int, progress: RoundProgress | None = None) -> dict:
        sampled = seeding.sample_clients(self.seed, r, self.n, self.S)
        mine = [c for c in sampled if c % self.world == self.rank]
        lr_f = self.lr_factor(r)
        down = self.strategy.broadcast(r)
        received = {k: m.tensor for k, m in down.items()}
        down_bytes = (self.model_bytes + sum(m.size() for m in down.values())) * len(sampled)
        agg = Aggregate(self.n)
        up_bytes, loss_total = 0, 0.0
        if progress:
            progress.start_round(r, len(mine))
        for cid in mine:
            msgs, loss = self.train_client(cid, r, received, lr_f)
            up_bytes += sum(m.size() for m in msgs.values())
            loss_total += loss
            agg.add(msgs)
            if progress:
                progress.client_done()
        self._reduce_aggregate(agg)
        tot = self._all_reduce(torch.tensor([float(up_bytes), loss_total], dtype=torch.float64, device=self.device))
        self.strategy.server_update(r, agg)
        self.uplink += int(tot[0])
        self.downlink += down_bytes
        return {"train_loss": float(tot[1]) / len(sampled), "lr_factor": lr_f}

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        self._load_global_into_module()
        self.module.eval()
        for i, batch in enumerate(self.data.test_batches(self.device)):
            with self.fabric.autocast():
                self.module.validation_step(self._cast_floats(batch), i)
        return self.module.compute_eval()

    # ------------------------------------------------------------------ checkpoints
    def state_tensors(self) -> dict[str, dict[str, Tensor]]:
        out = {"model": dict(self.global_params), "strategy": self.strategy.state_dict(),
               f"clients.rank{self.rank}": self.store.state_dict(), "rng": {"torch": torch.get_rng_state()}}
        return out

    def save(self, wall: float) -> str:
        """Checkpoint at the end of round ``self.round``. With several processes each writes its clients' states
        into a staging folder and rank 0 assembles the checkpoint (which is then written atomically)."""
        meta = {"round": self.round, "rows": self.rows, "uplink": self.uplink, "downlink": self.downlink,
                "wall_s": wall, "config_hash": self.config_hash, "world_size": self.world}
        tensors = self.state_tensors()
        final = os.path.join(self.ckpt_root, f"round_{self.round:06d}")
        staging = final + ".parts"
        if self.world > 1:
            stem = f"clients.rank{self.rank}"
            os.makedirs(staging, exist_ok=True)
            save_file({k: v.cpu().contiguous() for k, v in tensors.pop(stem).items()}, os.path.join(staging, stem + ".safetensors"))
            self.fabric.barrier()
            if self.rank == 0:
                for f in os.listdir(staging):
                    tensors[f[: -len(".safetensors")]] = load_file(os.path.join(staging, f))
        if self.rank == 0:
            save_checkpoint(self.ckpt_root, self.round, tensors, meta, int(self.cfg.checkpoint.get("keep_last", 2)))
            shutil.rmtree(staging, ignore_errors=True)
        if self.world > 1:
            self.fabric.barrier()
        self.last_ckpt = final
        return final

    def restore(self, run_dir: str, force: bool = False) -> None:
        path = latest_checkpoint(os.path.join(run_dir, "checkpoints"))
        if path is None:
            raise ResumeError(f"resume: no checkpoint under {os.path.join(run_dir, 'checkpoints')}; "
                              "point resume= at a run directory that has checkpoints/round_*")
        tensors, meta = load_checkpoint(path)
        if meta.get("config_hash") != self.config_hash and not force:
            raise ResumeError(
                f"resume: the config differs from the one that wrote {path} in a way that changes results "
                f"(hash {meta.get('config_hash')} != {self.config_hash}); rerun with the same overrides, or add force_resume=true"
            )
        if meta.get("world_size", 1) != self.world:
            raise ResumeError(f"resume: checkpoint written by {meta.get('world_size')} processes, this run has "
                              f"{self.world}; set trainer.devices to match")
        with torch.no_grad():
            for k, v in tensors["model"].items():
                self.global_params[k].copy_(v)
        self.strategy.load_state_dict({k: v.to(self.device) for k, v in tensors.get("strategy", {}).items()})
        self.store.load_state_dict(tensors.get(f"clients.rank{self.rank}", {}))
        if "rng" in tensors:
            torch.set_rng_state(tensors["rng"]["torch"])
        self.round, self.rows = int(meta["round"]), list(meta["rows"])
        self.uplink, self.downlink, self.wall_before = int(meta["uplink"]), int(meta["downlink"]), float(meta["wall_s"])
        self.last_ckpt = path
        log.info("resumed from %s (round %d)", path, self.round)

    # ------------------------------------------------------------------ metrics
    def _write_metrics(self) -> None:
        if self.rank != 0:
            return
        tmp = self.metrics_path + ".tmp"
        with open(tmp, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=METRIC_COLUMNS)
            w.writeheader()
            for row in self.rows:
                w.writerow({k: row.get(k) for k in METRIC_COLUMNS})
        os.replace(tmp, self.metrics_path)

    # ------------------------------------------------------------------ run
    def _on_signal(self, signum, frame):  # first signal: stop at the next safe point; second: abort
        if self._stop_signal is not None:
            raise KeyboardInterrupt
        self._stop_signal = signum
        log.warning("signal %d received: will checkpoint and stop after this round (again to abort now)", signum)

    def setup(self, resume: str | None = None, force: bool = False) -> None:
        self.strategy.setup(self.server_context())
        if resume:
            self.restore(resume, force)
            self._write_metrics()

    def run(self, stop_after_rounds: int | None = None, progress_enabled: bool = True) -> dict:
        ck_every = int(self.cfg.checkpoint.get("every", 1))
        t0 = time.perf_counter()
        old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            for s in old:
                signal.signal(s, self._on_signal)
        except ValueError:  # not the main thread: no signal handling
            old = {}
        end = self.R if stop_after_rounds is None else min(self.R, self.round + int(stop_after_rounds))
        try:
            with RoundProgress(self.R, self.round, progress_enabled and self.rank == 0) as progress:
                while self.round < end:
                    r = self.round
                    info = self.run_round(r, progress)
                    self.round = r + 1
                    evaluated = self.round % self.eval_every == 0 or self.round == self.R
                    wall = self.wall_before + time.perf_counter() - t0
                    row = {"round": self.round, "train_loss": info["train_loss"], "uplink_bytes": self.uplink,
                           "downlink_bytes": self.downlink, "lr_factor": info["lr_factor"], "wall_s": round(wall, 3)}
                    if evaluated:
                        row.update(self.evaluate())
                        self.rows.append(row)
                        self._write_metrics()
                        self.fabric.log_dict({k: v for k, v in row.items() if k != "round"}, step=self.round)
                    last = self.rows[-1] if self.rows else {}
                    progress.end_round(r, {**row, "test_acc": last.get("test_acc", float("nan")), "evaluated": evaluated})
                    stop = self._stop_signal is not None
                    if self.round % ck_every == 0 or self.round == end or stop:
                        self.save(wall)
                    if stop:
                        raise StopRequested(self.round, self._stop_signal)
                wall = self.wall_before + time.perf_counter() - t0
                summary = self.summary(wall)
                for lg in self.fabric.loggers:
                    lg.finalize("success")
                progress.summary(summary)
        finally:
            for s, h in old.items():
                signal.signal(s, h)
        return summary

    def summary(self, wall: float) -> dict:
        last = self.rows[-1] if self.rows else {}
        accs = [r["test_acc"] for r in self.rows if "test_acc" in r]
        cfg = self.cfg
        s = {
            "method": self.strategy.name, "model": cfg.model.name, "data": cfg.data.name, "rounds_done": self.round,
            "rounds": self.R, "finished": self.round >= self.R, "final_test_acc": last.get("test_acc"),
            "final_test_loss": last.get("test_loss"), "final_train_loss": last.get("train_loss"),
            "best_test_acc": max(accs) if accs else None, "uplink_bytes": self.uplink, "downlink_bytes": self.downlink,
            "uplink_mb": self.uplink / 1e6, "downlink_mb": self.downlink / 1e6, "wall_s": round(wall, 2),
            "num_params": sum(p.numel() for p in self.params.values()), "config_hash": self.config_hash,
            "run_dir": self.run_dir,
        }
        if self.rank == 0:
            with open(os.path.join(self.run_dir, "summary.json"), "w") as f:
                json.dump(s, f, indent=2)
        return s
