"""The program word's checks done at write time (``hw.core.decode.WordCheck``), and the
terms the front end registers from the fetched word (``hw.core.decode.FetchedTerms``), in
Amaranth's simulator, against the ISA's own decoder (``host.spec.isa.decode``) and the
model's register ranges (``host.spec.isa.register_limits``).

The core keeps ``WordCheck``'s verdict beside each word and fails a run on it instead of
decoding the fetched word (``hw.core.npu``); the core benches (``tests/hw/test_npu_hw.py``)
run illegal words and out-of-range ``s_wr`` through the whole core under Verilator and
Icarus, this file sweeps the word space of the checks alone: every opcode code with each
field that must be zero set, every register's range edges, and seeded random words.
"""

import random

import pytest
from amaranth.hdl import Module
from amaranth.sim import Simulator

from host.spec.config import parse_config
from host.spec.isa import (
    FIELDS,
    ErrorCode,
    IsaError,
    Opcode,
    Reg,
    Space,
    decode,
    register_limits,
)
from host.spec.mfu import MfuOp
from hw.core.decode import FetchedTerms, Verdict, WordCheck

#: Preset ulx3s_n4 has every unary function; UNARY_PART builds only relu and tanh.
CONFIG = parse_config("ulx3s_n4")
UNARY_PART = parse_config("ulx3s_n4,unary_ops=relu+tanh")
LIMITS = register_limits(CONFIG)
VERDICT_OF = {ErrorCode.NONE: Verdict.NONE, ErrorCode.ILLEGAL_OPCODE: Verdict.ILLEGAL_OPCODE,
              ErrorCode.ILLEGAL_FIELD: Verdict.ILLEGAL_FIELD}


def word(**fields):
    """A 64-bit word from field values (``host.spec.isa.FIELDS``; absent ones zero)."""
    out = 0
    for name, value in fields.items():
        off, width = FIELDS[name]
        assert 0 <= value < (1 << width), (name, value)
        out |= value << off
    return out


def expected(w, config=CONFIG):
    """``{field: value}`` of ``PREDECODE_LAYOUT`` for word ``w`` by the ISA
    (``host.spec.isa.decode``), the model's register ranges and the MFU units of
    ``host.spec.mfu.allocate``; only the verdict where it is not NONE (the core reads the
    other fields only then)."""
    try:
        ins = decode(w)
    except IsaError as e:
        return {"verdict": VERDICT_OF[e.code]}
    out = {"verdict": Verdict.NONE, "s_wr_out_of_range": False, "unary_unbuilt": False}
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
    """Run ``words`` through ``WordCheck(config)``; assert each against :func:`expected`;
    return how many words got each verdict."""
    dut = WordCheck(config)
    seen = []

    async def bench(ctx):
        for w in words:
            ctx.set(dut.word, w)
            seen.append({name: ctx.get(getattr(dut.predecode, name))
                         for name in ("verdict", "s_wr_out_of_range", "unit", "unary_unbuilt")})

    sim = Simulator(dut)
    sim.add_testbench(bench)
    sim.run()
    tally = {v: 0 for v in Verdict}
    for w, got in zip(words, seen):
        for name, want in expected(w, config).items():
            assert got[name] == want, f"word {w:#018x}: {name} {got[name]!r}, expected {want!r}"
        tally[Verdict(got["verdict"])] += 1
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
    checks: the verdict of opcode 0 is code 0 and the range flag is clear."""
    assert expected(0) == {"verdict": Verdict.ILLEGAL_OPCODE}
    assert Verdict.ILLEGAL_OPCODE.value == 0
    seen = []
    dut = WordCheck(CONFIG)

    async def bench(ctx):
        ctx.set(dut.word, 0)
        seen.append(ctx.get(dut.predecode.as_value()))

    sim = Simulator(dut)
    sim.add_testbench(bench)
    sim.run()
    assert seen == [0], f"an all-zero word's checks are {seen[0]:#x}, not 0"


#: FetchedTerms' opcode flags and the opcodes that set them.
TERM_OPCODES = {"end": {Opcode.END}, "s_wr": {Opcode.S_WR}, "v_rd": {Opcode.V_RD},
                "mv_mul": {Opcode.MV_MUL}, "mfu_op": {Opcode.VV, Opcode.V_UNARY, Opcode.V_REDUCE},
                "v_wr": {Opcode.V_WR}, "end_chain": {Opcode.END_CHAIN}}


def expected_terms(w):
    """FetchedTerms' terms of word ``w`` by the ISA's decoder: ``illegal`` where it refuses
    the word, each opcode flag for a legal word of its opcodes; for a legal word the
    one-hot of the op's unit (of ADDSUB, unit code 0, for a word that is not an op). The
    unit of an illegal word is not read (the core fails the run on it), so not compared."""
    try:
        ins = decode(w)
    except IsaError:
        return {"illegal": 1} | {name: 0 for name in TERM_OPCODES}
    out = {"illegal": 0, "unit_bit": 1}
    out |= {name: int(ins.opcode in codes) for name, codes in TERM_OPCODES.items()}
    unit = expected(w).get("unit")
    if unit is not None:
        out["unit_bit"] = 1 << unit.value
    return out


def run_terms(words):
    """Clock ``words`` through WordCheck (as the host's write stores them) into
    FetchedTerms' read data, one per cycle; return the terms before the first edge and
    after each."""
    m = Module()
    m.submodules.check = check = WordCheck(CONFIG)
    m.submodules.terms = dut = FetchedTerms()
    m.d.comb += dut.stored.eq(check.word | (check.predecode.as_value() << 64))
    names = list(TERM_OPCODES) + ["illegal", "unit_bit"]
    seen = []

    async def bench(ctx):
        seen.append({name: ctx.get(getattr(dut.terms, name)) for name in names})
        for w in words:
            ctx.set(check.word, w)
            await ctx.tick()
            seen.append({name: ctx.get(getattr(dut.terms, name)) for name in names})

    sim = Simulator(m)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    return seen


def test_fetched_terms_are_the_words_terms_a_cycle_later():
    """Directed and random words: after each edge the terms are those of the word read
    the cycle before (the word iw takes at that edge), and before the first edge those of
    the all-zero word, iw's reset value. Every flag is seen set and clear."""
    words = directed_words() + random_words(1500, 3)
    assert words[0] == 0
    seen = run_terms(words)
    assert seen[0] == seen[1], f"reset terms {seen[0]}, the all-zero word's {seen[1]}"
    for w, got in zip(words, seen[1:], strict=True):
        want = expected_terms(w)
        assert {k: got[k] for k in want} == want, f"word {w:#018x}: terms {got}"
    for name in TERM_OPCODES:
        assert {got[name] for got in seen} == {0, 1}, name
    assert {got["unit_bit"] for got in seen} == {1, 2, 4, 8}


def test_config_must_be_an_npu_config():
    with pytest.raises(TypeError, match="config must be an NpuConfig"):
        WordCheck(LIMITS)
