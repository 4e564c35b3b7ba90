"""The checkpointer's shared state: where it writes, its rank, the in-memory client index."""
from __future__ import annotations

import re
import threading
from typing import Callable

from .format import list_checkpoints

class _CheckpointerBase:
    """Where and for whom checkpoints are written (see :class:`fl_lightning.checkpoint.Checkpointer`)."""

    def __init__(self, root: str, *, config_hash: str = "", keep_last: int = 2, rank: int = 0, world_size: int = 1,
                 barrier: Callable[[], None] | None = None, per_rank: tuple[str, ...] = ("clients",),
                 background_bytes: int = 0, compact: float = 0.0):
        self.background_bytes, self.compact = int(background_bytes), float(compact)
        self._thread: threading.Thread | None = None  # the checkpoint being written behind
        self._error: BaseException | None = None  # its failure, re-raised by wait()
        self.root, self.config_hash, self.keep_last = root, config_hash, int(keep_last)
        self.rank, self.world_size, self.per_rank = rank, world_size, tuple(per_rank)
        self.barrier = barrier or (lambda: None)
        # which clients' states this process takes from a checkpoint written by another number of processes (the
        # loop sets it: each client's home process)
        self.claim: Callable[[int], bool] = lambda cid: True
        self.last: str | None = None  # the newest checkpoint written or loaded
        # per per-rank object: the checkpoint holding each client's saved state, the SHA-256 of those checkpoints'
        # client files and how many clients each file holds
        self._index: dict[str, tuple[dict[int, str], dict[str, str], dict[str, int]]] = {}

    def newest(self) -> str | None:
        """The newest complete checkpoint of this run: the one this process wrote or loaded last, or a newer one on
        disk (rank 0 renames a checkpoint into place before the others pass the barrier that tells them, so a peer
        lost in between leaves a complete checkpoint this process has not heard of)."""
        found = list_checkpoints(self.root)
        return found[-1] if found else self.last

    def _stem(self, name: str, rank: int | None = None) -> str:
        return f"{name}.rank{self.rank if rank is None else rank}" if name in self.per_rank else name

    def _regroups(self, meta: dict) -> bool:
        """Was the checkpoint of ``meta`` written by another number of processes (its client states shared out again)?"""
        return meta.get("world_size", 1) != self.world_size

    def _sync(self) -> None:
        if self.world_size > 1:
            self.barrier()

    def _rank_file(self, f: str, ext: str) -> bool:
        """Whether ``f`` is a per-rank object's client file (``.safetensors``) or index (``.json``)."""
        stem, _, rest = f.partition(".rank")
        return stem in self.per_rank and re.fullmatch(r"\d+" + re.escape(ext), rest) is not None

