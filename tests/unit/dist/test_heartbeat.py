"""fl_lightning/dist/peers.py in one process: the heartbeat names the rank whose counter stood still (torch's in-memory
HashStore standing in for the rendezvous store), ranks that are stopping themselves are not named, a store that does
not answer gives None, and the failures a lost peer raises are told from other errors."""
from __future__ import annotations

import time

import pytest
import torch.distributed as dist

from fl_lightning.dist import peers


def test_the_rank_whose_beat_stands_still_is_named():
    store = dist.HashStore()
    beats = [peers.Heartbeat(r, 3, store, period=0.05).start() for r in range(3)]
    time.sleep(0.2)
    beats[2].stop()  # rank 2 dies: its counter stops
    time.sleep(0.1)
    assert beats[0].missing(check_s=0.4) == [2]


def test_a_rank_that_is_stopping_because_it_lost_a_peer_is_not_named():
    store = dist.HashStore()
    beats = [peers.Heartbeat(r, 3, store, period=0.05).start() for r in range(3)]
    time.sleep(0.2)
    beats[2].stop()
    store.set("fl/lost/1", "1")  # rank 1 saw the loss first and is ending (its beat stops too)
    beats[1].stop()
    assert beats[0].missing(check_s=0.4) == [2]


def test_a_store_that_does_not_answer_gives_none():
    class Gone:
        def add(self, key, n):
            raise RuntimeError("Connection closed by peer")

        set = check = add

    assert peers.Heartbeat(1, 2, Gone()).missing(check_s=0.01) is None


@pytest.mark.parametrize("err,lost", [
    (RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:561] Connection closed by peer [127.0.0.1]:1"), True),
    (dist.DistNetworkError("Failed to recv, got 0 bytes"), True),
    (dist.DistStoreError("Timed out after 6 seconds waiting for clients. 1/2 clients joined."), True),
    (RuntimeError("mat1 and mat2 shapes cannot be multiplied"), False),
    (ValueError("Connection closed by peer"), False),
])
def test_peer_failures_are_told_from_other_errors(err, lost):
    assert peers.is_peer_failure(err) is lost


def test_the_line_names_the_round_the_checkpoint_and_the_resume_command(tmp_path):
    store = dist.HashStore()
    peers.set_run(str(tmp_path), lambda: f"{tmp_path}/checkpoints/round_000004", lambda: 5)
    peers._BEAT[:] = [peers.Heartbeat(0, 2, store)]  # rank 1 never beat: missing
    try:
        peers.CHECK_S, old = 0.05, peers.CHECK_S
        msg = peers.lost_peer_message(RuntimeError("[pair.cc:561] Connection closed by peer [10.0.0.2]:4. x"), 0, 2, 300,
                                        formed=True)
    finally:
        peers.CHECK_S = old
        peers._BEAT.clear()
        peers.ENDING.clear()
        peers.set_run(None)
    assert "\n" not in msg
    assert msg.startswith("rank 0: lost the process of rank 1 during round 5 (it stopped answering): Connection "
                          "closed by peer [10.0.0.2]:4")
    assert msg.endswith(f"the last checkpoint is {tmp_path}/checkpoints/round_000004; resume with: python3 train.py "
                        f"resume={tmp_path}")


@pytest.mark.slow
def test_a_process_that_ends_with_beats_running_exits_cleanly():
    """Beats still running at exit are stopped first: a daemon thread caught inside the store's C++ call at
    finalization used to abort the process ("terminate called without an active exception", exit 134)."""
    import subprocess
    import sys

    code = ("import time, torch.distributed as dist\n"
            "from fl_lightning import peers\n"
            "store = dist.HashStore()\n"
            "beats = [peers.Heartbeat(r, 4, store, period=0.0).start() for r in range(4)]\n"
            "time.sleep(0.3)\n")
    for _ in range(2):  # the abort needed a beat inside the store at the moment of exit: most exits hit one
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert "terminate called" not in proc.stderr
