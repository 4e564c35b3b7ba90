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


def _huge_info() -> dict:  # a round line of about 200 characters
    return {"train_loss": 1.0, "uplink_mb": 1e120, "downlink_mb": 2e120, "test_acc": 0.5, "evaluated": True}


def test_off_a_terminal_a_long_round_line_and_the_summary_are_never_wrapped_or_cut():
    buf = io.StringIO()
    progress = RoundProgress(2, 0, console=Console(file=buf, force_terminal=False),  # rich's default: 80 columns
                             out=Console(file=buf, force_terminal=False))  # the summary's (stdout by default)
    with progress:
        progress.end_round(0, _huge_info())
    line = buf.getvalue().rstrip("\n")
    assert "\n" not in line and len(line) > 200 and line.startswith("round 1/2") and line.endswith("MB"), line
    run_dir = "outputs/" + "d" * 180
    progress.summary({"method": "fedavg", "model": "cnn", "data": "digits", "primary_metric": "test_acc",
                      "rounds_done": 2, "run_dir": run_dir})
    rows = [r for r in buf.getvalue().splitlines() if "run_dir" in r]
    assert len(rows) == 1 and run_dir in rows[0], rows  # the whole path on one row, not wrapped onto the next


def test_the_report_table_is_drawn_by_rich_at_full_width_off_a_terminal(tmp_path):
    from fl_lightning.report.write import print_table

    page = tmp_path / "report.md"
    wide = "x" * 200
    page.write_text("# title\n\nsome text\n\n| method | note |\n| --- | ---: |\n| fedavg | [a] \\| b |\n"
                    f"| fedmuon | {wide} |\n\nafter\n")
    buf = io.StringIO()
    print_table(str(page), Console(file=buf, force_terminal=False))
    out = buf.getvalue().splitlines()
    assert out[0].startswith("┏") and "| ---" not in buf.getvalue()  # a rich table, not markdown pipes
    assert [r.split("│")[1].strip() for r in out if r.startswith("│")] == ["fedavg", "fedmuon"]
    assert any(wide in r for r in out)  # the 200-character cell whole, on one line
    assert any("[a] | b" in r for r in out)  # an escaped pipe and brackets shown as written
    assert len({len(r) for r in out}) == 1  # every row the same width: nothing wrapped
