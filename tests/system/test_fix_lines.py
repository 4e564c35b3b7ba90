"""A fix line that fails when followed is a defect, like a traceback (issue 65, item 2).

Each refusal here is one the tests provoke (tests/system/test_key_probe.py's last tracebacks and wrong hints, and the
refusals whose fixes did not work: an example out of the run's range, a ``did you mean`` whose key a ``+`` cannot
add, a fix that named no value or a file without the key). Its ``fix:`` is parsed and applied to the refused command
line (tests/helpers/fixes.py) and the line is checked again as ``train.py`` checks it before building (a refusal of
the build, Fabric's, is built again): the same refusal must not come back. The key probe and the group probe follow
the fixes of their hundreds of cases the same way (slow tier); the docs' console blocks in test_docs_commands.py."""
from __future__ import annotations

import pytest

from tests.helpers.cli import FAST
from tests.helpers.fixes import fix_defects, follow, verdict
from tests.system.test_key_probe import BASE, CASES

LAST = [c[0] for c in CASES]


@pytest.mark.parametrize("overrides", LAST, ids=[" ".join(o) for o in LAST])
def test_the_key_probes_refusals_fixes_work_when_followed(overrides):
    argv = BASE + overrides
    line = verdict(argv)
    assert line is not None, argv
    bad = fix_defects(argv, line)
    assert not bad, "\n".join(bad)


# refusals whose fix, followed, failed (or named nothing to follow where it could): the line and a part of its fix
FOLLOWED = [
    (["fl.clients_per_round=abc"], "fix: set e.g. fl.clients_per_round=6"),  # was =8, with fl.num_clients=6
    (["fl.clients_per_round=20"], "fix: set fl.clients_per_round=6 (or fewer), or raise fl.num_clients, "
                                  "e.g. fl.num_clients=20"),  # was "<= 6 or raise fl.num_clients": no value
    (["+data.batchsize=16"], "fix: did you mean data.batch_size? (data.batch_size=16;"),  # +data.batch_size: Hydra's
    (["+fl.num_client=5"], "fix: did you mean fl.num_clients? (fl.num_clients=5;"),  # "an item is already at ..."
    (["+method.learning_rate=0.5"], "fix: did you mean method.lr? (method.lr=0.5)"),
    (["+method.parts.agregation.rule=mean"], "fix: did you mean method.parts.aggregation? "
                                             "(method.parts.aggregation.rule=mean;"),
    (["+model.net.hiden=5"], "fix: did you mean model.net.hidden? (model.net.hidden=5;"),
    (["data.partition=iid"], "fix: choose the partition with data/partition=iid in place of data.partition=iid"),
    # a + on a key the config has: Hydra's "Could not append to config" was a line with no key and no fix
    (["+fl.rounds=2"], "fix: set it without the +: fl.rounds=2"),
]


@pytest.mark.parametrize("overrides,fix", FOLLOWED, ids=[" ".join(c[0]) for c in FOLLOWED])
def test_a_fix_that_failed_when_followed_now_works(overrides, fix):
    argv = FAST + overrides
    line = verdict(argv)
    assert line is not None and fix in line, line
    assert follow(argv, line), f"the fix names no concrete change: {line}"
    bad = fix_defects(argv, line)
    assert not bad, "\n".join(bad)


def _fabric_verdict(argv: list[str]) -> str | None:
    """:func:`verdict`, then Lightning Fabric made from the config as the build makes it (its refusals are the
    build's first)."""
    import tempfile

    from fl_lightning.run.build import make_fabric
    from fl_lightning.errors import FLError
    from tests.helpers.fixes import compose

    line = verdict(argv)
    if line is not None:
        return line
    try:
        with tempfile.TemporaryDirectory() as run_dir:
            make_fabric(compose(argv), run_dir)
    except FLError as err:
        return f"error: {err}"
    return None


@pytest.mark.parametrize("value", ["abc", "0"])
def test_fabrics_refusal_names_a_value_and_a_command_that_work(value, capsys):
    """``trainer.strategy=abc`` is refused when the build makes Fabric; its fix named "the valid values in
    conf/config.yaml (trainer:)", where there are none (the keys live in the schema). It names a value, which
    works, and the command that lists the key's values, which does."""
    from fl_lightning.config import keys

    argv = FAST + [f"trainer.strategy={value}"]
    line = _fabric_verdict(argv)
    assert line is not None and line.startswith(
        "error: config error: trainer.strategy: Lightning Fabric refused it"), line
    assert "fix: set e.g. trainer.strategy=auto (python -m fl_lightning.config.keys trainer.strategy" in line, line
    bad = fix_defects(argv, line, judge=_fabric_verdict)
    assert not bad, "\n".join(bad)
    assert keys.main(["trainer.strategy"]) == 0 and "trainer.strategy" in capsys.readouterr().out
