"""A Hugging Face hub cache made by hand in the hub's own layout (``hub/<kind>s--<org>--<name>/refs/main`` naming
``snapshots/<rev>/``), for the data tests that read from it offline."""
from __future__ import annotations

import os

REV = "0123456789abcdef0123456789abcdef01234567"


def snapshot(home, kind: str, repo: str) -> str:
    """The snapshot folder of ``repo`` in the hub cache under ``home`` (``refs/main`` names it)."""
    base = os.path.join(home, "hub", f"{kind}s--{repo.replace('/', '--')}")
    os.makedirs(os.path.join(base, "refs"), exist_ok=True)
    with open(os.path.join(base, "refs", "main"), "w") as f:
        f.write(REV)
    snap = os.path.join(base, "snapshots", REV)
    os.makedirs(snap, exist_ok=True)
    return snap
