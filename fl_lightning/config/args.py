"""The arguments of ``_target_`` nodes checked against their constructors' signatures, before anything is built.

:func:`check_targets` walks the composed config's groups: every key of a ``_target_`` node must be an argument of its
target, and a value must fit the argument's annotation and its :mod:`~fl_lightning.config.ranges` vocabulary (``Range``,
``OneOf``, a named ``Validate``), each failure one line naming the full key and the fix; then the method's parts and
the groups' labels (:mod:`fl_lightning.config.groups`). An annotation is read by
:func:`~fl_lightning.config.ranges.hint_meta`, the one function that reads the schema's fields too.
"""
from __future__ import annotations

import difflib
import functools
import inspect
import types
import typing
from collections.abc import Mapping
from typing import Annotated

from hydra.utils import get_object
from omegaconf import DictConfig, OmegaConf

from ..errors import ConfigError
from .ranges import LearningRate, Range, hint_meta

from .compose import interpolation_source, root_of, signature, qualify
from .groups import check_labels, check_parts
from .schema import TARGET_GROUPS
from .checks import bounds, problem, value_text

def arg_problem(meta: dict, value) -> str | None:
    """What is wrong with ``value`` for an argument described by :func:`~fl_lightning.config.ranges.hint_meta` (None:
    nothing)."""
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


def describe_target(meta: dict) -> str:
    """``an int in [1, 65536]``, ``a list of 2 floats in [0, 1)``, ``one of mean, n_minus_s``: the valid values."""
    if meta["kind"] == "list":
        item = meta["items"]
        n = f"{meta['length']} " if meta["length"] else ""
        desc = f"a list of {n}{item['kind']}s" + (f" {bounds(item)}" if item["low"] is not None or item["high"]
                                                   is not None else "")
    elif meta["choices"]:
        desc = f"one of {', '.join(map(str, meta['choices']))}"
    else:
        desc = {"int": "an int", "float": "a number", "bool": "true or false", "str": "a string", "path": "a path",
                "table": "a table (key: value, ...)"}[meta["kind"]]
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


def _meant(parent: str, near: str, value, node: Mapping) -> str:
    """``data.batch_size=16; `` : the override a "did you mean" fix asks for, the typed value under the key meant,
    with a ``+`` only where the node lacks that key (a ``+`` on a key the config has is refused by Hydra)."""
    if isinstance(value, (dict, Mapping)):
        return ""
    return f"{'' if near in node else '+'}{parent}.{near}={value_text(value)}; "



# arguments of targets this package does not own (torch's optimizers), declared as their hints would be
_UNIT = Annotated[float, Range(0.0, 1.0, open_high=True)]
EXTERNAL_HINTS: dict[str, dict] = {
    "torch.optim.SGD": {"lr": LearningRate, "momentum": _UNIT,
                        "weight_decay": Annotated[float, Range(0.0)], "dampening": _UNIT, "nesterov": bool},
    "torch.optim.Adam": {"lr": LearningRate,
                         "betas": Annotated[tuple[float, float], Range(0.0, 1.0, open_high=True)],
                         "eps": Annotated[float, Range(0.0, 1.0)], "weight_decay": Annotated[float, Range(0.0)],
                         "amsgrad": bool},
}
EXTERNAL_HINTS["torch.optim.AdamW"] = EXTERNAL_HINTS["torch.optim.Adam"]


@functools.lru_cache(maxsize=None)
def target_info(target: str):
    """(object, signature, hints with their Annotated markers) of a ``_target_`` path; None if it does not import."""
    try:
        obj = get_object(target)
    except Exception:
        return None
    return object_info(obj, EXTERNAL_HINTS.get(target))


def object_info(obj, extra: Mapping | None = None):
    """(object, signature, hints with their Annotated markers) of a function or class (``extra``: hints that
    override its own)."""
    sig = signature(obj)
    if sig is None:
        return obj, None, {}
    try:
        hints = typing.get_type_hints(obj.__init__ if inspect.isclass(obj) else obj, include_extras=True)
    except Exception:
        hints = {}
    return obj, sig, {**hints, **(extra or {})}


def _typed_dict(hint) -> dict | None:
    """The keys and hints of a ``TypedDict`` argument (``backbone: Backbone | None``), else None."""
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
            raise ConfigError(err.key, err.problem, f"{fix} ({_meant(user, near[0], v, value) if near else ''}"
                                                    f"it takes: {', '.join(fields)})")
        meta = hint_meta(fields[k])
        bad = None if meta is None else arg_problem(meta, v)
        if bad:
            err = qualify(ConfigError(f"{full}.{k}", bad, ""), "", root)
            ex = value_text(_example(meta, None, False))
            raise ConfigError(err.key, bad, f"set it to {describe_target(meta)}, e.g. {err.key.split(' (via ')[0]}={ex}")


def check_arguments(info, target: str, sub: Mapping, key: str, root=None, skip=()) -> None:
    """The values ``sub`` of one ``_target_`` node at ``key`` against its target's signature (``info``:
    :func:`target_info`): a key that is not an argument (unless it takes ``**kwargs``; ``skip``: keys its builder
    consumes), a value of the wrong type or out of its annotation's range, then the arguments' named
    :class:`~fl_lightning.config.ranges.Validate` rules. One :class:`ConfigError` naming the full key."""
    obj, sig, hints = info
    if sig is None:
        return
    takes_any = any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())
    skip = set(skip)
    for arg, value in sub.items():
        if str(arg).startswith("_") or arg in skip or (arg == "name" and "name" not in sig.parameters):
            continue
        full = f"{key}.{arg}" if key else str(arg)
        if arg not in sig.parameters and not takes_any:
            params = [p for p in sig.parameters if p not in ("self", "args", "kwargs")]
            near = difflib.get_close_matches(str(arg), params + sorted(skip), n=1)  # data.batch_size too
            err = qualify(ConfigError(full, f"is not an argument of {target}", ""), "", root)
            user = err.key.split(" (via ")[0].rpartition(".")[0]
            fix = f"did you mean {user}.{near[0]}?" if near else "remove it"
            raise ConfigError(err.key, err.problem, f"{fix} ({_meant(user, near[0], value, sub) if near else ''}"
                                                    f"it takes: {', '.join(params)})")
        p = sig.parameters.get(arg)
        has_default = p is not None and p.default is not p.empty
        default = p.default if has_default else None
        fields = _typed_dict(hints.get(arg))
        if fields is not None and isinstance(value, dict):  # a nested node with declared keys (TypedDict)
            _check_fields(full, value, fields, root)
            continue
        meta = hint_meta(hints.get(arg), default, has_default)
        if meta is None or (meta["kind"] != "list" and isinstance(value, (dict, list))):
            continue
        bad = arg_problem(meta, value)
        if bad:
            err = qualify(ConfigError(full, bad, ""), "", root)
            if meta["kind"] == "list" and isinstance(value, list):
                for i, item in enumerate(value):  # betas: [${method.beta1}, ${method.beta2}]
                    src = interpolation_source(root, f"{full}.{i}") if problem(meta["items"], item) else None
                    if src and src != f"{err.key.split(' (via ')[0]}.{i}":
                        item_meta = dict(meta["items"], example=None)
                        d = default[i] if isinstance(default, (list, tuple)) and len(default) > i else None
                        ex = value_text(_example(item_meta, d, d is not None))
                        raise ConfigError(f"{src} (via {err.key.split(' (via ')[0]}.{i})",
                                          problem(meta["items"], item),
                                          f"set it to {describe_target(item_meta)}, e.g. {src}={ex}")
            user = err.key.split(" (via ")[0]
            ex = value_text(_example(meta, default, has_default))
            shown = value_text(default)
            known = f" (its default: {shown})" if has_default and shown != ex else ""
            raise ConfigError(err.key, bad, f"set it to {describe_target(meta)}, e.g. {user}={ex}{known}")
    _check_rules(sig, hints, sub, key, root)


def _check_rules(sig, hints: Mapping, sub: Mapping, key: str, root) -> None:
    """The :class:`~fl_lightning.config.ranges.Validate` rules of the arguments, on their configured values (else
    their defaults); a rule none of whose arguments the node sets is the constructor's own default, not checked. A
    rule carried by several arguments' annotations (``lower <= upper`` on both) names the one moved from its
    default (else the first); a rule carried by one argument names that one."""
    rules: dict = {}  # rule -> (its Validate, the arguments whose annotation carries it)
    for arg, p in sig.parameters.items():
        meta = hint_meta(hints.get(arg), None if p.default is p.empty else p.default, p.default is not p.empty)
        for v in meta["validators"] if meta else ():
            rules.setdefault(v.rule, (v, []))[1].append(arg)
    for v, carriers in rules.values():
        names = list(inspect.signature(v.rule).parameters)
        if not any(n in sub for n in names):
            continue
        values, defaults = {}, {}
        for n in names:
            q = sig.parameters.get(n)
            if q is not None and q.default is not q.empty:
                defaults[n] = q.default
            if n in sub:
                values[n] = sub[n]
            elif n in defaults:
                values[n] = defaults[n]
        if len(values) < len(names) or v.rule(**values):
            continue
        moved = [a for a in carriers if a in values and (a not in defaults or values[a] != defaults[a])]
        blame = moved[0] if len(carriers) > 1 and moved else carriers[0]
        err = qualify(ConfigError(f"{key}.{blame}" if key else blame, v.problem.format(**values), ""), "", root)
        raise ConfigError(err.key, err.problem, v.fix.format(**values))


def check_call(obj, *args, **kwargs) -> None:
    """A direct call's arguments (``check_call(TopK, 0)``) against ``obj``'s annotations, as :func:`check_targets`
    checks a config node's before anything is built: one :class:`ConfigError` naming the argument. For code and
    tests that construct a part, codec or optimizer in Python, where no config check ran; a ``functools.partial``
    is checked with its bound arguments."""
    if isinstance(obj, functools.partial):
        return check_call(obj.func, *obj.args, *args, **{**obj.keywords, **kwargs})
    info = object_info(obj)
    if info[1] is None:
        return
    values = {**info[1].bind_partial(*args).arguments, **kwargs}
    check_arguments(info, f"{getattr(obj, '__module__', '')}.{getattr(obj, '__qualname__', obj)}", values, "")


def checked(obj, *args, **kwargs):
    """``obj(*args, **kwargs)`` after :func:`check_call`: a part, codec or optimizer built in Python meets the checks
    a config's would."""
    check_call(obj, *args, **kwargs)
    return obj(*args, **kwargs)


def check_targets(cfg: DictConfig, groups: tuple[str, ...] = TARGET_GROUPS,
                  drop: Mapping[str, tuple[str, ...]] | None = None) -> None:
    """Every ``_target_`` node's keys against its constructor, before anything is built: a ``_target_`` that does not
    import, a key that is not an argument (unless it takes ``**kwargs``), and a value of the wrong type or out of the
    range its signature declares (plain hints int, float, bool, str, lists of them, and ``typing.Annotated`` markers
    :class:`~fl_lightning.config.ranges.Range` / :class:`~fl_lightning.config.ranges.OneOf` /
    :class:`~fl_lightning.config.ranges.Validate`; :data:`EXTERNAL_HINTS` for torch's optimizers). One :class:`ConfigError` naming the full key (and the key the user typed when the value was
    interpolated), whose fix names a valid value for that key. ``drop``: keys of a node (by its full key) that the
    builder consumes before calling the target (``data``'s batch sizes and partition). Then the nodes under
    ``method.parts`` (:func:`check_parts`) and the groups' labels (:func:`check_labels`)."""
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
        root = root_of(node)
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
            info = target_info(target) if isinstance(target, str) else None
            if info is None or not callable(info[0]):
                what = (f"expected a name, got {target!r}" if not isinstance(target, str) else f"{target!r} does not "
                        "import" if info is None else f"{target!r} is not a function or class")
                fix = ("set it to an importable function or class (package.module.name), or pick another "
                       f"{key.split('.')[0]} (e.g. {key.split('.')[0]}=<name>)")
                if info is None and isinstance(target, str):  # the user's own module: its folder on the path
                    fix = (f"if {target.rpartition('.')[0]} is your own code, add the folder that holds it to "
                           "PYTHONPATH (PYTHONPATH=/abs/folder python train.py ...); else " + fix)
                raise qualify(ConfigError(f"{key}._target_", f"cannot be built ({what})", fix), "", root)
            check_arguments(info, target, sub, key, root, skip=(drop or {}).get(key, ()))
    check_labels(cfg)
