"""Client files and the index: the changed clients' states as one safetensors file per checkpoint and process,
streamed from the store; the index of which checkpoint holds each client's state; compaction (which clients to
rewrite so an old, sparsely referred-to file can go); lazy reading on restore."""
from __future__ import annotations

import hashlib
import json
import math
import struct
from collections.abc import Iterator, Mapping

import numpy as np
import torch
from safetensors import safe_open
from torch import Tensor

from .format import _DTYPE_NAME
from .state import ClientShards

def _client_header(store: ClientShards, cids: list[int]) -> tuple[bytes, int]:
    """The start of the safetensors file of ``cids`` (keys ``<client>/<key>``; length and JSON header, from
    ``store.layout``) and the size of the data after it."""
    header: dict[str, dict] = {}
    end = 0
    for c in cids:
        for k, (dtype, shape) in sorted(store.layout(c).items()):
            n = math.prod(shape) * dtype.itemsize
            header[f"{c}/{k}"] = {"dtype": _DTYPE_NAME[dtype], "shape": list(shape), "data_offsets": [end, end + n]}
            end += n
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    return struct.pack("<Q", len(head)) + head, end


def _client_bytes(store: ClientShards, cids: list[int]) -> Iterator[np.ndarray]:
    """The file of ``cids`` block by block: its header, then each client's values (one client read at a time)."""
    head, end = _client_header(store, cids)
    yield np.frombuffer(head, dtype=np.uint8)
    written = 0
    for c in cids:
        state = store.get(c)
        for k in sorted(state):
            block = state[k].detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()
            written += len(block)
            yield block
    if written != end:
        raise RuntimeError("client states changed while their checkpoint file was written")


def _write_clients(path: str, store: ClientShards, cids: list[int]) -> str:
    """The states of ``cids`` as one safetensors file, streamed from ``store`` one client at a time. Returns the
    file's SHA-256 (not fsynced: :func:`_sync_files` does that, with the checkpoint's other files)."""
    digest = hashlib.sha256()
    with open(path, "wb") as f:
        for block in _client_bytes(store, cids):
            digest.update(block)
            f.write(block)
    return digest.hexdigest()


def _index(round_name: str, held: list[int], write: list[int], where: dict[int, str], digests: dict[str, str],
           sizes: dict[str, int], digest: str) -> tuple[tuple[dict, dict, dict], bytes]:
    """A process's client index after writing ``write`` into ``round_name``'s file (SHA-256 ``digest``): every client
    ``held`` -> the checkpoint holding its state, and those checkpoints' client-file checksums; and its JSON. Also
    (in memory only) how many clients each of those files holds."""
    where = {c: where.get(c, round_name) for c in held} | {c: round_name for c in write}
    digests = {r: digests[r] for r in set(where.values()) if r != round_name} | {round_name: digest}
    sizes = {r: sizes[r] for r in digests if r in sizes} | {round_name: len(write)}
    blob = json.dumps({"clients": {str(c): r for c, r in where.items()}, "files": digests}).encode()
    return (where, digests, sizes), blob


def _sparse(where: dict[int, str], sizes: dict[str, int], keep: list[int], fraction: float) -> list[int]:
    """The clients of ``keep`` whose state is in an earlier file of which at most ``fraction`` of the clients is still
    referred to: rewriting them lets pruning drop that file (checkpoints/ stays near the size of the states)."""
    live: dict[str, int] = {}
    for c in keep:
        live[where[c]] = live.get(where[c], 0) + 1
    sparse = {r for r, k in live.items() if r in sizes and k <= fraction * sizes[r]}
    return [c for c in keep if where[c] in sparse]


class _LazyTensors(Mapping):
    """``{key: tensor}`` over safetensors files, each value read when asked for (one client at a time on restore)."""

    def __init__(self, where: dict[str, str], index: tuple[dict[int, str], dict[str, str], dict[str, int]]):
        self._where, self.index, self._open = where, index, {}

    @classmethod
    def merged(cls, parts: list["_LazyTensors"], claim) -> "_LazyTensors":
        """The clients ``claim(cid)`` takes from several processes' files (a checkpoint written by another number of
        processes). Without an index: the next checkpoint writes these clients again, into this process's file."""
        where = {k: p for part in parts for k, p in part._where.items() if claim(int(k.split("/", 1)[0]))}
        return cls(where, ({}, {}, {}))

    def __getitem__(self, key: str) -> Tensor:
        path = self._where[key]
        if path not in self._open:
            self._open[path] = safe_open(path, "pt")
        return self._open[path].get_tensor(key)

    def __iter__(self) -> Iterator[str]:
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)
