"""Re-record Flower's global models for tests/unit/strategies/test_server_opt_flower.py (its fixture,
tests/fixtures/flower_server_opt.json): FedAdam, FedYogi and FedAvgM on the test's two-client quadratic, every round.

flwr is no dependency of this project (flwr 1.42 needs SQLAlchemy >= 2, the dev extra's Optuna sweeper SQLAlchemy
< 2), so run this from a throwaway venv that sees the project's environment:

    python -m venv --system-site-packages /tmp/flwr && /tmp/flwr/bin/pip install flwr
    /tmp/flwr/bin/python tools/record_flower.py             # writes the fixture
    /tmp/flwr/bin/python -m pytest tests/unit/strategies/test_server_opt_flower.py   # the live test runs too

A changed recording is a change of Flower's (or of the test's problem): say which in the commit message.
"""
from __future__ import annotations

import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main() -> None:
    sys.path.insert(0, ROOT)
    try:
        import flwr
    except ModuleNotFoundError:
        print("error: tools/record_flower.py needs flwr, which is no dependency of this project; fix: run it from "
              "the throwaway venv in its --help (python -m venv --system-site-packages /tmp/flwr && "
              "/tmp/flwr/bin/pip install flwr)", file=sys.stderr)
        sys.exit(2)
    import numpy as np

    from tests.unit.strategies import test_server_opt_flower as t

    rec = {
        "about": "Flower's global model after each round (tools/record_flower.py); read by "
                 "tests/unit/strategies/test_server_opt_flower.py",
        "flwr": flwr.__version__, "numpy": np.__version__,
        "problem": t.problem(),
        "cases": {name: {"strategy": c["strategy"], "kwargs": c["kwargs"], "round_offset": c["round_offset"],
                         "trajectory": t.flower_trajectory(name)} for name, c in t.CASES.items()},
    }
    os.makedirs(os.path.dirname(t.FIXTURE), exist_ok=True)
    text = json.dumps(rec, indent=1)  # floats as repr: they read back bit for bit
    text = re.sub(r"\[\s+([^\[\]]*?)\s+\]", lambda m: "[" + re.sub(r"\s+", " ", m.group(1)) + "]",
                  text)  # one vector a line
    with open(t.FIXTURE, "w") as f:
        f.write(text + "\n")
    print(f"wrote {os.path.normpath(t.FIXTURE)} (flwr {flwr.__version__}, {len(t.CASES)} strategies, "
          f"{t.ROUNDS} rounds)")


if __name__ == "__main__":
    import argparse

    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    main()
