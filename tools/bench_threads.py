"""trainer.threads on an idle and on a busy machine: the default run's wall time per thread setting.

    python tools/bench_threads.py                     # idle, then busy (one spinning process per usable CPU)
    python tools/bench_threads.py --only busy --repeats 2 -- fl.rounds=10

Runs ``python train.py`` (the README's default job, plus any overrides after ``--``) as a user would, once per setting
and repetition, interleaved: ``auto`` (the default: the usable CPUs, idle OpenMP threads sleeping), each fixed count
from 1 to the usable CPUs, and ``spin`` (the usable CPUs with libgomp's default spin-then-sleep wait,
``GOMP_SPINCOUNT=300000``: what the default did before the wait became passive). "Busy" starts one pure-Python busy
loop per usable CPU (another user's job) for the whole phase. Prints a markdown table: median wall time, CPU time of
the run, and each setting's wall time over the best fixed count's. A run over ``--limit`` seconds is stopped and
reported as "> limit".
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from fl_lightning.threads import usable_cpus  # noqa: E402


def settings(cpus: int) -> dict[str, tuple[list[str], dict]]:
    out = {"auto": ([], {})}
    for n in range(1, cpus + 1):
        out[str(n)] = ([f"trainer.threads={n}"], {})
    out["spin"] = ([f"trainer.threads={cpus}"], {"GOMP_SPINCOUNT": "300000"})
    return out


def run_once(extra: list[str], env_extra: dict, overrides: list[str], limit: float) -> tuple[float, float]:
    """(wall s, CPU s of the child) of one ``train.py`` run; wall = inf when stopped at ``limit``."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT",
                                                             "MKL_NUM_THREADS")}
    env.update(env_extra)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with tempfile.TemporaryDirectory() as d:
        t = time.perf_counter()
        p = subprocess.Popen([sys.executable, os.path.join(ROOT, "train.py"), "trainer.progress=false", *extra,
                              *overrides, f"hydra.run.dir={d}"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
        try:
            _, err = p.communicate(timeout=limit)
            wall = time.perf_counter() - t
            if p.returncode != 0:
                raise SystemExit(f"run failed ({extra} {env_extra}): {err[-2000:]}")
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()
            wall = float("inf")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def hogs(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", choices=["idle", "busy"], default=None)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--limit", type=float, default=600.0, help="seconds before a run is stopped")
    ap.add_argument("overrides", nargs="*")
    a = ap.parse_args()
    cpus = usable_cpus()
    cases = settings(cpus)
    print(f"{cpus} usable CPUs; load average at start {os.getloadavg()[0]:.2f}; overrides {a.overrides or 'none'}",
          flush=True)
    rows = []
    for phase in ([a.only] if a.only else ["idle", "busy"]):
        started = hogs(cpus) if phase == "busy" else []
        try:
            time.sleep(1.0 if started else 0.0)
            res: dict[str, list[tuple[float, float]]] = {k: [] for k in cases}
            for _ in range(a.repeats):
                for name, (extra, env) in cases.items():
                    res[name].append(run_once(extra, env, a.overrides, a.limit))
                    print(f"  {phase} {name}: {res[name][-1][0]:.1f} s wall, {res[name][-1][1]:.1f} s CPU", flush=True)
        finally:
            for h in started:
                h.kill()
        wall = {k: statistics.median(w for w, _ in v) for k, v in res.items()}
        cpu = {k: statistics.median(c for _, c in v) for k, v in res.items()}
        best = min(wall[str(n)] for n in range(1, cpus + 1))
        for k in cases:
            w = wall[k]
            rows.append((phase, k, "> %.0f s" % a.limit if w == float("inf") else f"{w:.1f} s", f"{cpu[k]:.1f} s",
                         "—" if w == float("inf") else f"{w / best:.2f}"))
    print("\n| machine | trainer.threads | wall (median) | CPU time | wall / best fixed count |")
    print("|---|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(r) + " |")


if __name__ == "__main__":
    main()
