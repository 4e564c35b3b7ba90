"""How a part runs, from what it declares: the one rule the cohort (``trainer.cohort``) and the capture wrapper
(``trainer.compile=graphs``) read. A part says what it does, never which executor runs it:

* its hooks (``overrides``): a part with no work inside the local step (``after_backward`` / ``after_step``) and no
  plan before it (``before_step``) runs anywhere as it is;
* its step plan (``Part.step_plan``): the host values of its round state that its step hooks read, decided before
  the step by ``before_step`` (Sophia's refresh, the last step of seed 003's order). Declaring it, even empty, says
  the step hooks read no other changing host number and write only tensors that stay the same memory (their own
  buffers filled in place, the server's tensors, the context's parameters and gradients). That is what both a
  cohort (the same hooks over stacked tensors, a (K,) row of each planned value) and a replayed graph (the planned
  values as the capture's constants) need. A part with step hooks and no plan (``None``) runs one client at a time,
  eagerly;
* its rows (its ``Round`` state's ``rows`` fields, ``Part.cohort_rows``), stacked in a cohort;
* what its batched form needs of the model (``Part.cohort_check``);
* the local optimizer part is judged by its optimizer, not here: ``cohort/optimizer.py``'s ``optimizer_mode`` and
  the adapter's ``zero_is_fresh`` / ``device_steps`` (``graphed.unsupported``).

tests/system/test_part_writes.py holds every part that declares a plan to it (no host sync, no host value outside
the plan, no tensor rebound), over every method.
"""
from __future__ import annotations

from ..strategies.base import Part, overrides, steps_inside


def in_step(part: Part) -> bool:
    """Whether ``part`` does anything at or just before the local step (so a cohort stacks its round state and hands
    it the cohort's context)."""
    return not part.provides_optimizer and (steps_inside(part) or overrides(part, "before_step"))


def cohort_refusal(part: Part, module) -> str | None:
    """Why ``part`` cannot run in a cohort of clients with ``module``, or None."""
    if not in_step(part):
        return None
    if part.step_plan is None:
        return "has per-step hooks and declares no step plan (Part.step_plan)"
    return part.cohort_check(module)


def replay_refusal(part: Part) -> str | None:
    """Why ``part``'s step hooks cannot be replayed as a captured CUDA graph, or None."""
    if in_step(part) and part.step_plan is None:
        return "declares no step plan (Part.step_plan)"
    return None


def planned(client, strategy) -> tuple:
    """The host values the parts' step hooks read this step (their ``step_plan``), planned before it, and for a cohort
    whether every client takes the step (a step with finished clients runs eagerly, under row masks)."""
    out = []
    for part in strategy.parts if strategy is not None else ():
        if part.step_plan:
            state = getattr(client, "_states", {}).get(part.name)
            out.append(tuple(getattr(state, f, None) for f in part.step_plan))
    if getattr(client, "batched", False):  # a cohort: whether every client takes this step
        out.append(client.all_active)
    return tuple(out)
