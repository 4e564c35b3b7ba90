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


import functools
import inspect
import re
from typing import Any

from hydra.errors import InstantiationException
from hydra.utils import get_object
from hydra.utils import instantiate as hydra_instantiate
from omegaconf import DictConfig, OmegaConf

from ..errors import ConfigError, DiskError, FLError

_FULL_KEY = re.compile(r"full_key: (\S+)")
_INTERPOLATION = re.compile(r"\$\{(?:oc\.select:)?([\w.]+)(?:,.*)?\}")  # ${a.b} or ${oc.select:a.b,default} -> a.b


def root_of(node):
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


def interpolation_source(root: DictConfig | None, key: str) -> str | None:
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


def signature(target):
    if isinstance(target, str):
        try:
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
    args = {k: v for k, v in kwargs.items() if not str(k).startswith("_")}
    msg = str(err)
    for words, name in _SYNONYMS:  # torch.optim's messages name some arguments in words
        msg = msg.replace(words, name)
    named = [k for k in args if re.search(rf"(?<![\w.]){re.escape(str(k))}(?![\w.])", msg)]
    if len(named) == 1:
        return named[0]
    sig = signature(target)
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
    sig = signature(node.get("_target_"))
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
    src = interpolation_source(root, key)
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
    root = root_of(node) if OmegaConf.is_config(node) else None
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
        if isinstance(cause, OSError) and not isinstance(cause, (FileNotFoundError, NotADirectoryError)):
            raise DiskError(f"building {inner}", cause) from None  # disk full, permissions: not the config's fault
        what = f"{type(cause).__name__}: {cause}" if cause is not None else str(err).splitlines()[0]
        what = " ".join(what.split())
        sub = _sub_node(plain, inner[len(key) + 1:] if inner != key else "")
        if "callable target" in what or "Error locating target" in what:
            raise qualify(ConfigError("_target_", f"cannot be built ({what[:200]})",
                                      "set it to an importable function or class (package.module.name)"),
                          inner, root) from None
        arg = blame(sub.get("_target_"), sub, cause) if isinstance(sub, dict) and cause is not None else None
        if arg is not None and "unexpected keyword argument" in what:
            sig = signature(sub.get("_target_"))
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
