"""The data loaders' one-line messages about the Hugging Face cache (issue 65, items 3-6 and the CIFAR part of 13):
every printed ``hf download`` command is parsed by the installed ``hf`` CLI (its downloaders replaced, nothing is
fetched) and must ask for exactly what the run reads; an offline miss under ``download=true`` says the hub could not
be reached (nothing was downloaded); a missing split and a dangling blob are named; a run whose files are all cached
opens no connection even with ``download=true``; the CIFAR miss gives only our fix. The cache is written in the hub
cache's own layout (``<kind>s--org--name/{refs/main,snapshots/<rev>/...,blobs/<hash>}``) under a temporary
``HF_HOME``."""
from __future__ import annotations

import fnmatch
import os
import re
import shlex
import socket

import pytest

from fl_lightning.errors import ConfigError

from tests.helpers.hub_cache import REV, snapshot  # noqa: F401 (REV: the snapshot's revision)


def write_task(home, config: str, splits=("train", "validation"), rows: int = 6) -> str:
    """``<config>/<split>-00000-of-00001.parquet`` of nyu-mll/glue, each a link into ``blobs/`` as the hub writes it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    snap = snapshot(home, "dataset", "nyu-mll/glue")
    blobs = os.path.join(snap, "..", "..", "blobs")
    os.makedirs(blobs, exist_ok=True)
    os.makedirs(os.path.join(snap, config), exist_ok=True)
    for split in splits:
        blob = os.path.join(blobs, f"{config}-{split}-blob")
        pq.write_table(pa.table({"sentence1": [f"a {i}" for i in range(rows)],
                                 "sentence2": [f"b {i}" for i in range(rows)],
                                 "label": pa.array([i % 2 for i in range(rows)], pa.int64()),
                                 "idx": pa.array(range(rows), pa.int32())}), blob)
        os.symlink(os.path.join("..", "..", "..", "blobs", f"{config}-{split}-blob"),
                   os.path.join(snap, config, f"{split}-00000-of-00001.parquet"))
    return snap


@pytest.fixture
def home(tmp_path, monkeypatch):
    """An empty Hugging Face home, a fresh FL_CACHE_DIR, no local weights, downloads off."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HF_DATASETS_CACHE", raising=False)
    monkeypatch.setenv("FL_CACHE_DIR", str(tmp_path / "fl_cache"))
    monkeypatch.setenv("FL_WEIGHTS_ROOT", str(tmp_path / "no_weights"))
    monkeypatch.setenv("FL_DOWNLOAD", "0")
    return tmp_path / "hf"


@pytest.fixture
def no_network(monkeypatch):
    """Every name look-up and connect fails (and is recorded): what a machine without a network does."""
    import huggingface_hub.constants

    attempts = []

    def refuse_lookup(host, *args, **kwargs):
        attempts.append(("getaddrinfo", host))
        raise socket.gaierror(socket.EAI_NONAME, "no network in this test")

    def refuse_connect(self, address):
        attempts.append(("connect", address))
        raise OSError("network is unreachable (test)")

    monkeypatch.setattr(socket, "getaddrinfo", refuse_lookup)
    monkeypatch.setattr(socket.socket, "connect", refuse_connect)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    return attempts


def command_of(message: str) -> str:
    """The ``hf download ...`` command a message prints (between backticks)."""
    found = re.findall(r"`(hf download [^`]*)`", message)
    assert len(found) == 1, message
    return found[0]


def parse_with_cli(command: str, monkeypatch) -> dict:
    """What the installed ``hf`` CLI does with ``command``: the one downloader call it makes, its arguments (the
    downloaders are replaced here; nothing is fetched)."""
    from click.testing import CliRunner
    from huggingface_hub.cli import download as cli_download
    from huggingface_hub.cli.hf import app

    calls = []
    monkeypatch.setattr(cli_download, "snapshot_download",
                        lambda **kw: calls.append({"call": "snapshot_download", **kw}) or "/nowhere")
    monkeypatch.setattr(cli_download, "hf_hub_download",
                        lambda **kw: calls.append({"call": "hf_hub_download", **kw}) or "/nowhere")
    argv = shlex.split(command)
    assert argv[:2] == ["hf", "download"], command
    result = CliRunner().invoke(app, argv[1:], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert len(calls) == 1, calls
    return calls[0]


def fetched(call: dict, names: list[str]) -> list[str]:
    """Which of ``names`` (files of the repo) the parsed download would fetch."""
    if call["call"] == "hf_hub_download":
        return [n for n in names if n == call["filename"]]
    allow = call["allow_patterns"]
    return [n for n in names if allow is None or any(fnmatch.fnmatch(n, p) for p in allow)]


GLUE_FILES = [f"{c}/{s}-00000-of-00001.parquet" for c in ("cola", "rte")
              for s in ("train", "validation", "test")] + ["README.md"]


# --- item 3: the printed commands are the ones the CLI parses as meant ---------------------------------------------

def test_fetch_command_is_parsed_by_the_installed_cli_as_meant(monkeypatch):
    from fl_lightning.data import hub

    def parsed(repo, repo_type, files):
        return parse_with_cli(command_of(hub.fetch_command(repo, repo_type, files)), monkeypatch)

    call = parsed("nyu-mll/glue", "dataset", ("cola/train-*.parquet", "cola/validation-*.parquet"))
    assert call["call"] == "snapshot_download" and call["repo_id"] == "nyu-mll/glue" and call["repo_type"] == "dataset"
    assert call["allow_patterns"] == ["cola/train-*.parquet", "cola/validation-*.parquet"]
    call = parsed("FacebookAI/roberta-large", "model", ("*.json", "*.txt", "*.model"))
    assert call["repo_id"] == "FacebookAI/roberta-large" and call["repo_type"] == "model"
    assert call["allow_patterns"] == ["*.json", "*.txt", "*.model"]
    names = ["en/c4-train.00000-of-01024.json.gz", "en/c4-train.00001-of-01024.json.gz"]
    call = parsed("allenai/c4", "dataset", tuple(names))
    assert (call["repo_id"], call["repo_type"], call["allow_patterns"]) == ("allenai/c4", "dataset", names)
    call = parsed("allenai/c4", "dataset", tuple(names[:1]))
    assert (call["call"], call["filename"], call["repo_type"]) == ("hf_hub_download", names[0], "dataset")
    # a file name and a pattern together: both fetched (the CLI ignores --include next to a positional name)
    call = parsed("org/m", "model", ("model.safetensors", "*.json"))
    assert fetched(call, ["model.safetensors", "config.json", "x.bin"]) == ["model.safetensors", "config.json"]


def test_the_glue_miss_prints_a_command_that_fetches_the_task(home, monkeypatch):
    from fl_lightning.data.glue import hub_splits

    with pytest.raises(ConfigError) as err:
        hub_splits("cola", "hub", "", False)
    assert err.value.key == "source" and "\n" not in str(err.value)
    call = parse_with_cli(command_of(str(err.value)), monkeypatch)
    assert (call["repo_id"], call["repo_type"]) == ("nyu-mll/glue", "dataset")
    assert fetched(call, GLUE_FILES) == ["cola/train-00000-of-00001.parquet", "cola/validation-00000-of-00001.parquet"]


def test_the_tokenizer_miss_prints_a_command_that_fetches_config_and_tokenizer(home, monkeypatch):
    from fl_lightning.data.text import load_tokenizer

    with pytest.raises(ConfigError) as err:
        load_tokenizer("FacebookAI/roberta-large", "tokenizer_path", offline=True)
    call = parse_with_cli(command_of(str(err.value)), monkeypatch)
    assert (call["repo_id"], call["repo_type"]) == ("FacebookAI/roberta-large", "model")
    files = ["config.json", "tokenizer.json", "vocab.json", "merges.txt", "tokenizer_config.json", "model.safetensors"]
    assert fetched(call, files) == files[:5]


def test_the_c4_miss_prints_a_command_that_fetches_every_missing_shard(home, monkeypatch):
    from fl_lightning.data.c4 import hub_shards

    with pytest.raises(ConfigError) as err:
        hub_shards("train", 3, "max_train_shards", False)
    call = parse_with_cli(command_of(str(err.value)), monkeypatch)
    names = [f"en/c4-train.{i:05d}-of-01024.json.gz" for i in range(4)]
    assert (call["repo_id"], call["repo_type"]) == ("allenai/c4", "dataset")
    assert fetched(call, names) == names[:3]
    with pytest.raises(ConfigError) as err:  # max_val_shards: null, the whole split (8 files): one pattern
        hub_shards("validation", None, "max_val_shards", False)
    call = parse_with_cli(command_of(str(err.value)), monkeypatch)
    val = [f"en/c4-validation.{i:05d}-of-00008.json.gz" for i in range(8)]
    assert fetched(call, names + val) == val


# --- item 4: download=true without a network is not "was downloaded" -----------------------------------------------

def test_download_true_offline_with_a_partial_cache_says_the_hub_could_not_be_reached(home, no_network, monkeypatch):
    """rte cached, cola asked for, download=true, no network: the hub could not be reached, cola's two file patterns
    are missing, and the command that fetches them."""
    from fl_lightning.data.glue import hub_splits

    write_task(home, "rte")
    monkeypatch.setenv("FL_DOWNLOAD", "1")
    with pytest.raises(ConfigError) as err:
        hub_splits("cola", "hub", "", True)
    msg = str(err.value)
    assert "\n" not in msg and "was downloaded to" not in msg and "could not be reached" in msg, msg
    assert "cola/train-*.parquet" in msg and "cola/validation-*.parquet" in msg, msg
    call = parse_with_cli(command_of(msg), monkeypatch)
    assert fetched(call, GLUE_FILES) == ["cola/train-00000-of-00001.parquet", "cola/validation-00000-of-00001.parquet"]
    assert no_network  # it did try the hub


# --- item 5: which split is missing; a dangling blob ---------------------------------------------------------------

def test_a_missing_split_is_named_with_its_file_pattern(home, monkeypatch):
    from fl_lightning.data.glue import hub_splits

    write_task(home, "rte", splits=("train",))
    with pytest.raises(ConfigError) as err:
        hub_splits("rte", "hub", "", False)
    msg = str(err.value)
    assert "validation split" in msg and "rte/validation-*.parquet" in msg and "train split" not in msg, msg
    call = parse_with_cli(command_of(msg), monkeypatch)
    assert fetched(call, GLUE_FILES) == ["rte/validation-00000-of-00001.parquet"]


def test_one_cached_task_reads_although_the_tree_listing_names_the_others(home):
    """A real download of rte leaves the hub's tree listing of the whole repo (``trees/<rev>.json``, every task's
    files): the cached rte still reads offline (the hub's own local look-up refuses such a snapshot as incomplete)."""
    from huggingface_hub._tree_cache import TreeCacheEntry, write_tree_cache

    from fl_lightning.data.glue import hub_splits

    snap = write_task(home, "rte")
    write_tree_cache(os.path.dirname(os.path.dirname(snap)), REV,
                     {name: TreeCacheEntry(size=1, blob_id=f"b{i}") for i, name in enumerate(GLUE_FILES)})
    train, test = hub_splits("rte", "hub", "", False)
    assert len(train) == len(test) == 6


def test_a_dangling_blob_is_named_as_a_damaged_cache(home, monkeypatch):
    from fl_lightning.data.glue import hub_splits

    snap = write_task(home, "rte")
    link = os.path.join(snap, "rte", "validation-00000-of-00001.parquet")
    os.remove(os.path.realpath(link))  # the snapshot's link now points at nothing
    with pytest.raises(ConfigError) as err:
        hub_splits("rte", "hub", "", False)
    msg = str(err.value)
    assert err.value.key == "source" and "damaged" in msg and link in msg, msg
    assert "FileNotFoundError" not in msg and "check the arguments" not in msg
    call = parse_with_cli(command_of(msg), monkeypatch)
    assert fetched(call, GLUE_FILES) == ["rte/validation-00000-of-00001.parquet"]


# --- item 6: everything cached + download=true: no connection at all -----------------------------------------------

def test_download_true_with_everything_cached_opens_no_connection(home, no_network, monkeypatch):
    import datasets

    from fl_lightning.data import hub
    from fl_lightning.data.glue import hub_splits

    write_task(home, "rte")
    # datasets as a fresh process sees it (its switches are read when it is imported): online, counting loads
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(datasets.config, "HF_UPDATE_DOWNLOAD_COUNTS", True)
    for name in ("FL_DOWNLOAD", "HF_UPDATE_DOWNLOAD_COUNTS", "HF_HUB_DISABLE_TELEMETRY", "HF_HUB_OFFLINE",
                 "HF_DATASETS_OFFLINE"):
        monkeypatch.setenv(name, "")
    hub.configure(True)
    train, test = hub_splits("rte", "hub", "", hub.downloading())
    assert len(train) == len(test) == 6
    assert no_network == []
    # the whole GLUE builder (the tokenizer by its id from the cache too)
    from fl_lightning.data.glue import glue
    from fl_lightning.data.pretrain import train_tokenizer

    train_tokenizer([f"sentence number {i} a b" for i in range(50)], snapshot(home, "model", "FacebookAI/roberta-base"),
                    vocab_size=300)
    tr, te, info = glue(task="rte", source="hub", tokenizer_path="FacebookAI/roberta-base", cache_dir=None,
                        max_length=16)
    assert len(tr) == len(te) == 6 and info.num_classes == 2
    assert no_network == []


# --- item 13 (CIFAR): the miss line gives only our fix -------------------------------------------------------------

def test_the_cifar_miss_gives_only_the_top_level_download_switch(tmp_path, monkeypatch):
    from fl_lightning.data.vision import cifar10, mnist

    monkeypatch.setenv("FL_DOWNLOAD", "0")
    monkeypatch.setenv("FL_CACHE_DIR", str(tmp_path / "fl"))
    for build in (cifar10, mnist):
        with pytest.raises(ConfigError) as err:
            build(str(tmp_path / "data"))
        msg = str(err.value)
        assert "download=True" not in msg and "add download=true" in msg and "\n" not in msg, msg
