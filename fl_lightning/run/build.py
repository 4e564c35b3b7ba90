"""build(cfg): turn a composed Hydra config into (Fabric, module, FederatedData, Strategy, FederatedLoop).

``cfg`` arrives checked (:func:`fl_lightning.config.check_run`, which the command line runs before torch loads);
nothing here checks it again. What only the machine or the data can tell is checked on values: the accelerator is
there (:func:`check_device`), a partition's client count (``fl.num_clients=auto``) fits ``fl.clients_per_round``.
"""
from __future__ import annotations

import functools
import importlib.util
import logging
import os
import time
import warnings

import torch
from omegaconf import DictConfig, OmegaConf, open_dict

from ..dist import peers, signals
from .. import precision
from .._compat import import_fabric, set_collective_timeout, starts_processes_from_a_function
from ..checkpoint import Checkpointer
from ..loop.client_store import ClientStateStore
from ..cohort import auto as auto_settings
from ..cohort import auto_cohort, check_cohort_memory
from ..step import Capture
from ..config import check_clients, check_run, config_hash, instantiate, interpolation_source
from ..data import build_federated_data, hub
from ..dp import attach_dp
from ..errors import ConfigError
from ..loop.loop import FederatedLoop, LoopConfig
from ..models import build_model
from ..recorder import RunRecorder
from ..strategies import build_strategy
from ..threads import auto_threads

log = logging.getLogger("fl_lightning")

def check_device(accelerator: str) -> None:
    """What the config check cannot know before torch loads: the accelerator asked for is on this machine."""
    acc = str(accelerator)
    if acc in ("gpu", "cuda") and not torch.cuda.is_available():
        raise ConfigError("trainer.accelerator", f"{acc} asked for but no CUDA GPU is visible to this process",
                          "use trainer.accelerator=cpu (or auto)")
    if acc in ("tpu", "mps"):
        import_fabric()
        from lightning.fabric.accelerators import MPSAccelerator, XLAAccelerator

        if not (XLAAccelerator if acc == "tpu" else MPSAccelerator).is_available():
            need = "a TPU host with torch_xla installed" if acc == "tpu" else "an Apple-silicon Mac"
            raise ConfigError("trainer.accelerator", f"{acc} asked for but this machine has none ({acc} needs {need})",
                              "use trainer.accelerator=cpu (or auto)")


def apply_threads(cfg: DictConfig, num_params: int | None = None) -> int:
    """``trainer.threads``: torch's intra-op CPU threads for this process; ``auto``:
    :func:`fl_lightning.threads.auto_threads` (the CPUs this process may use over ``trainer.devices``, or
    ``OMP_NUM_THREADS``). Idle OpenMP threads sleep instead of spinning (:func:`fl_lightning.threads.passive_wait`,
    set by train.py before torch loads), so the default stays fast on a busy machine (docs/benchmarks.md)."""
    t = cfg.trainer.threads  # checked with the config (the schema: a whole number in range, or auto)
    devices = cfg.trainer.devices
    per_node = (devices if isinstance(devices, int) else 1) * int(cfg.trainer.processes_per_device)
    n = auto_threads(per_node, num_params) if t == "auto" else int(t)
    if n != torch.get_num_threads():
        torch.set_num_threads(n)
    return n


_LOGGER_FOLDERS = {"root_dir", "save_dir", "tracking_uri"}
_LOGGER_TEXT_KEYS = _LOGGER_FOLDERS | {"name", "project", "experiment_name", "version", "prefix"}
_LOGGER_PACKAGES = {"WandbLogger": "wandb", "MLFlowLogger": "mlflow", "TensorBoardLogger": "tensorboard",
                    "CometLogger": "comet_ml", "NeptuneLogger": "neptune"}


def make_loggers(cfg: DictConfig) -> list:
    """The ``logger`` group's entries, each a Fabric logger built from its ``_target_``: none by default, the rows'
    one file being the run's own metrics.csv (RunRecorder; ``logger=csv`` names it and adds nothing). A resumed run
    logs into its own version folder (``resumed_<time>``; a logger would otherwise overwrite or mix the earlier
    part's files). A logger whose package is missing is one line naming the package and the extra that installs it."""
    node = cfg.get("logger")
    if not OmegaConf.is_dict(node):
        return []
    version = f"resumed_{time.strftime('%Y%m%d-%H%M%S')}" if cfg.get("resume") else ""
    loggers = []
    for name, sub in node.items():
        if not OmegaConf.is_dict(sub) or "_target_" not in sub:
            raise ConfigError(f"logger.{name}", "is not a logger node (a mapping with a _target_)",
                              "choose a logger with logger=tensorboard | wandb | mlflow")
        cls = str(sub._target_).rsplit(".", 1)[-1]
        package = _LOGGER_PACKAGES.get(cls)
        if package and importlib.util.find_spec(package) is None:
            raise ConfigError(f"logger.{name}", f"{cls} needs the {package} package, which is not installed",
                              f"pip install {package} (or pip install -e \".[loggers]\"), or drop logger= (the "
                              "run's metrics.csv is written whatever the logger)")
        extra = {"version": version} if "version" not in sub and cls in ("CSVLogger", "TensorBoardLogger") else {}
        for k in _LOGGER_TEXT_KEYS & set(sub):  # folders and names: a number is a name (0 -> "0"), null is refused
            v = sub[k]
            if v is None and k in _LOGGER_FOLDERS:
                raise ConfigError(f"logger.{name}.{k}", "must be a folder, got null",
                                  "remove the override (default: the run's logs/ folder) or give a folder")
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                extra[k] = str(v)
        loggers.append(instantiate(sub, f"logger.{name}", drop=(), **extra))
    return loggers


def make_fabric(cfg: DictConfig, run_dir: str):
    Fabric = import_fabric().Fabric  # without lightning.pytorch and torchmetrics (a logger that needs them imports them)
    loggers = make_loggers(cfg)
    t = cfg.trainer
    prec = str(t.precision)
    strategy, devices = t.strategy, t.devices
    if int(t.processes_per_device) > 1:
        strategy, devices = shared_devices(t)
    try:
        fabric = Fabric(accelerator=t.accelerator, devices=devices, num_nodes=int(t.num_nodes),
                        strategy=strategy, precision=prec, loggers=loggers)
        set_collective_timeout(fabric.strategy, int(t.timeout_s))
        return fabric
    except (ValueError, TypeError, RuntimeError) as err:  # Fabric's own checks: one line naming the key
        msg = " ".join(str(err).split())
        key = next((f"trainer.{k}" for k in ("strategy", "precision", "accelerator", "devices", "num_nodes")
                    if k in msg), "trainer")
        from ..config import example, value_text

        ex = f"set e.g. {key}={value_text(example(key))} " if key != "trainer" else ""
        raise ConfigError(key, f"Lightning Fabric refused it: {msg[:300]}",
                          f"{ex}(python -m fl_lightning.config.keys {key} says its values)") from None


def shared_devices(t: DictConfig):
    """``trainer.processes_per_device=P``: a DDP strategy whose process list names each of this node's devices P times
    (Fabric starts one process per entry and puts each on its entry's device), with gloo collectives (NCCL refuses two
    processes on one GPU). As pfl-research and the seeds' Ray scripts do: several clients in flight on one GPU, each
    process training its share of the round's clients. Returns ``(strategy, devices)`` for Fabric."""
    strategy = str(t.strategy)
    if strategy not in ("auto", "ddp"):
        raise ConfigError("trainer.strategy", f"{strategy} cannot share a device between processes "
                          f"(trainer.processes_per_device={t.processes_per_device})", "use trainer.strategy=ddp (or auto)")
    acc = str(t.accelerator)
    kind = "cuda" if acc in ("cuda", "gpu") or (acc == "auto" and torch.cuda.is_available()) else "cpu"
    if kind == "cpu" and acc not in ("cpu", "auto"):
        raise ConfigError("trainer.processes_per_device", f"shares CPUs or CUDA GPUs, not {acc}",
                          "use trainer.accelerator=cuda or cpu, or trainer.processes_per_device=1")
    count = torch.cuda.device_count() if kind == "cuda" else 1
    n = count if t.devices == "auto" else int(t.devices)
    if kind == "cuda" and n > count:
        raise ConfigError("trainer.devices", f"{n} GPUs asked for, {count} visible", f"use trainer.devices={count} or fewer")
    ids = list(range(n))
    parallel = [torch.device(kind, i) if kind == "cuda" else torch.device("cpu")
                for i in ids for _ in range(int(t.processes_per_device))]
    from lightning.fabric.strategies import DDPStrategy  # lightning.fabric is loaded by now (import_fabric)

    return DDPStrategy(parallel_devices=parallel, process_group_backend="gloo"), (ids if kind == "cuda" else n)


def available_memory(device: torch.device) -> int | None:
    """Bytes free for new tensors on ``device`` (CUDA: free device memory; CPU: MemAvailable), None if unknown."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError):
        return None


def _size(b: float) -> str:
    return f"{b / 2**30:.1f} GiB" if b >= 2**30 else f"{b / 2**20:.1f} MiB"


def check_model_memory(cfg: DictConfig, info, device: torch.device, copies: int = 3) -> None:
    """Parameters × bytes, counted on the meta device (nothing allocated), times ``copies`` (the model, its gradients
    and the global copy; optimizer and client states come on top) against the memory available: one line naming
    the model instead of an allocation failure or the OOM killer minutes later."""
    avail = available_memory(device)
    if avail is None:
        return
    try:
        with warnings.catch_warnings(), torch.device("meta"):
            warnings.simplefilter("ignore")
            net = build_model(cfg.model, info)
        size = sum(p.numel() * p.element_size() for p in net.parameters())
    except Exception:  # a builder that cannot run on the meta device: the real build reports its own errors
        return
    if copies * size > avail:
        n = sum(p.numel() for p in net.parameters())
        raise ConfigError("model", f"{n / 1e6:,.1f} M parameters need at least {_size(copies * size)} on "
                          f"{device.type} (weights, gradients, the global copy) but {_size(avail)} is free",
                          f"choose a smaller model (model=<name> or its size keys: {size_keys(cfg.model)}), "
                          "or run where more memory is free")


def size_keys(model: DictConfig) -> str:
    """The keys of a model's config that size it (``model.net.hidden_size``, ``model.net.layers``, ...): its
    whole-number keys and lists of them (widths, depths, heads, vocabularies)."""
    plain = OmegaConf.to_container(model, resolve=True)
    found = []

    def walk(node, prefix):
        for k, v in node.items():
            if isinstance(v, dict):
                walk(v, f"{prefix}{k}.")
            elif not str(k).startswith("_") and (isinstance(v, int) and not isinstance(v, bool) and v > 1 or (
                    isinstance(v, list) and v and all(isinstance(x, int) and not isinstance(x, bool) for x in v))):
                found.append(f"model.{prefix}{k}")

    walk(plain, "")
    return ", ".join(found) or "model.net.*"


def activation_bytes(module, data, fabric) -> int:
    """What one client's forward and backward add at their peak on a CUDA device (the activations and gradients of
    one batch), measured on client 0's probe batch; the weights are left as they were."""
    device = fabric.device
    dtype = next(module.parameters()).dtype  # the "-true" precisions: inputs in the parameters' dtype
    batch = {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in data.probe_batch(0, device).items()}
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    with fabric.autocast():
        loss = module.training_step(batch, 0)
    loss.backward()
    peak = torch.cuda.max_memory_allocated(device) - before
    for p in module.parameters():
        p.grad = None
    return max(0, peak)


def _check_launcher(fabric) -> None:
    """train.py runs as a script in every process (Fabric re-runs it per rank); launchers that start processes from a
    function (``ddp_spawn``, ``ddp_fork``, ``ddp_notebook``) are refused in one line instead of Fabric's TypeError."""
    if starts_processes_from_a_function(fabric.strategy.launcher):
        raise ConfigError("trainer.strategy", "train.py starts one process per device by re-running itself; "
                          f"{type(fabric.strategy).__name__} with {fabric.strategy.launcher._start_method} start-up "
                          "starts them from a function", "use trainer.strategy=ddp")


def build(cfg: DictConfig, run_dir: str, fabric=None, checked: bool = False, resume: str | None = None):
    """Everything a run needs. Returns the FederatedLoop (with ``.fabric``, ``.module``, ``.data``, ``.strategy``).
    ``checked``: :func:`fl_lightning.config.check_run` already ran on ``cfg`` (the CLI does, once); otherwise it runs here.
    ``resume``: the run directory this run continues (its saved config decides what ``auto`` precisions and
    ``trainer.cohort`` / ``trainer.compile`` resolve to)."""
    saved = os.path.join(resume, "config.yaml") if resume else None
    if not checked:
        check_run(cfg)  # the config's one check (the CLI runs it before torch loads): nothing below re-checks cfg
    check_device(cfg.trainer.accelerator)
    precision.resolve(cfg, OmegaConf.load(saved) if saved and os.path.exists(saved) else None)
    auto_threads_later = cfg.trainer.threads == "auto"
    if not auto_threads_later:  # a number: from the start (the data's build too)
        apply_threads(cfg)
    os.makedirs(run_dir, exist_ok=True)
    if fabric is None:
        fabric = make_fabric(cfg, run_dir)
        _check_launcher(fabric)
        signals.LAUNCHERS.append(fabric.strategy.launcher)  # its children are told of a signal before the loop runs
        signals.interruptible(fabric.launch)  # SIGTERM while waiting for a peer that never comes: out at once
        if fabric.device.type == "cuda":  # the current CUDA device is per thread: the launch set it in its own
            torch.cuda.set_device(fabric.device)
        if fabric.world_size > 1:
            peers.watch_children(fabric.strategy.launcher)
            peers.check_shared_dir(fabric, run_dir)
            peers.start_heartbeat(fabric.global_rank, fabric.world_size)
    torch.manual_seed(int(cfg.seed))
    hub.configure(bool(cfg.get("download", False)))  # offline unless download=true (fl_lightning/data/hub.py)
    auto = str(cfg.fl.num_clients) == "auto"
    data = build_federated_data(cfg.data, None if auto else int(cfg.fl.num_clients), int(cfg.seed), fabric.device)
    if auto:  # the partition decided (one client per natural group): record it and check what depends on it
        with open_dict(cfg):
            cfg.fl.num_clients = data.num_clients
        check_clients(data.num_clients, int(cfg.fl.clients_per_round))
    if fabric.global_rank == 0:
        log.info("data %s: %s", cfg.data.get("name"), data.stats.summary())
    check_model_memory(cfg, data.info, fabric.device)
    module = _module(cfg, data, fabric)
    if auto_threads_later:  # auto: once, now that the model's size is known (a small model gets one thread)
        apply_threads(cfg, sum(p.numel() for p in module.parameters()) if fabric.device.type == "cpu" else None)
    strategy = build_strategy(cfg.method, checked=True)
    attach_dp(cfg, strategy, data.num_clients)
    clients = -(-int(cfg.fl.clients_per_round) // fabric.world_size)
    bound = functools.lru_cache(maxsize=1)(lambda: auto_cohort(  # the memory bound on K (a one-client probe)
        strategy, module, fabric.device, clients, available_memory(fabric.device),
        lambda: activation_bytes(module, data, fabric), "none"))
    auto_settings.resolve(  # trainer.cohort / trainer.compile = auto: the saved values, or measured (cohort/auto.py)
        cfg, OmegaConf.load(saved) if saved and os.path.exists(saved) else None, fabric.device, fabric.world_size,
        bound, lambda k, mode: probe_seconds(cfg, fabric, data, k, mode),
        lambda s: s * clients * int(cfg.fl.local_steps or 0) * int(cfg.fl.rounds) or None)
    return loop_of(cfg, run_dir, fabric, data, module, strategy)


def _module(cfg: DictConfig, data, fabric):
    """The run's model on its device, its initial weights drawn from ``seed``."""
    with fabric.init_module():
        torch.manual_seed(int(cfg.seed))
        module = build_model(cfg.model, data.info)
    return module.to(fabric.device)


def loop_of(cfg: DictConfig, run_dir: str, fabric, data, module, strategy) -> FederatedLoop:
    """The loop over built parts (``trainer.cohort`` / ``trainer.compile`` resolved): its client store, checkpointer and
    recorder, and how the local step runs."""
    cohort = cfg.trainer.cohort
    check_cohort_memory(int(cohort), module, available_memory(fabric.device), strategy)
    rank, world = fabric.global_rank, fabric.world_size
    offload = cfg.store.offload_dir  # a str (the schema's type), even for a folder whose name reads as a number
    if offload and world > 1:
        offload = os.path.join(str(offload), f"rank{rank}")
    store = ClientStateStore(fabric.device, offload)
    checkpointer = Checkpointer(os.path.join(run_dir, "checkpoints"), config_hash=config_hash(cfg), rank=rank,
                                world_size=world, barrier=fabric.barrier, keep_last=cfg.checkpoint.keep_last,
                                background_bytes=cfg.checkpoint.background_mb << 20, compact=cfg.checkpoint.compact)
    name = lambda node: str(node.get("name") or node.get("_target_") or "?")  # noqa: E731 (the yaml's display name)
    info = {"model": name(cfg.model), "data": name(cfg.data), **dict(data.info.provenance or ())}
    recorder = RunRecorder(run_dir, primary=getattr(module, "primary_metric", ("test_acc", "max")), rank=rank,
                           log_fn=fabric.log_dict, info=info)
    config = LoopConfig(fl=OmegaConf.to_object(cfg.fl), checkpoint=OmegaConf.to_object(cfg.checkpoint), seed=int(cfg.seed),
                        capture=capture_of(cfg, fabric.device), **lr_keys(cfg))
    return FederatedLoop(fabric, module, data, strategy, config, run_dir, store=store,
                         checkpointer=checkpointer, recorder=recorder, cohort=int(cohort))


def probe_seconds(cfg: DictConfig, fabric, data, k: int, mode: str) -> float:
    """Seconds a client-step of this run at ``trainer.cohort=k trainer.compile=mode``: a throwaway copy of the run
    (its own module, strategy and store, in a temporary folder, the data shared) trains a warm-up cohort (a graph's
    capture), then one more is timed, :data:`~fl_lightning.cohort.auto.PROBE_STEPS` local steps each. The global
    generators are as they were after it (the run is the one given the chosen values explicitly)."""
    import copy
    import gc
    import tempfile

    steps = auto_settings.PROBE_STEPS
    probe = copy.deepcopy(cfg)
    with open_dict(probe):
        probe.trainer.cohort, probe.trainer.compile, probe.trainer.progress = int(k), str(mode), False
        probe.fl.local_steps, probe.fl.local_epochs, probe.fl.lr_schedule, probe.fl.warmup_rounds = steps, None, \
            "constant", 0
    cuda = fabric.device.type == "cuda"
    rng = torch.random.get_rng_state(), (torch.cuda.get_rng_state_all() if cuda else None)
    quiet, level = logging.getLogger("fl_lightning"), logging.getLogger("fl_lightning").level
    quiet.setLevel(logging.WARNING)
    loop = None
    try:
        with tempfile.TemporaryDirectory(prefix="fl_probe_") as tmp:
            torch.manual_seed(int(probe.seed))
            loop = loop_of(probe, tmp, fabric, data, _module(probe, data, fabric),
                           build_strategy(probe.method, checked=True))
            loop.setup()
            received = {key: m.tensor for key, m in loop.strategy.broadcast(0).items()}
            timed = 2 if k == 1 else k  # clients timed: one cohort, or two one at a time
            cids = [c % loop.n for c in range(k + timed)]
            for _ in loop.train_clients(cids[:k], 0, received, 1.0):  # warm-up: lazy set-up, a graph's capture
                pass
            if cuda:
                torch.cuda.synchronize(fabric.device)
            start = auto_settings.timer()
            for _ in loop.train_clients(cids[k:], 0, received, 1.0):
                pass
            if cuda:
                torch.cuda.synchronize(fabric.device)
            return (auto_settings.timer() - start) / (timed * steps)
    finally:
        quiet.setLevel(level)
        del loop
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.set_rng_state_all(rng[1])
        torch.random.set_rng_state(rng[0])


def capture_of(cfg: DictConfig, device: torch.device) -> Capture:
    """How the local step runs, from the resolved ``trainer.compile`` (:class:`~fl_lightning.step.capture.Capture`)."""
    mode, backend = str(cfg.trainer.compile), str(cfg.trainer.compile_backend)
    if mode == "graphs" and device.type != "cuda":
        raise ConfigError("trainer.compile", f"graphs replays the step as CUDA graphs, and this run is on {device.type}",
                          "use trainer.compile=step (or none) here, or run on a CUDA GPU")
    lr_varies = cfg.fl.lr_schedule != "constant" or int(cfg.fl.warmup_rounds) > 0
    return Capture(mode=mode, backend=backend, lr_tensors=mode == "step" and lr_varies,
                   dynamic_batch=mode == "step" and cfg.fl.local_epochs is not None,
                   method=str(OmegaConf.select(cfg, "method.name") or ""))


def lr_keys(cfg: DictConfig) -> dict[str, str | None]:
    """The keys a user types for the clients' learning rate (the local optimizer's ``lr``) and the server's (a
    server optimizer's ``lr``, else a part's ``server_lr``), following interpolations (``${method.server_lr}``)."""
    def typed(key: str) -> str:
        return interpolation_source(cfg, key) or key

    client = typed("optimizer.lr") if OmegaConf.select(cfg, "optimizer.lr") is not None else None
    server = None
    parts = cfg.method.get("parts") if OmegaConf.is_config(cfg.method) else None
    for name, node in (parts.items() if OmegaConf.is_config(parts) else ()):
        if not OmegaConf.is_dict(node):
            continue
        if node.get("server_opt") is not None:
            server = typed(f"method.parts.{name}.server_opt.lr")
        elif "server_lr" in node and server is None:
            server = typed(f"method.parts.{name}.server_lr")
    return {"client_lr_key": client, "server_lr_key": server}
