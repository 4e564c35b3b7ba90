"""Small-scale comparison of every first-order method (issue 15 item 6): the default digits run (16 clients, 8 per
round, 10 local steps, 40 rounds, CNN) at Dirichlet alpha 0.1, seeds 0, 1, 2.

Every run is ``python train.py method=<name> data.partition.alpha=0.1 seed=<s>`` in a subprocess (the real CLI),
into ``<out>/<label>_s<seed>``; a run whose summary.json exists is not run again (so an interrupted sweep resumes).
The table is built from the run directories' summary.json: mean ± sample std over seeds of the final and best test
accuracy, and the bytes per round (every sampled client together, MB = 10^6 bytes) each way.

    OMP_NUM_THREADS=1 python tools/first_order_comparison.py                   # run what is missing, print the table
    python tools/first_order_comparison.py --table-only --out /tmp/first_order  # only the table
    python tools/first_order_comparison.py --only fedprox fedcm --jobs 1
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import small_scale  # noqa: E402
from small_scale import fmt  # noqa: E402

# (label, method, overrides): every first-order method in conf/method/, plus seed 000's local-momentum FedAvg
METHODS = [
    ("fedavg", "fedavg", []),
    ("fedavg, local momentum 0.9", "fedavg", ["method.momentum=0.9"]),
    ("fedavg_adam", "fedavg_adam", []),
    ("local_adamw", "local_adamw", []),
    ("fedprox", "fedprox", []),
    ("scaffold", "scaffold", []),
    ("scaffold_adam", "scaffold_adam", []),
    ("fedcm", "fedcm", []),
    ("fedavgm", "fedavgm", []),
    ("fedavg_server_momentum", "fedavg_server_momentum", []),
    ("fedadam", "fedadam", []),
    ("fedyogi", "fedyogi", []),
    ("fedams", "fedams", []),
    ("fedlada", "fedlada", []),
    ("scaffold, released codes' bug", "scaffold", ["method.parts.correction.correction_applied=false"]),
    # not the papers' values: a shorter memory of the global direction (an EMA over rounds)
    ("fedcm, gamma 0.5", "fedcm", ["method.gamma=0.5"]),
    ("fedavgm, global_momentum 0.5", "fedavgm", ["method.global_momentum=0.5"]),
]


def run_dir_of(out, label, seed):
    name = label.replace(", ", "_").replace(" ", "_").replace("'", "")
    return os.path.join(out, "".join(ch if ch.isalnum() or ch in "._-" else "_" for ch in name) + f"_s{seed}")


def one_run(label, method, overrides, alpha, seed, rounds, out):
    """One train.py run through the shared runner (skipped when finished); its summary."""
    return small_scale.one_run(label, method, overrides, alpha, seed, rounds, out, [],
                               tag=os.path.basename(run_dir_of(out, label, seed)))[3]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--alpha", type=float, default=0.1)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--only", nargs="*", default=None, help="labels or method names to run (default: all)")
    ap.add_argument("--jobs", type=int, default=1, help="runs in parallel (each with OMP_NUM_THREADS=1)")
    ap.add_argument("--out", default="/tmp/first_order")
    ap.add_argument("--table-only", action="store_true", help="do not run; table from the existing run directories")
    args = ap.parse_args(argv)

    specs = [s for s in METHODS if not args.only or s[0] in args.only or s[1] in args.only]
    t0 = time.perf_counter()
    if args.table_only:
        by = {}
        for lab, _, _ in specs:
            ss = []
            for seed in args.seeds:
                p = os.path.join(run_dir_of(args.out, lab, seed), "summary.json")
                if os.path.exists(p):
                    with open(p) as f:
                        ss.append(json.load(f))
            if ss:
                by[lab] = ss
    else:
        jobs = [(lab, m, ov, args.alpha, s) for (lab, m, ov) in specs for s in args.seeds]
        with ThreadPoolExecutor(args.jobs) as pool:
            results = list(pool.map(lambda j: (j[0], one_run(*j, args.rounds, args.out)), jobs))
        by = {}
        for lab, summ in results:
            by.setdefault(lab, []).append(summ)
        print(f"\n{len(jobs)} runs, {time.perf_counter() - t0:.0f} s", file=sys.stderr)

    print(f"\nDirichlet α = {args.alpha:g}, {args.rounds} rounds, seeds {args.seeds} (mean ± std over seeds)\n")
    print("| method | command | final test acc (%) | best test acc (%) | uplink MB / round | downlink MB / round "
          "| loop wall s (mean) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for lab, m, ov in specs:
        if lab not in by:
            continue
        ss = by[lab]
        up = statistics.mean(s["uplink_bits"] for s in ss) / 8e6 / args.rounds
        down = statistics.mean(s["downlink_bits"] for s in ss) / 8e6 / args.rounds
        cmd = " ".join([f"method={m}", *ov])
        seeds = "" if len(ss) == len(args.seeds) else f" (seeds: {len(ss)})"
        print(f"| `{lab}`{seeds} | `{cmd}` | {fmt([s['final_test_acc'] for s in ss])} "
              f"| {fmt([s['best_test_acc'] for s in ss])} | {up:.3f} | {down:.3f} "
              f"| {statistics.mean(s['wall_s'] for s in ss):.1f} |")


if __name__ == "__main__":
    main()
