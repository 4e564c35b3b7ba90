"""The config schema: one dataclass per core group, each key with its type, range, default and one-line help.

This is the single truth of the keys every run has (``seed``, ``fl.*``, ``trainer.*``, ``checkpoint.*``,
``store.*`` and the run controls); ``conf/config.yaml`` starts from it (Hydra structured config ``fl_lightning``)
and keeps only its defaults list and Hydra's settings. Keys of ``_target_`` nodes (models, datasets, parts,
optimizers, codecs) are checked from their constructors (:func:`fl_lightning.config.instantiate`); the data keys
every dataset builder shares are here too (:class:`DataKeys`).

:func:`check` runs on the composed config before torch is imported: a key that is not in the schema (also one added
with ``+``), a value of the wrong type or out of range, and the rules that tie keys together, each one line naming
the full key and the fix (:class:`~fl_lightning.errors.ConfigError`). ``python -m fl_lightning.keys`` prints it.
This module imports neither torch nor Lightning.
"""
from __future__ import annotations

import dataclasses
import difflib
import re
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Optional

from omegaconf import DictConfig, OmegaConf

from .errors import ConfigError
# re-exported: fl_lightning/models/ still imports the range vocabulary from here (fl_lightning/ranges.py holds it)
from .ranges import Betas, Fraction, NonNegative, OneOf, Positive, Range  # noqa: F401


# Annotations name a field's type; these three are for what OmegaConf cannot type itself (it has no union of
# primitives): to OmegaConf they are str and Any, to :func:`check` they say what to accept.
Path = str  # a file or folder name
IntOrAuto = Any  # a whole number, or one of the field's ``words`` (auto)
Table = Any  # a mapping (key: value, ...)
_KINDS = {"int": "int", "float": "float", "bool": "bool", "str": "str", "Path": "path", "IntOrAuto": "int",
          "Table": "table"}


def key(default, help: str, low=None, high=None, words=(), choices=(), example: str = "",  # noqa: A002
        result: bool = True, open_low: bool = False):
    """A schema field; its annotation is its type (``Optional[...]``: null accepted). ``low``/``high`` inclusive
    bounds (``open_low``: the low one excluded); ``words`` accepted besides numbers (``auto``); ``choices`` the only accepted strings; ``result``: whether
    the key changes what a run computes (False: where output goes, how it is shown, saved, resumed or spread over
    processes; :func:`not_result_keys`)."""
    meta = dict(help=help, low=low, high=high, words=tuple(words), choices=tuple(choices),
                example=example or str(default), result=result, open_low=open_low)
    return field(default=default, metadata=meta)


def typed(cls):
    """Complete each field's metadata from its annotation (written as source text, ``from __future__ import
    annotations``): ``kind`` int | float | bool | str | path | table, and ``nullable`` for ``Optional[...]``."""
    for f in dataclasses.fields(cls):
        if f.metadata:
            ann = str(f.type)
            nullable = ann.startswith("Optional[")
            base = ann[len("Optional["):-1] if nullable else ann
            if base not in _KINDS:
                raise TypeError(f"schema field {cls.__name__}.{f.name}: annotation {ann!r} is none of {sorted(_KINDS)}")
            f.metadata = MappingProxyType({**f.metadata, "kind": _KINDS[base], "nullable": nullable})
    return cls


@typed
@dataclass
class FL:
    """The federation: clients, sampling, rounds and local work."""

    num_clients: IntOrAuto = key(16, "clients in the federation (auto: as many as the partition's natural groups)",
                           1, 10**7, words=("auto",))
    clients_per_round: int = key(8, "clients sampled each round, uniformly without replacement, seeded by "
                                    "(seed, round)", 1, 10**7)
    rounds: int = key(40, "communication rounds", 1, 10**9)
    local_steps: Optional[int] = key(10, "K local steps per round (null: train by fl.local_epochs)", 1, 10**6)
    local_epochs: Optional[int] = key(None, "E local epochs per round instead of K steps", 1, 10**6, example="1")
    eval_every: int = key(1, "evaluate the global model every N rounds (and after the last)", 1, 10**9, result=False)
    lr_schedule: str = key("constant", "learning-rate schedule over rounds", choices=("constant", "cosine"))
    lr_min_factor: float = key(0.0, "the cosine schedule's final lr as a fraction of the initial", 0.0, 1.0)
    warmup_rounds: int = key(0, "rounds of linear lr warm-up (fewer than fl.rounds)", 0, 10**9)


@typed
@dataclass
class Trainer:
    """Lightning Fabric: device, processes, precision."""

    accelerator: str = key("auto", "device kind", choices=("auto", "cpu", "gpu", "cuda", "mps", "tpu"))
    devices: IntOrAuto = key(1, "processes per node; clients are split across them, uploads all-reduced", 1, 4096,
                       words=("auto",), result=False)
    processes_per_device: int = key(1, "processes sharing each device (several clients in flight on one GPU; their "
                                       "collectives go through gloo)", 1, 64, result=False)
    num_nodes: int = key(1, "nodes", 1, 4096, result=False)
    strategy: str = key("auto", "Fabric strategy (ddp when trainer.devices > 1)", result=False)
    precision: str = key("32-true", "numeric precision",
                         choices=("32-true", "32", "64-true", "bf16-mixed", "bf16-true", "16-true", "16-mixed"))
    progress: bool = key(True, "a progress bar on the terminal", result=False)
    requeue: bool = key(True, "under Slurm, a SIGUSR1 stop (checkpoint after the round) requeues the job "
                              "(scontrol requeue; resume=auto continues it)", result=False)
    threads: IntOrAuto = key("auto", "torch CPU threads per process (auto: available CPUs / devices, or OMP_NUM_THREADS)", 1, 4096, words=("auto",), result=False)
    compile: str = key("none", "the local step through torch.compile, compiled once per run for every client "
                               "(step; graphs: replayed as CUDA graphs, CUDA only; none: eager)",
                       choices=("none", "step", "graphs"), result=False)
    compile_backend: str = key("inductor", "torch.compile's backend for trainer.compile (aot_eager: no code "
                                           "generation, to debug)", choices=("inductor", "aot_eager", "eager"),
                               result=False)
    timeout_s: int = key(300, "seconds a process waits for the others (start-up, each collective) before it stops "
                              "with one line naming the rank that is gone (torch's default: 1800)", 5, 86400, result=False)


@typed
@dataclass
class Checkpoint:
    """When and how checkpoints are written (never what a run computes)."""

    every: int = key(1, "rounds between checkpoints (one is always written at the end and on SIGINT/SIGTERM/"
                        "SIGUSR1)", 1, 10**9, result=False)
    keep_last: int = key(2, "checkpoints kept", 1, 10**6, result=False)
    background_mb: int = key(512, "write a checkpoint behind the next round when its changed client states are at "
                                  "most this many MB (0: before it; one process only)", 0, 10**9, result=False)
    compact: float = key(0.25, "rewrite the client states left in an older checkpoint file once at most this "
                               "fraction of its clients is still referred to (0: never)", 0.0, 1.0, result=False)


@typed
@dataclass
class Store:
    """Where client states live between rounds."""

    offload_dir: Optional[Path] = key(None, "put client states in safetensors files here instead of CPU memory", example="/scratch/clients", result=False)


@typed
@dataclass
class DataKeys:
    """Keys every dataset builder takes (checked here as well as by the builder)."""

    batch_size: int = key(32, "training minibatch size", 1, 10**7)
    eval_batch_size: int = key(1024, "evaluation batch size", 1, 10**8)
    on_device: bool = key(True, "keep the dataset's tensors on the device")
    val_fraction: float = key(0.0, "fraction of the training pool held out (seeded, before partitioning) as a "
                                   "validation set, logged as val_* at every evaluation (0: none)", 0.0, 0.9,
                              example="0.1")


@typed
@dataclass
class Root:
    """A run: the groups above, the config groups (method, model, data, optimizer, server_opt, logger) and the
    controls."""

    seed: int = key(0, "seed of everything (sampling, partitions, initialisation, minibatch order)", 0, 2**32 - 1)
    fl: FL = field(default_factory=FL)
    trainer: Trainer = field(default_factory=Trainer)
    checkpoint: Checkpoint = field(default_factory=Checkpoint)
    store: Store = field(default_factory=Store)
    resume: Optional[Path] = key(None, "a run directory: continue from its last checkpoint (auto: this run's own "
                                "directory if it holds one, else start fresh)", words=("auto",),
                                example="outputs/DATE/TIME", result=False)
    force_resume: bool = key(False, "resume even if the result-relevant config differs", result=False)
    overwrite: bool = key(False, "a new run into a directory holding another run's checkpoints replaces it", result=False)
    stop_after_rounds: Optional[int] = key(None, "run at most this many rounds now, checkpoint, exit", 1, 10**9, example="10", result=False)
    run_dir: Optional[Path] = key(None, "the run directory (Hydra's output directory)", result=False)
    tables: Optional[Table] = key(None, "lookup tables an experiment's interpolations read (e.g. glue_lora's per-method lrs)", example="{name: value}")
    objective: Optional[str] = key(None, "the metric whose final value train.py returns to a Hydra sweeper that "
                                   "searches (hydra/sweeper=optuna), e.g. val_acc (null: the primary metric)", example="val_acc", result=False)
    label: Optional[str] = key(None, "the run's name in reports (an experiment's arm, conf/arm/, sets it)", example="FedPAC-SOAP, beta 0.9", result=False)
    paper: Optional[Table] = key(None, "the paper's numbers and claims for an experiment's cells, shown by fl-report beside the "
                     "rows of the runs that carry it (source, metric, key: the run metric compared, unit: '%' | "
                     "fraction | null, cells: [{KEY: VALUE, value: X}], ordering, claims; fl_lightning/report/"
                     "paper.py)",
                     example="{source: 'seed 002, Table 2', key: test_acc, unit: '%', cells: []}", result=False)
    # config groups: their keys are their targets' arguments (checked by instantiate) and the method's own knobs
    method: Any = None
    model: Any = None
    data: Any = None
    optimizer: Any = None
    server_opt: Any = None
    logger: Any = None


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

    grad_clip: Optional[float] = key(None, "max-norm gradient clipping before each local step (null: none)", 0, None,
                                     example="1.0", open_low=True)



def register() -> None:
    """Register :class:`Root` as the structured config ``fl_lightning`` (``conf/config.yaml``'s first default), and
    the resolver ``${fl_not_result:EXTRA,...}`` that gives a sweep job's folder name the keys to leave out (those
    that do not change results, and the extra names)."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="fl_lightning", node=Root)
    OmegaConf.register_new_resolver("fl_not_result", lambda *extra: [*not_result_keys(), *extra], replace=True)


def not_result_keys() -> list[str]:
    """The schema keys that do not change what a run computes (``result=False``), by dotted name: the resume check's
    config hash leaves them out (``build.config_hash``), the report does not tell settings apart by them, and Hydra's
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


def problem(meta, v) -> str | None:
    """What is wrong with value ``v`` for a field with metadata ``meta`` (None: nothing)."""
    if v is None:
        return None if meta["nullable"] else "must be set (got null)"
    if isinstance(v, str) and v in meta["words"]:
        return None
    kind = meta["kind"]
    if kind == "table":
        return None if isinstance(v, dict) or OmegaConf.is_dict(v) else f"expected a table (key: value, ...), got {v!r}"
    if kind in ("str", "path") and isinstance(v, (int, float)) and not isinstance(v, bool):
        v = str(v)  # a name the command line parsed as a number (trainer.precision=32, a folder called 0)
    if kind == "bool":
        return None if isinstance(v, bool) else f"expected true or false, got {v!r}"
    if kind in ("str", "path"):
        if not isinstance(v, str):
            return f"expected a {'path' if kind == 'path' else 'string'}, got {v!r}"
        if meta["choices"] and v not in meta["choices"]:
            return f"unknown value {v!r}; valid: {', '.join(meta['choices'])}"
        return None
    ok = isinstance(v, int) and not isinstance(v, bool)
    if kind == "float":
        ok = ok or isinstance(v, float)
    if not ok:
        what = "a whole number" if kind == "int" else "a number"
        alt = f" or {' / '.join(meta['words'])}" if meta["words"] else ""
        return f"expected {what}{alt}, got {v!r}"
    low, high = meta["low"], meta["high"]
    open_low, open_high = meta.get("open_low", False), meta.get("open_high", False)
    if v != v or (low is not None and (v <= low if open_low else v < low)) or (
            high is not None and (v >= high if open_high else v > high)):
        return f"must be {bounds(meta)}, got {v!r}"
    return None


def bounds(meta) -> str:
    """``>= 0``, ``> 0``, ``in [1, 65536]``, ``in [0, 1)``: a field's range in words."""
    low, high = meta["low"], meta["high"]
    open_low, open_high = meta.get("open_low", False), meta.get("open_high", False)
    if high is None:
        return f"{'>' if open_low else '>='} {low}"
    if low is None:
        return f"{'<' if open_high else '<='} {high}"
    return f"in {'(' if open_low else '['}{low}, {high}{')' if open_high else ']'}"


def check_value(name: str, v) -> None:
    meta = all_keys()[name].metadata
    p = problem(meta, v)
    if p:
        raise ConfigError(name, p, f"set e.g. {name}={meta['example']}")


def _read(cfg: DictConfig, name: str):
    try:
        return OmegaConf.select(cfg, name, throw_on_missing=True, default="__absent__")
    except Exception as err:  # an interpolation that does not resolve, a missing value (???)
        meta = all_keys()[name].metadata
        raise ConfigError(name, f"cannot be read ({str(err).splitlines()[0]})", f"set {name}={meta['example']}") from None


def closest(name: str, candidates) -> str | None:
    """The candidate key nearest to ``name``: the same last part, else the closest spelling."""
    leaf = name.rsplit(".", 1)[-1]
    same = [c for c in candidates if c.rsplit(".", 1)[-1] == leaf and c.split(".")[0] == name.split(".")[0]]
    if same:
        return min(same, key=len)
    m = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.6)
    return m[0] if m else None


# words a user may spell out where the configs abbreviate (method.learning_rate -> method.lr)
_SPELLED = (("learning_rate", "lr"), ("learningrate", "lr"), ("step_size", "lr"), ("epsilon", "eps"),
            ("wd", "weight_decay"))


def closest_key(cfg: DictConfig, name: str, exclude=()) -> str | None:
    """The key of ``cfg`` nearest to ``name`` (for 'no such key' messages): one with the same last part under the
    same top-level node (``model.hidden`` -> ``model.net.hidden``), else the closest sibling spelling (also with a
    spelled-out word abbreviated: ``method.learning_rate`` -> ``method.lr``), else the closest spelling of a value's
    key anywhere under the same top-level node (``method.rul`` -> ``method.parts.aggregation.rule``). ``exclude``:
    keys not to suggest (``name`` itself is never suggested)."""
    parent, _, leaf = name.rpartition(".")
    skip = {name, *exclude}
    tree = OmegaConf.to_container(cfg, resolve=False)
    flat = [k for k in _flat_keys(tree) if k not in skip]
    top = name.split(".")[0]
    leaves = [k for k in _flat_keys(tree, leaves_only=True) if k not in skip and k.split(".")[0] == top]
    for word in [leaf] + [re.sub(rf"(?<![^_]){a}(?![^_])", b, leaf) for a, b in _SPELLED
                          if re.search(rf"(?<![^_]){a}(?![^_])", leaf)]:
        same_leaf = [k for k in flat if k.split(".")[0] == top and k.rsplit(".", 1)[-1] == word]
        if same_leaf:
            return min(same_leaf, key=len)
        siblings = [k[len(parent) + 1:] if parent else k for k in flat if k.rpartition(".")[0] == parent]
        match = difflib.get_close_matches(word, siblings, n=1)
        if match:
            return f"{parent + '.' if parent else ''}{match[0]}"
    if parent:  # a key deeper in the same node (a part's argument no method key sets)
        by_leaf: dict[str, list[str]] = {}
        for k in leaves:
            by_leaf.setdefault(k.rsplit(".", 1)[-1], []).append(k)
        match = difflib.get_close_matches(leaf, list(by_leaf), n=1, cutoff=0.75)
        if match:
            return min(by_leaf[match[0]], key=len)
    return None


def _flat_keys(node, prefix: str = "", leaves_only: bool = False) -> list[str]:
    out = []
    if isinstance(node, dict):
        for k, v in node.items():
            if not (leaves_only and isinstance(v, dict)) and not str(k).startswith("_"):
                out.append(prefix + str(k))
            out.extend(_flat_keys(v, f"{prefix}{k}.", leaves_only))
    return out


def unknown_key(name: str) -> ConfigError:
    near = closest(name, all_keys())
    fix = f"did you mean {near}? (python -m fl_lightning.keys lists every key)" if near else \
        "remove it (python -m fl_lightning.keys lists every key)"
    return ConfigError(name, "no such key", fix)


def check(cfg: DictConfig, overrides: list[str] | None = None) -> None:
    """The composed config against the schema: unknown keys in the schema's groups (also ``+`` keys), each key's type
    and range, then the rules between keys; with the command line's ``overrides``, a ``method.X`` override that
    nothing in the method reads. Torch-free; raises the first :class:`ConfigError`."""
    declared = fields_of(Root)
    for top in cfg.keys():
        if top not in declared and top not in GROUPS and top not in (*CONFIG_GROUPS, "hydra"):
            raise unknown_key(str(top))
    for g, cls in GROUPS.items():
        node = cfg.get(g)
        if node is None:
            continue
        names = fields_of(cls)
        for k in node.keys():
            if k not in names:
                raise unknown_key(f"{g}.{k}")
    for name in all_keys():
        v = _read(cfg, name)
        if v == "__absent__":
            continue
        check_value(name, v)
    rules(cfg)
    if overrides and cfg.get("method") is not None:
        unread = unread_method_keys(cfg)
        for ov in overrides:
            name = ov.split("=", 1)[0].lstrip("+~")
            parts = name.split(".")
            if len(parts) == 2 and parts[0] == "method" and parts[1] in unread:
                near = closest_key(cfg, name, exclude={f"method.{k}" for k in unread})
                fix = f"did you mean {near}?" if near else "remove it"
                raise ConfigError(name, f"nothing in method {cfg.method.get('name')!r} reads it", fix)


METHOD_STRUCTURE = ("name", "parts", "comm", "grad_clip")  # read by the builder, not through interpolations


def unread_method_keys(cfg: DictConfig) -> set[str]:
    """The method's top-level keys that no ``${method.X}`` (or ``oc.select:method.X``) in the config refers to: knobs
    of a part the method does not have, or keys a user added that nothing uses."""
    refs: set[str] = set()

    def walk(node):
        if isinstance(node, dict):
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)
        elif isinstance(node, str) and "method." in node:
            refs.update(re.findall(r"method\.([A-Za-z_][A-Za-z0-9_]*)", node))

    walk(OmegaConf.to_container(cfg, resolve=False))
    return {str(k) for k in cfg.method.keys() if k not in refs and k not in METHOD_STRUCTURE}


def check_resume(path) -> None:
    """``resume=DIR``: the run directory must exist (checked before Hydra creates it, and on the composed config)."""
    import os

    if path not in (None, "", "null", "auto") and not os.path.isdir(str(path)):
        raise ConfigError("resume", f"no run directory {str(path)!r}",
                          "pass the run directory printed by the stopped run (it holds checkpoints/)")


def rules(cfg: DictConfig) -> None:
    """Cross-key rules, in one place."""
    check_resume(cfg.get("resume"))
    fl = cfg.fl
    auto = str(fl.num_clients) == "auto"
    if not auto and int(fl.clients_per_round) > int(fl.num_clients):
        raise ConfigError("fl.clients_per_round",
                          f"{fl.clients_per_round} clients per round but only fl.num_clients={fl.num_clients} clients exist",
                          f"set fl.clients_per_round <= {fl.num_clients} or raise fl.num_clients")
    steps, epochs = fl.get("local_steps"), fl.get("local_epochs")
    if bool(steps) == bool(epochs):
        raise ConfigError("fl.local_steps", f"set exactly one of fl.local_steps / fl.local_epochs (got {steps} / {epochs})",
                          "e.g. fl.local_steps=5 fl.local_epochs=null")
    if fl.get("warmup_rounds", 0) and int(fl.warmup_rounds) >= int(fl.rounds):
        raise ConfigError("fl.warmup_rounds", f"{fl.warmup_rounds} warm-up rounds in a run of fl.rounds={fl.rounds}",
                          "set fl.warmup_rounds below fl.rounds")
    if str(cfg.trainer.precision) == "16-mixed":
        raise ConfigError("trainer.precision", "fp16 mixed precision needs a grad scaler that per-client optimizers do "
                          "not share", "use bf16-mixed")
    objective = cfg.get("objective")
    if objective is not None and str(objective).startswith("val_") and not OmegaConf.select(
            cfg, "data.val_fraction", default=0):
        raise ConfigError("objective", f"{objective} is logged only with a validation split (data.val_fraction is 0)",
                          "set data.val_fraction=0.1, or objective=null (the primary test metric)")
    for name in ("method.name", "model.name", "data.name", "data.partition.name"):  # labels in outputs and logs
        if OmegaConf.select(cfg, name, default="") is None:
            raise ConfigError(name, "must be a label, got null", f"set {name} to a name (it labels summary.json and the logs)")
    _check_flags(cfg, "")


def _check_flags(node, prefix: str) -> None:
    """Hydra's own ``_partial_`` / ``_recursive_`` flags are booleans (Hydra raises a bare TypeError otherwise)."""
    if OmegaConf.is_dict(node):
        for k in node.keys():
            name = f"{prefix}{k}"
            if k in ("_partial_", "_recursive_"):
                v = OmegaConf.to_container(node, resolve=False)[k]
                if not isinstance(v, bool):
                    raise ConfigError(name, f"expected true or false, got {v!r}",
                                      f"set {name}=true (or leave the config's value)")
            elif not OmegaConf.is_interpolation(node, k):  # an interpolated node (${optimizer}): checked at its source
                _check_flags(node.get(k) if not OmegaConf.is_missing(node, k) else None, name + ".")


# ---------------------------------------------------------------------------------------------- before Hydra
def check_overrides(argv: list[str]) -> None:
    """The command line's overrides of schema keys, before Hydra composes anything (and before torch is imported):
    an unknown key (also with ``+``), a value of the wrong type or out of range is one :class:`ConfigError`. Sweeps
    (``fl.rounds=10,20``, ``choice(...)``, ``range(...)``) are checked value by value; interpolations are left to
    :func:`check` on the composed config."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    overrides = OverridesParser.create().parse_overrides([a for a in argv if "=" in a or a.startswith("~")])
    known = all_keys()
    for ov in overrides:
        name = ov.key_or_group
        top = name.split(".")[0]
        if ov.package is not None or "/" in name or top in ("hydra", "tables", "paper", *CONFIG_GROUPS) and name not in known:
            continue  # config groups, their targets' arguments (checked when built), table entries, Hydra's keys
        if name not in known:
            raise unknown_key(name)
        if ov.is_delete():
            raise ConfigError(name, "a schema key cannot be deleted",
                              f"set it instead, e.g. {name}={known[name].metadata['example']}")
        values = list(ov.sweep_iterator()) if ov.is_sweep_override() else [ov.value()]
        for v in values:
            if isinstance(v, str) and "${" in v:
                continue
            check_value(name, v)
