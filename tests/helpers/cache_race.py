"""One builder of a cache entry, for tests/unit/data/test_cache.py: several of these start at once and meet at a
barrier (every one waits until all have arrived), so they ask for the same entries at the same moment.

    python -m tests.helpers.cache_race BUILDER SPEC_JSON BARRIER_DIR N

BUILDER is one of BUILDERS; SPEC_JSON its paths. Prints the SHA-256 of every file under the cache (the lock folder
aside), one ``path digest`` a line. ``FL_TEST_KILL_BEFORE_PUBLISH=1``: kill -9 itself after writing its first entry
and before renaming it into place.
"""
from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
import time


def _pydoc_topics(spec: dict) -> None:
    from fl_lightning.data.pydoc_topics import pydoc_topics

    pydoc_topics(num_topics=2, vocab_size=300, cache_dir=spec["cache"], pretrain={"steps": 3, "batch_size": 4},
                 backbone={"hidden_size": 16, "layers": 1, "heads": 2, "intermediate_size": 32})


def _glue(spec: dict) -> None:
    from fl_lightning.data.glue import glue

    glue("mrpc", spec["glue"], spec["tok"], max_length=32, cache_dir=spec["cache"])


def _c4(spec: dict) -> None:
    from fl_lightning.data.c4 import c4

    c4(spec["c4"], spec["tok"], seq_len=16, eval_sequences=4, cache_dir=spec["cache"])


def _sentiment140(spec: dict) -> None:
    from fl_lightning.data.sentiment140 import sentiment140

    sentiment140(spec["s140"], fraction=0.5, cache_dir=spec["cache"])


BUILDERS = {"pydoc_topics": _pydoc_topics, "glue": _glue, "c4": _c4, "sentiment140": _sentiment140}


def listing(cache: str) -> list[str]:
    """``relative path  sha256`` of every file under ``cache``, the lock folders and lock files aside."""
    out = []
    for d, dirs, files in os.walk(cache):
        dirs[:] = sorted(x for x in dirs if x != ".locks")
        for f in sorted(files):
            p = os.path.join(d, f)
            with open(p, "rb") as fh:
                out.append(f"{os.path.relpath(p, cache)} {hashlib.sha256(fh.read()).hexdigest()}")
    return out


def main(builder: str, spec_json: str, barrier: str, n: int) -> None:
    spec = json.loads(spec_json)
    if os.environ.get("FL_TEST_KILL_BEFORE_PUBLISH") == "1":
        from fl_lightning.data import cache

        cache._before_publish = lambda tmp: os.kill(os.getpid(), signal.SIGKILL)
    os.makedirs(barrier, exist_ok=True)
    open(os.path.join(barrier, str(os.getpid())), "w").close()
    deadline = time.time() + 120
    while len(os.listdir(barrier)) < n:  # everyone at the start line before anyone builds
        if time.time() > deadline:
            sys.exit("barrier: the other builders never came")
        time.sleep(0.01)
    BUILDERS[builder](spec)
    print("\n".join(listing(spec["cache"])))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
