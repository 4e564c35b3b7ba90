"""The config groups' members and the method's parts, checked on the composed config.

:func:`check_labels`: a group member's label (``data.partition.name``, ``method.name``) must belong to its
``_target_`` (a run labelled "foo" that partitions by Dirichlet is refused); :func:`check_parts`: every node under
``method.parts`` is a part (a ``_target_``) or null. Each failure is one line naming the full key and the fix.
"""
from __future__ import annotations

import difflib
import functools
import os
from collections.abc import Mapping

import yaml
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from ..errors import ConfigError

# ---------------------------------------------------------------------------------------------- labels and parts
_GROUP_WORDS = {"data": "dataset", "data/partition": "partition"}


def _shipped_conf() -> str:
    """This checkout's conf/ (the members the package ships)."""
    return os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "conf")


def conf_dirs() -> tuple[str, ...]:
    """The folders Hydra composes from: inside a Hydra app its ``file://`` config sources (conf/ and any
    ``hydra.searchpath`` folder), else this checkout's conf/."""
    try:
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
def group_members(dirs: tuple[str, ...], group: str) -> dict[str, tuple[str, tuple, bool]]:
    """``{file name: (its yaml's name, its identity, shipped)}`` for the members of ``group`` (``data/partition``) in
    ``dirs`` (shipped: from the package's conf/, not a ``hydra.searchpath`` folder); a member that extends another of
    its group (``defaults: [cnn_fedsmu, _self_]``) has the merged keys."""
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
    dirs = conf_dirs() if dirs is None else dirs
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
        members = group_members(tuple(dirs), group)
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
