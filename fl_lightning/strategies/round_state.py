"""A part's per-client state of one round, as a typed value (the shape of an optax transformation, whose state is a
value its functions take and return): what the part's ``client_start`` makes (``client.start_state``), its step
hooks read and update (``client.state_of(part)``) and its ``client_end`` reads. One dataclass per part, its
``Round``; every field says how a cohort of K clients (``trainer.cohort``, fl_lightning/cohort/) holds it:

    rows()     one value per client, stacked along a leading client dimension (a tensor, a list or dict of tensors;
               host numbers become a list of K): the step hooks update each client's row, and each client gets its
               row back (views) before its end
    shared()   the same for every client of the round (the received Δ_G, the round's thresholds): the first client's
    own()      the client's alone and not read by the step hooks (its stored c_i before the round, a generator)

So a part's step hook is one function of (its state, the step's tensors): called by the sequential loop with one
client's state and tensors, and by a cohort with the stacked ones (``Part.after_backward(cohort)``), where the
context's few stacked-aware helpers (``copy_rows_``, ``norm_of``) keep a finished client's rows as they were.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

ROWS, SHARED, OWN = "rows", "shared", "own"


def rows(default=None, default_factory=None) -> Any:
    """A field with one value per client (stacked in a cohort)."""
    return _field(ROWS, default, default_factory)


def shared(default=None, default_factory=None) -> Any:
    """A field every client of a round holds the same (the cohort keeps the first client's)."""
    return _field(SHARED, default, default_factory)


def own(default=None, default_factory=None) -> Any:
    """A field of the client's own that the step hooks do not read (not stacked)."""
    return _field(OWN, default, default_factory)


def _field(kind: str, default, default_factory):
    if default_factory is not None:
        return field(default_factory=default_factory, metadata={"cohort": kind})
    return field(default=default, metadata={"cohort": kind})


@dataclass
class RoundState:
    """The base of a part's ``Round`` (see the module docstring); every field made by :func:`rows`, :func:`shared`
    or :func:`own`."""

    @classmethod
    def kinds(cls) -> dict[str, str]:
        """``{field: rows | shared | own}``."""
        out = {}
        for f in dataclasses.fields(cls):
            kind = f.metadata.get("cohort")
            if kind not in (ROWS, SHARED, OWN):
                raise TypeError(f"{cls.__qualname__}.{f.name}: declare it with rows(), shared() or own()")
            out[f.name] = kind
        return out

    @classmethod
    def stacked(cls, states: list["RoundState"]) -> "RoundState":
        """K clients' states as one: ``rows`` fields stacked, ``shared`` ones the first client's, ``own`` ones None."""
        values = {}
        for name, kind in cls.kinds().items():
            if kind == ROWS:
                values[name] = _stack([getattr(s, name) for s in states])
            elif kind == SHARED:
                values[name] = getattr(states[0], name)
            else:
                values[name] = None
        return cls(**values)

    @classmethod
    def stacked_into(cls, held: "RoundState | None", states: list["RoundState"]) -> "RoundState":
        """:meth:`stacked`, written into ``held`` (an earlier cohort's stacked state of the same shapes) where it can
        be: its ``rows`` tensors filled in place (the same memory from one cohort to the next, as a replayed step reads
        it), its ``own`` values kept (what ``before_step`` fills in place); otherwise a new one."""
        if held is None or type(held) is not cls:
            return cls.stacked(states)
        for name, kind in cls.kinds().items():
            if kind == ROWS:
                setattr(held, name, _stack_into(getattr(held, name), [getattr(s, name) for s in states]))
            elif kind == SHARED:
                setattr(held, name, getattr(states[0], name))
        return held

    def unstack_into(self, i: int, state: "RoundState") -> None:
        """Client ``i``'s rows of this stacked state into its own ``state`` (views: no copy)."""
        for name, kind in self.kinds().items():
            if kind == ROWS:
                setattr(state, name, _row(getattr(self, name), i))


def _stack(values: list):
    import torch

    first = values[0]
    if first is None:
        return None
    if isinstance(first, Tensor):
        return torch.stack(values)
    if isinstance(first, dict):
        return {k: _stack([v[k] for v in values]) for k in first}
    if isinstance(first, (list, tuple)) and (not first or isinstance(first[0], Tensor)):
        return [_stack([v[j] for v in values]) for j in range(len(first))]
    return list(values)  # host numbers (a step count): one per client


def _stack_into(old, values: list):
    """``_stack(values)`` into ``old``'s tensors where the structure and shapes agree (the same values)."""
    import torch

    first = values[0]
    if isinstance(first, Tensor) and isinstance(old, Tensor) and old.shape == (len(values), *first.shape) \
            and old.dtype == first.dtype and old.device == first.device:
        return torch.stack(values, out=old)
    if isinstance(first, dict) and isinstance(old, dict) and old.keys() == first.keys():
        return {k: _stack_into(old[k], [v[k] for v in values]) for k in first}
    if isinstance(first, (list, tuple)) and first and isinstance(first[0], Tensor) and isinstance(old, list) \
            and len(old) == len(first):
        return [_stack_into(o, [v[j] for v in values]) for j, o in enumerate(old)]
    return _stack(values)


def _row(value, i: int):
    if value is None:
        return None
    if isinstance(value, Tensor):
        return value[i]
    if isinstance(value, dict):
        return {k: _row(v, i) for k, v in value.items()}
    if value and isinstance(value[0], Tensor):
        return [t[i] for t in value]
    return value[i] if value else value


def rows_fields(part) -> int:
    """The tensor ``rows`` fields of ``part``'s Round (each a model-sized tensor per client): the default of
    ``Part.cohort_rows``."""
    if part.Round is None:
        return 0
    kinds = part.Round.kinds()
    return sum(1 for f in dataclasses.fields(part.Round) if kinds[f.name] == "rows" and str(f.type) in (
        "list", "dict", "Tensor", "Tensor | None"))
