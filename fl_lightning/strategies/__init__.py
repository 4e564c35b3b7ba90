"""Federated methods as compositions of parts. ``build_strategy(cfg.method)`` instantiates one from its config:

    name: fedavg
    parts:                       # called in this order at every hook
      local_optimizer: {_target_: fl_lightning.strategies.parts.LocalOptimizer, ...}
      aggregation:     {_target_: fl_lightning.strategies.parts.ModelAverage, ...}
"""
from __future__ import annotations

from .base import Aggregate, ClientContext, Msg, Part, ServerContext, Strategy


def build_strategy(cfg) -> Strategy:
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    parts = {}
    for name, pcfg in cfg.parts.items():
        if pcfg is None:  # a part switched off by an override (method.parts.x=null)
            continue
        parts[name] = instantiate(pcfg, _recursive_=False, _convert_="none")
    extra = {k: v for k, v in OmegaConf.to_container(cfg, resolve=True).items() if k not in ("name", "parts", "grad_clip")}
    return Strategy(cfg.name, parts, grad_clip=cfg.get("grad_clip"), **extra)


__all__ = ["Aggregate", "ClientContext", "Msg", "Part", "ServerContext", "Strategy", "build_strategy"]
