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
also accepts a changed config hash. A different process count is always refused (client states are per process).
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
import shutil
import struct
import threading
from collections.abc import Iterator, Mapping
from typing import Any, Callable, Protocol

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load as safetensors_load
from safetensors.torch import save as safetensors_bytes
from safetensors.torch import save_file
from torch import Tensor

from .errors import ResumeError

log = logging.getLogger("fl_lightning")

FORMAT = 3
_NAME = re.compile(r"^round_(\d{6})$")
RETAINED = ".clients"  # suffix of a pruned checkpoint folder kept for the client files later checkpoints refer to
DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "I64": torch.int64,
          "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool}
_DTYPE_NAME = {v: k for k, v in DTYPES.items()}


class Stateful(Protocol):
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...


class ClientShards(Stateful, Protocol):
    """A per-process object saved incrementally (the ClientStateStore): ``{client: {key: tensor}}``."""
    def clients(self) -> list[int]: ...
    def changed(self) -> set[int]: ...
    def mark_saved(self) -> None: ...
    def layout(self, cid: int) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]: ...
    def get(self, cid: int) -> dict[str, Tensor]: ...


class MissingStateKey(KeyError):
    """A key an object asked for that the checkpoint does not hold."""


class TrackedState(Mapping):
    """A read-only view of saved state that records which keys were read.

    ``state[k]``, ``state.get(k)``, ``items()`` and ``values()`` mark keys as used; iteration, ``keys()`` and ``in``
    do not. ``sub("prefix/")`` is the view of the keys under a prefix (sharing the record). A missing key raises
    :class:`MissingStateKey` with its full name.
    """

    def __init__(self, data: Mapping[str, Any], prefix: str = "", used: set[str] | None = None):
        self._data, self._prefix = data, prefix
        self._used = used if used is not None else set()

    def __getitem__(self, key: str) -> Any:
        full = self._prefix + key
        if full not in self._data:
            raise MissingStateKey(full)
        self._used.add(full)
        return self._data[full]

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and (self._prefix + key) in self._data

    def __iter__(self) -> Iterator[str]:
        n = len(self._prefix)
        return (k[n:] for k in self._data if k.startswith(self._prefix))

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def get(self, key: str, default: Any = None) -> Any:
        return self[key] if key in self else default

    def sub(self, prefix: str) -> "TrackedState":
        return TrackedState(self._data, self._prefix + prefix, self._used)

    def unused(self) -> list[str]:
        return [k for k in self._data if k.startswith(self._prefix) and k not in self._used]


def load_strict(obj: Stateful, saved: Mapping[str, Any], where: str, force: bool = False) -> None:
    """``obj.load_state_dict`` on a tracked view of ``saved``; missing or unused keys are errors (warnings with
    ``force``). ``where`` names the object in messages."""
    state = TrackedState(saved)
    try:
        obj.load_state_dict(state)
    except MissingStateKey as err:
        msg = f"the checkpoint's {where} state lacks key {err.args[0]!r}"
        if not force:
            raise ResumeError(f"resume: {msg} (written by another code version or method?); resume with the code and "
                              "config that wrote it, or add force_resume=true to start what is missing fresh") from None
        log.warning("force_resume: %s; that state starts fresh", msg)
        return
    unused = state.unused()
    if unused:
        more = f" (and {len(unused) - 1} more)" if len(unused) > 1 else ""
        msg = f"the checkpoint's {where} state has key {unused[0]!r}{more} that nothing in this run reads"
        if not force:
            raise ResumeError(f"resume: {msg} (written by another code version or method?); resume with the code and "
                              "config that wrote it, or add force_resume=true to ignore it")
        log.warning("force_resume: %s; ignored", msg)


def list_checkpoints(ckpt_root: str) -> list[str]:
    if not os.path.isdir(ckpt_root):
        return []
    return [os.path.join(ckpt_root, n) for n in sorted(n for n in os.listdir(ckpt_root) if _NAME.match(n))]


def latest_checkpoint(ckpt_root: str) -> str | None:
    found = list_checkpoints(ckpt_root)
    return found[-1] if found else None


def _split(state: dict[str, Any]) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """The tensors of ``state`` on the CPU and the rest."""
    tensors = {k: v.detach().cpu().contiguous() for k, v in state.items() if isinstance(v, Tensor)}
    return tensors, {k: v for k, v in state.items() if not isinstance(v, Tensor)}


def _nbytes(layout: Mapping[str, tuple[torch.dtype, tuple[int, ...]]]) -> int:
    return sum(math.prod(shape) * dtype.itemsize for dtype, shape in layout.values())


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


def _write_json(obj: Any, path: str) -> None:
    with open(path, "w") as f:
        f.write(json.dumps(obj))
        f.flush()
        os.fsync(f.fileno())


def _digest(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _put(path: str, data) -> str:
    """Write ``data`` (bytes, or a uint8 array) to ``path`` in one call and return its SHA-256 from one call (not
    fsynced): a writer thread releases the interpreter lock twice per file, not per block."""
    with open(path, "wb") as f:
        f.write(data)
    return hashlib.sha256(data).hexdigest()


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sync_files(paths: list[str], digest: int = 0) -> list[str]:
    """Fsync ``paths`` concurrently (one journal commit can serve several: a checkpoint's files cost about one fsync,
    not one each); returns the SHA-256 of the first ``digest`` of them."""
    from concurrent.futures import ThreadPoolExecutor

    def one(i: int) -> str:
        _fsync(paths[i])
        return _digest(paths[i]) if i < digest else ""

    with ThreadPoolExecutor(max_workers=max(1, min(8, len(paths)))) as pool:
        return list(pool.map(one, range(len(paths))))[:digest]


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

    def __getitem__(self, key: str) -> Tensor:
        path = self._where[key]
        if path not in self._open:
            self._open[path] = safe_open(path, "pt")
        return self._open[path].get_tensor(key)

    def __iter__(self) -> Iterator[str]:
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)


def _segment(root: str, round_name: str, file: str) -> str:
    """Where a client file of checkpoint ``round_name`` is: in its folder, or in the folder pruning retained."""
    path = os.path.join(root, round_name, file)
    return path if os.path.exists(path) else os.path.join(root, round_name + RETAINED, file)


class DamagedCheckpoint(ResumeError):
    """A checkpoint whose files do not match their recorded checksums, cannot be read, or hold non-finite weights."""


class Checkpointer:
    """Saves and strictly loads ``{name: Stateful}`` (see the module docstring)."""

    def __init__(self, root: str, *, config_hash: str = "", keep_last: int = 2, rank: int = 0, world_size: int = 1,
                 barrier: Callable[[], None] | None = None, per_rank: tuple[str, ...] = ("clients",),
                 background_bytes: int = 0, compact: float = 0.0):
        self.background_bytes, self.compact = int(background_bytes), float(compact)
        self._thread: threading.Thread | None = None  # the checkpoint being written behind
        self._error: BaseException | None = None  # its failure, re-raised by wait()
        self.root, self.config_hash, self.keep_last = root, config_hash, int(keep_last)
        self.rank, self.world_size, self.per_rank = rank, world_size, tuple(per_rank)
        self.barrier = barrier or (lambda: None)
        self.last: str | None = None  # the newest checkpoint written or loaded
        # per per-rank object: the checkpoint holding each client's saved state, the SHA-256 of those checkpoints'
        # client files and how many clients each file holds
        self._index: dict[str, tuple[dict[int, str], dict[str, str], dict[str, int]]] = {}

    def _stem(self, name: str, rank: int | None = None) -> str:
        return f"{name}.rank{self.rank if rank is None else rank}" if name in self.per_rank else name

    def _sync(self) -> None:
        if self.world_size > 1:
            self.barrier()

    def _rank_file(self, f: str, ext: str) -> bool:
        """Whether ``f`` is a per-rank object's client file (``.safetensors``) or index (``.json``)."""
        stem, _, rest = f.partition(".rank")
        return stem in self.per_rank and re.fullmatch(r"\d+" + re.escape(ext), rest) is not None

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
        shutil.rmtree(job.tmp, ignore_errors=True)
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
        if os.path.exists(job.final):
            shutil.rmtree(job.final)
        os.replace(job.tmp, job.final)
        _fsync(self.root)
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
        for f in os.listdir(path):
            if self._rank_file(f, ".json"):
                try:
                    with open(os.path.join(path, f)) as fh:
                        found |= set(json.load(fh)["files"])
                except (OSError, ValueError, KeyError, TypeError):
                    pass
        return found

    # ------------------------------------------------------------------ load
    def latest(self) -> str | None:
        return latest_checkpoint(self.root)

    def load_latest_good(self, objects: Mapping[str, Stateful], force: bool = False, root: str | None = None) -> str | None:
        """Restore from the newest checkpoint that is intact; a damaged one (see :meth:`verify`) is reported in one
        warning line and the previous one is tried. None if there is no checkpoint at all; a one-line
        :class:`DamagedCheckpoint` if every one is damaged. A mismatch of config or state layout is not damage: it
        stops the resume (strict loading)."""
        self.wait()
        root = root or self.root
        found = list_checkpoints(root)
        if not found:
            return None
        problems = []
        for path in reversed(found):
            try:
                states, meta = self.verify(path, objects)
            except DamagedCheckpoint as err:
                problems.append(str(err))
                log.warning("%s; trying the previous checkpoint", err)
                continue
            self._restore(path, states, meta, objects, force)
            return path
        raise DamagedCheckpoint(f"resume: every checkpoint under {root} is damaged (newest: {problems[0]})")

    def verify(self, path: str, objects: Mapping[str, Stateful]) -> tuple[dict[str, Mapping], dict]:
        """Read a checkpoint completely without touching ``objects``: meta.json parses, every file matches the
        checksum recorded at save time and reads as safetensors, and the global model's tensors are finite. Returns
        the tensors per object and the meta; raises :class:`DamagedCheckpoint` (one line) otherwise."""
        meta_path = os.path.join(path, "meta.json")
        try:
            with open(meta_path) as f:
                meta = json.load(f)
            if not isinstance(meta, dict):
                raise ValueError("not a JSON object")
        except (OSError, ValueError) as err:
            raise DamagedCheckpoint(f"resume: checkpoint {path} is damaged: cannot read meta.json ({err})") from None
        if meta.get("format") != FORMAT:
            raise ResumeError(f"resume: {path} was written in checkpoint format {meta.get('format', 1)}, this version "
                              f"reads format {FORMAT}; finish that run with the version that started it")
        ours = set(objects) & set(meta.get("objects", ()))
        mine = {self._stem(name) + (".json" if name in self.per_rank else ".safetensors"): name for name in ours}
        blobs: dict[str, bytes] = {}  # every file is read once: checksummed, and parsed from the same bytes if ours
        states: dict[str, Mapping] = {}
        for f, digest in meta.get("files", {}).items():
            try:
                with open(os.path.join(path, f), "rb") as fh:
                    data = fh.read()
            except OSError:
                raise DamagedCheckpoint(f"resume: checkpoint {path} is damaged: {f} is missing") from None
            if hashlib.sha256(data).hexdigest() != digest:
                raise DamagedCheckpoint(f"resume: checkpoint {path} is damaged: {f} is not what was saved (checksum)")
            if self._rank_file(f, ".json"):  # every process's clients, checked
                clients = self._clients(path, f, data)
                if f in mine:
                    states[mine[f]] = clients
            elif f in mine:
                blobs[f] = data
        for f, name in mine.items():
            if name in states:
                continue
            if f not in blobs:
                raise DamagedCheckpoint(f"resume: checkpoint {path} is damaged: {f} is missing")
            try:
                states[name] = dict(safetensors_load(blobs.pop(f)))
            except Exception as err:
                raise DamagedCheckpoint(f"resume: checkpoint {path} is damaged: cannot read {f} "
                                        f"({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''})") from None
        for k, t in states.get("model", {}).items():
            if t.is_floating_point() and not bool(t.isfinite().all()):
                raise DamagedCheckpoint(f"resume: checkpoint {path} is damaged: the model's {k} holds NaN or inf")
        return states, meta

    def _clients(self, path: str, f: str, data: bytes) -> _LazyTensors:
        """The client states an index refers to, after checking each client file it names against its checksum
        (a damaged or missing earlier file makes this checkpoint damaged)."""
        damaged = f"resume: checkpoint {path} is damaged"
        try:
            index = json.loads(data)
            where = {int(c): str(r) for c, r in index["clients"].items()}
            digests = {str(r): str(d) for r, d in index["files"].items()}
        except (ValueError, KeyError, TypeError, AttributeError):
            raise DamagedCheckpoint(f"{damaged}: cannot read {f}") from None
        root, file = os.path.dirname(path), f[: -len(".json")] + ".safetensors"
        keys: dict[str, str] = {}
        sizes: dict[str, int] = {}  # clients per file (what compaction weighs against the clients still referred to)
        for r, digest in sorted(digests.items()):
            seg = _segment(root, r, file)
            try:
                if _digest(seg) != digest:
                    raise DamagedCheckpoint(f"{damaged}: {r}/{file} is not what was saved (checksum)")
                with safe_open(seg, "pt") as fh:
                    names = list(fh.keys())
            except OSError:
                raise DamagedCheckpoint(f"{damaged}: {r}/{file}, which it refers to, is missing") from None
            except DamagedCheckpoint:
                raise
            except Exception as err:
                raise DamagedCheckpoint(f"{damaged}: cannot read {r}/{file} ({type(err).__name__})") from None
            keys.update({k: seg for k in names if where.get(int(k.split("/", 1)[0])) == r})
            sizes[r] = len({k.split("/", 1)[0] for k in names})
        return _LazyTensors(keys, (where, digests, sizes))

    def load(self, path: str, objects: Mapping[str, Stateful], force: bool = False) -> dict:
        """Restore ``objects`` from the checkpoint at ``path`` (verified, then strictly; see the module docstring).
        Returns its meta."""
        self.wait()
        states, meta = self.verify(path, objects)
        return self._restore(path, states, meta, objects, force)

    def _restore(self, path: str, states: dict[str, Mapping], meta: dict, objects: Mapping[str, Stateful],
                 force: bool) -> dict:
        if meta.get("world_size") != self.world_size:
            raise ResumeError(f"resume: checkpoint written by {meta['world_size']} processes, this run has "
                              f"{self.world_size}; set trainer.devices to match")
        if meta.get("config_hash") != self.config_hash and not force:
            raise ResumeError(
                f"resume: the config differs from the one that wrote {path} in a way that changes results "
                f"(hash {meta['config_hash']} != {self.config_hash}); rerun with the same overrides, or add force_resume=true")
        saved = set(meta.get("objects", ()))
        extra, missing = sorted(saved - set(objects)), sorted(set(objects) - saved)
        for name in extra + missing:
            what = "holds state" if name in extra else "lacks state"
            msg = f"the checkpoint {path} {what} {name!r} that this run {'does not have' if name in extra else 'needs'}"
            if not force:
                raise ResumeError(f"resume: {msg}; resume with the code and config that wrote it, or add force_resume=true")
            log.warning("force_resume: %s", msg)
        for name, obj in objects.items():
            if name not in saved:
                continue
            state = states[name]
            extra = meta.get("state", {}).get(name)
            load_strict(obj, {**state, **extra} if extra else state, name, force)
            if isinstance(state, _LazyTensors) and os.path.abspath(os.path.dirname(path)) == os.path.abspath(self.root):
                self._index[name] = state.index  # the next checkpoint refers to these client files
        self.last = path
        return meta


class TensorDict:
    """A ``{name: tensor}`` dict (e.g. the global model) as a stateful object; loading copies in place, strictly."""

    def __init__(self, tensors: dict[str, Tensor]):
        self.tensors = tensors

    def state_dict(self) -> dict[str, Tensor]:
        return dict(self.tensors)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        import torch

        with torch.no_grad():
            for k, t in self.tensors.items():
                t.copy_(state[k])


class TorchRNG:
    """The global torch RNG (dropout etc. are re-seeded per client, but a resumed run restores it too)."""

    def state_dict(self) -> dict[str, Tensor]:
        import torch

        return {"torch": torch.get_rng_state()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        import torch

        torch.set_rng_state(state["torch"])
