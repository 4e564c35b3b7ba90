"""Reading a checkpoint: verified against its checksums, restored strictly, the newest intact one found."""
from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Mapping

from safetensors import safe_open
from safetensors.torch import load as safetensors_load

from ..errors import ResumeError
from ._base import _CheckpointerBase
from .clients import _LazyTensors
from .files import file_digest
from .format import FORMAT, DamagedCheckpoint, _segment, list_checkpoints
from .state import Stateful, load_strict

log = logging.getLogger("fl_lightning")


class CheckpointReader(_CheckpointerBase):
    """The loading half of :class:`~fl_lightning.checkpoint.Checkpointer`."""

    # ------------------------------------------------------------------ load
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
        regroup = self._regroups(meta)  # every process's clients, this one's claim taken
        merged: dict[str, list[_LazyTensors]] = {}
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
                name = f.partition(".rank")[0]
                if regroup and name in ours:
                    merged.setdefault(name, []).append(clients)
                elif f in mine:
                    states[mine[f]] = clients
            elif f in mine:
                blobs[f] = data
        for name, parts in merged.items():
            states[name] = _LazyTensors.merged(parts, self.claim)
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
                if file_digest(seg) != digest:
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
        regroup = self._regroups(meta)
        if regroup:
            log.info("resume: %s was written by %s processes, this run has %d: the client states are shared out "
                     "again", path, meta.get("world_size"), self.world_size)
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
            if isinstance(state, _LazyTensors) and not regroup and os.path.abspath(os.path.dirname(path)) == os.path.abspath(self.root):
                self._index[name] = state.index  # the next checkpoint refers to these client files
        self.last = path
        return meta
