"""Caches under concurrent writers (fl_lightning/data/cache.py): three processes build the same entries at once on
an empty cache folder (a barrier makes them start together), all succeed, see the same bytes and leave no .tmp; a
builder killed between write and publish leaves a cache the next run uses; an OS error is a one-line disk error."""
from __future__ import annotations

import errno
import json
import os
import subprocess
import sys

import pytest

from fl_lightning.data import cache as cache_mod
from fl_lightning.errors import DiskError
from tests.helpers.cache_race import BUILDERS, listing
from tests.helpers.cli import ROOT
from tests.helpers.text_files import bpe_tokenizer, c4_shards


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    from tests.unit.data.test_text import _glue_dir, _sentiment140

    root = tmp_path_factory.mktemp("inputs")
    _glue_dir(str(root / "glue"))
    _sentiment140(str(root / "s140"))
    return {"tok": bpe_tokenizer(str(root / "tok")), "glue": str(root / "glue"), "c4": c4_shards(str(root / "c4")),
            "s140": str(root / "s140")}


def race(builder: str, spec: dict, barrier, n: int, env: dict | None = None) -> list[subprocess.CompletedProcess]:
    cmd = [sys.executable, "-m", "tests.helpers.cache_race", builder, json.dumps(spec), str(barrier), str(n)]
    e = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1", **(env or {})}
    procs = [subprocess.Popen(cmd, cwd=ROOT, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(n)]
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=600)
        out.append(subprocess.CompletedProcess(cmd, p.returncode, stdout, stderr))
    return out


def leftovers(folder) -> list[str]:
    return [os.path.join(d, x) for d, dirs, files in os.walk(folder) for x in dirs + files if x.endswith(".tmp")]


# each builder a process of its own (an import of torch and the package, then the build): the fast subset
# (-m "not slow") races the cheapest builder, and kills the cheaper of the two; the rest run with the whole suite
CHEAPEST = "sentiment140"


@pytest.mark.parametrize("builder", [b if b == CHEAPEST else pytest.param(b, marks=pytest.mark.slow)
                                     for b in sorted(BUILDERS)])
def test_three_builders_at_once_on_an_empty_cache(builder, inputs, tmp_path):
    spec = {**inputs, "cache": str(tmp_path / "cache")}
    runs = race(builder, spec, tmp_path / "barrier", 3)
    for r in runs:
        assert r.returncode == 0, r.stderr[-3000:]
    listings = [r.stdout.splitlines() for r in runs]
    assert listings[0] and listings[0] == listings[1] == listings[2]  # the same entries, the same bytes
    assert listing(spec["cache"]) == listings[0]
    assert leftovers(spec["cache"]) == []


@pytest.mark.parametrize("builder", [pytest.param("pydoc_topics", marks=pytest.mark.slow), "glue"])
def test_a_builder_killed_before_publishing_leaves_a_cache_the_next_run_uses(builder, inputs, tmp_path):
    spec = {**inputs, "cache": str(tmp_path / "cache")}
    (killed,) = race(builder, spec, tmp_path / "b1", 1, env={"FL_TEST_KILL_BEFORE_PUBLISH": "1"})
    assert killed.returncode == -9
    assert leftovers(spec["cache"])  # its half-built entry stayed behind
    (next_run,) = race(builder, spec, tmp_path / "b2", 1)
    assert next_run.returncode == 0, next_run.stderr[-3000:]
    assert leftovers(spec["cache"]) == []  # cleaned by the next builder
    (again,) = race(builder, spec, tmp_path / "b3", 1)
    assert again.returncode == 0 and again.stdout == next_run.stdout


def test_a_live_writers_tmp_is_left_alone_and_a_dead_ones_removed(tmp_path):
    final = str(tmp_path / "entry")
    live = f"{final}.{__import__('socket').gethostname()}.{os.getppid()}.tmp"  # our parent: alive
    dead = f"{final}.otherhost.123.tmp"  # another host's writer holds no lock: gone
    for p in (live, dead):
        os.makedirs(p)
    assert cache_mod.clean_leftovers(final) == [dead]
    assert os.path.isdir(live)


def test_an_incomplete_folder_is_built_again(tmp_path):
    final = str(tmp_path / "entry")
    os.makedirs(final)  # no completion marker: a half-written entry of another version
    calls = []

    def build(tmp):
        calls.append(tmp)
        os.makedirs(tmp)
        with open(os.path.join(tmp, "data"), "w") as f:
            f.write("x")

    assert cache_mod.publish(final, build) == final
    assert len(calls) == 1 and cache_mod.complete(final)
    assert sorted(os.listdir(final)) == sorted(["data", cache_mod.MARKER])
    cache_mod.publish(final, build)
    assert len(calls) == 1  # there and complete: used, not rebuilt


def test_an_os_error_is_a_disk_error_naming_the_path_and_the_fix(tmp_path):
    def full(tmp):
        raise OSError(errno.ENOSPC, "No space left on device", tmp)

    with pytest.raises(DiskError) as err:
        cache_mod.publish(str(tmp_path / "entry"), full, "the pre-trained backbone")
    msg = str(err.value)
    assert msg.startswith("disk error: writing the pre-trained backbone: No space left on device (ENOSPC) at ")
    assert "FL_CACHE_DIR" in msg and "\n" not in msg and "config error" not in msg
    assert leftovers(tmp_path) == []
