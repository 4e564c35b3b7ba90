"""The config groups' members and the method's parts, checked on the composed config.

:func:`check_labels`: a group member's label (``data.partition.name``, ``method.name``) must belong to its
``_target_`` (a run labelled "foo" that partitions by Dirichlet is refused); :func:`check_parts`: every node under
``method.parts`` is a part (a ``_target_``) or null. Each failure is one line naming the full key and the fix.
:func:`drop_left_behind`: what a command line's group choice leaves of the member it replaced (an experiment's
``data.partition.alpha`` under ``data/partition=iid``) is dropped, not refused.
"""
from __future__ import annotations

import difflib
import functools
import logging
import os
from collections.abc import Mapping

import yaml
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf, open_dict

from ..errors import ConfigError

log = logging.getLogger(__name__)

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
    nodes, shipped = _member_nodes(dirs, group)
    subgroups = _subgroups(_group_folders(dirs), group)
    return {stem: (str(node.get("name", stem)), _identity(node, subgroups), stem in shipped)
            for stem, node in nodes.items()}


@functools.lru_cache(maxsize=None)
def _member_nodes(dirs: tuple[str, ...], group: str) -> tuple[dict[str, dict], frozenset]:
    """(``{file name: its yaml's keys, merged with the members of its group it extends}``, the shipped ones); the
    nodes are shared: read them, never change them."""
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

    return {stem: merged(stem) for stem in raw}, frozenset(shipped)


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
                              f"choose the {word} with {group}={node} in place of {key}={node} (a / chooses a "
                              f"config, a . sets a key)")
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


def _choices(overrides) -> dict[str, str]:
    """The group choices of a command line, ``{group: member}`` (``data/partition=iid``; a sweep's job has one)."""
    groups = _group_folders(conf_dirs())
    out = {}
    for ov in overrides or ():
        name, sep, value = str(ov).lstrip("+").partition("=")
        if sep and name in groups and value and "," not in value and not value.startswith(("glob(", "range(")):
            out[name] = value
    return out


def _typed_keys(overrides, groups) -> set[str]:
    """The keys a command line sets or deletes (``data.partition.alpha=0.1``, ``~data.partition.alpha``), not its
    group choices."""
    keys = {str(ov).split("=", 1)[0].lstrip("+~") for ov in overrides or ()}
    return {k for k in keys if k not in groups and "/" not in k and "@" not in k}


def drop_left_behind(cfg: DictConfig, overrides, skip: Mapping[str, tuple[str, ...]] | None = None,
                     *, target_info) -> list[str]:
    """What a command line's group choice leaves behind, dropped from ``cfg``: Hydra merges an experiment's values
    for a group's node (``data: {partition: {alpha: 0.8}}``) after the group's member, whichever member the command
    line chose, so ``experiment=glue_lora data/partition=iid`` would hand the Dirichlet concentration to the IID
    partition, which takes none. A key is dropped when the command line chose that node's member (``data/partition=
    iid``, ``model=cnn``), the member's own yaml does not have it, its ``_target_`` does not take it (no ``**kwargs``),
    and the command line did not set it (``data/partition=iid data.partition.alpha=0.1`` is still refused: the user
    typed it). ``skip``: keys of a node (by its full key) that its builder consumes (``data``'s batch sizes). Returns
    the dropped keys (``data.partition.alpha``), each said in the log; the run is one of another setting than an
    experiment's ``paper.setting`` that names one (:func:`.paper_block.read_paper` accepts it, the report shows it).
    ``target_info``: :func:`.args.target_info` (handed over: args imports this file)."""

    choices = _choices(overrides)
    if not choices:
        return []
    dirs = conf_dirs()
    groups = _group_folders(dirs)
    typed = _typed_keys(overrides, groups)
    dropped: list[str] = []
    for group, member in choices.items():
        own = _member_nodes(dirs, group)[0].get(member)
        node_key = group.replace("/", ".")
        node = OmegaConf.select(cfg, node_key, default=None, throw_on_missing=False)
        if own is None or not OmegaConf.is_dict(node):  # a member Hydra found elsewhere: nothing known to drop
            continue
        nested = {g[len(group) + 1:].replace("/", ".") for g in groups if g.startswith(group + "/")}
        stack = [("", node, own)]
        while stack:  # the node and its nested _target_ nodes (a model's net, a method's parts), not a nested group's
            rel, sub, mine = stack.pop()
            info = target_info(sub["_target_"]) if isinstance(sub.get("_target_"), str) else None
            sig = info[1] if info is not None else None
            takes_any = sig is None or any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())
            for k in [str(k) for k in sub.keys()]:
                path = f"{rel}.{k}" if rel else k
                full = f"{node_key}.{path}"
                child = sub._get_node(k)
                if path in nested or k.startswith("_"):
                    continue
                if OmegaConf.is_dict(child) and not child._is_interpolation() and ("_target_" in child or sig is None):
                    stack.append((path, child, mine.get(k) if isinstance(mine.get(k), dict) else {}))
                    continue
                if takes_any or k in sig.parameters or k == "name" or k in mine or \
                        k in (skip or {}).get(full.rpartition(".")[0], ()) or \
                        any(full == t or full.startswith(t + ".") for t in typed):
                    continue  # the member's own (a bad one is refused), the builder's, or typed: checked as it is
                value = OmegaConf.to_container(sub, resolve=False)[k]
                with open_dict(sub):
                    del sub[k]
                dropped.append(full)
                log.info("%s=%s dropped: set for another %s than %s=%s, which takes no %s", full, value,
                         _GROUP_WORDS.get(group, group), group, member, k)
    return dropped


def _text(v) -> str:
    """A value as the command line writes it."""
    from .checks import value_text

    return value_text(v)


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
        meant = " ".join(f"{'' if k in parts[near[0]] else '+'}{key}.parts.{near[0]}.{k}={_text(v)}"
                         for k, v in p.items() if not isinstance(v, Mapping)) if near else ""
        fix = (f"did you mean {key}.parts.{near[0]}? ({meant + '; ' if meant else ''}{new})" if near else
               f"use one of the method's parts ({key}.parts.{(real or ['<part>'])[0]}.<key>=...); {new}")
        raise ConfigError(full, f"is not a part of method {method.get('name')!r} (no _target_; its parts: "
                                f"{', '.join(real) or 'none'})", fix)
