"""Where each client trains with several processes: the process that holds its state, else the least-loaded one by
local work, greedy longest-first; deterministic, so every process computes the same map."""
from __future__ import annotations


def assign_clients(work: list[float], world: int, clients=None, pinned=None) -> dict[int, int] | list[int]:
    """The process that trains each of ``clients`` (default: all, returned as a list): a client whose state a
    process holds (``pinned[c]`` >= 0) trains there; the others greedy longest-first, by decreasing local work (steps
    per round; they differ under ``local_epochs``), each to the least-loaded process (ties: lower id, lower rank).
    Deterministic, so every process computes the same map."""
    load, owner = [0.0] * world, {}
    todo = range(len(work)) if clients is None else clients
    for c in todo:
        if pinned is not None and pinned[c] >= 0:
            owner[c] = pinned[c]
            load[owner[c]] += work[c]
    for c in sorted((c for c in todo if c not in owner), key=lambda c: (-work[c], c)):
        r = min(range(world), key=lambda r: (load[r], r))
        owner[c], load[r] = r, load[r] + work[c]
    return [owner[c] for c in range(len(work))] if clients is None else owner
