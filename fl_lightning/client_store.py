"""ClientStateStore: every client's private state, off the device.

A client's state (optimizer moments, control variates, momenta, ...) is a flat ``{name: tensor}`` dict. It lives
in CPU memory (pinned when the device is a GPU, so the copy in overlaps), or in one safetensors file per client
under ``offload_dir`` when it does not fit in memory. It is on the device only while that client trains
(``checkout`` / ``checkin``), so device memory does not grow with the number of clients (DESIGN invariant 4).
"""
from __future__ import annotations

import os

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor


class ClientStateStore:
    def __init__(self, device: torch.device | str = "cpu", offload_dir: str | None = None):
        self.device = torch.device(device)
        self.offload_dir = offload_dir
        self._mem: dict[int, dict[str, Tensor]] = {}
        self._pin = self.device.type == "cuda"
        if offload_dir:
            os.makedirs(offload_dir, exist_ok=True)

    def _path(self, cid: int) -> str:
        return os.path.join(self.offload_dir, f"client_{cid:06d}.safetensors")

    def get(self, cid: int) -> dict[str, Tensor]:
        """The stored (CPU) state of ``cid``; empty if it never trained."""
        if self.offload_dir:
            p = self._path(cid)
            return load_file(p) if os.path.exists(p) else {}
        return dict(self._mem.get(cid, {}))

    def put(self, cid: int, state: dict[str, Tensor]) -> None:
        cpu = {}
        for k, v in state.items():
            v = v.detach()
            if v.device.type != "cpu":
                host = torch.empty(v.shape, dtype=v.dtype, pin_memory=self._pin)
                host.copy_(v)
                v = host
            else:
                v = v.clone()
            cpu[k] = v.contiguous()
        if self.offload_dir:
            tmp = self._path(cid) + ".tmp"
            save_file(cpu, tmp)
            os.replace(tmp, self._path(cid))
        else:
            self._mem[cid] = cpu

    def checkout(self, cid: int) -> dict[str, Tensor]:
        """State of ``cid`` moved to the device (for the duration of its local training)."""
        return {k: v.to(self.device, non_blocking=True) for k, v in self.get(cid).items()}

    def checkin(self, cid: int, state: dict[str, Tensor]) -> None:
        self.put(cid, state)

    def clients(self) -> list[int]:
        if self.offload_dir:
            return sorted(int(f[7:13]) for f in os.listdir(self.offload_dir) if f.endswith(".safetensors"))
        return sorted(self._mem)

    def nbytes(self) -> int:
        return sum(v.numel() * v.element_size() for c in self.clients() for v in self.get(c).values())

    # --- checkpointing: one flat dict "<client>/<key>" ---
    def state_dict(self) -> dict[str, Tensor]:
        return {f"{c}/{k}": v for c in self.clients() for k, v in self.get(c).items()}

    def load_state_dict(self, flat: dict[str, Tensor]) -> None:
        per: dict[int, dict[str, Tensor]] = {}
        for key, v in flat.items():
            c, k = key.split("/", 1)
            per.setdefault(int(c), {})[k] = v
        self._mem.clear()
        for c, st in per.items():
            self.put(c, st)
