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
opens no socket; a missing item is one line naming it (the split and file pattern, or the damaged file), the cache
folder looked in and the ``hf download`` command that fetches it on a connected machine, written as the pinned CLI
parses it (``--include`` once per pattern). With ``download=true`` a run whose files are all cached opens no socket
either (the libraries' telemetry is off: :func:`quiet_telemetry`), and a hub that cannot be reached is said as such.
Torch-free; ``huggingface_hub`` is imported only when an id is resolved.
"""
from __future__ import annotations

import logging
import os
import re
import shlex
from typing import Callable, NamedTuple

from ..errors import ConfigError

log = logging.getLogger("fl_lightning")

ENV = "FL_DOWNLOAD"  # "1": this run fetches what is missing (set by configure; read by every process of the run)
ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")
_warned: set[str] = set()
# the reader a dataset used before data.source existed (hashed as absent: ARGUMENT_HASH_RULES in config/schema.py)
LEGACY_SOURCE = {"fl_lightning.data.glue.glue": "tsv", "fl_lightning.data.c4.c4": "files"}


# the libraries' own pings, off for every run (a run that finds all its files cached opens no socket, download=true
# or not): datasets' load counter (a HEAD request per load_dataset, datasets/load.py increase_load_count) and
# huggingface_hub's telemetry
TELEMETRY_OFF = {"HF_UPDATE_DOWNLOAD_COUNTS": "0", "HF_HUB_DISABLE_TELEMETRY": "1"}


def configure(download: bool) -> None:
    """The run's switch: ``download=true`` lets the loaders fetch; otherwise both Hugging Face libraries go offline
    (set before either is imported, so they read it). Their telemetry is off either way."""
    os.environ[ENV] = "1" if download else "0"
    os.environ.update(TELEMETRY_OFF)
    if not download:
        os.environ["HF_HUB_OFFLINE"] = "1"
        os.environ["HF_DATASETS_OFFLINE"] = "1"


def quiet_telemetry() -> None:
    """The telemetry switches of :data:`TELEMETRY_OFF` also in libraries imported before :func:`configure` ran (they
    read the environment once, at import): ``datasets.config``, ``huggingface_hub.constants``."""
    os.environ.update(TELEMETRY_OFF)
    import sys

    if "datasets" in sys.modules:
        import datasets.config

        datasets.config.HF_UPDATE_DOWNLOAD_COUNTS = False
    if "huggingface_hub" in sys.modules:
        from huggingface_hub import constants

        constants.HF_HUB_DISABLE_TELEMETRY = True


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


def hf_download_command(repo: str, repo_type: str = "model", files: tuple[str, ...] = ()) -> str:
    """The ``hf download`` command line that fetches ``files`` of ``repo`` (names, or patterns with a ``*``), as the
    pinned ``huggingface_hub`` CLI (1.x) parses it: names only as positional arguments; any pattern and every file
    becomes one ``--include`` each (next to a positional name the CLI ignores ``--include``; one ``--include`` takes
    one pattern, the words after it are file names)."""
    files = tuple(dict.fromkeys(files))
    words = ["hf", "download", repo]
    if any(any(c in f for c in "*?[") for f in files):
        for f in files:
            words += ["--include", f]
    else:
        words += list(files)
    if repo_type != "model":
        words += ["--repo-type", repo_type]
    return " ".join(shlex.quote(w) for w in words)


def fetch_command(repo: str, repo_type: str = "model", files: tuple[str, ...] = ()) -> str:
    """``download=true``, or the ``hf download`` command line (:func:`hf_download_command`)."""
    cmd = hf_download_command(repo, repo_type, files)
    return (f"add download=true to this command on a connected machine, or run `{cmd}` there and copy "
            f"{repo_folder(repo, repo_type)} here")


class Gap(NamedTuple):
    """Something a run reads that a cached snapshot lacks: ``what`` it is (e.g. ``the validation split of rte
    (rte/validation-*.parquet)``), the file ``pattern`` (or name) that fetches it, and ``broken``: the snapshot's
    file whose link points at nothing (a damaged cache), if that is why."""
    what: str
    pattern: str
    broken: str | None = None


def dangling(path: str) -> bool:
    """A snapshot file whose link points at a blob that is not there."""
    return os.path.islink(path) and not os.path.exists(path)


def gaps(folder: str, wanted: dict[str, str]) -> list[Gap]:
    """What of ``wanted`` (``{pattern relative to the snapshot folder: what it is}``) ``folder`` lacks: no file
    matches, or a matching file is a dangling link."""
    import glob

    out = []
    for pattern, what in wanted.items():
        found = sorted(glob.glob(os.path.join(folder, pattern)))
        broken = [f for f in found if dangling(f)]
        if not found:
            out.append(Gap(f"{what} ({pattern})", pattern))
        for f in broken:
            name = os.path.relpath(f, folder).replace(os.sep, "/")
            out.append(Gap(f"{what} ({name})", name, f))
    return out


def _listing(items: list[Gap]) -> str:
    return ", ".join(g.what for g in items)


def missing(key: str, repo: str, repo_type: str, what: str, files: tuple[str, ...] = ()) -> ConfigError:
    local = " nor a local file or folder" if repo_type == "model" else ""  # weights/t5-base may have meant a folder
    return ConfigError(key, f"{what} {repo} is not in the Hugging Face cache (looked in {repo_folder(repo, repo_type)})"
                       f"{local}", fetch_command(repo, repo_type, files))


def incomplete(key: str, repo: str, repo_type: str, what: str, folder: str, items: list[Gap],
               files: tuple[str, ...] | None = None) -> ConfigError:
    """The cached snapshot ``folder`` of ``repo`` lacks ``items`` (missing files, or links to absent blobs), fetched
    by ``files`` (default: the items' patterns)."""
    broken = [g for g in items if g.broken]
    files = tuple(g.pattern for g in items if g.pattern) if files is None else files
    if broken:
        return ConfigError(key, f"the Hugging Face cache is damaged: {broken[0].broken} (of {what} {repo}) links to "
                           f"{os.path.realpath(broken[0].broken)}, which is not there"
                           + (f"; also missing: {_listing(items[1:])}" if len(items) > 1 else ""),
                           fetch_command(repo, repo_type, files))
    return ConfigError(key, f"{what} {repo} is only partly in the Hugging Face cache: {folder} lacks {_listing(items)}",
                       fetch_command(repo, repo_type, files))


def _locked(repo: str, repo_type: str):
    """The node's download lock for one repository (the cache's file lock, under ``$FL_CACHE_DIR``)."""
    from filelock import FileLock

    from .cache import cache_root, lock_path

    final = os.path.join(cache_root(), "hub", f"{repo_type}s--{repo.replace('/', '--')}")
    os.makedirs(os.path.dirname(lock_path(final)), exist_ok=True)
    return FileLock(lock_path(final))


def cached_snapshot(repo: str, repo_type: str = "model") -> str | None:
    """The snapshot folder ``refs/main`` names in the hub cache, if both are there (read by hand: the hub's own
    ``snapshot_download(local_files_only=True)`` refuses a snapshot that lacks any file of its cached tree listing,
    e.g. the other GLUE tasks, and says nothing of which file)."""
    base = repo_folder(repo, repo_type)
    try:
        with open(os.path.join(base, "refs", "main")) as f:
            rev = f.read().strip()
    except OSError:
        return None
    path = os.path.join(base, "snapshots", rev)
    return path if rev and os.path.isdir(path) else None


def _unreachable(err: BaseException | None) -> BaseException | None:
    """The error in ``err``'s chain that says the hub could not be reached (no network, a timeout, offline mode, the
    hub down), or None."""
    import httpx
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled

    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, (httpx.TransportError, OfflineModeIsEnabled, ConnectionError, TimeoutError)):
            return err
        if isinstance(err, HfHubHTTPError) and err.response is not None and err.response.status_code >= 500:
            return err
        err = err.__cause__ or err.__context__
    return None


def _probe(repo: str, repo_type: str) -> BaseException | None:
    """Can the hub be reached? The error that says it cannot, else None (asked only after a fetch came back short:
    the hub's downloader falls back on the cached snapshot without saying so)."""
    from huggingface_hub import HfApi

    try:
        HfApi().repo_info(repo, repo_type=repo_type)
    except Exception as err:  # noqa: BLE001 - not found, gated: the hub answered
        return _unreachable(err)
    return None


def _text(err: BaseException) -> str:
    return f"{type(err).__name__}: {' '.join(str(err).split())[:160]}"


def _failed(key: str, repo: str, repo_type: str, err: BaseException, what: str = "",
            lacks: str = "", files: tuple[str, ...] = ()) -> ConfigError:
    """A fetch under ``download=true`` that did not bring what the run reads (``lacks``, fetched by ``files``)."""
    folder = repo_folder(repo, repo_type)
    cmd = hf_download_command(repo, repo_type, files)
    lacks = lacks or f"{folder} holds no copy of {what + ' ' if what else ''}{repo}"
    offline = _unreachable(err)
    if offline is not None:
        return ConfigError(key, f"could not download {repo}: the Hugging Face hub could not be reached "
                           f"({_text(offline)}); nothing was downloaded, and {lacks}",
                           f"run `{cmd}` on a connected machine and copy {folder} here, then run again (with or "
                           "without download=true)")
    return ConfigError(key, f"could not download {repo} into {folder} ({_text(err)}); {lacks}",
                       f"run `{cmd}` on a connected machine and copy {folder} here, then run without download=true")


def _cached_file(repo: str, filename: str, repo_type: str) -> str | None:
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(repo, filename, cache_dir=hub_cache(), repo_type=repo_type)
    return found if isinstance(found, str) else None


def resolve_files(repo: str, filenames: list[str], key: str, repo_type: str = "model", fetch: bool | None = None,
                  what: str = "the weights", covering: str | None = None) -> list[str]:
    """The local paths of ``filenames`` of ``repo`` in the hub cache (the missing ones fetched first when ``fetch``:
    default :func:`downloading`); what is missing is one line naming ``key``, every missing file and the command
    that fetches them all (or the damaged file: a link to a blob that is not there). ``covering``: a pattern that
    matches exactly ``filenames``, printed instead of the names when none is cached (1,024 C4 shards)."""
    from huggingface_hub import hf_hub_download

    fetch = downloading() if fetch is None else fetch
    found = {name: _cached_file(repo, name, repo_type) for name in filenames}
    absent = [name for name, path in found.items() if path is None]
    if absent and not fetch:
        snap = cached_snapshot(repo, repo_type)
        files = (covering,) if covering and len(absent) == len(found) else tuple(absent)
        if snap is None:
            raise missing(key, repo, repo_type, what, files)
        raise incomplete(key, repo, repo_type, what, snap, [
            Gap(name, name, os.path.join(snap, name) if dangling(os.path.join(snap, name)) else None)
            for name in absent], files)
    if absent:
        with _locked(repo, repo_type):
            for i, name in enumerate(absent):
                path = _cached_file(repo, name, repo_type)  # another process of this node may have fetched it
                if path is None:
                    try:
                        path = hf_hub_download(repo, name, repo_type=repo_type, cache_dir=hub_cache())
                    except Exception as err:  # noqa: BLE001 - no network, no such repo or file: one line
                        rest = tuple(absent[i:])
                        raise _failed(key, repo, repo_type, err, what, f"{repo_folder(repo, repo_type)} lacks "
                                      f"{', '.join(rest)}", rest) from None
                found[name] = path
    return [found[name] for name in filenames]


def resolve_file(repo: str, filename: str, key: str, repo_type: str = "model", fetch: bool | None = None,
                 what: str = "the weights") -> str:
    """The local path of ``filename`` of ``repo`` in the hub cache (fetched first when ``fetch``: default
    :func:`downloading`); a missing file is a one-line ConfigError naming ``key``."""
    return resolve_files(repo, [filename], key, repo_type, fetch, what)[0]


def resolve_snapshot(repo: str, key: str, repo_type: str = "model", patterns: list[str] | None = None,
                     fetch: bool | None = None, what: str = "the model", need=None,
                     lacking: Callable[[str], list[Gap]] | None = None) -> str:
    """The snapshot folder of ``repo`` in the hub cache (``refs/main``), fetching the files matching ``patterns``
    first when ``fetch`` (default :func:`downloading`) and the folder lacks something: ``lacking(folder)`` (the
    :class:`Gap` list, e.g. from :func:`gaps`), else ``need(folder)`` (default: the folder exists) is false. What is
    still missing is one line naming ``key``, what is missing (a split and its file pattern, a damaged file), and the
    ``hf download`` command that fetches it."""
    from huggingface_hub import snapshot_download

    fetch = downloading() if fetch is None else fetch
    patterns = list(patterns) if patterns else None
    if lacking is None:
        need = need or os.path.isdir
        reads = f"the files this run reads ({', '.join(patterns)})" if patterns else "the files this run reads"
        lacking = lambda p: [] if need(p) else [Gap(reads, "")]  # noqa: E731

    def fetches(items: list[Gap]) -> tuple[str, ...]:  # the files that fill the gaps (all of patterns if unknown)
        named = tuple(g.pattern for g in items if g.pattern)
        return named if named and len(named) == len(items) else tuple(patterns or ())

    def local() -> tuple[str | None, list[Gap]]:
        path = cached_snapshot(repo, repo_type)
        return path, (lacking(path) if path else [])

    path, short = local()
    if path and not short:
        return path
    if not fetch:
        if path is None:
            raise missing(key, repo, repo_type, what, tuple(patterns or ()))
        raise incomplete(key, repo, repo_type, what, path, short, fetches(short))
    with _locked(repo, repo_type):
        path, short = local()
        if path and not short:
            return path
        lacks = (f"{path} lacks {_listing(short)}" if path else "")
        try:
            path = snapshot_download(repo, repo_type=repo_type, cache_dir=hub_cache(), allow_patterns=patterns)
        except Exception as err:  # noqa: BLE001
            raise _failed(key, repo, repo_type, err, what, lacks, fetches(short)) from None
    short = lacking(path)
    if short:  # the hub's downloader falls back on the cached snapshot when it cannot reach the hub
        offline = _probe(repo, repo_type)
        if offline is not None:
            raise _failed(key, repo, repo_type, offline, what, f"{path} lacks {_listing(short)}", fetches(short))
        raise ConfigError(key, f"{what} {repo} on the Hugging Face hub has no {_listing(short)} (fetched into {path})",
                          f"check {key} and the files of {repo} on huggingface.co")
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

