"""Files and checksums: each file written in one call with its SHA-256, manifests as fsynced JSON, and fsyncs run
concurrently so a checkpoint's files cost about one journal commit."""
from __future__ import annotations

import hashlib
import json
import os
from typing import Any

def _write_json(obj: Any, path: str) -> None:
    with open(path, "w") as f:
        f.write(json.dumps(obj))
        f.flush()
        os.fsync(f.fileno())


def file_digest(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _put(path: str, data) -> str:
    """Write ``data`` (bytes, or a uint8 array) to ``path`` in one call and return its SHA-256 from one call (not
    fsynced): a writer thread releases the interpreter lock twice per file, not per block."""
    with open(path, "wb") as f:
        f.write(data)
    return hashlib.sha256(data).hexdigest()


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sync_files(paths: list[str], digest: int = 0) -> list[str]:
    """Fsync ``paths`` concurrently (one journal commit can serve several: a checkpoint's files cost about one fsync,
    not one each); returns the SHA-256 of the first ``digest`` of them."""
    from concurrent.futures import ThreadPoolExecutor

    def one(i: int) -> str:
        _fsync(paths[i])
        return file_digest(paths[i]) if i < digest else ""

    with ThreadPoolExecutor(max_workers=max(1, min(8, len(paths)))) as pool:
        return list(pool.map(one, range(len(paths))))[:digest]
