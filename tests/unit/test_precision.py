"""``ns_dtype: auto`` (fl_lightning/precision.py): bf16 on CUDA and on CPUs with native bf16, fp32 elsewhere, resolved
once into the run's config and kept by a resume; one line where bf16 asked for explicitly is slow."""
from __future__ import annotations

import logging

import pytest
import torch
from omegaconf import OmegaConf

from fl_lightning import precision
from fl_lightning.optim.newton_schulz import orthogonalize
from tests.helpers.cli import cli_in_process, make_cfg, saved_model

TINY = ["data=digits", "model=mlp", "model.net.hidden=[16]", "fl.num_clients=4", "fl.clients_per_round=2",
        "fl.local_steps=2", "fl.rounds=3", "trainer.progress=false", "trainer.threads=1"]


@pytest.fixture
def cpu_without_bf16(monkeypatch):
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: False)
    monkeypatch.setattr(precision, "cpu_bf16_slowdown", lambda: 36.0)


@pytest.fixture
def cpu_with_bf16(monkeypatch):
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: True)


@pytest.mark.parametrize("method", ["fedmuon", "fedmuon_avg", "fedpac_muon", "local_muon_reset", "fedmuon_svd"])
@pytest.mark.parametrize("device,native,want", [("cuda", False, "bfloat16"), ("cpu", True, "bfloat16"),
                                                ("cpu", False, "float32")])
def test_auto_resolves_by_device(monkeypatch, tmp_path, method, device, native, want):
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: native)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: device == "cuda")  # trainer.accelerator=auto sees it
    cfg = make_cfg([f"method={method}", "trainer.accelerator=auto"], tmp_path)
    keys = list(precision.dtype_keys(cfg))
    assert keys and all(OmegaConf.select(cfg, k) == "auto" for k in keys)
    resolved = precision.resolve(cfg)
    assert resolved and set(resolved.values()) == {want}
    assert all(OmegaConf.select(cfg, k) == want for k in keys)  # the optimizer's interpolation too
    assert OmegaConf.to_container(cfg, resolve=True)["optimizer"]["ns_dtype"] == want


def test_the_device_check_reads_torchs_cpu_capabilities(monkeypatch):
    for avx512_bf16, amx, onednn, want in [(True, False, True, True), (False, True, True, True),
                                           (False, False, True, False), (True, False, False, False)]:
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda v=avx512_bf16: v)
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda v=amx: v)
        monkeypatch.setattr(precision, "onednn_has_bf16", lambda v=onednn: v)
        assert precision.cpu_has_native_bf16() is want
        assert precision.auto_dtype("cpu") == ("bfloat16" if want else "float32")
        assert precision.auto_dtype("cuda") == "bfloat16"


def test_a_run_saves_the_resolved_dtype_and_a_resume_elsewhere_keeps_it(monkeypatch, tmp_path, caplog):
    """Started where auto is fp32, resumed where it would be bf16: the resume keeps fp32 and ends bit-identical to
    an uninterrupted fp32 run (the arithmetic never changes mid-run)."""
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: False)
    straight, split = tmp_path / "straight", tmp_path / "split"
    assert cli_in_process(["method=fedmuon", *TINY], straight)[0] == 0
    assert cli_in_process(["method=fedmuon", *TINY, "stop_after_rounds=1"], split)[0] == 0
    assert OmegaConf.load(split / "config.yaml").method.ns_dtype == "float32"
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: True)  # "another machine"
    code, err = cli_in_process(["method=fedmuon", *TINY, f"resume={split}"], split)
    assert code == 0, err
    assert OmegaConf.load(split / "config.yaml").method.ns_dtype == "float32"
    a, b = saved_model(straight, 3), saved_model(split, 3)
    assert all(torch.equal(a[k], b[k]) for k in a)
    bf16 = tmp_path / "bf16"  # and the precision matters: the same run in bf16 ends elsewhere
    assert cli_in_process(["method=fedmuon", *TINY], bf16)[0] == 0
    assert OmegaConf.load(bf16 / "config.yaml").method.ns_dtype == "bfloat16"
    c = saved_model(bf16, 3)
    assert any(not torch.equal(a[k], c[k]) for k in a)


def test_explicit_bf16_on_a_cpu_without_it_says_so_once_and_runs(cpu_without_bf16, tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="fl_lightning")
    code, err = cli_in_process(["method=fedmuon", "method.ns_dtype=bfloat16", *TINY, "fl.rounds=1"], tmp_path / "a")
    assert code == 0, err
    lines = [r.getMessage() for r in caplog.records if "without native bf16" in r.getMessage()]
    assert lines == ["method.ns_dtype=bfloat16 on a CPU without native bf16: its matrix products run about 36x slower "
                     "than fp32 here; method.ns_dtype=auto (or float32) runs Newton-Schulz in fp32"]
    caplog.clear()
    code, err = cli_in_process(["method=fedavg", "trainer.precision=bf16-mixed", *TINY, "fl.rounds=1"], tmp_path / "b")
    assert code == 0, err
    lines = [r.getMessage() for r in caplog.records if "without native bf16" in r.getMessage()]
    assert lines == ["trainer.precision=bf16-mixed on a CPU without native bf16: matrix products run about 36x slower "
                     "than fp32 here; trainer.precision=32-true is faster"]


def test_no_line_where_bf16_is_native(cpu_with_bf16, tmp_path):
    cfg = make_cfg(["method=fedmuon", "method.ns_dtype=bfloat16", "trainer.precision=bf16-mixed"], tmp_path)
    assert precision.warn_slow_bf16(cfg, "cpu") == [] and precision.warn_slow_bf16(cfg, "cuda") == []


def test_the_slowdown_is_measured_here():
    assert precision.cpu_bf16_slowdown() > 0


def test_newton_schulz_in_the_resolved_fp32_agrees_with_float64():
    torch.manual_seed(0)
    G = torch.randn(192, 768)
    ref = orthogonalize(G.double(), 5, "muon")
    for dtype in (None, "float32"):
        got = orthogonalize(G, 5, "muon", dtype=dtype)
        assert got.dtype == torch.float32
        assert float((got.double() - ref).norm() / ref.norm()) <= 1e-5


def test_the_optimizer_alone_resolves_auto_by_its_params_device(cpu_without_bf16, monkeypatch):
    G = torch.randn(16, 32)
    assert torch.equal(orthogonalize(G, 5, dtype="auto"), orthogonalize(G, 5, dtype=None))
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: True)
    assert torch.equal(orthogonalize(G, 5, dtype="auto"), orthogonalize(G, 5, dtype="bfloat16"))
