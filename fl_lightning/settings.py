"""Typed settings: the loop, data, trainer and checkpoint keys every run has, each with its type and range, checked
before anything is built, so ``fl.rounds=abc``, ``fl.rounds=2.5``, ``data.eval_batch_size=-1`` or ``seed=null`` are
one line naming the key (exit 2) instead of a traceback or a silently truncated value. Keys that belong to a part,
a model or a dataset builder are checked by their constructors (``ConfigError``), which ``instantiate`` names fully.
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass

from omegaconf import DictConfig, OmegaConf

from .errors import ConfigError


@dataclass(frozen=True)
class Setting:
    kind: str                    # "int" | "float" | "bool"
    low: float | None = None     # inclusive lower bound
    high: float | None = None    # inclusive upper bound
    nullable: bool = False
    words: tuple[str, ...] = ()  # accepted words besides numbers (e.g. "auto")
    example: str = ""


SETTINGS: dict[str, Setting] = {
    "seed": Setting("int", 0, 2**32 - 1, example="0"),
    "fl.num_clients": Setting("int", 1, 10**7, words=("auto",), example="16"),
    "fl.clients_per_round": Setting("int", 1, 10**7, example="8"),
    "fl.rounds": Setting("int", 1, 10**9, example="40"),
    "fl.local_steps": Setting("int", 1, 10**9, nullable=True, example="10"),
    "fl.local_epochs": Setting("int", 1, 10**6, nullable=True, example="1"),
    "fl.eval_every": Setting("int", 1, 10**9, example="1"),
    "fl.lr_min_factor": Setting("float", 0.0, 1.0, example="0.0"),
    "fl.warmup_rounds": Setting("int", 0, 10**9, example="0"),
    "trainer.devices": Setting("int", 1, 4096, words=("auto",), example="1"),
    "trainer.num_nodes": Setting("int", 1, 4096, example="1"),
    "trainer.progress": Setting("bool", example="true"),
    "trainer.threads": Setting("int", 1, 4096, words=("auto",), example="auto"),
    "checkpoint.every": Setting("int", 1, 10**9, example="1"),
    "checkpoint.keep_last": Setting("int", 1, 10**6, example="2"),
    "checkpoint.background_mb": Setting("int", 0, 10**9, example="512"),
    "checkpoint.compact": Setting("float", 0.0, 1.0, example="0.25"),
    "data.batch_size": Setting("int", 1, 10**7, example="32"),
    "data.eval_batch_size": Setting("int", 1, 10**8, example="1024"),
    "data.on_device": Setting("bool", example="true"),
    "stop_after_rounds": Setting("int", 1, 10**9, nullable=True, example="10"),
    "method.grad_clip": Setting("float", 0.0, None, nullable=True, example="1.0"),
    "force_resume": Setting("bool", example="false"),
    "overwrite": Setting("bool", example="false"),
}


def _problem(s: Setting, v) -> str | None:
    if v is None:
        return None if s.nullable else "must be set (got null)"
    if isinstance(v, str) and v in s.words:
        return None
    if s.kind == "bool":
        return None if isinstance(v, bool) else f"expected true or false, got {v!r}"
    ok = isinstance(v, int) and not isinstance(v, bool)
    if s.kind == "float":
        ok = ok or isinstance(v, float)
    if not ok:
        what = "a whole number" if s.kind == "int" else "a number"
        alt = f" or {' / '.join(s.words)}" if s.words else ""
        return f"expected {what}{alt}, got {v!r}"
    if v != v or (s.low is not None and v < s.low) or (s.high is not None and v > s.high):
        bounds = f">= {s.low}" if s.high is None else f"in [{s.low}, {s.high}]"
        return f"must be {bounds}, got {v!r}"
    return None


def setting(cfg: DictConfig, key: str, default=None):
    """The value of one :data:`SETTINGS` key, checked (a one-line :class:`ConfigError` naming it otherwise);
    ``default`` when the key is absent or null-and-allowed."""
    s = SETTINGS[key]
    try:
        v = OmegaConf.select(cfg, key, throw_on_missing=True, default="__absent__")
    except Exception as err:  # an interpolation that does not resolve, a missing value (???)
        raise ConfigError(key, f"cannot be read ({str(err).splitlines()[0]})", f"set {key}={s.example}") from None
    if v == "__absent__":
        return default
    problem = _problem(s, v)
    if problem:
        raise ConfigError(key, problem, f"set e.g. {key}={s.example}")
    return default if v is None else v


def check_settings(cfg: DictConfig) -> None:
    """Every key of :data:`SETTINGS` present in ``cfg``: type and range, one :class:`ConfigError` for the first
    bad one; plus the relations between them (warm-up shorter than the run)."""
    for key in SETTINGS:
        setting(cfg, key)
    fl = cfg.get("fl", {})
    if fl.get("warmup_rounds", 0) and fl.get("rounds") and int(fl.warmup_rounds) >= int(fl.rounds):
        raise ConfigError("fl.warmup_rounds", f"{fl.warmup_rounds} warm-up rounds in a run of fl.rounds={fl.rounds}",
                          "set fl.warmup_rounds below fl.rounds")


def closest_key(cfg: DictConfig, key: str) -> str | None:
    """The existing dotted key nearest to ``key`` (for 'unknown key' messages): a key with the same last part under
    the same top-level node (``model.hidden`` -> ``model.net.hidden``), else the closest sibling name."""
    parent, _, leaf = key.rpartition(".")
    top = key.split(".")[0]
    flat = _keys(OmegaConf.to_container(cfg, resolve=False))
    same_leaf = [k for k in flat if k.split(".")[0] == top and k.rsplit(".", 1)[-1] == leaf]
    if same_leaf:
        return min(same_leaf, key=len)
    siblings = [k[len(parent) + 1:] if parent else k for k in flat
                if (k.rpartition(".")[0] == parent)]
    match = difflib.get_close_matches(leaf, siblings, n=1)
    return f"{parent + '.' if parent else ''}{match[0]}" if match else None


def _keys(node, prefix: str = "") -> list[str]:
    out = []
    if isinstance(node, dict):
        for k, v in node.items():
            out.append(prefix + str(k))
            out.extend(_keys(v, f"{prefix}{k}."))
    return out
