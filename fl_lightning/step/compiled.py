"""``trainer.compile``: the local step through ``torch.compile``, compiled once per run and reused by every client.

The step (:class:`fl_lightning.step.local.LocalStep`: forward, backward, the parts' ``after_backward``, clipping, the
optimizer step, the parts' ``after_step``) is handed to ``torch.compile`` whole by the one capture wrapper
(:mod:`fl_lightning.step.capture`). Dynamo traces the
backward into the graph (``torch._dynamo.config.trace_autograd_ops``, torch ≥ 2.14), so the graphs break only where the
step leaves tensor code: ``torch.optim``'s deliberate break before an optimizer's step (it keeps the update an in-place
inference graph), ``zero_grad``, and a few parts' Python (``python tools/compile_check.py`` lists them per method). It
is reused by every client because what it guards on stays the same objects for the whole run: the one module the
clients' states are copied into (the loop), and one optimizer object reset in place for each client
(:func:`fl_lightning.optim.state.reset_in_place`). Numbers that change between clients and steps (step counters, a short
last batch's size) become symbolic after their first change (Dynamo's automatic dynamic shapes): one recompile per run
each, not one per client or step; under ``fl.local_epochs`` a pass's short last batch has any size, so the batch
dimension is symbolic from the first step (``maybe_mark_dynamic``). Under an lr schedule the groups' learning rates
enter as 0-d tensors, and a part's own scheduled factor is a tensor it makes outside the step (GlobalAlignment's η_r·α,
used under ``torch.compiler.is_compiling()``; the eager arithmetic is unchanged).

``step``: the backend's code (``trainer.compile_backend``, inductor by default); compiled and eager runs agree up to
float summation order (tests/system/test_compile.py), not bit for bit. ``graphs`` is the eager step captured as a CUDA
graph, with no compiler: :mod:`fl_lightning.step.graphed`.
"""
from __future__ import annotations

import logging
from typing import Callable

from ..optim.adapters import adapter_for

log = logging.getLogger("fl_lightning")

_CURRENT: "CompiledStep | None" = None  # the compiled step whose calls count the compilations Dynamo starts


def _on_compile(args) -> None:
    step = _CURRENT
    if step is not None and step._active and args.callback_trigger.name == "DYNAMO":
        step._ids.add(str(args.compile_id).split("_")[0])  # "frame/compile" (a retried attempt counts once)


class CompiledStep:
    """``step_fn(client, batch, k) -> loss`` compiled (``mode``: step); :meth:`counts` says how many graphs were
    compiled and how many of them were recompiles (a guard of an earlier graph failed), :meth:`log_counts` logs it
    once."""

    def __init__(self, step_fn: Callable, mode: str, backend: str = "inductor", lr_tensors: bool = False,
                 dynamic_batch: bool = False):
        import torch
        import torch._dynamo.callback as callback

        if mode != "step":
            raise ValueError(f"compile mode {mode!r}: CompiledStep compiles mode 'step' (graphs: GraphedStep)")
        self.mode, self.backend, self.lr_tensors, self.dynamic_batch = mode, backend, lr_tensors, dynamic_batch
        self._ids: set[str] = set()
        self._active = False
        # One compiled step per process: Dynamo's caches are per code object (LocalStep.__call__), so a second
        # loop in the same process (a test, a notebook) would find the first one's entries, fail their guards and,
        # past torch's recompile limit, fall back to eager without a word. A run starts from empty caches.
        torch._dynamo.reset()
        self.cache = compile_cache()
        self._cache0 = self._cache_counts()
        self._step_fn, self._fn = step_fn, torch.compile(step_fn, backend=backend)
        self._dynamo, self._torch = torch._dynamo, torch
        global _CURRENT
        _CURRENT = self  # one callback per process, counting for the newest compiled step (reset() drops callbacks)
        if _on_compile not in callback.callback_handler.start_callbacks:
            callback.callback_handler.register_start_callback(_on_compile)

    @staticmethod
    def _lr_tensors(optimizer) -> None:
        """Each group's ``*lr`` number as a 0-d float64 tensor on its parameters' device (a number a part or the
        schedule put there since the last step). A float is a constant of the graph, recompiled for every new value:
        under a schedule that is every round, so a run whose lr changes between rounds (``lr_tensors``) passes it as
        a tensor, an input of the graph. A constant lr stays a float: the update is then the eager arithmetic
        exactly (a tensor lr multiplies, then adds: one more rounding, which SOAP's eigenbases at rank-deficient
        early factors can turn into another basis). The optimizers take either (fl_lightning/optim/scalars.py)."""
        if optimizer is None:
            return
        import torch

        for g in optimizer.param_groups:
            for key, v in g.items():
                if key.endswith("lr") and isinstance(v, (int, float)) and not isinstance(v, bool) and g["params"]:
                    g[key] = torch.tensor(float(v), dtype=torch.float64, device=g["params"][0].device)

    @staticmethod
    def steps_as_tensors(optimizer) -> None:
        """Each Python-number ``step`` counter of the optimizer's state as a 0-d float32 tensor on its parameter's
        device, for the optimizers whose adapter allows it (``device_steps``: Muon's AdamW group, Sophia, SOAP, whose
        branches on its counts are planned on the host: ``plan_step``): counted and read on the device, so the
        compiled step guards on no count
        (a number is a constant of the graph: a recompile at its first change, and the bias corrections of Muon's
        AdamW at every value). The optimizers take either (``muon_math.adamw_update_foreach``)."""
        if optimizer is None or not adapter_for(optimizer).device_steps:
            return
        import torch

        for p, st in optimizer.state.items():
            v = st.get("step")
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                st["step"] = torch.tensor(float(v), dtype=torch.float32, device=p.device)
            elif isinstance(v, torch.Tensor) and v.device != p.device:  # a client store's 0-d values stay on the CPU
                st["step"] = v.to(device=p.device, dtype=torch.float32)

    def __call__(self, client, batch, k):
        opt = client.optimizer
        regular = opt is None or adapter_for(opt).plan_step(first=k == 0)  # before the counts move to the device
        if k == 0:  # a client's first step: its state was just reset or imported
            self.steps_as_tensors(opt)
        if self.lr_tensors:
            self._lr_tensors(opt)
        if not regular:  # a step that initialises or refreshes state (SOAP): eager, not a variant of the graph
            loss = self._step_fn(client, batch, k)
            self.steps_as_tensors(opt)  # the counts of a state it made
            return loss
        if self.dynamic_batch:  # local epochs: a pass's short last batch has any size, symbolic from the first step
            for v in batch.values():
                if isinstance(v, self._torch.Tensor) and v.dim() > 0:
                    self._dynamo.maybe_mark_dynamic(v, 0)
        self._active = client.traced = True  # planned numbers read as tensors (ClientContext.number)
        try:
            with self._trace_backward():
                return self._fn(client, batch, k)
        finally:
            self._active = client.traced = False

    def _trace_backward(self):
        """Dynamo traces the backward into the step's graph (torch ≥ 2.14). An older torch has no such switch and
        breaks the graph at ``backward()`` instead (the same numbers, more graphs); its inductor also fails an
        assertion in ``Scheduler.reorder_loops_by_dep_pair`` on FedMuon's ViT-Tiny step on CUDA (seen with torch
        2.11 on an H100; 2.14 returns there instead of asserting), so there loops are not reordered after fusion."""
        if hasattr(self._dynamo.config, "trace_autograd_ops"):
            return self._dynamo.config.patch(trace_autograd_ops=True)
        import torch._inductor.config as inductor_config

        return inductor_config.patch(loop_ordering_after_fusion=False)

    @staticmethod
    def _cache_counts() -> tuple[int, int]:
        """Inductor's graphs loaded from its cache, and generated, so far in this process."""
        from torch._dynamo.utils import counters

        return int(counters["inductor"]["fxgraph_cache_hit"]), int(counters["inductor"]["fxgraph_cache_miss"])

    def counts(self) -> dict[str, int]:
        """``compiled_graphs``: compilations of a frame of the step (the first of each frame and its recompiles);
        ``recompiles``: those after a frame's first; ``generated`` and ``from_cache``: inductor's graphs whose code
        was generated, and those loaded from the compile cache (:func:`compile_cache`) instead."""
        recompiles = sum(1 for i in self._ids if i.split("/")[-1] not in ("0", ""))
        (hits, misses), (hits0, misses0) = self._cache_counts(), self._cache0
        return {"compiled_graphs": len(self._ids), "recompiles": recompiles, "generated": misses - misses0,
                "from_cache": hits - hits0}

    def log_counts(self) -> dict[str, int]:
        c = self.counts()
        log.info("trainer.compile=%s (%s): %d frames of the local step compiled, %d of them recompiles; code of %d "
                 "graphs generated, of %d loaded from the compile cache %s", self.mode, self.backend,
                 c["compiled_graphs"], c["recompiles"], c["generated"], c["from_cache"], self.cache)
        return c


def compile_cache() -> str:
    """Where inductor keeps the code it generates: ``$TORCHINDUCTOR_CACHE_DIR`` if set (to other than torch's
    default), else
    ``inductor/<arch>-<cpu ISA>/`` under the package's cache folder (``$FL_CACHE_DIR``, default
    ``~/.cache/fl_lightning``) instead of torch's default in ``/tmp``: so the runs of a sweep, one after another or
    side by side, on one machine or on nodes sharing that folder, generate a step's code once and load it after
    (inductor's FX-graph and AOT-autograd caches, keyed by the graph, the device and the versions; written
    atomically, so parallel jobs share it). One folder per CPU instruction set: generated CPU code is cached by its
    source, not by the ISA it was built for, so a node without AVX-512 (or a run with ``ATEN_CPU_CAPABILITY``
    forced) loading another's kernels would crash."""
    import os
    import platform

    import torch
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    from ..data.cache import cache_root

    given = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if given and os.path.abspath(given) != os.path.abspath(default_cache_dir()):  # torch writes its default there
        return given
    isa = f"{platform.machine()}-{torch.backends.cpu.get_cpu_capability()}".lower()
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(cache_root(), "inductor", isa)
    return os.environ["TORCHINDUCTOR_CACHE_DIR"]
