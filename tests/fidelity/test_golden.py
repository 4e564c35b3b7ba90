"""Behaviour locked: every method yaml, 2 rounds of the default digits run with 1 thread, in this process, against its
record in tests/fidelity/golden.json (``python -m tests.helpers.golden --write``): bit for bit on the machine that
wrote it, to the method's measured tolerance elsewhere (tests/helpers/golden.py says how, and how to compare two
commits bit for bit on any machine). A change is a named bug fix: say it in the commit message and in
docs/decisions.md, then re-record that method."""
from __future__ import annotations

import pytest

from tests.helpers import golden
from tests.helpers.cover import cases

RECORDED = golden.load()


def test_every_method_is_recorded_with_a_measured_tolerance():
    assert sorted(RECORDED["methods"]) == golden.methods()
    for name, record in RECORDED["methods"].items():
        assert {"acc", "float"} <= set(record["tolerance"]["measured"]) and "catches_lr_change" in record["tolerance"]
        assert record["tolerance"]["float"] >= golden.FLOOR["float"] and record["tolerance"]["acc"] >= golden.FLOOR["acc"]
    assert set(RECORDED["machine"]) == set(golden.machine())


@pytest.mark.parametrize("name", cases(golden.methods()))  # fast subset: the cover (tests/helpers/cover.py)
def test_method_matches_its_golden_record(name):
    if name not in RECORDED["methods"]:
        pytest.fail(f"{name} has no golden record: python -m tests.helpers.golden --write {name}")
    record = RECORDED["methods"][name]
    diff = golden.check(name, golden.run_method(name, golden.at_its_precision(record)), RECORDED)
    assert not diff, f"{name} ({'bits' if golden.machine() == RECORDED['machine'] else 'tolerance'}): " + "; ".join(diff)


def test_a_real_change_fails_the_off_machine_comparison():
    """fedavg with its lr changed by a factor 1.001 is reported even with the tolerance used off the recording
    machine, and so are its exact integers and the digest with bits compared."""
    record = RECORDED["methods"]["fedavg"]
    diff = golden.perturbed("fedavg", record)
    assert any(d.startswith(("final_train_loss", "final_test_loss", "global_norm")) for d in diff), diff
    changed_bits = {**record, "metrics": {**record["metrics"], "uplink_bits": record["metrics"]["uplink_bits"] + 1}}
    assert golden.differences(record, changed_bits, {k: record["tolerance"][k] for k in golden.FLOOR}) == [
        f"uplink_bits: {record['metrics']['uplink_bits']} != recorded {record['metrics']['uplink_bits'] + 1}"]
    assert golden.differences({**record, "digest": "0" * 64}, record, None)[0].startswith("digest")


def test_the_comparison_is_bits_on_the_recording_machine_only(monkeypatch):
    """A forced ISA (ATEN_CPU_CAPABILITY and friends) or another CPU is another machine: tolerance, not bits."""
    monkeypatch.setattr(golden, "machine", lambda: RECORDED["machine"])
    record = RECORDED["methods"]["fedavg"]
    last_bit = {**record, "metrics": {**record["metrics"],
                                      "final_train_loss": record["metrics"]["final_train_loss"] * (1 + 2 ** -52)}}
    assert golden.check("fedavg", last_bit, RECORDED)  # same machine: a last-bit change fails
    monkeypatch.setattr(golden, "machine", lambda: {**RECORDED["machine"], "cpu_capability": "DEFAULT"})
    assert golden.check("fedavg", {**last_bit, "digest": "0" * 64}, RECORDED) == []  # elsewhere: within tolerance


def test_a_machine_that_resolves_auto_otherwise_checks_the_recorded_precision(monkeypatch):
    """fedmuon's record was made with ns_dtype auto -> bfloat16; where auto means fp32 (a CPU without native bf16),
    the test still runs bf16 and so compares the same arithmetic."""
    from fl_lightning import precision

    record = RECORDED["methods"]["fedmuon"]
    assert set(record["precision"].values()) == {"bfloat16"}
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: False)
    monkeypatch.setattr(precision, "cpu_bf16_slowdown", lambda: 36.0)
    assert not golden.check("fedmuon", golden.run_method("fedmuon", golden.at_its_precision(record)), RECORDED)
    assert golden.run_method("fedmuon")["precision"] == {k: "float32" for k in record["precision"]}
