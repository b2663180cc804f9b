"""The program word's checks done at write time (``hw.core.decode.WordCheck``), with the
decision terms the front end reads from the fetched word, in Amaranth's simulator,
against the ISA's own decoder (``host.spec.isa.decode``) and the model's register ranges
(``host.spec.isa.register_limits``).

The core keeps ``WordCheck``'s verdict beside each word and fails a run on it instead of
decoding the fetched word (``hw.core.npu``); the core benches (``tests/hw/test_npu_hw.py``)
run illegal words and out-of-range ``s_wr`` through the whole core under Verilator and
Icarus, this file sweeps the word space of the checks alone: every opcode code with each
field that must be zero set, every register's range edges, and seeded random words.
"""

import random

import pytest
from amaranth.sim import Simulator

from host.spec.config import parse_config
from host.spec.isa import (
    FIELDS,
    ErrorCode,
    Instruction,
    IsaError,
    Opcode,
    Reg,
    Space,
    decode,
    register_limits,
)
from host.spec.mfu import MfuOp
from host.spec.ops import BinaryOp, ReduceOp, UnaryOp
from hw.core.decode import KEPT_FIELDS, STORED_WORD_LAYOUT, WordCheck

#: Preset ulx3s_n4 has every unary function; UNARY_PART builds only relu and tanh.
CONFIG = parse_config("ulx3s_n4")
UNARY_PART = parse_config("ulx3s_n4,unary_ops=relu+tanh")
LIMITS = register_limits(CONFIG)


def word(**fields):
    """A 64-bit word from field values (``host.spec.isa.FIELDS``; absent ones zero)."""
    out = 0
    for name, value in fields.items():
        off, width = FIELDS[name]
        assert 0 <= value < (1 << width), (name, value)
        out |= value << off
    return out


def kept_fields(w):
    """``{field: value}`` of the fields of word ``w`` that the program memory keeps
    (``hw.core.decode.KEPT_FIELDS``)."""
    return {name: (w >> FIELDS[name][0]) & ((1 << FIELDS[name][1]) - 1)
            for name in KEPT_FIELDS}


def expected(w, config=CONFIG):
    """``{name: value}`` of the checks (``PREDECODE_LAYOUT``) for word ``w`` by the ISA
    (``host.spec.isa.decode``), the model's register ranges and the MFU units of
    ``host.spec.mfu.allocate``: ``legal`` and, for an illegal word, ``field`` (its error
    is ILLEGAL_FIELD) only (the core reads the others only for a legal word); ``unit``,
    the op's unit, is checked as the one-hot ``unit_bit``."""
    try:
        ins = decode(w)
    except IsaError as e:
        assert e.code in (ErrorCode.ILLEGAL_OPCODE, ErrorCode.ILLEGAL_FIELD), e.code
        return {"legal": 0, "field": int(e.code == ErrorCode.ILLEGAL_FIELD)}
    out = {"legal": 1, "s_wr_out_of_range": False, "unary_unbuilt": False}
    if ins.opcode == Opcode.S_WR:
        lo, hi = register_limits(config)[ins.func]
        out["s_wr_out_of_range"] = not lo <= ins.operand <= hi
    if ins.opcode in (Opcode.VV, Opcode.V_UNARY, Opcode.V_REDUCE):
        make = {Opcode.VV: lambda f: MfuOp.binary(f, 0), Opcode.V_UNARY: MfuOp.unary,
                Opcode.V_REDUCE: MfuOp.reduce}[ins.opcode]
        out["unit"] = make(ins.func).unit
    if ins.opcode == Opcode.V_UNARY:
        out["unary_unbuilt"] = ins.func not in config.unary_ops
    return out


def directed_words():
    words = [0, (1 << 64) - 1]
    for op in range(1 << FIELDS["opcode"][1]):
        words.append(word(opcode=op))
        words.append(word(opcode=op, space=Space.IVRF.value))
        words.append(word(opcode=op, space=Space.NETQ.value))
        for name in ("reserved", "func", "inc", "operand", "space"):
            words.append(word(**{"opcode": op, "space": Space.IVRF.value, name: 1}))
    # Every MFU op, legal: each unit's decision term is reached.
    for opcode, funcs in ((Opcode.VV, BinaryOp), (Opcode.V_UNARY, UnaryOp),
                          (Opcode.V_REDUCE, ReduceOp)):
        operand = 3 if opcode is Opcode.VV else 0
        words += [Instruction(opcode, func=f, operand=operand).encode() for f in funcs]
    for reg in Reg:
        lo, hi = LIMITS[reg]
        for v in {lo - 1, lo, lo + 1, hi - 1, hi, hi + 1, (1 << FIELDS["operand"][1]) - 1}:
            if 0 <= v < (1 << FIELDS["operand"][1]):
                words.append(word(opcode=Opcode.S_WR.value, space=Space.NETQ.value,
                                  func=reg.value, operand=v))
    return words


def random_words(count, seed):
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        fields = {
            "opcode": rng.choice([rng.randrange(1 << FIELDS["opcode"][1])]
                                 + [o.value for o in Opcode] * 3),
            "space": rng.randrange(1 << FIELDS["space"][1]),
            "func": rng.choice([0, rng.randrange(1 << FIELDS["func"][1])]),
            "inc": rng.choice([0, 0, rng.randrange(1 << FIELDS["inc"][1])]),
            "operand": rng.choice([0, rng.randrange(64), rng.randrange(1 << 20),
                                   rng.randrange(1 << FIELDS["operand"][1])]),
            "reserved": rng.choice([0] * 7 + [rng.randrange(1 << FIELDS["reserved"][1])]),
        }
        out.append(word(**fields))
    return out


def check_words(words, config=CONFIG):
    """Run ``words`` through ``WordCheck(config)``; assert each one's checks against
    :func:`expected` and its kept fields against the word's; return how many words got
    each error code (``NONE``, ``ILLEGAL_OPCODE``, ``ILLEGAL_FIELD``)."""
    dut = WordCheck(config)
    seen = []

    async def bench(ctx):
        for w in words:
            ctx.set(dut.word, w)
            checks = dut.stored.checks
            got = {name: ctx.get(getattr(checks, name))
                   for name in ("field", "s_wr_out_of_range", "unary_unbuilt")}
            got["legal"] = ctx.get(checks.terms.legal)
            got["unit_bit"] = ctx.get(checks.terms.unit_bit)
            got |= {name: ctx.get(getattr(dut.stored, name)) for name in KEPT_FIELDS}
            seen.append(got)

    sim = Simulator(dut)
    sim.add_testbench(bench)
    sim.run()
    tally = {code: 0 for code in (ErrorCode.NONE, ErrorCode.ILLEGAL_OPCODE,
                                  ErrorCode.ILLEGAL_FIELD)}
    for w, got in zip(words, seen, strict=True):
        want = expected(w, config)
        unit = want.pop("unit", None)
        for name, value in want.items():
            assert got[name] == value, f"word {w:#018x}: {name} {got[name]!r}, expected {value!r}"
        if unit is not None:
            assert got["unit_bit"] == 1 << unit.value, f"word {w:#018x}: unit {got['unit_bit']}"
        for name, value in kept_fields(w).items():
            assert got[name] == value, f"word {w:#018x}: {name}"
        code = (ErrorCode.NONE if got["legal"] else
                ErrorCode.ILLEGAL_FIELD if got["field"] else ErrorCode.ILLEGAL_OPCODE)
        tally[code] += 1
    return tally


@pytest.mark.parametrize("config", [CONFIG, UNARY_PART], ids=["every_unary", "relu_tanh"])
def test_directed_words(config):
    tally = check_words(directed_words(), config)
    assert all(tally.values()), tally          # every verdict was reached


@pytest.mark.parametrize("seed", [1, 2])
def test_random_words(seed):
    tally = check_words(random_words(1500, seed))
    assert all(tally.values()), tally


def test_an_all_zero_word_is_stored_as_zero_bits():
    """The program memory's power-on contents (all zero) must read as an all-zero word's
    fields and checks: opcode 0 is ILLEGAL_OPCODE, which the checks encode as all zero
    (``legal`` and ``field`` clear), the range flag is clear and so is every decision
    term."""
    assert expected(0) == {"legal": 0, "field": 0}
    seen = []
    dut = WordCheck(CONFIG)

    async def bench(ctx):
        ctx.set(dut.word, 0)
        seen.append(ctx.get(dut.stored.as_value()))

    sim = Simulator(dut)
    sim.add_testbench(bench)
    sim.run()
    assert seen == [0], f"an all-zero word is stored as {seen[0]:#x}, not 0"


def test_the_stored_word_fits_four_block_rams():
    """72 bits: four 18-bit-wide DP16KD at the board's program depth of 1,024."""
    assert STORED_WORD_LAYOUT.size == 72


#: The decision terms' opcode flags (``FETCHED_TERMS_LAYOUT``) and the opcodes that set them.
TERM_OPCODES = {"end": {Opcode.END}, "s_wr": {Opcode.S_WR}, "v_rd": {Opcode.V_RD},
                "mv_mul": {Opcode.MV_MUL}, "mfu_op": {Opcode.VV, Opcode.V_UNARY, Opcode.V_REDUCE},
                "v_wr": {Opcode.V_WR}, "end_chain": {Opcode.END_CHAIN}}


def expected_terms(w):
    """The decision terms of word ``w`` by the ISA's decoder: ``legal`` where it accepts
    the word, each opcode flag for a legal word of its opcodes, and for a legal ``vv``,
    ``v_unary`` or ``v_reduce`` the one-hot of its unit (0 for every other word)."""
    try:
        ins = decode(w)
    except IsaError:
        return {"legal": 0, "unit_bit": 0} | {name: 0 for name in TERM_OPCODES}
    out = {"legal": 1, "unit_bit": 0}
    out |= {name: int(ins.opcode in codes) for name, codes in TERM_OPCODES.items()}
    if out["mfu_op"]:
        out["unit_bit"] = 1 << expected(w)["unit"].value
    return out


def test_stored_terms_are_the_words_terms():
    """Directed and random words: the decision terms WordCheck stores with each word are
    those of the ISA's decoder. Every flag is seen set and clear, every unit's bit set."""
    words = directed_words() + random_words(1500, 3)
    dut = WordCheck(CONFIG)
    names = list(TERM_OPCODES) + ["legal", "unit_bit"]
    seen = []

    async def bench(ctx):
        for w in words:
            ctx.set(dut.word, w)
            seen.append({name: ctx.get(getattr(dut.stored.checks.terms, name)) for name in names})

    sim = Simulator(dut)
    sim.add_testbench(bench)
    sim.run()
    for w, got in zip(words, seen, strict=True):
        assert got == expected_terms(w), f"word {w:#018x}: terms {got}"
    for name in list(TERM_OPCODES) + ["legal"]:
        assert {got[name] for got in seen} == {0, 1}, name
    assert {got["unit_bit"] for got in seen} == {0, 1, 2, 4, 8}


def test_config_must_be_an_npu_config():
    with pytest.raises(TypeError, match="config must be an NpuConfig"):
        WordCheck(LIMITS)
