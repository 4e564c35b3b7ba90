"""The command line's words before Hydra composes them (``train.py``'s first checks, torch-free): group names,
unknown options (``--rounds 3``: say ``fl.rounds=3``), and a composition's failure as one line naming the key and a
fix; :func:`fail` prints such a line and exits 2."""
from __future__ import annotations

import logging
import os
import re
import shlex
import sys

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError

from ..config import CONFIG_GROUPS, OPTIONAL_GROUPS, check_overrides, check_resume, closest_key
from ..dist import peers
from ..errors import FLError
from .run_dir import OVERRIDES_FILE, merge_overrides, override_key

log = logging.getLogger("fl_lightning")
GROUPS = (*CONFIG_GROUPS, "data/partition")  # what a command line may choose (``experiment=null`` keeps none)


def fail(msg: str, code: int = 2) -> None:
    peers.ENDING.set()  # a rank launched by this process ending the same way is not reported as lost
    _to_log_file(f"error: {msg}")
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(code)


def _to_log_file(line: str) -> None:
    """The line into the run's ``train.log`` too (Hydra's file handler, where the run folder exists already): a run
    refused after Hydra made its folder leaves the reason there, not an empty log. Not on the terminal twice."""
    for h in logging.getLogger().handlers:
        if isinstance(h, logging.FileHandler) and getattr(h, "stream", None) is not None:
            try:
                h.stream.write(line + "\n")
                h.flush()
            except (OSError, ValueError):  # a full disk or a closed file: the terminal line still says it
                pass


def _search_dirs(argv: list[str], conf_dir: str) -> list[str]:
    """conf/ plus the ``file://`` folders of a ``hydra.searchpath=[...]`` override (a user's own configs)."""
    dirs = [conf_dir]
    for arg in argv:
        key, sep, val = arg.lstrip("+").partition("=")
        if sep and key == "hydra.searchpath":
            for item in val.strip("[]").split(","):
                item = item.strip().strip("'\"")
                if item.startswith("file://"):
                    dirs.append(item[len("file://"):])
    return dirs


def check_groups(argv: list[str], conf_dir: str) -> None:
    """``method=foo`` with no method/foo.yaml in conf/ (or a ``hydra.searchpath`` folder): one line listing the valid
    names (before Hydra's longer report)."""
    dirs = _search_dirs(argv, conf_dir)
    for arg in argv:
        key, sep, val = arg.lstrip("+~").partition("=")
        if not sep or key not in GROUPS or val == "" or val.startswith(("glob(", "range(", "choice(", "[")):
            continue
        for one in val.split(","):  # a sweep's list (-m method=fedavg,fedavgm): each name
            _check_group(key, one.strip(), dirs)


def _check_group(key: str, val: str, dirs: list[str]) -> None:
    """One group name: known, or one line with the closest name and the valid ones."""
    if val == "null" and key not in OPTIONAL_GROUPS:
        fail(f"config error: {key}: null is not a {key} config; fix: name one, e.g. {key}=<name> (files in "
             f"conf/{key}/)")
    if val == "null":
        return  # none: the default of an optional group (prepare drops the override)
    names = sorted({os.path.relpath(os.path.join(root, f), os.path.join(d, key))[:-5].replace(os.sep, "/")
                    for d in dirs for root, _, files in os.walk(os.path.join(d, key))
                    for f in files if f.endswith(".yaml")})
    names = [n for n in names if not any(f"{key}/{n}".startswith(g + "/") for g in GROUPS
                                         if g.startswith(key + "/"))]  # data/partition's members are not data's
    if val not in names:
        import difflib

        near = difflib.get_close_matches(val, names, n=1, cutoff=0.6)
        hint = f"did you mean {key}={near[0]}? " if near else ""
        fail(f"unknown {key} {val!r}; fix: {hint}valid: {', '.join(names)} (files in conf/{key}/; {key} configs "
             f"kept elsewhere are found with hydra.searchpath=[file://DIR] where DIR holds {key}/{val}.yaml)")


# ``--name`` options a user may type for a key whose last part is another word (used only where the key exists)
OPTION_KEYS = {"epochs": "fl.local_epochs", "local_epochs": "fl.local_epochs", "steps": "fl.local_steps",
               "clients": "fl.num_clients", "lr": "method.lr", "learning_rate": "method.lr", "bs": "data.batch_size",
               "device": "trainer.accelerator", "accelerator": "trainer.accelerator", "gpus": "trainer.devices",
               "out": "hydra.run.dir", "output": "hydra.run.dir", "output_dir": "hydra.run.dir",
               "outdir": "hydra.run.dir", "run_dir": "hydra.run.dir"}
_NOT_SET = ("run_dir", "tables", "paper")  # schema keys a command line does not set (run_dir: hydra.run.dir)


def check_options(argv: list[str], conf_dir: str) -> None:
    """``--rounds 3`` (an option Hydra's command line does not have, which argparse would answer with its usage):
    one line saying that keys are set as ``key=value``, with the key whose last part is the option's name
    (``fl.rounds=3``), exit 2."""
    from hydra._internal.utils import get_args_parser

    known = [o for o in get_args_parser()._option_string_actions]
    for i, arg in enumerate(argv):
        name, eq, val = arg.partition("=")
        if not name.startswith("-") or name in ("-", "--") or name in known:
            continue
        if name.startswith("--") and any(o.startswith(name) for o in known if o.startswith("--")):
            continue  # a prefix of Hydra's long options: argparse's (--multi: --multirun; --config: ambiguous)
        if not eq and i + 1 < len(argv) and not argv[i + 1].startswith("-") and "=" not in argv[i + 1]:
            val = argv[i + 1]
        key = option_key(name.lstrip("-").replace("-", "_").lower(), argv, conf_dir)
        if key:
            fail(f"unknown option {name}; keys are set as key=value: {key}={shlex.quote(val) if val else '...'}")
        fail(f"unknown option {name}; keys are set as key=value, e.g. fl.rounds=3 (the keys: python3 -m "
             "fl_lightning.config.keys)")


def option_key(word: str, argv: list[str], conf_dir: str) -> str | None:
    """The config key an option ``--word`` meant: a schema key whose last part is ``word`` (``rounds`` ->
    ``fl.rounds``, ``seed`` -> ``seed``), else :data:`OPTION_KEYS`' key for it, else a key of the config composed
    with the command line's group choices whose last part is ``word`` (``width`` -> ``model.net.width``); None if
    there is none."""
    from ..config import all_keys

    schema = [k for k in all_keys() if k not in _NOT_SET]
    same = [k for k in schema if k.rsplit(".", 1)[-1] == word]
    if same:
        return min(same, key=lambda k: (len(k), k))
    alias = OPTION_KEYS.get(word)
    if alias and (alias in schema or alias.startswith("hydra.") or alias in GROUPS):
        return alias
    try:  # the keys of the config the command line's groups compose (a method's lr, a model's width)
        rest = [a for a in argv if not a.startswith("-") and "=" in a and override_key(a) in GROUPS]
        with initialize_config_dir(config_dir=conf_dir, version_base="1.3"):
            composed = compose(config_name="config", overrides=rest)
        keys = set(_flat_keys(OmegaConf.to_container(composed, resolve=False)))
    except Exception:  # noqa: BLE001 - a command line that does not compose: no key to name
        return None
    if alias in keys:
        return alias
    same = [k for k in keys if k.rsplit(".", 1)[-1] == word and not k.startswith(_NOT_SET)]
    return min(same, key=lambda k: (k.count("."), len(k), k)) if same else None


def _flat_keys(node, prefix: str = "") -> list[str]:
    if not isinstance(node, dict):
        return []
    out = []
    for k, v in node.items():
        name = f"{prefix}{k}"
        out.append(name)
        out.extend(_flat_keys(v, name + "."))
    return out


def prepare(argv: list[str], conf_dir: str) -> list[str]:
    """What ``train.py`` does before Hydra composes: an option Hydra does not have (``--rounds 3``), group names and
    the schema's keys checked (torch-free, one line each), and for ``resume=DIR`` the run's saved overrides put under
    the new ones, so that Hydra composes the resumed run's config once (a key only the resumed run has, e.g.
    ``model.net.pretrained_path``, is accepted). Returns the overrides to compose."""
    check_options(argv, conf_dir)
    check_groups(argv, conf_dir)
    argv = [a for a in argv if a.lstrip("+") not in (f"{g}=null" for g in OPTIONAL_GROUPS)]  # already none
    try:
        check_overrides(argv)
    except FLError as err:
        if user_full_error():
            raise
        fail(str(err))
    except Exception as err:  # an override Hydra's parser refuses: Hydra reports it (one line, below)
        log.debug("override parse: %s", err)
    for arg in argv:
        key, sep, val = arg.lstrip("+").partition("=")
        if sep and key == "resume" and val not in ("", "null", "auto"):  # auto: this command is the run's own
            try:
                check_resume(val)
            except FLError as err:
                fail(str(err))
            saved = os.path.join(val, OVERRIDES_FILE)
            if os.path.exists(saved):
                return merge_overrides([str(o) for o in OmegaConf.load(saved)], argv)
    return list(argv)


def composition_error(err: BaseException, argv: list[str], conf_dir: str) -> str:
    """Hydra's report of a config that does not compose, as one line: ``X=v`` for a key the config does not have
    names the closest key (the config is composed once more, without that override, only on this error path)."""
    text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    m = re.search(r"Could not override '([^']+)'", str(err))
    missing = err.__cause__ if isinstance(err.__cause__, (ConfigAttributeError, ConfigKeyError)) else None
    if missing is not None and missing.full_key:  # OmegaConf names the key the config does not have
        name = str(missing.full_key)
        near, takes = None, None
        try:
            rest = [a for a in argv if override_key(a) != name and not a.startswith("hydra.")]
            with initialize_config_dir(config_dir=conf_dir, version_base="1.3"):
                composed = compose(config_name="config", overrides=rest)
            near = closest_key(composed, name)
            takes = _target_takes(composed, name)
        except Exception:
            near = None
        if near:  # the closest key first; the + hint only where no key is close
            return f"config error: {name}: no such key; fix: did you mean {near}?"
        if takes is not None:  # the node is built by a target that has no such argument: a + would not help
            target, params = takes
            return (f"config error: {name}: no such key, and {target} takes no {name.rpartition('.')[2]}; fix: remove "
                    f"it (it takes: {', '.join(params)})")
        return f"config error: {name}: no such key; fix: a new argument of a part or model needs a leading +, " \
               f"e.g. +{name}=..."
    if m and "No match in the defaults list" in str(err):  # server_opt=adam with a method that has no server optimizer
        name = m.group(1)
        val = next((a.partition("=")[2] for a in argv if override_key(a) == name), "<name>")
        fix = (f"choose a method with a server optimizer, e.g. method=fedadam server_opt={val}" if name == "server_opt"
               else f"add it with +{name}={val}")
        return f"config error: {name}: this config has no {name} to override; fix: {fix}"
    m = re.search(r"Could not append to config. An item is already at '([^']+)'", str(err))
    if m:  # +key=value for a key the config already has: set it without the +
        name = m.group(1)
        word = next((a for a in argv if a.startswith("+") and override_key(a) == name), f"+{name}=<value>")
        return (f"config error: {name}: is in the config already, so {word} cannot add it; fix: set it without the "
                f"+: {word.lstrip('+')}")
    cause = err.__cause__
    if cause is not None and str(cause).strip():
        text += f" ({str(cause).strip().splitlines()[0]})"
    return f"config error: {text}"


def _target_takes(cfg, name: str) -> tuple[str, list[str]] | None:
    """(target, its arguments) when ``name``'s parent node is built by a ``_target_`` whose signature has no such
    argument (and no ``**kwargs``); None when it has one, or the node has no target (then ``+name=`` may be right)."""
    from ..config import target_info

    parent, _, leaf = name.rpartition(".")
    node = OmegaConf.select(cfg, parent, default=None) if parent else None
    target = node.get("_target_") if OmegaConf.is_dict(node) else None
    info = target_info(target) if isinstance(target, str) else None
    if info is None or info[1] is None:
        return None
    sig = info[1]
    if leaf in sig.parameters or any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values()):
        return None
    return target, [p for p in sig.parameters if p not in ("self", "args", "kwargs")]


def user_full_error() -> bool:
    """Did the user ask for tracebacks (``HYDRA_FULL_ERROR=1``)? train.py sets Hydra's variable itself so that
    composition errors reach it, and keeps the user's choice in ``FL_HYDRA_FULL_ERROR`` (inherited by the processes
    a launcher starts)."""
    return os.environ.get("FL_HYDRA_FULL_ERROR", os.environ.get("HYDRA_FULL_ERROR", "")) == "1"
