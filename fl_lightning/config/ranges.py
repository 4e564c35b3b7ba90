"""The range vocabulary of constructor signatures: :class:`Range` and :class:`OneOf` markers for ``typing.Annotated``
and the argument kinds built from them (``lr: NonNegative = 1e-3``, ``beta1: Fraction = 0.9``).

:func:`fl_lightning.config.args.check_targets` reads them from a ``_target_``'s signature and refuses a value out of range
before anything is built. This module imports neither torch nor omegaconf, so any module may declare its ranges.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any


@dataclass(frozen=True)
class Range:
    """The bounds of a constructor argument, declared in its signature (``hidden: Annotated[int, Range(1, 1 << 16)]``)
    and enforced by :func:`fl_lightning.config.args.check_targets` before anything is built, so a huge or negative size is
    one line naming the key, never an allocation. ``low``/``high`` are inclusive unless ``open_low``/``open_high``;
    ``words`` are strings accepted besides numbers (``auto``); ``example`` is the value a fix suggests when the
    argument has no valid default. For a list argument (``list[int]``, ``tuple[float, float]``) it bounds each item."""

    low: float | None = None
    high: float | None = None
    open_low: bool = False
    open_high: bool = False
    words: tuple[str, ...] = ()
    example: Any = None


@dataclass(frozen=True)
class OneOf:
    """The only strings a constructor argument accepts (``first_step: Annotated[str, OneOf("init_only", "adam")]``),
    enforced like :class:`Range`."""

    values: tuple

    def __init__(self, *values):
        object.__setattr__(self, "values", tuple(values))


# argument kinds constructor signatures share (``lr: NonNegative = 1e-3``), checked by config_args.check_targets
NonNegative = Annotated[float, Range(0.0)]
Positive = Annotated[float, Range(0.0, open_low=True)]
Fraction = Annotated[float, Range(0.0, 1.0, open_high=True)]  # betas, momenta, dropout rates: [0, 1)
Betas = Annotated[tuple[float, float], Range(0.0, 1.0, open_high=True)]
# a local optimizer's step size (method.lr reaches every local optimizer as ``lr``): >= 0, 0 = no step. Parts that
# divide by it (GlobalAlignment's Δ_G, Scallion's K·η, SignSteps' step count) declare Positive instead.
LearningRate = NonNegative

__all__ = ["Betas", "Fraction", "LearningRate", "NonNegative", "OneOf", "Positive", "Range"]
