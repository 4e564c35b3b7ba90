"""What a checkpoint saves and restores: stateful objects, the strict loading that refuses missing and unread keys,
and the two small stateful wrappers the loop uses (a tensor dict, torch's RNG)."""
from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from typing import Any, Protocol

import torch
from torch import Tensor

from ..errors import ResumeError

log = logging.getLogger("fl_lightning")

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
