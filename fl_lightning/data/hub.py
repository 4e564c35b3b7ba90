"""Hugging Face hub ids for data and weights, and the one switch that fetches them (``download=true``).

An id (``org/name``, e.g. ``FacebookAI/roberta-base``, ``timm/vit_base_patch16_224.orig_in21k``, ``nyu-mll/glue``)
is looked up in this order:

1. ``$FL_WEIGHTS_ROOT/<name>`` (default ``./weights``; a file or folder named like the id's last part, or one of the
   model's older local names): the local copy still comes first, as before hub ids;
2. the Hugging Face hub cache (``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``~/.cache/huggingface/hub``), read
   with ``local_files_only``: nothing is fetched;
3. with ``download=true`` (top-level; outside the result hash), the libraries' own downloaders into their own
   caches, once per node: one process downloads under a file lock (:mod:`fl_lightning.data.cache`), the others
   wait and read the cache.

Without ``download=true`` a run sets ``HF_HUB_OFFLINE=1`` and ``HF_DATASETS_OFFLINE=1`` (:func:`configure`) and
opens no socket; a missing item is one line naming it, the cache folder looked in and the command that fetches it
on a connected machine. Torch-free; ``huggingface_hub`` is imported only when an id is resolved.
"""
from __future__ import annotations

import logging
import os
import re

from ..errors import ConfigError

log = logging.getLogger("fl_lightning")

ENV = "FL_DOWNLOAD"  # "1": this run fetches what is missing (set by configure; read by every process of the run)
ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")
_warned: set[str] = set()
# the reader a dataset used before data.source existed (hashed as absent: ARGUMENT_HASH_RULES in config/schema.py)
LEGACY_SOURCE = {"fl_lightning.data.glue.glue": "tsv", "fl_lightning.data.c4.c4": "files"}


def configure(download: bool) -> None:
    """The run's switch: ``download=true`` lets the loaders fetch; otherwise both Hugging Face libraries go offline
    (set before either is imported, so they read it)."""
    os.environ[ENV] = "1" if download else "0"
    if not download:
        os.environ["HF_HUB_OFFLINE"] = "1"
        os.environ["HF_DATASETS_OFFLINE"] = "1"


def downloading() -> bool:
    """Did the run ask to fetch what is missing (``download=true``)?"""
    return os.environ.get(ENV) == "1"


def deprecated(key: str, fix: str) -> None:
    """One line, once per process, for an old opt-in key that still works."""
    if key not in _warned:
        _warned.add(key)
        log.warning("%s is deprecated and still works; %s", key, fix)


def allow_fetch(legacy_key: str | None = None, legacy_value=None, legacy_means_fetch=None) -> bool:
    """Whether this loader may fetch: ``download=true``, or an old opt-in (``hub_offline: false``,
    ``data.download: true``; ``legacy_means_fetch(value)``) with its deprecation line."""
    if legacy_key is not None and legacy_means_fetch is not None and legacy_means_fetch(legacy_value):
        deprecated(legacy_key, "use the top-level download=true (it fetches everything the run needs)")
        return True
    return downloading()


def is_hub_id(value) -> bool:
    """``org/name`` that is not a local path (no leading ``.``, ``/`` or ``~``, nothing there on disk)."""
    return isinstance(value, str) and bool(ID.match(value)) and not os.path.exists(value)


def hf_home() -> str:
    return os.path.expanduser(os.environ.get("HF_HOME") or os.path.join("~", ".cache", "huggingface"))


def hub_cache() -> str:
    """The hub cache folder, read from the environment now (not when huggingface_hub was imported)."""
    return os.path.expanduser(os.environ.get("HF_HUB_CACHE") or os.path.join(hf_home(), "hub"))


def datasets_cache() -> str:
    """Where ``datasets`` keeps its Arrow copies (``$HF_DATASETS_CACHE``, else ``$HF_HOME/datasets``)."""
    return os.path.expanduser(os.environ.get("HF_DATASETS_CACHE") or os.path.join(hf_home(), "datasets"))


def repo_folder(repo: str, repo_type: str = "model") -> str:
    return os.path.join(hub_cache(), f"{repo_type}s--{repo.replace('/', '--')}")


def local_first(repo: str, also: tuple[str, ...] = ()) -> str | None:
    """``$FL_WEIGHTS_ROOT/<name>`` (default ``weights/``) or one of ``also`` there, if it exists."""
    root = os.path.expanduser(os.environ.get("FL_WEIGHTS_ROOT") or "weights")
    for name in (repo.rsplit("/", 1)[-1], *also):
        path = os.path.join(root, name)
        if os.path.exists(path):
            return path
    return None


def fetch_command(repo: str, repo_type: str = "model", files: tuple[str, ...] = ()) -> str:
    """``download=true``, or the ``hf download`` command line (``files``: names, or patterns with a ``*``)."""
    kind = " --repo-type dataset" if repo_type == "dataset" else ""
    names = [f for f in files if "*" not in f]
    patterns = [f"'{f}'" for f in files if "*" in f]
    args = "".join(" " + f for f in names) + (" --include " + " ".join(patterns) if patterns else "")
    return (f"add download=true to this command on a connected machine, or run `hf download {repo}{args}{kind}` "
            f"there and copy {repo_folder(repo, repo_type)} here")


def missing(key: str, repo: str, repo_type: str, what: str, files: tuple[str, ...] = ()) -> ConfigError:
    local = " nor a local file or folder" if repo_type == "model" else ""  # weights/t5-base may have meant a folder
    return ConfigError(key, f"{what} {repo} is not in the Hugging Face cache (looked in {repo_folder(repo, repo_type)})"
                       f"{local}", fetch_command(repo, repo_type, files))


def _locked(repo: str, repo_type: str):
    """The node's download lock for one repository (the cache's file lock, under ``$FL_CACHE_DIR``)."""
    from filelock import FileLock

    from .cache import cache_root, lock_path

    final = os.path.join(cache_root(), "hub", f"{repo_type}s--{repo.replace('/', '--')}")
    os.makedirs(os.path.dirname(lock_path(final)), exist_ok=True)
    return FileLock(lock_path(final))


def _failed(key: str, repo: str, repo_type: str, err: Exception) -> ConfigError:
    return ConfigError(key, f"could not download {repo} into {repo_folder(repo, repo_type)} ({type(err).__name__}: "
                       f"{' '.join(str(err).split())[:160]})", "run it on a connected machine and copy the cache "
                       "folder here, then run without download=true")


def resolve_file(repo: str, filename: str, key: str, repo_type: str = "model", fetch: bool | None = None,
                 what: str = "the weights") -> str:
    """The local path of ``filename`` of ``repo`` in the hub cache (fetched first when ``fetch``: default
    :func:`downloading`); a missing file is a one-line ConfigError naming ``key``."""
    from huggingface_hub import hf_hub_download, try_to_load_from_cache

    fetch = downloading() if fetch is None else fetch
    cache = hub_cache()
    found = try_to_load_from_cache(repo, filename, cache_dir=cache, repo_type=repo_type)
    if isinstance(found, str):
        return found
    if not fetch:
        raise missing(key, repo, repo_type, what, (filename,))
    with _locked(repo, repo_type):
        found = try_to_load_from_cache(repo, filename, cache_dir=cache, repo_type=repo_type)
        if isinstance(found, str):  # another process of this node fetched it while this one waited
            return found
        try:
            return hf_hub_download(repo, filename, repo_type=repo_type, cache_dir=cache)
        except Exception as err:  # noqa: BLE001 - no network, no such repo or file: one line
            raise _failed(key, repo, repo_type, err) from None


def resolve_snapshot(repo: str, key: str, repo_type: str = "model", patterns: list[str] | None = None,
                     fetch: bool | None = None, what: str = "the model", need=None) -> str:
    """The snapshot folder of ``repo`` in the hub cache (``refs/main``), fetching the files matching ``patterns``
    first when ``fetch`` (default :func:`downloading`) and ``need(folder)`` (default: the folder exists) is false."""
    from huggingface_hub import snapshot_download

    fetch = downloading() if fetch is None else fetch
    cache = hub_cache()
    need = need or os.path.isdir

    def local() -> str | None:
        try:
            path = snapshot_download(repo, repo_type=repo_type, cache_dir=cache, local_files_only=True)
        except Exception:  # noqa: BLE001 - LocalEntryNotFoundError and kin: not in the cache
            return None
        return path if need(path) else None

    path = local()
    if path:
        return path
    if not fetch:
        raise missing(key, repo, repo_type, what, tuple(patterns or ()))
    with _locked(repo, repo_type):
        path = local()
        if path:
            return path
        try:
            path = snapshot_download(repo, repo_type=repo_type, cache_dir=cache, allow_patterns=patterns)
        except Exception as err:  # noqa: BLE001
            raise _failed(key, repo, repo_type, err) from None
    if not need(path):
        raise ConfigError(key, f"{repo} was downloaded to {path} but lacks the files this run reads",
                          f"check the id (files {patterns})")
    return path


def inherit_source(cfg, saved) -> bool:
    """A run saved before ``data.source`` existed resumes with the reader it ran with (GLUE: ``tsv``, C4:
    ``files``), the way ``ns_dtype: auto`` inherits a resumed run's precision. Returns whether it changed ``cfg``."""
    from omegaconf import open_dict

    data, old = cfg.get("data"), saved.get("data") if saved is not None else None
    if data is None or old is None or "source" not in data or "source" in old:
        return False
    legacy = LEGACY_SOURCE.get(str(data.get("_target_")))
    if legacy is None:
        return False
    with open_dict(data):
        data.source = legacy
    return True

