"""Federated methods as compositions of parts. ``build_strategy(cfg.method)`` instantiates one from its config:

    name: fedavg
    parts:                       # called in this order at every hook
      local_optimizer: {_target_: fl_lightning.strategies.parts.LocalOptimizer, optimizer: ${optimizer}, ...}
      aggregation:     {_target_: fl_lightning.strategies.parts.ModelAverage, ...}

Each part is built by Hydra's recursive instantiation (``fl_lightning.config.compose.instantiate``): nested ``_target_``
nodes arrive as ready objects, ``_partial_: true`` nodes as factories (an optimizer class waiting for its params),
so parts never import Hydra. A bad value anywhere in a part's tree is a one-line error naming its full key.
"""
from __future__ import annotations

from omegaconf import OmegaConf

from ..config import root_of, instantiate, qualify
from ..config import check_parts
from ..errors import ConfigError
from .base import Aggregate, ClientContext, Msg, Part, ServerContext, Strategy
from .round_state import RoundState, own, rows, shared


def build_strategy(cfg, key: str = "method", checked: bool = False) -> Strategy:
    if not checked:  # the run's check (config.check_run) covers it; a node built on its own is checked here
        check_parts(cfg, key)  # a node without a _target_ (+method.parts.nosuch.x=1): one line naming the parts
    parts = {}
    for name, pcfg in cfg.parts.items():
        if pcfg is None:  # a part switched off by an override (method.parts.x=null)
            continue
        if not OmegaConf.is_dict(pcfg):
            raise ConfigError(f"{key}.parts.{name}", f"expected a part (a node with a _target_), got {pcfg!r}",
                              f"set {key}.parts.{name}=null to switch it off, or leave the method's own")
        part = instantiate(pcfg, f"{key}.parts.{name}")
        if not isinstance(part, Part):
            raise ConfigError(f"{key}.parts.{name}._target_", f"built a {type(part).__name__}, not a strategy part",
                              "set it to a Part subclass (fl_lightning.strategies.parts, or your own subclass of "
                              "fl_lightning.strategies.Part)")
        part.config_key = f"{key}.parts.{name}"
        parts[name] = part
    for name, part in parts.items():  # a part that reads another part's state names it (FedSMU-M's momentum_of)
        for arg, other in part.reads_parts().items():
            if other not in parts:
                raise qualify(ConfigError(arg, f"names no part of this method ({other!r})",
                                          f"use one of {', '.join(parts)} (e.g. aggregation)"),
                              f"{key}.parts.{name}", root_of(cfg))
        if part.reads_parts():
            part.link({arg: parts[other] for arg, other in part.reads_parts().items()})
    return Strategy(cfg.name, parts, grad_clip=cfg.get("grad_clip"))


__all__ = ["Aggregate", "ClientContext", "Msg", "Part", "RoundState", "ServerContext", "Strategy", "build_strategy", "own",
           "rows", "shared"]
