"""Issue 65, items 8, 9 and 11: the summary (the run's result) on stdout and the progress on stderr; the live
display stopped before the summary is printed, its bar kept at 80 columns; off a terminal, a long round reports its
clients done and an ETA."""
from __future__ import annotations

import io
import re

from rich.console import Console

from fl_lightning.progress import RoundProgress

INFO = {"train_loss": 1.0, "uplink_mb": 12.34, "downlink_mb": 12.34, "test_acc": 0.5, "evaluated": True}
SUMMARY = {"method": "fedavg", "model": "cnn", "data": "digits", "primary_metric": "test_acc", "rounds_done": 4,
           "final_test_acc": 0.5, "run_dir": "/tmp/run"}
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _screen(raw: str) -> list[str]:
    """The lines a terminal keeps: escape codes dropped, a carriage return or an erased line starting the line again,
    the lines the live display moved up over (cursor up) dropped."""
    lines: list[str] = [""]
    for token in re.split(r"(\x1b\[[0-9;?]*[A-Za-z]|\r|\n)", raw):
        if token == "\n":
            lines.append("")
        elif token in ("\r", "\x1b[2K"):
            lines[-1] = ""
        elif token == "\x1b[1A":
            lines.pop()
        elif token and not _ANSI.fullmatch(token):
            lines[-1] += token
    return [ln.rstrip() for ln in lines]


def _run(progress: RoundProgress, rounds: int = 4, clients: int = 8) -> None:
    with progress:
        for r in range(rounds):
            progress.start_round(r, clients)
            for _ in range(clients):
                progress.client_done()
            progress.end_round(r, INFO)
            progress.progress.refresh()
        progress.summary(SUMMARY)


def test_at_80_columns_the_round_line_keeps_its_bar_and_the_summary_is_drawn_last():
    buf = io.StringIO()  # stdout and stderr on one terminal, as a user sees them
    term = dict(file=buf, force_terminal=True, width=80)
    progress = RoundProgress(4, 0, console=Console(**term), out=Console(**term))
    assert progress.live
    _run(progress)
    screen = [ln for ln in _screen(buf.getvalue()) if ln]
    rounds = [ln for ln in screen if ln.startswith("rounds")]
    assert rounds and "━" in rounds[-1] and "4/4" in rounds[-1], screen  # the bar and the count at 80 columns
    assert all(len(ln) <= 80 for ln in screen), screen
    assert screen[-1].startswith("└"), screen  # the table's last line is the last thing on the screen
    table = next(i for i, ln in enumerate(screen) if "rounds_done" in ln)
    assert not any(ln.startswith(("rounds", "clients")) for ln in screen[table:]), screen  # no frame below it
    assert not any(ln.startswith("clients") for ln in screen), screen  # the finished round's clients row is gone
    assert any("loss 1.0000" in ln and "test_acc 0.5000" in ln for ln in screen[:table]), screen  # the numbers kept


def test_the_summary_goes_to_stdout_and_the_progress_to_its_console(capsys):
    err = io.StringIO()
    _run(RoundProgress(2, 0, console=Console(file=err, force_terminal=False, width=200)), rounds=2)
    out = capsys.readouterr().out
    assert "rounds_done" in out and "/tmp/run" in out, out  # the result, on stdout
    assert "rounds_done" not in err.getvalue() and "round 2/2" in err.getvalue(), err.getvalue()


def test_off_a_terminal_a_long_round_reports_its_clients_done_and_an_eta():
    now = [0.0]
    buf = io.StringIO()
    progress = RoundProgress(3, 0, console=Console(file=buf, force_terminal=False, width=200))
    progress.progress.get_time = lambda: now[0]
    assert not progress.live
    with progress:
        progress.start_round(0, 10)  # a short round (2 s a client): nothing inside it
        for _ in range(10):
            now[0] += 2.0
            progress.client_done()
        assert buf.getvalue() == ""
        progress.end_round(0, INFO)
        progress.start_round(1, 10)  # a long one: 20 s a client
        for _ in range(10):
            now[0] += 20.0
            progress.client_done()
    lines = buf.getvalue().splitlines()[1:]  # after round 1's line
    inner = [ln for ln in lines if "clients" in ln]
    assert inner[0] == ("round 2/3  clients 2/10  0:00:40 in the round  ETA 0:02:40 for the round, about 0:06:00 "
                        "for the run (evaluation not counted)"), lines
    # after 30 s in the round, then each time the time in it has doubled (40, 80, 160 s); the last client: no line
    assert [ln.split("  ")[1] for ln in inner] == ["clients 2/10", "clients 4/10", "clients 8/10"], lines


def test_a_long_round_on_a_terminal_or_without_progress_prints_no_inner_line():
    for kwargs in ({"enabled": False}, {}):
        now = [0.0]
        buf = io.StringIO()
        progress = RoundProgress(2, 0, console=Console(file=buf, force_terminal=not kwargs, width=120), **kwargs)
        progress.progress.get_time = lambda: now[0]
        with progress:
            progress.start_round(0, 4)
            for _ in range(4):
                now[0] += 60.0
                progress.client_done()
        assert "in the round" not in buf.getvalue(), buf.getvalue()
