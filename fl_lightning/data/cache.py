"""Cache entries that any number of processes, on one machine or several sharing a filesystem, can build at once.

Every cache the package writes (the pre-trained backbones and tokenizers of ``pydoc_topics``, tokenized datasets and
token files, vocabularies) goes through :func:`publish`:

- a file lock (``filelock``: fcntl's ``flock`` on ``.locks/<entry>.lock`` in the entry's folder) is held around
  check, build and publish, so one process builds an entry and the others wait and then use it;
- the entry is built at ``<entry>.<host>.<pid>.tmp`` and renamed into place, a folder with a completion marker
  (``.fl_complete``) written last, so a half-written entry is never read: a folder without the marker is built again;
- leftover ``.tmp`` entries of dead writers (a kill -9 between write and publish) are removed by the next builder,
  under the lock, never while their writer lives (same host: its pid is checked; another host: it holds no lock, so
  it is gone);
- an OS error (disk full, permissions) is a one-line :class:`~fl_lightning.errors.DiskError` naming the path.

Caches live under ``$FL_CACHE_DIR`` (default ``~/.cache/fl_lightning``: :func:`cache_root`; ``trainer.compile``'s
code too, in ``inductor/``); deleting that folder is safe while nothing runs, and everything is rebuilt on the next
run.
"""
from __future__ import annotations

import glob
import os
import shutil
import socket
from collections.abc import Callable

from filelock import FileLock

from ..errors import DiskError

MARKER = ".fl_complete"
# a test's hook: called with the temporary path after the build and before the rename (a barrier to make a race
# certain, or a kill between write and publish)
_before_publish: Callable[[str], None] | None = None


def cache_root() -> str:
    """``$FL_CACHE_DIR``, or ``~/.cache/fl_lightning``: where the package's caches live (absolute)."""
    root = os.environ.get("FL_CACHE_DIR") or os.path.join("~", ".cache", "fl_lightning")
    return os.path.abspath(os.path.expanduser(root))


def lock_path(final: str) -> str:
    parent, name = os.path.split(os.path.abspath(final))
    return os.path.join(parent, ".locks", name + ".lock")


def complete(path: str) -> bool:
    """A file that is there (a rename put it there whole), or a folder with its completion marker."""
    if os.path.isdir(path):
        return os.path.isfile(os.path.join(path, MARKER))
    return os.path.isfile(path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            os.remove(path)
        except FileNotFoundError:
            pass


def clean_leftovers(final: str, ready: Callable[[str], bool] = complete) -> list[str]:
    """Remove ``<final>.<host>.<pid>.tmp`` entries whose writer is gone, and a folder at ``final`` that is not
    ``ready`` (incomplete). Call it holding the entry's lock."""
    removed, host = [], socket.gethostname()
    for tmp in glob.glob(glob.escape(final) + ".*.tmp"):
        parts = tmp[len(final) + 1: -len(".tmp")].rsplit(".", 1)
        if len(parts) == 2 and parts[0] == host and parts[1].isdigit() and _alive(int(parts[1])) \
                and int(parts[1]) != os.getpid():
            continue  # a writer on this host that still runs (of an older version, without the lock): leave it
        _remove(tmp)
        removed.append(tmp)
    if os.path.isdir(final) and not ready(final):
        _remove(final)
        removed.append(final)
    return removed


def publish(final: str, build: Callable[[str], object], what: str = "a cache entry",
            ready: Callable[[str], bool] = complete) -> str:
    """``final`` built once by whichever process comes first: ``build(tmp)`` writes the entry (a file or a folder) at
    ``tmp``; the others wait on the lock and then use it. ``ready(final)``: the entry is there and whole (default:
    :func:`complete`; a builder whose own last-written file says so may pass its check, which also accepts entries
    an older version published by rename). Returns ``final``."""
    if ready(final):
        return final
    parent = os.path.dirname(os.path.abspath(final))
    try:
        os.makedirs(os.path.join(parent, ".locks"), exist_ok=True)
        with FileLock(lock_path(final)):
            if ready(final):
                return final
            clean_leftovers(final, ready)
            tmp = f"{final}.{socket.gethostname()}.{os.getpid()}.tmp"
            _remove(tmp)
            try:
                build(tmp)
                if os.path.isdir(tmp):
                    with open(os.path.join(tmp, MARKER), "w") as f:
                        f.write("complete\n")
                if _before_publish is not None:
                    _before_publish(tmp)
                os.replace(tmp, final)
            except BaseException:
                _remove(tmp)
                raise
    except OSError as err:
        raise DiskError(f"writing {what}", err) from None
    return final
