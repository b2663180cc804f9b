# amaranth: UnusedElaboratable=no
"""Tests of :class:`hw.arith.fp16_arith.Fp16Binary`, the MFUs' FP16 add/sub/mul/max unit.

* Simulator tests (cocotb bench ``sim/test_fp16_arith.py``, Verilator and Icarus, 8 lanes):
  every TestFloat ``f16_add``/``f16_sub``/``f16_mul`` case (sub also as ``b_sub_a``) and
  ``max`` from ``f16_lt``/``f16_le`` (Icarus a seeded random 12,000 of each file's
  46,464, every case with ``NPU_SOAK=1``: :func:`sim.fp16_vectors.conformance_cases`), and
  special plus random pairs against :mod:`host.numerics.fp16`, each with and without input gaps and output back-pressure, the
  operation changing from vector to vector; the latency.
* Amaranth's own simulator on one and three lanes (every pair of special operands).
* Constructor validation and the payload layouts.

The TestFloat files are looked up in ``$NPU_CONFORMANCE_DIR`` or else in
``<repo>/tests/data/conformance`` (``testfloat/`` below it); if they are missing the tests
fail.
"""

from collections import Counter

import numpy as np
import pytest
from amaranth.sim import Simulator

from host.spec.ops import BinaryOp
from host.numerics.fp16 import binary_bits, binary_events_bits
from hw.arith.fp16_arith import LATENCY, Fp16Binary, input_layout, output_layout
from sim.fp16_vectors import (
    SPECIALS, conformance_cases, find_testfloat, random_pairs, read_testfloat, take_sample,
)
from sim.runner import run_cocotb

BENCH = "sim.test_fp16_arith"
BOTH_STALLS = ("/stalls=False", "/stalls=True")
TESTFLOAT_FILES = ("f16_add.rne.txt.gz", "f16_sub.rne.txt.gz", "f16_mul.rne.txt.gz",
                   "f16_lt.rne.txt.gz", "f16_le.rne.txt.gz")


def _cases(*names):
    return [n + s for n in names for s in BOTH_STALLS]


def run_bench(simulator, *, lanes, testcases, count=0):
    dut = Fp16Binary(lanes=lanes)
    run_cocotb(
        name=f"fp16_binary_l{lanes}",
        component=dut,
        test_module=BENCH,
        simulator=simulator,
        testcase=",".join(testcases),
        extra_env={
            "FP16A_LANES": str(lanes),
            "FP16A_LATENCY": str(dut.latency),
            "FP16A_COUNT": str(count),
            "FP16A_TESTFLOAT_CASES": str(conformance_cases(simulator)),
        },
    )


def test_conformance(simulator):
    for name in TESTFLOAT_FILES:          # fail here, with the path, if one is missing
        try:
            find_testfloat(name)
        except FileNotFoundError as e:
            pytest.fail(str(e))
    run_bench(simulator, lanes=8, testcases=["test_latency", *_cases("test_conformance")])


def test_model(simulator):
    # Verilator runs about 15 times faster than Icarus: give it ten times the pairs.
    count = 400_000 if simulator == "verilator" else 40_000
    run_bench(simulator, lanes=8, count=count, testcases=_cases("test_model"))


def test_conformance_cases(monkeypatch):
    """Icarus's share of TestFloat: ``cases`` lines of the file, none twice, in file order,
    another draw for another seed; every line on Verilator and in a soak."""
    v = read_testfloat(find_testfloat("f16_add.rne.txt.gz"))
    rows = Counter(tuple(map(int, r)) for r in zip(*v))     # the file repeats some lines
    monkeypatch.delenv("NPU_SOAK", raising=False)
    assert conformance_cases("verilator") == 0
    cases = conformance_cases("icarus")
    assert 0 < cases < len(v.a)
    monkeypatch.setenv("NPU_SOAK", "1")
    assert conformance_cases("icarus") == 0
    one, other = take_sample(v, cases, seed=1), take_sample(v, cases, seed=2)
    for s in (one, other):
        lines = [tuple(map(int, r)) for r in zip(*s)]
        assert len(lines) == cases and Counter(lines) <= rows
        order = [np.flatnonzero((v.a == a) & (v.b == b))[0] for a, b, *_ in lines[:200]]
        assert order == sorted(order)
    assert not np.array_equal(one.a, other.a)
    # The file repeats its operand pairs for every operation: a seed per file (the
    # bench's) gives another sample of pairs for each operation.
    assert take_sample(v, 0, seed=1) is v
    for bad in (-1, len(v.a) + 1):
        with pytest.raises(ValueError, match=f"cases must be 0 \\(all\\) to {len(v.a)}, not {bad}"):
            take_sample(v, bad, seed=0)


# --- Amaranth simulator: every pair of special operands, odd lane counts ------------------

def _pysim(lanes, ops, a, b, built=None):
    """Run pairs through the unit built with ``built`` ops (default all), each op of
    ``ops`` on every pair; return (result, ovf, nan) per op."""
    dut = Fp16Binary(lanes=lanes, ops=built)
    n = len(a)
    pad = -n % lanes
    a = np.concatenate([a, np.zeros(pad, np.uint16)])
    b = np.concatenate([b, np.zeros(pad, np.uint16)])
    jobs = [(op, k) for op in ops for k in range(0, n + pad, lanes)]
    got = []

    async def bench(ctx):
        ctx.set(dut.o_stream.ready, 1)
        sent = 0
        while len(got) < len(jobs):
            if sent < len(jobs):
                op, k = jobs[sent]
                ctx.set(dut.i_stream.valid, 1)
                ctx.set(dut.i_stream.payload,
                        {"a": [int(x) for x in a[k:k + lanes]],
                         "b": [int(x) for x in b[k:k + lanes]], "op": op})
            else:
                ctx.set(dut.i_stream.valid, 0)
            _, _, ready, valid, payload = await ctx.tick().sample(
                dut.i_stream.ready, dut.o_stream.valid, dut.o_stream.payload)
            sent += int(ready and sent < len(jobs))
            if valid:
                got.append([(int(payload.result[j]), int(payload.overflow[j]),
                             int(payload.nan_created[j])) for j in range(lanes)])

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    out = {}
    for (op, k), lanes_out in zip(jobs, got):
        out.setdefault(op, []).extend(lanes_out)
    return {op: np.array(v[:n]) for op, v in out.items()}


@pytest.mark.parametrize("lanes", [1, 3])
def test_pysim_specials(lanes):
    sa, sb = (g.ravel() for g in np.meshgrid(SPECIALS, SPECIALS))
    ra, rb = random_pairs(np.random.default_rng(lanes), 300)
    a, b = np.concatenate([sa, ra]), np.concatenate([sb, rb])
    got = _pysim(lanes, list(BinaryOp), a, b)
    for op in BinaryOp:
        ev = binary_events_bits(op, a, b)
        exp = np.stack([binary_bits(op, a, b), ev.overflow, ev.nan_created], axis=1)
        bad = np.flatnonzero((got[op] != exp).any(axis=1))
        assert len(bad) == 0, [f"{op.name}({a[i]:04X}, {b[i]:04X}): got {got[op][i]}, "
                               f"expected {exp[i]}" for i in bad[:8]]


def _expected(op, a, b):
    ev = binary_events_bits(op, a, b)
    return np.stack([binary_bits(op, a, b), ev.overflow, ev.nan_created], axis=1)


@pytest.mark.parametrize("built", [
    (BinaryOp.ADD, BinaryOp.A_SUB_B, BinaryOp.B_SUB_A, BinaryOp.MAX),   # the MFU's ADDSUB
    (BinaryOp.MUL,),                                                     # the MFU's MUL
])
def test_pysim_subset(built):
    """A build of some ops computes them as the full build does, and every other op
    (not built) as ADD."""
    sa, sb = (g.ravel() for g in np.meshgrid(SPECIALS[::2], SPECIALS[1::2]))
    ra, rb = random_pairs(np.random.default_rng(len(built)), 200)
    a, b = np.concatenate([sa, ra]), np.concatenate([sb, rb])
    got = _pysim(3, list(BinaryOp), a, b, built=built)
    for op in BinaryOp:
        exp = _expected(op if op in built else BinaryOp.ADD, a, b)
        bad = np.flatnonzero((got[op] != exp).any(axis=1))
        assert len(bad) == 0, [f"{op.name}({a[i]:04X}, {b[i]:04X}): got {got[op][i]}, "
                               f"expected {exp[i]}" for i in bad[:8]]


# --- constructor and layouts -----------------------------------------------------------

# Objects built only to inspect them or to see __init__ raise are never elaborated; the
# first line of this file tells Amaranth not to warn about them.


def test_properties():
    dut = Fp16Binary(lanes=16)
    assert (dut.lanes, dut.latency) == (16, LATENCY) == (16, 6)
    assert dut.i_stream.payload.shape() == input_layout(16)
    assert dut.o_stream.payload.shape() == output_layout(16)
    assert input_layout(16).size == 32 * 16 + 3
    assert input_layout(4)["op"].shape is BinaryOp
    assert (input_layout(4)["op"].offset, output_layout(4)["nan_created"].offset) == \
        (128, 68)


@pytest.mark.parametrize("lanes, error, message", [
    (0, ValueError, "lanes must be from 1 to 64, not 0"),
    (65, ValueError, "lanes must be from 1 to 64, not 65"),
    (2.0, TypeError, "lanes must be an integer, not 2.0"),
    (True, TypeError, "lanes must be an integer, not True"),
    (None, TypeError, "lanes must be an integer, not None"),
])
def test_constructor_errors(lanes, error, message):
    with pytest.raises(error) as info:
        Fp16Binary(lanes=lanes)
    assert str(info.value) == message


def test_ops():
    assert Fp16Binary(lanes=2).ops == tuple(BinaryOp)
    assert Fp16Binary(lanes=2, ops=[BinaryOp.MAX, BinaryOp.ADD, BinaryOp.MAX]).ops == \
        (BinaryOp.ADD, BinaryOp.MAX)


@pytest.mark.parametrize("ops, error, message", [
    ([], ValueError, "ops must name at least one BinaryOp, not ()"),
    (BinaryOp.ADD, TypeError, "ops must be a collection of BinaryOp, not <BinaryOp.ADD: 0>"),
    ("add", TypeError, "ops must be a collection of BinaryOp, not 'add'"),
    (3, TypeError, "ops must be a collection of BinaryOp, not 3"),
    ([BinaryOp.ADD, 3], TypeError, "ops must be a collection of BinaryOp; 3 is not a BinaryOp"),
])
def test_ops_errors(ops, error, message):
    with pytest.raises(error) as info:
        Fp16Binary(lanes=4, ops=ops)
    assert str(info.value) == message


def test_keyword_only():
    with pytest.raises(TypeError):
        Fp16Binary(4)


def test_side_band_and_ready_under_stalls():
    """A side band leaves with its vector, in order, under random input gaps and
    back-pressure; ``i_stream.ready`` never changes with ``o_stream.ready`` inside a cycle
    (it is the skid register's flip-flop)."""
    lanes, side, n = 2, 7, 300
    dut = Fp16Binary(lanes=lanes, ops=(BinaryOp.ADD, BinaryOp.MUL), side=side)
    rng = np.random.default_rng(11)
    a, b = random_pairs(rng, n * lanes)
    a, b = a.reshape(n, lanes), b.reshape(n, lanes)
    ops = rng.choice([BinaryOp.ADD, BinaryOp.MUL], n)
    tags = rng.integers(0, 1 << side, n)
    got, ready_seen = [], set()

    async def bench(ctx):
        sent = 0
        while len(got) < n:
            offer = sent < n and rng.random() < 0.7
            ctx.set(dut.i_stream.valid, offer)
            if offer:
                ctx.set(dut.i_stream.payload, {
                    "a": [int(x) for x in a[sent]], "b": [int(x) for x in b[sent]],
                    "op": ops[sent], "side": int(tags[sent])})
            # i_stream.ready must be the same with o_stream.ready low and high.
            ctx.set(dut.o_stream.ready, 0)
            low = ctx.get(dut.i_stream.ready)
            ctx.set(dut.o_stream.ready, 1)
            assert ctx.get(dut.i_stream.ready) == low
            ready_seen.add(low)
            ctx.set(dut.o_stream.ready, int(rng.random() < 0.5))
            _, _, i_ready, o_valid, o_ready, payload = await ctx.tick().sample(
                dut.i_stream.ready, dut.o_stream.valid, dut.o_stream.ready,
                dut.o_stream.payload)
            sent += int(offer and i_ready)
            if o_valid and o_ready:
                got.append((int(payload.side),
                            [int(payload.result[j]) for j in range(lanes)]))

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert ready_seen == {0, 1}           # the skid register did fill
    assert [t for t, _ in got] == [int(t) for t in tags]
    for k, (_, res) in enumerate(got):
        assert res == [int(binary_bits(ops[k], a[k, j:j + 1], b[k, j:j + 1])[0])
                       for j in range(lanes)], k


def test_side_layouts_and_errors():
    dut = Fp16Binary(lanes=4, side=5)
    assert dut.side == 5 and Fp16Binary(lanes=4).side == 0
    assert (input_layout(4, 5)["side"].offset, output_layout(4, 5)["side"].offset) == \
        (131, 72)
    assert dut.o_stream.payload.shape() == output_layout(4, 5)
    with pytest.raises(ValueError, match="^side must be from 0 to 64, not 65$"):
        Fp16Binary(lanes=4, side=65)
    with pytest.raises(TypeError, match="^side must be an integer, not '3'$"):
        Fp16Binary(lanes=4, side="3")
