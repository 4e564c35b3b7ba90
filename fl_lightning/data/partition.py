"""Client partitioners: who holds which training examples.

All partitioners are deterministic functions of ``(labels, num_clients, seed)`` and return one index array per
client. The forms the seeds use:

* ``iid``: a random equal split.
* ``dirichlet`` (per-class proportions over clients, Yurochkin et al. 2019 / Hsu et al. 2019 as most FL code
  implements it; seeds 000, 002, 003): for every class c draw ``p_c ~ Dir(alpha * 1_n)`` and split the class's
  examples over the clients in those proportions. Client sizes are unequal.
* ``dirichlet_per_client`` (seed 004's code, spec 004 §4.1): every client draws a class distribution
  ``q_j ~ Dir(alpha * 1_C)`` and then ``len(train)/n`` labels from it, taking the next example of that class
  from a shuffled pool that restarts when exhausted. Equal client sizes; an example may sit on two clients.
* ``shards`` (McMahan et al. 2017): sort by label, cut into ``n * shards_per_client`` shards, deal them out.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError


def iid(labels: np.ndarray, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    perm = rng.permutation(len(labels))
    return [np.sort(part) for part in np.array_split(perm, num_clients)]


def dirichlet_per_class(
    labels: np.ndarray, num_clients: int, alpha: float, rng: np.random.Generator, min_size: int = 1, max_tries: int = 1000
) -> list[np.ndarray]:
    classes = np.unique(labels)
    for _ in range(max_tries):
        parts: list[list[int]] = [[] for _ in range(num_clients)]
        for c in classes:
            idx = rng.permutation(np.flatnonzero(labels == c))
            p = rng.dirichlet(np.full(num_clients, alpha))
            cuts = (np.cumsum(p)[:-1] * len(idx)).astype(int)
            for client, chunk in enumerate(np.split(idx, cuts)):
                parts[client].extend(chunk.tolist())
        if min(len(p) for p in parts) >= min_size:
            return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]
    raise ConfigError(
        "data.partition.min_size",
        f"no Dirichlet(alpha={alpha}) split gave every one of {num_clients} clients >= {min_size} examples in {max_tries} tries",
        "raise data.partition.alpha, lower data.partition.min_size or use fewer clients",
    )


def dirichlet_per_client(
    labels: np.ndarray, num_clients: int, alpha: float, rng: np.random.Generator, samples_per_client: int | None = None
) -> list[np.ndarray]:
    classes = np.unique(labels)
    per_client = samples_per_client or len(labels) // num_clients
    pools = {c: rng.permutation(np.flatnonzero(labels == c)) for c in classes}
    cursor = {c: 0 for c in classes}
    q = rng.dirichlet(np.full(len(classes), alpha), size=num_clients)
    parts = []
    for j in range(num_clients):
        drawn = rng.choice(len(classes), size=per_client, p=q[j])
        out = np.empty(per_client, dtype=np.int64)
        for t, ci in enumerate(drawn):
            c = classes[ci]
            if cursor[c] >= len(pools[c]):  # pool exhausted: reshuffle and restart (spec 004 §4.1)
                pools[c] = rng.permutation(pools[c])
                cursor[c] = 0
            out[t] = pools[c][cursor[c]]
            cursor[c] += 1
        parts.append(np.sort(out))
    return parts


def shards(labels: np.ndarray, num_clients: int, shards_per_client: int, rng: np.random.Generator) -> list[np.ndarray]:
    order = np.argsort(labels, kind="stable")
    pieces = np.array_split(order, num_clients * shards_per_client)
    deal = rng.permutation(len(pieces))
    return [
        np.sort(np.concatenate([pieces[k] for k in deal[j * shards_per_client : (j + 1) * shards_per_client]]))
        for j in range(num_clients)
    ]


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


def partition(labels: np.ndarray, num_clients: int, cfg, seed: int) -> list[np.ndarray]:
    """Dispatch on ``cfg.name``; check the result (every client holds data, or a one-line error)."""
    rng = np.random.default_rng([seed, 0x9A27])
    name = cfg.name
    if name == "iid":
        parts = iid(labels, num_clients, rng)
    elif name == "dirichlet":
        parts = dirichlet_per_class(labels, num_clients, float(cfg.alpha), rng, int(cfg.get("min_size", 1)))
    elif name == "dirichlet_per_client":
        parts = dirichlet_per_client(labels, num_clients, float(cfg.alpha), rng, cfg.get("samples_per_client"))
    elif name == "shards":
        parts = shards(labels, num_clients, int(cfg.get("shards_per_client", 2)), rng)
    else:
        raise ConfigError(
            "data.partition.name", f"unknown partitioner {name!r}", "use one of iid, dirichlet, dirichlet_per_client, shards"
        )
    empty = [i for i, p in enumerate(parts) if len(p) == 0]
    if empty:
        raise ConfigError(
            "fl.num_clients",
            f"client {empty[0]} received no training data ({len(empty)} empty of {num_clients})",
            "use fewer clients, a larger data.partition.alpha, or data.partition.min_size >= 1",
        )
    return parts


def stats(labels: np.ndarray, parts: list[np.ndarray]) -> PartitionStats:
    return PartitionStats(
        sizes=np.array([len(p) for p in parts]),
        classes_per_client=np.array([len(np.unique(labels[p])) for p in parts]),
    )
