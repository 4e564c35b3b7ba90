"""RunRecorder: open metric columns, the declared primary metric in summary.json, and part metrics in the rows."""
from __future__ import annotations

import csv
import json

import pytest

from fl_lightning.recorder import RunRecorder
from tests.helpers.cli import FAST, build_loop, run_cli


def test_open_columns_first_seen_order_blank_when_missing(tmp_path):
    rec = RunRecorder(str(tmp_path), primary=("perplexity", "min"))
    rec.add(uplink_bits=10, downlink_bits=20)
    rec.record(1, {"train_loss": 2.0, "perplexity": 9.0})
    rec.add(uplink_bits=10, downlink_bits=20)
    rec.record(2, {"train_loss": 1.5, "drift": 0.3})
    rec.record(3, {"train_loss": 1.2, "perplexity": 7.0})
    with open(tmp_path / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
        header = rows and list(rows[0])
    assert header == ["round", "train_loss", "perplexity", "uplink_bits", "downlink_bits", "uplink_mb", "downlink_mb",
                      "wall_s", "drift"]
    assert rows[1]["perplexity"] == "" and rows[1]["drift"] == "0.3" and rows[2]["uplink_bits"] == "20"
    s = rec.summary()
    assert (s["primary_metric"], s["primary_mode"], s["final"], s["best"]) == ("perplexity", "min", 7.0, 7.0)
    assert s["final_drift"] == 0.3 and s["uplink_bits"] == 20 and s["downlink_mb"] == 40 / 8e6
    assert json.loads((tmp_path / "summary.json").read_text())["best_perplexity"] == 7.0


def test_recorder_state_round_trips(tmp_path):
    a = RunRecorder(str(tmp_path))
    a.add(uplink_bits=5)
    a.record(1, {"test_acc": 0.5})
    saved = json.loads(json.dumps(a.state_dict()))
    b = RunRecorder(str(tmp_path))
    b.load_state_dict(saved)
    assert b.rows == a.rows and b.totals == a.totals and b.wall() >= saved["wall_s"]


def test_classifier_summary_declares_accuracy(tmp_path):
    loop = build_loop(FAST + ["fl.rounds=2"], tmp_path)
    s = loop.run()
    assert (s["primary_metric"], s["primary_mode"]) == ("test_acc", "max")
    assert s["final"] == s["final_test_acc"] and s["best_test_acc"] >= s["final_test_acc"]


def test_summary_stamps_the_loop_start_and_each_round_end(tmp_path):
    """``loop_start_unix``, ``first_client_unix`` and one ``round_end_unix`` per round, wall-clock and in order
    (tools/bench_w2.py times the start-up from them)."""
    import time

    before = time.time()
    loop = build_loop(FAST + ["fl.rounds=3"], tmp_path)
    s = loop.run()
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk["loop_start_unix"] == s["loop_start_unix"] and len(on_disk["round_end_unix"]) == 3
    assert s["loop_start_unix"] <= s["first_client_unix"] <= s["round_end_unix"][0]
    stamps = [s["loop_start_unix"], *s["round_end_unix"]]
    assert before <= stamps[0] and stamps == sorted(stamps) and stamps[-1] <= time.time()


@pytest.mark.slow
def test_part_metrics_reach_metrics_csv_through_the_cli(tmp_path):
    p = run_cli(FAST + ["fl.rounds=3", "+method.parts.probe._target_=tests.helpers.parts.UpdateNorm", f"hydra.run.dir={tmp_path}"])
    assert p.returncode == 0, p.stderr[-2000:]
    with open(tmp_path / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 3
    assert all(float(r["probe/update_norm"]) > 0 and float(r["probe/clients"]) == 3 for r in rows)
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["final_probe/update_norm"] == pytest.approx(float(rows[-1]["probe/update_norm"]))
