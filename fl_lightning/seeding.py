"""Derived random streams. Every random choice is a pure function of (seed, purpose, ids...), so a client's
minibatch order depends only on (seed, client id, round): not on which other clients were sampled, on the
process count, or on whether the run was resumed (DESIGN invariant 1)."""
from __future__ import annotations

import numpy as np
import torch

SAMPLING, CLIENT_DATA, CLIENT_TORCH, CLIENT_EXTRA, CLIENT_PART = 1, 2, 3, 5, 6  # purpose ids (4 retired; never reused)
DP_NOISE, POISSON = 7, 8  # the server's DP noise of a round (fl_lightning/dp/), fl.sampling=poisson


def purpose_id(name: str) -> int:
    """A stable integer for a part's named random stream (``ClientContext.rng("hutchinson")``)."""
    import zlib

    return zlib.crc32(name.encode())


def derive(seed: int, *ids: int) -> int:
    """A 63-bit seed derived from ``seed`` and ``ids`` (numpy SeedSequence hashing)."""
    return int(np.random.SeedSequence([int(seed), *map(int, ids)]).generate_state(2, dtype=np.uint32).astype(np.uint64)
               .dot(np.array([1 << 31, 1], dtype=np.uint64)) & ((1 << 63) - 1))


def generator(seed: int, *ids: int, device="cpu") -> torch.Generator:
    g = torch.Generator(device=device)
    g.manual_seed(derive(seed, *ids))
    return g


def sample_clients(seed: int, round_idx: int, num_clients: int, per_round: int) -> list[int]:
    """Uniform without replacement, seeded by (seed, round)."""
    rng = np.random.default_rng(derive(seed, SAMPLING, round_idx))
    return sorted(rng.choice(num_clients, size=per_round, replace=False).tolist())


def poisson_clients(seed: int, round_idx: int, num_clients: int, q: float) -> list[int]:
    """Poisson sampling: each client joins independently with probability ``q``, seeded by (seed, round); the
    round's size is Binomial(num_clients, q) and may be 0."""
    rng = np.random.default_rng(derive(seed, POISSON, round_idx))
    return np.flatnonzero(rng.random(num_clients) < q).tolist()


def round_clients(seed: int, round_idx: int, num_clients: int, per_round: int, sampling: str = "fixed") -> list[int]:
    """Round ``round_idx``'s clients (``fl.sampling``): ``fixed``, :func:`sample_clients`; ``poisson``,
    :func:`poisson_clients` with q = per_round / num_clients."""
    if sampling == "poisson":
        return poisson_clients(seed, round_idx, num_clients, per_round / num_clients)
    return sample_clients(seed, round_idx, num_clients, per_round)
