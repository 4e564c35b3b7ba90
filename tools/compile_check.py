"""Which methods' local step ``torch.compile`` captures whole, and where the others break.

For each method yaml (all of ``conf/method/`` by default), one client of the default digits run takes its first local
step (:class:`fl_lightning.step.local.LocalStep`: forward, backward, the parts' hooks, clipping, the
optimizer step) under ``torch._dynamo.explain``, which traces it as ``torch.compile`` would and lists the graphs
and the graph breaks with their reasons. Tracing only (no code generation), so it runs on a CPU in seconds per
method; each method in a fresh interpreter (a failed trace marks code objects as skipped for the rest of a
process, which would show up as breaks in the next method). The backward is traced into the graph
(``torch._dynamo.config.trace_autograd_ops``, torch ≥ 2.14), as ``trainer.compile`` does; ``--no-trace-backward``
shows the step as plain ``torch.compile`` sees it (``Tensor.backward()`` a break).

``--run`` also trains each method 3 rounds under a cosine lr schedule (``fl.lr_schedule=cosine``: the lr changes
between rounds) eagerly and with ``trainer.compile=step`` (backend ``aot_eager``: the capture without code
generation) and adds the largest relative difference of the global model, the compilations in round 1 (the first of
each frame and its recompiles) and those after round 1 (rounds 2-3: 0 when the step is compiled once per run) and
how many of all were recompiles.

    python tools/compile_check.py                      # every method, a markdown table on stdout
    python tools/compile_check.py --run                # and each method compiled against eager
    python tools/compile_check.py fedavg fedmuon --no-trace-backward
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
FAST = ["fl.num_clients=4", "fl.clients_per_round=2", "fl.rounds=1", "fl.local_steps=2", "trainer.progress=false",
        "trainer.accelerator=cpu", "trainer.threads=1"]


def methods() -> list[str]:
    return sorted(f[:-5] for f in os.listdir(os.path.join(ROOT, "conf", "method")) if f.endswith(".yaml"))


def build_loop(method: str, run_dir: str, extra=()):
    from hydra import compose, initialize_config_dir
    from omegaconf import open_dict

    from fl_lightning.run.build import build
    from fl_lightning.config import register

    register()
    with initialize_config_dir(config_dir=os.path.join(ROOT, "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"method={method}", *FAST, *extra])
    with open_dict(cfg):
        cfg.run_dir = run_dir
    loop = build(cfg, run_dir)
    loop.setup()
    return loop


def reason(text: str) -> str:
    """The first line of a graph break's reason, without Dynamo's hints and links."""
    first = str(text).strip().splitlines()[0]
    return re.sub(r"\s+", " ", first)[:160]


def check(method: str) -> dict:
    import torch
    import torch._dynamo as dynamo

    from fl_lightning.config import StepBudget

    with tempfile.TemporaryDirectory() as d:
        loop = build_loop(method, d)
        client = loop.start_client(0, 0, {k: m.tensor for k, m in loop.strategy.broadcast(0).items()}, 1.0)
        batch = loop.services.cast_floats(next(iter(loop.data.client_batches(0, 0, loop.device, StepBudget(steps=2)))))
        loop.strategy.before_step(client)  # the parts' decisions before the step, outside it (as train_client does)
        loop.services.eager_under_compile()  # a second backward inside the step runs eagerly, as trainer.compile has it
        dynamo.reset()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = dynamo.explain(loop.step)(client, batch, 0)
        torch.compiler.reset()
    reasons = []
    for br in out.break_reasons:
        where = br.user_stack[-1] if br.user_stack else None
        at = f" at {os.path.relpath(where.filename, ROOT) if where.filename.startswith(ROOT) else os.path.basename(where.filename)}:{where.lineno} ({where.name})" if where else ""
        r = reason(br.reason) + at
        if r not in reasons:
            reasons.append(r)
    return {"method": method, "graphs": out.graph_count, "breaks": out.graph_break_count, "reasons": reasons}


ROUNDS = 3
RUN = [f"fl.rounds={ROUNDS}", "fl.lr_schedule=cosine"]


def compiled_vs_eager(method: str) -> dict:
    """3 rounds eager and 3 with ``trainer.compile=step`` (aot_eager), under a cosine lr schedule: the largest
    relative difference of the global model (max |a-b| / max |a| over tensors), the compilations in round 1
    (``round1``) and after it (``later``: rounds 2-3), and the recompiles among all of them."""
    out = {}
    for mode in ("none", "step"):
        with tempfile.TemporaryDirectory() as d:
            loop = build_loop(method, d, [*RUN, f"trainer.compile={mode}", "trainer.compile_backend=aot_eager"])
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                for r in range(ROUNDS):
                    loop.run_round(r)
                    if mode == "step" and r == 0:
                        first = loop.client_step.counts()
            out[mode] = {k: v.detach().clone() for k, v in loop.global_params.items()}
            if mode == "step":
                counts = loop.client_step.counts()
    a, b = out["none"], out["step"]
    rel = max(float((a[k] - b[k]).abs().max() / a[k].abs().max().clamp_min(1e-12)) for k in a)
    return {"rel": rel, "round1": first["compiled_graphs"],
            "later": counts["compiled_graphs"] - first["compiled_graphs"], **counts}


def one(method: str, trace_backward: bool, run: bool = False) -> None:
    """Trace ``method`` in this interpreter and print the result as one JSON line."""
    import json
    import logging

    import torch._dynamo as dynamo

    logging.getLogger("fl_lightning").setLevel(logging.WARNING)
    dynamo.config.trace_autograd_ops = trace_backward
    try:
        r = check(method)
        if run:
            r.update(compiled_vs_eager(method))
    except Exception as err:  # a method the tracer cannot run at all: say so
        r = {"method": method, "error": reason(f"{type(err).__name__}: {err}")}
    print("RESULT " + json.dumps(r), flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("methods", nargs="*", help="method names (default: every conf/method/*.yaml)")
    ap.add_argument("--no-trace-backward", dest="trace_backward", action="store_false",
                    help="torch._dynamo.config.trace_autograd_ops = False (Tensor.backward() breaks the graph)")
    ap.add_argument("--trace-backward", dest="trace_backward", action="store_true", help=argparse.SUPPRESS)  # the child
    ap.add_argument("--run", action="store_true", help="also train 3 rounds (cosine lr) eager and compiled (aot_eager): compare, count compiles per round")
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # the child: one method, a JSON line
    args = ap.parse_args(argv)
    if args.one:
        one(args.methods[0], args.trace_backward, args.run)
        return 0
    import json
    import subprocess

    import torch

    print(f"torch {torch.__version__}, trace_autograd_ops={bool(args.trace_backward)}\n")
    if args.run:
        print("| method | graphs | graph breaks | compiled vs eager (rel.) | compiled in round 1 | compiled after round 1 "
              "| recompiles | reasons (first line each) |\n|---|---|---|---|---|---|---|---|")
    else:
        print("| method | graphs | graph breaks | reasons (first line each) |\n|---|---|---|---|")
    whole = once = 0
    names = args.methods or methods()
    for m in names:
        cmd = [sys.executable, os.path.abspath(__file__), m, "--one", "--trace-backward" if args.trace_backward else "--no-trace-backward"]
        cmd += ["--run"] if args.run else []
        p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        line = next((x for x in p.stdout.splitlines() if x.startswith("RESULT ")), None)
        r = json.loads(line[len("RESULT "):]) if line else {"error": f"exit {p.returncode}: {reason(p.stderr[-300:] or '?')}"}
        if "error" in r:
            print(f"| {m} | — | — |{' — | — | — | — |' if args.run else ''} failed: {r['error']} |", flush=True)
            continue
        whole += r["breaks"] == 0
        if args.run:
            once += r["later"] == 0
        ran = f" {r['rel']:.1e} | {r['round1']} | {r['later']} | {r['recompiles']} |" if args.run else ""
        print(f"| {m} | {r['graphs']} | {r['breaks']} |{ran} {'; '.join(r['reasons']) or 'none: one graph'} |", flush=True)
    print(f"\n{whole} of {len(names)} methods' local step is one graph")
    if args.run:
        print(f"{once} of {len(names)} methods compile nothing after round 1")
    return 0


if __name__ == "__main__":
    sys.exit(main())
