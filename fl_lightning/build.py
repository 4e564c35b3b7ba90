"""build(cfg): turn a composed Hydra config into (Fabric, module, FederatedData, Strategy, FederatedLoop).

``validate(cfg)`` checks the values a user is likely to get wrong and raises a one-line :class:`ConfigError`
naming the key and the fix. ``config_hash(cfg)`` hashes the result-relevant part of the config (what a resumed
run must share with the run that wrote the checkpoint).
"""
from __future__ import annotations

import hashlib
import json
import logging
import os

import torch
from omegaconf import DictConfig, OmegaConf

from .errors import ConfigError

log = logging.getLogger("fl_lightning")

# keys that do not change results: where output goes, how it is shown, how often it is saved, how it is resumed,
# and the process count (which changes only the float summation order)
_NOT_RESULT = {"resume", "force_resume", "stop_after_rounds", "run_dir", "checkpoint", "store", "hydra", "progress"}
_NOT_RESULT_TRAINER = {"devices", "num_nodes", "strategy", "progress", "loggers"}


def validate(cfg: DictConfig) -> None:
    fl = cfg.fl

    def need(ok: bool, key: str, problem: str, fix: str):
        if not ok:
            raise ConfigError(key, problem, fix)

    need(int(fl.num_clients) >= 1, "fl.num_clients", f"must be >= 1, got {fl.num_clients}", "set fl.num_clients=16")
    need(int(fl.clients_per_round) >= 1, "fl.clients_per_round", f"must be >= 1, got {fl.clients_per_round}",
         "set fl.clients_per_round to a value in [1, fl.num_clients]")
    need(int(fl.clients_per_round) <= int(fl.num_clients), "fl.clients_per_round",
         f"{fl.clients_per_round} clients per round but only fl.num_clients={fl.num_clients} clients exist",
         f"set fl.clients_per_round <= {fl.num_clients} or raise fl.num_clients")
    need(int(fl.rounds) >= 1, "fl.rounds", f"must be >= 1, got {fl.rounds}", "set fl.rounds=50")
    steps, epochs = fl.get("local_steps"), fl.get("local_epochs")
    need(bool(steps) != bool(epochs), "fl.local_steps",
         f"set exactly one of fl.local_steps / fl.local_epochs (got {steps} / {epochs})",
         "e.g. fl.local_steps=5 fl.local_epochs=null")
    need(steps is None or int(steps) >= 1, "fl.local_steps", f"must be >= 1, got {steps}", "set fl.local_steps=5")
    need(epochs is None or int(epochs) >= 1, "fl.local_epochs", f"must be >= 1, got {epochs}", "set fl.local_epochs=1")
    need(int(fl.get("eval_every", 1)) >= 1, "fl.eval_every", "must be >= 1", "set fl.eval_every=1")
    need(fl.get("lr_schedule", "constant") in ("constant", "cosine"), "fl.lr_schedule",
         f"unknown schedule {fl.get('lr_schedule')!r}", "use constant or cosine")
    p = cfg.data.partition
    if p.name in ("dirichlet", "dirichlet_per_client"):
        need(p.get("alpha") is not None and float(p.alpha) > 0, "data.partition.alpha",
             f"Dirichlet concentration must be > 0, got {p.get('alpha')}", "use e.g. data.partition.alpha=0.1 (skewed) or 10 (near iid)")
    need(int(cfg.data.batch_size) >= 1, "data.batch_size", f"must be >= 1, got {cfg.data.batch_size}", "set data.batch_size=32")
    prec = str(cfg.trainer.precision)
    need(prec in ("32-true", "32", "64-true", "bf16-mixed", "bf16-true", "16-mixed", "16-true"), "trainer.precision",
         f"unknown precision {prec!r}", "use 32-true, bf16-mixed, bf16-true or 64-true")
    need(prec not in ("16-mixed",), "trainer.precision", "fp16 mixed precision needs a grad scaler that per-client "
         "optimizers do not share", "use bf16-mixed")
    clip = cfg.method.get("grad_clip")
    need(clip is None or float(clip) > 0, "method.grad_clip", f"must be > 0 or null, got {clip}", "set method.grad_clip=null")
    ck = cfg.checkpoint
    need(int(ck.get("every", 1)) >= 1, "checkpoint.every", "must be >= 1", "set checkpoint.every=1")
    if cfg.get("resume"):
        need(os.path.isdir(str(cfg.resume)), "resume", f"no run directory {cfg.resume!r}",
             "pass the run directory printed by the stopped run (it holds checkpoints/)")


def config_hash(cfg: DictConfig) -> str:
    c = OmegaConf.to_container(cfg, resolve=True)
    c = {k: v for k, v in c.items() if k not in _NOT_RESULT}
    c["trainer"] = {k: v for k, v in c.get("trainer", {}).items() if k not in _NOT_RESULT_TRAINER}
    if c.get("fl", {}).get("lr_schedule", "constant") == "constant":  # R matters only through the schedule
        c["fl"] = {k: v for k, v in c["fl"].items() if k != "rounds"}
    c.get("fl", {}).pop("eval_every", None)
    return hashlib.sha256(json.dumps(c, sort_keys=True).encode()).hexdigest()[:16]


def make_fabric(cfg: DictConfig, run_dir: str):
    from lightning.fabric import Fabric
    from lightning.fabric.loggers import CSVLogger

    loggers = [CSVLogger(os.path.join(run_dir, "logs"), name="", version="")]
    try:
        from lightning.fabric.loggers import TensorBoardLogger
        import tensorboard  # noqa: F401

        loggers.append(TensorBoardLogger(os.path.join(run_dir, "logs"), name="tb", version=""))
    except Exception:  # TensorBoard is optional
        pass
    t = cfg.trainer
    prec = str(t.precision)
    return Fabric(accelerator=t.accelerator, devices=t.devices, num_nodes=int(t.get("num_nodes", 1)),
                  strategy=t.get("strategy", "auto"), precision=prec, loggers=loggers)


def build(cfg: DictConfig, run_dir: str, fabric=None):
    """Everything a run needs. Returns the FederatedLoop (with ``.fabric``, ``.module``, ``.data``, ``.strategy``)."""
    from .data import build_federated_data
    from .loop import FederatedLoop
    from .models import build_model
    from .strategies import build_strategy

    validate(cfg)
    os.makedirs(run_dir, exist_ok=True)
    if fabric is None:
        fabric = make_fabric(cfg, run_dir)
        fabric.launch()
    torch.manual_seed(int(cfg.seed))
    data = build_federated_data(cfg.data, int(cfg.fl.num_clients), int(cfg.seed), fabric.device)
    if fabric.global_rank == 0:
        log.info("data %s: %s", cfg.data.name, data.stats.summary())
    in_shape = tuple(data.train.tensors["x"].shape[1:])
    with fabric.init_module():
        torch.manual_seed(int(cfg.seed))
        module = build_model(cfg.model, in_shape, data.num_classes)
    module = module.to(fabric.device)
    strategy = build_strategy(cfg.method)
    return FederatedLoop(fabric, module, data, strategy, cfg, run_dir, config_hash(cfg))
