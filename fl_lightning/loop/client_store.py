"""ClientStateStore: every client's private state, off the device.

A client's state (optimizer moments, control variates, momenta, ...) is a flat ``{name: tensor}`` dict, stored as
ONE contiguous uint8 buffer in ordinary (unpinned) CPU memory plus its layout (``{name: (dtype, shape, byte
offset)}``, offsets 64-byte aligned, tensors with dimensions first and 0-d ones at the end), or as one safetensors
file per client under ``offload_dir`` when it does not fit in memory (the buffer as one tensor ``flat``, the layout
in the file's metadata, written to a temporary file and renamed; the store owns that folder: it locks it, and clears
client files it did not write itself, at start and when a checkpoint is restored). ``get`` returns views of the
buffer, to read only; ``put`` always copies into a buffer nobody else holds, so a stored state never changes after
``put`` (a new one, or one the store stopped holding and of which no view is left: buffers are reused because a
fresh one above glibc's 32 MB mmap threshold is page-faulted in on every use: ~30 ms per 90 MB here).

A client's state is on the device only while that client trains (``checkout`` / ``checkin``), so device memory
does not grow with the number of clients (DESIGN invariant 4). ``checkout`` always hands out a copy (on the CPU one
memcpy of the buffer), so training may update its state in place. On a GPU the buffer travels whole: checkout is one
memcpy into a reusable pinned "in" staging buffer and one non-blocking host->device copy (device views per key; 0-d
values stay on the CPU); checkin packs the device tensors into one device buffer, makes one non-blocking copy into
the pinned "out" staging, waits once per client, and copies that into the client's new unpinned buffer. Only the
two staging buffers are pinned, never the stored states.

Checkpoints are incremental: the store remembers which clients were written since the last checkpoint
(``changed``; ``mark_saved`` after a checkpoint), and the :class:`~fl_lightning.checkpoint.Checkpointer` writes only
those, one client at a time (``layout`` gives a client's tensor shapes without reading its values).
"""
from __future__ import annotations

import fcntl
import json
import math
import os
import threading
from collections.abc import Mapping
from typing import NamedTuple

import torch
from safetensors.torch import save_file
from torch import Tensor

from .._compat import storage_use_count
from ..errors import ConfigError

ALIGN = 64  # byte alignment of each value in a client's buffer (a multiple of every dtype's size)
SPARES = 4  # buffers kept for reuse: a fresh one above glibc's mmap threshold (32 MB) is page-faulted in on first use


def _unshared(buf: Tensor) -> bool:
    """No tensor but ``buf`` uses its memory (no view of it is alive): the count is ``buf``'s and the probe's."""
    return storage_use_count(buf) == 2


class _Flat(NamedTuple):
    """One client's state: a contiguous uint8 CPU buffer and ``{key: (dtype, shape, byte offset)}``."""
    buf: Tensor
    layout: dict[str, tuple[torch.dtype, tuple[int, ...], int]]

    @property
    def head(self) -> int:
        """Where the 0-d values start: the tensors with dimensions are all before (one copy to the device)."""
        return min((o for _, shape, o in self.layout.values() if not shape), default=self.buf.numel())


def _size(dtype: torch.dtype, shape: tuple[int, ...]) -> int:
    return math.prod(shape) * dtype.itemsize


def _plan(state: Mapping[str, Tensor]) -> tuple[dict, int]:
    """The layout of ``state`` in one buffer (keys in ``state``'s order; tensors with dimensions first, then the 0-d
    ones; each at an ``ALIGN``-byte offset) and the buffer's size."""
    offsets, end = {}, 0
    for scalar in (False, True):
        for k, v in state.items():
            if (v.ndim == 0) == scalar:
                offsets[k] = end
                end += -(-_size(v.dtype, v.shape) // ALIGN) * ALIGN
    return {k: (v.dtype, tuple(v.shape), offsets[k]) for k, v in state.items()}, end


def _views(buf: Tensor, layout: dict, start: int = 0) -> dict[str, Tensor]:
    """``{key: tensor}`` viewing ``buf``, a byte buffer that begins at byte ``start`` of the layout."""
    typed, out = {}, {}
    for k, (dtype, shape, o) in layout.items():
        if dtype not in typed:
            typed[dtype] = buf.view(dtype)
        t = typed[dtype]
        out[k] = t.as_strided(shape, _strides(shape), t.storage_offset() + (o - start) // dtype.itemsize)
    return out


def _strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The strides of a contiguous tensor of ``shape``."""
    out, step = [], 1
    for n in reversed(shape):
        out.append(step)
        step *= max(n, 1)
    return tuple(reversed(out))


def _gaps(layout: dict, end: int) -> list[tuple[int, int]]:
    """The padding byte ranges between the values of a layout."""
    spans = sorted((o, o + _size(dtype, shape)) for dtype, shape, o in layout.values())
    bounds = zip([e for _, e in spans], [o for o, _ in spans[1:]] + [end])
    return [(a, b) for a, b in bounds if b > a]


def _unparse(layout: dict) -> str:
    """A layout as the JSON kept in a client file's safetensors metadata."""
    return json.dumps({k: [str(dtype).removeprefix("torch."), list(shape), o] for k, (dtype, shape, o) in layout.items()})


def _header(f) -> tuple[dict, int]:
    """The JSON header of the safetensors file ``f`` and where its data starts (only the header is read)."""
    n = int.from_bytes(f.read(8), "little")
    return json.loads(f.read(n)), 8 + n


def _parse(metadata: dict[str, str]) -> dict:
    layout = {}
    for k, (name, shape, o) in json.loads(metadata["layout"]).items():
        dtype = getattr(torch, name)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"client file names an unknown dtype {name!r}")
        layout[k] = (dtype, tuple(shape), o)
    return layout


class ClientStateStore:
    def __init__(self, device: torch.device | str = "cpu", offload_dir: str | None = None):
        self.device = torch.device(device)
        self.offload_dir = offload_dir
        self._mem: dict[int, _Flat] = {}
        self._stage: dict[str, Tensor] = {}  # "in" / "out": pinned byte buffers (GPU only), reused across clients
        self._copied_in = None  # a CUDA event: the last checkout's copy out of the "in" staging is done
        self._changed: set[int] = set()  # clients written since the last checkpoint
        self._spare: list[Tensor] = []  # buffers no longer stored or handed out, reused when unreferenced
        self._spare_lock = threading.Lock()
        if offload_dir:
            self._lock = self._claim(offload_dir)
            self._clear_files()  # a fresh store starts empty: files left by an earlier or crashed run are not ours

    @staticmethod
    def _claim(offload_dir: str):
        """An exclusive lock on ``<offload_dir>/.lock`` for the store's life: two runs never share client files."""
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

    def _flat(self, cid: int) -> _Flat | None:
        """The stored flat buffer of ``cid`` (read from its file with the store on disk); None if it never trained."""
        if not self.offload_dir:
            return self._mem.get(cid)
        if not os.path.exists(self._path(cid)):
            return None
        with open(self._path(cid), "rb") as f:
            header, data = _header(f)
            lo, hi = header["flat"]["data_offsets"]
            buf = self._alloc(hi - lo)  # 64-byte aligned, read straight into
            f.seek(data + lo)
            if f.readinto(memoryview(buf.numpy())) != hi - lo:
                raise OSError(f"{self._path(cid)} is truncated")
        return _Flat(buf, _parse(header["__metadata__"]))

    def get(self, cid: int) -> dict[str, Tensor]:
        """The stored (CPU) state of ``cid``, as views of its one buffer (read-only: write a new state with ``put``);
        empty if it never trained."""
        flat = self._flat(cid)
        if flat is None:
            return {}
        out = _views(flat.buf, flat.layout)
        self._read_done(flat)
        return out

    def _read_done(self, flat: _Flat) -> None:
        """A buffer read from a client file, handed out as views: reused once they are all gone."""
        if self.offload_dir:
            self._retire(flat.buf)

    def _staging(self, which: str, nbytes: int) -> Tensor:
        """The first ``nbytes`` of the pinned staging buffer ``which`` ("in" / "out"), grown as needed."""
        buf = self._stage.get(which)
        if buf is None or buf.numel() < nbytes:
            buf = self._stage[which] = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        return buf[:nbytes]

    def _alloc(self, nbytes: int) -> Tensor:
        """A byte buffer nobody else holds: a spare one of that size whose views are all gone, else a new one."""
        with self._spare_lock:  # a checkpoint written from another thread may read client files meanwhile
            for i, buf in enumerate(self._spare):
                if buf.numel() == nbytes and _unshared(buf):
                    return self._spare.pop(i)
        return torch.empty(nbytes, dtype=torch.uint8)

    def _retire(self, buf: Tensor) -> None:
        """Keep ``buf`` (no longer stored, or handed out) for reuse once its last view is gone."""
        with self._spare_lock:
            self._spare.append(buf)
            del self._spare[:-SPARES]

    def _copy(self, buf: Tensor) -> Tensor:
        out = self._alloc(buf.numel())
        out.copy_(buf)
        self._retire(out)
        return out

    def _pack(self, state: dict[str, Tensor]) -> _Flat:
        """``state`` copied into one new unpinned CPU buffer: device tensors packed on the device and brought over
        in one copy through the "out" staging (one wait per client), CPU tensors copied in place."""
        layout, end = _plan(state)
        buf = self._alloc(end)
        on_device = {k: v.detach() for k, v in state.items() if v.device.type != "cpu"}
        if on_device:
            dev = next(iter(on_device.values())).device
            packed = torch.empty(end, dtype=torch.uint8, device=dev)
            torch._foreach_copy_(list(_views(packed, {k: layout[k] for k in on_device}).values()),
                                 list(on_device.values()))
            if dev.type == "cuda":
                stage = self._staging("out", end)
                stage.copy_(packed, non_blocking=True)  # one device->host copy
                torch.cuda.current_stream(dev).synchronize()  # once per client
                buf.copy_(stage)
            else:
                buf.copy_(packed)
        views = _views(buf, layout)
        on_cpu = [k for k in state if k not in on_device]
        if on_cpu:  # one multi-tensor copy
            torch._foreach_copy_([views[k] for k in on_cpu], [state[k].detach() for k in on_cpu])
        if self.offload_dir:
            for a, b in _gaps(layout, end):
                buf[a:b].zero_()  # no stray bytes in a client file
        return _Flat(buf, layout)

    def put(self, cid: int, state: dict[str, Tensor]) -> None:
        """Store a copy of ``state`` (a new buffer: later changes to ``state``'s tensors do not reach it)."""
        flat = self._pack(state)
        if self.offload_dir:
            tmp = self._path(cid) + ".tmp"
            save_file({"flat": flat.buf}, tmp, metadata={"layout": _unparse(flat.layout)})
            os.replace(tmp, self._path(cid))
            self._retire(flat.buf)
        else:
            if cid in self._mem:
                self._retire(self._mem[cid].buf)
            self._mem[cid] = flat
        self._changed.add(cid)

    def layout(self, cid: int) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
        """``{key: (dtype, shape)}`` of the stored state of ``cid``, without reading its values from disk."""
        if self.offload_dir:
            with open(self._path(cid), "rb") as f:
                layout = _parse(_header(f)[0]["__metadata__"])
        else:
            layout = self._mem[cid].layout if cid in self._mem else {}
        return {k: (dtype, shape) for k, (dtype, shape, _) in layout.items()}

    def changed(self) -> set[int]:
        """The clients whose state was written since the last :meth:`mark_saved` (or restore)."""
        return set(self._changed)

    def mark_saved(self) -> None:
        self._changed.clear()

    def checkout(self, cid: int) -> dict[str, Tensor]:
        """State of ``cid`` on the device, for the duration of its local training: always a copy (on the CPU too), so
        training may update it in place without touching the stored state. Tensors with dimensions travel as one
        buffer: on a GPU one memcpy into the pinned "in" staging, one non-blocking host->device copy, device views.
        0-d tensors (step counters, numbers) stay on the CPU, where torch's optimizers keep ``step`` unless
        capturable or fused: reading them (``.item()``) then never waits for the device."""
        flat = self._flat(cid)
        if flat is None:
            return {}
        if self.device.type == "cpu":
            out = _views(flat.buf if self.offload_dir else self._copy(flat.buf), flat.layout)
        else:
            head = flat.head
            moving = {k: v for k, v in flat.layout.items() if v[1]}  # all before head (even empty ones)
            out = _views(flat.buf[head:].clone(), {k: v for k, v in flat.layout.items() if k not in moving}, head)
            if moving:
                out |= _views(self._to_device(flat.buf[:head]), moving)
            out = {k: out[k] for k in flat.layout}
        self._read_done(flat)
        return out

    def _to_device(self, host: Tensor) -> Tensor:
        """One non-blocking copy of the byte buffer ``host`` to the device (on a GPU through the "in" staging)."""
        if self.device.type != "cuda":
            return host.to(self.device, non_blocking=True)
        if self._copied_in is not None:
            self._copied_in.synchronize()  # the previous client's copy has left the staging (long since, in practice)
        stage = self._staging("in", host.numel())
        stage.copy_(host)
        dev = stage.to(self.device, non_blocking=True)
        self._copied_in = torch.cuda.Event()
        self._copied_in.record()
        return dev

    def checkin(self, cid: int, state: dict[str, Tensor]) -> None:
        self.put(cid, state)

    def clients(self) -> list[int]:
        if self.offload_dir:
            return sorted(int(f[7:13]) for f in os.listdir(self.offload_dir) if f.endswith(".safetensors"))
        return sorted(self._mem)

    def nbytes(self) -> int:
        """Bytes of all stored values (padding excluded), from the layouts."""
        return sum(_size(dtype, shape) for c in self.clients() for dtype, shape in self.layout(c).values())

    # --- checkpointing: one flat dict "<client>/<key>" ---
    def state_dict(self) -> dict[str, Tensor]:
        return {f"{c}/{k}": v for c in self.clients() for k, v in self.get(c).items()}

    def load_state_dict(self, flat: Mapping[str, Tensor]) -> None:
        """Restore from ``{"<client>/<key>": tensor}``, reading the values one client at a time (a checkpoint hands
        a lazy mapping, so restoring does not hold every client's state in memory at once)."""
        per: dict[int, list[str]] = {}
        for key in flat:
            per.setdefault(int(key.split("/", 1)[0]), []).append(key)
        self._mem.clear()
        if self.offload_dir:  # files written after the checkpoint (a crashed round) must not survive the restore
            self._clear_files()
        for c, keys in per.items():
            self.put(c, {key.split("/", 1)[1]: flat[key] for key in keys})
        self.mark_saved()
