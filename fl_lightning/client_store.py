"""ClientStateStore: every client's private state, off the device.

A client's state (optimizer moments, control variates, momenta, ...) is a flat ``{name: tensor}`` dict. It lives
in CPU memory (pinned when the device is a GPU, so the copy in overlaps), or in one safetensors file per client
under ``offload_dir`` when it does not fit in memory (the store owns that folder: it locks it, and clears client files
it did not write itself, at start and when a checkpoint is restored). It is on the device only while that client trains
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
            self._lock = self._claim(offload_dir)
            self._clear_files()  # a fresh store starts empty: files left by an earlier or crashed run are not ours

    @staticmethod
    def _claim(offload_dir: str):
        """An exclusive lock on ``<offload_dir>/.lock`` for the store's life: two runs never share client files."""
        import fcntl

        from .errors import ConfigError

        os.makedirs(offload_dir, exist_ok=True)
        f = open(os.path.join(offload_dir, ".lock"), "a")
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.close()
            raise ConfigError("store.offload_dir", f"{offload_dir} is in use by another running job",
                              "give each run its own store.offload_dir") from None
        return f

    def _clear_files(self) -> None:
        for f in os.listdir(self.offload_dir):
            if f.startswith("client_") and (f.endswith(".safetensors") or f.endswith(".tmp")):
                os.remove(os.path.join(self.offload_dir, f))

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
        if self.offload_dir:  # files written after the checkpoint (a crashed round) must not survive the restore
            self._clear_files()
        for c, st in per.items():
            self.put(c, st)
