"""Checkpointer: atomic, pickle-free, strictly loaded checkpoints of a dict of stateful objects.

The loop hands the checkpointer its stateful objects by name (the global model, the strategy, the client store,
the RNG, the run recorder, the loop's own counters), torchtitan-style. Each object has ``state_dict()`` returning a
flat ``{key: value}`` dict and ``load_state_dict(state)``. Tensor values go to ``<name>.safetensors``, everything
else (ints, floats, strings, lists of metric rows) to ``meta.json`` under the object's name. A checkpoint is a
directory ``checkpoints/round_000006/`` written to ``round_000006.tmp`` and renamed into place, so a crash never
leaves a half-written checkpoint under a real name; loading reads safetensors and JSON only, so it cannot run code.

Every file's SHA-256 is recorded in ``meta.json``; files and directories are fsynced before the rename. Resuming
verifies a checkpoint completely (checksums, readable safetensors, a finite global model) before loading anything,
and falls back to the previous checkpoint (``keep_last`` are kept) with one warning line when the newest is damaged.

Objects named in ``per_rank`` (the client store: each process keeps the states of the clients it trained) are saved
incrementally, each process writing its own files straight into the checkpoint folder: ``<name>.rank<K>.safetensors``
holds only the clients whose state changed since the previous checkpoint (``store.changed()``), written from the
store one client at a time; ``<name>.rank<K>.json`` (the index, whose checksum is in meta.json) names, for every
client the process holds, the checkpoint whose file has its current state, with the SHA-256 of each file it refers
to. Verifying a checkpoint checks every file its indexes refer to, so a damaged earlier file makes the checkpoint
damaged (and the resume falls back). Pruning keeps an old checkpoint's client files while a kept checkpoint refers to
them: the folder is renamed ``round_N.clients`` and everything else in it removed. Restoring reads the client states
lazily, one client at a time. A checkpoint's client files are thus only complete together with the earlier files of
the same ``checkpoints/`` folder. A file is kept whole while any of its clients is referred to, so with ``compact`` > 0,
once at most that fraction of a file's clients is still referred to, a save writes those clients again and pruning
drops the file (``tools/checkpoint_disk.py``: at 10 of 1,000 clients changed per checkpoint, ``checkpoints/`` holds
3.0× the client states without compaction, 2.0× with 0.25 for 1.28× the bytes written; at 100 of 1,000: 5.8×, 2.0×).

With one process a checkpoint is written behind the next round (``checkpoint.background_mb``, the most client-state
bytes to copy for it): :meth:`Checkpointer.save` copies the states and returns, a thread writes, checksums, fsyncs,
renames and prunes, and the next save, :meth:`~Checkpointer.wait` or load waits for it (one in flight; its error is
re-raised there). The rename is still the commit point: a crash while it is written leaves the previous checkpoint.

Loading is strict. The checkpoint must carry exactly the objects given; each object's ``load_state_dict`` receives a
:class:`TrackedState` that records which keys it read, and a key it asked for but the checkpoint lacks, or a key
the checkpoint holds but nothing read, is a one-line :class:`~fl_lightning.errors.ResumeError` naming the key (a
state layout that changed between code versions never silently restarts from scratch). ``force=True``
(``force_resume=true``) turns those errors into warnings and leaves the unmatched state as freshly initialised; it
also accepts a changed config hash.

A checkpoint written by W processes resumes on any other number W': every process reads every process's index, takes
the clients ``claim(cid)`` gives it (the loop: each client's home process under W'), and the next checkpoint writes
those states again into the new processes' files. The rank in a client file's name says which process wrote it; the
states in it are keyed by client id.
"""
from __future__ import annotations

from .format import FORMAT, RETAINED, DamagedCheckpoint, list_checkpoints
from .reader import CheckpointReader
from .state import ClientShards, MissingStateKey, Stateful, TensorDict, TorchRNG, TrackedState, load_strict
from .writer import CheckpointWriter


class Checkpointer(CheckpointWriter, CheckpointReader):
    """Saves and strictly loads ``{name: Stateful}`` (see the module docstring)."""


__all__ = ["FORMAT", "RETAINED", "Checkpointer", "ClientShards", "DamagedCheckpoint", "MissingStateKey", "Stateful",
           "TensorDict", "TorchRNG", "TrackedState", "list_checkpoints", "load_strict"]
