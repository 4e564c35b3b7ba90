"""Every command the README and docs/ print is a test (issue 59): a documented command that silently does nothing, or
names a key that no longer exists, is what a newcomer meets first.

The commands come from tests/helpers/doc_commands.py, a collector of our own: pytest-examples, phmdoctest and
pytest-markdown-docs run ```python blocks only, and mktestdocs runs a whole ```bash block as written (a 50-round run,
a 6,000-job sweep); none reads the indented and inline command lines (the results pages' line 5 and 6, the
reproduction table) or lets the test shrink a command. The docs keep the real commands; the shrinking is here.

- ``train.py`` lines, in-process (fast, one per distinct line): every job's group names, the first job composed
  and checked as ``train.py`` does (a bad key fails), every swept value applied to it and checked; the documented
  refusals (``$ `` lines in a ```console block, :data:`REFUSED`) print their line, exit 2, and their fix, where it
  names a concrete change, gets the line past that check when followed (tests/helpers/fixes.py). A span of
  overrides written relative to an experiment ("all with ``experiment=X``", issue 65) is such a line, composed with
  that experiment (fast tier only: it is the experiment's line with other values).
- slow: every sweep's combinations of group choices (method, arm, model, data, ...) composed and checked in full;
  shrunk runs of the lines' first jobs (one round, tiny widths, test_experiments_shrunk's tiny files): one per
  wiring, pairwise (a method's parts with each model, with each data set); not again what test_experiments_shrunk
  runs (an experiment as it is); the first line of each real data set, as written, ends in its one-line message,
  exit 2 (its data is absent here).
- slow, real subprocesses from the repository root: every ``python -m X`` / ``python tools/X.py`` named in the docs
  answers ``--help``; every ``fl-report`` / ``python -m fl_lightning.report`` line writes its files from a tiny
  sweep made here (the results pages' fourteen ``--declared`` lines as one command over fourteen sweeps);
  ``python -m fl_lightning.config.keys`` lines print their keys.
- Lines not run are skipped with the reason in :data:`SKIP` (pip, pytest, torchrun / srun, a GPU, a download, a
  template with placeholders, a measurement of minutes); :func:`run_plan` says why a train.py line is not run.
"""
from __future__ import annotations

import contextlib
import copy
import io
import itertools
import json
import os
import re
import subprocess
import sys
from collections import OrderedDict

import pytest

from tests.helpers.cli import CONF, ROOT, cli_in_process, one_line_error
from tests.helpers.doc_commands import Command, all_commands, doc_pages
from tests.system.test_experiments_shrunk import files  # noqa: F401  (the tiny data files, a module fixture)

GROUP_KEYS = ("method", "model", "data", "data/partition", "optimizer", "server_opt", "arm", "experiment", "logger",
              "dp")
OUTPUT_KEYS = ("hydra.run.dir", "hydra.sweep.dir", "hydra/launcher", "hydra.launcher.n_jobs")  # where and how it runs
REAL_DATA = ("cifar10", "cifar100", "fashion_mnist", "mnist", "tiny_imagenet", "glue", "sentiment140", "shakespeare",
             "c4")
PLACEHOLDER = re.compile(r"<[^>]*>|\.\.\.|(^|\s)\[[^\]]*\](\s|$)|=[A-Z](\s|$)|\$PWD")
# lines the docs show being refused (besides the ```console blocks' `$ ` lines): the line -> a part of its one line
REFUSED = {"python train.py model=llama_tiny data=pydoc_chars model.net.hidden_size=65536": "parameters need at least",
           "python3 train.py method=fedsmu dp=central dp.noise_multiplier=1": "LionMomentum(Sign) codec"}
# the reasons a documented line is not run here, by what it starts with or holds
SKIP = {
    "pip": "installs packages: the environment's job, not a test's",
    "pytest": "runs the test suite: this suite itself",
    "torchrun": "a launcher of processes on several nodes (tests/system/test_torchrun.py runs torchrun on CPU)",
    "srun": "a Slurm job (tests/unit/dist/test_slurm.py covers the requeue)",
    "python -c": "a Python one-liner (a download from the Hugging Face Hub; tests reach no network)",
    "template": "a template with placeholders (<name>, ..., N, [optional]): not a command as written",
    "gpu": "needs a CUDA GPU (composed and checked above; not run)",
    "searchpath": "needs the page's own files (my_conf/, mymodels.py) that a reader writes first",
    "download": "downloads from the Hub (tests reach no network); the line without download=true runs",
    "fednova": "runs in tests/system/test_extension_example.py (the same command, shrunk, and its resume)",
    "measurement": "a measurement, or every method re-run (minutes; docs/benchmarks.md); its --help is tested",
}


def parts(cmd: Command) -> list[Command]:
    """``a && b`` -> two commands at the same place."""
    return [Command(cmd.path, cmd.line, p.strip(), cmd.output, cmd.base) for p in cmd.text.split(" && ")]


COMMANDS = [p for c in all_commands() for p in parts(c)]


def kind(cmd: Command) -> tuple[str, str | None]:
    """(what the line is: train, report, keys, help-only, or skip; the skip reason)."""
    env, w = cmd.argv()
    prog = w[0]
    args = w[1:]
    if prog == "pip" or args[:2] == ["-m", "pip"]:
        return "skip", SKIP["pip"]
    if prog in ("torchrun", "srun"):
        return "skip", SKIP[prog]
    if "my_conf" in cmd.text:
        return "skip", SKIP["searchpath"]
    if PLACEHOLDER.search(cmd.text) and not is_report(w):
        return "skip", SKIP["template"]
    if args[:2] == ["-m", "pytest"]:
        return "skip", SKIP["pytest"]
    if args[:1] == ["-c"]:
        return "skip", SKIP["python -c"]
    if is_report(w):
        return "report", None
    if args[:1] == ["train.py"] or args[:2] == ["-m", "train.py"]:
        return "train", None
    if args[:2] == ["-m", "fl_lightning.config.keys"]:
        return "keys", None
    return "skip", SKIP["measurement"]


def is_report(words: list[str]) -> bool:
    return words[0] == "fl-report" or words[1:3] == ["-m", "fl_lightning.report"]


TRAIN_ALL = [c for c in COMMANDS if kind(c)[0] == "train"]
CONSOLE = [c for c in TRAIN_ALL if c.output or c.text in REFUSED]  # documented refusals
TRAIN = [c for c in TRAIN_ALL if c not in CONSOLE]
REPORT = [c for c in COMMANDS if kind(c)[0] == "report"]
KEYS = [c for c in COMMANDS if kind(c)[0] == "keys"]
SKIPPED = [c for c in COMMANDS if kind(c)[0] == "skip"]


def ids(cmds):
    return [f"{c.where}:{c.text[:60]}" for c in cmds]


def train_args(cmd: Command) -> tuple[bool, list[str]]:
    """(``-m``?, the overrides) of a ``python train.py ...`` line."""
    _, w = cmd.argv()
    args = w[w.index("train.py") + 1:]
    return "-m" in args, [a for a in args if a != "-m"]


def key_of(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


# ---------------------------------------------------------------------------------------------- composition
def _parser():
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create(config_loader=GlobalHydra.instance().config_loader())


def sweep_params(args: list[str]) -> list[str]:
    """The ``hydra.sweeper.params`` of the line's experiment as ``key=value`` overrides, read from its yaml and its
    parents' (the experiments in its defaults list, merged as Hydra merges them): a moment, where composing takes
    0.1 s a line. ``test_every_job_of_a_sweep_composes_and_checks`` compares it with Hydra's composed config."""
    from omegaconf import OmegaConf

    name = next((a.partition("=")[2] for a in args if key_of(a) == "experiment"), None)
    if not name:
        return []

    def node(n):
        path = os.path.join(CONF, "experiment", f"{n}.yaml")
        own = OmegaConf.load(path)
        parents = [d for d in (own.get("defaults") or []) if isinstance(d, str) and d != "_self_"]
        base = os.path.dirname(n)
        merged = OmegaConf.merge(*[node(os.path.join(base, p) if base else p) for p in parents],
                                 OmegaConf.create({"p": OmegaConf.select(own, "hydra.sweeper.params") or {}}))
        return merged

    params = node(name.split(",")[0]).p
    return [f"{k}={v}" for k, v in params.items()]


def jobs(multirun: bool, args: list[str], params: list[str] | None = None) -> list[list[str]]:
    """The jobs Hydra's basic sweeper launches for ``args`` (with the experiment's ``hydra.sweeper.params`` first, the
    command line's on top, product in key order; glob/range expanded); an interval (the Optuna sweeper) counts as
    its two ends. A single run: one job."""
    if not multirun:
        return [list(args)]
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=CONF, version_base="1.3"):  # glob(*) lists a group's configs
        parsed = _parser().parse_overrides((sweep_params(args) if params is None else params) + list(args))
    by_key: OrderedDict[str, list[str]] = OrderedDict()
    for ov in parsed:
        key = ov.get_key_element()
        if ov.is_discrete_sweep():
            by_key[key] = [f"{key}={v}" for v in ov.sweep_string_iterator()]
        elif ov.is_interval_sweep():
            iv = ov.value()
            by_key[key] = [f"{key}={iv.start}", f"{key}={iv.end}"]
        else:
            by_key[key] = [f"{key}={ov.get_value_element_as_str()}"]
    return [list(j) for j in itertools.product(*by_key.values())]


def composed_params(args: list[str]) -> list[str]:
    """What Hydra composes for ``hydra.sweeper.params`` (the line's first values)."""
    from hydra import compose, initialize_config_dir

    from fl_lightning.config.schema import register

    register()
    first = [a if "," not in a.partition("=")[2] or a.partition("=")[2].startswith("[") else
             f"{key_of(a)}={a.partition('=')[2].split(',')[0]}" for a in args]
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        cfg = compose(config_name="config", overrides=[a for a in first if "(" not in a], return_hydra_config=True)
    return [f"{k}={v}" for k, v in (cfg.hydra.sweeper.get("params") or {}).items()]


def checked_config(argv: list[str], run_dir):
    """What ``train.py argv`` checks before it builds anything: group names and schema values (``cli.prepare``),
    the composition (a key the config lacks) and ``check_run`` (every key, rule and target). Returns the composed
    config; a refusal fails the test with the one line ``train.py`` prints."""
    from fl_lightning.run import cli
    from fl_lightning.config import check_run
    from fl_lightning.errors import FLError
    from tests.helpers.cli import make_cfg

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            argv2 = cli.prepare(list(argv), CONF)
            try:
                cfg = make_cfg(argv2, run_dir)
            except Exception as bad:
                cli.fail(cli.composition_error(bad, argv2, CONF))
    except SystemExit:
        pytest.fail(f"{' '.join(argv)}: {err.getvalue().strip()}")
    try:
        check_run(cfg, [a for a in argv2 if not a.startswith("hydra")])
    except FLError as bad:
        pytest.fail(f"{' '.join(argv)}: error: {bad}")
    return cfg


def values_checked(cfg, overrides: list[str]) -> None:
    """Swept values applied to a composed job (as Hydra applies value overrides) and checked in full."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from omegaconf import open_dict

    from fl_lightning.config import check_run
    from fl_lightning.errors import FLError

    c = copy.deepcopy(cfg)
    try:
        with open_dict(c):
            ConfigLoaderImpl._apply_overrides_to_config(_parser_plain().parse_overrides(overrides), c)
        check_run(c, overrides)
    except FLError as bad:
        pytest.fail(f"{' '.join(overrides)}: error: {bad}")
    except Exception as bad:  # a key the config lacks
        pytest.fail(f"{' '.join(overrides)}: {type(bad).__name__}: {str(bad).splitlines()[0]}")


def diagonal(all_jobs: list[list[str]]) -> list[list[str]]:
    """The values the jobs give each plain (non-group) key, beyond the first job's, as few jobs of the sweep: the
    i-th of them sets each key to its i-th other value (a key with fewer values keeps the first job's)."""
    first = all_jobs[0]
    others: OrderedDict[str, list[str]] = OrderedDict()
    for job in all_jobs[1:]:
        for o in job:
            k = key_of(o)
            if k in GROUP_KEYS or "/" in k or k.startswith("hydra") or o in first:
                continue
            if o not in others.setdefault(k, []):
                others[k].append(o)
    n = max((len(v) for v in others.values()), default=0)
    return [[v[i] for v in others.values() if i < len(v)] for i in range(n)]


_PLAIN = []


def _parser_plain():
    from hydra.core.override_parser.overrides_parser import OverridesParser

    if not _PLAIN:
        _PLAIN.append(OverridesParser.create())
    return _PLAIN[0]


@pytest.fixture
def at_root(monkeypatch):
    """cwd at the repository root, as a user runs the commands (``file://examples/...`` is relative to it)."""
    monkeypatch.chdir(ROOT)


def with_env(cmd: Command, monkeypatch):
    env, _ = cmd.argv()
    if "PYTHONPATH" in env:
        monkeypatch.syspath_prepend(os.path.join(ROOT, env["PYTHONPATH"]))


def distinct(cmds: list[Command]) -> list[Command]:
    """One line per distinct command (the same overrides in another order, output folder or launcher, is one)."""
    seen, out = set(), []
    for c in cmds:
        multirun, args = train_args(c)
        key = (multirun, frozenset(c.argv()[0].items()), frozenset(a for a in args if key_of(a) not in OUTPUT_KEYS))
        if key not in seen:
            seen.add(key)
            out.append(c)
    return out


DISTINCT = distinct(TRAIN)


@pytest.mark.parametrize("cmd", DISTINCT, ids=ids(DISTINCT))
def test_train_line_composes_and_every_swept_value_checks(cmd, tmp_path, monkeypatch, at_root):
    """The line's first job composes and passes ``train.py``'s checks; every group name of every job exists; every
    value the sweep gives a plain key is applied to the first job and checked (:func:`diagonal`); each combination
    of group choices is composed by the slow test."""
    from fl_lightning.run import cli

    with_env(cmd, monkeypatch)
    multirun, args = train_args(cmd)
    all_jobs = jobs(multirun, args)
    assert all_jobs, cmd.text
    first = all_jobs[0]
    cfg = checked_config(first, tmp_path / "run")
    choices = sorted({o for j in all_jobs for o in j if key_of(o) in GROUP_KEYS or "/" in key_of(o)} - set(first))
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            cli.check_groups(choices, CONF)  # every job's group names (their compositions: the slow test)
    except SystemExit:
        pytest.fail(f"{cmd.where}: {err.getvalue().strip()}")
    for values in diagonal(all_jobs):
        values_checked(cfg, values)


@pytest.mark.parametrize("cmd", [pytest.param(c, marks=[pytest.mark.slow] if c.text in REFUSED else [])
                                 for c in CONSOLE], ids=ids(CONSOLE))
def test_a_documented_refusal_is_the_line_the_command_prints(cmd, tmp_path, at_root):
    """usage.md shows what a bad value prints: the command prints that line, exit 2 (reliability.md's refusal of a
    model too large for memory: its line, after the model is counted on the meta device)."""
    _, args = train_args(cmd)
    line = one_line_error(cli_in_process(args, tmp_path / "run"), REFUSED.get(cmd.text, ""))
    if cmd.output:
        assert [line] == cmd.output, (cmd.where, line)
    named = re.findall(r"(?<![\w.])(model\.[\w.]*\w)", line.partition("; fix: ")[2])
    if named:  # the fix's words name keys of this run's config (the model's own size keys, issue 65)
        from tests.helpers.cli import make_cfg
        from omegaconf import OmegaConf

        cfg = make_cfg(args)
        assert all(OmegaConf.select(cfg, k, default=None) is not None for k in named), (cmd.where, named, line)


@pytest.mark.parametrize("cmd", CONSOLE, ids=ids(CONSOLE))
def test_a_documented_refusals_fix_works_when_followed(cmd, at_root):
    """Issue 65: a fix that fails when followed is a defect, like a traceback. The fix of each documented refusal
    that ``train.py`` gives before building anything, where it names a concrete change (``set fl.clients_per_round=16``,
    ``e.g. method.alpha=0.5``), is applied to the documented command line; the line then gets past that check. (The
    memory refusal comes after the model is counted: its fix names the model's own size keys, checked where it is
    run, above.)"""
    from tests.helpers.fixes import fix_defects, follow, verdict

    _, args = train_args(cmd)
    line = verdict(args)
    if line is None:
        assert cmd.text in REFUSED, f"{cmd.where}: refused only when built, and not in REFUSED"
        pytest.skip("refused after the check (when the model is counted): followed in the refusal's test")
    assert follow(args, line), f"{cmd.where}: the fix names no concrete change: {line}"
    bad = fix_defects(args, line)
    assert not bad, "\n".join(bad)


def test_the_docs_name_no_old_module_path():
    """``fl_lightning.keys`` moved to ``fl_lightning.config.keys``: no page names the old path."""
    bad = []
    for page in doc_pages():
        with open(os.path.join(ROOT, page)) as f:
            for n, line in enumerate(f, 1):
                if re.search(r"fl_lightning[./]keys\b", line):
                    bad.append(f"{page}:{n}")
    assert not bad, bad


def test_the_collector_finds_the_documented_commands():
    """The collector reads fenced, indented and inline commands: the counts issue 59 names, and a line of each
    form, are found (a collector that finds nothing would make every test above pass)."""
    train = [c for c in all_commands() if "train.py" in c.text]
    assert len(train) >= 150, len(train)
    assert sum("-m" in c.argv()[1] for c in train) >= 90
    where = {c.where for c in COMMANDS}
    assert {"docs/results/first_order.md:5", "docs/results/first_order.md:6"} <= where  # indented
    assert any(c.path == "README.md" and "data.fake=true" in c.text for c in COMMANDS)  # fenced
    assert any(c.path == "docs/reproduction.md" and "experiment=fedpac_cifar100 " in c.text for c in COMMANDS)  # inline
    assert any(c.output and c.path == "docs/usage.md" for c in COMMANDS)  # a console block's output
    assert len(REPORT) >= 17 and len(DISTINCT) < len(TRAIN)
    # overrides written relative to an experiment (issue 65): the text's one-client line, composed with it
    local = [c for c in DISTINCT if c.path == "docs/text.md" and "fl.num_clients=1" in c.text]
    assert local and local[0].base == "experiment=glue_lora data=pydoc_topics", local
    assert train_args(local[0])[1][:2] == ["experiment=glue_lora", "data=pydoc_topics"]
    assert "data/partition=iid" in train_args(local[0])[1] and "fl.rounds=10" in train_args(local[0])[1]


# ---------------------------------------------------------------------------------------------- slow: every job
SWEEPS = [c for c in DISTINCT if train_args(c)[0]]


@pytest.mark.slow
@pytest.mark.parametrize("cmd", SWEEPS, ids=ids(SWEEPS))
def test_every_job_of_a_sweep_composes_and_checks(cmd, tmp_path, monkeypatch, at_root):
    """Each job's combination of group choices (method, arm, model, data, partition, ...) composed and checked as
    ``train.py`` does; its swept values are the fast test's (each on its own)."""
    with_env(cmd, monkeypatch)
    multirun, args = train_args(cmd)
    assert sweep_params(args) == composed_params(args), "the yaml reader of the sweep's params is not Hydra's"
    seen = set()
    for job in jobs(multirun, args):
        groups = tuple(o for o in job if key_of(o) in GROUP_KEYS or "/" in key_of(o))
        if groups not in seen:
            seen.add(groups)
            checked_config(job, tmp_path / "run")


# ---------------------------------------------------------------------------------------------- slow: runs
def shrink_setting():
    """test_experiments_shrunk's shrink: SMALL, the models' tiny widths, the data files' overrides."""
    from tests.system import test_experiments_shrunk as shrunk

    return shrunk


def run_plan() -> tuple[list[Command], dict[str, str]]:
    """(the lines run; the lines not run -> why): one run per distinct experiment (read from the line's words, not
    composed: this runs at collection)."""
    plan, why, seen = [], {}, {}
    for cmd in TRAIN:
        multirun, args = train_args(cmd)
        if cmd.base:
            why[cmd.where] = f"overrides written relative to {cmd.base}: composed and checked in the fast tier"
            continue
        if any(key_of(a) == "trainer.accelerator" and a.endswith("=gpu") for a in args):
            why[cmd.where] = SKIP["gpu"]
            continue
        if "download=true" in args:
            why[cmd.where] = SKIP["download"]
            continue
        if any(key_of(a) == "hydra.searchpath" for a in args):
            why[cmd.where] = SKIP["fednova"]
            continue
        key = frozenset(a for a in args if key_of(a) not in OUTPUT_KEYS and key_of(a) not in SHRUNK_KEYS)
        if len(key) == 1 and next(iter(key)).startswith("experiment=") and not multirun:
            why[cmd.where] = "runs shrunk in tests/system/test_experiments_shrunk.py (every experiment= config)"
            continue
        if (multirun, key) in seen:
            why[cmd.where] = f"the same experiment as {seen[(multirun, key)]}"
            continue
        seen[(multirun, key)] = cmd.where
        plan.append(cmd)
    return plan, why


def first_job(cmd: Command) -> list[str]:
    """The overrides of the line's first job, without where and how it runs."""
    return [a for a in jobs(*train_args(cmd))[0] if key_of(a) not in OUTPUT_KEYS]


LLAMA = ["model.net.layers=1", "model.net.hidden_size=16", "model.net.heads=2", "model.net.intermediate_size=32"]
MODELS = {"llama_tiny": LLAMA, "llama_130m": LLAMA, "llama_350m": LLAMA}  # beside test_experiments_shrunk's MODELS


def data_shrink(data: str, files: dict) -> list[str]:
    """Data sets the experiments of test_experiments_shrunk do not use: their own small settings."""
    if data == "pydoc_chars":  # its natural partition decides the number of clients
        return ["fl.num_clients=auto", "data.test_windows=20"]
    if data == "pydoc_topics":  # a tiny backbone pre-trained for two steps, its cache under tmp_path
        return ["data.pretrain.steps=2", "data.backbone.hidden_size=16", "data.backbone.layers=1",
                "data.backbone.heads=2", "data.backbone.intermediate_size=32", "data.vocab_size=300",
                f"data.cache_dir={files['cache']}"]
    return []


# what the shrink sets (the line's value is replaced): size, rounds, threads, progress
SHRUNK_KEYS = ("fl.rounds", "fl.num_clients", "fl.clients_per_round", "fl.local_steps", "fl.local_epochs",
               "fl.eval_every", "trainer.progress", "trainer.accelerator", "trainer.threads", "data.batch_size", "seed")


PLAN = run_plan()[0]


ABSENT_SEEN: set[str] = set()  # the data sets whose as-written line this process ran
RUN_SEEN: dict[tuple, str] = {}  # (a method's parts, a model or data set) this process ran -> the line


def wiring(cfg, own: list[str]) -> tuple:
    """What a shrunk run can break, as a key: the method (its label and class of each part), model, data and
    partition, and the keys the line itself sets (not their values: the fast test checks every value)."""
    from omegaconf import OmegaConf

    parts = OmegaConf.select(cfg, "method.parts", default=None) or {}
    targets = tuple(sorted((str(k), str(v.get("_target_")) if OmegaConf.is_dict(v) else str(v))
                           for k, v in parts.items()))
    return (str(cfg.method.name), targets, str(cfg.model.name), str(cfg.data.name),
            str(OmegaConf.select(cfg, "data.partition.name", default=None)), bool(cfg.data.get("fake")),
            frozenset(key_of(a) for a in own if key_of(a) != "experiment"))


@pytest.mark.slow
@pytest.mark.parametrize("cmd", PLAN, ids=ids(PLAN))
def test_each_distinct_experiment_runs_shrunk(cmd, files, tmp_path, monkeypatch, at_root):
    """The line's first job, shrunk (one round, tiny widths, tiny files in the real formats), ends its run. Not run,
    saying why: a line whose :func:`wiring` is its experiment's as it is (test_experiments_shrunk runs it), or whose
    method's parts ran with its model and with its data already in this process (pairwise coverage). First, the
    first line of each real data set (per process) runs as written: its data absent here, it ends in one line
    naming what is missing, exit 2 (not where the data is present: it would train for hours)."""
    from fl_lightning.run.run_dir import merge_overrides
    from tests.helpers.cli import make_cfg

    job = first_job(cmd)
    shrunk = shrink_setting()
    cfg = make_cfg(job, tmp_path / "probe")
    data, model = str(cfg.data.name), str(cfg.model.name)
    root = os.path.join(ROOT, str(cfg.data.get("root")))
    if data in REAL_DATA and not cfg.data.get("fake") and data not in ABSENT_SEEN and not (
            os.path.isdir(root) and os.listdir(root)):  # as written, the data absent here: one line, exit 2
        ABSENT_SEEN.add(data)
        one_line_error(cli_in_process(job, tmp_path / "as_written"))
    sig = wiring(cfg, [a for a in train_args(cmd)[1] if key_of(a) not in OUTPUT_KEYS + SHRUNK_KEYS])
    experiment = [a for a in job if key_of(a) == "experiment"]
    if experiment and sig == wiring(make_cfg(experiment, tmp_path / "probe"), experiment):
        pytest.skip("its wiring runs in test_experiments_shrunk (the experiment as it is)")
    pairs = {(sig[1], sig[2], sig[6]), (sig[1], sig[3:6], sig[6])}  # the method's parts with the model; with the data
    if pairs <= set(RUN_SEEN):
        pytest.skip(f"its method's parts ran with its model ({RUN_SEEN[(sig[1], sig[2], sig[6])]}) and with its data "
                    f"({RUN_SEEN[(sig[1], sig[3:6], sig[6])]}) in this process")
    for pair in pairs:
        RUN_SEEN.setdefault(pair, cmd.where)
    small = [o for o in shrunk.SMALL if not (o.startswith("fl.local_") and cfg.fl.get("local_epochs"))]
    small = merge_overrides(small, ["fl.rounds=1"])
    over = merge_overrides(job, [*small, *shrunk.data_overrides(data, files, cfg), *data_shrink(data, files),
                                 *shrunk.MODELS.get(model, MODELS.get(model, []))])
    run = tmp_path / "run"
    code, err = cli_in_process(over, run)
    assert code == 0, f"{cmd.where} {cmd.text}\n{err[-3000:]}"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["rounds_done"] == 1 and summary["finished"], summary


def test_the_run_plan_skips_only_with_a_reason():
    plan, why = run_plan()
    assert len(plan) + len(why) == len(TRAIN) and len(TRAIN) + len(CONSOLE) == len(TRAIN_ALL)
    assert all(why.values())


# ---------------------------------------------------------------------------------------------- slow: subprocesses
def named_programs() -> list[list[str]]:
    """Every ``python -m X`` and ``python tools/X.py`` the docs name (pip and pytest aside), and
    ``python -m tests.helpers.golden``."""
    found = set()
    for page in doc_pages():
        with open(os.path.join(ROOT, page)) as f:
            text = f.read()
        found |= {("-m", m) for m in re.findall(r"python3? -m ([\w.]+)", text) if m not in ("pip", "pytest")}
        found |= {(t,) for t in re.findall(r"python3? (tools/\w+\.py)", text)}
    found.add(("-m", "tests.helpers.golden"))
    return [list(p) for p in sorted(found)]


PROGRAMS = named_programs()


def run_here(argv: list[str], env: dict | None = None, timeout: int = 120) -> subprocess.CompletedProcess:
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=e)


@pytest.mark.slow
@pytest.mark.parametrize("program", PROGRAMS, ids=[" ".join(p) for p in PROGRAMS])
def test_every_named_program_answers_help(program):
    """``--help``: its usage on stdout (argparse's ``usage:`` line, or a text naming how it is called), exit 0, in
    a moment (nothing measured or written)."""
    p = run_here([sys.executable, *program, "--help"], timeout=60)
    assert p.returncode == 0, (program, p.stdout[-1000:], p.stderr[-2000:])
    assert "Traceback" not in p.stderr, p.stderr
    name = re.escape(os.path.basename(program[-1]))
    assert re.search(rf"usage|{name} (\[|--?\w|[A-Z]{{2,}})", p.stdout, re.I), (program, p.stdout[-1000:])


@pytest.mark.slow
@pytest.mark.parametrize("cmd", KEYS, ids=ids(KEYS))
def test_keys_lines_print_their_keys(cmd):
    _, w = cmd.argv()
    p = run_here([sys.executable, *w[1:]])
    assert p.returncode == 0, p.stderr
    asked = w[-1].split("=")[0]
    assert asked in p.stdout and len(p.stdout.splitlines()) > 3, p.stdout[-1000:]


def report_sweep(root, experiment: str | None):
    """A tiny sweep: two seeds of two jobs whose config.yaml is the composed config of the experiment's first jobs
    (its labels, keys and paper block), a metrics.csv with every column a declared report reads, and the sweep's
    ``multirun.yaml`` (what ``--declared`` reads: the experiment's ``hydra.callbacks``)."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf, open_dict

    from fl_lightning.config.schema import register

    register()
    root.mkdir(parents=True)
    args = [f"experiment={experiment}"] if experiment else ["method=fedavg,fedavgm", "data.val_fraction=0.1"]
    picked = jobs(True, args)
    firsts = [picked[0]] + [j for j in picked if j[0] != picked[0][0]][:1]  # the first job, one of another row
    firsts = firsts if len(firsts) == 2 else picked[:2]
    callbacks = None
    for i, job in enumerate(firsts):
        with initialize_config_dir(config_dir=CONF, version_base="1.3"):
            cfg = compose(config_name="config", overrides=job, return_hydra_config=True)
        if callbacks is None and cfg.hydra.get("callbacks"):
            callbacks = OmegaConf.to_container(cfg.hydra.callbacks)
        with open_dict(cfg):
            del cfg["hydra"]
        for seed in (0, 1):
            run = root / f"job{i}_{seed}"
            run.mkdir()
            with open_dict(cfg):
                cfg.seed, cfg.run_dir = seed, str(run)
            OmegaConf.save(cfg, run / "config.yaml", resolve=True)
            cols = ["round", "test_acc", "val_acc", "train_loss", "test_loss", "test_ppl", "grad_norm", "precond_drift",
                    "mu_frac", "uplink_mb", "downlink_mb", "wall_s"]
            rows = [[r, 0.5 + 0.1 * r + 0.01 * seed + 0.02 * i, 0.5 + 0.1 * r, 1.0 / r, 1.0 / r, 3.0, 1.0 / r, 0.1, 0.2,
                     r, 2 * r, r] for r in (1, 2)]
            lines = [",".join(cols)] + [",".join(map(str, x)) for x in rows]
            (run / "metrics.csv").write_text("\n".join(lines) + "\n")
            primary = ("grad_norm", "min") if str(cfg.data.name) == "matrix_quadratic" else ("test_acc", "max")
            (run / "summary.json").write_text(json.dumps({"primary_metric": primary[0], "primary_mode": primary[1],
                                                          "finished": True, "rounds_done": 2}))
    if experiment:
        OmegaConf.save(OmegaConf.create({"hydra": {"callbacks": callbacks,
                                                   "overrides": {"hydra": [], "task": [f"experiment={experiment}"]}}}),
                       root / "multirun.yaml")
    return root


def report_argv(cmd: Command, sweep, out) -> list[str]:
    """The documented report line with its sweep folder replaced by ``sweep`` and its outputs sent to ``out``; a
    template's target X is 0.5."""
    _, w = cmd.argv()
    if w[0] == "fl-report":
        head, rest = [os.path.join(os.path.dirname(sys.executable), "fl-report")], w[1:]
    else:
        head, rest = [sys.executable, "-m", "fl_lightning.report"], w[3:]
    out_args, skip = [], False
    for i, a in enumerate(rest):
        if skip:
            skip = False
            continue
        if a == "--out":
            out_args += ["--out", str(out)]
            skip = True
        elif a == "--target" and rest[i + 1] == "X":
            out_args += ["--target", "0.5"]
            skip = True
        elif not a.startswith("-") and (i == 0 or not rest[i - 1].startswith("--")):
            out_args.append(str(sweep))
        else:
            out_args.append(a)
    if "--declared" not in out_args and "--out" not in out_args:
        out_args += ["--out", str(out)]
    return head + out_args


def declared_experiment(cmd: Command) -> str | None:
    """``sweeps/first_order --declared`` -> the experiment whose sweep folder that is."""
    _, w = cmd.argv()
    if "--declared" not in w:
        return None
    name = [a for a in w if a.startswith("sweeps/")]
    if not name:
        return "results/first_order"  # a template (SWEEP): any declared page
    stem = name[0].split("/", 1)[1]
    return f"results/{stem}" if os.path.exists(os.path.join(CONF, "experiment", "results", stem + ".yaml")) else stem


def report_form(cmd: Command) -> tuple:
    """A report line without its sweep folder: the lines of the results pages share one form."""
    _, w = cmd.argv()
    return tuple(a for a in w if a.startswith("-") or a in ("fl-report", "fl_lightning.report"))


# the --declared lines of one form run as one command over their sweeps (the CLI takes several folders): one
# python start instead of fourteen
DECLARED = [c for c in REPORT if "--declared" in c.argv()[1] and c.argv()[1][0] != "fl-report"]
SINGLE = [c for c in REPORT if c not in DECLARED]


@pytest.mark.slow
def test_the_results_pages_report_lines_write_their_pages(tmp_path):
    """Line 6 of every results page (``python -m fl_lightning.report sweeps/NAME --declared``), as one command over
    a tiny sweep of each page's experiment: each page is written into its sweep's folder."""
    assert {report_form(c) for c in DECLARED} == {("-m", "fl_lightning.report", "--declared")}
    sweeps, pages = [], []
    for i, cmd in enumerate(DECLARED):
        experiment = declared_experiment(cmd)
        sweeps.append(report_sweep(tmp_path / f"s{i}", experiment))
        pages.append(sweeps[-1] / f"{_callback_name(sweeps[-1])}.md")
    p = run_here([sys.executable, "-m", "fl_lightning.report", *map(str, sweeps), "--declared"])
    assert p.returncode == 0, (p.stdout[-2000:], p.stderr[-2000:])
    missing = [f"{c.where} ({f})" for c, f in zip(DECLARED, pages) if not (f.exists() and f.stat().st_size > 0)]
    assert not missing, (missing, p.stdout[-2000:])


def _callback_name(sweep) -> str:
    from omegaconf import OmegaConf

    return str(OmegaConf.load(sweep / "multirun.yaml").hydra.callbacks.report.name)


@pytest.mark.slow
@pytest.mark.parametrize("cmd", SINGLE, ids=ids(SINGLE))
def test_every_report_line_writes_its_files(cmd, tmp_path):
    """As a user types it, from the repository root, on a tiny sweep: the report's page and table are written."""
    experiment = declared_experiment(cmd)
    sweep = report_sweep(tmp_path / "sweep", experiment)
    out = tmp_path / "out"
    argv = report_argv(cmd, sweep, out)
    p = run_here(argv)
    assert p.returncode == 0, (argv, p.stdout[-2000:], p.stderr[-2000:])
    if experiment:
        written = [sweep / f"{_callback_name(sweep)}.md"]
    else:
        written = [out / "report.md", out / "report.csv"]
    for f in written:
        there = f.parent.exists() and sorted(os.listdir(f.parent))
        assert f.exists() and f.stat().st_size > 0, (argv, p.stdout[-2000:], there)


@pytest.mark.parametrize("cmd", SKIPPED, ids=ids(SKIPPED))
def test_lines_not_run_here(cmd):
    """Each line this suite does not run, with the reason (shown by ``-ra``)."""
    pytest.skip(kind(cmd)[1])
