"""Every key of the composed default config × {abc, null, -1, 0} through the CLI (issue "Reliability" item 3):
each case is a one-line error naming the key (exit 2) or one of the documented valid values below, where the run
then trains — never a traceback, never a value silently replaced; a refusal's fix that names a concrete change gets
the line past that check when followed (issue 65). Runs in-process (train.py's checks, the Hydra composition and
``cli.run``) with one short round, so the ~240 cases take about a minute."""
from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from tests.helpers.cli import FAST, cli_in_process, make_cfg
from tests.helpers.fixes import built_verdict, fix_defects, verdict

pytestmark = pytest.mark.slow

BASE = FAST + ["fl.rounds=1", "fl.local_steps=1"]
VALUES = ["abc", "null", "-1", "0"]
LABELS = {"abc", "-1", "0"}  # any non-null value names a method in outputs (method.name: no _target_ to disagree with)
# the documented valid values (docs/reliability.md, "Bad values"): everything else must be refused in one line
VALID = {
    "optimizer.lr": {"0"}, "method.lr": {"0"},  # a zero step: the global model stays at its initial weights
    "optimizer.momentum": {"0"}, "method.momentum": {"0"},  # off
    "optimizer.weight_decay": {"0"}, "method.weight_decay": {"0"},  # off
    "method.grad_clip": {"null"},  # no clipping
    "method.parts.aggregation.server_lr": {"0"},  # a frozen global model
    "method.name": LABELS,  # model.name, data.name, data.partition.name: a label its _target_'s member lacks is refused
    # the bytes a method declares it sends: read by tests/system/test_methods.py only; runs measure their own bytes
    "method.comm.uplink": set(VALUES), "method.comm.downlink": set(VALUES),
    "data.partition.min_size": {"0"},  # no minimum client size
    "data.val_fraction": {"0"},  # no validation set (the default)
    "seed": {"0"}, "fl.local_epochs": {"null"}, "fl.lr_min_factor": {"0"}, "fl.warmup_rounds": {"0"},
    "store.offload_dir": {"null", "abc", "-1", "0"},  # null: in memory; else a folder (relative to the cwd)
    "resume": {"null"}, "stop_after_rounds": {"null"}, "tables": {"null"},  # no lookup tables (the default)
    "label": set(VALUES), "paper": {"null"}, "objective": {"null"},  # any name (null: the method's); no paper numbers (the default)
    "checkpoint.background_mb": {"0"},  # every checkpoint written before the next round
    "checkpoint.compact": {"0"},  # never rewrite older client states
}


NAMED_AS = {"data.partition._target_": "data.partition"}  # "no partitioner": the message names the group to add


def _leaves(node, prefix=""):
    if isinstance(node, dict):
        return [k for key, v in node.items() for k in _leaves(v, f"{prefix}{key}.")]
    return [prefix[:-1]]


# run_dir: Hydra's output folder; server_opt: a group fedavg does not use; logger: no logger by default (a logger's
# folders and names: tests/unit/loop/test_loggers.py)
KEYS = [k for k in _leaves(OmegaConf.to_container(make_cfg(BASE), resolve=False))
        if k not in ("run_dir", "server_opt", "logger")]


def test_the_probe_covers_the_whole_default_config():
    assert len(KEYS) >= 55 and {"model.net.hidden", "method.parts.local_optimizer.state", "optimizer.lr"} <= set(KEYS)


@pytest.mark.parametrize("key", KEYS)
def test_every_key_refuses_bad_values_in_one_line(tmp_path, monkeypatch, key):
    """... and where the fix names a concrete change (``set e.g. fl.rounds=40``), following it gets the line past
    that check (issue 65; tests/helpers/fixes.py), checked before building, or built where the build refused it;
    each of a key's fixes once."""
    monkeypatch.chdir(tmp_path)  # relative folders a value names (store.offload_dir=abc) land here
    followed = set()
    for value in VALUES:
        code, err = cli_in_process(BASE + [f"{key}={value}"], tmp_path / f"run_{value}")
        if value in VALID.get(key, ()):
            assert code == 0, (key, value, err)
            continue
        lines = err.strip().splitlines()
        assert code == 2 and len(lines) == 1 and lines[0].startswith("error:"), (key, value, err)
        assert NAMED_AS.get(key, key) in lines[0], (key, value, lines[0])  # the full key a user typed
        fix = lines[0].partition("; fix: ")[2]
        if fix not in followed:
            followed.add(fix)
            argv = BASE + [f"{key}={value}"]
            bad = fix_defects(argv, lines[0], verdict if verdict(argv) is not None else built_verdict)
            assert not bad, "\n".join(bad)


# the last inputs that ended in a traceback, ran silently or gave the wrong hint: (overrides, start of the one line,
# what it must hold, what it must not)
CASES = [
    (["+method.parts.nosuch.x=1"], "method.parts.nosuch: is not a part of method 'fedavg'",  # was an AttributeError
     ["its parts: local_optimizer, aggregation", "+method.parts.nosuch._target_="], []),
    (["+method.parts.agregation.rule=mean"], "method.parts.agregation: is not a part",
     ["fix: did you mean method.parts.aggregation?"], []),
    (["data.partition.name=foo"], "data.partition.name: is 'foo' but the node is the dirichlet partition",  # was silent
     ["fix: choose the partition with data/partition=foo", "data.partition.name=dirichlet"], []),
    (["model.name=mlp"], "model.name: is 'mlp' but the node is the cnn model", ["fix: choose the model with model=mlp"],
     []),
    (["method.learning_rate=0.1"], "method.learning_rate: no such key", ["fix: did you mean method.lr?"], ["+"]),
    (["method=fedmuon", "method.alpah=0.5"], "method.alpah: no such key", ["fix: did you mean method.alpha?"], ["+"]),
    (["method.rul=mean"], "method.rul: no such key", ["fix: did you mean method.parts.aggregation.rule?"], ["+"]),
    (["method.zzzz=1"], "method.zzzz: no such key", ["fix: a new argument of a part or model needs a leading +",
                                                     "+method.zzzz="], ["did you mean"]),
    (["method=nosuch"], "unknown method 'nosuch'",
     ["valid: adam_biclip", "hydra.searchpath=[file://DIR] where DIR holds method/nosuch.yaml"], []),
    (["data/partition=nosuch"], "unknown data/partition 'nosuch'",  # was Hydra's "Could not find", no names
     ["valid: by_group, dirichlet", "DIR holds data/partition/nosuch.yaml"], []),
    (["data/partition=iid", "data.partition.alpha=0.1"],  # was "needs a leading +", then "not an argument": remove
     "data.partition.alpha: no such key, and fl_lightning.data.partition.iid takes no alpha",
     ["fix: remove it (it takes: labels, num_clients, rng)"], ["+"]),
    (["method.parts.aggregation.beta=0.9"], "method.parts.aggregation.beta: no such key, and "
     "fl_lightning.strategies.parts.ModelAverage takes no beta", ["fix: remove it (it takes:"], ["+"]),
    (["method=fedavgg"], "unknown method 'fedavgg'", ["fix: did you mean method=fedavg? valid: adam_biclip"], []),
    (["-m", "method=fedavg,fedavgg"], "unknown method 'fedavgg'",  # a sweep's list: was Hydra's, no names
     ["fix: did you mean method=fedavg? valid: adam_biclip"], []),
    (["data.partition=iid"], "data.partition: is 'iid', not a partition",  # was an AttributeError
     ["fix: choose the partition with data/partition=iid in place of data.partition=iid"], []),
    (["method.parts=null"], "method.parts: is null", ["method.parts.<part>=null"], []),  # was an AttributeError
    (["server_opt=adam"], "server_opt: this config has no server_opt to override",  # was Hydra's, with no fix
     ["fix: choose a method with a server optimizer, e.g. method=fedadam server_opt=adam"], []),
    (["+data.batchsize=16"], "data.batchsize: is not an argument", ["fix: did you mean data.batch_size?"], []),
]


@pytest.mark.parametrize("overrides,start,needles,absent", CASES, ids=[" ".join(c[0]) for c in CASES])
def test_the_last_tracebacks_and_wrong_hints_are_one_line(tmp_path, overrides, start, needles, absent):
    """(Their fixes, followed: tests/system/test_fix_lines.py.)"""
    code, err = cli_in_process(BASE + overrides, tmp_path / "run")
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, (code, err)
    prefix = "error: " if start.startswith("unknown") else "error: config error: "
    assert lines[0].startswith(prefix + start), lines[0]
    for n in needles:
        assert n in lines[0], (n, lines[0])
    fix = lines[0].split("; fix: ", 1)[-1]
    for n in absent:
        assert n not in fix, (n, lines[0])


@pytest.mark.parametrize("method,typed,near", [("fedavg", "learning_rate", "method.lr"),
                                               ("fedmuon", "alpah", "method.alpha"),
                                               ("fedavg", "rul", "method.parts.aggregation.rule")])
def test_a_plus_key_close_to_one_names_it(method, typed, near):
    """With a leading + the key composes, and nothing reads it (train.py's check of the run's overrides; outside a
    Hydra app cli_in_process has none): the closest key is named too."""
    from fl_lightning.errors import ConfigError
    from fl_lightning.config.checks import check

    overrides = [f"method={method}", f"+method.{typed}=0.5"]
    with pytest.raises(ConfigError) as err:
        check(make_cfg(BASE + overrides), overrides)
    assert err.value.key == f"method.{typed}" and err.value.fix == f"did you mean {near}? ({near}=0.5)", str(err.value)
