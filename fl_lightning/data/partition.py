"""Client partitioners: who holds which training examples.

A partitioner is a function ``fn(labels, num_clients, rng, **options) -> list[np.ndarray]`` (one sorted index
array per client), named by ``data.partition._target_`` (``conf/data/partition/<name>.yaml``; switch with
``data/partition=iid``). The data builder passes the training labels, ``fl.num_clients`` and
``rng = np.random.default_rng([seed, 0x9A27])``, so a partition is a deterministic function of the run seed.
An option a partitioner rejects raises ``ConfigError(<option>, ...)``, reported as ``data.partition.<option>``.
The forms the seeds use:

* ``iid``: a random equal split.
* ``dirichlet_per_class`` (``dirichlet``; per-class proportions over clients, Yurochkin et al. 2019 / Hsu et al.
  2019 as most FL code implements it; seeds 000, 002, 003): for every class c draw ``p_c ~ Dir(alpha * 1_n)`` and
  split the class's examples over the clients in those proportions. Client sizes are unequal.
* ``dirichlet_per_client`` (seed 004's code, ``dirichlet_data.py``; the paper says only "Dirichlet partitioning
  (Hsu et al., 2019)", Sec. 7): every client draws a class distribution ``q_j ~ Dir(alpha * 1_C)`` and then
  ``len(train)/n`` labels from it, taking the next example of that class from a shuffled pool that restarts when
  exhausted. Equal client sizes; an example may sit on two clients.
* ``shards`` (McMahan et al. 2017): sort by label, cut into ``n * shards_per_client`` shards, deal them out.
* ``natural`` (LEAF's natural split, Caldas et al. 2018, arXiv 1812.01097): client = group of the dataset's
  ``group`` tensor (Sentiment140: the tweet's user); ``fl.num_clients=auto`` takes the number of groups.
* ``by_group``: ``fl.num_clients`` clients, each group whole on one client (C4: a sequence's URL host, a non-IID
  split by source domain), groups dealt largest first to the client holding the fewest examples.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Annotated

import numpy as np

from ..errors import ConfigError
from ..config import Positive, Range


def iid(labels: np.ndarray, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    """A uniformly random split into ``num_clients`` parts of (almost) equal size."""
    perm = rng.permutation(len(labels))
    return [np.sort(part) for part in np.array_split(perm, num_clients)]


def dirichlet_per_class(labels: np.ndarray, num_clients: int, rng: np.random.Generator, alpha: Positive,
                        min_size: Annotated[int, Range(0, 10**9)] = 1,
                        max_tries: Annotated[int, Range(1, 1 << 20)] = 1000) -> list[np.ndarray]:
    """Per-class Dirichlet(alpha) proportions over clients (Hsu et al. 2019); redrawn until every client holds
    ``min_size`` examples (at most ``max_tries`` draws)."""
    alpha = float(alpha)
    classes = np.unique(labels)
    for _ in range(int(max_tries)):
        parts: list[list[int]] = [[] for _ in range(num_clients)]
        for c in classes:
            idx = rng.permutation(np.flatnonzero(labels == c))
            p = rng.dirichlet(np.full(num_clients, alpha))
            cuts = (np.cumsum(p)[:-1] * len(idx)).astype(int)
            for client, chunk in enumerate(np.split(idx, cuts)):
                parts[client].extend(chunk.tolist())
        if min(len(p) for p in parts) >= int(min_size):
            return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]
    raise ConfigError(
        "min_size",
        f"no Dirichlet(alpha={alpha}) split gave every one of {num_clients} clients >= {min_size} examples in {max_tries} tries",
        "raise data.partition.alpha, lower data.partition.min_size or use fewer clients (fl.num_clients)",
    )


def dirichlet_per_client(labels: np.ndarray, num_clients: int, rng: np.random.Generator, alpha: Positive,
                         samples_per_client: Annotated[int, Range(1, 10**9)] | None = None) -> list[np.ndarray]:
    """Per-client Dirichlet(alpha) class mix, equal sizes (seed 004's ``dirichlet_data.py``); ``samples_per_client``
    defaults to ``len(labels) // num_clients``."""
    alpha = float(alpha)
    classes = np.unique(labels)
    per_client = int(samples_per_client or len(labels) // num_clients)
    pools = {c: rng.permutation(np.flatnonzero(labels == c)) for c in classes}
    cursor = {c: 0 for c in classes}
    q = rng.dirichlet(np.full(len(classes), alpha), size=num_clients)
    parts = []
    for j in range(num_clients):
        drawn = rng.choice(len(classes), size=per_client, p=q[j])
        out = np.empty(per_client, dtype=np.int64)
        for t, ci in enumerate(drawn):
            c = classes[ci]
            if cursor[c] >= len(pools[c]):  # pool exhausted: reshuffle and restart (decision 004/AMBIG-22)
                pools[c] = rng.permutation(pools[c])
                cursor[c] = 0
            out[t] = pools[c][cursor[c]]
            cursor[c] += 1
        parts.append(np.sort(out))
    return parts


def shards(labels: np.ndarray, num_clients: int, rng: np.random.Generator,
           shards_per_client: Annotated[int, Range(1, 1 << 20)] = 2) -> list[np.ndarray]:
    """Label-sorted shards, ``shards_per_client`` to each client (McMahan et al. 2017)."""
    k = int(shards_per_client)
    order = np.argsort(labels, kind="stable")
    pieces = np.array_split(order, num_clients * k)
    deal = rng.permutation(len(pieces))
    return [np.sort(np.concatenate([pieces[i] for i in deal[j * k : (j + 1) * k]])) for j in range(num_clients)]


def natural(labels: np.ndarray, num_clients: int | None, rng: np.random.Generator, groups=None,
            min_size: Annotated[int, Range(1, 10**9)] = 1) -> list[np.ndarray]:
    """One client per group (``groups``: the dataset's ``group`` tensor, passed by the data builder), groups in id
    order; groups with fewer than ``min_size`` examples are left out (their examples train nobody). The number of
    clients is the number of groups kept (``fl.num_clients=auto``)."""
    if groups is None:
        raise ConfigError("_target_", "the dataset has no 'group' tensor to split by (client = user)",
                          "use a dataset with natural groups (data=sentiment140) or another partitioner")
    g = np.asarray(groups)
    order = np.argsort(g, kind="stable")
    cuts = np.flatnonzero(np.diff(g[order])) + 1
    parts = [np.sort(p) for p in np.split(order, cuts) if len(p) >= int(min_size)]
    if not parts:
        raise ConfigError("min_size", f"no group has {min_size} examples", "lower data.partition.min_size")
    return parts


def by_group(labels: np.ndarray, num_clients: int | None, rng: np.random.Generator, groups=None) -> list[np.ndarray]:
    """Every group whole on one client: groups by decreasing size (ties in a random order from ``rng``), each to the
    client with the fewest examples so far (ties: lower id), so client sizes come out nearly equal."""
    if groups is None:
        raise ConfigError("_target_", "the dataset has no 'group' tensor to split by",
                          "use a dataset with groups (data=c4: URL hosts) or another partitioner")
    if num_clients is None:
        raise ConfigError("_target_", "needs a number of clients (fl.num_clients=auto is one client per group)",
                          "give fl.num_clients a number, or use data/partition=natural")
    _, inverse, counts = np.unique(np.asarray(groups), return_inverse=True, return_counts=True)
    order = rng.permutation(len(counts))
    order = order[np.argsort(-counts[order], kind="stable")]
    heap, owner = [(0, c) for c in range(num_clients)], np.empty(len(counts), dtype=np.int64)
    for gi in order:
        load, c = heapq.heappop(heap)
        owner[gi] = c
        heapq.heappush(heap, (load + int(counts[gi]), c))
    client = owner[inverse.ravel()]
    by_client = np.argsort(client, kind="stable")
    return np.split(by_client, np.cumsum(np.bincount(client, minlength=num_clients))[:-1])


@dataclass
class PartitionStats:
    sizes: np.ndarray
    classes_per_client: np.ndarray

    def summary(self) -> str:
        s = self.sizes
        return (
            f"{len(s)} clients, sizes min/median/max = {s.min()}/{int(np.median(s))}/{s.max()}, "
            f"classes per client mean = {self.classes_per_client.mean():.1f}"
        )


def stats(labels: np.ndarray, parts: list[np.ndarray]) -> PartitionStats:
    return PartitionStats(
        sizes=np.array([len(p) for p in parts]),
        classes_per_client=np.array([len(np.unique(labels[p])) for p in parts]),
    )
