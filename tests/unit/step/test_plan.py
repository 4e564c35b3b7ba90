"""The one rule (fl_lightning/step/plan.py): how a part runs follows from what it declares, read the same way by the
cohort's check and the capture wrapper."""
from __future__ import annotations

import pytest

from fl_lightning.errors import ConfigError
from fl_lightning.step.plan import cohort_refusal, in_step, replay_refusal
from fl_lightning.strategies.base import Part
from tests.helpers.cli import build_loop

BASE = ["fl.num_clients=4", "fl.clients_per_round=2", "fl.rounds=1", "fl.local_steps=2", "trainer.progress=false",
        "trainer.accelerator=cpu"]


class _AtTheEnd(Part):
    def client_end(self, client):
        return {}


class _Unplanned(Part):
    def after_backward(self, client):
        pass


class _Planned(_Unplanned):
    step_plan = ("count",)

    def cohort_check(self, module):
        return "needs what the model lacks" if not hasattr(module, "missing_on_purpose") else None


class _PlansOnly(Part):  # a plan before the step and nothing inside it: still a step part
    def before_step(self, client):
        pass


def test_the_rule_reads_the_declarations():
    assert not in_step(_AtTheEnd()) and in_step(_Unplanned()) and in_step(_PlansOnly())
    assert cohort_refusal(_AtTheEnd(), None) is None and replay_refusal(_AtTheEnd()) is None
    assert cohort_refusal(_Unplanned(), None) == "has per-step hooks and declares no step plan (Part.step_plan)"
    assert replay_refusal(_Unplanned()) == "declares no step plan (Part.step_plan)"
    assert replay_refusal(_PlansOnly()) == "declares no step plan (Part.step_plan)"
    assert replay_refusal(_Planned()) is None
    assert cohort_refusal(_Planned(), object()) == "needs what the model lacks"  # its batched form's own need
    opt = Part()
    opt.provides_optimizer = True  # judged by its optimizer (cohort/optimizer.py, graphed.unsupported), not here
    assert not in_step(opt) and cohort_refusal(opt, None) is None


@pytest.mark.parametrize("part,needle", [(_Unplanned, "declares no step plan"), (_Planned, "needs what the model")])
def test_a_cohort_refuses_a_part_the_rule_refuses_in_one_line(part, needle, tmp_path):
    from fl_lightning.cohort import check_cohort

    loop = build_loop(["method=fedavg", *BASE], tmp_path)
    p = part()
    p.name = "mine"
    loop.strategy.parts.append(p)
    with pytest.raises(ConfigError) as e:
        check_cohort(loop.strategy, loop.module, 2)
    assert e.value.key == "trainer.cohort" and needle in str(e.value) and "\n" not in str(e.value)
    assert "part 'mine'" in str(e.value) and "trainer.cohort=1" in str(e.value)
    check_cohort(loop.strategy, loop.module, 1)  # one client at a time: anything runs
