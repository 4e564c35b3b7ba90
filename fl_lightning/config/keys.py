"""``python -m fl_lightning.config.keys [GROUP | KEY | GROUP=NAME ...]``: the config's keys with their type, range, default
and help.

* ``keys`` / ``keys fl``: the schema's keys (generated from :mod:`fl_lightning.config.schema`), all or under a prefix;
* ``keys method=fedmuon`` (or ``model=``, ``data=``, ``optimizer=``, any group choice; several together): that
  config as Hydra composes it, every key under the group, the constructor arguments of its parts, models, datasets
  and optimizers included (type and range from their annotations, the value the config gives; a key nothing
  describes, such as ``method.name``, shows its value's type); ``data.download``, which old configs still carry
  (the top-level ``download`` replaced it), is left out (:data:`HIDDEN`);
* ``keys method.lr``: that one key, in the default config (or with the group choices given beside it).
"""
from __future__ import annotations

import dataclasses
import sys

from .schema import all_keys
from .checks import bounds


def describe(group: str | None = None) -> list[tuple[str, str, str, str]]:
    """(key, type, default, help) for every schema key, or those of one group."""
    out = []
    for name, f in all_keys().items():
        if group and not (name == group or name.startswith(group + ".")):
            continue
        m = f.metadata
        kind = m["kind"] + (" | " + " | ".join(m["words"]) if m["words"] else "")
        if m["choices"]:
            kind = " | ".join(m["choices"])
        if m["low"] is not None or m["high"] is not None:
            kind += " " + bounds(m)
        if m["nullable"]:
            kind += " | null"
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        out.append((name, kind, "null" if default is None else str(default).lower() if isinstance(default, bool)
                    else str(default), m["help"]))
    return out


# keys a config still carries for old configs, left out of the listing (``keys KEY`` still describes them): the key that
# replaced each
HIDDEN = {"data.download": "download"}


_UNRESOLVED = object()


def _value_kind(v) -> str:
    """The type of a value no schema field or annotation describes, in :func:`~.args.describe_target`'s words ("":
    an interpolation that resolves only in a run)."""
    if v is _UNRESOLVED:
        return ""
    if v is None:
        return "null"
    for t, word in ((bool, "true or false"), (int, "an int"), (float, "a number"), (str, "a string"),
                    (list, "a list"), (dict, "a table (key: value, ...)")):
        if isinstance(v, t):
            return word
    return type(v).__name__


def _described(meta: dict) -> str:
    """:func:`~.args.describe_target`'s words for a schema field or an argument, ``(or null)`` where null is taken."""
    from .args import describe_target

    if meta.get("nullable") and "null" not in meta["words"]:
        meta = {**meta, "words": (*meta["words"], "null")}
    return describe_target(meta)


USAGE = ("usage: python -m fl_lightning.config.keys [GROUP | KEY | GROUP=NAME ...]   e.g. keys fl; keys method=fedmuon; "
         "keys method.lr; keys model=vit_tiny model.net")


def describe_config(choices: list[str], prefix: str) -> list[tuple[str, str, str, str]]:
    """(key, type, value, help) of every leaf under ``prefix`` in the config composed with ``choices``."""
    import os

    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from .args import target_info
    from .ranges import hint_meta
    from .schema import register

    register()
    conf = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "conf")
    with initialize_config_dir(config_dir=conf, version_base="1.3"):
        cfg = compose(config_name="config", overrides=choices)
    schema = all_keys()
    node = OmegaConf.select(cfg, prefix, default=None) if prefix else cfg
    if node is None:
        return []
    out = []
    feeds = _interpolated_arguments(cfg)  # method.lr -> (its meta, "fl_lightning.optim.Muon's lr")

    def value(parent, k) -> str:
        try:
            v = parent[k]
            return "null" if v is None else str(OmegaConf.to_container(v, resolve=True) if OmegaConf.is_config(v) else v)
        except Exception:  # an interpolation that resolves only in a run
            return str(parent._get_node(k)._value())

    def raw(parent, k):
        """The value, its interpolations resolved (:data:`_UNRESOLVED`: one that resolves only in a run)."""
        try:
            v = parent[k]
        except Exception:  # noqa: BLE001 - resolves only in a run: its type is not known here
            return _UNRESOLVED
        return OmegaConf.to_container(v, resolve=True) if OmegaConf.is_config(v) else v

    def walk(n, path: str) -> None:
        for k in n.keys() if OmegaConf.is_dict(n) else ():
            full = f"{path}.{k}" if path else str(k)
            child = n._get_node(k)
            if str(k).startswith("_") or full in HIDDEN:
                continue
            if child._is_interpolation() and isinstance(child._value(), str) and OmegaConf.is_dict(
                    OmegaConf.select(cfg, full, default=None)):
                out.append((full, "a config node", child._value(), f"the node {child._value()[2:-1]}: keys "
                            f"{child._value()[2:-1]}=<name> lists it"))
                continue
            if OmegaConf.is_dict(child) and not child._is_missing() and not child._is_none():
                walk(child, full)
                continue
            out.append(leaf(n, k, full))

    def leaf(n, k, full: str) -> tuple[str, str, str, str]:
        """One key: the schema's description, else its target's annotation, else the argument it feeds."""
        if full in schema:
            f = schema[full]
            return full, _described(f.metadata), value(n, k), f.metadata["help"]
        target = n.get("_target_") if OmegaConf.is_dict(n) else None
        info = target_info(target) if isinstance(target, str) else None
        kind, help_ = "", ""
        if info is not None and info[1] is not None and k in info[1].parameters:
            p = info[1].parameters[k]
            has = p.default is not p.empty
            meta = hint_meta(info[2].get(k), p.default if has else None, has)
            kind, help_ = (_described(meta) if meta else ""), f"argument of {target}"
        elif info is not None:
            help_ = f"read by {target}'s caller, not its constructor"
        elif full in feeds:
            meta, where = feeds[full]
            kind, help_ = _described(meta), f"sets {where}"
        if not kind:  # nothing declares it (a method's name, its comm formulas): the type of its value
            kind = _value_kind(raw(n, k))
        if full in HIDDEN:
            help_ = f"deprecated: use the top-level {HIDDEN[full]}" + (f"; {help_}" if help_ else "")
        return full, kind, value(n, k), help_

    if OmegaConf.is_dict(node):
        walk(node, prefix)
    else:
        parent, _, k = prefix.rpartition(".")
        out.append(leaf(OmegaConf.select(cfg, parent) if parent else cfg, k, prefix))
    return out


def _interpolated_arguments(cfg) -> dict:
    """``{key: (meta, "target's arg")}`` for every key that a constructor argument takes by interpolation (``lr:
    ${method.lr}``, ``${oc.select:method.beta,0.95}``): the argument's type and range describe the key."""
    import re

    from omegaconf import OmegaConf

    from .args import target_info
    from .ranges import hint_meta

    out = {}

    def walk(n) -> None:
        if not OmegaConf.is_dict(n):
            return
        target = n.get("_target_")
        info = target_info(target) if isinstance(target, str) else None
        for k in n.keys():
            child = n._get_node(k)
            if OmegaConf.is_dict(child) and not child._is_interpolation():
                walk(child)
            elif info is not None and info[1] is not None and k in info[1].parameters and child._is_interpolation():
                # ${method.lr}, ${oc.select:method.beta,0.95}, ${oc.select:method.aux_lr,${method.lr}}: the first key
                m = re.fullmatch(r"\$\{(?:oc\.select:([\w.]+)(?:,(?:[^{}]*|\$\{[^{}]*\}))?|([\w.]+))\}",
                                 str(child._value()))
                if m:
                    p = info[1].parameters[k]
                    has = p.default is not p.empty
                    meta = hint_meta(info[2].get(k), p.default if has else None, has)
                    if meta:
                        out.setdefault(m.group(1) or m.group(2), (meta, f"{target}'s {k}"))

    walk(cfg)
    return out


def main(argv: list[str]) -> int:
    if any(a in ("-h", "--help") for a in argv):
        print(USAGE)
        return 0
    choices = [a for a in argv if "=" in a]
    names = [a for a in argv if "=" not in a]
    if choices or (names and names[0] not in {k.split(".")[0] for k in all_keys()} | set(all_keys())
                   or names and "." in names[0] and names[0] not in all_keys()):
        prefix = names[0] if names else choices[0].split("=", 1)[0].split("/")[0]
        try:
            rows = describe_config(choices, prefix)
        except Exception as err:  # noqa: BLE001 - a choice that does not compose: one line
            print(f"error: keys: {' '.join(str(err).split())[:300]}; fix: {USAGE}", file=sys.stderr)
            return 2
        if not rows:
            print(f"error: keys: no key {prefix!r} in the config composed with {' '.join(choices) or 'the defaults'}; "
                  f"fix: {USAGE}", file=sys.stderr)
            return 2
        width = max(len(r[0]) for r in rows)
        for name, kind, default, help_ in rows:
            print(f"{name:<{width}}  {kind or '?'}  (value {default})" + (f"\n{'':<{width}}  {help_}" if help_ else ""))
        return 0
    group = names[0] if names else None
    rows = describe(group)
    if not rows:
        tops = sorted({k.split(".")[0] for k in all_keys()})
        print(f"error: no schema keys under {group!r}; groups and keys: {', '.join(tops)}", file=sys.stderr)
        return 2
    width = max(len(r[0]) for r in rows)
    for name, kind, default, help_ in rows:
        print(f"{name:<{width}}  {kind}  (default {default})\n{'':<{width}}  {help_}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
