"""The shell commands the README and docs/ print, as a user would copy them: collected from fenced code blocks
(```bash / ```sh / ```console / plain ```), indented code lines and inline code spans that start with a command
(``python``, ``python3``, ``fl-report``, ``pip``, ``torchrun``, ``srun``, an ``A=B`` environment prefix, ``time``).
A ``\\`` continuation is joined, a trailing ``# comment`` and a ``$ `` prompt are dropped; in a fenced block the
lines after a ``$ `` command up to the next one are what it prints (:attr:`Command.output`).

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


def all_commands() -> list[Command]:
    return [c for p in doc_pages() for c in commands(p)]
