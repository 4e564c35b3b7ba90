"""DataInfo: what a model needs to know about its dataset when it is built."""
from __future__ import annotations

from typing import Any


class DataInfo:
    """Runtime facts a dataset builder reports and a network builder reads (``small_cnn(info, ...)``).

    ``input_shape``: one example's ``x`` without the batch dimension (``(C, H, W)`` for images), or None.
    ``num_classes``: label count for classification, else None. ``vocab_size`` / ``tokenizer_path``: for text and
    language-model datasets (None for the image sets). ``metrics``: the evaluation metrics the dataset's benchmark
    prescribes, primary first (GLUE: ``("mcc", "acc")`` for CoLA, ``("f1", "acc")`` for MRPC/QQP), None = the
    model's default. ``pretrained_path``: a backbone prepared with the dataset (the embedded ``pydoc_topics`` task's
    MLM-pretrained RoBERTa), used when the model names none. ``provenance``: ``((key, value), ...)`` strings recorded
    in ``summary.json`` (e.g. the hash of an embedded corpus). Immutable; ``replace(**changes)`` gives a modified copy.

    A plain class, not a dataclass: Hydra's ``instantiate`` would turn a dataclass passed as a runtime keyword into
    a config node (a dict), and the model builders receive ``info`` that way.
    """

    __slots__ = ("input_shape", "num_classes", "vocab_size", "tokenizer_path", "metrics", "pretrained_path", "provenance")

    def __init__(self, input_shape: tuple[int, ...] | None = None, num_classes: int | None = None,
                 vocab_size: int | None = None, tokenizer_path: str | None = None, metrics=None,
                 pretrained_path: str | None = None, provenance=None):
        set_ = object.__setattr__
        set_(self, "input_shape", None if input_shape is None else tuple(int(s) for s in input_shape))
        set_(self, "num_classes", None if num_classes is None else int(num_classes))
        set_(self, "vocab_size", None if vocab_size is None else int(vocab_size))
        set_(self, "tokenizer_path", None if tokenizer_path is None else str(tokenizer_path))
        set_(self, "metrics", None if metrics is None else tuple(str(m) for m in metrics))
        set_(self, "pretrained_path", None if pretrained_path is None else str(pretrained_path))
        items = provenance.items() if isinstance(provenance, dict) else (provenance or ())
        set_(self, "provenance", tuple((str(k), str(v)) for k, v in items) or None)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("DataInfo is immutable; use info.replace(...)")

    def _fields(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__slots__}

    def replace(self, **changes: Any) -> "DataInfo":
        return DataInfo(**{**self._fields(), **changes})

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DataInfo) and self._fields() == other._fields()

    def __hash__(self) -> int:
        return hash(tuple(self._fields().values()))

    def __repr__(self) -> str:
        return "DataInfo(" + ", ".join(f"{k}={v!r}" for k, v in self._fields().items()) + ")"
