"""``trainer.processes_per_device``: the strategy that puts several processes on each device, and its one-line errors
(the two-process run on the CPU: tests/system/test_multiprocess.py)."""
from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from fl_lightning.run.build import shared_devices
from fl_lightning.errors import ConfigError
from fl_lightning.config.checks import check_overrides


def _trainer(**kw):
    base = dict(accelerator="cuda", devices=1, processes_per_device=4, strategy="auto")
    return OmegaConf.create({**base, **kw})


def test_four_processes_on_one_gpu_use_gloo(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    strategy, devices = shared_devices(_trainer())
    assert strategy.parallel_devices == [torch.device("cuda", 0)] * 4
    assert strategy.num_processes == 4 and strategy._process_group_backend == "gloo"
    assert devices == [0]
    strategy, devices = shared_devices(_trainer(devices="auto", processes_per_device=2))  # both GPUs, two each
    assert strategy.parallel_devices == [torch.device("cuda", i) for i in (0, 0, 1, 1)] and devices == [0, 1]


def test_on_the_cpu_it_is_that_many_processes():
    strategy, devices = shared_devices(_trainer(accelerator="cpu", processes_per_device=3))
    assert strategy.parallel_devices == [torch.device("cpu")] * 3 and devices == 1


@pytest.mark.parametrize("kw,key", [
    (dict(strategy="fsdp"), "trainer.strategy:"),
    (dict(accelerator="mps"), "trainer.processes_per_device:"),
    (dict(devices=3), "trainer.devices:"),
])
def test_what_cannot_share_a_device_is_one_line(monkeypatch, kw, key):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ConfigError) as err:
        shared_devices(_trainer(**kw))
    assert str(err.value).startswith(f"config error: {key}") and "\n" not in str(err.value)


@pytest.mark.parametrize("value", ["0", "-1", "2.5", "abc", "65"])
def test_a_bad_count_is_one_line(value):
    with pytest.raises(ConfigError, match="trainer.processes_per_device:"):
        check_overrides([f"trainer.processes_per_device={value}"])
