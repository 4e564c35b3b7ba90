"""Writing a checkpoint: the snapshot taken in ``save()``, written in ``save()`` or by a thread behind the next round,
then committed (manifest, rename) and pruned."""
from __future__ import annotations

import json
import logging
import os
import shutil
import threading
from collections.abc import Mapping
from typing import Any

import numpy as np
from safetensors.torch import save as safetensors_bytes
from safetensors.torch import save_file
from torch import Tensor

from ._base import _CheckpointerBase
from .clients import _client_bytes, _index, _sparse, _write_clients
from .files import _fsync, _put, _sync_files, _write_json
from .format import FORMAT, RETAINED, _nbytes, _split, list_checkpoints, move_aside
from .state import ClientShards, Stateful

log = logging.getLogger("fl_lightning")


class _Job:
    """One checkpoint, as taken by :meth:`Checkpointer._snapshot`. Written behind (``copied``): every file is already
    in memory (``files``: name -> bytes; the client files' bytes in ``clients``). Else the tensors are on the CPU and
    the client files are streamed from the stores when written."""

    def __init__(self, final: str, round_done: int, objects: list[str]):
        self.final, self.tmp, self.round_done, self.objects = final, final + ".tmp", round_done, objects
        self.copied = False
        self.states: dict[str, tuple[dict[str, Tensor] | None, dict[str, Any]]] = {}  # name -> (tensors, rest)
        self.files: dict[str, bytes] = {}
        # per-rank name -> (store or its file's bytes, held, write, where, digests, sizes)
        self.clients: dict[str, tuple] = {}
        self.stores: dict[str, ClientShards] = {}  # marked saved once the checkpoint is in place


class CheckpointWriter(_CheckpointerBase):
    """The saving half of :class:`~fl_lightning.checkpoint.Checkpointer`."""

    # ------------------------------------------------------------------ save
    def save(self, round_done: int, objects: Mapping[str, Stateful]) -> str:
        """Checkpoint ``objects`` after round ``round_done``; returns the checkpoint's path.

        With ``background_bytes`` > 0 and one process, the states are copied now and a thread writes, fsyncs and
        renames the checkpoint into place while the next round runs (when the client states to write are at most
        ``background_bytes``; more, as after a long ``checkpoint.every``, are written now, streamed from the store,
        so memory stays flat). At most one checkpoint is in flight: the next save, :meth:`wait` and every load wait
        for it first, and re-raise its error. With several processes the save has barriers, so it is written now."""
        self.wait()
        job = self._snapshot(round_done, objects)
        if job.copied:
            self._thread = threading.Thread(target=self._write_behind, args=(job,), name="fl-checkpoint")
            self._thread.start()
        else:
            self._write(job)
        return job.final

    def wait(self, quiet: bool = False) -> None:
        """Block until the checkpoint being written behind (if any) is in place; re-raise its error (log it, with
        ``quiet``, for a run that is failing anyway)."""
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join()
        err, self._error = self._error, None
        if err is not None:
            if not quiet:
                raise err
            log.error("the checkpoint written in the background failed: %s", err)

    def _write_behind(self, job: "_Job") -> None:
        """The thread's part: every file from memory (one write and one checksum each), fsync, commit."""
        try:
            self._fresh_tmp(job)
            files = {f: _put(os.path.join(job.tmp, f), data) for f, data in job.files.items()}
            index, indexes = self._save_clients(job)
            for f in os.listdir(job.tmp):
                _fsync(os.path.join(job.tmp, f))
            self._commit(job, files | indexes)
            self._done(job, index)
        except BaseException as err:  # re-raised in the main thread by wait()
            shutil.rmtree(job.tmp, ignore_errors=True)
            self._error = err

    def _snapshot(self, round_done: int, objects: Mapping[str, Stateful]) -> "_Job":
        """What a checkpoint writes, taken now: the objects' states and, per per-rank store, the clients to write. To
        be written behind, every file is made in memory now (a later round changes the states in place; one copy of
        the client states, which the thread writes in one call), else the tensors are taken to the CPU and the client
        states are streamed from the store when written."""
        final = os.path.join(self.root, f"round_{round_done:06d}")
        job = _Job(final, round_done, sorted(objects))
        plans = {}
        for name in self.per_rank:
            if name in objects:
                store = objects[name]
                where, digests, sizes = self._index.get(name, ({}, {}, {}))
                held, changed = store.clients(), store.changed()
                write = [c for c in held if c in changed or c not in where]
                if self.compact > 0:
                    written = set(write)
                    write += _sparse(where, sizes, [c for c in held if c not in written], self.compact)
                plans[name] = (store, held, write, where, digests, sizes)
        size = sum(_nbytes(plan[0].layout(c)) for plan in plans.values() for c in plan[2])
        job.copied = self.world_size == 1 and 0 < self.background_bytes and size <= self.background_bytes
        for name, obj in objects.items():
            if name not in self.per_rank:
                tensors, rest = _split(obj.state_dict())
                if job.copied:  # the file's bytes, and what meta.json gets
                    job.files[name + ".safetensors"] = safetensors_bytes(tensors)
                    tensors, rest = None, json.loads(json.dumps(rest))
                job.states[name] = (tensors, rest)
        for name, (store, *plan) in plans.items():
            if job.copied:
                job.clients[name] = (np.concatenate(list(_client_bytes(store, plan[1]))), *plan)
                store.mark_saved()  # the copy holds them; later changes go into the next checkpoint
            else:
                job.clients[name] = (store, *plan)
                job.stores[name] = store
        return job

    def _write(self, job: "_Job") -> None:
        """A checkpoint written in :meth:`save` (several processes: with barriers)."""
        tmp = job.tmp
        if self.rank == 0:
            self._fresh_tmp(job)
        self._sync()
        index, _ = self._save_clients(job)
        if self.world_size > 1:  # on disk before rank 0 lists them (one process: synced with rank 0's files below)
            _sync_files([os.path.join(tmp, self._stem(name) + ext) for name in index for ext in (".safetensors", ".json")])
        self._sync()  # every process's client files and index are in tmp
        if self.rank == 0:
            for name, (tensors, _) in job.states.items():
                save_file(tensors, os.path.join(tmp, name + ".safetensors"))
            files = sorted(os.listdir(tmp))  # each file's checksum (client files: in their index), all on disk
            listed = [f for f in files if not self._rank_file(f, ".safetensors")]
            unsynced = [f for f in files if f not in listed] if self.world_size == 1 else []
            digests = _sync_files([os.path.join(tmp, f) for f in listed + unsynced], digest=len(listed))
            self._commit(job, dict(zip(listed, digests)))
        self._sync()
        self._done(job, index)

    def _fresh_tmp(self, job: "_Job") -> None:
        os.makedirs(self.root, exist_ok=True)
        if os.path.isdir(job.tmp) and not os.path.islink(job.tmp):
            shutil.rmtree(job.tmp, ignore_errors=True)  # a write that was cut off
        elif os.path.lexists(job.tmp):
            os.remove(job.tmp)  # the staging name is ours: whatever else sits there is not a checkpoint
        os.makedirs(job.tmp)

    def _save_clients(self, job: "_Job") -> tuple[dict[str, tuple], dict[str, str]]:
        """This process's client files (from memory, or streamed from the store) and indexes in ``job.tmp``: the new
        indexes, and the index files' checksums."""
        index, digests = {}, {}
        for name, (source, held, write, where, old, sizes) in job.clients.items():
            path = os.path.join(job.tmp, self._stem(name) + ".safetensors")
            digest = _put(path, source) if job.copied else _write_clients(path, source, write)
            index[name], blob = _index(os.path.basename(job.final), held, write, where, old, sizes, digest)
            digests[self._stem(name) + ".json"] = _put(os.path.join(job.tmp, self._stem(name) + ".json"), blob)
        return index, digests

    def _done(self, job: "_Job", index: dict[str, tuple]) -> None:
        """The checkpoint is in place: later ones may refer to its client files."""
        self._index.update(index)
        for store in job.stores.values():
            store.mark_saved()
        self.last = job.final

    def _commit(self, job: "_Job", files: dict[str, str]) -> None:
        """Rank 0, every file of ``job.tmp`` on disk: meta.json (with ``files``' checksums), then the rename into place
        and the pruning."""
        meta: dict[str, Any] = {"format": FORMAT, "round": job.round_done, "config_hash": self.config_hash,
                                "world_size": self.world_size, "objects": job.objects,
                                "state": {name: rest for name, (_, rest) in job.states.items() if rest},
                                "files": dict(sorted(files.items()))}
        _write_json(meta, os.path.join(job.tmp, "meta.json"))
        _fsync(job.tmp)
        if os.path.isdir(job.final) and not os.path.islink(job.final):
            shutil.rmtree(job.final)
        elif os.path.lexists(job.final):
            move_aside(job.final)
        os.replace(job.tmp, job.final)
        _fsync(self.root)
        self.last = job.final  # complete on disk, whether or not the other processes reach the barrier after it
        if self.keep_last > 0:
            self._prune()

    def _prune(self) -> None:
        """Keep the newest ``keep_last`` checkpoints; an older one whose client files a kept one refers to is
        renamed ``round_N.clients`` and stripped to those files; retained folders nothing refers to any more go."""
        found = list_checkpoints(self.root)
        alive = set()
        for path in found[-self.keep_last:]:
            alive |= self._references(path)
        for path in found[: -self.keep_last]:
            if os.path.basename(path) not in alive:
                shutil.rmtree(path, ignore_errors=True)
                continue
            os.replace(path, path + RETAINED)
            for f in os.listdir(path + RETAINED):
                if not self._rank_file(f, ".safetensors"):
                    os.remove(os.path.join(path + RETAINED, f))
        for d in os.listdir(self.root):
            if d.endswith(RETAINED) and d[: -len(RETAINED)] not in alive:
                shutil.rmtree(os.path.join(self.root, d), ignore_errors=True)

    def _references(self, path: str) -> set[str]:
        """The checkpoints whose client files the indexes of ``path`` refer to (an unreadable index: none)."""
        found: set[str] = set()
        try:
            names = os.listdir(path)
        except OSError:  # unreadable: it refers to nothing we can keep
            return found
        for f in names:
            if self._rank_file(f, ".json"):
                try:
                    with open(os.path.join(path, f)) as fh:
                        found |= set(json.load(fh)["files"])
                except (OSError, ValueError, KeyError, TypeError):
                    pass
        return found

