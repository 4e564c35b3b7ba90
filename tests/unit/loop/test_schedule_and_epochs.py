import math

import pytest

from fl_lightning.schedule import lr_factor
from tests.helpers.cli import FAST, build_loop
from tests.helpers.spies import Recorder


def test_cosine_schedule_over_rounds():
    R = 10
    f = [lr_factor(r, R, "cosine") for r in range(R)]
    assert f[0] == 1.0 and all(a > b for a, b in zip(f, f[1:]))
    assert f[5] == pytest.approx(0.5)
    assert lr_factor(3, R, "constant") == 1.0
    assert lr_factor(0, R, "cosine", warmup_rounds=2) == 0.5
    assert lr_factor(R, R, "cosine", min_factor=0.1) == pytest.approx(0.1)
    assert math.isclose(lr_factor(R - 1, R, "cosine"), 0.5 * (1 + math.cos(math.pi * 0.9)))


def test_local_epochs_visit_every_example_once_per_epoch(tmp_path, monkeypatch):
    loop = build_loop(FAST + ["fl.local_steps=null", "fl.local_epochs=2", "data.batch_size=16", "fl.rounds=1"], tmp_path)
    counts = []
    orig = loop.module.training_step
    monkeypatch.setattr(loop.module, "training_step", lambda b, k: (counts.append(len(b["y"])), orig(b, k))[1])
    loop.run_round(0)
    sizes = [loop.data.num_samples(c) for c in (0, 1, 2, 3, 4, 5)]
    assert sum(counts) in {2 * sum(sorted_s) for sorted_s in [[sizes[i] for i in s] for s in _triples()]}


def _triples():
    from itertools import combinations

    return list(combinations(range(6), 3))


def test_cosine_lr_reaches_the_optimizer(tmp_path):
    loop = build_loop(FAST + ["fl.lr_schedule=cosine", "fl.rounds=4"], tmp_path)
    seen = []
    from fl_lightning.strategies.base import Part

    class Peek(Recorder):
        def after_step(self, client):
            seen.append((client.round, client.optimizer.param_groups[0]["lr"]))

    loop.strategy.parts.append(Peek())
    loop.run()
    lrs = {r: lr for r, lr in seen}
    assert lrs[0] == pytest.approx(0.05) and lrs[2] == pytest.approx(0.05 * 0.5)


@pytest.mark.parametrize("method,part", [("fedmuon", "alignment"), ("fedavg_vr", "correction"), ("scallion", None)])
def test_under_local_epochs_the_server_knows_each_clients_steps_and_nothing_uploads_them(method, part, tmp_path):
    """A client's local work is one value (``fl.local_epochs``: E passes of its own data, ⌈n_i / B⌉ steps each,
    :class:`fl_lightning.config.StepBudget`); the loop counts the round's steps, so the parts that need K (Δ_G's units,
    the direction momentum, SCALLION's K·η) read the clients' mean from the round's aggregate, and no client uploads
    its K (the server knows the clients' data sizes)."""
    from fl_lightning import seeding

    loop = build_loop(FAST + [f"method={method}", "fl.local_steps=null", "fl.local_epochs=1", "data.batch_size=16",
                              "fl.rounds=2"], tmp_path)
    sent = []
    orig = loop.train_client
    loop.train_client = lambda *a: (lambda out: (sent.append(sorted(out[0])), out)[1])(orig(*a))
    loop.run_round(0)
    assert sent and not any(k == "K" or k.endswith("/K") or "k_eta" in k for keys in sent for k in keys), sent
    sampled = seeding.sample_clients(loop.seed, 0, loop.n, loop.S)
    want = sum(math.ceil(loop.data.num_samples(c) / 16) for c in sampled) / len(sampled)
    assert len({math.ceil(loop.data.num_samples(c) / 16) for c in sampled}) > 1  # the clients' K differ
    if part is not None:
        p = loop.strategy.parts[[type(q).__name__ for q in loop.strategy.parts].index(
            {"alignment": "GlobalAlignment", "correction": "MomentumCorrection"}[part])]
        assert p.prev_K == want
