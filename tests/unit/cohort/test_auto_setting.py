"""``trainer.cohort=auto`` / ``trainer.compile=auto`` (fl_lightning/cohort/auto.py), on the CPU with a mocked CUDA
device and a mocked clock: the candidates and the choice, the probe's line, the values written into the config and
inherited on resume (chosen again where they cannot run), a run after the probe equal to one given the chosen values,
and the config hashes of runs from before the defaults changed."""
from __future__ import annotations

import logging

import pytest
import torch
from omegaconf import OmegaConf

from fl_lightning.cohort import auto
from tests.helpers.cli import FAST, build_loop, cli_in_process, make_cfg

CUDA = torch.device("cuda")


def test_candidates_are_powers_of_two_up_to_the_memory_bound_and_graphs_without_a_cohort():
    assert auto.candidates(6) == [(1, "none"), (1, "graphs"), (2, "none"), (4, "none"), (6, "none")]
    assert auto.candidates(8) == [(1, "none"), (1, "graphs"), (2, "none"), (4, "none"), (8, "none")]
    assert auto.candidates(1) == [(1, "none"), (1, "graphs")]


def test_the_fastest_per_client_step_wins_and_a_tie_goes_to_the_smaller_and_eager():
    assert auto.choose({(1, "none"): 3e-3, (1, "graphs"): 1e-3, (4, "none"): 2e-3}) == (1, "graphs")
    assert auto.choose({(1, "none"): 1e-3, (1, "graphs"): 1e-3, (2, "none"): 1e-3}) == (1, "none")
    assert auto.choose({(8, "none"): 1e-4, (4, "none"): 2e-4, (1, "none"): 2e-3}) == (8, "none")


class Clock:
    """A mocked clock: each candidate's timing advances it by that candidate's seconds."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def _resolve(overrides, times, saved=None, world=1, bound=8, device=CUDA, monkeypatch=None):
    """Resolve with a mocked CUDA device: ``times`` {(K, compile): seconds a client-step}, spent on the mocked clock
    (a candidate missing from it fails)."""
    clock = Clock()
    monkeypatch.setattr(auto, "timer", clock)
    monkeypatch.setattr(auto, "device_kind", lambda d: d.type if d.type != "cuda" else "cuda")
    timed = []

    def time_fn(k, mode):
        timed.append((k, mode))
        if (k, mode) not in times:
            raise RuntimeError("CUDA out of memory")
        clock.now += 0.5  # the candidate's probe takes half a second
        return times[(k, mode)]
    cfg = make_cfg(overrides, "/tmp/unused")
    out = auto.resolve(cfg, saved, device, world, lambda: (bound, f"{bound} fit"), time_fn,
                       lambda s: s * 10 * 50 * 1000)
    return cfg, out, timed


def test_the_probe_times_each_candidate_and_says_its_choice_in_one_line(monkeypatch, caplog):
    times = {(1, "none"): 2e-3, (1, "graphs"): 9e-4, (2, "none"): 1.1e-3, (4, "none"): 4e-4}
    with caplog.at_level(logging.INFO, logger="fl_lightning"):
        cfg, out, timed = _resolve(["method=fedavg"], times, bound=8, monkeypatch=monkeypatch)
    assert timed == [(1, "none"), (1, "graphs"), (2, "none"), (4, "none"), (8, "none")]
    assert out == {"cohort": 4, "compile": "none"} and cfg.trainer.cohort == 4 and cfg.trainer.compile == "none"
    line = [r.getMessage() for r in caplog.records if "trainer.compile=auto ->" in r.getMessage()]
    assert len(line) == 1 and "\n" not in line[0]
    assert line[0].startswith("trainer.cohort=auto trainer.compile=auto -> cohort=4 compile=none")
    assert "1/graphs 0.9," in line[0] and "4/none 0.4" in line[0] and "8/none failed: RuntimeError: CUDA out of memory" \
        in line[0]
    # 4 candidates ran, 0.5 s each: 2 s of probe against 4e-4 s x 10 clients x 50 steps x 1000 rounds = 200 s
    assert "probe 2.0 s, 1% of the run's projected 0.0556 h" in line[0]


def test_a_given_key_is_not_probed(monkeypatch):
    cfg, out, timed = _resolve(["method=fedavg", "trainer.compile=none"], {(1, "none"): 2e-3, (2, "none"): 1e-3,
                                                                          (4, "none"): 3e-3, (8, "none"): 4e-3},
                               monkeypatch=monkeypatch)
    assert all(m == "none" for _, m in timed) and out == {"cohort": 2}
    cfg, out, timed = _resolve(["method=fedavg", "trainer.cohort=4"], {}, monkeypatch=monkeypatch)
    assert timed == [] and out == {"compile": "none"}  # a cohort has no graph yet: one candidate


def test_off_cuda_both_are_the_sequential_eager_loop_and_several_processes_skip_the_probe(monkeypatch):
    cfg, out, timed = _resolve(["method=fedavg"], {}, device=torch.device("cpu"), monkeypatch=monkeypatch)
    assert timed == [] and out == {"cohort": 1, "compile": "none"}
    cfg, out, timed = _resolve(["method=fedavg"], {}, world=4, bound=6, monkeypatch=monkeypatch)
    assert timed == [] and out == {"cohort": 6, "compile": "none"}


def test_a_resume_keeps_the_saved_values_unless_they_cannot_run_here(monkeypatch, caplog):
    saved = OmegaConf.create({"trainer": {"cohort": 4, "compile": "none"}})
    cfg, out, timed = _resolve(["method=fedavg"], {}, saved=saved, monkeypatch=monkeypatch)
    assert timed == [] and out == {"cohort": 4, "compile": "none"}
    times = {(1, "none"): 2e-3, (2, "none"): 1e-3}
    with caplog.at_level(logging.INFO, logger="fl_lightning"):  # a K too big for this (smaller) GPU
        cfg, out, timed = _resolve(["method=fedavg"], times, saved=saved, bound=2, monkeypatch=monkeypatch)
    assert out == {"cohort": 2, "compile": "none"} and timed
    assert "trainer.cohort=4 is more than the 2 clients that fit" in caplog.text
    caplog.clear()
    graphs = OmegaConf.create({"trainer": {"cohort": 1, "compile": "graphs"}})
    with caplog.at_level(logging.INFO, logger="fl_lightning"):  # graphs saved on a GPU, resumed on a CPU
        cfg, out, timed = _resolve(["method=fedavg"], {}, saved=graphs, device=torch.device("cpu"),
                                   monkeypatch=monkeypatch)
    assert out == {"cohort": 1, "compile": "none"} and "replays CUDA graphs and this run is on cpu" in caplog.text


def test_old_runs_config_hashes_are_unchanged():
    """The result hash of configs from before the defaults became auto (values recorded then), and auto against
    the explicit values: both keys are out of it."""
    from fl_lightning.config.hashing import config_hash

    assert config_hash(make_cfg(["method=fedavg"], "/tmp/x")) == "968ef41f978bc19e"
    assert config_hash(make_cfg(["method=fedmuon", "model=vit_tiny"], "/tmp/x")) == "a6c28b5b64256253"
    assert config_hash(make_cfg(["method=scaffold", "trainer.cohort=4"], "/tmp/x")) == "991072bcc6e70ae2"
    assert config_hash(make_cfg(["method=fedavg", "trainer.cohort=1", "trainer.compile=none"], "/tmp/x")) == \
        "968ef41f978bc19e"


def test_the_resolved_values_are_written_into_the_saved_config_and_inherited(tmp_path):
    from fl_lightning.run.build import build

    code, err = cli_in_process([*FAST, "method=fedavg", "fl.rounds=1"], tmp_path / "run")
    assert code == 0, err
    saved = OmegaConf.load(tmp_path / "run" / "config.yaml")
    assert saved.trainer.cohort == 1 and saved.trainer.compile == "none"
    saved.trainer.cohort = 2  # as a GPU's probe would have chosen: a resume keeps it
    OmegaConf.save(saved, tmp_path / "run" / "config.yaml")
    cfg = make_cfg([*FAST, "method=fedavg", "fl.rounds=1"], tmp_path / "run")
    loop = build(cfg, str(tmp_path / "run"), resume=str(tmp_path / "run"))
    assert cfg.trainer.cohort == 2 and loop.cohort is not None and loop.cohort.size == 2


@pytest.mark.slow
def test_a_run_after_the_probe_equals_the_run_given_the_chosen_values(tmp_path, monkeypatch):
    """With a mocked CUDA device (the probe's runs are real, on the CPU; ``graphs`` fails there and is left out) and
    the choice pinned to K = 2: the run, built after its probe, equals bit for bit the run given
    ``trainer.cohort=2 trainer.compile=none``: the probe's throwaway runs leave nothing behind."""
    from fl_lightning.run import build as build_mod

    ov = ["method=scaffold", "fl.num_clients=6", "fl.clients_per_round=3", "fl.rounds=2", "fl.local_steps=3",
          "trainer.progress=false", "trainer.accelerator=cpu"]
    monkeypatch.setattr(auto, "device_kind", lambda d: "cuda")
    monkeypatch.setattr(build_mod, "activation_bytes", lambda *a: 1000)
    tried = []
    real_probe = build_mod.probe_seconds

    def probe_seconds(cfg, fabric, data, k, mode):
        tried.append((k, mode))
        return real_probe(cfg, fabric, data, k, mode)
    monkeypatch.setattr(build_mod, "probe_seconds", probe_seconds)
    monkeypatch.setattr(auto, "choose", lambda timings: (2, "none"))
    probed = build_loop(ov, tmp_path / "auto")
    assert tried == [(1, "none"), (1, "graphs"), (2, "none"), (3, "none")]
    assert probed.cohort is not None and probed.cohort.size == 2
    monkeypatch.undo()
    given = build_loop(ov + ["trainer.cohort=2", "trainer.compile=none"], tmp_path / "given")
    for r in range(2):
        probed.run_round(r)
        given.run_round(r)
    assert all(torch.equal(probed.global_params[k], given.global_params[k]) for k in given.global_params)
