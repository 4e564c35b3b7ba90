"""Golden digests: every method yaml's result after 2 rounds of the default digits run with 1 thread, recorded once
and required bit-identical afterwards (tests/fidelity/test_golden.py). A refactor must not change them; a change is
a named bug fix (in the commit message and docs/decisions.md) and re-recorded with

    python -m tests.helpers.golden --write            # all methods
    python -m tests.helpers.golden --write fedavg     # some

The digest is SHA-256 over the global weights and the strategy's server state (names, dtypes, shapes, bytes, in
sorted order); the metrics are the run summary's numbers (losses, accuracy, exact bit counts), compared exactly.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GOLDEN = os.path.join(ROOT, "tests", "fidelity", "golden.json")
ROUNDS = 2
OVERRIDES = [f"fl.rounds={ROUNDS}", "trainer.threads=1", "trainer.progress=false", "trainer.accelerator=cpu"]
SKIP_SUMMARY = {"wall_s", "run_dir", "config_hash", "loop_start_unix", "first_client_unix",
                "round_end_unix"}  # where, when, how long


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


def run_method(name: str) -> dict:
    """``python train.py method=<name> fl.rounds=2 trainer.threads=1`` in this process: its digest and metrics."""
    import torch

    from tests.helpers.cli import build_loop

    threads = torch.get_num_threads()
    try:
        with tempfile.TemporaryDirectory() as d:
            loop = build_loop([f"method={name}", *OVERRIDES], d)
            torch.set_num_threads(1)
            summary = loop.run(progress_enabled=False)
            state = {f"global/{k}": v for k, v in loop.global_params.items()}
            state.update({f"server/{k}": v for k, v in loop.strategy.state_dict().items()
                          if isinstance(v, torch.Tensor)})
            metrics = {k: v for k, v in summary.items() if k not in SKIP_SUMMARY and isinstance(v, (int, float, str))}
            return {"digest": digest(state), "metrics": metrics}
    finally:
        torch.set_num_threads(threads)


def load() -> dict:
    with open(GOLDEN) as f:
        return json.load(f)


def main(argv: list[str]) -> None:
    if "--write" not in argv:
        sys.exit("usage: python -m tests.helpers.golden --write [METHOD ...]")
    names = [a for a in argv if not a.startswith("-")] or methods()
    out = load() if os.path.exists(GOLDEN) and names != methods() else {}
    for n in names:
        out[n] = run_method(n)
        print(n, out[n]["digest"][:16], out[n]["metrics"].get("final"), flush=True)
    out = {k: out[k] for k in sorted(out)}
    with open(GOLDEN, "w") as f:
        json.dump(out, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main(sys.argv[1:])
