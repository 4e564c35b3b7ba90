"""Small-scale evidence for FedPAC (seed 001, issue 12 item 5) on the embedded digits at Dirichlet α = 0.1:

* ``main``: Local-X vs FedPAC-X for X in {Muon, SOAP, Sophia} (seed 001's Local-X: fresh optimizer state each round);
* ``beta``: FedPAC-SOAP with β in {0, 0.5, 0.9} (β = 0 with alignment is ``fedpac_soap_align_only``: the correction
  term β·g_G vanishes and the lr factor (1 − β) is 1, so the two are the same run);
* ``ablation``: seed 001 Table 5 on SOAP: Local / alignment only / correction only / both.

Every run is ``python train.py method=... data.partition.alpha=0.1 seed=...`` in a subprocess (the real CLI) with
the preconditioner drift Δ_D (spec 001 §6.1 eq. 15) logged per round; the tables give mean ± std over seeds of the
final and best test accuracy and of Δ_D averaged over the rounds. Learning rates are seed 001 Table 8's (Muon 3e-2,
SOAP 3e-3, Sophia 3e-4) except where a row says otherwise (Sophia 1e-3: the best of {3e-4, 1e-3, 3e-3, 1e-2} for
Local Sophia on seed 0, shared with FedPAC-Sophia as the paper shares lrs).

    python tools/fedpac_small_scale.py                         # the tables in docs/fedpac_small_scale.md
    python tools/fedpac_small_scale.py --seeds 0 --rounds 10   # a quick look
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from small_scale import fmt, one_run  # noqa: E402

DRIFT = "+method.parts.drift._target_=fl_lightning.strategies.parts.PreconditionerDrift"
MUON = ["method.ns_dtype=null"]  # fp32 Newton-Schulz: bf16 is emulated (slow) on CPUs without bf16 units
SOPHIA_TUNED = "method.lr=0.001"

RUNS = {  # label -> (method, overrides)
    "Local Muon": ("local_muon_reset", ["method.lr=0.03", "method.aux_lr=0.03", *MUON, DRIFT]),
    "FedPAC-Muon": ("fedpac_muon", [*MUON, "method.log_drift=true"]),
    "Local SOAP": ("local_soap", [DRIFT]),
    "FedPAC-SOAP": ("fedpac_soap", ["method.log_drift=true"]),
    "Local Sophia (lr 3e-4)": ("local_sophia", [DRIFT]),
    "FedPAC-Sophia (lr 3e-4)": ("fedpac_sophia", ["method.log_drift=true"]),
    "Local Sophia (lr 1e-3)": ("local_sophia", [SOPHIA_TUNED, DRIFT]),
    "FedPAC-Sophia (lr 1e-3)": ("fedpac_sophia", [SOPHIA_TUNED, "method.log_drift=true"]),
    "FedPAC-SOAP, alignment only (β = 0)": ("fedpac_soap_align_only", ["method.log_drift=true"]),
    "FedPAC-SOAP, correction only": ("fedpac_soap_correct_only", ["method.log_drift=true"]),
    "FedPAC-SOAP, β = 0.9": ("fedpac_soap", ["method.pac_beta=0.9", "method.log_drift=true"]),
}
GROUPS = {
    "main": ["Local Muon", "FedPAC-Muon", "Local SOAP", "FedPAC-SOAP", "Local Sophia (lr 3e-4)",
             "FedPAC-Sophia (lr 3e-4)", "Local Sophia (lr 1e-3)", "FedPAC-Sophia (lr 1e-3)"],
    "beta": ["FedPAC-SOAP, alignment only (β = 0)", "FedPAC-SOAP", "FedPAC-SOAP, β = 0.9"],
    "ablation": ["Local SOAP", "FedPAC-SOAP, alignment only (β = 0)", "FedPAC-SOAP, correction only", "FedPAC-SOAP"],
}


def tag(label: str, alpha: float, seed: int) -> str:
    method, overrides = RUNS[label]
    keep = [o.split("=")[-1] for o in overrides if o not in (DRIFT, *MUON, "method.log_drift=true")]
    return f"{method}{'_' + '_'.join(keep) if keep else ''}_a{alpha}_s{seed}"


def mean_drift(s: dict) -> float:
    vals = [float(r["precond_drift"]) for r in s["rows"] if r.get("precond_drift") not in (None, "")]
    return statistics.mean(vals) if vals else float("nan")


def per_round(s: dict) -> int:
    from omegaconf import OmegaConf

    return int(OmegaConf.load(os.path.join(s["run_dir"], "config.yaml")).fl.clients_per_round)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--alpha", type=float, default=0.1)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--groups", nargs="+", choices=sorted(GROUPS), default=["main", "beta", "ablation"])
    ap.add_argument("--jobs", type=int, default=2, help="runs in parallel (each with OMP_NUM_THREADS=1)")
    ap.add_argument("--out", default="/tmp/fedpac_small_scale")
    ap.add_argument("--extra", nargs="*", default=[], help="extra Hydra overrides for every run")
    args = ap.parse_args(argv)

    labels = list(dict.fromkeys(lab for g in args.groups for lab in GROUPS[g]))
    jobs = [(lab, s) for lab in labels for s in args.seeds]
    t0 = time.perf_counter()

    def go(job):
        lab, s = job
        method, overrides = RUNS[lab]
        return one_run(lab, method, overrides, args.alpha, s, args.rounds, args.out, args.extra,
                       tag=tag(lab, args.alpha, s))

    with ThreadPoolExecutor(args.jobs) as pool:
        results = list(pool.map(go, jobs))
    by: dict[str, list[dict]] = {}
    for lab, _, _, summ in results:
        by.setdefault(lab, []).append(summ)

    print(f"\n{len(jobs)} runs, {args.rounds} rounds, Dirichlet α = {args.alpha:g}, seeds {args.seeds}, "
          f"{time.perf_counter() - t0:.0f} s total\n")
    for g in args.groups:
        print(f"\n### {g}\n")
        print("| method | final test acc (%) | best test acc (%) | mean Δ_D over rounds | uplink kB / client·round "
              "| wall s (mean) |")
        print("| --- | --- | --- | --- | --- | --- |")
        for lab in GROUPS[g]:
            ss = by[lab]
            up = statistics.mean(s["uplink_bits"] / 8e3 / (args.rounds * per_round(s)) for s in ss)
            print(f"| {lab} | {fmt([s['final_test_acc'] for s in ss])} | {fmt([s['best_test_acc'] for s in ss])} "
                  f"| {fmt([mean_drift(s) for s in ss], scale=1.0, digits=3)} | {up:.1f} "
                  f"| {statistics.mean(s['wall_s'] for s in ss):.0f} |")
    print("\nCommands (seed 0):\n")
    for lab in labels:
        print(f"    {by[lab][0]['cmd']}")
    return by


if __name__ == "__main__":
    main()
