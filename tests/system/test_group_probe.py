"""Every member of every config group (each conf/model, data, data/partition, method, optimizer and server_opt yaml,
found by listing conf/, so a new member is covered without an edit here) × each of that member's own keys ×
{abc, null, -1, 0, 10**12, and for a list key its first item alone}, plus one misspelled ``+<group>.<key>`` per
member (issue 32, "Hardening, second pass"), a new node without ``_target_`` under ``method.parts`` per method, and per
member with a ``name`` and a ``_target_`` (models, datasets, partitions) another member's label.

Each case must reach its verdict before anything is built: :func:`fl_lightning.config.check_run` (the schema, and every
``_target_`` node's keys against its constructor's signature, whose ``typing.Annotated`` ranges bound sizes such as
``model.net.hidden`` before any allocation) refuses it with one line naming the key the user typed and a fix, or it
is one of the documented valid values below. For the method, optimizer and server_opt groups a value the validation
accepts is also given to :func:`fl_lightning.strategies.build_strategy` (cheap: the local optimizer is tried on a 2×2
tensor, a server optimizer on no tensors), whose refusals must name the key too. Where a fix names values
(``e.g. model.net.layers=2``, ``did you mean X? (X=1)``), they are set and the error on that key (or on a key the
fix wrote) must go away (issue 65: a fix that fails when followed is a defect). Models and datasets are
never built (no weights, no files), so the probe runs in about a minute."""
from __future__ import annotations

import fnmatch
import os
import re
import resource

import pytest
from omegaconf import OmegaConf, open_dict

from fl_lightning.config import value_text
from tests.helpers.cli import CONF, FAST, make_cfg

pytestmark = pytest.mark.slow

# group folder in conf/ -> the config node its members fill; companions a member needs to compose or to be used
GROUPS = {"model": "model", "data": "data", "data/partition": "data.partition", "method": "method",
          "optimizer": "optimizer", "server_opt": "server_opt", "dp": "dp"}
COMPANIONS = {"server_opt": ["method=fedadam"]}  # fedavg has no server optimizer: fedadam reads ${server_opt}
BUILT = ("method", "optimizer", "server_opt")  # groups whose accepted values also go through build_strategy
HUGE = 10**12
VALUES = {"abc": "abc", "null": None, "-1": -1, "0": 0, "huge": HUGE}  # + "item" (a list key's first item alone)

# The documented valid values: (pattern of the full key, the values, why). A value listed here may be accepted; any
# other value must be refused (a listed value may be refused too where a member's constructor does not take it, e.g.
# Lion's lr=0, but then in one line naming the key). Labels: abc, null, -1, 0, huge (10**12), item (a list's first).
ANY = set(VALUES) | {"item"}
NAMES = {"abc", "-1", "0", "huge"}  # any string; a number typed on the command line is read as its name
FLOATS = "a float hyperparameter: no size, nothing allocated; a divergent run stops with the non-finite-loss error"
VALID = [
    ("method.name", NAMES, "a label in summary.json and the logs (no _target_ to disagree with: the parts have them); "
                           "model.name, data.name, data.partition.name must be a label of their _target_'s member"),
    ("method.comm.*", ANY, "the bytes a method declares: read by tests/system/test_methods.py only"),
    ("*root", NAMES, "a folder (relative to the cwd): read when the data is built, a missing one is a one-line error"),
    ("data.cache_dir", NAMES | {"null"}, "a folder for token caches (null: none / a temporary one)"),
    ("data.tokenizer_path", NAMES | {"null"}, "a tokenizer folder, read when the data is built (null: the model's)"),
    ("data.*_files", NAMES, "a file pattern under data.root, matched when the data is built"),
    ("model.net.pretrained_path", NAMES | {"null"}, "a weights file or folder, read when the model is built "
                                                    "(null: random initialisation / none)"),
    *[(f"data.partition.{k}", {"null"}, "a Flower partitioner's argument (data/partition=flower): null = not given, "
       "the class's default") for k in ("partition_by", "alpha", "min_partition_size", "self_balancing",
                                         "num_classes_per_partition", "class_assignment_mode", "partition_sizes",
                                         "num_shards_per_partition", "shard_size", "keep_incomplete_shard",
                                         "strictness", "group_size", "mode", "sort_unique_ids", "shuffle")],
    ("model.net.glove_path", NAMES | {"null"}, "a GloVe file, read when the model is built (null: random embeddings)"),
    ("*mu_block", NAMES, "a parameter name, looked up in the model when the run starts (auto: the last hidden bias)"),
    ("method.parts.mu.block", NAMES, "a parameter name, looked up in the model when the run starts"),
    # zero / null meaning "off" or "none"
    ("*lr", {"0"}, "a zero step: the model stays where it is (refused where the method divides by it)"),
    ("*.momentum", {"0"}, "no momentum"),
    ("*weight_decay", {"0"}, "no weight decay"),
    ("*weight_decay", {"null"}, "Muon's aux_weight_decay: the Muon groups' weight decay"),
    ("method.grad_clip", {"null"}, "no clipping"),
    ("*server_lr", {"0"}, "a frozen global model"),
    ("*min_size", {"0"}, "no minimum client size"),
    ("data.val_fraction", {"0"}, "no validation split (the default)"),
    ("*beta", {"0"}, "a moment with no memory (the current value only)"),
    ("*beta1", {"0"}, "a moment with no memory (the current value only)"),
    ("*beta2", {"0"}, "a moment with no memory (the current value only)"),
    ("*server_momentum", {"0"}, "no server momentum"),
    ("*global_momentum", {"0"}, "no global momentum"),
    ("*shampoo_beta", {"0", "null"}, "0: the last gradient's factors only; null: SOAP uses beta2"),
    ("*eps", {"0"}, "no epsilon (the denominators stay positive by construction or the tau floor)"),
    ("*v0", {"0"}, "v starts at zero (torch / Flower / the authors' Keras code)"),
    ("*aux_lr", {"null"}, "the Muon groups' lr"),
    ("*ns_steps", {"0"}, "no Newton-Schulz iteration: the direction normalised by its Frobenius norm"),
    ("*ns_dtype", {"null"}, "fp32 (fp64 stays fp64)"),
    ("method.exclude", {"item"}, "one excluded kind"),
    ("*.alpha", {"0"}, "no alignment term (the weight of the global direction is 0)"),
    ("*pac_beta", {"0"}, "no alignment term (the weight of the global direction is 0)"),
    ("method.alpha", {"null"}, "SCALLION's alpha from the codec's variance omega(d)"),
    ("*scallion.alpha", {"null"}, "SCALLION's alpha from the codec's variance omega(d)"),
    ("*lower", {"0"}, "no lower clipping threshold"),
    ("*.mu", {"0"}, "no proximal term (FedAvg)"),
    ("*gamma2", {"0"}, "no weight decay (FedSMU's gamma2)"),
    ("*storm_c", {"0"}, "no STORM correction term"),
    ("*storm.c", {"0"}, "no STORM correction term"),
    ("*storm_omega", {"0"}, "the step size schedule k / t^(1/3) from t = 0"),
    ("*storm.omega", {"0"}, "the step size schedule k / t^(1/3) from t = 0"),
    ("*v_decay", {"0"}, "no second-moment memory"),
    ("*sign_zero", {"0"}, "ternary signs (torch.sign)"),
    ("*.codec", {"null"}, "no compression (dense)"),
    ("*.server_opt", {"null"}, "no server optimizer: the plain server_lr step"),
    ("*.codec.min", {"0"}, "clamp at zero (the default)"),
    ("data.augment", {"null"}, "the dataset's default augmentation"),
    ("data.delta", {"0"}, "no heterogeneity (every client shares the optimum)"),
    ("data.sigma", {"0"}, "noise-free gradients"),
    ("data.nu", {"null"}, "only read with noise=student_t"),
    ("data.*seed", {"0"}, "a seed"),
    ("data.max_train", {"null"}, "every training row"),
    ("data.max_*_shards", {"null"}, "every matching shard"),
    ("data.partition.samples_per_client", {"null"}, "len(train) / fl.num_clients"),
    ("model.net.hidden", {"item"}, "mlp: one hidden layer of that width"),
    ("model.net.padding", {"0"}, "no padding (the CIFAR-10 count)"),
    ("model.net.*dropout", {"0"}, "no dropout"),
    ("model.net.drop_path", {"0"}, "no stochastic depth"),
    ("model.net.dropout", {"null"}, "the backbone config's own dropout"),
    ("model.net.vocab_size", {"null"}, "the tokenizer's size"),
    ("model.metrics", {"null"}, "the dataset's metrics"),
    ("*max_precond_dim", {"huge"}, "every dimension is preconditioned (the bound only limits which are)"),
    # a float without a natural upper bound: huge is a (bad but harmless) hyperparameter, not a size
    *[(pat, {"huge"}, FLOATS) for pat in (
        "*lr", "*weight_decay", "*tau", "*eps", "*.rho", "*_rho", "*gamma", "*gamma1", "*gamma2", "*v0", "*.mu",
        "*.c", "*storm_c", "*omega", "*.k", "*storm_k", "*upper", "*lower", "*_exponent", "*.codec.min", "data.L",
        "data.kappa", "data.delta", "data.sigma", "data.nu", "model.net.lora_alpha", "model.net.rms_norm_eps",
        "*damping", "*.scale")],
    *[(f"method.parts.{part}", {"null"}, "a part the method switches off (its yaml's own value)")
      for part in ("alignment", "theta", "aggregation")],
    ("method.grad_clip", {"huge"}, "a clipping norm no gradient reaches: no clipping"),
    ("*_exponent", {"-1", "0"}, "BiClip's threshold schedule t^exponent: 0 constant, < 0 shrinking"),
    ("method.gamma", {"0"}, "FedCM / FedLADA: no weight on the global direction"),
    ("data.partition.alpha", {"huge"}, "Dirichlet(alpha) with a huge alpha: (nearly) iid proportions"),
    # dp (issue 67): null means "not given" (z from the target, δ from N, no budget, σ_b from m); a huge clip is one
    # no upload reaches; a huge z, ε or budget is a (useless but harmless) privacy setting, nothing allocated
    ("dp.noise_multiplier", {"null", "0", "huge"}, "null: z calibrated for dp.target_epsilon (one of the two is "
                                                   "needed, checked when the run is built); 0: no noise"),
    ("dp.target_epsilon", {"null", "huge"}, "null: z given by dp.noise_multiplier; huge: a target any z meets"),
    ("dp.delta", {"null"}, "1/num_clients^1.1"),
    ("dp.max_epsilon", {"null", "huge"}, "no budget / one the run never reaches"),
    ("dp.count_noise", {"null", "huge"}, "max(m/20, z) / a count that says nothing (C stays put)"),
    ("dp.clip", {"huge"}, "a clip no upload reaches: no clipping"),
    ("dp.target_quantile", {"0"}, "C chases the smallest upload norm"),
    ("*every", {"huge"}, "a Hessian refresh period longer than the run: computed once"),
    ("data.max_train", {"huge"}, "a cap above the data's size: every row"),
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
    """The member's keys (its yaml's leaves after composition, unresolved), without a nested group's
    (data.partition)."""
    node = OmegaConf.select(cfg, node_key)
    if node is None:  # a member that sets the node to null (dp=none): no keys
        return []
    plain = OmegaConf.to_container(node, resolve=False)
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
    from fl_lightning.config import check_run as validate
    from fl_lightning.errors import FLError
    from fl_lightning.config.checks import check

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
    """Follow the fix where it names a concrete change of config keys (issue 65; the alternatives of
    tests/helpers/fixes.py, e.g. ``set it to ..., e.g. model.net.layers=2``, ``set e.g. fl.local_steps=5
    fl.local_epochs=null``, ``did you mean X? (X=1; ...)``): each alternative's overrides are set, and what is
    still wrong then with ``key`` or with a key the fix wrote is returned (None: the error went away). A group
    choice (``model=mlp``) is composed, not set: not followed here (test_fix_lines.py follows those). Each fix is
    followed once per key (the bad values of a key share their fix)."""
    from contextlib import ExitStack

    from tests.helpers.fixes import _PLACEHOLDER, _alternatives, _bare, key_of, tokens

    for alt in _alternatives(err.fix):
        toks = [t for t in tokens(_bare(alt).partition(" in place of ")[0])
                if not _PLACEHOLDER.search(t.split("=", 1)[1]) and "." in key_of(t) and "/" not in key_of(t)
                and not t.startswith(("hydra.", "~"))]
        if not toks or (key, tuple(toks)) in _FOLLOWED:
            continue
        _FOLLOWED.add((key, tuple(toks)))
        written = {key_of(t) for t in toks}
        with ExitStack() as stack:
            for t in toks:
                stack.enter_context(_Set(cfg, key_of(t), _parse(key_of(t), t.split("=", 1)[1])))
            again = verdict(cfg, group)
        if again is not None and (_names(again, key) or again.key.split(" (via ")[0] in written):
            return f"{' '.join(toks)} -> {again}"
    return None


_FOLLOWED: set = set()
CASES = [0]  # cases tried in this session (for the record)
# (key, its yaml value, the constructor it goes to): a method that inherits fedavg's keys unchanged is not probed on
# them again (the verdict is the same); every key of a new member is
_PROBED: set = set()


def _numeric(raw) -> bool:
    """A key whose shipped value is a number (or an interpolation, which may be one): the huge value is probed."""
    return (isinstance(raw, (int, float)) and not isinstance(raw, bool)) or (isinstance(raw, str) and "${" in raw) or (
        isinstance(raw, list) and any(_numeric(v) for v in raw)) or raw is None


def _cases():
    for group in GROUPS:
        for m in members(group):
            yield pytest.param(group, m, id=f"{group}={m}")


def _new_part_and_relabel(cfg, group: str, member: str, node_key: str) -> list[str]:
    """A new node without ``_target_`` under ``method.parts`` (a misspelled part name, then an unrelated one) must be
    one line naming that node, the closest part first; a node with a ``name`` and a ``_target_`` relabelled as another
    member of its group (one with another ``_target_``) must be refused naming ``<node>.name``, and the fix's
    ``<node>.name=<its own>`` must make the error go away."""
    from fl_lightning.config.groups import conf_dirs, group_members

    bad = []
    if group == "method":
        real = [n for n, p in OmegaConf.to_container(cfg.method.parts, resolve=False).items()
                if isinstance(p, dict) and "_target_" in p]
        near_part = f"method.parts.{real[0]}"
        for new, near in ((misspelled(near_part), near_part), ("method.parts.nosuch", None)):
            with _Set(cfg, new, {"x": 1}):
                err = verdict(cfg, group, [f"+{new}.x=1"])
            CASES[0] += 1
            if err is None or "\n" in str(err) or err.key != new or (near and not err.fix.startswith(
                    f"did you mean {near}?")) or f"+{new}._target_=" not in err.fix:
                bad.append(f"+{new}.x=1 (no _target_): should be one line naming {new}"
                           f"{' and suggesting ' + near if near else ''}: {err}")
    node = OmegaConf.select(cfg, node_key)
    if OmegaConf.is_dict(node) and "name" in node and "_target_" in node:
        members = group_members(conf_dirs(), group)
        own = members[member][1]
        other = next((m for m in members if members[m][1] != own), None)
        if other is not None:
            key = f"{node_key}.name"
            with _Set(cfg, key, other):
                err = verdict(cfg, group)
            CASES[0] += 1
            if err is None or err.key != key or f"{group}={other}" not in err.fix:
                bad.append(f"{key}={other} (another member's label): should be refused, fix {group}={other}: {err}")
            elif _follow_fix(cfg, group, key, err):
                bad.append(f"{key}={other}: following the fix ({err.fix}) still fails")
    return bad


@pytest.mark.parametrize("group,member", list(_cases()))
def test_every_key_of_every_member_refuses_bad_values_in_one_line(group, member):
    node_key = GROUPS[group]
    cfg = make_cfg(FAST + COMPANIONS.get(group, []) + [f"{group}={member}"])
    base = verdict(cfg, group)
    assert base is None, f"{group}={member} does not validate as shipped: {base}"
    bad: list[str] = []
    keys = own_keys(cfg, node_key)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB; nothing a case does may allocate by its value
    for key, raw in keys:
        parent = key.rpartition(".")[0]
        seen = (key, repr(raw), str(OmegaConf.select(cfg, f"{parent}._target_", default=None)))
        if seen in _PROBED:
            continue
        _PROBED.add(seen)
        values = dict(VALUES)
        if not _numeric(raw):  # a name or a flag: 10**12 is refused as -1 is
            del values["huge"]
        if isinstance(raw, list) and raw:
            values["item"] = OmegaConf.to_container(OmegaConf.select(cfg, key), resolve=True)[0]
        for label, value in values.items():
            with _Set(cfg, key, value):
                err = verdict(cfg, group)
            CASES[0] += 1
            if err is None:
                if not _valid(key, label):
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
            err = verdict(cfg, group, [f"+{typo}={value_text(value)}"])
        CASES[0] += 1
        if err is None:
            bad.append(f"+{typo} accepted")
        elif not _names(err, typo) or real not in err.fix:
            bad.append(f"+{typo}: should name it and suggest {real}: {err}")
        else:  # its fix, followed: the typed value under the key meant, without the typo (no + on a key there is)
            from tests.helpers.fixes import tokens

            meant = [t for t in tokens(err.fix) if t.split("=", 1)[0] == real]
            if not meant:
                bad.append(f"+{typo}: the fix does not write the override meant ({real}=...): {err.fix}")
            else:
                with _Set(cfg, real, _parse(real, meant[0].split("=", 1)[1])):
                    again = verdict(cfg, group)
                if again is not None and _names(again, real):
                    bad.append(f"+{typo}: following the fix ({meant[0]}) still fails: {again}")
    bad += _new_part_and_relabel(cfg, group, member, node_key)
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak
    assert grown < 256 * 1024, f"{group}={member}: the cases raised the peak memory by {grown // 1024} MiB"
    assert not bad, f"{group}={member}: {len(bad)} bad cases:\n" + "\n".join(bad)


@pytest.mark.parametrize("overrides,key", [
    (["data=digits", "data.test_size=1000000000000"], "data.test_size"),
    (["data/partition=shards", "data.partition.shards_per_client=0"], "data.partition.shards_per_client"),
    (["method=fedprox", "method.mu=-1"], "method.mu"),
    (["optimizer=soap", "optimizer.precondition_frequency=0"], "optimizer.precondition_frequency"),
    (["method=fedadam", "server_opt=yogi", "server_opt.beta1=abc"], "server_opt.beta1"),
    (["model=mlp", "model.net.hidden=[128,1000000000000]"], "model.net.hidden"),
    (["model=cnn", "+model.net.hiden=5"], "model.net.hiden"),
])
def test_a_sample_through_the_cli(overrides, key, tmp_path):
    """What the probe checks at validation is what ``python train.py`` prints: one line, exit 2, the key typed."""
    from tests.helpers.cli import cli_in_process

    code, err = cli_in_process(FAST + overrides, tmp_path / "run")
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith(f"error: config error: {key}"), err
    assert "; fix: " in lines[0], lines[0]
