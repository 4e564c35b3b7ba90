"""fl_lightning/strategies/records.py: a record's fields read and write the flat names the checkpoints hold
("<part>/<pattern>"), over a dict and over an Aggregate (its weighted mean and sum, by hand)."""
from __future__ import annotations

import pytest
import torch

from fl_lightning.strategies.base import Aggregate, Msg, Part
from fl_lightning.strategies.records import Field, Record


class Rec(Record):
    c = Field("c/{}")
    y = Field("{}/y")
    M = Field("M/{}/{}")
    K = Field("K")


def _part(name="p"):
    part = Part()
    part.name = name
    return part


def test_fields_write_the_flat_names():
    d = {}
    r = Rec(_part("scaffold"), d)
    r.c["w"] = torch.ones(2)
    r.y["w"] = torch.zeros(1)
    r.M["w", "exp_avg"] = torch.full((1,), 3.0)
    r.K.set(torch.tensor(4.0))
    assert sorted(d) == ["scaffold/K", "scaffold/M/w/exp_avg", "scaffold/c/w", "scaffold/w/y"]
    assert r.c.path("w") == "scaffold/c/w" and r.M.path(("w", "exp_avg")) == "scaffold/M/w/exp_avg"
    assert "w" in r.c and "v" not in r.c and () in r.K
    assert r.c.get("v") is None and float(r.K.get()) == 4.0
    assert sorted(r.M.keys()) == ["scaffold/M/w/exp_avg"]
    assert r.y.pop("w").shape == (1,) and "w" not in r.y
    with pytest.raises(AttributeError):
        r.ci  # a misspelt field fails where it is used  # noqa: B018


def test_fields_over_an_aggregate_give_its_weighted_mean_and_sum():
    agg = Aggregate(num_clients=10)
    p = _part()
    for t, w in ((torch.tensor([1.0, 2.0]), 1.0), (torch.tensor([3.0, 6.0]), 3.0)):
        up = Rec(p, {})
        up.c["w"] = Msg(t, w)
        agg.add(up.container)
    r = Rec(p, agg)
    assert "w" in r.c and "v" not in r.c
    torch.testing.assert_close(r.c.sum("w"), torch.tensor([1.0 + 9.0, 2.0 + 18.0]))
    torch.testing.assert_close(r.c.mean("w"), torch.tensor([10.0 / 4, 20.0 / 4]))
    assert list(r.c.keys()) == ["p/c/w"]
