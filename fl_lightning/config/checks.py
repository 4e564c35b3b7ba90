"""Checking a config against the schema (:mod:`fl_lightning.config.schema`): :func:`check` on the composed config and
:func:`check_overrides` on the command line, both before torch is imported; :func:`problem` says what is wrong with
one value for a field's metadata (the schema's fields and, through :mod:`fl_lightning.config.args`, constructor
arguments). Every refusal is one :class:`~fl_lightning.errors.ConfigError` line naming the full key and the fix."""
from __future__ import annotations

import difflib
import os
import re
from collections.abc import Mapping

from omegaconf import DictConfig, OmegaConf

from ..errors import ConfigError
from .schema import CONFIG_GROUPS, GROUPS, Root, all_keys, fields_of


def problem(meta, v) -> str | None:
    """What is wrong with value ``v`` for a field with metadata ``meta`` (None: nothing)."""
    if v is None:
        return None if meta["nullable"] else "must be set (got null)"
    if isinstance(v, str) and v in meta["words"]:
        return None
    kind = meta["kind"]
    if kind == "table":
        return None if isinstance(v, Mapping) else f"expected a table (key: value, ...), got {v!r}"
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


# a key whose valid values another key bounds: its example stays within that key's value (fl.clients_per_round=8
# is no example where fl.num_clients=6)
_BOUNDED_BY = {"fl.clients_per_round": "fl.num_clients"}


def value_text(v) -> str:
    """A value as the command line writes it (``true``, ``[32,64]``, ``null``)."""
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(value_text(x) for x in v) + "]"
    return "null" if v is None else str(v)


def example(name: str, others=None):
    """The example value a fix names for schema key ``name``; ``others``: the run's other values (``{key: value}``),
    where a key's example must fit them (:data:`_BOUNDED_BY`)."""
    ex = all_keys()[name].metadata["example"]
    bound = (others or {}).get(_BOUNDED_BY.get(name, ""))
    if isinstance(bound, int) and not isinstance(bound, bool) and str(ex).isdigit() and bound >= 1:
        ex = min(int(ex), bound)
    return ex


def check_value(name: str, v, others=None) -> None:
    meta = all_keys()[name].metadata
    p = problem(meta, v)
    if p:
        raise ConfigError(name, p, f"set e.g. {name}={value_text(example(name, others))}")


def _read(cfg: DictConfig, name: str):
    try:
        return OmegaConf.select(cfg, name, throw_on_missing=True, default="__absent__")
    except Exception as err:  # an interpolation that does not resolve, a missing value (???)
        raise ConfigError(name, f"cannot be read ({str(err).splitlines()[0]})",
                          f"set {name}={value_text(example(name))}") from None


def _raw(cfg: DictConfig, name: str):
    """The value at ``name`` as written (interpolations unresolved); a node as a table."""
    parent, _, leaf = name.rpartition(".")
    node = OmegaConf.select(cfg, parent) if parent else cfg
    try:
        return OmegaConf.to_container(node, resolve=False)[leaf]
    except Exception:  # noqa: BLE001 - not a plain node: no value to name
        return _NO_VALUE


def closest(name: str, candidates) -> str | None:
    """The candidate key nearest to ``name``: the same last part, else the closest spelling."""
    leaf = name.rsplit(".", 1)[-1]
    same = [c for c in candidates if c.rsplit(".", 1)[-1] == leaf and c.split(".")[0] == name.split(".")[0]]
    if same:
        return min(same, key=len)
    m = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.6)
    return m[0] if m else None


_NO_VALUE = object()

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


def unknown_key(name: str, value=_NO_VALUE) -> ConfigError:
    """``name``: no such schema key; the fix names the closest key, with ``value`` (the one typed) as the override
    to write (``fl.num_clients=5``, without the ``+`` of ``+fl.num_client=5``: the closest key exists)."""
    near = closest(name, all_keys())
    given = f"{near}={value_text(value)}; " if near and value is not _NO_VALUE and not isinstance(value, dict) else ""
    fix = f"did you mean {near}? ({given}python -m fl_lightning.config.keys lists every key)" if near else \
        "remove it (python -m fl_lightning.config.keys lists every key)"
    return ConfigError(name, "no such key", fix)


def check(cfg: DictConfig, overrides: list[str] | None = None) -> None:
    """The composed config against the schema: unknown keys in the schema's groups (also ``+`` keys), each key's type
    and range, then the rules between keys; with the command line's ``overrides``, a ``method.X`` override that
    nothing in the method reads. Torch-free; raises the first :class:`ConfigError`."""
    declared = fields_of(Root)
    for top in cfg.keys():
        if top not in declared and top not in GROUPS and top not in (*CONFIG_GROUPS, "hydra"):
            raise unknown_key(str(top), _raw(cfg, str(top)))
    for g, cls in GROUPS.items():
        node = cfg.get(g)
        if node is None:
            continue
        names = fields_of(cls)
        for k in node.keys():
            if k not in names:
                raise unknown_key(f"{g}.{k}", _raw(cfg, f"{g}.{k}"))
    values = {}
    for name in all_keys():  # read first (a key's example may depend on another's value), refused in schema order
        try:
            values[name] = _read(cfg, name)
        except ConfigError as err:
            values[name] = err
    for name, v in values.items():
        if isinstance(v, ConfigError):
            raise v
        if v != "__absent__":
            check_value(name, v, values)
    rules(cfg)
    if overrides and cfg.get("method") is not None:
        unread = unread_method_keys(cfg)
        for ov in overrides:
            name = ov.split("=", 1)[0].lstrip("+~")
            parts = name.split(".")
            if len(parts) == 2 and parts[0] == "method" and parts[1] in unread:
                near = closest_key(cfg, name, exclude={f"method.{k}" for k in unread})
                typed = ov.split("=", 1)[1] if "=" in ov else None
                fix = (f"did you mean {near}?" + (f" ({near}={typed})" if typed is not None else "")) if near else \
                    "remove it"
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
    if path not in (None, "", "null", "auto") and not os.path.isdir(str(path)):
        raise ConfigError("resume", f"no run directory {str(path)!r}",
                          "pass the run directory printed by the stopped run (it holds checkpoints/)")


def check_clients(num_clients: int, clients_per_round: int) -> None:
    """``fl.clients_per_round`` within ``fl.num_clients`` (also the count a partition decides: ``num_clients=auto``)."""
    check_value("fl.num_clients", num_clients)
    if clients_per_round > num_clients:
        raise ConfigError("fl.clients_per_round",
                          f"{clients_per_round} clients per round but only fl.num_clients={num_clients} clients exist",
                          f"set fl.clients_per_round={num_clients} (or fewer), or raise fl.num_clients, e.g. "
                          f"fl.num_clients={clients_per_round}")


def rules(cfg: DictConfig) -> None:
    """Cross-key rules, in one place."""
    check_resume(cfg.get("resume"))
    fl = cfg.fl
    if str(fl.num_clients) != "auto":  # auto: checked on the partition's count (build)
        check_clients(int(fl.num_clients), int(fl.clients_per_round))
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
    from hydra.core.override_parser.overrides_parser import OverridesParser  # Hydra's grammar: 0.2 s, command line only

    overrides = OverridesParser.create().parse_overrides([a for a in argv if "=" in a or a.startswith("~")])
    known = all_keys()
    typed = {ov.key_or_group: ov.value() for ov in overrides if not ov.is_delete() and not ov.is_sweep_override()}
    for ov in overrides:
        name = ov.key_or_group
        top = name.split(".")[0]
        if ov.package is not None or "/" in name or top in ("hydra", "tables", "paper", *CONFIG_GROUPS) and name not in known:
            continue  # config groups, their targets' arguments (checked when built), table entries, Hydra's keys
        if name not in known:
            raise unknown_key(name, _NO_VALUE if ov.is_delete() or ov.is_sweep_override() else ov.value())
        if ov.is_delete():
            raise ConfigError(name, "a schema key cannot be deleted",
                              f"set it instead, e.g. {name}={value_text(example(name, typed))}")
        values = list(ov.sweep_iterator()) if ov.is_sweep_override() else [ov.value()]
        for v in values:
            if isinstance(v, str) and "${" in v:
                continue
            check_value(name, v, typed)
