"""Per-MFU unit sets (issue 36): the build parameter ``unit_sets``, its forms (constructor,
dict and JSON, ``parse_config`` text, INFO entry) and the allocation rule with it."""

import itertools
import re

import numpy as np
import pytest

from host.spec import protocol as p
from host.spec.config import NpuConfig, parse_config
from host.spec.mfu import (
    ALL_UNITS,
    MfuConfig,
    MfuOp,
    MfuUnit,
    allocate,
    decode_chain,
    encode_chain,
    format_unit_sets,
    parse_unit_sets,
    unit_set_mask,
    unit_sets_from_mask,
)

A, M, X, R = (MfuOp.binary("add", 0), MfuOp.binary("mul", 0), MfuOp.unary("relu"),
              MfuOp.reduce("max"))
AD, MU, AC, RE = MfuUnit
#: REDUCE only in the first MFU, activations only in the last.
SPLIT = ((AD, MU, RE), (AD, MU, AC))


# --- allocation -------------------------------------------------------------------------------

def test_an_op_moves_past_the_mfus_without_its_unit():
    assert allocate([X], 2, SPLIT) == ((), (X,))
    assert allocate([R, X], 2, SPLIT) == ((R,), (X,))
    assert allocate([A, R, X, A], 2, SPLIT) == ((A, R), (X, A))
    # An op that moves on takes the chain with it: the ops after it never go back.
    assert allocate([X, M], 2, SPLIT) == ((), (X, M))
    # It skips as many MFUs as it must.
    assert allocate([A, X, R], 4, [[AD], [MU], [AC], [RE]]) == ((A,), (), (X,), (R,))
    # Names and the text form say the same.
    assert allocate([X], 2, "addsub+mul+reduce/addsub+mul+act") == ((), (X,))
    assert allocate([X], 2, [["addsub", "mul", "reduce"], ["act", "ADDSUB", "mul"]]) \
        == ((), (X,))


@pytest.mark.parametrize("ops, says", [
    ([X, R], ("op 1 (reduce.max) needs unit REDUCE, which is not built in MFU 1 or any later "
             "MFU (unit sets addsub+mul+reduce/addsub+mul+act)")),
    ([R, R], ("op 1 (reduce.max) needs unit REDUCE after MFU 0, which already uses it; no "
             "later MFU has REDUCE built (unit sets addsub+mul+reduce/addsub+mul+act)")),
    ([R, X, X], "op 2 (act.relu) needs unit ACT after MFU 1, the last of 2 MFUs"),
    ([A, A, A], "op 2 (addsub.add(0)) needs unit ADDSUB after MFU 1, the last of 2 MFUs"),
])
def test_a_chain_that_cannot_be_placed_names_the_reason(ops, says):
    with pytest.raises(ValueError, match=re.escape(says)):
        allocate(ops, 2, SPLIT)


def test_an_op_whose_unit_no_mfu_has():
    with pytest.raises(ValueError, match=re.escape(
            "op 0 (act.relu) needs unit ACT, which is not built in MFU 0 or any later MFU")):
        allocate([X], 2, [[AD, MU], [RE]])


def _old_rule(ops, mfus):
    """The rule before unit sets (a copy of the pre-issue-36 implementation)."""
    placed = [[] for _ in range(mfus)]
    m = 0
    for op in ops:
        if any(o.unit is op.unit for o in placed[m]):
            m += 1
            if m == mfus:
                raise ValueError
        placed[m].append(op)
    return tuple(tuple(g) for g in placed)


def test_the_default_is_the_rule_of_every_unit_in_every_mfu():
    rng = np.random.default_rng(36)
    pool = [A, M, X, R]
    legal = 0
    for _ in range(3000):
        ops = [pool[i] for i in rng.integers(0, 4, int(rng.integers(0, 10)))]
        mfus = int(rng.integers(1, 5))
        try:
            want = _old_rule(ops, mfus)
        except ValueError:
            want = None
        for sets in (None, [ALL_UNITS] * mfus, ["all"] * mfus):
            try:
                got = allocate(ops, mfus, sets)
            except ValueError:
                got = None
            assert got == want, (ops, mfus, sets)
        legal += want is not None
    assert 1000 < legal < 2900          # both outcomes are well represented


def _placeable(units, mfus, sets):
    """Independent rule: some non-decreasing assignment of MFUs puts each op on an MFU
    that builds its unit, no unit twice in one MFU."""
    for where in itertools.combinations_with_replacement(range(mfus), len(units)):
        if all(u in sets[m] for u, m in zip(units, where)) and \
                len(set(zip(units, where))) == len(units):
            return True
    return False


def test_allocation_with_unit_sets_is_legal_iff_some_placement_exists():
    rng = np.random.default_rng(3636)
    pool = [A, M, X, R]
    outcomes = set()
    for _ in range(2000):
        mfus = int(rng.integers(1, 4))
        sets = [[u for u in MfuUnit if rng.random() < 0.6] or [MfuUnit(int(rng.integers(4)))]
                for _ in range(mfus)]
        ops = [pool[i] for i in rng.integers(0, 4, int(rng.integers(0, 7)))]
        units = [o.unit for o in ops]
        try:
            placed = allocate(ops, mfus, sets)
        except ValueError:
            assert not _placeable(units, mfus, sets), (ops, sets)
            outcomes.add(False)
            continue
        outcomes.add(True)
        assert _placeable(units, mfus, sets), (ops, sets)
        assert [o for g in placed for o in g] == ops
        for m, group in enumerate(placed):
            assert all(o.unit in sets[m] for o in group), (ops, sets)
            assert len({o.unit for o in group}) == len(group)
    assert outcomes == {True, False}


# --- the parameter --------------------------------------------------------------------------

def test_unit_sets_are_normalized():
    assert parse_unit_sets(None, 2) is None
    # Every unit everywhere is the default build, whatever form says so.
    assert parse_unit_sets([ALL_UNITS, "all"], 2) is None
    assert NpuConfig(unit_sets="all/addsub+mul+act+reduce") == NpuConfig()
    sets = parse_unit_sets([["reduce", "addsub", "MUL", "mul"], {AC, MU, AD}], 2)
    assert sets == SPLIT                      # sorted by code, a unit named twice once
    cfg = NpuConfig(unit_sets=[[RE, AD, MU], [AC, AD, MU]])
    assert cfg.unit_sets == SPLIT and hash(cfg) == hash(NpuConfig(unit_sets=SPLIT))
    assert cfg.units(0) == SPLIT[0] and NpuConfig().units(1) == ALL_UNITS
    assert cfg.mfu.unit_sets == SPLIT and cfg.mfu.units(1) == SPLIT[1]
    assert MfuConfig(unit_sets="all/act").has_vrf(0, 1)
    assert not MfuConfig(unit_sets="all/act").has_vrf(1, 0)


@pytest.mark.parametrize("value, error, says", [
    (5, TypeError, ("unit_sets must be a sequence of 2 unit collections (one per MFU) or "
                   "None, not 5")),
    ([[AD]], ValueError, "unit_sets must have one entry per MFU (2), not 1: [[<MfuUnit"),
    ("addsub/mul/act", ValueError, ("unit_sets must have one entry per MFU (2), not 3: "
                                   "'addsub/mul/act'")),
    ([[AD], []], ValueError, "unit_sets[1] must name at least one unit, not []"),
    ([[AD], "act"], TypeError, ("unit_sets[1] must be a collection of units, not the "
                               "single 'act'")),
    ([[AD], MU], TypeError, "unit_sets[1] must be a collection of units, not the single"),
    ([[AD], [4]], ValueError, ("unit_sets[1] must be an MfuUnit or one of 'addsub', 'mul', "
                              "'act', 'reduce', not 4")),
    ("addsub/relu", ValueError, ("unit_sets[1] must be an MfuUnit or one of 'addsub', 'mul', "
                                "'act', 'reduce', not 'relu'")),
])
def test_bad_unit_sets_are_refused_naming_the_parameter(value, error, says):
    for make in (lambda: NpuConfig(unit_sets=value), lambda: MfuConfig(unit_sets=value)):
        with pytest.raises(error, match=re.escape(says)):
            make()


def test_unit_sets_round_trip_through_dict_json_and_text():
    cfg = NpuConfig(n=8, tiles=1, mfus=3, unit_sets=[SPLIT[0], [AC], ALL_UNITS])
    d = cfg.to_dict()
    assert d["unit_sets"] == [["addsub", "mul", "reduce"], ["act"],
                              ["addsub", "mul", "act", "reduce"]]
    assert NpuConfig(**d) == cfg and NpuConfig.from_json(cfg.to_json()) == cfg
    text = format_unit_sets(cfg.unit_sets, 3)
    assert text == "addsub+mul+reduce/act/addsub+mul+act+reduce"
    assert parse_config(f"n=8,tiles=1,mfus=3,unit_sets={text}") == cfg
    assert parse_config("n=8,tiles=1,mfus=3,unit_sets=reduce+addsub+mul/ACT/all") == cfg
    from host.compiler.network import config_text
    assert parse_config(config_text(cfg)) == cfg
    # The default build's dict and JSON are what they were before unit sets existed.
    assert "unit_sets" not in NpuConfig().to_dict()
    assert "unit_sets" not in NpuConfig().to_json()
    assert parse_config(config_text(NpuConfig())) == NpuConfig()


@pytest.mark.parametrize("text, says", [
    ("unit_sets=addsub", ("unit_sets='addsub': unit_sets must have one entry per MFU (2), "
                         "not 1")),
    ("unit_sets=addsub/cosine", ("unit_sets='addsub/cosine': unit_sets[1] must be an "
                                "MfuUnit or one of")),
    ("unit_sets=addsub/", "unit_sets='addsub/': unit_sets[1] must name at least one unit"),
    ("mfus=3,unit_sets=all/all", ("unit_sets='all/all': unit_sets must have one entry per "
                                 "MFU (3), not 2")),
])
def test_the_text_form_refusals_name_the_item(text, says):
    with pytest.raises(ValueError, match=re.escape(says)):
        parse_config(text)


def test_info_reports_the_unit_sets():
    cfg = NpuConfig(n=8, tiles=1, unit_sets=SPLIT)
    entries = p.info_entries(cfg)
    # After the other build fields: one 4-bit mask per MFU, MFU 0 in the low bits.
    assert list(entries)[:len(p.CONFIG_FIELDS) + 1] == [*p.CONFIG_FIELDS, "unit_sets"]
    assert entries["unit_sets"] == 0b0111_1011 == unit_set_mask(SPLIT, 2)
    decoded = p.unpack_info(p.pack_info(entries))
    assert decoded["unit_sets"] == 0x7B and p.config_from_entries(decoded) == cfg
    assert unit_sets_from_mask(0xFF, 2) is None
    # A build with every unit everywhere sends no entry (its INFO is unchanged), and a
    # reply without one, from such a build or from before, means every unit.
    full = p.info_entries(NpuConfig(n=8, tiles=1))
    assert "unit_sets" not in full
    assert p.config_from_entries(full).unit_sets is None
    for bad, says in [(0x1FB, "bits beyond the 2 MFUs"),
                      (0x0B, "unit_sets[1] must name at least one unit")]:
        with pytest.raises(ValueError, match=re.escape("INFO entry unit_sets: ")
                           + ".*" + re.escape(says)):
            p.config_from_entries({**full, "unit_sets": bad})


def test_info_and_build_info_list_each_mfus_units():
    cfg = NpuConfig(unit_sets=SPLIT)
    assert p.build_info(cfg)["unit_sets"] == [["addsub", "mul", "reduce"],
                                              ["addsub", "mul", "act"]]
    assert p.build_info(NpuConfig())["unit_sets"] == [["addsub", "mul", "act", "reduce"]] * 2


def test_space_depth_knows_the_vrfs_a_unit_set_leaves_out():
    from host.spec.isa import Space, vector_spaces
    cfg = NpuConfig(n=8, tiles=1, unit_sets="addsub+mul+reduce/mul+act")
    assert vector_spaces(cfg) == (Space.IVRF, Space.ASVRF0, Space.MULVRF0, Space.MULVRF1)
    assert p.space_depth(cfg, Space.ASVRF1.value) is None
    assert p.space_depth(cfg, Space.MULVRF1.value) == cfg.vrf_depth
    assert len(vector_spaces(NpuConfig(mfus=4))) == 9


def test_the_chain_encoding_follows_the_unit_sets():
    cfg = MfuConfig(n=4, mfus=2, vrf_depth=8, unit_sets=SPLIT)
    word = encode_chain(cfg, [X, A], 2, 3)
    assert decode_chain(cfg, word) == ((X, A), 2, 3)
    # The same op list on the full build puts X in MFU 0: a word the split build refuses.
    full = encode_chain(MfuConfig(n=4, mfus=2, vrf_depth=8), [X, A], 2, 3)
    with pytest.raises(ValueError, match="MFU 0: unit ACT is not built there"):
        decode_chain(cfg, full)
    with pytest.raises(ValueError, match="needs unit REDUCE"):
        encode_chain(cfg, [X, R], 1, 1)
