"""Building objects from ``_target_`` configs, with errors that name the full key.

Everything a user may swap (models, datasets, partitioners, strategy parts, optimizers, codecs, server
optimizers) is built by :func:`instantiate` from a node of the composed Hydra config. A constructor or builder
function that rejects a value raises :class:`~fl_lightning.errors.ConfigError` naming its own argument
(``ConfigError("rule", "unknown rule 'foo'", "use one of mean, n_minus_s, majority_vote")``); :func:`instantiate`
turns that into the full key a user types on the command line (``method.parts.aggregation.rule``), and when that
value was interpolated from another key (``alpha: ${method.alpha}``) names that key too. Any other exception raised
while calling a target (an unknown keyword, a wrong type) becomes a one-line :class:`ConfigError` as well, so a bad
value anywhere in the tree is one line on the command line, never a Hydra traceback.
"""
from __future__ import annotations

from collections.abc import Mapping

import difflib
import functools
import re
from typing import Annotated, Any

from omegaconf import DictConfig, OmegaConf

from .errors import ConfigError, FLError
from .ranges import OneOf, Range

_FULL_KEY = re.compile(r"full_key: (\S+)")
_INTERPOLATION = re.compile(r"\$\{(?:oc\.select:)?([\w.]+)(?:,.*)?\}")  # ${a.b} or ${oc.select:a.b,default} -> a.b


def _root(node):
    """The root config of ``node`` (None stays None)."""
    while node is not None and node._get_parent() is not None:
        node = node._get_parent()
    return node


def _interpolation_target(root: DictConfig, key: str) -> str | None:
    """If the node at ``key`` is an interpolation ``${a.b}`` (or ``${oc.select:a.b,default}``), return ``a.b``."""
    parent_key, _, leaf = key.rpartition(".")
    try:
        parent = OmegaConf.select(root, parent_key, throw_on_missing=False) if parent_key else root
        if parent is None or not OmegaConf.is_config(parent) or not OmegaConf.is_list(parent) and not \
                OmegaConf.is_interpolation(parent, leaf):
            return None
        if OmegaConf.is_list(parent):  # an item of a list (betas: [${method.beta1}, ...])
            if not leaf.isdigit() or int(leaf) >= len(parent) or not OmegaConf.is_interpolation(parent, int(leaf)):
                return None
            text = str(OmegaConf.to_container(parent, resolve=False)[int(leaf)])
        else:
            text = str(OmegaConf.to_container(parent, resolve=False)[leaf])
    except Exception:  # not a plain node (a list index, a missing key): no source to name
        return None
    m = _INTERPOLATION.fullmatch(text.strip())
    return m.group(1) if m else None


def _interpolation_source(root: DictConfig | None, key: str) -> str | None:
    """The key a user typed for the value at ``key``: follows interpolations of the node or of any of its parents
    (``method.parts.aggregation.server_opt: ${server_opt}``, ``lr: ${oc.select:method.server_lr,0.01}``)."""
    if root is None or not key:
        return None
    src, seen = key, set()
    while src not in seen:
        seen.add(src)
        parts = src.split(".")
        for n in range(len(parts), 0, -1):  # the node itself first, then its parents
            target = _interpolation_target(root, ".".join(parts[:n]))
            if target:
                src = ".".join([target, *parts[n:]])
                break
        else:
            break
    return src if src != key else None


def _sub_node(plain, rel: str):
    for part in [p for p in rel.split(".") if p]:
        if not isinstance(plain, dict) or part not in plain:
            return None
        plain = plain[part]
    return plain


def _signature(target):
    import inspect

    if isinstance(target, str):
        try:
            from hydra.utils import get_object

            target = get_object(target)
        except Exception:
            return None
    if isinstance(target, functools.partial):
        target = target.func
    try:
        return inspect.signature(target)
    except (TypeError, ValueError):
        return None


_SYNONYMS = (("learning rate", "lr"), ("epsilon", "eps"), ("beta parameter", "betas"))


def blame(target, kwargs: dict, err: BaseException) -> str | None:
    """The argument of ``target`` (a callable or a ``_target_`` path) that the exception ``err`` raised when calling
    it with ``kwargs`` points at: the one argument the message names (``Invalid momentum value: -1``), else the first
    whose value is not of its default's kind (``None`` for a number, ``'abc'`` for a float). None if unclear."""
    import inspect

    args = {k: v for k, v in kwargs.items() if not str(k).startswith("_")}
    msg = str(err)
    for words, name in _SYNONYMS:  # torch.optim's messages name some arguments in words
        msg = msg.replace(words, name)
    named = [k for k in args if re.search(rf"(?<![\w.]){re.escape(str(k))}(?![\w.])", msg)]
    if len(named) == 1:
        return named[0]
    sig = _signature(target)
    if sig is None:
        return None
    for k, v in args.items():
        p = sig.parameters.get(k)
        d = p.default if p is not None else inspect.Parameter.empty
        if d is inspect.Parameter.empty or d is None:  # no default: its annotation tells the kind
            d = {"float": 0.0, "int": 0, float: 0.0, int: 0}.get(p.annotation) if p is not None else None
            if d is None:
                continue
        number = isinstance(d, (int, float)) and not isinstance(d, bool)
        if v is None or (isinstance(d, bool) and not isinstance(v, bool)) or (
                number and not (isinstance(v, (int, float)) and not isinstance(v, bool))):
            return k
    return None


def _default_hint(node: dict, arg: str) -> str:
    sig = _signature(node.get("_target_"))
    p = sig.parameters.get(arg) if sig is not None else None
    if p is None:
        return ""
    if p.default is not p.empty:
        return f" (its default: {p.default!r})"
    return f" (a {p.annotation})" if p.annotation in ("float", "int", "str", "bool") else ""


def qualify(err: ConfigError, prefix: str, root: DictConfig | None = None) -> ConfigError:
    """``err`` with its key made absolute under ``prefix`` (and its interpolation source named)."""
    key = err.key
    if prefix and not key.startswith(prefix + ".") and key != prefix:
        key = f"{prefix}.{key}" if key else prefix
    src = _interpolation_source(root, key)
    if src and src != key:
        key = f"{src} (via {key})"
    return ConfigError(key, err.problem, err.fix)


def instantiate(node: Any, key: str, *, drop: tuple[str, ...] = ("name",), **kwargs) -> Any:
    """``hydra.utils.instantiate(node, **kwargs)`` for the config node at ``key`` of the composed config.

    Interpolations are resolved in the full config first; ``drop`` lists metadata keys of the top node that are not
    arguments of the target (a model's or dataset's display ``name``). Containers reach targets as plain
    ``dict``/``list`` (``_convert_="all"``), nested ``_target_`` nodes are built first (``_partial_: true`` gives a
    factory). Errors: see the module docstring.
    """
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate as hydra_instantiate

    root = _root(node) if OmegaConf.is_config(node) else None
    if OmegaConf.is_config(node):
        try:
            plain = OmegaConf.to_container(node, resolve=True)
        except Exception as err:  # an interpolation that does not resolve
            raise ConfigError(key, f"cannot resolve: {str(err).splitlines()[0]}", "check the keys it refers to") from None
    else:
        plain = dict(node)
    if isinstance(plain, dict):
        plain = {k: v for k, v in plain.items() if k not in drop}
        plain.setdefault("_convert_", "all")
    try:
        return hydra_instantiate(plain, **kwargs)
    except InstantiationException as err:
        m = _FULL_KEY.search(str(err))
        inner = f"{key}.{m.group(1)}" if m else key
        cause = err.__cause__
        while isinstance(cause, InstantiationException) and cause.__cause__ is not None:
            cause = cause.__cause__
        if isinstance(cause, ConfigError):
            raise qualify(cause, inner, root) from None
        if isinstance(cause, FLError):
            raise cause from None
        what = f"{type(cause).__name__}: {cause}" if cause is not None else str(err).splitlines()[0]
        what = " ".join(what.split())
        sub = _sub_node(plain, inner[len(key) + 1:] if inner != key else "")
        if "callable target" in what or "Error locating target" in what:
            raise qualify(ConfigError("_target_", f"cannot be built ({what[:200]})",
                                      "set it to an importable function or class (package.module.name)"),
                          inner, root) from None
        arg = blame(sub.get("_target_"), sub, cause) if isinstance(sub, dict) and cause is not None else None
        if arg is not None and "unexpected keyword argument" in what:
            sig = _signature(sub.get("_target_"))
            takes = ", ".join(p for p in sig.parameters if p not in ("self", "args", "kwargs")) if sig else "?"
            raise qualify(ConfigError(arg, f"is not an argument of {sub.get('_target_')}",
                                      f"remove it (it takes: {takes})"), inner, root) from None
        if arg is not None:
            raise qualify(ConfigError(arg, f"rejected by {sub.get('_target_')} ({what})",
                                      f"set it to a valid value{_default_hint(sub, arg)}"),
                          inner, root) from None
        raise ConfigError(inner, f"could not build {plain.get('_target_', 'the object')} ({what})",
                          f"check the arguments under {inner}") from None
    except ConfigError as err:  # raised by the top-level target itself, outside Hydra's wrapping
        raise qualify(err, key, root) from None


_KINDS = {int: "int", float: "float", bool: "bool", str: "str"}


def arg_meta(hint, default=None, has_default: bool = False) -> dict | None:
    """What :func:`check_targets` checks of an argument from its type hint: the schema's field metadata (kind, range,
    choices, nullable; :func:`fl_lightning.schema.problem`), plus for a list argument ``items`` (the metadata of one
    item), ``length`` (a ``tuple[float, float]``'s 2) and ``scalar`` (``int | list[int]``: one value accepted too).
    The range comes from ``typing.Annotated`` markers (:class:`~fl_lightning.ranges.Range`,
    :class:`~fl_lightning.ranges.OneOf`). None for a hint it does not understand (its constructor checks it)."""
    import collections.abc
    import types
    import typing

    rng, choices = None, ()

    def unwrap(h):  # Annotated[X, Range(...)] -> X, keeping the markers
        nonlocal rng, choices
        if typing.get_origin(h) is typing.Annotated:
            h, *marks = typing.get_args(h)
            for m in marks:
                if isinstance(m, Range):
                    rng = m
                elif isinstance(m, OneOf):
                    choices = m.values
        return h

    hint = unwrap(hint)
    nullable = has_default and default is None
    alts = [hint]
    if typing.get_origin(hint) in (typing.Union, types.UnionType):  # Optional[Annotated[...]] too
        alts = [unwrap(a) for a in typing.get_args(hint) if a is not type(None)]
        nullable = nullable or len(alts) < len(typing.get_args(hint))
        alts = [b for a in alts for b in (typing.get_args(a) if typing.get_origin(a) in (typing.Union, types.UnionType)
                                          else (a,))]  # Optional[Annotated[str | list[str], ...]]
    words = tuple(rng.words) if rng else ()
    scalars = [_KINDS[a] for a in alts if a in _KINDS]
    lists = [a for a in alts if typing.get_origin(a) in (list, tuple, collections.abc.Sequence)]
    if "str" in scalars and len(scalars) > 1 and (words or rng is not None):  # int | str with words: a number or a word
        scalars.remove("str")
    if scalars == ["str"] and lists and words:  # str | tuple[float, ...] with words (Muon's ns_coeffs): a word or list
        scalars.remove("str")
    if len(scalars) > 1 or len(lists) > 1 or (not scalars and not lists):
        return None
    base = dict(nullable=nullable, words=words, choices=tuple(choices), low=rng.low if rng else None,
                high=rng.high if rng else None, open_low=bool(rng and rng.open_low),
                open_high=bool(rng and rng.open_high), example=rng.example if rng else None)
    if not lists:
        return dict(base, kind=scalars[0])
    item_args = typing.get_args(lists[0])
    length = None
    if typing.get_origin(lists[0]) is tuple and item_args and Ellipsis not in item_args:
        length = len(item_args)
    kinds = {_KINDS.get(a) for a in item_args if a is not Ellipsis}
    if len(kinds) != 1 or None in kinds:
        return None
    item = dict(base, kind=kinds.pop(), nullable=False)
    if scalars and scalars[0] != item["kind"]:  # a name or numbers (Muon's ns_coeffs): its constructor checks it
        return None
    scalar = bool(scalars)
    return dict(base, kind="list", items=item, length=length, scalar=scalar)


def arg_problem(meta: dict, value) -> str | None:
    """What is wrong with ``value`` for an argument described by :func:`arg_meta` (None: nothing)."""
    from .schema import problem

    if meta["kind"] != "list" or value is None or (isinstance(value, str) and value in meta["words"]):
        return problem(meta, value)
    if not isinstance(value, (list, tuple)):
        if meta["scalar"]:
            return problem(meta["items"], value)
        n = f"{meta['length']} " if meta["length"] else ""
        return f"expected a list of {n}{meta['items']['kind']}s, got {value!r}"
    if meta["length"] is not None and len(value) != meta["length"]:
        return f"expected a list of {meta['length']} {meta['items']['kind']}s, got {value!r}"
    for v in value:
        bad = problem(meta["items"], v)
        if bad:
            return f"{bad} (in {value!r})"
    return None


def _describe(meta: dict) -> str:
    """``an int in [1, 65536]``, ``a list of 2 floats in [0, 1)``, ``one of mean, n_minus_s``: the valid values."""
    from .schema import bounds

    if meta["kind"] == "list":
        item = meta["items"]
        n = f"{meta['length']} " if meta["length"] else ""
        desc = f"a list of {n}{item['kind']}s" + (f" {bounds(item)}" if item["low"] is not None or item["high"]
                                                   is not None else "")
    elif meta["choices"]:
        desc = f"one of {', '.join(map(str, meta['choices']))}"
    else:
        desc = {"int": "an int", "float": "a number", "bool": "true or false", "str": "a string"}[meta["kind"]]
        if meta["low"] is not None or meta["high"] is not None:
            desc += f" {bounds(meta)}"
    if meta["words"]:
        desc += f" (or {' / '.join(meta['words'])})"
    return desc


def _example(meta: dict, default, has_default: bool):
    """A value the fix suggests: the argument's default when it is valid, else the marker's example, else a bound."""
    if has_default and default is not None and not arg_problem(meta, default):
        return default
    if meta.get("example") is not None:
        return meta["example"]
    if meta["choices"]:
        return meta["choices"][0]
    if meta["words"]:
        return meta["words"][0]
    m = meta["items"] if meta["kind"] == "list" else meta
    v = m["low"] if m["low"] is not None else m["high"] if m["high"] is not None else None
    if v is None:
        return {"int": 1, "float": 1.0, "bool": False, "str": "a"}.get(m["kind"])
    if m["kind"] == "int":
        v = int(v) + (1 if m.get("open_low") else 0)
    elif m.get("open_low"):
        v = v + (min(1.0, (m["high"] - v) / 2) if m["high"] is not None else 1.0)
    return [v] * (meta["length"] or 1) if meta["kind"] == "list" else v


def _override_text(v) -> str:
    """A value as the command line writes it."""
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(_override_text(x) for x in v) + "]"
    return "null" if v is None else str(v)


# arguments of targets this package does not own (torch's optimizers), declared as their hints would be
_UNIT = Annotated[float, Range(0.0, 1.0, open_high=True)]
EXTERNAL_HINTS: dict[str, dict] = {
    "torch.optim.SGD": {"lr": Annotated[float, Range(0.0)], "momentum": _UNIT,
                        "weight_decay": Annotated[float, Range(0.0)], "dampening": _UNIT, "nesterov": bool},
    "torch.optim.Adam": {"lr": Annotated[float, Range(0.0)],
                         "betas": Annotated[tuple[float, float], Range(0.0, 1.0, open_high=True)],
                         "eps": Annotated[float, Range(0.0, 1.0)], "weight_decay": Annotated[float, Range(0.0)],
                         "amsgrad": bool},
}
EXTERNAL_HINTS["torch.optim.AdamW"] = EXTERNAL_HINTS["torch.optim.Adam"]


@functools.lru_cache(maxsize=None)
def _target_info(target: str):
    """(object, signature, hints with their Annotated markers) of a ``_target_`` path; None if it does not import."""
    import inspect
    import typing

    try:
        from hydra.utils import get_object

        obj = get_object(target)
    except Exception:
        return None
    sig = _signature(obj)
    if sig is None:
        return obj, None, {}
    try:
        hints = typing.get_type_hints(obj.__init__ if inspect.isclass(obj) else obj, include_extras=True)
    except Exception:
        hints = {}
    return obj, sig, {**hints, **EXTERNAL_HINTS.get(target, {})}


def _typed_dict(hint) -> dict | None:
    """The keys and hints of a ``TypedDict`` argument (``backbone: Backbone | None``), else None."""
    import types
    import typing

    if typing.get_origin(hint) is typing.Annotated:
        hint = typing.get_args(hint)[0]
    alts = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    for a in alts:
        if isinstance(a, type) and typing.is_typeddict(a):
            return typing.get_type_hints(a, include_extras=True)
    return None


def _check_fields(full: str, value: dict, fields: dict, root) -> None:
    """A nested node's keys against its ``TypedDict``: no other key, each value of its type and in its range."""
    for k, v in value.items():
        if k not in fields:
            near = difflib.get_close_matches(str(k), list(fields), n=1)
            err = qualify(ConfigError(f"{full}.{k}", f"is not a key of {full}", ""), "", root)
            user = err.key.split(" (via ")[0].rpartition(".")[0]
            fix = f"did you mean {user}.{near[0]}?" if near else "remove it"
            raise ConfigError(err.key, err.problem, f"{fix} (it takes: {', '.join(fields)})")
        meta = arg_meta(fields[k])
        bad = None if meta is None else arg_problem(meta, v)
        if bad:
            err = qualify(ConfigError(f"{full}.{k}", bad, ""), "", root)
            ex = _override_text(_example(meta, None, False))
            raise ConfigError(err.key, bad, f"set it to {_describe(meta)}, e.g. {err.key.split(' (via ')[0]}={ex}")


def check_targets(cfg: DictConfig, groups: tuple[str, ...] = ("method", "model", "data", "optimizer", "server_opt"),
                  drop: Mapping[str, tuple[str, ...]] | None = None) -> None:
    """Every ``_target_`` node's keys against its constructor, before anything is built: a ``_target_`` that does not
    import, a key that is not an argument (unless it takes ``**kwargs``), and a value of the wrong type or out of the
    range its signature declares (plain hints int, float, bool, str, lists of them, and ``typing.Annotated`` markers
    :class:`~fl_lightning.ranges.Range` / :class:`~fl_lightning.ranges.OneOf`; :data:`EXTERNAL_HINTS` for torch's
    optimizers). One :class:`ConfigError` naming the full key (and the key the user typed when the value was
    interpolated), whose fix names a valid value for that key. ``drop``: keys of a node (by its full key) that the
    builder consumes before calling the target (``data``'s batch sizes and partition). Then the nodes under
    ``method.parts`` (:func:`check_parts`) and the groups' labels (:func:`check_labels`)."""
    from .schema import problem

    if "method" in groups and OmegaConf.is_dict(cfg.get("method")):
        check_parts(cfg.method)
    for group in groups:
        node = cfg.get(group)
        if not OmegaConf.is_config(node):
            continue
        try:
            plain = OmegaConf.to_container(node, resolve=True)
        except Exception:  # an interpolation that does not resolve: instantiate names it
            continue
        root = _root(node)
        stack = [(group, plain)]
        while stack:
            key, sub = stack.pop()
            if isinstance(sub, list):
                stack.extend((f"{key}.{i}", v) for i, v in enumerate(sub))
                continue
            if not isinstance(sub, dict):
                continue
            stack.extend((f"{key}.{k}", v) for k, v in sub.items() if isinstance(v, (dict, list)))
            if "_target_" not in sub:
                continue
            target = sub["_target_"]
            info = _target_info(target) if isinstance(target, str) else None
            if info is None or not callable(info[0]):
                what = (f"expected a name, got {target!r}" if not isinstance(target, str) else f"{target!r} does not "
                        "import" if info is None else f"{target!r} is not a function or class")
                raise qualify(ConfigError(f"{key}._target_", f"cannot be built ({what})",
                                          "set it to an importable function or class (package.module.name), or pick "
                                          f"another {key.split('.')[0]} (e.g. {key.split('.')[0]}=<name>)"), "", root)
            obj, sig, hints = info
            if sig is None:
                continue
            takes_any = any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())
            skip = set((drop or {}).get(key, ()))
            for arg, value in sub.items():
                if str(arg).startswith("_") or arg in skip or (arg == "name" and "name" not in sig.parameters):
                    continue
                full = f"{key}.{arg}"
                if arg not in sig.parameters and not takes_any:
                    params = [p for p in sig.parameters if p not in ("self", "args", "kwargs")]
                    near = difflib.get_close_matches(str(arg), params + sorted(skip), n=1)  # data.batch_size too
                    err = qualify(ConfigError(full, f"is not an argument of {target}", ""), "", root)
                    user = err.key.split(" (via ")[0].rpartition(".")[0]
                    fix = f"did you mean {user}.{near[0]}?" if near else "remove it"
                    raise ConfigError(err.key, err.problem, f"{fix} (it takes: {', '.join(params)})")
                p = sig.parameters.get(arg)
                has_default = p is not None and p.default is not p.empty
                default = p.default if has_default else None
                fields = _typed_dict(hints.get(arg))
                if fields is not None and isinstance(value, dict):  # a nested node with declared keys (TypedDict)
                    _check_fields(full, value, fields, root)
                    continue
                meta = arg_meta(hints.get(arg), default, has_default)
                if meta is None or (meta["kind"] != "list" and isinstance(value, (dict, list))):
                    continue
                bad = arg_problem(meta, value)
                if bad:
                    err = qualify(ConfigError(full, bad, ""), "", root)
                    if meta["kind"] == "list" and isinstance(value, list):
                        for i, item in enumerate(value):  # betas: [${method.beta1}, ${method.beta2}]
                            src = _interpolation_source(root, f"{full}.{i}") if problem(meta["items"], item) else None
                            if src and src != f"{err.key.split(' (via ')[0]}.{i}":
                                item_meta = dict(meta["items"], example=None)
                                d = default[i] if isinstance(default, (list, tuple)) and len(default) > i else None
                                ex = _override_text(_example(item_meta, d, d is not None))
                                raise ConfigError(f"{src} (via {err.key.split(' (via ')[0]}.{i})",
                                                  problem(meta["items"], item),
                                                  f"set it to {_describe(item_meta)}, e.g. {src}={ex}")
                    user = err.key.split(" (via ")[0]
                    ex = _override_text(_example(meta, default, has_default))
                    shown = _override_text(default)
                    known = f" (its default: {shown})" if has_default and shown != ex else ""
                    raise ConfigError(err.key, bad, f"set it to {_describe(meta)}, e.g. {user}={ex}{known}")
    check_labels(cfg)


# ---------------------------------------------------------------------------------------------- labels and parts
_GROUP_WORDS = {"data": "dataset", "data/partition": "partition"}


def _shipped_conf() -> str:
    """This checkout's conf/ (the members the package ships)."""
    import os

    return os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "conf")


def _conf_dirs() -> tuple[str, ...]:
    """The folders Hydra composes from: inside a Hydra app its ``file://`` config sources (conf/ and any
    ``hydra.searchpath`` folder), else this checkout's conf/."""
    import os

    try:
        from hydra.core.hydra_config import HydraConfig

        if HydraConfig.initialized():
            dirs = tuple(s.path[len("file://"):] if s.path.startswith("file://") else s.path
                         for s in HydraConfig.get().runtime.config_sources if s.schema == "file")
            if dirs:
                return dirs
    except Exception:  # noqa: BLE001 - no Hydra app: this checkout's conf/
        pass
    return (_shipped_conf(),) if os.path.isdir(_shipped_conf()) else ()


def _merge(a: dict, b: dict) -> dict:
    out = dict(a)
    for k, v in b.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


@functools.lru_cache(maxsize=None)
def _group_members(dirs: tuple[str, ...], group: str) -> dict[str, tuple[str, tuple, bool]]:
    """``{file name: (its yaml's name, its identity, shipped)}`` for the members of ``group`` (``data/partition``) in
    ``dirs`` (shipped: from the package's conf/, not a ``hydra.searchpath`` folder); a member that extends another of
    its group (``defaults: [cnn_fedsmu, _self_]``) has the merged keys."""
    import os

    import yaml

    raw: dict[str, dict] = {}
    shipped: set[str] = set()
    for d in dirs:
        folder = os.path.join(d, group)
        if not os.path.isdir(folder):
            continue
        for f in sorted(os.listdir(folder)):
            if f.endswith(".yaml") and f[:-5] not in raw:  # the first folder that has it wins, as in Hydra
                try:
                    with open(os.path.join(folder, f)) as fh:
                        node = yaml.safe_load(fh)
                except Exception:  # noqa: BLE001 - Hydra reports a yaml it cannot read
                    continue
                if isinstance(node, dict):
                    raw[f[:-5]] = node
                    if os.path.realpath(d) == os.path.realpath(_shipped_conf()):
                        shipped.add(f[:-5])

    def merged(stem: str, seen: tuple = ()) -> dict:
        node = raw[stem]
        out: dict = {}
        for entry in node.get("defaults") or ():
            base = entry.rsplit("/", 1)[-1] if isinstance(entry, str) else None
            if base and base != "_self_" and base in raw and base not in seen:
                out = _merge(out, merged(base, (*seen, stem)))
        return _merge(out, {k: v for k, v in node.items() if k != "defaults"})

    subgroups = _subgroups(_group_folders(dirs), group)
    out = {}
    for stem in raw:
        node = merged(stem)
        out[stem] = (str(node.get("name", stem)), _identity(node, subgroups), stem in shipped)
    return out


@functools.lru_cache(maxsize=None)
def _group_folders(dirs: tuple[str, ...]) -> tuple[str, ...]:
    """The config groups of ``dirs``: each folder holding a yaml (``model``, ``data/partition``)."""
    import os

    return tuple(sorted({os.path.relpath(root, d).replace(os.sep, "/") for d in dirs for root, _, files in os.walk(d)
                         if root != d and any(f.endswith(".yaml") for f in files)}))


def _subgroups(groups: tuple[str, ...], group: str) -> frozenset:
    """The groups nested one level in ``group`` (``partition`` in ``data``): their nodes are members of their own."""
    return frozenset(g[len(group) + 1:] for g in groups if g.startswith(group + "/") and "/" not in g[len(group) + 1:])


def _identity(node: dict, subgroups=frozenset()) -> tuple:
    """What a group member is, as its label names it: its ``_target_`` and those of its nested nodes (a model's
    ``net``), not of a nested group (``data.partition``) and not its values."""
    nested = tuple(sorted((str(k), str(v["_target_"])) for k, v in node.items()
                          if isinstance(v, dict) and "_target_" in v and k not in subgroups))
    return str(node.get("_target_")), nested


def check_labels(cfg: DictConfig, dirs: tuple[str, ...] | None = None) -> None:
    """A group node's ``name`` (``data.partition.name``, ``model.name``, ``data.name``: a label in summary.json and
    the logs, which never chooses anything) must be the name of a member whose ``_target_`` it has: a relabelled
    member (``data.partition.name=iid`` or ``=foo`` on the Dirichlet partition) would run one thing under another's
    name. A node whose ``_target_`` no shipped member has (the user's own, ``model.net._target_=mymodels.x``, also one
    with a yaml in a ``hydra.searchpath`` folder) may carry any label; a user's yaml of a shipped ``_target_`` carries
    its own. Methods (no ``_target_``: the parts are) and optimizers (no ``name``) have none to check."""
    dirs = _conf_dirs() if dirs is None else dirs
    if not dirs:
        return
    groups = _group_folders(tuple(dirs))
    for group in groups:
        key = group.replace("/", ".")
        node = OmegaConf.select(cfg, key, default=None, throw_on_missing=False)
        word = _GROUP_WORDS.get(group, group)
        if "/" in group and node is not None and not OmegaConf.is_config(node):  # data.partition=iid
            raise ConfigError(key, f"is {node!r}, not a {word} (a node with a _target_)",
                              f"choose the {word} with {group}={node}")
        if not OmegaConf.is_dict(node) or "name" not in node or "_target_" not in node:
            continue
        try:
            plain = OmegaConf.to_container(node, resolve=True)
        except Exception:  # noqa: BLE001 - an interpolation that does not resolve: instantiate names it
            continue
        members = _group_members(tuple(dirs), group)
        ident = _identity(plain, _subgroups(groups, group))
        same = [stem for stem, (_, idt, _) in members.items() if idt == ident]
        owners = [stem for stem in same if members[stem][2]]
        label = plain.get("name")
        if not owners or label is None or str(label) in {n for s in same for n in (s, members[s][0])}:
            continue
        owner = owners[0]
        targets = ", ".join([f"{key}._target_: {ident[0]}"] + [f"{key}.{k}._target_: {t}" for k, t in ident[1]])
        choose = f"choose the {word} with {group}={label}"
        if str(label) not in members:  # no such member yet: where one would be found
            choose += f" (a {group}/{label}.yaml in conf/ or in a hydra.searchpath=[file://DIR] folder)"
        raise ConfigError(f"{key}.name", f"is {label!r} but the node is the {owner} {word} ({targets}): the name only "
                                         f"labels the run, it does not choose the {word}",
                          f"{choose}, or set {key}.name={members[owner][0]} (label={label} names the run)")


def check_parts(method, key: str = "method") -> None:
    """Every node under ``<key>.parts`` is a part (a mapping with a ``_target_``) or null (switched off): a new node
    without one (``+method.parts.nosuch.x=1``, a misspelled part name) is one line naming it and the method's parts."""
    if OmegaConf.is_config(method):
        method = OmegaConf.to_container(method, resolve=False)
    if not isinstance(method, Mapping):
        return
    parts = method.get("parts")
    if not isinstance(parts, Mapping):  # method.parts=null, ~method.parts: a method is its parts
        what = "missing" if "parts" not in method else "null" if parts is None else repr(parts)
        raise ConfigError(f"{key}.parts", f"is {what}: method {method.get('name')!r} is made of its parts",
                          f"leave {key}.parts as the method's yaml sets it (switch one part off with "
                          f"{key}.parts.<part>=null), or choose another method (method=<name>)")
    real = [str(n) for n, p in parts.items() if isinstance(p, Mapping) and "_target_" in p]
    for n, p in parts.items():
        if not isinstance(p, Mapping) or "_target_" in p:
            continue  # null: switched off; a value: build_strategy's "expected a part" line
        full = f"{key}.parts.{n}"
        near = difflib.get_close_matches(str(n), real, n=1, cutoff=0.6)
        new = f"a new part needs a _target_: +{full}._target_=package.module.Part"
        fix = (f"did you mean {key}.parts.{near[0]}? ({new})" if near else
               f"use one of the method's parts ({key}.parts.{(real or ['<part>'])[0]}.<key>=...); {new}")
        raise ConfigError(full, f"is not a part of method {method.get('name')!r} (no _target_; its parts: "
                                f"{', '.join(real) or 'none'})", fix)
