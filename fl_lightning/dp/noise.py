"""DPNoise: the server-side step of user-level DP, on the round's complete sums (after the cross-process all-reduce,
before every part's ``server_update``).

The Gaussian mechanism on the sum of clipped uploads (DP-FedAvg: McMahan et al., ICLR 2018, arXiv:1710.06963, Alg. 1
with the fixed-denominator estimator f̃_f): every travelling sum gets N(0, (z·C)² I), one draw over all tensors, and
its mean is the noised sum over the EXPECTED number of clients q·N (= fl.clients_per_round), not the realised weights
(which would publish the round's size and the clients' data sizes). The parts then read ``agg.mean`` / ``agg.sum`` as
always, and ``agg.num_sampled`` is the expected count too.

The noise comes from the server's own stream, a generator seeded by (seed, round) on the CPU, drawn key by key in
sorted order: the same on every process, under ``trainer.cohort=K``, and after a resume. A round nobody was sampled
in (``fl.sampling=poisson``) still releases noise: its sums are zeros of the upload's layout (remembered from the first
round that had uploads, and checkpointed). ε after each round (the accountant, :mod:`.accountant`) is the round's
``dp_epsilon`` metric; with ``dp.max_epsilon`` the run stops before the round that would pass it.
"""
from __future__ import annotations

import logging
import math
from collections.abc import Mapping

import torch
from torch import Tensor

from .. import seeding
from ..errors import ConfigError
from ..strategies.base import Aggregate, Part, ServerContext
from .clip import COUNT_KEY

log = logging.getLogger("fl_lightning")

DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)  # the layout's dtype codes


class DPNoise(Part):
    """Gaussian noise of std z·C on the round's travelling sums, divided by the expected clients (see the module)."""

    @property
    def releases_empty_rounds(self) -> bool:
        """An empty round releases noise once the upload's layout is known (before any upload: nothing to noise; the
        accountant counts the round all the same)."""
        return bool(self.layout)

    def __init__(self, mech):
        self.mech = mech  # the dp group's settings (z, C, the accountant's inputs): fl_lightning/dp/mechanism.py
        self.clip = float(mech.clip)
        self.layout: dict[str, Tensor] = {}  # upload key -> int64 [free, dtype code, *shape]
        self._free: set[str] = set()  # keys of messages that do not travel, seen at this process's clients
        self._told = False

    def setup(self, server: ServerContext) -> None:
        self.server = server

    # ------------------------------------------------------------------ client side (through DPClip)
    def current_clip(self) -> float:
        return self.clip

    def note_free(self, keys) -> None:
        self._free.update(keys)

    # ------------------------------------------------------------------ the round's sums
    def update_std(self) -> float:
        """The std of the noise on the upload's sum this round: z·C (the adaptive clip: z_Δ·C)."""
        return self.mech.noise_multiplier * self.clip

    def _learn_layout(self, agg: Aggregate) -> None:
        new = sorted(k for k in agg.keys() if k not in self.layout and k != COUNT_KEY)
        if not new:
            return
        flags = torch.tensor([1.0 if k in self._free else 0.0 for k in new], dtype=torch.float64, device=self.server.device)
        if self.server.all_reduce_sum is not None:  # a process whose clients never sent a key does not know it is free
            flags = self.server.all_reduce_sum(flags)
        for k, f in zip(new, flags.tolist()):
            t = agg.sums[k]
            self.layout[k] = torch.tensor([int(f > 0), DTYPES.index(t.dtype), *t.shape], dtype=torch.int64)
        if not self._told:
            self._told = True
            self._tell()

    def _tell(self) -> None:
        """The line at start: what is clipped (per part: tensors and values), what is not."""
        groups: dict[str, list[int]] = {}
        free = []
        for k, lay in self.layout.items():
            if lay[0]:
                free.append(k)
                continue
            g = groups.setdefault(k.split("/")[0], [0, 0])
            g[0] += 1
            g[1] += math.prod(lay[2:].tolist())
        what = "; ".join(f"{p}: {n} tensors, {v:,} values" for p, (n, v) in groups.items())
        log.info("dp: each client's whole upload (%s) is clipped to one L2 norm C and weighs 1; the noised sum is "
                 "divided by the expected clients %d (q·N), not by the realised weights%s", what,
                 self.mech.expected_clients,
                 f"; not clipped, not noised, not private (do not travel): {', '.join(free)}" if free else "")

    def aggregate(self, round_idx: int, agg: Aggregate) -> None:
        self._learn_layout(agg)
        m = self.mech.expected_clients
        if agg.num_sampled == 0:  # an empty round: zeros of the layout, to which the noise is added
            for k, lay in self.layout.items():
                agg.sums[k] = torch.zeros(lay[2:].tolist(), dtype=DTYPES[int(lay[1])], device=self.server.device)
                agg.weights[k] = 0.0
            if self.mech.adaptive:
                agg.sums[COUNT_KEY] = torch.zeros((), dtype=torch.float64, device=self.server.device)
        gen = seeding.generator(self.mech.seed, seeding.DP_NOISE, round_idx)
        std = self.update_std()
        for k in sorted(agg.sums):
            lay = self.layout.get(k)
            if k == COUNT_KEY:
                agg.sums[k] = agg.sums[k] + self.count_std() * torch.randn((), generator=gen, dtype=torch.float64).to(
                    agg.sums[k].device)
                agg.weights[k] = float(m)
            elif lay is not None and not lay[0]:
                t = agg.sums[k]
                if std > 0:
                    agg.sums[k] = t + std * torch.randn(t.shape, generator=gen, dtype=t.dtype).to(t.device)
                agg.weights[k] = float(m)
            elif agg.num_sampled == 0 and lay is not None:  # a free key in an empty round: a zero mean
                agg.weights[k] = 1.0
        if agg.num_sampled != m:  # the parts see the expected count (Poisson: the realised one is private)
            k_steps = self.server.local_steps or (agg.steps / agg.num_sampled if agg.num_sampled else 1)
            agg.num_sampled, agg.steps = m, int(round(m * k_steps))

    def count_std(self) -> float:
        return 0.0

    def server_update(self, round_idx: int, agg: Aggregate) -> dict[str, float]:
        """The round's row: ε at δ after this round (none with z = 0: ε = ∞), δ and z (calibrated or given)."""
        eps = self.mech.epsilon(round_idx + 1)
        return {**({} if eps is None else {"dp_epsilon": eps}), "dp_delta": self.mech.delta,
                "dp_noise_multiplier": self.mech.noise_multiplier}

    def round_limit(self, rounds_done: int, end: int) -> int | None:
        mech = self.mech
        if mech.max_epsilon is None:
            return None
        limit = mech.rounds_within(mech.max_epsilon)
        if limit >= end:
            return None
        nxt = mech.epsilon(limit + 1)
        if limit <= rounds_done:
            raise ConfigError("dp.max_epsilon", f"{mech.max_epsilon:g} allows {limit} rounds and this run has done "
                              f"{rounds_done}; round {rounds_done + 1} would bring ε to "
                              f"{mech.epsilon(rounds_done + 1):.4g} at δ={mech.delta:.3g}",
                              f"{'resume' if rounds_done else 'run'} with dp.max_epsilon="
                              f"{_up(mech.epsilon(rounds_done + 1))} or more")
        log.warning(f"dp: ε reaches {mech.epsilon(limit):.4g} after round {limit} (δ={mech.delta:.3g}); round "
                    f"{limit + 1} would bring it to {nxt:.4g} > dp.max_epsilon={mech.max_epsilon:g}: the run stops "
                    f"after round {limit} (resume with dp.max_epsilon={_up(nxt)} or more to go on)")
        return limit

    def state_dict(self) -> dict[str, Tensor]:
        return {f"layout/{k}": v for k, v in self.layout.items()}

    def load_state_dict(self, state: Mapping[str, Tensor]) -> None:
        self.layout = {k[len("layout/"):]: state[k].cpu() for k in state if k.startswith("layout/")}
        self._told = bool(self.layout)


def _up(x: float) -> str:
    """``x`` rounded up to 3 significant digits, as text (a bound that a fix may quote)."""
    if not math.isfinite(x):
        return str(x)
    e = math.floor(math.log10(abs(x))) - 2 if x else 0
    return f"{math.ceil(x / 10 ** e) * 10 ** e:.{max(0, -e)}f}"
