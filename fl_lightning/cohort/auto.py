"""``trainer.cohort=auto`` and ``trainer.compile=auto`` (the defaults): the fastest setting on this machine, chosen by
measurement once, at a fresh run's start, and kept in the saved config (as ``ns_dtype: auto``: precision.py).

Off CUDA both resolve to the sequential eager loop (1 and none: a cohort and a graph are GPU paths,
docs/benchmarks.md). On CUDA a probe times a few steps of each candidate, K ∈ {1, 2, 4, …, the memory bound}
× {none, graphs} (a candidate not measured on a GPU yet is left out: ``graphs`` with a cohort; a method
that cannot run batched has K = 1 only), each in a throwaway copy of the run (its own module, strategy and store;
the run itself is built after, from the same seed), keeps the fastest per client-step and says in one line what it
chose with the measured figures and the probe's cost. A key given explicitly is not probed. With several processes
the probe is not run (they would time each other): K is the memory bound and compile none.

A resume keeps the saved values; a saved value that cannot run here (``graphs`` off CUDA, a K above this device's
memory bound) is chosen again, said in one line. Both keys stay out of the result hash (``result=False``): the
arithmetic of a run does not depend on them beyond float order (tests/system/test_cohort.py).
"""
from __future__ import annotations

import logging
import time
from typing import Callable

from omegaconf import DictConfig, OmegaConf, open_dict

log = logging.getLogger("fl_lightning")

AUTO = "auto"
MODES = ("none", "graphs")  # trainer.compile candidates (step: minutes of compiling, not a probe's)
PROBE_STEPS = 6  # timed local steps of each candidate (after a warm-up client: the capture of a graph)


def timer() -> float:
    """The probe's clock (``time.perf_counter``; a test's mock replaces it)."""
    return time.perf_counter()


def device_kind(device) -> str:
    """The device's kind (``cuda``, ``cpu``): the one thing the probe asks of it (a test's mock replaces it)."""
    return device.type


def candidates(bound: int, modes=MODES) -> list[tuple[int, str]]:
    """``(K, compile)`` to time: K ∈ {1, 2, 4, …} up to ``bound`` (the memory bound; 1 for a method or model that
    cannot run batched) and ``bound`` itself; ``graphs`` at K = 1 only (a cohort's replay has not been measured on a GPU)."""
    ks, k = [], 1
    while k <= max(1, bound):
        ks.append(k)
        k *= 2
    if bound > 1 and ks[-1] != bound:
        ks.append(bound)
    return [(k, m) for k in ks for m in modes if m == "none" or k == 1]


def choose(timings: dict[tuple[int, str], float]) -> tuple[int, str]:
    """The fastest candidate per client-step (seconds); a tie goes to the smaller K, then to ``none``."""
    order = {m: i for i, m in enumerate(MODES)}
    return min(timings, key=lambda c: (timings[c], c[0], order.get(c[1], 9)))


def summary(choice, timings: dict, failed: dict, probe_s: float, run_s: float | None) -> str:
    """The probe's one line: the choice, every candidate's ms per client-step, the failures, its cost."""
    figs = ", ".join(f"{k}/{m} {1e3 * t:.3g}" for (k, m), t in sorted(timings.items()))
    bad = "".join(f"; {k}/{m} failed: {why}" for (k, m), why in sorted(failed.items()))
    cost = (f", {100 * probe_s / run_s:.2g}% of the run's projected {run_s / 3600:.3g} h" if run_s else "")
    return (f"trainer.cohort=auto trainer.compile=auto -> cohort={choice[0]} compile={choice[1]}: "
            f"ms a client-step (K/compile) {figs}{bad}; probe {probe_s:.1f} s{cost}")


def probe(cands: list[tuple[int, str]], time_fn: Callable[[int, str], float]) -> tuple[tuple[int, str], dict, dict, float]:
    """Time each candidate (``time_fn(K, compile) -> seconds a client-step``; an exception leaves it out with its
    reason): ``(choice, timings, failures, probe seconds)``. At least (1, none) must run."""
    start = timer()
    timings, failed = {}, {}
    for k, m in cands:
        try:
            timings[(k, m)] = float(time_fn(k, m))
        except Exception as err:  # noqa: BLE001 - an out-of-memory K or a failed capture: not a candidate
            failed[(k, m)] = f"{type(err).__name__}: {' '.join(str(err).split())[:120]}"
    if not timings:
        raise RuntimeError(f"trainer.cohort=auto: no candidate ran ({failed})")
    return choose(timings), timings, failed, timer() - start


def unrunnable(cohort, compile_, device, bound: int | None) -> str | None:
    """Why a saved (resolved) setting cannot run on ``device`` (a resume on another machine), or None."""
    if compile_ == "graphs" and device_kind(device) != "cuda":
        return f"trainer.compile=graphs replays CUDA graphs and this run is on {device_kind(device)}"
    if cohort not in (None, AUTO) and bound is not None and int(cohort) > max(1, bound):
        return f"trainer.cohort={cohort} is more than the {bound} clients that fit this device's memory"
    return None


def resolve(cfg: DictConfig, saved: DictConfig | None, device, world: int, bound: Callable[[], tuple[int, str]],
            time_fn: Callable[[int, str], float], run_seconds: Callable[[float], float] | None = None) -> dict[str, object]:
    """Resolve ``trainer.cohort`` / ``trainer.compile`` = auto in ``cfg`` in place (the module docstring) and return
    ``{key: value}`` for those resolved. ``bound()``: ``(memory-bound K, why)``; ``time_fn(K, compile)``: a candidate's
    seconds a client-step; ``run_seconds(s)``: the run's
    projected seconds at ``s`` a client-step (for the probe's share of it)."""
    t = cfg.trainer
    auto = {"cohort": str(t.cohort) == AUTO, "compile": str(t.compile) == AUTO}
    if not any(auto.values()):
        return {}
    if saved is not None:  # a resume: the saved values, unless they cannot run here
        old = {k: OmegaConf.select(saved, f"trainer.{k}", default=None) for k in auto}
        if all(not auto[k] or (old[k] is not None and str(old[k]) != AUTO) for k in auto):
            why = unrunnable(old["cohort"] if auto["cohort"] else t.cohort,
                             old["compile"] if auto["compile"] else t.compile, device,
                             bound()[0] if auto["cohort"] and device_kind(device) == "cuda" else None)
            if why is None:
                return _set(cfg, {k: old[k] for k in auto if auto[k]})
            log.warning("the run's saved setting cannot run here (%s): trainer.cohort and trainer.compile are chosen "
                        "again", why)
    if device_kind(device) != "cuda":
        out = _set(cfg, {k: v for k, v in (("cohort", 1), ("compile", "none")) if auto[k]})
        # nothing was chosen (the defaults' one value off CUDA; the config holds it): not a line at INFO level
        log.debug("trainer.cohort=auto trainer.compile=auto -> %s on %s (a cohort and a CUDA graph are GPU paths)",
                 " ".join(f"{k}={v}" for k, v in out.items()), device_kind(device))
        return out
    k_max, why = bound() if auto["cohort"] else (int(t.cohort), "given")
    if world > 1:  # several processes share the device: they would time each other
        out = _set(cfg, {k: v for k, v in (("cohort", k_max), ("compile", "none")) if auto[k]})
        log.info("trainer.cohort/compile=auto with %d processes: %s without a probe (%s)", world,
                 " ".join(f"{k}={v}" for k, v in out.items()), why)
        return out
    ks = candidates(k_max) if auto["cohort"] else [(k_max, m) for m in MODES]
    cands = [(k, m) for k, m in ks if (auto["compile"] or m == str(t.compile)) and (k == 1 or m == "none")]
    if len(cands) <= 1:  # nothing to choose between (a given K > 1: no graphs yet; a given mode at bound 1)
        choice = cands[0] if cands else (k_max, str(t.compile))
        log.info("trainer.cohort/compile=auto -> cohort=%s compile=%s (the one candidate: %s)", *choice, why)
        return _set(cfg, {k: v for k, v in (("cohort", choice[0]), ("compile", choice[1])) if auto[k]})
    choice, timings, failed, spent = probe(cands, time_fn)
    run_s = run_seconds(timings[choice]) if run_seconds else None
    log.info(summary(choice, timings, failed, spent, run_s))
    return _set(cfg, {k: v for k, v in (("cohort", choice[0]), ("compile", choice[1])) if auto[k]})


def _set(cfg: DictConfig, values: dict) -> dict:
    with open_dict(cfg.trainer):
        for k, v in values.items():
            cfg.trainer[k] = int(v) if k == "cohort" else str(v)
    return values


def auto_cohort(strategy, module, device, clients: int, available: int | None,
                activation_bytes, compiled: str | None = None) -> tuple[int, str]:
    """``trainer.cohort=auto`` bounded by memory: ``(K, why)``. 1 off CUDA (the sequential loop is as fast on a CPU:
    docs/benchmarks.md) and for a method or model that cannot run batched (the reason); on CUDA the most of the
    ``clients`` a process trains in a round whose per-client tensors (:func:`client_bytes`) and activations
    (``activation_bytes()``: a one-client forward and backward, measured) fit :data:`AUTO_FRACTION` of the free
    memory."""
    from ..errors import ConfigError
    from .engine import check_cohort
    from .memory import AUTO_FRACTION, _gib, client_bytes

    if device_kind(device) != "cuda":
        return 1, f"the sequential loop on {device.type} (a cohort is a GPU path)"
    try:
        check_cohort(strategy, module, 2, compiled)
    except ConfigError as err:
        return 1, f"the sequential loop: {err.problem}"
    if available is None or clients <= 1:
        return 1, "the sequential loop (free memory unknown)" if available is None else "one client a round"
    per_client = client_bytes(strategy, module) + int(activation_bytes())
    k = max(1, min(clients, int(AUTO_FRACTION * available) // max(1, per_client)))
    return k, (f"{k} clients a step: {_gib(per_client)} each (weights, gradients, optimizer and round state, "
               f"activations), {_gib(available)} free")
