"""Aggregate: the streaming weighted sums of a round's uploads, summed across processes (``all_reduce``)."""
from __future__ import annotations

import torch
from torch import Tensor

from ..messages import Msg


class Aggregate:
    """Streaming weighted sums of the uploads of one round; :meth:`all_reduce` sums them across processes."""

    def __init__(self, num_clients: int):
        self.num_clients = num_clients
        self.num_sampled = 0
        self.steps = 0  # the local steps of the round's clients, summed (the loop knows them: no upload)
        self.sums: dict[str, Tensor] = {}
        self.weights: dict[str, float] = {}

    def add(self, msgs: dict[str, Msg], steps: int = 0) -> None:
        """Add one client's uploads (and its local ``steps``): the running sums of keys already seen in one
        multi-tensor op per weight."""
        self.num_sampled += 1
        self.steps += int(steps)
        adds: dict[float, tuple[list[Tensor], list[Tensor]]] = {}
        for k, m in msgs.items():
            t = m.tensor.detach()
            if t.dtype in (torch.float16, torch.bfloat16):  # accumulate half precision in fp32; fp32/fp64 stay
                t = t.float()
            if k in self.sums:
                sums, ts = adds.setdefault(m.weight, ([], []))
                sums.append(self.sums[k])
                ts.append(t)
            else:
                self.sums[k] = t.mul(m.weight) if m.weight != 1.0 else t.clone()
                self.weights[k] = 0.0
            self.weights[k] += m.weight
        for w, (sums, ts) in adds.items():
            torch._foreach_add_(sums, ts, alpha=w)

    def all_reduce(self, reduce_sum, gather_object, device) -> None:
        """Sum every process's sums, weights and client count (``reduce_sum(tensor) -> tensor``, ``gather_object(obj)
        -> [obj of each rank]``). A key only some processes saw (no sampled client of theirs uploaded it) enters
        as zeros there. Keys are reduced in sorted order, the same on every process, packed into one flat buffer per dtype
        (one all-reduce each, not one per key)."""
        union: dict[str, tuple] = {}
        for meta in gather_object({k: (tuple(v.shape), str(v.dtype)) for k, v in self.sums.items()}):
            union.update(meta)
        keys = sorted(union)
        for k in keys:
            if k not in self.sums:
                shape, dtype = union[k]
                self.sums[k] = torch.zeros(shape, dtype=getattr(torch, dtype.split(".")[-1]), device=device)
                self.weights[k] = 0.0
        by_dtype: dict[torch.dtype, list[str]] = {}
        for k in keys:  # one flat buffer per dtype: one collective each instead of one per key
            by_dtype.setdefault(self.sums[k].dtype, []).append(k)
        for ks in by_dtype.values():
            flat = reduce_sum(torch.cat([self.sums[k].reshape(-1) for k in ks]))
            for k, part in zip(ks, flat.split([self.sums[k].numel() for k in ks])):
                self.sums[k] = part.view(self.sums[k].shape)
        w = reduce_sum(torch.tensor([self.weights[k] for k in keys] + [self.num_sampled, self.steps], dtype=torch.float64,
                                    device=device))
        for i, k in enumerate(keys):
            self.weights[k] = float(w[i])
        self.num_sampled, self.steps = int(w[-2]), int(w[-1])

    def sum(self, key: str) -> Tensor:
        return self.sums[key]

    def mean(self, key: str) -> Tensor:
        return self.sums[key] / self.weights[key]

    def mean_steps(self) -> float:
        """The mean local steps of the round's clients (K under ``fl.local_steps``; under ``fl.local_epochs`` each
        client's own, from its data size)."""
        return self.steps / self.num_sampled

    def keys(self, prefix: str = "") -> list[str]:
        return [k for k in self.sums if k.startswith(prefix)]
