"""One check that an argument is a codec (``codecs.base.check_codec``), for every part and codec that takes one."""
from __future__ import annotations

import os
import re

import pytest

from fl_lightning.codecs import Sign
from fl_lightning.codecs.base import check_codec
from fl_lightning.errors import ConfigError

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "..", "fl_lightning")


def test_the_codec_check_is_written_once():
    """No part or codec tests for ``encode`` by hand (it was written out in 7 places)."""
    hand = []
    for dirpath, _, files in os.walk(ROOT):
        for f in files:
            path = os.path.join(dirpath, f)
            if f.endswith(".py") and not path.endswith(os.path.join("codecs", "base.py")):
                if re.search(r"""hasattr\([^)]*["']encode["']\)""", open(path).read()):
                    hand.append(os.path.relpath(path, ROOT))
    assert hand == []


@pytest.mark.parametrize("bad,shown", [("sign", "'sign'"), (5, "5"), (object(), "object")])
def test_a_non_codec_is_one_line_naming_the_key(bad, shown):
    with pytest.raises(ConfigError) as err:
        check_codec(bad, "inner", "fl_lightning.codecs.TopK")
    assert err.value.key == "inner" and f"expected a codec, got {shown}" in str(err.value)
    assert "fl_lightning.codecs.TopK" in str(err.value) and "\n" not in str(err.value)


def test_null_is_a_codec_only_where_it_means_something():
    check_codec(None, null="dense")
    check_codec(Sign())
    with pytest.raises(ConfigError, match="expected a codec, got None"):
        check_codec(None)
