"""The processes of one run keep track of each other: a shared run directory is checked at start, each process
beats in the rendezvous store, and a lost peer ends every survivor with one line naming the rank that is gone.

- :func:`check_shared_dir`: rank 0 writes a token into the run directory and every rank reads it back; a rank that
  cannot (each node its own disk, or each node's Hydra its own timestamped folder) stops every rank with one line
  naming the directory, exit 2, before anything is written there.
- :class:`Heartbeat`: a daemon thread adds 1 to ``fl/beat/<rank>`` in the process group's store every
  :data:`BEAT_S` seconds (a few bytes over TCP; nothing on the device, no collective). When a collective fails
  (a peer's sockets closed, or ``trainer.timeout_s`` passed), :func:`lost_peer_message` reads the counters twice and
  names the ranks whose counter stood still; ranks that are stopping because they lost a peer say so first
  (``fl/lost/<rank>``), so a survivor that stops later does not count them. A store that no longer answers is the
  one rank 0 (Lightning's launcher, a static rendezvous) or torchrun's first agent served: that process is gone.
- :func:`watch_children`: Lightning's launcher polls the ranks it started every 5 s and SIGKILLs everything when one
  dies; here it prints the one line first (the rank, its exit code, the last checkpoint, the resume command).

Fabric still forms the process group; ``trainer.timeout_s`` bounds every collective and the rendezvous
(:func:`fl_lightning._compat.set_collective_timeout`), well under torch's 30-minute default.
"""
from __future__ import annotations

import atexit
import os
import signal
import socket
import sys
import threading
import time
import uuid
import weakref

from ..errors import ConfigError

BEAT_S = 1.0  # heartbeat period; a counter that does not move in CHECK_S seconds is a process gone
CHECK_S = 4.0
TOKEN = ".fl_processes"  # the file rank 0 writes into the run directory at start
# where this process is: set by the loop (the run directory and a function giving the last checkpoint)
_RUN: dict = {"dir": None, "last": lambda: None, "round": lambda: None}
ENDING = threading.Event()  # this process is already ending with its own line (the child watcher stays quiet)


def quiet_cpp_warnings() -> bool:
    """``TORCH_CPP_LOG_LEVEL=ERROR`` unless the user set a level (read once, when torch loads): the rendezvous store's
    client logs every failed socket operation as a C++ warning with a stack trace, so a rank that loses rank 0 (the
    store's host) would print pages before its one line. True if it can still take effect."""
    if "TORCH_CPP_LOG_LEVEL" in os.environ:
        return False
    os.environ["TORCH_CPP_LOG_LEVEL"] = "ERROR"
    return "torch" not in sys.modules


def set_run(run_dir: str | None, last=None, round_now=None) -> None:
    """What the one line says: the run directory, and callables giving the last checkpoint and the round running."""
    _RUN.update(dir=run_dir, last=last or (lambda: None), round=round_now or (lambda: None))


def _during() -> str:
    rnd = _RUN["round"]()
    return f" during round {rnd}" if rnd else ""


def _where() -> str:
    last, d = _RUN["last"](), _RUN["dir"]
    if not d:
        return ""
    if last:
        return f"; the last checkpoint is {last}; resume with: python3 train.py resume={d}"
    return f"; no checkpoint was written yet; start again with: python3 train.py resume=auto hydra.run.dir={d}"


# ---------------------------------------------------------------------------------------------- shared run directory
def check_shared_dir(fabric, run_dir: str, wait_s: float = 5.0) -> None:
    """Every rank sees the run directory rank 0 writes to (see the module docstring); raises a one-line
    :class:`~fl_lightning.errors.ConfigError` on every rank otherwise."""
    import torch  # 2 s: this module is imported by the command line before torch, only a run needs it


    here = os.path.abspath(run_dir)
    token = uuid.uuid4().hex
    if fabric.global_rank == 0:
        tmp = os.path.join(here, f"{TOKEN}.{token}.tmp")
        with open(tmp, "w") as f:
            f.write(token)
        os.replace(tmp, os.path.join(here, TOKEN))
    token, root = fabric.broadcast((token, here), src=0)  # sent after rank 0's file is in place
    ok, deadline = False, time.time() + wait_s  # a network filesystem may show a new file a moment later
    while True:
        try:
            with open(os.path.join(here, TOKEN)) as f:
                ok = f.read() == token
        except OSError:
            ok = False
        if ok or time.time() >= deadline:
            break
        time.sleep(0.2)
    flags = torch.zeros(fabric.world_size, dtype=torch.int32, device=fabric.device)
    flags[fabric.global_rank] = 0 if ok else 1
    bad = [r for r, b in enumerate(fabric.all_reduce(flags, reduce_op="sum").tolist()) if b]
    if not bad:
        return
    them = f"rank{'s' if len(bad) > 1 else ''} {', '.join(map(str, bad[:8]))}{' …' if len(bad) > 8 else ''}"
    mine = f" (this rank's is {here}, on {socket.gethostname()})" if here != root else ""
    raise ConfigError("hydra.run.dir", f"the processes do not share the run directory {root}: {them} cannot read "
                      f"what rank 0 wrote there{mine}",
                      "put the run directory on a filesystem every node mounts and give every node the same "
                      "hydra.run.dir=/shared/runs/NAME")


# ---------------------------------------------------------------------------------------------- heartbeat
def _default_store():
    from .._compat import default_store  # _compat imports torch (2 s): only a run of several processes

    return default_store()


class Heartbeat:
    """A daemon thread beating ``fl/beat/<rank>`` in the process group's store (see the module docstring)."""

    _live: "weakref.WeakSet[Heartbeat]" = weakref.WeakSet()

    def __init__(self, rank: int, world: int, store=None, period: float = BEAT_S):
        self.rank, self.world, self.period = rank, world, period
        self.store = store if store is not None else _default_store()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="fl-heartbeat", daemon=True)

    def start(self) -> "Heartbeat":
        Heartbeat._live.add(self)
        self._thread.start()
        return self

    def stop(self, wait: float = 0.0) -> None:
        """Stop beating; with ``wait`` > 0, also wait up to that many seconds for the thread to leave the store."""
        self._stop.set()
        if wait > 0 and self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(wait)

    def _beat(self) -> None:
        while not self._stop.is_set():
            try:
                self.store.add(f"fl/beat/{self.rank}", 1)
            except Exception:  # the store is gone: the failure shows in the next collective
                return
            self._stop.wait(self.period)

    def stopping(self) -> set[int]:
        """The ranks that said they are ending because they lost a peer (``fl/lost/<rank>``)."""
        return {r for r in range(self.world) if self.store.check([f"fl/lost/{r}"])}

    def counts(self) -> list[int]:
        return [int(self.store.add(f"fl/beat/{r}", 0)) for r in range(self.world)]

    def missing(self, check_s: float | None = None) -> list[int] | None:
        """The ranks whose beat stood still for ``check_s`` seconds (default :data:`CHECK_S`), less those stopping
        because they lost a peer; None when the store does not answer."""
        check_s = CHECK_S if check_s is None else check_s
        self.stop()
        try:
            self.store.set(f"fl/lost/{self.rank}", "1")
            before = self.counts()
            time.sleep(check_s)
            after = self.counts()
            stopping = self.stopping()
            return [r for r in range(self.world) if r != self.rank and after[r] == before[r] and r not in stopping]
        except Exception:
            return None


_BEAT: list[Heartbeat] = []


def start_heartbeat(rank: int, world: int) -> None:
    if world > 1:
        _BEAT.append(Heartbeat(rank, world).start())


def stop_heartbeat() -> None:
    while _BEAT:
        _BEAT.pop().stop()


@atexit.register
def _join_heartbeats() -> None:
    """Every beat still running stops before the interpreter finalizes: a daemon thread that is inside the store's
    C++ call then (it releases the GIL there) is unwound by ``pthread_exit`` through a ``noexcept`` frame, and the
    process aborts with "terminate called without an active exception" (exit 134) after its work is done."""
    for beat in list(Heartbeat._live):
        beat.stop(wait=2.0)


# ---------------------------------------------------------------------------------------------- a lost peer
_SIGNS = ("gloo", "nccl", "connection closed by peer", "connection reset by peer", "broken pipe", "timed out",
          "socket timeout", "wait timeout", "waiting for clients")


def is_peer_failure(err: BaseException) -> bool:
    """A collective or the rendezvous failed because another process is gone or never came (several processes)."""
    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return False
    kind = getattr(dist, "DistError", None)
    if kind is not None and isinstance(err, kind):
        return True
    text = str(err).lower()
    return isinstance(err, RuntimeError) and any(s in text for s in _SIGNS)


def lost_peer_message(err: BaseException, rank: int, world: int, timeout_s: float | None,
                      formed: bool | None = None) -> str:
    """The one line a survivor prints: which ranks are gone (from the heartbeat), what failed, where the run stands.
    ``formed``: whether the process group had formed (default: it is initialised now); before, the processes never
    met."""
    beat = _BEAT[0] if _BEAT else None
    missing = beat.missing() if beat is not None else None
    first = " ".join(str(err).split())
    first = first[first.find("]") + 1:].strip() if first.startswith("[") else first  # drop gloo's source location
    why = first.split(". ")[0][:160]
    if formed is None:
        dist = sys.modules.get("torch.distributed")
        formed = dist is not None and dist.is_initialized()
    if not formed:  # the rendezvous: the processes never met
        addr = f"{os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}"
        if "timed out" in str(err).lower() or "timeout" in str(err).lower():
            return (f"rank {rank}: not every process joined within trainer.timeout_s={timeout_s:g} s ({why}); start "
                    f"all {world} processes (each node with the same hydra.run.dir), or raise trainer.timeout_s")
        return (f"rank {rank}: the processes could not meet at {addr} ({why}); fix: a free MASTER_PORT, and a "
                f"MASTER_ADDR every node reaches")
    if missing is None:
        who = "lost rank 0 (the rendezvous store it served does not answer)" if rank else "the rendezvous store is gone"
        who += _during()
    elif missing:
        who = f"lost the process of rank {', '.join(map(str, missing))}{_during()} (it stopped answering)"
    else:
        who = f"a collective failed{_during()} with every process still answering (a hung or slow rank? raise " \
              f"trainer.timeout_s={timeout_s:g} if the processes' rounds differ that much)"
    return f"rank {rank}: {who}: {why}{_where()}"


def _stopping() -> set[int]:
    try:
        return _BEAT[0].stopping() if _BEAT else set()
    except Exception:  # the store is gone
        return set()


def watch_children(launcher) -> None:
    """Replace Lightning's child-process observer of ``launcher`` (after ``fabric.launch``): a rank that dies ends
    this process with one line (the rank, its exit code, where the run stands) instead of a silent SIGKILL."""
    from .._compat import silence_child_observer  # imports torch, as above

    procs = list(getattr(launcher, "procs", []))
    if not procs or not silence_child_observer():
        return

    def watch():
        while True:
            time.sleep(1.0)
            codes = [p.poll() for p in procs]
            if all(c == 0 for c in codes):
                return
            if ENDING.is_set():  # this process says why it ends
                return
            dead = [(i + 1, c) for i, c in enumerate(codes) if c not in (None, 0)]
            if not dead:
                continue
            time.sleep(1.0)  # the main thread may be reporting the same loss; it says more (the heartbeat)
            if ENDING.is_set():
                return
            stopping = _stopping()  # ranks that ended because they lost a peer are not the cause
            r, c = min(dead, key=lambda rc: (rc[0] in stopping, rc[1] >= 0, rc[0]))  # killed by a signal first
            how = f"was killed by signal {-c}" if c < 0 else f"exited with code {c}"
            try:
                os.write(2, f"error: rank 0: the process of rank {r} {how}{_during()}{_where()}\n".encode())
            finally:
                for p in procs:
                    if p.poll() is None:
                        p.send_signal(signal.SIGKILL)
                os._exit(1)

    threading.Thread(target=watch, name="fl-child-watch", daemon=True).start()
