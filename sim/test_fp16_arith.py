"""cocotb bench for :class:`hw.arith.fp16_arith.Fp16Binary` (``tests/hw/test_fp16_arith_hw.py``).

Every vector carries one operation for all its lanes; vectors of different operations
are interleaved, so the run-time operation switch is exercised all the time. Every
output lane is checked, in order: result bits, ``overflow`` and ``nan_created``.

* ``test_conformance``: Berkeley TestFloat ``f16_add``, ``f16_sub`` (also as ``b_sub_a``
  with the operands swapped) and ``f16_mul`` (``.rne``), all 46,464 cases each (or a
  seeded random ``FP16A_TESTFLOAT_CASES`` of each file: Icarus in ``make test``), NaN
  results exactly ``0x7E00``, ``overflow`` equal to TestFloat's overflow flag and
  ``nan_created`` to its invalid flag without a NaN operand; ``max`` against the maximum
  derived from ``f16_lt`` and ``f16_le`` (:func:`sim.fp16_vectors.max_from_compare`).
* ``test_model``: every pair of the special operands under every operation, then random
  and hard-case pairs (:func:`sim.fp16_vectors.random_pairs`), against
  :func:`host.numerics.fp16.binary_bits` and :func:`host.numerics.fp16.binary_events_bits`.
* ``test_latency``: the documented latency and one vector per cycle.

The conformance and model tests run with and without random input gaps and output
back-pressure (the bus models of ``sim.stream``); a monitor checks that a stalled output
holds its payload, and the bench that nothing comes out that did not go in.

Parameters from the environment (set by the pytest wrapper): ``FP16A_LANES``,
``FP16A_LATENCY``, ``FP16A_COUNT`` (random pairs per ``test_model`` run),
``FP16A_TESTFLOAT_CASES`` (cases per TestFloat file, 0 for all:
:func:`sim.fp16_vectors.conformance_cases`).
"""

from __future__ import annotations

import os
import random
import zlib

import cocotb
import numpy as np

from host.spec.formats import CANONICAL_NAN
from host.spec.ops import BinaryOp
from host.numerics.fp16 import binary_bits, binary_events_bits
from sim.fp16_vectors import (
    FLAG_INVALID, FLAG_OVERFLOW, SPECIALS, find_testfloat, is_nan, max_from_compare,
    random_pairs, read_testfloat, take_sample,
)
from sim.stream import UnitBench

LANES = int(os.environ.get("FP16A_LANES", "8"))
LATENCY = int(os.environ.get("FP16A_LATENCY", "6"))
COUNT = int(os.environ.get("FP16A_COUNT", "20000"))
TESTFLOAT_CASES = int(os.environ.get("FP16A_TESTFLOAT_CASES", "0"))


# --- vectors: (op, a lanes, b lanes, expected result, overflow, nan_created) ----------------

class Batch:
    """Pairs under one operation with their expected outputs (NumPy arrays)."""

    def __init__(self, op, a, b, result, overflow, nan_created, what):
        self.op, self.a, self.b = op, a, b
        self.result, self.overflow, self.nan_created = result, overflow, nan_created
        self.what = what

    @classmethod
    def from_model(cls, op, a, b, what):
        ev = binary_events_bits(op, a, b)
        return cls(op, a, b, binary_bits(op, a, b), ev.overflow, ev.nan_created, what)

    def vectors(self):
        """Split into vectors of LANES lanes; the last is padded with the first pair."""
        n = len(self.a)
        pad = -n % LANES
        idx = np.concatenate([np.arange(n), np.zeros(pad, dtype=np.int64)])
        for k in range(0, n + pad, LANES):
            sel = idx[k:k + LANES]
            yield Vector(self, sel)


class Vector:
    def __init__(self, batch: Batch, sel):
        self.batch, self.sel = batch, sel

    def word(self) -> int:
        """The i_stream payload: a lanes, b lanes, then the op code."""
        b = self.batch
        w = b.op.value << (32 * LANES)
        for j, i in enumerate(self.sel):
            w |= int(b.a[i]) << (16 * j)
            w |= int(b.b[i]) << (16 * (LANES + j))
        return w

    def check(self, word: int, log) -> int:
        """Compare one o_stream payload; log and return the number of bad lanes."""
        b = self.batch
        bad = 0
        for j, i in enumerate(self.sel):
            got = ((word >> (16 * j)) & 0xFFFF, (word >> (16 * LANES + j)) & 1,
                   (word >> (17 * LANES + j)) & 1)
            exp = (int(b.result[i]), int(b.overflow[i]), int(b.nan_created[i]))
            if got != exp:
                bad += 1
                log.error("%s: %s(%04X, %04X) lane %d: got %04X overflow %d nan_created %d, "
                          "expected %04X %d %d", b.what, b.op.name, int(b.a[i]), int(b.b[i]),
                          j, *got, *exp)
        return bad


def testfloat_batches(cases: int = 0) -> list[Batch]:
    """The TestFloat cases of add, sub (as a - b and as b - a), mul, and max from lt/le:
    every case, or a seeded random ``cases`` of each file (the same for every run)."""
    batches = []

    def read(name):
        # A seed per file: the files list the same operand pairs in the same order.
        return take_sample(read_testfloat(find_testfloat(name)), cases,
                           seed=zlib.crc32(name.encode()))
    for op, name, swap in [(BinaryOp.ADD, "f16_add.rne.txt.gz", False),
                           (BinaryOp.A_SUB_B, "f16_sub.rne.txt.gz", False),
                           (BinaryOp.B_SUB_A, "f16_sub.rne.txt.gz", True),
                           (BinaryOp.MUL, "f16_mul.rne.txt.gz", False)]:
        v = read(name)
        a, b = (v.b, v.a) if swap else (v.a, v.b)
        result = np.where(is_nan(v.result), CANONICAL_NAN, v.result).astype(np.uint16)
        overflow = (v.flags & FLAG_OVERFLOW) != 0
        # TestFloat raises invalid for signalling NaN operands too: those propagate.
        created = ((v.flags & FLAG_INVALID) != 0) & ~is_nan(a) & ~is_nan(b)
        batches.append(Batch(op, a, b, result, overflow, created, f"{name} as {op.name}"))
    for name in ("f16_lt.rne.txt.gz", "f16_le.rne.txt.gz"):
        v = read(name)
        none = np.zeros(len(v.a), dtype=bool)
        batches.append(Batch(BinaryOp.MAX, v.a, v.b, max_from_compare(v.a, v.b, v.result),
                             none, none, f"max from {name}"))
    return batches


def model_batches(rng: np.random.Generator, count: int) -> list[Batch]:
    """Every pair of special operands under every op, then ``count`` random pairs."""
    sa, sb = (g.ravel() for g in np.meshgrid(SPECIALS, SPECIALS))
    batches = [Batch.from_model(op, sa, sb, "specials") for op in BinaryOp]
    per_op = -(-count // len(BinaryOp))
    for op in BinaryOp:
        a, b = random_pairs(rng, per_op)
        batches.append(Batch.from_model(op, a, b, "random"))
    return batches


def interleave(rng: random.Random, batches: list[Batch]) -> list[Vector]:
    """All vectors of all batches in a random order (ops change from vector to vector)."""
    vectors = [v for b in batches for v in b.vectors()]
    rng.shuffle(vectors)
    return vectors


# --- testbench -------------------------------------------------------------------------------

CLOCK_NS = 10
IDLE_PROB = 0.3             # input gaps with stalls
BACKPRESSURE_PROB = 0.4     # o_stream.ready low with stalls


class TB(UnitBench):
    """:class:`sim.stream.UnitBench` and the comparison with expectations."""

    def __init__(self, dut, stalls: bool):
        rng = random.Random(random.getrandbits(64))
        super().__init__(dut, rng, idle_prob=IDLE_PROB if stalls else 0.0,
                         backpressure_prob=BACKPRESSURE_PROB if stalls else 0.0,
                         clock_ns=CLOCK_NS)
        self.stalls = stalls
        self.np_rng = np.random.default_rng(rng.getrandbits(64))

    async def run(self, vectors: list[Vector], what: str) -> None:
        """Send ``vectors``, receive as many outputs, check every lane.

        :raises AssertionError: a lane differs, (with stalls) no output was
            back-pressured, or :meth:`sim.stream.UnitBench.transfer` failed.
        """
        words, stalls = await self.transfer([v.word() for v in vectors], LATENCY)
        bad = 0
        for v, word in zip(vectors, words):
            if bad < 20:
                bad += v.check(word, self.dut._log)
            else:
                bad += v.check(word, _Quiet())
        pairs = sum(len(v.sel) for v in vectors)
        self.dut._log.info("%s: %d vectors (%d lanes), %d bad lanes, %d output stall checks",
                           what, len(vectors), pairs, bad, stalls)
        assert not bad, f"{what}: {bad} of {pairs} lanes differ"
        if self.stalls:
            assert stalls > 0, f"{what}: no back-pressured output cycle"


class _Quiet:
    def error(self, *args):
        pass


@cocotb.test()
async def test_latency(dut):
    """Without stalls, output k leaves LATENCY cycles after input k, one per cycle."""
    tb = TB(dut, stalls=False)
    await tb.start()
    vectors = interleave(tb.rng, model_batches(tb.np_rng, 64 * LANES))[:64]
    await tb.run(vectors, "latency burst")
    acc, out = tb.inputs.cycles, tb.outputs.cycles
    assert all(b - a == 1 for a, b in zip(acc, acc[1:])), "input not accepted every cycle"
    lat = [o - a for a, o in zip(acc, out)]
    assert set(lat) == {LATENCY}, f"latency {sorted(set(lat))}, documented {LATENCY}"


@cocotb.test()
@cocotb.parametrize(stalls=[False, True])
async def test_conformance(dut, stalls):
    """TestFloat add/sub/mul and max from lt/le (all cases, or ``TESTFLOAT_CASES`` of each
    file); bits and flags exact."""
    tb = TB(dut, stalls)
    await tb.start()
    batches = testfloat_batches(TESTFLOAT_CASES)
    assert all(len(b.a) == (TESTFLOAT_CASES or 46_464) for b in batches)
    await tb.run(interleave(tb.rng, batches), "TestFloat")


@cocotb.test()
@cocotb.parametrize(stalls=[False, True])
async def test_model(dut, stalls):
    """Special operand pairs and random pairs against host.numerics.fp16, all five operations."""
    tb = TB(dut, stalls)
    await tb.start()
    await tb.run(interleave(tb.rng, model_batches(tb.np_rng, COUNT)), "model")
