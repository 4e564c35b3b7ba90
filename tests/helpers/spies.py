"""Parts that record what other parts did (inserted into a Strategy's parts list by tests)."""
from __future__ import annotations

from fl_lightning.strategies.base import Part


class Recorder(Part):
    """A test's instrument: what it records is no state of the run, so the unsaved-state check at each checkpoint
    (fl_lightning/strategies/unsaved.py) leaves every attribute of it alone."""

    @property
    def scratch(self) -> tuple[str, ...]:
        return tuple(vars(self))


class MomentumSpy(Recorder):
    """After the momentum part: at client_start record the optimizer momenta; at client_end the final ones."""

    def __init__(self):
        self.starts, self.ends = [], []

    def client_start(self, client):
        opt = client.optimizer
        self.starts.append((client.round, client.id, {n: opt.momentum_buffer(p).clone() for n, p in client.params.items()
                                                      if opt.param_kind(p) == "muon"}))

    def client_end(self, client):
        opt = client.optimizer
        self.ends.append((client.round, client.id, {n: opt.momentum_buffer(p).clone() for n, p in client.params.items()
                                                    if opt.param_kind(p) == "muon"}))
        return {}


class StateSpy(Recorder):
    """After a state-moving part: the optimizer state of every param (through its adapter) at client_start and at
    client_end, as ``(round, client, {name: {entry: tensor}})``."""

    def __init__(self):
        self.starts, self.ends = [], []

    @staticmethod
    def _snap(client):
        from fl_lightning.optim import adapter_for

        a = adapter_for(client.optimizer)
        return {n: {k: v.clone() for k, v in a.export_state(p).items()} for n, p in client.params.items()}

    def client_start(self, client):
        self.starts.append((client.round, client.id, self._snap(client)))

    def client_end(self, client):
        self.ends.append((client.round, client.id, self._snap(client)))
        return {}
