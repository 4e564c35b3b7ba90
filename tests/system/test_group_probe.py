"""Every member of every config group (each conf/model, data, data/partition, method, optimizer and server_opt yaml,
found by listing conf/, so a new member is covered without an edit here) × each of that member's own keys ×
{abc, null, -1, 0, 10**12, and for a list key its first item alone}, plus one misspelled ``+<group>.<key>`` per
member (issue 32, "Hardening, second pass").

Each case must reach its verdict before anything is built: :func:`fl_lightning.build.validate` (the schema, and every
``_target_`` node's keys against its constructor's signature, whose ``typing.Annotated`` ranges bound sizes such as
``model.net.hidden`` before any allocation) refuses it with one line naming the key the user typed and a fix, or it
is one of the documented valid values below. For the method, optimizer and server_opt groups a value the validation
accepts is also given to :func:`fl_lightning.strategies.build_strategy` (cheap: the local optimizer is tried on a 2×2
tensor, a server optimizer on no tensors), whose refusals must name the key too. Where a fix names a value
(``e.g. model.net.layers=2``), that value is set and the error on that key must go away. Models and datasets are
never built (no weights, no files), so the probe runs in about a minute."""
from __future__ import annotations

import fnmatch
import os
import re

import pytest
from omegaconf import OmegaConf, open_dict

from fl_lightning.config import _override_text
from tests.helpers.cli import CONF, FAST, make_cfg

pytestmark = pytest.mark.slow

# group folder in conf/ -> the config node its members fill; companions a member needs to compose or to be used
GROUPS = {"model": "model", "data": "data", "data/partition": "data.partition", "method": "method",
          "optimizer": "optimizer", "server_opt": "server_opt"}
COMPANIONS = {"server_opt": ["method=fedadam"]}  # fedavg has no server optimizer: fedadam reads ${server_opt}
BUILT = ("method", "optimizer", "server_opt")  # groups whose accepted values also go through build_strategy
HUGE = 10**12
VALUES = {"abc": "abc", "null": None, "-1": -1, "0": 0, "huge": HUGE}  # + "item" (a list key's first item alone)

# The documented valid values: (pattern of the full key, the values, why). Everything else must be refused.
ANY = set(VALUES) | {"item"}
VALID = [
    ("*.name", {"abc", "-1", "0", "huge"}, "a label in summary.json and the logs (not a target argument)"),
    ("method.comm.*", ANY, "the bytes a method declares: read by tests/system/test_methods.py only"),
    ("*.lr", {"0"}, "a zero step: the model stays where it is"),
    ("method.aux_lr", {"0"}, "a zero step for the non-matrix parameters"),
    ("optimizer.aux_lr", {"0"}, "a zero step for the non-matrix parameters"),
    ("*.momentum", {"0"}, "no momentum"),
    ("*weight_decay", {"0"}, "no weight decay"),
    ("method.grad_clip", {"null"}, "no clipping"),
    ("method.parts.aggregation.server_lr", {"0"}, "a frozen global model"),
    ("method.server_lr", {"0"}, "a frozen global model"),
    ("*.min_size", {"0"}, "no minimum client size"),
    ("*.max_precond_dim", {"huge"}, "every dimension is preconditioned (the bound only limits which are)"),
]


def _valid(key: str, value: str) -> bool:
    return any(fnmatch.fnmatchcase(key, pat) and value in vals for pat, vals, _ in VALID)


def members(group: str) -> list[str]:
    return sorted(f[:-5] for f in os.listdir(os.path.join(CONF, group)) if f.endswith(".yaml"))


def _leaves(node, prefix: str) -> list[tuple[str, object]]:
    if isinstance(node, dict):
        return [kv for k, v in node.items() for kv in _leaves(v, f"{prefix}.{k}")]
    return [(prefix, node)]


def own_keys(cfg, node_key: str) -> list[tuple[str, object]]:
    """The member's keys (its yaml's leaves after composition, unresolved), without a nested group's (data.partition)."""
    plain = OmegaConf.to_container(OmegaConf.select(cfg, node_key), resolve=False)
    if node_key == "data":
        plain.pop("partition", None)
    return _leaves(plain, node_key)


def misspelled(key: str) -> str:
    """``key`` with its last part misspelled (two letters swapped, else one dropped): a key near a real one."""
    parent, _, leaf = key.rpartition(".")
    i = next((j for j in range(1, len(leaf) - 1) if leaf[j] != leaf[j + 1] and leaf[j].isalpha()
              and leaf[j + 1].isalpha()), None)
    bad = leaf[:i] + leaf[i + 1] + leaf[i] + leaf[i + 2:] if i is not None else leaf + "x"
    return f"{parent}.{bad}"


def verdict(cfg, group: str, overrides: list[str] | None = None):
    """None if ``cfg`` passes validation (and, for the BUILT groups, build_strategy), else the FLError raised;
    ``overrides``: the command line's (``cli.run`` checks that a ``method.X`` one is read by something)."""
    from fl_lightning.build import validate
    from fl_lightning.errors import FLError
    from fl_lightning.schema import check

    try:
        if overrides:
            check(cfg, overrides)
        validate(cfg)
        if group in BUILT:
            from fl_lightning.strategies import build_strategy

            build_strategy(cfg.method)
    except FLError as err:
        return err
    return None


class _Set:
    """Set ``key`` to ``value`` in the composed config for the block (adding it if absent), then put it back."""

    def __init__(self, cfg, key: str, value):
        self.cfg, self.key, self.value = cfg, key, value

    def __enter__(self):
        parent_key, _, self.leaf = self.key.rpartition(".")
        self.parent = OmegaConf.select(self.cfg, parent_key)
        raw = OmegaConf.to_container(self.parent, resolve=False)
        self.had, self.old = self.leaf in raw, raw.get(self.leaf)
        with open_dict(self.parent):
            self.parent[self.leaf] = self.value
        return self

    def __exit__(self, *exc):
        with open_dict(self.parent):
            if self.had:
                self.parent[self.leaf] = self.old
            else:
                del self.parent[self.leaf]


def _parse(key: str, text: str):
    """A command-line value as Hydra parses it (``2`` -> 2, ``[0.9,0.99]`` -> a list, ``null`` -> None)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create().parse_override(f"{key}={text}").value()


def _names(err, key: str) -> bool:
    """The message names the key the user typed (itself, or as the source of an interpolated value)."""
    return err.key.split(" (via ")[0] == key


def _follow_fix(cfg, group: str, key: str, err) -> str | None:
    """If the fix names a value for ``key`` (``... e.g. key=VALUE``), set it: what is still wrong with ``key`` then
    (None: the error went away)."""
    m = re.search(rf"(?<![\w.]){re.escape(key)}=(\S+?)(?=[\s;)]|$)", err.fix)
    if not m:
        return None
    with _Set(cfg, key, _parse(key, m.group(1))):
        again = verdict(cfg, group)
    return str(again) if again is not None and _names(again, key) else None


def _cases():
    for group in GROUPS:
        for m in members(group):
            yield pytest.param(group, m, id=f"{group}={m}")


@pytest.mark.parametrize("group,member", list(_cases()))
def test_every_key_of_every_member_refuses_bad_values_in_one_line(group, member):
    node_key = GROUPS[group]
    cfg = make_cfg(FAST + COMPANIONS.get(group, []) + [f"{group}={member}"])
    base = verdict(cfg, group)
    assert base is None, f"{group}={member} does not validate as shipped: {base}"
    bad: list[str] = []
    keys = own_keys(cfg, node_key)
    for key, raw in keys:
        values = dict(VALUES)
        if isinstance(raw, list) and raw:
            values["item"] = OmegaConf.to_container(OmegaConf.select(cfg, key), resolve=True)[0]
        for label, value in values.items():
            with _Set(cfg, key, value):
                err = verdict(cfg, group)
            if _valid(key, label):
                if err is not None:
                    bad.append(f"{key}={value!r} is documented valid but refused: {err}")
                continue
            if err is None:
                bad.append(f"{key}={value!r} accepted")
                continue
            msg = str(err)
            if "\n" in msg or not msg.startswith("config error: ") or not getattr(err, "fix", ""):
                bad.append(f"{key}={value!r}: not a one-line config error with a fix: {msg}")
            elif not _names(err, key):
                bad.append(f"{key}={value!r}: names {err.key!r}, not the key typed: {msg}")
            else:
                still = _follow_fix(cfg, group, key, err)
                if still:
                    bad.append(f"{key}={value!r}: following the fix ({err.fix}) still fails: {still}")
    real = next((k for k, _ in keys if not k.rsplit(".", 1)[-1].startswith("_") and k.rsplit(".", 1)[-1] != "name"
                 and not k.startswith("method.comm.")), None)
    if real is not None:
        typo = misspelled(real)
        value = OmegaConf.to_container(OmegaConf.select(cfg, real.rpartition(".")[0]), resolve=True)[
            real.rpartition(".")[2]]
        with _Set(cfg, typo, value):
            err = verdict(cfg, group, [f"+{typo}={_override_text(value)}"])
        if err is None:
            bad.append(f"+{typo} accepted")
        elif not _names(err, typo) or real not in err.fix:
            bad.append(f"+{typo}: should name it and suggest {real}: {err}")
    assert not bad, f"{group}={member}: {len(bad)} bad cases:\n" + "\n".join(bad)
