"""The config schema (fl_lightning/config/schema.py): every key probed with {abc, null, -1, 0, 2.5} on the command line is
either a valid value or one line naming that key, before Hydra composes and before torch is imported; the composed
config is checked the same way (values from yaml files, ``+`` keys); the rules between keys; ``fl_lightning.config.keys``."""
from __future__ import annotations

import subprocess
import sys

import pytest

from fl_lightning.config import check_run as validate
from fl_lightning.errors import ConfigError
from fl_lightning.config.keys import describe
from fl_lightning.config.schema import all_keys
from fl_lightning.config.checks import check, check_overrides, closest_key
from tests.helpers.cli import ROOT, make_cfg

# values that are valid for a key (the rest must be refused)
VALID = {("seed", "0"), ("fl.warmup_rounds", "0"), ("fl.lr_min_factor", "0"), ("stop_after_rounds", "null"),
         ("fl.local_epochs", "null"), ("fl.local_steps", "null"), ("method.grad_clip", "null"),
         ("method.grad_clip", "2.5"), ("checkpoint.background_mb", "0"), ("checkpoint.compact", "0"),
         ("store.offload_dir", "null"), ("resume", "null"), ("run_dir", "null"), ("tables", "null"),
         ("data.val_fraction", "0"), ("label", "null"), ("paper", "null"), ("objective", "null")}  # no validation split (the default)
BAD = ["abc", "null", "-1", "0", "2.5"]
NAMES = ("store.offload_dir", "run_dir", "trainer.strategy", "label", "objective")  # any string names a folder / a Fabric strategy
VALID |= {(k, v) for k in NAMES for v in ("abc", "-1", "0", "2.5")}
NOT_PROBED = {"resume"}  # resume=abc is a missing run directory, tested in tests/system/test_cli_errors.py


def _cases():
    keys = [k for k in all_keys() if k not in NOT_PROBED]
    assert len(keys) >= 25
    return [(k, v) for k in keys for v in BAD]


@pytest.mark.parametrize("key,value", _cases())
def test_every_schema_key_refuses_bad_values_in_one_line(key, value):
    if (key, value) in VALID:
        check_overrides([f"{key}={value}"])
        return
    with pytest.raises(ConfigError) as err:
        check_overrides([f"{key}={value}"])
        check(make_cfg([f"{key}={value}"]))  # a value only a rule refuses (grad_clip 0, local_steps null with epochs)
    msg = str(err.value)
    assert "\n" not in msg and "fix:" in msg
    assert f"{key}:" in msg, msg


def test_unknown_keys_name_the_closest_one():
    for arg in ("fl.num_client=5", "+fl.num_client=5", "++fl.num_client=5"):
        with pytest.raises(ConfigError, match=r"fl\.num_client: no such key; fix: did you mean fl\.num_clients\?"):
            check_overrides([arg])
    with pytest.raises(ConfigError, match="no such key"):
        check_overrides(["+foo=1"])
    check_overrides(["+method.parts.aggregation.codec._target_=fl_lightning.codecs.TopK", "method=fedavg",
                     "data/partition=iid", "hydra.run.dir=x", "fl.rounds=10,20", "+tables.lr={a: 1}"])


def test_keys_added_to_the_composed_config_are_refused():
    """A ``+`` key composes (Hydra adds it even to a structured node); the schema check refuses it, and a method knob
    that nothing in the method reads (the command line's ``method.X``) is refused too."""
    with pytest.raises(ConfigError, match="fl.num_client: no such key"):
        check(make_cfg(["+fl.num_client=5"]))
    with pytest.raises(ConfigError, match="nothing in method 'fedavg' reads it; fix: did you mean method.lr"):
        check(make_cfg(["+method.lrr=0.1"]), ["+method.lrr=0.1"])
    with pytest.raises(ConfigError, match="method.pac_beta: nothing in method 'fedpac_soap_align_only'"):
        ov = ["method=fedpac_soap_align_only", "method.pac_beta=0.3"]
        check(make_cfg(ov), ov)
    check(make_cfg(["method=fedpac_soap", "method.pac_beta=0.3"]), ["method=fedpac_soap", "method.pac_beta=0.3"])


def test_every_method_reads_all_its_keys():
    from fl_lightning.config.checks import unread_method_keys
    from tests.helpers.golden import methods

    unread = {m: unread_method_keys(make_cfg([f"method={m}"])) for m in methods()}
    assert {m: u for m, u in unread.items() if u} == {"fedpac_soap_align_only": {"pac_beta"}}  # its part is removed


def test_rules_between_keys():
    with pytest.raises(ConfigError, match="fl.clients_per_round: 20 clients per round"):
        validate(make_cfg(["fl.clients_per_round=20"]))
    with pytest.raises(ConfigError, match="fl.local_steps: set exactly one"):
        validate(make_cfg(["fl.local_epochs=1"]))
    with pytest.raises(ConfigError, match="fl.warmup_rounds"):
        validate(make_cfg(["fl.warmup_rounds=40"]))
    with pytest.raises(ConfigError, match="trainer.precision: fp16 mixed"):
        validate(make_cfg(["trainer.precision=16-mixed"]))
    validate(make_cfg(["fl.local_steps=null", "fl.local_epochs=1"]))


def test_closest_key():
    cfg = make_cfg([])
    assert closest_key(cfg, "fl.num_client") == "fl.num_clients"
    assert closest_key(cfg, "model.hidden") == "model.net.hidden"
    assert closest_key(cfg, "nothing.like.this") is None


def test_keys_listing_is_generated_from_the_schema():
    rows = {r[0]: r for r in describe()}
    assert set(rows) == set(all_keys())
    out = subprocess.run([sys.executable, "-m", "fl_lightning.config.keys", "fl"], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0 and "fl.clients_per_round" in out.stdout and "trainer." not in out.stdout
    assert "int in [1, 1000000000]  (default 40)" in out.stdout
    bad = subprocess.run([sys.executable, "-m", "fl_lightning.config.keys", "nope"], capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1


def test_schema_fields_and_arguments_share_one_range_vocabulary():
    """A schema field states its type and range as a constructor argument does, ``Annotated[T, Range(...)]`` /
    ``OneOf``, read by the same function (config.ranges.hint_meta, from typing.get_type_hints: no annotation text
    parsed); OmegaConf types the plain field; Path / Table / IntOrWord are told apart by their Kind."""
    import dataclasses
    import typing

    from omegaconf import OmegaConf

    from fl_lightning.config import schema
    from fl_lightning.config.ranges import OneOf, Range, hint_meta

    for cls in (*schema.GROUPS.values(), schema.Root, schema.DataKeys, schema.MethodKeys):
        hints = typing.get_type_hints(cls, include_extras=True)
        for f in dataclasses.fields(cls):
            if f.metadata:
                read = {k: v for k, v in hint_meta(hints[f.name], f.default, True).items() if k != "example"}
                assert {k: f.metadata[k] for k in read} == read, (cls.__name__, f.name)
    fl = typing.get_type_hints(schema.FL, include_extras=True)
    assert Range(1, 10**9) in typing.get_args(fl["rounds"]) and OneOf("constant", "cosine") in typing.get_args(
        fl["lr_schedule"])
    assert OmegaConf.get_type(OmegaConf.structured(schema.FL), "rounds") is int
    keys = all_keys()
    assert (keys["fl.num_clients"].metadata["kind"], keys["fl.num_clients"].metadata["words"]) == ("int", ("auto",))
    assert keys["store.offload_dir"].metadata["kind"] == "path" and keys["paper"].metadata["kind"] == "table"
    assert not hasattr(schema, "_KINDS")


def test_a_named_validator_is_one_line_with_its_message():
    """A rule tying two arguments (BiClip's lower <= upper, FedAdam's tau = 0 with v starting at 0) is a named
    Validate next to the annotation, checked with the config like a Range."""
    from fl_lightning.config import check_targets

    for overrides, key, text in [
            (["method=adam_biclip", "method.biclip_lower=2"], "method.biclip_lower (via method.parts.clip.lower)",
             "need 0 <= lower <= upper, got lower=2, upper=1.0"),
            (["method=fedadam", "method.server_tau=0"], "method.server_tau (via method.parts.aggregation.server_opt.tau)",
             "tau = 0 with v starting at 0 divides by zero")]:
        with pytest.raises(ConfigError) as err:
            check_targets(make_cfg(overrides))
        assert err.value.key == key and err.value.problem == text and "\n" not in str(err.value), str(err.value)


def test_the_schema_imports_no_torch():
    code = "import sys, fl_lightning.config.schema, fl_lightning.run.cli, fl_lightning.config.keys; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.stdout.strip() == "False", out.stderr


def test_a_model_larger_than_free_memory_is_refused_before_allocating(tmp_path, monkeypatch):
    """Size sanity check: parameters × bytes (counted on the meta device) against the free memory, one line naming
    the model keys, instead of an allocation failure or the OOM killer later."""
    from fl_lightning.run import build as build_mod
    from tests.helpers.cli import build_error

    monkeypatch.setattr(build_mod, "available_memory", lambda device: 100_000)  # ~100 kB free: the CNN needs more
    msg = build_error(["fl.rounds=1"], tmp_path)
    assert msg.startswith("config error: model: ") and "MiB" in msg and "model.net.hidden" in msg, msg


def test_a_validation_objective_needs_a_split_and_a_paper_block_is_checked_before_the_run():
    with pytest.raises(ConfigError, match=r"^config error: objective: val_acc is logged only with a validation split"):
        check(make_cfg(["objective=val_acc"]))
    check(make_cfg(["objective=val_acc", "data.val_fraction=0.1"]))
    with pytest.raises(ConfigError, match=r"^config error: paper\.cells\[0\]: got .*; fix: give the keys"):
        validate(make_cfg(["+paper.cells=[{method: fedavg}]"]))
    with pytest.raises(ConfigError, match=r"^config error: paper\.foo: no such key; fix: use source"):
        validate(make_cfg(["+paper.foo=1"]))
    validate(make_cfg(["+paper.cells=[{method: fedavg, value: 55.2}]", "+paper.ordering=[fedavg]"]))


def test_keys_that_leave_results_alone_are_stated_once_and_used_by_the_hash_the_report_and_hydra():
    """``result=False`` on a schema field is the one statement: the config hash ignores the key, the report does not
    tell settings apart by it, and a sweep job's folder name leaves it out; a result key does all three the other way."""
    import os

    from omegaconf import OmegaConf

    from fl_lightning.config import config_hash
    from fl_lightning.report.runs import IGNORED_KEYS
    from fl_lightning.config.schema import all_keys, not_result_keys, register
    from tests.helpers.cli import CONF, make_cfg

    register()  # conf/config.yaml's exclude_keys call its resolver
    quiet = not_result_keys()
    assert {"trainer.threads", "trainer.progress", "trainer.devices", "checkpoint.every", "resume"} <= set(quiet)
    assert not {"seed", "fl.rounds", "fl.local_steps", "trainer.precision", "data.batch_size"} & set(quiet)
    assert all(not all_keys()[k].metadata["result"] for k in quiet)
    exclude = OmegaConf.load(os.path.join(CONF, "config.yaml")).hydra.job.config.override_dirname.exclude_keys
    assert set(quiet) <= set(exclude) and "experiment" in exclude and "fl.rounds" not in exclude
    assert set(quiet) <= set(IGNORED_KEYS) and "fl.local_steps" not in IGNORED_KEYS
    base = config_hash(make_cfg([], "r"))
    for key, value in [("trainer.threads", "1"), ("checkpoint.every", "3"), ("fl.eval_every", "4"), ("label", "x")]:
        assert config_hash(make_cfg([f"{key}={value}"], "r")) == base, key
    for key, value in [("fl.local_steps", "3"), ("trainer.precision", "bf16-mixed"), ("seed", "1")]:
        assert config_hash(make_cfg([f"{key}={value}"], "r")) != base, key


def test_keys_lists_a_chosen_configs_keys_with_their_ranges_and_one_key_and_usage(capsys):
    """``keys method=fedmuon``: that method's keys, a part's or optimizer's argument described by its annotation
    (also when the method's key feeds it by interpolation); ``keys method.lr``: that key; ``--help``: usage; an
    unknown choice: one line, exit 2."""
    from fl_lightning.config.keys import main

    assert main(["method=fedmuon"]) == 0
    out = capsys.readouterr().out
    assert "method.alpha" in out and "a number in [0.0, 1.0)  (value 0.5)" in out
    assert "sets fl_lightning.strategies.parts.GlobalAlignment's alpha" in out
    assert "method.parts.local_optimizer.state" in out and "argument of fl_lightning.strategies.parts.LocalOptimizer" in out
    assert main(["method.lr"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[0].startswith("method.lr") and "(value " in out[0]
    assert main(["--help"]) == 0 and capsys.readouterr().out.startswith("usage: python -m fl_lightning.config.keys")
    assert main(["method=nosuch"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: keys:")


def _listed(capsys, *argv) -> dict[str, str]:
    """``keys ARGV``: {key: the type it shows}."""
    from fl_lightning.config.keys import main

    assert main(list(argv)) == 0
    lines = [x for x in capsys.readouterr().out.splitlines() if x and not x.startswith(" ")]
    return {x.split()[0]: x.split(None, 1)[1].rsplit("  (value ", 1)[0].strip() for x in lines}


def test_keys_shows_a_type_for_every_key_of_a_chosen_config(capsys):
    """Issue 65 item 13: a key no schema field or argument describes shows its value's type, not ``?``; a key that
    feeds an argument through ``${oc.select:KEY,${OTHER}}`` takes that argument's type; null where a key takes it."""
    kinds = _listed(capsys, "method=fedmuon")
    assert "?" not in kinds.values(), {k: v for k, v in kinds.items() if v == "?"}
    assert kinds["method.name"] == "a string" and kinds["method.comm.uplink"] == "a string"
    assert kinds["method.aux_lr"] == "a number >= 0.0 (or null)"  # fl_lightning.optim.Muon's aux_lr
    assert kinds["method.grad_clip"] == "a number > 0 (or null)"  # the schema's, in the same words
    assert _listed(capsys, "data=cifar10")["data.augment"] == "true or false (or null)"


def test_keys_leaves_out_data_download_which_the_top_level_download_replaced(capsys):
    """Issue 65 item 13: ``data.download`` (still read from old configs, with a deprecation line) is not listed
    beside the top-level ``download``; asked for by name it says what replaced it."""
    assert "download" in all_keys()
    listed = _listed(capsys, "data=cifar10")
    assert "data.root" in listed and "data.download" not in listed
    from fl_lightning.config.keys import main

    assert main(["data=cifar10", "data.download"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("data.download") and "deprecated: use the top-level download" in out


def test_a_keys_effect_on_the_config_hash_and_the_reports_setting_is_declared_on_its_field():
    """Hash rules are field metadata (issue 48 item 4): ``fl.rounds`` enters the config hash only under a schedule,
    ``data.val_fraction`` only when it holds a set out, a dataset's ``fake`` argument only when true (the real files hash
as before it existed); ``data.eval_batch_size`` and ``data.on_device`` stay in the
    hash (every checkpoint's hash has them) but never tell two settings apart in the report."""
    from fl_lightning.config import config_hash
    from fl_lightning.config import hash_rules, not_result_keys, not_setting_keys
    from fl_lightning.report.runs import IGNORED_KEYS
    from tests.helpers.cli import make_cfg

    assert sorted(hash_rules()) == ["data.fake", "data.source", "data.val_fraction", "dp.max_epsilon", "fl.rounds",
                                    "fl.sampling"]
    assert {"data.eval_batch_size", "data.on_device"} <= set(not_setting_keys()) - set(not_result_keys())
    assert set(not_setting_keys()) <= set(IGNORED_KEYS)
    h = config_hash(make_cfg([]))
    assert config_hash(make_cfg(["fl.rounds=7"])) == h  # constant schedule: R changes nothing
    assert config_hash(make_cfg(["fl.lr_schedule=cosine"])) != config_hash(make_cfg(["fl.lr_schedule=cosine",
                                                                                     "fl.rounds=7"]))
    assert config_hash(make_cfg(["data.val_fraction=0.0"])) == h != config_hash(make_cfg(["data.val_fraction=0.1"]))
    assert config_hash(make_cfg(["data.eval_batch_size=7"])) != h
    # issue 67: dp=none and fl.sampling=fixed (the runs before them) leave the hash alone; where a budget stops a run
    # (dp.max_epsilon) is not what it computes
    assert config_hash(make_cfg(["dp=none", "fl.sampling=fixed"])) == h != config_hash(make_cfg(["fl.sampling=poisson"]))
    dp = ["dp=central", "dp.noise_multiplier=1"]
    assert config_hash(make_cfg(dp)) == config_hash(make_cfg(dp + ["dp.max_epsilon=3"])) != h
