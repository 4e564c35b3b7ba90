"""What a CNN run imports: ``train.py`` in a fresh interpreter, then its ``sys.modules``. A CNN run needs neither the
Hugging Face stack (transformers, peft, datasets, flwr_datasets) nor matplotlib nor lightning.pytorch (the Trainer side of Lightning; the run
uses Fabric alone): importing them cost most of the start-up (docs/benchmarks.md, W2). A wrapper or a logger that
needs one of them imports it itself, shown by the last test. Not timed: only which modules were loaded."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers.cli import FAST, ROOT

HEAVY = ("transformers", "peft", "matplotlib", "lightning.pytorch", "torchmetrics", "datasets", "flwr_datasets")

# train.py as `python train.py ARGS` runs it, then the heavy modules it left in sys.modules (one JSON line)
_PROBE = """
import json, runpy, sys
sys.argv = sys.argv[1:]
code = 0
try:
    runpy.run_path("train.py", run_name="__main__")
except SystemExit as stop:
    code = stop.code or 0
print("PROBE " + json.dumps({"code": code, "loaded": [m for m in %r if m in sys.modules]}))
""" % (HEAVY,)


def _probe(args: list[str]) -> dict:
    p = subprocess.run([sys.executable, "-c", _PROBE, "train.py", *args], capture_output=True, text=True, cwd=ROOT,
                       timeout=600)
    line = next((ln for ln in p.stdout.splitlines() if ln.startswith("PROBE ")), None)
    assert line is not None, (p.returncode, p.stdout[-2000:], p.stderr[-3000:])
    out = json.loads(line[len("PROBE "):])
    assert out["code"] == 0, p.stderr[-3000:]
    return out


@pytest.mark.slow
@pytest.mark.parametrize("model", [[], ["model=cnn_fedavg", "model.net.padding=2"]], ids=["cnn", "cnn_fedavg"])
def test_a_cnn_run_imports_no_text_plot_or_trainer_stack(tmp_path, model):
    out = _probe([*FAST, "fl.rounds=1", *model, f"hydra.run.dir={tmp_path}"])
    assert out["loaded"] == [], f"a CNN run imported {out['loaded']}"


@pytest.mark.slow
def test_lightning_names_still_resolve_after_a_run():
    """After the run's ``lightning`` package (fl_lightning._compat.lazy_lightning), ``lightning.LightningModule`` and
    friends import lightning.pytorch on first use, as ``import lightning`` would have."""
    code = ("import sys\n"
            "from fl_lightning._compat import import_fabric\n"
            "fabric = import_fabric()\n"
            "assert 'lightning.pytorch' not in sys.modules and 'torchmetrics' not in sys.modules\n"
            "import lightning, lightning.pytorch as pl\n"
            "from lightning.fabric.utilities import imports\n"
            "assert bool(imports._TORCHMETRICS_GREATER_EQUAL_1_0_0)\n"
            "assert lightning.LightningModule is pl.LightningModule and lightning.Fabric is fabric.Fabric\n"
            "assert lightning.Trainer is pl.Trainer and lightning.__version__ == pl.__version__\n"
            "print('ok')\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stderr[-3000:]
