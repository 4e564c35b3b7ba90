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
