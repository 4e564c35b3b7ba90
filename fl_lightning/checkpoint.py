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

Objects named in ``per_rank`` (the client store: each process keeps the states of the clients it owns) are written
by every process to ``<name>.rank<K>.safetensors`` through a staging folder; rank 0 moves them into the checkpoint.

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
import os
import re
import shutil
from collections.abc import Iterator, Mapping
from typing import Any, Callable, Protocol

from safetensors.torch import load as safetensors_load
from safetensors.torch import save_file
from torch import Tensor

from .errors import ResumeError

log = logging.getLogger("fl_lightning")

FORMAT = 2
_NAME = re.compile(r"^round_(\d{6})$")


class Stateful(Protocol):
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...


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
    tensors = {k: v.detach().cpu().contiguous() for k, v in state.items() if isinstance(v, Tensor)}
    return tensors, {k: v for k, v in state.items() if not isinstance(v, Tensor)}


def _fsync_json(obj: Any, path: str) -> None:
    with open(path, "w") as f:
        json.dump(obj, f)
        f.flush()
        os.fsync(f.fileno())


def _digest(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class DamagedCheckpoint(ResumeError):
    """A checkpoint whose files do not match their recorded checksums, cannot be read, or hold non-finite weights."""


class Checkpointer:
    """Saves and strictly loads ``{name: Stateful}`` (see the module docstring)."""

    def __init__(self, root: str, *, config_hash: str = "", keep_last: int = 2, rank: int = 0, world_size: int = 1,
                 barrier: Callable[[], None] | None = None, per_rank: tuple[str, ...] = ("clients",)):
        self.root, self.config_hash, self.keep_last = root, config_hash, int(keep_last)
        self.rank, self.world_size, self.per_rank = rank, world_size, tuple(per_rank)
        self.barrier = barrier or (lambda: None)
        self.last: str | None = None  # the newest checkpoint written or loaded

    def _stem(self, name: str, rank: int | None = None) -> str:
        return f"{name}.rank{self.rank if rank is None else rank}" if name in self.per_rank else name

    # ------------------------------------------------------------------ save
    def save(self, round_done: int, objects: Mapping[str, Stateful]) -> str:
        final = os.path.join(self.root, f"round_{round_done:06d}")
        tmp, staging = final + ".tmp", final + ".parts"
        states = {name: obj.state_dict() for name, obj in objects.items()}
        if self.world_size > 1:  # every process stages its own per-rank files; rank 0 assembles
            os.makedirs(staging, exist_ok=True)
            for name in self.per_rank:
                if name in states:
                    tensors, rest = _split(states[name])
                    if rest:
                        raise TypeError(f"per-process state {name!r} must hold tensors only, got {sorted(rest)[:3]}")
                    save_file(tensors, os.path.join(staging, self._stem(name) + ".safetensors"))
            self.barrier()
        if self.rank == 0:
            os.makedirs(self.root, exist_ok=True)
            shutil.rmtree(tmp, ignore_errors=True)
            os.makedirs(tmp)
            meta: dict[str, Any] = {"format": FORMAT, "round": round_done, "config_hash": self.config_hash,
                                    "world_size": self.world_size, "objects": sorted(states), "state": {}}
            for name, state in states.items():
                if self.world_size > 1 and name in self.per_rank:
                    continue
                tensors, rest = _split(state)
                save_file(tensors, os.path.join(tmp, self._stem(name) + ".safetensors"))
                if rest:
                    meta["state"][name] = rest
            if self.world_size > 1:
                for f in os.listdir(staging):
                    os.replace(os.path.join(staging, f), os.path.join(tmp, f))
            meta["files"] = {}
            for f in sorted(os.listdir(tmp)):  # each tensor file's checksum, and on disk before the rename
                _fsync(os.path.join(tmp, f))
                meta["files"][f] = _digest(os.path.join(tmp, f))
            _fsync_json(meta, os.path.join(tmp, "meta.json"))
            _fsync(tmp)
            if os.path.exists(final):
                shutil.rmtree(final)
            os.replace(tmp, final)
            _fsync(self.root)
            shutil.rmtree(staging, ignore_errors=True)
            if self.keep_last > 0:
                for old in list_checkpoints(self.root)[: -self.keep_last]:
                    shutil.rmtree(old, ignore_errors=True)
        if self.world_size > 1:
            self.barrier()
        self.last = final
        return final

    # ------------------------------------------------------------------ load
    def latest(self) -> str | None:
        return latest_checkpoint(self.root)

    def load_latest_good(self, objects: Mapping[str, Stateful], force: bool = False, root: str | None = None) -> str | None:
        """Restore from the newest checkpoint that is intact; a damaged one (see :meth:`verify`) is reported in one
        warning line and the previous one is tried. None if there is no checkpoint at all; a one-line
        :class:`DamagedCheckpoint` if every one is damaged. A mismatch of config or state layout is not damage: it
        stops the resume (strict loading)."""
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

    def verify(self, path: str, objects: Mapping[str, Stateful]) -> tuple[dict[str, dict], dict]:
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
        mine = {self._stem(name) + ".safetensors": name for name in objects if name in set(meta.get("objects", ()))}
        blobs: dict[str, bytes] = {}  # every file is read once: checksummed, and parsed from the same bytes if ours
        for f, digest in meta.get("files", {}).items():
            try:
                with open(os.path.join(path, f), "rb") as fh:
                    data = fh.read()
            except OSError:
                raise DamagedCheckpoint(f"resume: checkpoint {path} is damaged: {f} is missing") from None
            if hashlib.sha256(data).hexdigest() != digest:
                raise DamagedCheckpoint(f"resume: checkpoint {path} is damaged: {f} is not what was saved (checksum)")
            if f in mine:
                blobs[f] = data
        states: dict[str, dict] = {}
        for f, name in mine.items():
            try:
                if f not in blobs:  # a checkpoint without a checksum list
                    with open(os.path.join(path, f), "rb") as fh:
                        blobs[f] = fh.read()
                states[name] = dict(safetensors_load(blobs.pop(f)))
            except Exception as err:
                raise DamagedCheckpoint(f"resume: checkpoint {path} is damaged: cannot read {f} "
                                        f"({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''})") from None
        for k, t in states.get("model", {}).items():
            if t.is_floating_point() and not bool(t.isfinite().all()):
                raise DamagedCheckpoint(f"resume: checkpoint {path} is damaged: the model's {k} holds NaN or inf")
        return states, meta

    def load(self, path: str, objects: Mapping[str, Stateful], force: bool = False) -> dict:
        """Restore ``objects`` from the checkpoint at ``path`` (verified, then strictly; see the module docstring).
        Returns its meta."""
        states, meta = self.verify(path, objects)
        return self._restore(path, states, meta, objects, force)

    def _restore(self, path: str, states: dict[str, dict], meta: dict, objects: Mapping[str, Stateful],
                 force: bool) -> dict:
        if meta.get("format") != FORMAT:
            raise ResumeError(f"resume: {path} was written in checkpoint format {meta.get('format', 1)}, this version "
                              f"reads format {FORMAT}; finish that run with the version that started it")
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
            state: dict[str, Any] = states[name]
            state.update(meta.get("state", {}).get(name, {}))
            load_strict(obj, state, name, force)
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
