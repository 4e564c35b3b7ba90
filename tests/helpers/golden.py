"""Golden records: every method yaml's result after 2 rounds of the default digits run with 1 thread, recorded once
(tests/fidelity/golden.json) and checked by tests/fidelity/test_golden.py.

A record holds a digest (SHA-256 over the global weights and the strategy's server state: names, dtypes, shapes,
bytes, in sorted order), the run summary's numbers (losses, accuracy, exact bit counts) and the float64 norms of the
global weights and the server state. The file also holds the machine it was written on (:func:`machine`: torch,
its CPU capability, MKL and oneDNN versions, the CPU and its vector ISA, any forced ISA variable) and the
tolerances below, with the measurement they come from.

- On the recording machine (the same :func:`machine`), a method must match its record bit for bit.
- On any other machine, sums reduce in another order (torch's CPU kernels are vectorised per ISA, MKL and oneDNN
  pick code paths by CPU), so floats are compared to the measured tolerance; integers (bit counts, rounds, sizes) and
  strings stay exact everywhere.

The bit-exact guard for a refactor runs both commits on one machine:

    python -m tests.helpers.golden --compare BASE_COMMIT          # all methods; or name some after the commit
    FL_GOLDEN_EXTRA=trainer.cohort=4 python -m tests.helpers.golden --compare BASE_COMMIT   # the same, as cohorts
    python -m tests.helpers.golden --write [METHOD ...]           # re-record (a named bug fix: docs/decisions.md)
    python -m tests.helpers.golden --measure [OLD_RECORD.json]    # re-measure the cross-ISA spread (the tolerances)
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GOLDEN = os.path.join(ROOT, "tests", "fidelity", "golden.json")
ROUNDS = 2
OVERRIDES = [f"fl.rounds={ROUNDS}", "trainer.threads=1", "trainer.progress=false", "trainer.accelerator=cpu"]
SKIP_SUMMARY = {"wall_s", "run_dir", "config_hash", "loop_start_unix", "first_client_unix",
                "round_end_unix"}  # where, when, how long
# variables that force a kernel ISA: a run under any of them is another machine as far as bits go
ISA_VARIABLES = ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA",
                 "MKL_CBWR")
# the settings --measure runs every method under, each in its own process (the variables are read at start-up)
SETTINGS = {
    "native": {},
    "aten_avx2": {"ATEN_CPU_CAPABILITY": "avx2"},
    "aten_default": {"ATEN_CPU_CAPABILITY": "default"},
    "all_avx2": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
}


# --------------------------------------------------------------------------------------------------- the record
def methods() -> list[str]:
    return sorted(f[:-5] for f in os.listdir(os.path.join(ROOT, "conf", "method")) if f.endswith(".yaml"))


def digest(tensors: dict) -> str:
    import torch

    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def norm(tensors: dict) -> float:
    """The float64 L2 norm over every floating tensor (0.0 for none)."""
    import torch

    total = torch.zeros((), dtype=torch.float64)
    for t in tensors.values():
        if t.is_floating_point():
            total += t.detach().double().pow(2).sum()
    return float(total.sqrt())


def run_method(name: str, extra: tuple[str, ...] = ()) -> dict:
    """``python train.py method=<name> fl.rounds=2 trainer.threads=1 *extra`` in this process: its record, with the
    precision every ``auto`` key resolved to here (``precision``: the overrides that run it so elsewhere)."""
    import torch
    from omegaconf import OmegaConf

    from fl_lightning import precision
    try:
        from fl_lightning.run.build import build
    except ImportError:  # a base commit of --compare from before the run/ folder
        from fl_lightning.build import build
    from tests.helpers.cli import make_cfg

    threads = torch.get_num_threads()
    try:
        with tempfile.TemporaryDirectory() as d:
            cfg = make_cfg([f"method={name}", *OVERRIDES, *extra], d)
            auto = [k for k, v in precision.dtype_keys(cfg).items() if v == precision.AUTO]
            loop = build(cfg, d)
            loop.setup()
            torch.set_num_threads(1)
            summary = loop.run(progress_enabled=False)
            weights = dict(loop.global_params)
            server = {k: v for k, v in loop.strategy.state_dict().items() if isinstance(v, torch.Tensor)}
            state = {f"global/{k}": v for k, v in weights.items()}
            state.update({f"server/{k}": v for k, v in server.items()})
            metrics = {k: v for k, v in summary.items() if k not in SKIP_SUMMARY and isinstance(v, (int, float, str))}
            metrics["global_norm"] = norm(weights)
            metrics["server_norm"] = norm(server)
            return {"digest": digest(state), "metrics": metrics,
                    "precision": {k: str(OmegaConf.select(cfg, k)) for k in auto}}
    finally:
        torch.set_num_threads(threads)


def at_its_precision(record: dict) -> tuple[str, ...]:
    """The overrides that run a method at the precision its record was made with (``auto`` may resolve otherwise
    on this machine: fl_lightning/precision.py)."""
    return tuple(f"{k}={v}" for k, v in sorted(record.get("precision", {}).items()))


def machine() -> dict:
    """What decides the low bits of a CPU run: torch, the ATen kernels' ISA, MKL and oneDNN (versions and forced
    ISA), the CPU. Two runs with equal ``machine()`` are expected to agree bit for bit."""
    import torch

    config = torch.__config__.show()
    mkl = re.search(r"Math Kernel Library Version (\S+)", config)
    dnn = re.search(r"MKL-DNN (v[\d.]+)", config)
    cpu, isa = platform.processor() or platform.machine(), []
    try:
        with open("/proc/cpuinfo") as f:
            info = f.read()
        name = re.search(r"^model name\s*:\s*(.*)$", info, re.M)
        flags = re.search(r"^(?:flags|Features)\s*:\s*(.*)$", info, re.M)
        cpu = name.group(1).strip() if name else cpu
        isa = sorted({f for f in (flags.group(1).split() if flags else [])
                      if re.match(r"(avx|amx|fma|f16c|sse|ssse|sve|asimd|neon)", f)})
    except OSError:
        pass
    return {"torch": torch.__version__.split("+")[0], "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "blas": f"MKL {mkl.group(1)}" if mkl else "not MKL", "onednn": dnn.group(1) if dnn else "none",
            "cpu": cpu, "isa": " ".join(isa),
            "forced": {v: os.environ[v] for v in ISA_VARIABLES if os.environ.get(v)}}


def load() -> dict:
    with open(GOLDEN) as f:
        return json.load(f)


def _save(data: dict) -> None:
    with open(GOLDEN, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
        f.write("\n")


# --------------------------------------------------------------------------------------------------- comparing
def kind(key: str) -> str:
    """How a metric is compared off the recording machine: 'acc' (fractions of test examples), 'float' (losses,
    norms, anything else computed) or 'exact' (integers and strings: bit counts, rounds, names)."""
    if key.endswith("_acc") or key in ("best", "final"):
        return "acc"
    return "float"


def differences(got: dict, want: dict, tolerance: dict | None) -> list[str]:
    """What differs between two records, one line each; ``tolerance=None`` compares bits (the digest and every
    number exactly), else floats to ``tolerance`` ({'acc': absolute, 'float': relative}), integers and strings
    exactly."""
    out = []
    if tolerance is None and got["digest"] != want["digest"]:
        out.append(f"digest {got['digest'][:16]} != recorded {want['digest'][:16]}")
    g, w = got["metrics"], want["metrics"]
    for key in sorted(set(g) | set(w)):
        if key not in g or key not in w:
            out.append(f"{key}: {'missing' if key not in g else 'not recorded'}")
            continue
        a, b = g[key], w[key]
        floats = isinstance(a, float) or isinstance(b, float)
        if tolerance is None or not floats or isinstance(a, (str, bool)) or isinstance(b, (str, bool)):
            if a != b or type(a) is not type(b):
                out.append(f"{key}: {a!r} != recorded {b!r}")
            continue
        k = kind(key)
        if not (math.isfinite(a) and math.isfinite(b)):
            bad = not (a == b or (math.isnan(a) and math.isnan(b)))
        elif k == "acc":
            bad = abs(a - b) > tolerance["acc"]
        else:
            bad = abs(a - b) > tolerance["float"] * max(abs(a), abs(b), 1e-12)
        if bad:
            out.append(f"{key}: {a!r} vs recorded {b!r} (tolerance {tolerance[k]} {'abs' if k == 'acc' else 'rel'})")
    return out


def check(name: str, got: dict, golden: dict | None = None) -> list[str]:
    """``got`` against the record of ``name``: bits on the recording machine, the tolerance elsewhere."""
    golden = golden or load()
    want = golden["methods"][name]
    same = machine() == golden["machine"]
    return differences(got, want, None if same else {k: want["tolerance"][k] for k in FLOOR})


# --------------------------------------------------------------------------------------------------- commands
def _dump(out: str, names: list[str]) -> None:
    """Every named method's record, in this process, to ``out`` (JSON), with the machine."""
    import fl_lightning

    data = {"machine": machine(), "package": os.path.dirname(os.path.abspath(fl_lightning.__file__)), "methods": {}}
    try:
        recorded = load()["methods"]
    except (OSError, ValueError, KeyError):  # a base commit's golden file of an older layout
        recorded = {}
    extra = tuple(os.environ.get("FL_GOLDEN_EXTRA", "").split())  # e.g. trainer.cohort=4: --compare another path
    for n in names:  # at the recorded precision, so that the settings compare the same arithmetic
        data["methods"][n] = run_method(n, (*at_its_precision(recorded.get(n, {})), *extra))
        print(n, data["methods"][n]["digest"][:16], flush=True)
    with open(out, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)


def _dump_in(cwd: str, env: dict, names: list[str]) -> dict:
    """Run ``--dump`` in a fresh process in ``cwd`` (a checkout) with ``env`` added; its records."""
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "records.json")
        environ = {**{k: v for k, v in os.environ.items() if k not in ISA_VARIABLES}, **env,
                   "PYTHONPATH": cwd, "OMP_NUM_THREADS": "1"}
        subprocess.run([sys.executable, "-m", "tests.helpers.golden", "--dump", out, *names], cwd=cwd, env=environ,
                       check=True, stdout=subprocess.DEVNULL)
        with open(out) as f:
            data = json.load(f)
    if os.path.realpath(data["package"]) != os.path.realpath(os.path.join(cwd, "fl_lightning")):
        sys.exit(f"the run in {cwd} imported fl_lightning from {data['package']}")
    return data


def _write(names: list[str]) -> None:
    """Record ``names`` on this machine (each keeps its measured tolerance; a new one has none until --measure)."""
    old = load() if os.path.exists(GOLDEN) else {}
    if names != methods() and old.get("machine") != machine():
        sys.exit("the records were written on another machine; re-record all methods here (--write with no names)")
    data = {"machine": machine(), "tolerance": old.get("tolerance", {}), "methods": old.get("methods", {})}
    for n in names:  # a method keeps its measured tolerance (--measure after a change that moves it)
        kept = data["methods"].get(n, {}).get("tolerance", {**FLOOR, "measured": {"acc": 0.0, "float": 0.0, "where": ""}})
        data["methods"][n] = {**run_method(n), "tolerance": kept}
        print(n, data["methods"][n]["digest"][:16], data["methods"][n]["metrics"].get("final"), flush=True)
    data["methods"] = {k: data["methods"][k] for k in sorted(data["methods"])}
    _save(data)


def _compare(base: str, names: list[str]) -> int:
    """Records of ``base`` (a temporary worktree) and of the working tree, on this machine: the methods whose bits
    differ. Exit 1 if any does."""
    with tempfile.TemporaryDirectory() as d:
        tree = os.path.join(d, "base")
        subprocess.run(["git", "worktree", "add", "--detach", tree, base], cwd=ROOT, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            if not os.path.exists(os.path.join(tree, "tests", "helpers", "golden.py")):
                sys.exit(f"{base} has no tests/helpers/golden.py")
            # the base's own runner would do, but --dump is new: run the working tree's runner over the base's code
            helper = os.path.join(tree, "tests", "helpers", "golden.py")
            with open(__file__) as src, open(helper, "w") as dst:
                dst.write(src.read())
            print(f"running {len(names)} methods at {base} ...", flush=True)
            before = _dump_in(tree, {}, names)["methods"]
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", tree], cwd=ROOT, check=False)
    print(f"running {len(names)} methods in the working tree ...", flush=True)
    after = _dump_in(ROOT, {}, names)["methods"]
    changed = 0
    for n in names:
        if n not in before or n not in after:
            print(f"{n}: only {'after' if n in after else 'before'}")
            changed += 1
            continue
        diff = differences(after[n], before[n], None)
        if diff:
            changed += 1
            print(f"{n}: " + "; ".join(diff))
    print(f"{changed} of {len(names)} methods differ in their bits from {base}" if changed else
          f"all {len(names)} methods are bit-identical to {base}")
    return 1 if changed else 0


def spread(records: dict[str, dict]) -> dict[str, dict]:
    """Per method, the largest difference its float metrics show between any two settings: {'acc': absolute,
    'float': relative, 'where': which key and settings gave the larger}."""
    out = {}
    settings = list(records)
    for n in records[settings[0]]:
        worst = {"acc": (0.0, ""), "float": (0.0, "")}
        for i, s in enumerate(settings):
            for t in settings[i + 1:]:
                if n not in records[s] or n not in records[t]:
                    continue
                a, b = records[s][n]["metrics"], records[t][n]["metrics"]
                for key, x in a.items():
                    y = b.get(key)
                    if not isinstance(x, float) or not isinstance(y, float) or not math.isfinite(x + y):
                        continue
                    k = kind(key)
                    d = abs(x - y) if k == "acc" else abs(x - y) / max(abs(x), abs(y), 1e-12)
                    if d > worst[k][0]:
                        worst[k] = (d, f"{key} ({s} vs {t})")
        out[n] = {"acc": worst["acc"][0], "float": worst["float"][0],
                  "where": worst["float"][1] if worst["float"][0] else worst["acc"][1]}
    return out


FACTOR = 10  # tolerance = FACTOR x a method's measured spread, and at least FLOOR
FLOOR = {"acc": 1.5 / 360, "float": 1e-6}  # one test example of the 360; a float32 loss's last bits


def tolerance_of(measured: dict) -> dict:
    return {k: max(FACTOR * measured[k], FLOOR[k]) for k in FLOOR}


def _measure(names: list[str], extra: list[str]) -> None:
    """Every method under each of SETTINGS, each in a fresh process, and any record files in ``extra`` (records
    made on other machines: ``--dump`` output or an older golden.json); each method's spread, and its tolerance,
    into the golden file (the records themselves are left as they are)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max(1, min(len(SETTINGS), os.cpu_count() or 1))) as pool:  # one process a setting
        jobs = {s: pool.submit(_dump_in, ROOT, env, names) for s, env in SETTINGS.items()}
        records = {s: job.result()["methods"] for s, job in jobs.items()}
    for path in extra:
        with open(path) as f:
            other = json.load(f)
        label = other.get("machine", {}).get("cpu", os.path.basename(path)) if isinstance(other, dict) else path
        records[f"record {os.path.basename(path)} ({label})"] = other.get("methods", other)
    ints = sorted({f"{n}.{k}" for n in names for s in list(SETTINGS)[1:]
                   for k, v in records["native"][n]["metrics"].items()
                   if not isinstance(v, float) and v != records[s][n]["metrics"].get(k)})
    if ints:
        print("integers that differ between settings (they must not):", ints)
    measured = spread(records)
    data = load()
    data["tolerance"] = {
        "how": ("python -m tests.helpers.golden --measure [RECORD_FILE ...]: every method under each of "
                f"{', '.join(f'{s} {env}' for s, env in SETTINGS.items())}, in fresh processes on "
                f"{machine()['cpu']} ({machine()['cpu_capability']}), and the record files named; a method's "
                f"tolerance is {FACTOR}x the largest difference between any two of them, at least {FLOOR}; "
                "catches_lr_change: whether the tolerance sees method.lr changed by a factor 1.001"),
        "settings": list(records),
    }
    for n in names:
        data["methods"][n]["tolerance"] = {**tolerance_of(measured[n]), "measured": measured[n]}
        data["methods"][n]["tolerance"]["catches_lr_change"] = bool(perturbed(n, data["methods"][n]))
        t = data["methods"][n]["tolerance"]
        print(f"{n:28s} acc {measured[n]['acc']:.4f}  float {measured[n]['float']:.2e}  "
              f"{'catches' if t['catches_lr_change'] else 'MISSES '} method.lr x 1.001  ({measured[n]['where']})",
              flush=True)
    _save(data)


LR_CHANGE = 1.001


def perturbed(name: str, record: dict) -> list[str]:
    """What the off-machine comparison reports for ``name`` run with ``method.lr`` x 1.001 against ``record``: a
    method whose result really changes must fail it (empty: the tolerance is too loose to see that change)."""
    from tests.helpers.cli import make_cfg

    with tempfile.TemporaryDirectory() as d:
        lr = float(make_cfg([f"method={name}"], d).method.lr)
    got = run_method(name, (*at_its_precision(record), f"method.lr={lr * LR_CHANGE!r}"))
    return differences(got, record, {k: record["tolerance"][k] for k in FLOOR})


def main(argv: list[str]) -> None:
    args = [a for a in argv if not a.startswith("-")]
    if "--help" in argv or "-h" in argv:
        print(__doc__)
        return
    if "--dump" in argv:
        _dump(args[0], args[1:] or methods())
    elif "--write" in argv:
        _write(args or methods())
    elif "--compare" in argv:
        if not args:
            sys.exit("usage: python -m tests.helpers.golden --compare BASE_COMMIT [METHOD ...]")
        sys.exit(_compare(args[0], args[1:] or methods()))
    elif "--measure" in argv:
        files = [a for a in args if a.endswith(".json")]
        _measure([a for a in args if a not in files] or methods(), files)
    else:
        print(__doc__, file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main(sys.argv[1:])
