"""Build presets and the one text form of a build (``host.spec.config.parse_config``)."""

import re

import pytest

from host.spec.config import PRESETS, NpuConfig, parse_config, preset
from host.spec.ops import UnaryOp


def test_presets():
    assert preset("default") == NpuConfig() == parse_config("")
    ulx3s = preset("ulx3s")
    assert (ulx3s.n, ulx3s.tiles) == (4, 1) and ulx3s.mfus == NpuConfig().mfus
    assert parse_config("", base="ulx3s") == ulx3s == parse_config("ulx3s")
    assert set(PRESETS) >= {"default", "ulx3s"}


def test_fields_replace_the_preset_and_take_every_kind_of_value():
    c = parse_config("ulx3s, mrf_depth=0x400, unary_ops=relu+sigmoid")
    assert (c.n, c.tiles, c.mrf_depth) == (4, 1, 1024)
    assert c.unary_ops == (UnaryOp.RELU, UnaryOp.SIGMOID)
    assert parse_config("n=8,tiles=1") == NpuConfig(n=8, tiles=1)
    assert parse_config("tiles=4", base="ulx3s").n == 4


@pytest.mark.parametrize("text, says", [
    ("nope", "unknown build preset 'nope'; choose one of: default, ulx3s"),
    ("n=8,ulx3s", "build item 'ulx3s' is not KEY=VALUE"),
    ("colour=3", "'colour' is not a build field"),
    ("n=eight", "n must be an integer, not 'eight'"),
    ("unary_ops=relu+cosine", "unary_ops='relu+cosine'"),
    ("n=6", "n must be a power of two, not 6"),
])
def test_refusals_name_the_item(text, says):
    with pytest.raises(ValueError, match=re.escape(says)):
        parse_config(text)
    with pytest.raises(ValueError, match="unknown build preset"):
        preset("nope")
