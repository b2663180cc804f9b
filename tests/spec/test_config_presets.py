"""Build presets and the one text form of a build (``host.spec.config.parse_config``)."""

import re

import pytest

from host.spec.config import PRESETS, NpuConfig, parse_config, preset
from host.spec.ops import UnaryOp


def test_presets():
    assert preset("default") == NpuConfig() == parse_config("")
    small = preset("ulx3s_n4")
    assert (small.n, small.tiles) == (4, 1) and small.mfus == NpuConfig().mfus
    assert parse_config("", base="ulx3s_n4") == small == parse_config("ulx3s_n4")
    assert set(PRESETS) >= {"default", "ulx3s", "ulx3s_n4"}


def test_board_preset():
    # The board build (issue 36): N = 16 at 256 MACs a cycle, 2 lanes, REDUCE in the last
    # MFU only, the narrow check off, and depths for the LSTM-256 of bench/lstm.py.
    board = parse_config("ulx3s")
    assert (board.n, board.tiles, board.lanes, board.macs_per_cycle) == (16, 1, 2, 256)
    assert board.narrow_check is False
    assert [sorted(u.name for u in units) for units in board.unit_sets] == [
        ["ACT", "ADDSUB", "MUL"], ["ACT", "ADDSUB", "MUL", "REDUCE"]]
    assert (board.mrf_depth, board.vrf_depth, board.ivrf_depth, board.program_depth,
            board.netq_depth) == (2048, 192, 512, 1024, 512)


def test_fields_replace_the_preset_and_take_every_kind_of_value():
    c = parse_config("ulx3s_n4, mrf_depth=0x400, unary_ops=relu+sigmoid")
    assert (c.n, c.tiles, c.mrf_depth) == (4, 1, 1024)
    assert c.unary_ops == (UnaryOp.RELU, UnaryOp.SIGMOID)
    assert parse_config("n=8,tiles=1") == NpuConfig(n=8, tiles=1)
    assert parse_config("tiles=4", base="ulx3s_n4").n == 4
    assert parse_config("ulx3s,n=8").lanes == 2                 # the preset's other fields


@pytest.mark.parametrize("text, says", [
    ("nope", "unknown build preset 'nope'; choose one of: default, ulx3s, ulx3s_n4"),
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


# --- the narrow-accumulator check, a build option (issue 36) -------------------------------

@pytest.mark.parametrize("text, flag", [
    ("narrow_check=off", False), ("narrow_check=0", False), ("narrow_check=False", False),
    ("narrow_check=NO", False), ("narrow_check=on", True), ("narrow_check=1", True),
    ("narrow_check=true", True), ("narrow_check=yes", True), ("", True),
])
def test_narrow_check_is_parsed(text, flag):
    c = parse_config(f"ulx3s_n4,{text}" if text else "ulx3s_n4")
    assert c.narrow_check is flag and (c.n, c.tiles) == (4, 1)
    assert c.mvm.narrow_check is flag                       # the MVM's part carries it
    assert c.to_dict()["narrow_check"] is flag
    assert NpuConfig.from_json(c.to_json()) == c


@pytest.mark.parametrize("value", ["2", "maybe", "", "offf"])
def test_narrow_check_refusals_name_the_field(value):
    with pytest.raises(ValueError, match=re.escape(
            f"narrow_check must be one of 1, 0, true, false, on, off, yes, no, not {value!r}")):
        parse_config(f"narrow_check={value}")


@pytest.mark.parametrize("value", [1, 0, "off", None, 1.0])
def test_narrow_check_must_be_a_bool(value):
    from host.spec.config import MvmConfig
    for cls in (MvmConfig, NpuConfig):
        with pytest.raises(TypeError, match=re.escape(
                f"narrow_check must be True or False, not {value!r}")):
            cls(narrow_check=value)
