"""A refusal's ``fix:`` followed as a user would (issue 65): a fix that names a concrete change (``remove it``, ``did
you mean X?``, ``set X=Y``, ``e.g. X=Y``, ``choose the partition with data/partition=iid``) is applied to the refused
command line, mechanically, and the line is checked again as ``train.py`` checks it before anything is built
(:func:`verdict`: ``cli.prepare``, the Hydra composition, ``check_run``; :func:`built_verdict` also builds the run,
for a refusal of the build). A fix that cannot be followed this way (``set it to a valid value``, a file to write)
is reported as such (:func:`follow` returns nothing) and must be right in words.

Used by tests/system/test_fix_lines.py, test_key_probe.py, test_group_probe.py and test_docs_commands.py."""
from __future__ import annotations

import contextlib
import copy
import functools
import io
import re

from tests.helpers.cli import CONF, make_cfg

_TOKEN_START = re.compile(r"(?<![\w.\[/=<+~-])[+~]?[A-Za-z_][\w./@-]*=")
_PLACEHOLDER = re.compile(r"<[^>]*>|\.\.\.|DIR|\bN\b|\bX\b|package\.module")


def key_of(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def parts(line: str) -> tuple[str, str, str]:
    """(key, problem, fix) of ``error: config error: KEY: PROBLEM; fix: FIX`` (another ``error: WHAT; fix: FIX`` line:
    key ``""``, problem WHAT); the key is the one the user typed (``X (via Y)``: X)."""
    body = line.removeprefix("error: ")
    head, _, fix = body.partition("; fix: ")
    if head.startswith("config error: "):
        key, _, problem = head.removeprefix("config error: ").partition(": ")
        return key.split(" (via ")[0], problem, fix
    return "", head, fix


def same_refusal(a: str, b: str | None) -> bool:
    """Is ``b`` still the refusal ``a`` (the same key refused; for a line that names no key, the same words)?"""
    if b is None:
        return False
    ka, pa, _ = parts(a)
    kb, pb, _ = parts(b)
    return ka == kb if ka else pa == pb


def _is_group(override: str) -> bool:
    from fl_lightning.run.cli import GROUPS

    return key_of(override) in GROUPS or "/" in key_of(override)


@functools.lru_cache(maxsize=64)
def _composed(groups: tuple[str, ...]):
    return make_cfg(list(groups), "/nonexistent/run")


def compose(argv: list[str]):
    """``make_cfg(argv)``, faster where it matters: the group choices composed once per set (cached), the values
    applied on a copy as Hydra applies them after composing (``ConfigLoaderImpl._apply_overrides_to_config``)."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.core.override_parser.overrides_parser import OverridesParser

    groups = tuple(a for a in argv if _is_group(a))
    values = [a for a in argv if not _is_group(a)]
    cfg = copy.deepcopy(_composed(groups))
    ConfigLoaderImpl._apply_overrides_to_config(OverridesParser.create().parse_overrides(values), cfg)
    return cfg


def verdict(argv: list[str]) -> str | None:
    """What ``python train.py *argv`` says before it builds anything: None (it would run), or its one ``error:``
    line (a group name or schema value refused before Hydra, a config that does not compose, or ``check_run``'s
    refusal). A sweep (``-m``, ``a=1,2``) is judged on its first job."""
    from fl_lightning.run import cli
    from fl_lightning.config import check_run
    from fl_lightning.errors import FLError

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            argv2 = cli.prepare(list(argv), CONF)
            argv2 = [a if "," not in a.partition("=")[2] or a.partition("=")[2][:1] in "[{" else
                     f"{a.partition('=')[0]}={a.partition('=')[2].split(',')[0]}" for a in argv2 if a != "-m"]
            try:
                cfg = compose(argv2)
            except Exception as bad:  # noqa: BLE001 - what cli.main prints for a config that does not compose
                cli.fail(cli.composition_error(bad, argv2, CONF))
    except SystemExit:
        return err.getvalue().strip().splitlines()[-1]
    try:
        check_run(cfg, [a for a in argv2 if not a.startswith("hydra")])
    except FLError as bad:
        return f"error: {bad}"
    return None


def built_verdict(argv: list[str]) -> str | None:
    """:func:`verdict`, and for a line it accepts, the run built as ``train.py`` builds it (``build.build``: Fabric,
    the data, the model, the method's parts; not trained): None, or the build's one ``error:`` line."""
    import tempfile

    from fl_lightning.run.build import build
    from fl_lightning.config import check_run
    from fl_lightning.errors import FLError

    line = verdict(argv)
    if line is not None:
        return line
    argv = [a for a in argv if a != "-m"]
    cfg = compose(argv)
    check_run(cfg, argv)
    with tempfile.TemporaryDirectory() as run_dir:
        try:
            build(cfg, run_dir, checked=True)
        except FLError as err:
            return f"error: {err}"
    return None


def tokens(text: str) -> list[str]:
    """The ``KEY=VALUE`` overrides written in ``text`` (a value in brackets or braces whole: ``x=[32,64]``)."""
    out, i = [], 0
    for m in _TOKEN_START.finditer(text):
        if m.start() < i:
            continue
        j, depth = m.end(), 0
        while j < len(text):
            ch = text[j]
            if ch in "[{":
                depth += 1
            elif ch in "]}":
                depth -= 1
            elif depth == 0 and (ch.isspace() or ch in ";)" or (ch == "," and (j + 1 == len(text) or
                                                                             text[j + 1].isspace()))):
                break
            j += 1
        value = text[m.end():j].rstrip(".?,")
        if value and depth == 0:
            out.append(m.group(0) + value)
        i = j
    return out


def _bare(text: str) -> str:
    """``text`` without its remarks in parentheses (one level of nesting)."""
    return re.sub(r"\([^()]*\)", "", re.sub(r"\([^()]*\([^()]*\)[^()]*\)", "", text))


def _alternatives(fix: str) -> list[str]:
    """The fix's alternatives (``A, or B``; ``A or B``; ``A; B``) as written, remarks included; an alternative that
    asks for a file first (``data/partition=foo (a data/partition/foo.yaml in conf/ ...)``) is not concrete."""
    alts, depth, cur, i = [], 0, "", 0
    while i < len(fix):
        ch = fix[i]
        depth += (ch == "(") - (ch == ")")
        m = re.match(r",? or |; ", fix[i:]) if depth == 0 else None
        if m:
            alts.append(cur)
            cur, i = "", i + m.end()
            continue
        cur += ch
        i += 1
    alts.append(cur)
    return [a.strip() for a in alts if a.strip() and ".yaml" not in a]


def follow(argv: list[str], line: str) -> list[list[str]]:
    """The command lines a user gets by following the fix of ``line`` (the refusal of ``argv``), one per alternative
    it names concretely; [] where it names no concrete change (``set it to a valid value``; ``remove it`` for a key
    the command line does not hold)."""
    key, _, fix = parts(line)
    out: list[list[str]] = []
    if re.match(r"remove it\b", fix):
        kept = [a for a in argv if key_of(a) != key]
        return [kept] if key and len(kept) < len(argv) else []
    m = re.match(r"did you mean ([^\s?]+)\?", fix)
    if m:
        near = m.group(1)
        if "=" in near:  # a group name: method=fedavg
            return [[a for a in argv if key_of(a) != key_of(near)] + [near]]
        typed = [a for a in argv if key_of(a) == key or key_of(a).startswith(key + ".")]
        if not typed:
            return []
        written = [t for t in tokens(fix) if key_of(t) == near or key_of(t).startswith(near + ".")]
        if written:  # the override the fix writes out (data.batch_size=16)
            return [[a for a in argv if a not in typed] + written]
        # else the typed override under the name meant, its + or ~ kept (+data.batchsize=16 -> +data.batch_size=16)
        return [[re.sub(rf"^([+~]*){re.escape(key)}(?=[.=]|$)", lambda m: m.group(1) + near, a) for a in argv]]
    for alt in _alternatives(fix):
        alt, _, instead = _bare(alt).partition(" in place of ")  # write A=1 in place of B=1: B=1 goes
        gone = {key_of(t) for t in tokens(instead)}
        toks = [t for t in tokens(alt) if not _PLACEHOLDER.search(t.split("=", 1)[1])
                  and not t.startswith("hydra.searchpath")]
        if not toks:
            continue
        keys = {key_of(t) for t in toks}
        out.append([a for a in argv if key_of(a) not in keys | gone] + toks)
    return out


def fix_defects(argv: list[str], line: str, judge=None) -> list[str]:
    """Each way of following ``line``'s fix (the refusal of ``argv``) that does not get past the check that refused
    it: ``"ARGV: LINE / followed: NEW / -> AGAIN"`` where the same refusal comes again, or one about what the fix
    wrote (``+data.batch_size=16``: Hydra's "an item is already at 'data.batch_size'"), or a name the fix made up
    (``unknown ...``); [] when every concrete alternative gets past it (or none is concrete). ``judge``: what says
    ``None`` or the refusal line for a command line (default :func:`verdict`)."""
    judge = judge or verdict
    bad = []
    for new in follow(argv, line):
        again = judge(new)
        written = {key_of(a) for a in new if a not in argv}
        key = parts(again)[0] if again else ""
        about_written = again is not None and (key in written or (" " in key or not key) and any(
            re.search(rf"(?<![\w.]){re.escape(w)}(?![\w])", again) for w in written))
        if same_refusal(line, again) or about_written or (again or "").startswith("error: unknown "):
            bad.append(f"{' '.join(argv)}: {line}\n  followed: {' '.join(new)}\n  -> {again}")
    return bad
