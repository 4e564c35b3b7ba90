"""Argument checks shared by the network builders: a bad value is a ConfigError naming the argument."""
from __future__ import annotations

from typing import Annotated

from ..data.info import DataInfo
from ..errors import ConfigError
from ..config import Fraction, Range, Validate

# the bounds network builders declare (checked before anything is built, see fl_lightning.config.args.check_targets): a
# huge width or depth is one line naming the key, never an allocation
Width = Annotated[int, Range(1, 1 << 16)]  # channels, hidden units, embedding sizes
Widths = Annotated[list[int], Range(1, 1 << 16)]
Depth = Annotated[int, Range(1, 1024)]  # layers, blocks, heads
Depths = Annotated[list[int], Range(1, 1024)]
Dropout = Fraction


def mlp_hidden(embed_dim, mlp_ratio) -> bool:
    """A transformer's MLP keeps at least one unit: int(embed_dim · mlp_ratio) >= 1 (a rule tying two arguments)."""
    return int(int(embed_dim) * float(mlp_ratio)) >= 1


MlpRatio = Annotated[float, Range(0.0, 64.0, open_low=True),
                     Validate(mlp_hidden, "gives an MLP of int({embed_dim} x {mlp_ratio}) = 0 units", "use 4")]


def positive_ints(value, arg: str, count: int | None = None, example: str = "") -> tuple[int, ...]:
    """``value`` (an int or a list) as a tuple of ints >= 1, of length ``count`` when given."""
    items = value if isinstance(value, (list, tuple)) else [value]
    try:
        out = tuple(int(v) for v in items)
        ok = all(v >= 1 and float(v) == float(o) for v, o in zip(out, items))
    except (TypeError, ValueError):
        out, ok = (), False
    if not ok or (count is not None and len(out) != count) or not out:
        what = f"{count} positive integer{'s' if count != 1 else ''}" if count else "positive integers"
        raise ConfigError(arg, f"must be {what}, got {value!r}", f"use e.g. {example}" if example else "see the model's yaml")
    return out


def image_shape(info: DataInfo, model: str, min_side: int = 1, square: bool = True) -> tuple[int, int]:
    """(channels, width) of ``(C, H, W)`` images (square if asked, sides >= ``min_side``), or a ConfigError."""
    shape = info.input_shape
    if shape is None or len(shape) != 3 or (square and shape[1] != shape[2]) or min(shape[1:]) < min_side:
        kind = "square (C, H, W) images" if square else "(C, H, W) images"
        raise ConfigError("", f"{model} needs {kind} with sides >= {min_side}, the dataset gives "
                          f"input_shape {shape}", "pick another model (model=mlp takes any shape) or dataset")
    return int(shape[0]), int(shape[2])


def lora_args(r, alpha, dropout, targets, default_targets) -> tuple[int, float, float, list[str]]:
    """LoRA's rank, alpha, dropout and target modules (their ranges: the builders' annotations), with a non-empty
    list of module names; ``default_targets`` is named in the fix."""
    (r,) = positive_ints(r, "lora_r", 1, "16")
    targets = [targets] if isinstance(targets, str) else list(targets or [])
    if not targets:
        raise ConfigError("lora_targets", "is empty", f"use {list(default_targets)}")
    return r, float(alpha), float(dropout), targets


def attention_dims(embed_dim: int, num_heads: int, mlp_ratio, heads_fix: str) -> float:
    """A transformer's heads must divide ``embed_dim``; ``mlp_ratio`` (:data:`MlpRatio`) returned as a float."""
    if embed_dim % num_heads:
        raise ConfigError("num_heads", f"{num_heads} heads do not divide embed_dim {embed_dim}", heads_fix)
    return float(mlp_ratio)


def choice(value, arg: str, allowed: tuple[str, ...]) -> str:
    """One of ``allowed``, or a one-line error naming ``arg``."""
    if value not in allowed:
        raise ConfigError(arg, f"must be one of {', '.join(allowed)}, got {value!r}", f"use {allowed[0]}")
    return value
