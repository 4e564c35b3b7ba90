"""A client's local work in a round, as one value: ``steps`` minibatches (``fl.local_steps``, K) or ``epochs``
passes over its own data (``fl.local_epochs``, E), resolved per client by :meth:`StepBudget.steps_for`. The loop,
the data stream and the server's parts read it; nobody rebuilds K from a raw pair or from an upload."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StepBudget:
    steps: int | None = None
    epochs: int | None = None

    def __post_init__(self):
        if (self.steps is None) == (self.epochs is None):
            raise ValueError(f"a step budget is steps or epochs, got steps={self.steps}, epochs={self.epochs}")

    @property
    def fixed(self) -> int | None:
        """K when every client takes the same number of steps (``fl.local_steps``), else None."""
        return self.steps

    def steps_for(self, num_samples: int, batch_size: int) -> int:
        """The steps of a client with ``num_samples`` examples and minibatches of ``batch_size``: K, or E passes of
        ⌈n / min(batch, n)⌉ batches (the last one of a pass possibly smaller)."""
        if self.steps is not None:
            return int(self.steps)
        return int(self.epochs) * -(-num_samples // min(batch_size, num_samples))
