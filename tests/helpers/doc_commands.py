"""The shell commands the README and docs/ print, as a user would copy them: collected from fenced code blocks
(```bash / ```sh / ```console / plain ```), indented code lines and inline code spans that start with a command
(``python``, ``python3``, ``fl-report``, ``pip``, ``torchrun``, ``srun``, an ``A=B`` environment prefix, ``time``).
A ``\\`` continuation is joined, a trailing ``# comment`` and a ``$ `` prompt are dropped; in a fenced block the
lines after a ``$ `` command up to the next one are what it prints (:attr:`Command.output`).

An inline span of overrides alone written relative to an experiment (issue 65: docs/text.md's ``method=local_adamw
... data/partition=iid fl.rounds=10`` below its table's "all with ``experiment=glue_lora data=pydoc_topics``") is a
command too: ``python train.py BASE FRAGMENT`` (:func:`fragments`; :attr:`Command.base` holds BASE).

Used by tests/system/test_docs_commands.py."""
from __future__ import annotations

import glob
import os
import re
import shlex
from dataclasses import dataclass, field

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHELL_FENCES = {"", "bash", "sh", "shell", "console", "shell-session"}
_ENV = re.compile(r"^[A-Z_][A-Z0-9_]*=\S*$")
_WORDS = ("python", "python3", "fl-report", "pip", "torchrun", "srun", "time")
_FENCE = re.compile(r"^\s*(```+|~~~+)\s*([\w-]*)")
_SPAN = re.compile(r"(`+)(.+?)\1")


@dataclass
class Command:
    path: str  # relative to the repository root
    line: int
    text: str  # the command as a user types it (continuations joined, comment and prompt dropped)
    output: list[str] = field(default_factory=list)  # what the docs show it printing (``$ `` blocks)
    base: str = ""  # a fragment's: the experiment's group choices it is written relative to (its text holds them)

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"

    def argv(self) -> tuple[dict[str, str], list[str]]:
        """(environment prefix, words): ``PYTHONPATH=x python train.py a=1`` -> ({PYTHONPATH: x}, [python, ...])."""
        words = shlex.split(self.text)
        env = {}
        while words and _ENV.match(words[0]):
            k, _, v = words.pop(0).partition("=")
            env[k] = v
        if words and words[0] == "time":
            words.pop(0)
        return env, words


def doc_pages() -> list[str]:
    """README.md and every page under docs/ (results pages included), relative to the root."""
    pages = ["README.md"] + sorted(glob.glob("docs/**/*.md", root_dir=ROOT, recursive=True))
    return [p for p in pages if os.path.isfile(os.path.join(ROOT, p))]


def is_command(text: str) -> bool:
    words = text.split()
    while words and _ENV.match(words[0]):
        words = words[1:]
    return bool(words) and words[0] in _WORDS and len(words) > 1


def _strip_comment(line: str) -> str:
    """``cmd a=1   # note`` -> ``cmd a=1`` (a ``#`` inside quotes, or glued to a word, stays)."""
    out, quote = [], None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            break
        out.append(ch)
    return "".join(out).strip()


def _joined(lines: list[tuple[int, str]]) -> list[tuple[int, str, bool]]:
    """(first line number, command, had a ``$ `` prompt) with ``\\`` continuations joined."""
    out, cur, start, prompt = [], "", 0, False
    for n, raw in lines:
        text = raw.strip()
        if not cur:
            start, prompt = n, text.startswith("$ ")
            text = text[2:] if prompt else text
        text = _strip_comment(text) if not text.startswith("#") else ""
        if text.endswith("\\"):
            cur += text[:-1].strip() + " "
            continue
        cur += text
        if cur.strip():
            out.append((start, cur.strip(), prompt))
        cur = ""
    return out


def commands(page: str) -> list[Command]:
    """Every command of one page, in page order."""
    with open(os.path.join(ROOT, page)) as f:
        lines = f.read().splitlines()
    found: list[Command] = []
    fence, lang, block = None, "", []
    prev_blank = True
    for n, line in enumerate(lines, 1):
        m = _FENCE.match(line)
        if fence is not None:
            if m and m.group(1).startswith(fence):
                if lang in SHELL_FENCES:
                    found.extend(_block(page, block))
                fence, block = None, []
            else:
                block.append((n, line))
            continue
        if m:
            fence, lang, block = m.group(1), m.group(2).lower(), []
            continue
        if line.startswith("    ") and line.strip() and (prev_blank or lines[n - 2].startswith("    ")):
            for start, text, _ in _joined([(n, line)]):  # an indented code line
                if is_command(text):
                    found.append(Command(page, start, text))
        else:
            for span in _SPAN.finditer(line):  # inline code spans
                text = span.group(2).strip()
                if is_command(text):
                    found.append(Command(page, n, text))
        prev_blank = not line.strip()
    return found


def _block(page: str, block: list[tuple[int, str]]) -> list[Command]:
    """A fenced block's commands; in a ``$ `` block, the other lines are the output of the command above them."""
    prompted = any(t.strip().startswith("$ ") for _, t in block)
    if not prompted:
        return [Command(page, n, t) for n, t, _ in _joined(block) if is_command(t)]
    out: list[Command] = []
    for n, raw in block:
        if raw.strip().startswith("$ "):
            for start, text, _ in _joined([(n, raw)]):
                if is_command(text):
                    out.append(Command(page, start, text))
        elif out and raw.strip():
            out[-1].output.append(raw.strip())
    return out


_OVERRIDE = re.compile(r"^[+~]?[A-Za-z_][\w.@/-]*=\S*$|^~[A-Za-z_][\w.@/-]*$")
_HEADING = re.compile(r"^#{1,6}\s")


def _overrides(text: str) -> list[str] | None:
    """The words of ``text`` if each is a Hydra override (``a.b=1``, ``group=name``, ``'~a.b'``), else None."""
    try:
        words = shlex.split(text)
    except ValueError:
        return None
    return words if words and all(_OVERRIDE.match(w) for w in words) else None


_BASE = re.compile(r"\ball with `([^`]+)`")


def fragments(page: str) -> list[Command]:
    """The page's inline spans of two or more overrides written relative to an experiment: after a page says "all
    with ``experiment=X ...``" (a table's header: its rows and the text below are runs of X), each span of overrides
    alone in that section (up to the next heading; a span may wrap onto the next line), as ``python train.py`` +
    those overrides + the span's own. A span of overrides elsewhere (relative to the defaults, or a template) is
    not one: the page does not say what it is relative to."""
    with open(os.path.join(ROOT, page)) as f:
        lines = f.read().splitlines()
    found: list[Command] = []
    base: list[str] = []
    fence, carry, start = None, "", 0
    for n, line in enumerate(lines, 1):
        m = _FENCE.match(line)
        if fence is not None or m:
            fence = (m.group(1) if fence is None else None if m and m.group(1).startswith(fence) else fence)
            continue
        if _HEADING.match(line):
            base, carry = [], ""
            continue
        text = carry + line if carry else line
        start = start if carry else n
        if text.count("`") % 2 and n < len(lines) and lines[n].strip():  # a span wrapping onto the next line
            carry = text.rstrip() + " "
            continue
        carry = ""
        declared = _BASE.search(text)
        if declared and (_overrides(declared.group(1)) or [""])[0].startswith("experiment="):
            base = _overrides(declared.group(1))
        for span in _SPAN.finditer(text):
            words = _overrides(span.group(2).strip())
            if base and words and len(words) >= 2 and not any(w.startswith("experiment=") for w in words):
                found.append(Command(page, start, " ".join(["python", "train.py", *base, *map(shlex.quote, words)]),
                                     base=" ".join(base)))
    return found


def all_commands() -> list[Command]:
    return [c for p in doc_pages() for c in commands(p) + fragments(p)]
