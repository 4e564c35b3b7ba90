"""Seed 003's method comparison at small scale (issue 16 item 7): FedMuon (fedmuon_avg) and the 11 baselines of
spec 003 §3.2 on the embedded digits data in seed 003's federated setting: 8 clients, all of them every round,
tau = 4 local steps, batch 64, cosine lr over the rounds, Dirichlet(alpha) partition, seeds 0, 1, 2.

Every run is ``python train.py method=<name> data.partition.alpha=<a> seed=<s> fl.num_clients=8 ...`` in a
subprocess (the real CLI, tools/small_scale.py's runner); a finished run directory is read back, not run again. The
VR methods run with ``method.prev_model=client`` (full participation: clients keep x^{r-1}, the papers' bytes).
Seed 003 grid-tuned every method; ``--tune NAME ...`` does a small version of that for the methods named (all with
no name): the yaml lr times 0.5, 1 and 2 on the first seed (final test accuracy at the first alpha), then every seed
at the chosen lr (ties: the yaml's).
Prints a markdown table (mean ± sample std over seeds of the final and best test accuracy, MB per round each way,
wall s) and writes a plot of the mean test accuracy per round.

    OMP_NUM_THREADS=1 python tools/seed003_comparison.py --jobs 2 --tune fedavgm fedavg_vr scaffold_m scaffold_vr \
        padamfed padamfed_vr fafed adam_biclip                                # docs/seed003_comparison.md
    python tools/seed003_comparison.py --alphas 0.5 --seeds 0 --only fafed padamfed
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from small_scale import ROOT, fmt, one_run, run_all  # noqa: E402

VR = ["method.prev_model=client"]
METHODS = [  # (label, method, overrides): spec 003 §3.2's experimental baselines in its order, then FedMuon
    ("FedAvg", "fedavg", []), ("SCAFFOLD", "scaffold", []), ("FedAvg-M", "fedavgm", []),
    ("FedAvg-VR", "fedavg_vr", VR), ("SCAFFOLD-M", "scaffold_m", []), ("SCAFFOLD-VR", "scaffold_vr", VR),
    ("PAdaMFed", "padamfed", []), ("PAdaMFed-VR", "padamfed_vr", VR), ("FedAdam", "fedadam", []),
    ("FAFED", "fafed", []), ("Adam-BiClip", "adam_biclip", []), ("FedMuon (seed 003)", "fedmuon_avg", []),
]
SETTING = ["fl.num_clients=8", "fl.clients_per_round=8", "fl.local_steps=4", "data.batch_size=64",
           "fl.lr_schedule=cosine"]


def yaml_lr(method: str) -> float:
    from hydra import compose, initialize_config_dir

    from fl_lightning.schema import register

    register()  # the config schema, conf/config.yaml's first default
    with initialize_config_dir(config_dir=os.path.join(ROOT, "conf"), version_base="1.3"):
        return float(compose("config", overrides=[f"method={method}"]).method.lr)


def diverged_or_run(label, method, overrides, alpha, seed, args) -> dict:
    """one_run's summary (``diverged`` False), or, when train.py stops on a non-finite loss, ``diverged`` True and
    accuracy 0 (a tuning point, never a reported run)."""
    try:
        return {**one_run(label, method, overrides, alpha, seed, args.rounds, args.out, args.extra)[3], "diverged": False}
    except RuntimeError as err:
        if "became inf" not in str(err) and "became nan" not in str(err):
            raise
        return {"final_test_acc": 0.0, "best_test_acc": 0.0, "diverged": True}


def tune(specs, alpha, seed, args):
    """Each method at its yaml lr × 0.5, 1, 2 on one seed; its spec with the best final accuracy's lr."""
    lrs = {m: yaml_lr(m) for _, m, _ in specs}
    grid = [(lab, m, ov + ([] if f == 1.0 else [f"method.lr={f * lrs[m]:g}"]), f) for lab, m, ov in specs
            for f in (1.0, 0.5, 2.0)]
    with ThreadPoolExecutor(args.jobs) as pool:
        res = list(pool.map(lambda g: (g, diverged_or_run(g[0], g[1], g[2] + SETTING, alpha, seed, args)), grid))
    print(f"\nlr grid (seed {seed}, Dirichlet α = {alpha:g}, final / best test acc %):\n")
    print("| method | × 0.5 | × 1 (yaml) | × 2 | chosen lr |\n| --- | --- | --- | --- | --- |")
    out = []
    for lab, m, ov in specs:
        rows = {g[3]: (g, s) for g, s in res if g[0] == lab}
        best = max((1.0, 0.5, 2.0), key=lambda f: rows[f][1]["final_test_acc"])  # max keeps the first of ties
        cells = " | ".join("diverged" if rows[f][1]["diverged"] else
                           f"{100 * rows[f][1]['final_test_acc']:.1f} / {100 * rows[f][1]['best_test_acc']:.1f}"
                           for f in (0.5, 1.0, 2.0))
        print(f"| {lab} | {cells} | {best * lrs[m]:g} |")
        out.append((lab, m, rows[best][0][2]))
    return out


def plot(by, specs, alphas, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(alphas), figsize=(6.5 * len(alphas), 4.5), squeeze=False)
    for ax, a in zip(axes[0], alphas):
        for i, (lab, _, _) in enumerate(specs):
            runs = by.get((lab, a), [])
            curves = [[float(row["test_acc"]) * 100 for row in s["rows"] if row.get("test_acc")] for s in runs]
            if not curves:
                continue
            n = min(len(c) for c in curves)
            mean = [statistics.mean(c[j] for c in curves) for j in range(n)]
            ax.plot(range(1, n + 1), mean, label=lab, ls="-" if i < 10 else "--")
        ax.set(title=f"digits, 8 clients, tau = 4, Dirichlet alpha = {a:g}", xlabel="round",
               ylabel="test accuracy (%), mean of seeds", ylim=(40, 100))
        ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=8, loc="lower right", ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--alphas", type=float, nargs="+", default=[0.5])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--only", nargs="*", default=None, help="labels or method names to run (default: all)")
    ap.add_argument("--jobs", type=int, default=2, help="runs in parallel (each with OMP_NUM_THREADS=1)")
    ap.add_argument("--out", default="/tmp/seed003_comparison")
    ap.add_argument("--plot", default=os.path.join(ROOT, "docs", "seed003_comparison.png"))
    ap.add_argument("--extra", nargs="*", default=[], help="extra Hydra overrides for every run")
    ap.add_argument("--tune", nargs="*", default=None, help="methods whose lr is chosen from yaml × {0.5, 1, 2} on "
                    "the first seed (no names: every method)")
    args = ap.parse_args(argv)

    specs = [s for s in METHODS if not args.only or s[0] in args.only or s[1] in args.only]
    if args.tune is not None:
        chosen = dict((lab, (lab, m, ov)) for lab, m, ov in
                      tune([s for s in specs if not args.tune or s[1] in args.tune], args.alphas[0], args.seeds[0], args))
        specs = [chosen.get(s[0], s) for s in specs]
    jobs = [(lab, m, ov + SETTING, a, s) for a in args.alphas for (lab, m, ov) in specs for s in args.seeds]
    t0 = time.perf_counter()
    by = run_all(jobs, args.rounds, args.out, args.extra, args.jobs)

    print(f"\n{len(jobs)} runs, {args.rounds} rounds each, seeds {args.seeds}, {time.perf_counter() - t0:.0f} s total\n")
    print("| method | Dirichlet α | final test acc (%) | best test acc (%) | up MB / round | down MB / round | wall s |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for a in args.alphas:
        for lab, m, ov in specs:
            ss = by[(lab, a)]
            up = statistics.mean(s["uplink_bits"] for s in ss) / 8e6 / args.rounds
            down = statistics.mean(s["downlink_bits"] for s in ss) / 8e6 / args.rounds
            print(f"| {lab} (`{' '.join([f'method={m}', *ov])}`) | {a:g} | {fmt([s['final_test_acc'] for s in ss])} "
                  f"| {fmt([s['best_test_acc'] for s in ss])} | {up:.3f} | {down:.3f} "
                  f"| {statistics.mean(s['wall_s'] for s in ss):.0f} |")
    if args.plot:
        plot(by, specs, args.alphas, args.plot)
        print(f"\nplot: {os.path.relpath(args.plot, ROOT)}")
    return by


if __name__ == "__main__":
    main()
