"""A method yaml's ``comm:`` formulas (bytes per sampled client and round, uplink and downlink) evaluated for the test
MLP of tests/helpers/harness.py, as tests/system/test_methods.py compares them with what a run measures."""
from __future__ import annotations

import math
import os

from fl_lightning.codecs.lowrank import svd_rank
from tests.helpers.harness import MLP, FakeData, LossModule, build, method_config, mse, regression_batches, run

# a conf folder (as given to hydra.searchpath) whose method/*.yaml are tested beside the package's: your own methods
OWN_CONF = os.environ.get("FL_METHOD_CONF")


def own_methods() -> list[str]:
    folder = os.path.join(OWN_CONF, "method") if OWN_CONF else None
    return sorted(f[:-5] for f in os.listdir(folder) if f.endswith(".yaml")) if folder else []


def config(name: str, overrides: list[str] = ()):
    """conf/method/<name>.yaml, or the one of ``$FL_METHOD_CONF``, composed with ``overrides``."""
    search = [f"hydra.searchpath=[file://{os.path.abspath(OWN_CONF)}]"] if OWN_CONF else []
    return method_config(name, [*search, *overrides])


def _sizes(cfg) -> dict[str, float]:
    """The names a yaml's ``comm`` formulas may use, for the test MLP."""
    ps = list(MLP().parameters())
    mats = [p for p in ps if p.ndim >= 2]
    vecs = [p for p in ps if p.ndim < 2]
    m_svd = 0
    for p in mats:
        rows, cols = p.shape[0], math.prod(p.shape[1:])
        r = svd_rank(rows, cols, cfg.method.get("svd_mode", "storage_frac"), float(cfg.method.get("svd_frac", 0.05)))
        m_svd += (rows * r + r + r * cols) * 4
    # nT: the number of trainable tensors (per-tensor scales of a codec, e.g. Quantize's max|v|)
    # SOAP's Kronecker factors (seed 001's Θ = {L, R}): one n×n factor per dimension of every ndim >= 2 param,
    # dense (LR) or as rank-r SVD factors of each (LR_svd)
    factors = [n for p in mats for n in p.shape]
    lr_svd = 0
    for n in factors:
        r = svd_rank(n, n, cfg.method.get("svd_mode", "storage_frac"), float(cfg.method.get("svd_frac", 0.05)))
        lr_svd += (2 * n * r + r) * 4
    return {"P": sum(p.numel() * 4 for p in ps), "M": sum(p.numel() * 4 for p in mats), "M_svd": m_svd,
            "V": sum(p.numel() * 4 for p in vecs), "nV": len(vecs), "nP": len(ps), "nT": len(ps), "LR": sum(n * n * 4 for n in factors),
            "LR_svd": lr_svd}


def _sparse(frac: float, bits_per_value: int = 32):
    """(k, bytes) summed over the test MLP's tensors for a sparsifier keeping k = ceil(frac d) values of d per
    tensor with ceil(log2 d)-bit indices, 0 for d = 1 (TopK, RandK, HeavySign's heavy part)."""
    ks = [max(1, min(p.numel(), math.ceil(frac * p.numel()))) for p in MLP().parameters()]
    ds = [p.numel() for p in MLP().parameters()]
    return sum(ks), sum(k * (bits_per_value + (math.ceil(math.log2(d)) if d > 1 else 0)) for k, d in zip(ks, ds)) / 8


def declared(cfg, direction: str, rounds: int, per_round: int, num_clients: int = 4, local_steps: int = 2) -> int:
    """The yaml's formula summed over rounds; it may use the sizes above, n (clients), S (sampled per round),
    K (local steps), r (the round), ceil, log2, sparse_bytes(frac) and sparse_k(frac) (heavy HeavySign coordinates)."""
    formula = str(cfg.method.comm[direction])
    names = {**{k: v for k, v in cfg.method.items() if k not in ("parts", "comm")}, **_sizes(cfg),
             "n": num_clients, "S": per_round, "K": local_steps, "ceil": math.ceil, "log2": math.log2,
             "sparse_bytes": lambda f: _sparse(f)[1], "sparse_k": lambda f: _sparse(f)[0]}
    return sum(per_round * eval(formula, {"__builtins__": {}}, {**names, "r": r}) for r in range(rounds))  # noqa: S307


def measured_and_declared(cfg, run_dir) -> dict[str, tuple[int, int]]:
    """{direction: (bits a 3-round run of 4 clients, 2 a round, 2 local steps measured, bits the yaml declares)}."""
    rounds, s = 3, 2
    loop = run(build(cfg), LossModule(MLP(), mse), FakeData(regression_batches(4), 4), run_dir,
               num_clients=4, per_round=s, rounds=rounds, local_steps=2)
    return {d: (loop.recorder.totals[f"{d}_bits"], 8 * declared(cfg, d, rounds, s)) for d in ("uplink", "downlink")}
