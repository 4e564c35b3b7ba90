"""Typed settings (issue "Reliability" item 3): every key of fl_lightning.settings.SETTINGS in the default config,
probed with {abc, null, -1, 0, 2.5}: each value is either a documented valid value or a one-line ConfigError naming
that key — never a traceback from deeper down, never silently truncated."""
from __future__ import annotations

import pytest

from fl_lightning.build import validate
from fl_lightning.errors import ConfigError
from fl_lightning.settings import SETTINGS, closest_key
from tests.helpers.cli import make_cfg

# values that are valid for a key (the rest must be refused)
VALID = {("seed", "0"), ("fl.warmup_rounds", "0"), ("fl.lr_min_factor", "0"), ("stop_after_rounds", "null"),
         ("fl.local_epochs", "null"),
         ("method.grad_clip", "null"), ("checkpoint.background_mb", "0"),
         ("checkpoint.compact", "0")}
BAD = ["abc", "null", "-1", "0", "2.5"]


def _cases():
    cfg = make_cfg([])
    from omegaconf import OmegaConf

    keys = [k for k in SETTINGS if OmegaConf.select(cfg, k, default="__absent__") != "__absent__"]
    assert len(keys) >= 15
    return [(k, v) for k in keys for v in BAD]


@pytest.mark.parametrize("key,value", _cases())
def test_every_setting_refuses_bad_values_in_one_line(key, value):
    cfg = make_cfg([f"{key}={value}"])
    if (key, value) in VALID or (SETTINGS[key].kind == "float" and value == "2.5" and SETTINGS[key].high is None):
        validate(cfg)
        return
    with pytest.raises(ConfigError) as err:
        validate(cfg)
    msg = str(err.value)
    assert "\n" not in msg and "fix:" in msg
    # null for one of fl.local_steps / fl.local_epochs is legal; the pair's rule names fl.local_steps
    assert f"{key}:" in msg or (key == "fl.local_steps" and value == "null" and "fl.local_steps" in msg), msg


def test_closest_key():
    cfg = make_cfg([])
    assert closest_key(cfg, "fl.num_client") == "fl.num_clients"
    assert closest_key(cfg, "model.hidden") == "model.net.hidden"
    assert closest_key(cfg, "nothing.like.this") is None


def test_a_model_larger_than_free_memory_is_refused_before_allocating(tmp_path, monkeypatch):
    """Size sanity check: parameters × bytes (counted on the meta device) against the free memory, one line naming
    the model keys, instead of an allocation failure or the OOM killer later."""
    from fl_lightning import build as build_mod
    from tests.helpers.cli import build_error

    monkeypatch.setattr(build_mod, "available_memory", lambda device: 100_000)  # ~100 kB free: the CNN needs more
    msg = build_error(["fl.rounds=1"], tmp_path)
    assert msg.startswith("config error: model: ") and "MiB" in msg and "model.net.hidden" in msg, msg
