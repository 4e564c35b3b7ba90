"""The config schema: one dataclass per core group, each key with its type, range, default and one-line help.

This is the single truth of the keys every run has (``seed``, ``fl.*``, ``trainer.*``, ``checkpoint.*``,
``store.*`` and the run controls); ``conf/config.yaml`` starts from it (Hydra structured config ``fl_lightning``)
and keeps only its defaults list and Hydra's settings. Keys of ``_target_`` nodes (models, datasets, parts,
optimizers, codecs) are checked from their constructors (:func:`fl_lightning.config.compose.instantiate`); the data keys
every dataset builder shares are here too (:class:`DataKeys`).

:func:`fl_lightning.config.checks.check` checks the composed config against it before torch is imported (a key that
is not here, a value of the wrong type or out of range, the rules that tie keys together), each refusal one line
naming the full key and the fix. ``python -m fl_lightning.config.keys`` prints it. This module imports neither torch nor
Lightning.
"""
from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Annotated, Any, Optional

from omegaconf import OmegaConf

from .budget import StepBudget
from .ranges import IntOrWord, OneOf, Path, Range, Table, hint_meta



# A field's annotation is its type and range, in the vocabulary constructor arguments use (:mod:`.ranges`):
# ``Annotated[int, Range(1, 10**9)]``, ``Annotated[str, OneOf(...)]``; ``Optional[...]``: null accepted. OmegaConf
# reads the plain type (get_type_hints drops the markers); Path, Table and IntOrWord are what it cannot type itself
# (it has no union of primitives): to OmegaConf str and Any, to the checks a path, a mapping, a number or a word.


def key(default, help: str, example: str = "", result: bool = True, setting: bool | None = None,  # noqa: A002
        hashed=None):
    """A schema field; its annotation is its type and range (:func:`typed`). ``example``: the value a fix suggests
    (the default's text unless given); ``result``: whether the key changes what a run computes (False: where output
    goes, how it is shown, saved, resumed or spread over processes; :func:`not_result_keys`). Its effect on the run's
    config hash (the resume check) and on the report's setting key, declared here:

    - ``hashed(value, view) -> bool``: for a result key, whether it enters the hash given its value and the rest of
      the result view (a dict of the config): a key added after checkpoints existed leaves the hash alone at the value
      that reproduces the runs before it, and a key that matters only through another stays out when that one makes
      it moot (``fl.rounds`` under a constant schedule). Default: always.
    - ``setting``: whether the report tells two settings apart by it (default: ``result``); False for a result key
      that only evaluation or storage reads (``data.eval_batch_size``): :func:`not_setting_keys`."""
    meta = dict(help=help, example=example or str(default), result=result,
                setting=result if setting is None else setting, hashed=hashed)
    return field(default=default, metadata=meta)


def typed(cls):
    """Complete each field's metadata from its annotation, read by :func:`~fl_lightning.config.ranges.hint_meta` as a
    constructor argument's is: ``kind`` int | float | bool | str | path | table, ``nullable`` for ``Optional[...]``,
    the range (``low``, ``high``, ``open_low``, ``open_high``, ``words``) and ``choices``."""
    hints = typing.get_type_hints(cls, include_extras=True)
    for f in dataclasses.fields(cls):
        if f.metadata:
            m = hint_meta(hints[f.name], f.default, f.default is not dataclasses.MISSING)
            if m is None or m["kind"] == "list":
                raise TypeError(f"schema field {cls.__name__}.{f.name}: annotation {hints[f.name]!r} is none of int, "
                                "float, bool, str, Path, Table, IntOrWord (Optional, Annotated with a Range/OneOf)")
            f.metadata = MappingProxyType({**{k: v for k, v in m.items() if k != "example"}, **f.metadata})
    return cls


@typed
@dataclass
class FL:
    """The federation: clients, sampling, rounds and local work."""

    num_clients: Annotated[IntOrWord, Range(1, 10**7, words=("auto",))] = key(
        16, "clients in the federation (auto: as many as the partition's natural groups)")
    clients_per_round: Annotated[int, Range(1, 10**7)] = key(
        8, "clients sampled each round, uniformly without replacement, seeded by (seed, round) (fl.sampling=poisson: "
        "in expectation)")
    sampling: Annotated[str, OneOf("fixed", "poisson")] = key(
        "fixed", "how a round's clients are drawn: fixed (fl.clients_per_round of them, uniformly without replacement) | "
        "poisson (each client joins with q = clients_per_round/num_clients: the round's size varies, may be 0; the "
        "sampling DP accounts as add/remove, docs/usage.md)", example="poisson", hashed=lambda v, view: v != "fixed")
    rounds: Annotated[int, Range(1, 10**9)] = key(40, "communication rounds",
                                                  hashed=lambda v, view: view["fl"].get("lr_schedule", "constant") != "constant")
    local_steps: Annotated[Optional[int], Range(1, 10**6)] = key(
        10, "K local steps per round (null: train by fl.local_epochs)")
    local_epochs: Annotated[Optional[int], Range(1, 10**6)] = key(
        None, "E local epochs per round instead of K steps", example="1")
    eval_every: Annotated[int, Range(1, 10**9)] = key(
        1, "evaluate the global model every N rounds (and after the last)", result=False)
    lr_schedule: Annotated[str, OneOf("constant", "cosine")] = key("constant", "learning-rate schedule over rounds")
    lr_min_factor: Annotated[float, Range(0.0, 1.0)] = key(
        0.0, "the cosine schedule's final lr as a fraction of the initial")
    warmup_rounds: Annotated[int, Range(0, 10**9)] = key(0, "rounds of linear lr warm-up (fewer than fl.rounds)")

    @property
    def budget(self) -> StepBudget:
        """The clients' local work as one value (``local_steps`` or ``local_epochs``, resolved per client)."""
        return StepBudget(self.local_steps, self.local_epochs)


@typed
@dataclass
class Trainer:
    """Lightning Fabric: device, processes, precision."""

    accelerator: Annotated[str, OneOf("auto", "cpu", "gpu", "cuda", "mps", "tpu")] = key("auto", "device kind")
    devices: Annotated[IntOrWord, Range(1, 4096, words=("auto",))] = key(
        1, "processes per node; clients are split across them, uploads all-reduced", result=False)
    processes_per_device: Annotated[int, Range(1, 64)] = key(
        1, "processes sharing each device (several clients in flight on one GPU; their collectives go through gloo)",
        result=False)
    num_nodes: Annotated[int, Range(1, 4096)] = key(1, "nodes", result=False)
    strategy: str = key("auto", "Fabric strategy (ddp when trainer.devices > 1)", result=False)
    precision: Annotated[str, OneOf("32-true", "32", "64-true", "bf16-mixed", "bf16-true", "16-true",
                                    "16-mixed")] = key("32-true", "numeric precision")
    progress: bool = key(True, "a progress bar on the terminal", result=False)
    requeue: bool = key(
        True, "under Slurm, a SIGUSR1 stop (checkpoint after the round) requeues the job (scontrol requeue; "
        "resume=auto continues it)", result=False)
    threads: Annotated[IntOrWord, Range(1, 4096, words=("auto",))] = key(
        "auto", "torch CPU threads per process (auto: available CPUs / devices, or OMP_NUM_THREADS)", result=False)
    cohort: Annotated[IntOrWord, Range(1, 1 << 16, words=("auto",))] = key(
        "auto", "clients trained at a time in one batched step (fl_lightning/cohort/: K clients' parameters stacked, "
        "one forward and backward through torch.func.vmap; a GPU path: 1, the sequential loop, is as fast on a CPU; "
        "auto: 1 off CUDA; on CUDA the fastest of 1, 2, 4, ... up to what fits 80% of its free memory, timed at the "
        "start with trainer.compile (fl_lightning/cohort/auto.py) and kept in the saved config)",
        example="8", result=False)
    compile: Annotated[str, OneOf("auto", "none", "step", "graphs")] = key(
        "auto", "the local step through torch.compile, compiled once per run for every client (step; graphs: the "
        "eager step captured once as a CUDA graph and replayed, no compiler, CUDA only; none: eager; auto: none off "
        "CUDA, on CUDA none or graphs, whichever a start-up probe times faster with trainer.cohort)", result=False)
    compile_backend: Annotated[str, OneOf("inductor", "aot_eager", "eager")] = key(
        "inductor", "torch.compile's backend for trainer.compile (aot_eager: no code generation, to debug)",
        result=False)
    timeout_s: Annotated[int, Range(5, 86400)] = key(
        300, "seconds a process waits for the others (start-up, each collective) before it stops with one line naming "
        "the rank that is gone (torch's default: 1800)", result=False)


@typed
@dataclass
class Checkpoint:
    """When and how checkpoints are written (never what a run computes)."""

    every: Annotated[int, Range(1, 10**9)] = key(
        1, "rounds between checkpoints (one is always written at the end and on SIGINT/SIGTERM/SIGUSR1)", result=False)
    keep_last: Annotated[int, Range(1, 10**6)] = key(2, "checkpoints kept", result=False)
    background_mb: Annotated[int, Range(0, 10**9)] = key(
        512, "write a checkpoint behind the next round when its changed client states are at most this many MB (0: "
        "before it; one process only)", result=False)
    compact: Annotated[float, Range(0.0, 1.0)] = key(
        0.25, "rewrite the client states left in an older checkpoint file once at most this fraction of its clients is "
        "still referred to (0: never)", result=False)


@typed
@dataclass
class Store:
    """Where client states live between rounds."""

    offload_dir: Optional[Path] = key(
        None, "put client states in safetensors files here instead of CPU memory",
        example="/scratch/clients", result=False)


@typed
@dataclass
class DataKeys:
    """Keys every dataset takes, read by the data layer (fl_lightning/data/__init__.py), not by its builder: the
    ``data`` node starts from these defaults (:func:`data_defaults`) and a dataset's yaml overrides them."""

    batch_size: Annotated[int, Range(1, 10**7)] = key(32, "training minibatch size")
    eval_batch_size: Annotated[int, Range(1, 10**8)] = key(1024, "evaluation batch size", setting=False)
    on_device: bool = key(True, "keep the dataset's tensors on the device", setting=False)
    val_fraction: Annotated[float, Range(0.0, 0.9)] = key(
        0.0, "fraction of the training pool held out (seeded, before partitioning) as a validation set, logged as "
        "val_* at every evaluation (0: none)", example="0.1", hashed=lambda v, view: bool(v))


def data_defaults() -> dict:
    """``{key: default}`` of :class:`DataKeys`: the ``data`` node every dataset's yaml merges onto."""
    return {f.name: f.default for f in dataclasses.fields(DataKeys)}


# the ``data`` keys the data layer reads (the federated view), not passed to the dataset's builder
FEDERATION_KEYS = ("name", *data_defaults(), "partition")


@typed
@dataclass
class Root:
    """A run: the groups above, the config groups (method, model, data, optimizer, server_opt, logger) and the
    controls."""

    seed: Annotated[int, Range(0, 2**32 - 1)] = key(
        0, "seed of everything (sampling, partitions, initialisation, minibatch order)")
    fl: FL = field(default_factory=FL)
    trainer: Trainer = field(default_factory=Trainer)
    checkpoint: Checkpoint = field(default_factory=Checkpoint)
    store: Store = field(default_factory=Store)
    resume: Annotated[Optional[Path], Range(words=("auto",))] = key(
        None, "a run directory: continue from its last checkpoint (auto: this run's own directory if it holds one, "
        "else start fresh)", example="outputs/DATE/TIME", result=False)
    force_resume: bool = key(False, "resume even if the result-relevant config differs", result=False)
    download: bool = key(
        False, "fetch what the run needs and is missing (torchvision sets, hub datasets and weights) with the "
        "libraries' own downloaders into their caches, once per node; false: offline (HF_HUB_OFFLINE, "
        "local_files_only), a missing item is one line naming it", example="true", result=False)
    overwrite: bool = key(
        False, "a new run into a directory holding another run's checkpoints replaces it", result=False)
    stop_after_rounds: Annotated[Optional[int], Range(1, 10**9)] = key(
        None, "run at most this many rounds now, checkpoint, exit", example="10", result=False)
    run_dir: Optional[Path] = key(None, "the run directory (Hydra's output directory)", result=False)
    tables: Optional[Table] = key(
        None, "lookup tables an experiment's interpolations read (e.g. glue_lora's per-method lrs)",
        example="{name: value}")
    objective: Optional[str] = key(
        None, "the metric whose final value train.py returns to a Hydra sweeper that searches (hydra/sweeper=optuna), "
        "e.g. val_acc (null: the primary metric)", example="val_acc", result=False)
    label: Optional[str] = key(
        None, "the run's name in reports (an experiment's arm, conf/arm/, sets it)",
        example="FedPAC-SOAP, beta 0.9", result=False)
    paper: Optional[Table] = key(
        None, "the paper's numbers and claims for an experiment's cells, shown by fl-report beside the rows of the "
        "runs that carry it (source, metric, key: the run metric compared, unit: '%' | fraction | null, setting: "
        "{CONFIG.KEY: VALUE} the table fixes, cells: [{KEY: VALUE, value: X}], ordering, claims; "
        "fl_lightning/report/paper.py)",
        example="{source: 'seed 002, Table 2', key: test_acc, unit: '%', cells: []}", result=False)
    # config groups: their keys are their targets' arguments (checked by instantiate) and the method's own knobs
    method: Any = None
    model: Any = None
    data: Any = field(default_factory=data_defaults)  # a dataset's yaml merges onto DataKeys' defaults
    optimizer: Any = None
    server_opt: Any = None
    logger: Any = None
    dp: Any = None  # user-level differential privacy (conf/dp/: none | central | central_adaptive; fl_lightning/dp/)


GROUPS = {"fl": FL, "trainer": Trainer, "checkpoint": Checkpoint, "store": Store}
# the config groups (conf/<group>/): those whose node stays in the composed config, built from _target_s (Root's
# fields above), and those merged into it (an experiment, an arm), null by default; data/partition is data's subgroup
TARGET_GROUPS = tuple(f.name for f in dataclasses.fields(Root) if not f.metadata and f.name not in GROUPS)
OPTIONAL_GROUPS = ("experiment", "arm")
CONFIG_GROUPS = (*TARGET_GROUPS, *OPTIONAL_GROUPS)


@typed
@dataclass
class MethodKeys:
    """The method's keys that are not a part's or optimizer's argument."""

    grad_clip: Annotated[Optional[float], Range(0, open_low=True)] = key(
        None, "max-norm gradient clipping before each local step (null: none)", example="1.0")



def register() -> None:
    """Register :class:`Root` as the structured config ``fl_lightning`` (``conf/config.yaml``'s first default), and
    the resolver ``${fl_not_result:EXTRA,...}`` that gives a sweep job's folder name the keys to leave out (those
    that do not change results, and the extra names)."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="fl_lightning", node=Root)
    OmegaConf.register_new_resolver("fl_not_result", lambda *extra: [*not_result_keys(), *extra], replace=True)


def not_setting_keys() -> list[str]:
    """The schema keys the report does not tell settings apart by (``setting=False``; every key with
    ``result=False``, and result keys only evaluation or storage reads)."""
    return [name for name, f in all_keys().items() if not f.metadata["setting"]]


# dataset arguments (not schema keys) whose place in the hash depends on a value: ``data.fake=false`` is the real
# files, hashed as before the argument existed; ``data.source`` tsv (GLUE) / files (C4) is the reader every run
# before the argument used (fl_lightning/data/hub.py: LEGACY_SOURCE)
ARGUMENT_HASH_RULES = {"data.fake": lambda v, view: v is not False,
                       "data.source": lambda v, view: v not in ("tsv", "files"),
                       "dp.max_epsilon": lambda v, view: False}  # where the run stops, not what it computes


def hash_rules() -> dict[str, object]:
    """``{dotted key: hashed(value, view)}`` of the result keys whose place in the config hash depends on a value
    (the schema keys' ``hashed=``, then :data:`ARGUMENT_HASH_RULES`)."""
    rules = {name: f.metadata["hashed"] for name, f in all_keys().items() if f.metadata["hashed"] is not None}
    return {**rules, **ARGUMENT_HASH_RULES}


def not_result_keys() -> list[str]:
    """The schema keys that do not change what a run computes (``result=False``), by dotted name: the resume check's
    config hash leaves them out (:func:`.hashing.config_hash`), the report does not tell settings apart by them, and Hydra's
    job folder names leave them out (``conf/config.yaml``: ``${fl_not_result:}``)."""
    return [name for name, f in all_keys().items() if not f.metadata["result"]]


def fields_of(cls) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls) if f.metadata}


def all_keys() -> dict[str, dataclasses.Field]:
    """Every schema key by its dotted name."""
    out = {n: f for n, f in fields_of(Root).items()}
    for g, cls in GROUPS.items():
        out.update({f"{g}.{n}": f for n, f in fields_of(cls).items()})
    out.update({f"data.{n}": f for n, f in fields_of(DataKeys).items()})
    out.update({f"method.{n}": f for n, f in fields_of(MethodKeys).items()})
    return out
