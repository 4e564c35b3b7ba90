"""The progress display keeps messages visible (issue "Reliability" item 4): while the live display runs, a log
record is printed above it through rich, not written under it onto the terminal it repaints (warnings go to
sys.stderr, which rich itself redirects)."""
from __future__ import annotations

import io
import logging
import sys

from rich.console import Console

from fl_lightning.progress import RoundProgress


def test_messages_print_above_the_live_display(capsys):
    buf = io.StringIO()
    handler = logging.StreamHandler(sys.stderr)  # as Hydra's and Lightning's console handlers hold their stream
    log = logging.getLogger("fl_lightning.test_progress")
    log.addHandler(handler)
    try:
        with RoundProgress(3, 0, console=Console(file=buf, force_terminal=True, width=120)) as progress:
            assert progress.live, progress
            log.warning("signal 15 received: will checkpoint")
        assert handler.stream is sys.stderr  # given back afterwards
    finally:
        log.removeHandler(handler)
    shown = buf.getvalue()
    assert "signal 15 received: will checkpoint" in shown
    assert "signal 15" not in capsys.readouterr().err  # nothing went to the raw stream under the display


def test_the_plain_line_off_a_terminal_gives_an_eta_once_rounds_have_a_pace(monkeypatch):
    clock = iter(range(0, 1000, 10))  # every reading of the clock 10 s later
    buf = io.StringIO()
    progress = RoundProgress(4, 0, console=Console(file=buf, force_terminal=False, width=200))
    monkeypatch.setattr(progress.progress, "get_time", lambda: float(next(clock)))
    assert not progress.live
    info = {"train_loss": 1.0, "uplink_mb": 1.0, "downlink_mb": 1.0, "test_acc": 0.5, "evaluated": True}
    with progress:
        for r in range(4):
            progress.end_round(r, info)
    lines = buf.getvalue().splitlines()
    assert [line.split("  ")[0] for line in lines] == ["round 1/4", "round 2/4", "round 3/4", "round 4/4"]
    assert "ETA 0:00:" in lines[2] and "ETA" not in lines[3]  # a pace from the rounds so far; none at the end
