"""FederatedData: a dataset, its partition over clients, and per-client minibatch streams."""
from __future__ import annotations

from typing import Iterator

import numpy as np
import torch
from torch import Tensor

from .. import seeding
from ..config import StepBudget
from . import partition as part
from .info import DataInfo
from .tensors import TensorSet


class FederatedData:
    """Training set split over ``num_clients`` clients, plus the global test set, the held-out validation set
    (``val``, None unless ``data.val_fraction`` > 0) and the dataset's ``info``.

    ``client_batches(client, round, device, budget)`` yields that client's minibatches for one round from a
    generator seeded by (seed, client, round). With a budget of K steps (:class:`~fl_lightning.config.StepBudget`) the client
    draws a stream of shuffled passes over its data and takes K full batches (passes wrap around); with E epochs it
    makes E shuffled passes, the last batch of a pass possibly smaller.
    """

    AHEAD_ROWS = 1 << 16  # rows drawn ahead per copy: a round of any length plans in bounded memory

    def __init__(self, train: TensorSet, test: TensorSet, info: DataInfo, client_indices: list[np.ndarray],
                 batch_size: int, seed: int, eval_batch_size: int = 1024, val: TensorSet | None = None):
        self.train, self.test, self.info, self.val = train, test, info, val
        self.client_indices = [torch.as_tensor(i, dtype=torch.long) for i in client_indices]
        self.batch_size, self.seed, self.eval_batch_size = batch_size, seed, eval_batch_size
        self.stats = part.stats(train.labels.cpu().numpy(), client_indices)

    @property
    def num_classes(self) -> int | None:
        return self.info.num_classes

    @property
    def num_clients(self) -> int:
        return len(self.client_indices)

    def num_samples(self, client: int) -> int:
        return len(self.client_indices[client])

    def steps_per_round(self, client: int, budget: StepBudget) -> int:
        return budget.steps_for(self.num_samples(client), self.batch_size)

    def client_batches(self, client: int, round_idx: int, device, budget: StepBudget) -> Iterator[dict]:
        g = seeding.generator(self.seed, seeding.CLIENT_DATA, client, round_idx + 1)  # +1: the probe stream is round -1
        transform = self.train.transform
        draw = getattr(transform, "draw", None)
        plan = self._plan(client, g, budget, draw)
        if transform is not None and draw is None:  # a transform drawing from the generator itself: batch by batch
            for take, _ in plan:
                yield self.train.batch(take, device, g)
            return
        for chunk in _chunks(plan, self.AHEAD_ROWS):  # drawn ahead: indices and augmentation randomness of many
            order = torch.cat([take for take, _ in chunk]).to(self.train.device, non_blocking=True)  # batches move
            noise = [z for _, z in chunk if z is not None]                      # in one copy each, in bounded memory
            noise = torch.cat(noise, dim=1).to(device, non_blocking=True) if noise else None
            start = 0
            for take, _ in chunk:
                end = start + len(take)
                yield self.train.batch(order[start:end], device, g, None if noise is None else noise[:, start:end])
                start = end

    def cohort_batches(self, clients: list[int], round_idx: int, device, budget: StepBudget):
        """The batches of a cohort of clients (``trainer.cohort``, fl_lightning/cohort/), step by step, stacked:
        ``(batch (K, B, ...), 0/1 row mask (K, B), real rows (K,), active (K,), real rows as host numbers)``, each
        client's rows exactly those :meth:`client_batches` yields it (its own (seed, client, round) plan), padded to
        the batch size ``B``; a client whose steps are done is inactive (mask 0). The K clients' rows are gathered in
        one ``index_select`` a step. None when the transform draws randomness per batch (the caller stacks the
        clients' own batches)."""
        if self.train.transform is not None:
            return None
        return self._cohort_batches(clients, round_idx, device, budget)

    def _cohort_batches(self, clients: list[int], round_idx: int, device, budget: StepBudget):
        plans = [[take.numpy() for take, _ in self._plan(c, seeding.generator(self.seed, seeding.CLIENT_DATA, c,
                                                                                round_idx + 1), budget, None)]
                 for c in clients]
        T, K, B = max(len(p) for p in plans), len(clients), self.batch_size
        idx, rows = np.zeros((T, K, B), dtype=np.int64), np.zeros((T, K), dtype=np.int64)
        for i, plan in enumerate(plans):  # host arrays: no kernel per batch
            for t, take in enumerate(plan):
                idx[t, i, :len(take)], rows[t, i] = take, len(take)
        src = self.train.device
        idx_t = torch.from_numpy(idx).to(src, non_blocking=True)
        mask = torch.from_numpy((np.arange(B)[None, None, :] < rows[..., None]).astype(np.float32)).to(device,
                                                                                                   non_blocking=True)
        count = torch.from_numpy(np.maximum(rows, 1)).to(device, non_blocking=True)
        active = torch.from_numpy(rows > 0).to(device, non_blocking=True)
        for t in range(T):
            flat = idx_t[t].reshape(-1)
            batch = {k: v.index_select(0, flat).to(device, non_blocking=True).view(K, B, *v.shape[1:])
                     for k, v in self.train.tensors.items()}
            yield batch, mask[t], count[t], active[t], rows[t].tolist()

    def _plan(self, client: int, g: torch.Generator, budget: StepBudget, draw) -> Iterator[tuple[Tensor, Tensor | None]]:
        """(indices, augmentation randomness or None) per batch, drawn from ``g`` in the order the batches use them:
        shuffled passes wrapping around under ``local_steps``; whole passes under ``local_epochs``, the last batch
        of a pass possibly smaller."""
        idx = self.client_indices[client]
        n = len(idx)
        bs = min(self.batch_size, n)
        if budget.steps is not None:
            stream = torch.empty(0, dtype=torch.long)
            for _ in range(budget.steps):
                while len(stream) < bs:
                    stream = torch.cat([stream, idx[torch.randperm(n, generator=g)]])
                take, stream = stream[:bs], stream[bs:]
                yield take, draw(bs, g) if draw else None
        else:
            for _ in range(budget.epochs):
                order = idx[torch.randperm(n, generator=g)]
                for s in range(0, n, bs):
                    take = order[s : s + bs]
                    yield take, draw(len(take), g) if draw else None

    def extra_batch(self, client: int, round_idx: int, device) -> dict:
        """A minibatch from a stream of its own, seeded by (seed, client, round): for parts that need one gradient
        beyond the local steps (SCAFFOLD option I), without shifting the local steps' batches."""
        idx = self.client_indices[client]
        g = seeding.generator(self.seed, seeding.CLIENT_EXTRA, client, round_idx + 1)
        take = idx[torch.randperm(len(idx), generator=g)[: min(self.batch_size, len(idx))]]
        return self.train.batch(take, device, g)

    def probe_batch(self, client: int, device) -> dict:
        """One minibatch at a fixed stream (round -1): for strategies that initialise state from a gradient."""
        return next(self.client_batches(client, -1, device, StepBudget(steps=1)))

    def test_batches(self, device, split: str = "test") -> Iterator[dict]:
        """The test set (``split="val"``: the held-out validation set) in order, ``eval_batch_size`` at a time."""
        data = self.val if split == "val" else self.test
        for s in range(0, len(data), self.eval_batch_size):
            yield data.batch(torch.arange(s, min(s + self.eval_batch_size, len(data))), device)


def _chunks(plan: Iterator[tuple[Tensor, Tensor | None]], rows: int) -> Iterator[list]:
    """The plan's batches in lists of about ``rows`` rows (at least one batch each), drawn lazily in order."""
    chunk, n = [], 0
    for item in plan:
        chunk.append(item)
        n += len(item[0])
        if n >= rows:
            yield chunk
            chunk, n = [], 0
    if chunk:
        yield chunk
