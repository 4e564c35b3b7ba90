"""The table in docs/usage.md of which methods' local steps replay under ``trainer.compile=graphs``, and why the others
do not, made from the declarations (``Part.step_plan`` read by ``step/plan.py``, the optimizer's adapter:
``step.graphed.unsupported``). ``python3 -m tests.helpers.graph_table`` rewrites it; a test checks it matches."""
from __future__ import annotations

import os
import sys
import tempfile

from tests.helpers.cli import CONF, ROOT, build_loop

USAGE = os.path.join(ROOT, "docs", "usage.md")
BEGIN, END = "<!-- graph-table: made by python3 -m tests.helpers.graph_table -->", "<!-- graph-table end -->"
BASE = ["fl.num_clients=4", "fl.clients_per_round=2", "fl.rounds=1", "fl.local_steps=2", "trainer.progress=false",
        "trainer.accelerator=cpu"]


def method_row(method: str, run_dir) -> tuple[str, str]:
    """(whether ``method``'s step replays, the reason or the steps it runs eagerly)."""
    from fl_lightning.step.graphed import unsupported
    from fl_lightning.strategies.base import steps_inside

    loop = build_loop([f"method={method}", *BASE], run_dir)
    received = {k: m.tensor for k, m in loop.strategy.broadcast(0).items()}
    client = loop.start_client(loop.owned[0], 0, received, 1.0)
    reason = unsupported(loop.strategy, client.optimizer)
    if reason:
        return "no", reason
    planned = [f"`{p.name}.{f}`" for p in loop.strategy.parts if steps_inside(p) for f in (p.step_plan or ())]
    return "yes", (f"eager at a step whose {', '.join(planned)} is not the captured step's" if planned else "")


def table() -> str:
    methods = sorted(f[:-5] for f in os.listdir(os.path.join(CONF, "method")) if f.endswith(".yaml"))
    lines = ["| method | replays | why not, or the steps that run eagerly |", "| --- | --- | --- |"]
    with tempfile.TemporaryDirectory() as tmp:
        for m in methods:
            ok, why = method_row(m, os.path.join(tmp, m))
            lines.append(f"| {m} | {ok} | {why} |")
    return "\n".join([BEGIN, *lines, END])


def current() -> str:
    text = open(USAGE).read()
    i, j = text.index(BEGIN), text.index(END) + len(END)
    return text[i:j]


if __name__ == "__main__":
    if sys.argv[1:]:  # --help (or anything): the usage, nothing rewritten
        print(f"usage: python3 -m tests.helpers.graph_table   (no arguments)\n\n{__doc__}")
        sys.exit(0 if sys.argv[1] in ("-h", "--help") else 2)
    new = table()
    text = open(USAGE).read()
    text = text.replace(current(), new)
    open(USAGE, "w").write(text)
    sys.stdout.write(new + "\n")
