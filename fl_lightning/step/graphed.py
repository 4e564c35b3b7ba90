"""``trainer.compile=graphs``: the eager local step captured once as a CUDA graph and replayed for every later step of
every client (``torch.cuda.CUDAGraph``; no compiler, so it starts in seconds).

The whole step (:class:`fl_lightning.step.local.LocalStep`: forward, backward, the parts' hooks, clipping, the
optimizer step), handed over by the one capture wrapper (:mod:`fl_lightning.step.capture`), is captured after a short warm-up of eager steps on a side stream (lazy initialisation stays out
of the graph), at the first full batch. Replaying it needs everything it reads and writes to stay the same memory
for the whole run, and no number of the step to change behind its back:

* the batch is copied into static input buffers (one multi-tensor copy); a batch of another shape (a short last
  batch) runs eagerly;
* the module's parameters are the loop's one module (each client's weights are copied into them);
* the optimizer is the run's one object with its state (and corrections) allocated once and zeroed in place for each client
  (``optim.state.allocate``, ``reset_in_place``: adapters with ``zero_is_fresh``), or no state at all (SGD without
  momentum); its step counters are device tensors (``device_steps``); its groups' numbers (learning rates, weight
  decay) are constants of the graph, so when a client brings others (an lr schedule's next round) the step is
  captured again (one capture a round, the cost of about one step);
* every part with per-step work declares its step plan (``Part.step_plan``, ``step/plan.py``): its step hooks read
  only such static tensors, sync nothing to the host and branch on no tensor's value; a host number they read is
  planned before the step (``before_step``) and declared in the plan: a step whose plan differs from the captured one (Sophia's
  refresh every τ steps, the last step of seed 003's order) runs eagerly, and a change at a client's start (a round's
  clipping thresholds) captures the step again; a number read through ``ClientContext.number`` is, while captured (``traced``), its 0-d tensor filled in
  place. tests/system/test_part_writes.py holds every part with a plan to this, and docs/usage.md lists the methods
  that replay (:func:`replay_table`).

A replay reads memory by address, so a tensor that a client brings anew instead of writing into the old one would be
read stale without a word. So at each client's start the addresses the step reads are compared with those it was
captured with (the parameters, every tensor of the optimizer's state and corrections, and every tensor of the
planned parts' own attributes and per-client round states); any change captures the step again.

Dropout draws from the default CUDA generator, which the capture registers (each replay advances its offset). Where a
method's step cannot be replayed (a part with no step plan, per-client optimizer state, a failed capture), one line
names the method and the reason, and the run goes on eagerly. Off CUDA, ``trainer.compile=graphs`` is refused when
the run is built. Graph and eager steps agree up to float order (tests/unit/step/test_graphed_step.py, on a GPU).
"""
from __future__ import annotations

import logging
from typing import Callable

import torch

from ..strategies.base import steps_inside
from .plan import planned, replay_refusal

log = logging.getLogger("fl_lightning")

WARMUP = 3  # eager steps before the capture (cuBLAS handles, autograd's streams and other lazy set-up)




def unsupported(strategy, optimizer) -> str | None:
    """Why this method's local step cannot be replayed as a CUDA graph, or None."""
    from ..optim.adapters import adapter_for

    for part in strategy.parts:
        if why := replay_refusal(part):
            return f"part {part.name!r} ({type(part).__name__}) {why}"
    if optimizer is None:
        return "no local optimizer"
    adapter = adapter_for(optimizer)
    stateless = not any(adapter.entries(p) for g in optimizer.param_groups for p in g["params"])
    if stateless:
        return None
    if not adapter.zero_is_fresh:
        return f"{type(optimizer).__name__} rebuilds its state for each client"
    if not adapter.device_steps and _has_counts(optimizer):
        return f"{type(optimizer).__name__} counts its steps on the host (a constant of a captured step)"
    return None


def _has_counts(optimizer) -> bool:
    return any("step" in st for st in optimizer.state.values())


def tensors_in(obj, out: list, depth: int = 0) -> list:
    """Every tensor in ``obj`` (a tensor, or dicts, lists, tuples and objects' attributes of them, 3 levels deep)."""
    if isinstance(obj, torch.Tensor):
        out.append(obj)
    elif depth < 3:
        if isinstance(obj, dict):
            for v in obj.values():
                tensors_in(v, out, depth + 1)
        elif isinstance(obj, (list, tuple)):
            for v in obj:
                tensors_in(v, out, depth + 1)
        elif hasattr(obj, "__dict__") and not isinstance(obj, (torch.nn.Module, torch.optim.Optimizer, type)):
            tensors_in({k: v for k, v in vars(obj).items() if k not in ("server",)}, out, depth + 1)
    return out


def addresses(client, strategy) -> list[int]:
    """The memory a replayed step reads: parameters, optimizer state and corrections, the hooked parts'
    tensors (their attributes and this client's round state)."""
    ts = list(client.params.values())
    ts += [t for t in (getattr(client, n, None) for n in ("mask", "count", "active")) if isinstance(t, torch.Tensor)]
    opt = client.optimizer
    if opt is not None:
        ts += tensors_in(list(opt.state.values()), [])
        ts += tensors_in(list(getattr(opt, "corrections", {}).values()), [])
    for part in strategy.parts:
        if steps_inside(part):
            declared = part.step_tensors(client)
            if declared is not None:
                ts += list(declared)
                continue
            ts += tensors_in(vars(part), [])
            state = getattr(client, "_states", {}).get(part.name)
            if state is not None:
                ts += tensors_in(vars(state), [])
    return [t.data_ptr() for t in ts]


class GraphedStep:
    """``step_fn(client, batch, k) -> loss`` replayed as one CUDA graph (see the module docstring); :meth:`counts`
    says how many steps were replayed, captured and run eagerly."""

    def __init__(self, step_fn: Callable, method: str = "", strategy=None, params: dict | None = None):
        self.step_fn, self.method, self.strategy, self.params = step_fn, method, strategy, params or {}
        self.graph: torch.cuda.CUDAGraph | None = None
        self.static: dict[str, torch.Tensor] | None = None
        self.loss: torch.Tensor | None = None
        self.reason: str | None = None  # set once the step is known not to replay: the run stays eager
        self.warm = 0
        self.numbers: list | None = None  # the optimizer groups' numbers the graph was captured with
        self.addresses: list[int] | None = None  # and the memory it reads (``addresses``)
        self.plan: tuple | None = None  # and the parts' planned host values (``plan``)
        self._n = {"graphs_captured": 0, "replays": 0, "eager_steps": 0}

    @staticmethod
    def _numbers(optimizer) -> list:
        return [sorted((k, v) for k, v in g.items() if isinstance(v, (bool, int, float, str, tuple)))
                for g in optimizer.param_groups]

    def _same_shapes(self, batch: dict) -> bool:
        return self.static is not None and batch.keys() == self.static.keys() and all(
            v.shape == self.static[k].shape and v.dtype == self.static[k].dtype for k, v in batch.items())

    # ------------------------------------------------------------------ the step
    def __call__(self, client, batch, k):
        if self.reason is None and k == 0 and self.graph is None:
            self.reason = unsupported(self.strategy, client.optimizer)
            if self.reason:
                log.warning("trainer.compile=graphs: %s's local step runs eagerly: %s", self.method or "the method",
                            self.reason)
        if self.reason:
            self._n["eager_steps"] += 1
            return self.step_fn(client, batch, k)
        if k == 0:  # a client's start: its counters on the device; other hyperparameters, another capture
            from .compiled import CompiledStep

            CompiledStep.steps_as_tensors(client.optimizer)
            if self.graph is not None and (self._numbers(client.optimizer) != self.numbers
                                           or addresses(client, self.strategy) != self.addresses
                                           or planned(client, self.strategy) != self.plan):
                self.graph = self.static = self.loss = None  # captured again at this step (warm already)
        if self.graph is not None and self._same_shapes(batch) and planned(client, self.strategy) == self.plan:
            torch._foreach_copy_([self.static[key] for key in batch], list(batch.values()))
            self.graph.replay()
            client.batch, client.loss = self.static, self.loss
            self._n["replays"] += 1
            return self.loss
        if self.graph is None and self.warm >= WARMUP:
            loss = self._capture(client, batch, k)
            if loss is not None:
                return loss
        return self._eager(client, batch, k)

    def _eager(self, client, batch, k):
        self._n["eager_steps"] += 1
        if self.graph is not None:
            return self.step_fn(client, batch, k)
        side = torch.cuda.Stream()  # warm-up on a side stream, as torch's CUDA-graph recipe does
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            loss = self.step_fn(client, batch, k)
        torch.cuda.current_stream().wait_stream(side)
        self.warm += 1
        return loss

    def _capture(self, client, batch, k):
        """Capture the step on static copies of ``batch`` and replay it once (the capture itself runs nothing)."""
        self.static = {key: v.clone() for key, v in batch.items()}
        graph = torch.cuda.CUDAGraph()
        self.numbers = self._numbers(client.optimizer)
        self.addresses = addresses(client, self.strategy)
        self.plan = planned(client, self.strategy)
        try:  # thread_local: a checkpoint written from another thread meanwhile does not break the capture
            client.traced = True  # planned numbers read as tensors filled in place (ClientContext.number)
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                self.loss = self.step_fn(client, self.static, k)
        except Exception as err:  # noqa: BLE001 - any failure leaves the run eager, said once
            self.reason = f"its capture failed ({type(err).__name__}: {' '.join(str(err).split())[:160]})"
            log.warning("trainer.compile=graphs: %s's local step runs eagerly: %s", self.method or "the method",
                        self.reason)
            self.static = self.loss = None
            for p in self.params.values():
                p.grad = None
            return None
        finally:
            client.traced = False
        self.graph = graph
        self._n["graphs_captured"] += 1
        graph.replay()
        self._n["replays"] += 1
        client.batch, client.loss = self.static, self.loss
        return self.loss

    def counts(self) -> dict:
        return {**self._n, "eager_reason": self.reason}

    def log_counts(self) -> dict:
        c = self.counts()
        log.info("trainer.compile=graphs: %d graph captured, %d steps replayed, %d eager%s", c["graphs_captured"],
                 c["replays"], c["eager_steps"], f" ({self.reason})" if self.reason else "")
        return c
