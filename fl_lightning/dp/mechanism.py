"""The ``dp`` config group's targets: user-level central DP settings, checked, and the parts they add to a method.

``dp=central`` (:class:`CentralDP`): each client's whole upload clipped to C (:class:`~.clip.DPClip`), Gaussian noise
of std z·C on the round's sum (:class:`~.noise.DPNoise`); DP-FedAvg (McMahan, Ramage, Talwar & Zhang, ICLR 2018,
arXiv:1710.06963). z is ``dp.noise_multiplier``, or calibrated for ``dp.target_epsilon`` at ``dp.delta`` over the
run's rounds and sampling (:func:`.accountant.calibrate`). ``dp=central_adaptive`` (:class:`AdaptiveCentralDP`): C
follows a quantile of the clients' upload norms (Andrew et al., NeurIPS 2021, arXiv:1905.03871; :mod:`.adaptive`).

A protected unit is one client's whole data set (user-level DP): neighbouring runs differ in one client's data
(add/remove one client under ``fl.sampling=poisson``, replace one under ``fixed``). Refused: methods whose upload is
encoded before it is summed (sign, top-k, random-k, α-bit and Lion codecs, error feedback over them): clipping their
reconstruction would change the method, and the server sums codes, not floats.
"""
from __future__ import annotations

import logging
import math
from typing import Annotated, Optional

from ..config import OneOf, Range, Validate, instantiate
from ..errors import ConfigError
from . import accountant as acc

log = logging.getLogger("fl_lightning")

SUMMED_AS_FLOATS = ("Dense", "LowRankSVD", "Clamp")  # codecs whose reconstruction the server sums as floats


def codecs_of(obj):
    """The codecs (objects with ``encode``) among ``obj``'s attributes, lists and dicts (not inside those codecs)."""
    for v in (vars(obj).values() if hasattr(obj, "__dict__") else ()):
        for item in (v if isinstance(v, (list, tuple)) else v.values() if isinstance(v, dict) else (v,)):
            if callable(getattr(item, "encode", None)) and not isinstance(item, (type, str, bytes)):
                yield item


def codec_name(codec, depth: int = 0) -> str:
    """``LionMomentum(Sign)``: a codec with the codecs it wraps (4 levels at most)."""
    inner = [codec_name(c, depth + 1) for c in codecs_of(codec)] if depth < 4 else []
    return type(codec).__name__ + (f"({', '.join(inner)})" if inner else "")


def summed_as_floats(codec, depth: int = 0) -> bool:
    """Whether the server sums ``codec``'s reconstruction as floats, and every codec it wraps does (4 levels)."""
    ok = type(codec).__name__ in SUMMED_AS_FLOATS or getattr(codec, "summed_as_floats", False)
    return ok and (depth >= 4 or all(summed_as_floats(c, depth + 1) for c in codecs_of(codec)))


def refused_codec(strategy) -> tuple[str, str] | None:
    """``(part's config key, codec)`` of the first codec (or one it wraps) whose upload is not summed as floats (a
    codec of one's own may say ``summed_as_floats = True``), or None."""
    for p in strategy.parts:
        for c in codecs_of(p):
            if not summed_as_floats(c):
                return p.config_key or p.name, codec_name(c)
    return None


def attach_dp(cfg, strategy, num_clients: int) -> None:
    """The run's ``dp`` group (conf/dp/): its clip and noise parts appended to the method's, for the run's clients,
    rounds, sampling and seed; ``dp: null`` (dp=none) adds nothing."""
    if cfg.get("dp") is None:
        return
    dp = instantiate(cfg.dp, "dp", num_clients=int(num_clients), clients_per_round=int(cfg.fl.clients_per_round),
                     rounds=int(cfg.fl.rounds), sampling=str(cfg.fl.sampling), seed=int(cfg.seed))
    dp.attach(strategy)


def budget_with_noise(max_epsilon, noise_multiplier) -> bool:
    """A privacy budget needs noise: with z = 0 one round spends ε = ∞."""
    return max_epsilon is None or noise_multiplier is None or float(noise_multiplier) != 0


BUDGET = Validate(budget_with_noise, "a budget with dp.noise_multiplier=0, which spends ε = ∞ in one round",
                  "set dp.max_epsilon=null, or a noise multiplier, e.g. dp.noise_multiplier=1.0")

# the dp group's keys, shared by both mechanisms' signatures (read as the keys' ranges: fl_lightning/config/ranges.py)
Clip = Annotated[float, Range(0, open_low=True)]  # C, the bound on the whole upload's L2 norm
NoiseMultiplier = Annotated[Optional[float], Range(0)]  # z (null: calibrated for target_epsilon)
TargetEpsilon = Annotated[Optional[float], Range(0, open_low=True)]
Delta = Annotated[Optional[float], Range(0, 1, open_low=True, open_high=True, example=1e-5)]  # below 1/N
MaxEpsilon = Annotated[Optional[float], Range(0, open_low=True), BUDGET]
Accountant = Annotated[str, OneOf(*acc.ACCOUNTANTS)]


class CentralDP:
    """``dp=central``: clip the whole upload to ``clip``, add N(0, (z·clip)²) to the round's sum (see the module)."""

    adaptive = False

    def __init__(self, clip: Clip = 1.0, noise_multiplier: NoiseMultiplier = None,
                 target_epsilon: TargetEpsilon = None, delta: Delta = None, max_epsilon: MaxEpsilon = None,
                 accountant: Accountant = "pld", *,
                 num_clients: int = 1, clients_per_round: int = 1, rounds: int = 1, sampling: str = "fixed",
                 seed: int = 0):
        self.clip, self.max_epsilon, self.accountant = float(clip), max_epsilon, accountant
        self.num_clients, self.expected_clients, self.rounds = int(num_clients), int(clients_per_round), int(rounds)
        self.sampling, self.seed = sampling, int(seed)
        bound = 1.0 / self.num_clients
        if delta is not None and delta >= bound:
            raise ConfigError("delta", f"{delta:g} is not below 1/fl.num_clients = {bound:.4g} (a δ that large allows "
                              "publishing one client's data whole)", f"set dp.delta=null (1/N^1.1 = "
                              f"{self.num_clients ** -1.1:.3g}) or a value below {bound:.4g}")
        self.delta = float(delta) if delta is not None else self.num_clients ** -1.1
        self.delta_stated = delta is None
        if (noise_multiplier is None) == (target_epsilon is None):
            both = noise_multiplier is not None
            raise ConfigError("target_epsilon" if both else "noise_multiplier",
                              "set together with dp.noise_multiplier" if both else
                              "neither dp.noise_multiplier nor dp.target_epsilon is set",
                              "set dp.noise_multiplier=null to calibrate z for dp.target_epsilon" if both else
                              "set dp.target_epsilon=8 (z calibrated) or dp.noise_multiplier=1.0")
        self.target_epsilon = target_epsilon
        self.noise_multiplier = float(noise_multiplier) if noise_multiplier is not None else self._calibrate(target_epsilon)

    def _args(self) -> tuple:
        return (self.delta, self.num_clients, self.expected_clients, self.sampling, self.accountant)

    def epsilon(self, rounds: int, z: float | None = None) -> float | None:
        """ε at δ after ``rounds`` rounds (None: z = 0, no privacy)."""
        z = self.noise_multiplier if z is None else z
        if z <= 0:
            return None
        d, n, s, samp, kind = self._args()
        return acc.epsilon(z, rounds, d, n, s, samp, kind)

    def rounds_within(self, max_epsilon: float) -> int:
        if self.noise_multiplier <= 0:
            return 0
        d, n, s, samp, kind = self._args()
        return acc.rounds_within(max_epsilon, self.noise_multiplier, self.rounds, d, n, s, samp, kind)

    def _calibrate(self, target: float) -> float:
        d, n, s, samp, kind = self._args()
        z = acc.calibrate(target, self.rounds, d, n, s, samp, kind)
        if z is None:
            floor = acc.epsilon(acc.Z_MAX, self.rounds, d, n, s, samp, kind)
            from .noise import _up

            raise ConfigError("target_epsilon", f"{target:g} is reached by no noise multiplier up to {acc.Z_MAX:g} over "
                              f"{self.rounds} rounds at δ={d:.3g} (ε = {floor:.4g} at z={acc.Z_MAX:g})",
                              f"set dp.target_epsilon={_up(floor)} or more, or fewer fl.rounds")
        return z

    def describe(self) -> str:
        """The accounting in words: sampling, neighbours, accountant."""
        kind = acc.which(self.accountant, self.sampling)
        if self.sampling == "poisson":
            how = (f"Poisson sampling, q = {self.expected_clients}/{self.num_clients}, add/remove-one neighbours, "
                   f"{kind.upper()} accountant")
        else:
            how = (f"fixed-size sampling of {self.expected_clients} of {self.num_clients} without replacement, "
                   "replace-one neighbours, RDP accountant" + (" (PLD does not take this sampling)"
                                                               if self.accountant == "pld" else ""))
        return how

    def parts(self) -> dict:
        from .clip import DPClip
        from .noise import DPNoise

        noise = DPNoise(self)
        return {"dp_clip": DPClip(noise), "dp_noise": noise}

    def attach(self, strategy) -> None:
        """Refuse a method whose upload is encoded before it is summed, add the clip and noise parts, say what they
        do (the lines at start)."""
        bad = refused_codec(strategy)
        if bad is not None:
            raise ConfigError("dp", f"method {strategy.name!r} uploads through the {bad[1]} codec ({bad[0]}), which is "
                              "not summed as floats: clipping and noising its reconstruction is not that method",
                              "use a method whose upload is dense, e.g. method=fedavg (this one runs without DP only)")
        strategy.add_parts(self.parts())
        self.tell()

    def tell(self) -> None:
        d = f"δ={self.delta:.3g}" + (f" (1/N^1.1, N={self.num_clients})" if self.delta_stated else "")
        z = (f"z={self.noise_multiplier:.4g} calibrated for ε={self.target_epsilon:g}" if self.target_epsilon is not None
             else f"z={self.noise_multiplier:g}")
        total = self.epsilon(self.rounds)
        log.info("dp: C=%g, %s, noise std z·C on the round's sum; every sampled client weighs the same (the noised sum "
                 "over the expected %d clients, not the realised weights); %s; ε after %d rounds = %s at %s", self.clip,
                 z, self.expected_clients, self.describe(), self.rounds,
                 "inf (z=0: no privacy)" if total is None else f"{total:.4g}", d)


class AdaptiveCentralDP(CentralDP):
    """``dp=central_adaptive``: C starts at ``clip`` and moves geometrically toward the ``target_quantile`` of the
    clients' upload norms, ``C ← C·exp(−clip_lr (b̃ − target_quantile))``, b̃ the noised fraction of clients under C
    (Andrew et al., NeurIPS 2021, arXiv:1905.03871, Alg. 1 and Sec. 3: γ = 0.5, η_C = 0.2, σ_b = m/20 their
    defaults; σ_b is at least z here, see below). z is the whole round's (the update and the count together): the update's own multiplier is
    z_Δ = (z⁻² − (2σ_b)⁻²)^(−1/2), so the accounting is that of one Gaussian with z."""

    adaptive = True

    def __init__(self, clip: Clip = 0.1, noise_multiplier: NoiseMultiplier = None,
                 target_epsilon: TargetEpsilon = None, delta: Delta = None, max_epsilon: MaxEpsilon = None,
                 accountant: Accountant = "pld",
                 target_quantile: Annotated[float, Range(0, 1)] = 0.5,
                 clip_lr: Annotated[float, Range(0, open_low=True)] = 0.2,
                 count_noise: Annotated[Optional[float], Range(0, open_low=True)] = None, *, num_clients: int = 1,
                 clients_per_round: int = 1, rounds: int = 1, sampling: str = "fixed", seed: int = 0):
        super().__init__(clip, noise_multiplier, target_epsilon, delta, max_epsilon, accountant, num_clients=num_clients,
                         clients_per_round=clients_per_round, rounds=rounds, sampling=sampling, seed=seed)
        self.target_quantile, self.clip_lr = float(target_quantile), float(clip_lr)
        # Andrew et al.'s m/20, raised to z where a small federation's m/20 would leave the update (almost) no
        # privacy budget: then z_Δ ≤ z/√(3/4), the update's noise at most 15.5% above z·C
        self.count_noise = float(count_noise) if count_noise is not None else max(self.expected_clients / 20,
                                                                                  self.noise_multiplier)
        z, sb = self.noise_multiplier, self.count_noise
        if z > 0 and z >= 2 * sb:
            raise ConfigError("count_noise", f"σ_b = {sb:g} leaves no privacy for the update: z = {z:.4g} needs "
                              f"2σ_b > z", f"set dp.count_noise={_ceil2(z / 2 * 1.5)} (or more)")
        self.update_noise = 0.0 if z == 0 else (z ** -2 - (2 * sb) ** -2) ** -0.5

    def parts(self) -> dict:
        from .adaptive import AdaptiveNoise
        from .clip import DPClip

        noise = AdaptiveNoise(self)
        return {"dp_clip": DPClip(noise, adaptive=True), "dp_noise": noise}

    def tell(self) -> None:
        super().tell()
        log.info("dp: adaptive clip (Andrew et al. 2021): C from %g toward the %g quantile of the upload norms "
                 "(η_C=%g), count noise σ_b=%g, the update's z_Δ=%.4g", self.clip, self.target_quantile, self.clip_lr,
                 self.count_noise, self.update_noise)


def _ceil2(x: float) -> str:
    return f"{math.ceil(x * 100) / 100:g}"
