"""``python -m fl_lightning.keys [GROUP]``: every key of the config schema with its type, default and help (generated
from :mod:`fl_lightning.schema`; GROUP: fl, trainer, checkpoint, store, data, method, or a top-level key). The keys of
a model, dataset, part, optimizer or codec are its constructor's arguments: see its docstring and conf/ yaml."""
from __future__ import annotations

import dataclasses
import sys

from .schema import all_keys
from .schema_check import bounds


def describe(group: str | None = None) -> list[tuple[str, str, str, str]]:
    """(key, type, default, help) for every schema key, or those of one group."""
    out = []
    for name, f in all_keys().items():
        if group and not (name == group or name.startswith(group + ".")):
            continue
        m = f.metadata
        kind = m["kind"] + (" | " + " | ".join(m["words"]) if m["words"] else "")
        if m["choices"]:
            kind = " | ".join(m["choices"])
        if m["low"] is not None or m["high"] is not None:
            kind += " " + bounds(m)
        if m["nullable"]:
            kind += " | null"
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        out.append((name, kind, "null" if default is None else str(default).lower() if isinstance(default, bool)
                    else str(default), m["help"]))
    return out


def main(argv: list[str]) -> int:
    group = argv[0] if argv else None
    rows = describe(group)
    if not rows:
        tops = sorted({k.split(".")[0] for k in all_keys()})
        print(f"error: no schema keys under {group!r}; groups and keys: {', '.join(tops)}", file=sys.stderr)
        return 2
    width = max(len(r[0]) for r in rows)
    for name, kind, default, help_ in rows:
        print(f"{name:<{width}}  {kind}  (default {default})\n{'':<{width}}  {help_}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
