"""ClientStateStore keeps each client's state as one flat unpinned buffer (issue 18, item 2).

Values of a client are views of one 64-byte aligned buffer; a stored state never changes after ``put`` (neither
through the source tensors nor through a checked-out copy nor through a reused buffer); mixed dtypes and shapes
round-trip exactly in memory and on disk; ``layout`` reads no values; on a GPU a checkout is one host->device copy
and makes no synchronising call.
"""
from __future__ import annotations

import os

import pytest
import torch
from safetensors import safe_open

from fl_lightning.loop import client_store
from fl_lightning.loop.client_store import ClientStateStore


def _state(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"m": torch.randn(5, 7, generator=g), "t": torch.randn(7, 3, generator=g).mT,  # non-contiguous
            "h": torch.randn(3, generator=g).to(torch.bfloat16), "i": torch.randint(-9, 9, (2, 2), generator=g),
            "step": torch.tensor(3.0 + seed, dtype=torch.float64), "b": torch.rand(9, generator=g) > .5,
            "flag": torch.tensor(True), "e": torch.zeros(0, 4), "d": torch.randn(2, 1, 3, generator=g).double()}


def _store(tmp_path, where: str) -> ClientStateStore:
    return ClientStateStore("cpu", str(tmp_path / "store") if where == "disk" else None)


def _same(a: dict, b: dict) -> bool:
    return list(a) == list(b) and all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in b)


@pytest.mark.parametrize("where", ["memory", "disk"])
def test_values_of_a_client_share_one_unpinned_aligned_buffer(tmp_path, where):
    store = _store(tmp_path, where)
    store.put(4, _state())
    for got in (store.get(4), store.checkout(4)):
        assert len({v.untyped_storage().data_ptr() for v in got.values()}) == 1
        assert not any(v.is_pinned() for v in got.values())
        assert all(v.data_ptr() % 64 == 0 and v.is_contiguous() for v in got.values())
        assert got["step"].ndim == 0 and got["flag"].ndim == 0
    assert store.nbytes() == sum(v.numel() * v.element_size() for v in _state().values())


@pytest.mark.parametrize("where", ["memory", "disk"])
def test_mixed_dtypes_and_shapes_round_trip_exactly(tmp_path, where):
    store = _store(tmp_path, where)
    for c in (0, 7):
        store.put(c, _state(c))
    for c in (0, 7):
        assert _same(store.get(c), _state(c)) and _same(store.checkout(c), _state(c))
    assert store.get(3) == {} and store.checkout(3) == {} and store.clients() == [0, 7]
    fresh = _store(tmp_path / "b", where)
    fresh.load_state_dict(store.state_dict())
    assert _same(fresh.get(7), _state(7))


@pytest.mark.parametrize("where", ["memory", "disk"])
def test_a_stored_state_never_changes_after_put(tmp_path, where):
    store = _store(tmp_path, where)
    src = _state()
    store.put(1, src)
    for v in src.values():
        v.add_(1) if v.dtype != torch.bool else v.logical_not_()
    held = store.get(1)
    assert _same(held, _state())
    out = store.checkout(1)  # training updates its checked-out state in place
    out["m"].add_(1)
    out["step"].add_(1)
    assert _same(store.get(1), _state())
    for s in range(2 * client_store.SPARES):  # buffers are reused, but never one whose views are alive
        store.checkin(1, store.checkout(1))
        store.put(2 + s % 2, _state(s))
    assert _same(held, _state()) and _same(out, _state() | {"m": _state()["m"] + 1, "step": _state()["step"] + 1})


def test_a_buffer_nobody_holds_is_reused():
    """Replacing a client's state reuses a retired buffer (no fresh, page-faulted memory each round)."""
    store = ClientStateStore("cpu")
    ptrs = set()
    for s in range(4):
        store.put(0, _state(s))
        ptrs.add(store.get(0)["m"].untyped_storage().data_ptr())
    assert len(ptrs) == 2 and _same(store.get(0), _state(3))


def test_layout_reads_no_values(tmp_path):
    """With the store on disk, ``layout`` reads the file's header only: it works on a file cut after its header."""
    store = _store(tmp_path, "disk")
    store.put(5, _state())
    [name] = [f for f in os.listdir(tmp_path / "store") if f.startswith("client_")]
    assert name == "client_000005.safetensors"  # written to a .tmp file and renamed: none left
    path = str(tmp_path / "store" / name)
    with safe_open(path, "pt") as f:  # a safetensors file: one uint8 tensor, the layout in the metadata
        assert list(f.keys()) == ["flat"] and "layout" in f.metadata()
    with open(path, "rb") as f:
        head = 8 + int.from_bytes(f.read(8), "little")
    os.truncate(path, head)
    assert store.layout(5) == {k: (v.dtype, tuple(v.shape)) for k, v in _state().items()}
    with pytest.raises(OSError, match="truncated"):
        store.get(5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_checkout_is_one_host_to_device_copy_without_sync():
    """A checkout is one host->device copy and no synchronising call; a checkin one device->host copy (and the one
    wait); values exact, 0-d values on the CPU, the stored state unpinned."""
    from torch.profiler import ProfilerActivity, profile

    store = ClientStateStore("cuda")
    for c in (0, 1):
        store.checkin(c, {k: v if v.ndim == 0 else v.cuda() for k, v in _state(c).items()})
    store.checkout(0)  # warm-up: the "in" staging and the allocator
    torch.cuda.synchronize()
    activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
    with profile(activities=activities) as prof:
        torch.cuda.set_sync_debug_mode("error")
        try:
            out = store.checkout(1)
        finally:
            torch.cuda.set_sync_debug_mode(0)
        torch.cuda.synchronize()
    copies = [e.name for e in prof.events() if e.name.startswith("Memcpy")]  # the device's copies, by kind
    assert len(copies) == 1 and "HtoD" in copies[0], copies
    assert out["step"].device.type == "cpu" and out["m"].device.type == "cuda" and out["e"].device.type == "cuda"
    assert _same({k: v.cpu() for k, v in out.items()}, _state(1))
    with profile(activities=activities) as prof:
        store.checkin(1, out)
    copies = [e.name for e in prof.events() if e.name.startswith("Memcpy") and "DtoD" not in e.name]
    assert len(copies) == 1 and "DtoH" in copies[0], copies
    assert _same(store.get(1), _state(1)) and not store.get(1)["m"].is_pinned()
