"""The range vocabulary, one for the schema's fields and for constructor arguments alike: :class:`Range`,
:class:`OneOf` (and :class:`Kind`, :class:`Validate`) markers for ``typing.Annotated``, the argument kinds built from
them (``lr: NonNegative = 1e-3``, ``beta1: Fraction = 0.9``), and :func:`hint_meta`, the one function that reads an
annotation into what the checks use.

A schema field (``rounds: Annotated[int, Range(1, 10**9)] = key(40, ...)``, :mod:`fl_lightning.config.schema`) and a
constructor argument (``hidden: Annotated[int, Range(1, 1 << 16)]``) state their range with the same markers, read by
:func:`hint_meta` from ``typing.get_type_hints(..., include_extras=True)``; :func:`fl_lightning.config.checks.check` and
:func:`fl_lightning.config.args.check_targets` refuse a value out of range before anything is built. A rule the
markers cannot state (one argument bounded by another) is one named :class:`Validate` next to the annotation. This
module imports neither torch nor omegaconf, so any module may declare its ranges.
"""
from __future__ import annotations

import collections.abc
import types
import typing
from dataclasses import dataclass
from typing import Annotated, Any, Callable


@dataclass(frozen=True)
class Range:
    """The bounds of a value, declared in its annotation (``hidden: Annotated[int, Range(1, 1 << 16)]``) and enforced
    before anything is built, so a huge or negative size is one line naming the key, never an allocation. ``low``/
    ``high`` are inclusive unless ``open_low``/``open_high``; ``words`` are strings accepted besides numbers
    (``auto``); ``example`` is the value a fix suggests when the argument has no valid default. For a list argument
    (``list[int]``, ``tuple[float, float]``) it bounds each item."""

    low: float | None = None
    high: float | None = None
    open_low: bool = False
    open_high: bool = False
    words: tuple[str, ...] = ()
    example: Any = None


@dataclass(frozen=True)
class OneOf:
    """The only strings a value accepts (``first_step: Annotated[str, OneOf("init_only", "adam")]``), enforced like
    :class:`Range`."""

    values: tuple

    def __init__(self, *values):
        object.__setattr__(self, "values", tuple(values))


@dataclass(frozen=True)
class Kind:
    """What a value is where its Python type cannot say it to OmegaConf (which has no union of primitives): ``path``
    (a ``str`` naming a file or folder), ``table`` (a mapping) or ``int`` (``Any`` holding a whole number or one of
    the :class:`Range`'s ``words``). See :data:`Path`, :data:`Table`, :data:`IntOrWord`."""

    name: str


@dataclass(frozen=True)
class Validate:
    """A named rule the markers above cannot state, declared next to the annotation of the argument its message
    names (``lower: Annotated[float, Range(0.0), Validate(lower_below_upper, "must be <= upper ({upper}), got
    {lower}")]``). ``rule``'s parameters are the arguments it reads (their configured values, else their
    defaults); it returns True when they fit. ``problem`` and ``fix`` are formatted with those values; the refusal
    is one :class:`~fl_lightning.errors.ConfigError` line naming the argument, like a :class:`Range`'s."""

    rule: Callable[..., bool]
    problem: str
    fix: str = ""

    @property
    def name(self) -> str:
        return self.rule.__name__


# what OmegaConf types as str / Any, told apart by their Kind
Path = Annotated[str, Kind("path")]  # a file or folder name
Table = Annotated[Any, Kind("table")]  # a mapping (key: value, ...)
IntOrWord = Annotated[Any, Kind("int")]  # a whole number, or one of its Range's words (auto)

# argument kinds constructor signatures share (``lr: NonNegative = 1e-3``), checked by config.args.check_targets
NonNegative = Annotated[float, Range(0.0)]
Positive = Annotated[float, Range(0.0, open_low=True)]
Fraction = Annotated[float, Range(0.0, 1.0, open_high=True)]  # betas, momenta, dropout rates: [0, 1)
Betas = Annotated[tuple[float, float], Range(0.0, 1.0, open_high=True)]
# a local optimizer's step size (method.lr reaches every local optimizer as ``lr``): >= 0, 0 = no step. Parts that
# divide by it (GlobalAlignment's Δ_G, Scallion's K·η, SignSteps' step count) declare Positive instead.
LearningRate = NonNegative

# the one table of Python types the vocabulary knows (Kind names the rest)
_KINDS = {int: "int", float: "float", bool: "bool", str: "str"}
_UNIONS = (typing.Union, types.UnionType)


def hint_meta(hint, default=None, has_default: bool = False) -> dict | None:
    """What the checks know of a value from its type hint (read with ``typing.get_type_hints(...,
    include_extras=True)``), for a schema field and a constructor argument alike: ``kind`` (int, float, bool, str,
    path, table, list), ``nullable`` (``Optional[...]``, or a default of None), the :class:`Range`'s ``low``,
    ``high``, ``open_low``, ``open_high``, ``words`` and ``example``, the :class:`OneOf`'s ``choices`` and the
    :class:`Validate` rules (``validators``); for a list, ``items`` (the metadata of one item), ``length`` (a
    ``tuple[float, float]``'s 2) and ``scalar`` (``int | list[int]``: one value accepted too). None for a hint it
    does not understand (its constructor checks it)."""
    rng, choices, validators = None, (), []

    def unwrap(h):  # Annotated[X, Range(...)] -> X, keeping the markers; X with a Kind -> the Kind
        nonlocal rng, choices
        if typing.get_origin(h) is not typing.Annotated:
            return h
        h, *marks = typing.get_args(h)
        for m in marks:
            if isinstance(m, Range):
                rng = m
            elif isinstance(m, OneOf):
                choices = m.values
            elif isinstance(m, Validate):
                validators.append(m)
            elif isinstance(m, Kind):
                h = m
        return h

    hint = unwrap(hint)
    nullable = has_default and default is None
    alts = [hint]
    if typing.get_origin(hint) in _UNIONS:  # Optional[Annotated[...]] too
        alts = [unwrap(a) for a in typing.get_args(hint) if a is not type(None)]
        nullable = nullable or len(alts) < len(typing.get_args(hint))
        alts = [b for a in alts for b in (typing.get_args(a) if typing.get_origin(a) in _UNIONS else (a,))]
    words = tuple(rng.words) if rng else ()
    scalars = [a.name if isinstance(a, Kind) else _KINDS[a] for a in alts if isinstance(a, Kind) or a in _KINDS]
    lists = [a for a in alts if typing.get_origin(a) in (list, tuple, collections.abc.Sequence)]
    if "str" in scalars and len(scalars) > 1 and (words or rng is not None):  # int | str with words: a number or a word
        scalars.remove("str")
    if scalars == ["str"] and lists and words:  # str | tuple[float, ...] with words (Muon's ns_coeffs): a word or list
        scalars.remove("str")
    if len(scalars) > 1 or len(lists) > 1 or (not scalars and not lists):
        return None
    base = dict(nullable=nullable, words=words, choices=tuple(choices), low=rng.low if rng else None,
                high=rng.high if rng else None, open_low=bool(rng and rng.open_low),
                open_high=bool(rng and rng.open_high), example=rng.example if rng else None,
                validators=tuple(validators))
    if not lists:
        return dict(base, kind=scalars[0])
    item_args = typing.get_args(lists[0])
    length = None
    if typing.get_origin(lists[0]) is tuple and item_args and Ellipsis not in item_args:
        length = len(item_args)
    kinds = {_KINDS.get(a) for a in item_args if a is not Ellipsis}
    if len(kinds) != 1 or None in kinds:
        return None
    item = dict(base, kind=kinds.pop(), nullable=False, validators=())
    if scalars and scalars[0] != item["kind"]:  # a name or numbers (Muon's ns_coeffs): its constructor checks it
        return None
    return dict(base, kind="list", items=item, length=length, scalar=bool(scalars))


__all__ = ["Betas", "Fraction", "IntOrWord", "Kind", "LearningRate", "NonNegative", "OneOf", "Path", "Positive",
           "Range", "Table", "Validate", "hint_meta"]
