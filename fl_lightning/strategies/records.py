"""A part's names, declared once: its client state, what it broadcasts and what it uploads, as records of named
fields instead of key strings built where they are used.

A record is a class of :class:`Field` attributes; bound to a part and to one flat container (``client.state``,
``client.received``, the dict of :class:`~fl_lightning.messages.Msg` a hook returns, or the round's
:class:`~fl_lightning.strategies.base.Aggregate`) each field reads and writes that container under the part's name::

    class Uploads(Record):
        dc = Field("dc/{}")            # one tensor per parameter: "<part>/dc/<param>"
        K = Field("K")                 # one tensor: "<part>/K"

    out = Uploads(self, {})
    out.dc[n] = Msg(new - old)         # writes out["scaffold/dc/<n>"]
    Uploads(self, agg).dc.sum(n)       # the round's sum of it
    return out.container

A field's pattern is its layout in the flat namespace (``str.format`` with the index: a parameter name, or a
parameter and an optimizer-state name), the same names checkpoints hold on disk, so records change no file. A
misspelt field is an ``AttributeError`` where it is used, not a key that is silently absent.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from .base import Aggregate


class Field:
    """One named field of a :class:`Record`: ``pattern`` its key under the part's name (``"c_i/{}"``: one tensor per
    parameter; ``"K"``: one tensor; ``"M/{}/{}"``: one per parameter and state entry)."""

    def __init__(self, pattern: str):
        self.pattern = pattern

    def __get__(self, record: "Record | None", owner) -> Any:
        return self if record is None else Entries(record, self)


def _args(index) -> tuple:
    return index if isinstance(index, tuple) else (index,)


class Entries:
    """A field bound to a container: ``[index]`` reads and writes, ``get``/``pop``/``in``, and over an
    :class:`~fl_lightning.strategies.base.Aggregate` ``mean``/``sum``. The index of a one-tensor field is ``()``."""

    __slots__ = ("record", "field")

    def __init__(self, record: "Record", field: Field):
        self.record, self.field = record, field

    def path(self, index=()) -> str:
        """The flat key of one entry (what a codec or a log names it by)."""
        return self.record.prefix + self.field.pattern.format(*_args(index))

    def _map(self):
        c = self.record.container
        return c.sums if isinstance(c, Aggregate) else c  # an Aggregate: its sums

    def __getitem__(self, index):
        return self.record.container[self.path(index)]

    def __setitem__(self, index, value) -> None:
        self.record.container[self.path(index)] = value

    def __contains__(self, index) -> bool:
        return self.path(index) in self._map()

    def get(self, index=(), default=None):
        return self._map().get(self.path(index), default)

    def pop(self, index=(), *default):
        return self._map().pop(self.path(index), *default)

    def set(self, value, index=()) -> None:
        self[index] = value

    def mean(self, index=()):
        return self.record.container.mean(self.path(index))

    def sum(self, index=()):
        return self.record.container.sum(self.path(index))

    def keys(self) -> Iterator[str]:
        """The flat keys of this field's entries in the container (a field whose pattern ends with an index)."""
        stem = self.record.prefix + self.field.pattern.split("{")[0]
        return (k for k in list(self._map()) if k.startswith(stem))


class Record:
    """Named fields (:class:`Field` class attributes) over one flat container, under ``part``'s name."""

    def __init__(self, part, container):
        self.prefix = f"{part.name}/"
        self.container = container
