"""The dp group's targets (fl_lightning/dp/mechanism.py): every bad input is one ConfigError naming the full key with a
fix that works when followed; methods whose upload is encoded before it is summed are refused, naming the codec."""
from __future__ import annotations

import pytest

from fl_lightning.config import instantiate
from fl_lightning.dp import CentralDP
from fl_lightning.dp.mechanism import refused_codec
from fl_lightning.errors import ConfigError
from tests.helpers.cli import make_cfg

RUN = dict(num_clients=16, clients_per_round=8, rounds=40, sampling="fixed", seed=0)


def _error(node: dict, **runtime) -> ConfigError:
    with pytest.raises(ConfigError) as err:
        instantiate({"_target_": "fl_lightning.dp.CentralDP", **node}, "dp", **{**RUN, **runtime})
    assert "\n" not in str(err.value)
    return err.value


def _fix_value(err: ConfigError) -> float:
    import re

    return float(re.search(rf"{err.key}=([0-9.e+-]+)", err.fix).group(1))


def test_delta_at_or_above_one_over_n():
    err = _error({"noise_multiplier": 1.0, "delta": 0.1})
    assert err.key == "dp.delta" and "1/fl.num_clients" in err.problem
    instantiate({"_target_": "fl_lightning.dp.CentralDP", "noise_multiplier": 1.0, "delta": 0.06}, "dp", **RUN)


def test_unreachable_target_and_its_fix():
    """All 1000 clients in each of 10^4 rounds at δ = 1e-8: ε ≈ 1.08 even at z = 1000 (μ-GDP with μ = 0.2)."""
    big = dict(num_clients=1000, clients_per_round=1000, rounds=10_000)
    err = _error({"target_epsilon": 0.5, "delta": 1e-8}, **big)
    assert err.key == "dp.target_epsilon" and "1000" in err.problem
    ok = instantiate({"_target_": "fl_lightning.dp.CentralDP", "target_epsilon": _fix_value(err), "delta": 1e-8}, "dp",
                     **{**RUN, **big})
    assert ok.noise_multiplier <= 1e3


def test_noise_multiplier_and_target_exactly_one():
    assert _error({"noise_multiplier": 1.0, "target_epsilon": 8}).key == "dp.target_epsilon"
    assert _error({}).key == "dp.noise_multiplier"



def test_a_budget_without_noise_is_refused_before_the_run():
    """dp.max_epsilon with z = 0 (ε = ∞ after one round): the named rule next to the key (mechanism.BUDGET), checked
    with every key before anything is built; its fix, followed, passes."""
    from fl_lightning.config import check_run

    with pytest.raises(ConfigError) as err:
        check_run(make_cfg(["dp=central", "dp.noise_multiplier=0", "dp.max_epsilon=3"]))
    assert err.value.key == "dp.max_epsilon" and "\n" not in str(err.value)
    check_run(make_cfg(["dp=central", "dp.noise_multiplier=0", "dp.max_epsilon=null"]))

def test_adaptive_count_noise_too_small():
    with pytest.raises(ConfigError) as err:
        instantiate({"_target_": "fl_lightning.dp.AdaptiveCentralDP", "noise_multiplier": 1.0, "count_noise": 0.4},
                    "dp", **RUN)
    assert err.value.key == "dp.count_noise"
    ok = instantiate({"_target_": "fl_lightning.dp.AdaptiveCentralDP", "noise_multiplier": 1.0,
                      "count_noise": _fix_value(err.value)}, "dp", **RUN)
    assert ok.update_noise > 0


def test_ranges_from_the_signature(tmp_path):
    from fl_lightning.config import check_targets

    for bad, key in (("dp.clip=0", "dp.clip"), ("dp.noise_multiplier=-1", "dp.noise_multiplier"),
                     ("dp.accountant=prv", "dp.accountant"), ("dp.max_epsilon=0", "dp.max_epsilon")):
        with pytest.raises(ConfigError) as err:
            check_targets(make_cfg(["dp=central", "dp.noise_multiplier=1", bad], tmp_path), groups=("dp",))
        assert err.value.key == key, (bad, str(err.value))


@pytest.mark.parametrize("method,codec", [("fedsmu", "LionMomentum(Sign)"), ("fedef_sign", "ErrorFeedback(ScaledSign)"),
                                          *(pytest.param(*c, marks=pytest.mark.slow) for c in (
                                              ("ef21", "TopK"), ("fedlion", "SignSteps"),
                                              ("fedsmu_3bit", "LionMomentum(Quantize)"), ("scallion", "RandK")))])
def test_refused_codecs(tmp_path, method, codec):
    from fl_lightning.strategies import build_strategy

    strategy = build_strategy(make_cfg([f"method={method}"], tmp_path).method)
    assert refused_codec(strategy)[1] == codec
    with pytest.raises(ConfigError) as err:
        CentralDP(noise_multiplier=1.0, **RUN).attach(strategy)
    assert err.value.key == "dp" and f"the {codec} codec" in err.value.problem and "method=fedavg" in err.value.fix


@pytest.mark.parametrize("method", ["fedavg", "fedmuon_svd", *(pytest.param(m, marks=pytest.mark.slow) for m in (
    "fedmuon", "fedpac_muon", "scaffold", "fedadam"))])
def test_dense_and_float_codecs_accepted(tmp_path, method):
    from fl_lightning.strategies import build_strategy

    strategy = build_strategy(make_cfg([f"method={method}"], tmp_path).method)
    assert refused_codec(strategy) is None
    CentralDP(noise_multiplier=1.0, **RUN).attach(strategy)
    assert [p.name for p in strategy.parts][-2:] == ["dp_clip", "dp_noise"]
