"""Run directories as the trainer leaves them (``config.yaml``, ``metrics.csv``, ``summary.json``), written without
training, for the report's tests (tests/unit/test_report*.py)."""
from __future__ import annotations

import json

from omegaconf import OmegaConf


def fake_run(path, label, seed, finals, finished=True, summary=True, paper=None, error=None):
    """A run whose primary metric is ``grad_norm`` (minimised), one row per round ending at ``finals[-1]``, with its
    summary.json (``finished``; an ``error`` as a non-finite loss leaves) or none."""
    path.mkdir(parents=True)
    cfg = {"seed": seed, "label": label, "method": {"name": "fedavg"}, "fl": {"rounds": 3}}
    if paper:
        cfg["paper"] = paper
    OmegaConf.save(OmegaConf.create(cfg), path / "config.yaml")
    with open(path / "metrics.csv", "w") as f:
        f.write("round,grad_norm,uplink_mb,downlink_mb,wall_s\n")
        for i, g in enumerate(finals):
            f.write(f"{i + 1},{g},{i + 1},{2 * (i + 1)},{i + 0.5}\n")
    if summary:
        s = {"primary_metric": "grad_norm", "primary_mode": "min", "finished": finished, "rounds_done": len(finals)}
        if error:
            s["error"] = error
        (path / "summary.json").write_text(json.dumps(s))


def fake_sweep_run(path, method, alpha, seed, accs, paper, data="digits", model="cnn", lr=0.1, losses=None,
                   extra=None):
    """A classifier's run: ``test_acc`` (primary, maximised) per round, and ``train_loss`` when ``losses`` is given;
    ``extra``: more config (nested dicts)."""
    path.mkdir(parents=True)
    cfg = {"seed": seed, "method": {"name": method, "lr": lr}, "fl": {"rounds": len(accs)}, "model": {"name": model},
           "data": {"name": data, "partition": {"name": "dirichlet", "alpha": alpha}}, "paper": paper}
    cfg = OmegaConf.merge(OmegaConf.create(cfg), OmegaConf.create(extra or {}))
    OmegaConf.save(cfg, path / "config.yaml")
    with open(path / "metrics.csv", "w") as f:
        if losses is None:
            f.write("round,test_acc\n" + "".join(f"{i + 1},{a}\n" for i, a in enumerate(accs)))
        else:
            f.write("round,train_loss,test_acc\n"
                    + "".join(f"{i + 1},{l},{a}\n" for i, (l, a) in enumerate(zip(losses, accs))))
    (path / "summary.json").write_text(json.dumps({"primary_metric": "test_acc", "primary_mode": "max",
                                                  "finished": True, "rounds_done": len(accs)}))
