"""cocotb bench for :class:`hw.mvm.convert.FixedToFp16` (``tests/hw/test_fp16_convert_hw.py``).

The whole lane array is driven as one packed integer per transfer and every output is
compared, in order, with a reference:

* ``test_conformance``: Berkeley TestFloat ``i32_to_f16`` / ``i64_to_f16`` vectors
  (``lsb = 0``); with ``saturate`` the overflowing cases become +-65504, the others
  are unchanged, and ``overflow`` must equal TestFloat's overflow flag.
* ``test_model``: :func:`host.numerics.mvm.fixed_to_fp16`, on every input when ``width`` is
  small, otherwise on values near every FP16 rounding boundary plus a random mix.
* ``test_latency``: the documented latency and one vector per cycle.

The conformance and model tests run with and without random input gaps and output
back-pressure; monitors on both streams (``sim.stream``) check that a stalled payload
holds until taken.

Parameters come from the environment (set by the pytest wrapper):
``FP16C_LANES``, ``FP16C_WIDTH``, ``FP16C_LSB``, ``FP16C_ROUNDING`` (``nearest-even`` /
``nearest-away``), ``FP16C_SATURATE`` (0/1), ``FP16C_LATENCY``, ``FP16C_VECTORS``
(comma-separated TestFloat files for ``test_conformance``), ``FP16C_COUNT`` (number of
random values for ``test_model`` when not exhaustive).
"""

from __future__ import annotations

import gzip
import os
import random

import cocotb
import numpy as np

from host.spec.formats import FP16_FRAC_BITS, FP16_MAX_BITS, FP16_MAX_EXP, FP16_MIN_EXP
from host.numerics.mvm import fixed_to_fp16
from sim.stream import UnitBench

LANES = int(os.environ.get("FP16C_LANES", "4"))
WIDTH = int(os.environ.get("FP16C_WIDTH", "32"))
LSB = int(os.environ.get("FP16C_LSB", "0"))
ROUNDING = os.environ.get("FP16C_ROUNDING", "nearest-even")
SATURATE = os.environ.get("FP16C_SATURATE", "1") == "1"
LATENCY = int(os.environ.get("FP16C_LATENCY", "4"))
VECTORS = [p for p in os.environ.get("FP16C_VECTORS", "").split(",") if p]
COUNT = int(os.environ.get("FP16C_COUNT", "20000"))
#: Widths up to this are tested on every input value.
EXHAUSTIVE_WIDTH = 14

A_MIN, A_MAX = -(1 << (WIDTH - 1)), (1 << (WIDTH - 1)) - 1
A_MASK = (1 << WIDTH) - 1
INF_BITS = 0x7C00
#: Model calls are made this many values at a time.
BATCH = 4096
CLOCK_NS = 10
#: Probability of an idle input cycle / of a back-pressured output cycle with stalls.
IDLE_PROB = 0.3
BACKPRESSURE_PROB = 0.4


# --- stimulus ------------------------------------------------------------------------------

def _on_grid(num: int, exp: int, lsb: int) -> list[int]:
    """Inputs (units of ``2**lsb``) nearest to ``num * 2**exp``: itself, or floor and ceil."""
    shift = exp - lsb
    if shift >= 0:
        return [num << shift]
    f = num >> -shift
    return [f, f + 1]


def boundary_values(width: int, lsb: int) -> list[int]:
    """Inputs on and +-1, +-2 LSB around FP16 rounding boundaries, both signs.

    For every binade from ``2**-26`` (below the smallest subnormal) to ``2**16`` (past
    65504) and a few significands in it (the first, the last, the middle, even and odd):
    the representable value and the tie above it. So ties and their neighbours at every
    exponent, 65504 / 65520 / 65536, the subnormal range and ``2**-24``, ``2**-25``. Then
    every ``+-2**k`` and ``+-(2**k - 1)`` of the input range, 0, -1, the extremes.
    """
    lo, hi = -(1 << (width - 1)), (1 << (width - 1)) - 1
    out = {0, 1, -1, lo, lo + 1, hi, hi - 1}

    def add(candidates):
        for c in candidates:
            for d in (-2, -1, 0, 1, 2):
                for v in (c + d, -(c + d)):
                    if lo <= v <= hi:
                        out.add(v)

    for e in range(FP16_MIN_EXP - 2, FP16_MAX_EXP + 2):
        q = max(e - FP16_FRAC_BITS, FP16_MIN_EXP)        # the binade's last place
        if e < q:                                        # below the smallest subnormal
            add(_on_grid(1, e, lsb))
            add(_on_grid(3, e - 1, lsb))
            continue
        start, end = 1 << (e - q), (2 << (e - q)) - 1    # significands of the binade
        mid = (start + end) // 2
        for s in {start, start + 1, mid & ~1, mid | 1, end - 1, end}:
            if start <= s <= end:
                add(_on_grid(s, q, lsb))                  # representable
                add(_on_grid(2 * s + 1, q - 1, lsb))      # tie above it
    for k in range(width):
        add([1 << k, (1 << k) - 1])
    return sorted(out)


def random_values(rng: random.Random, count: int, width: int, lsb: int) -> list[int]:
    """A mix: uniform bit length then uniform bits (half), near-boundary values (half).

    Near-boundary values are a representable FP16 value or a tie, put on the input grid,
    then moved by 0, +-1 or a random amount below the tie's place (which only the sticky
    bit sees), with a random sign.
    """
    lo, hi = -(1 << (width - 1)), (1 << (width - 1)) - 1
    vals = []
    while len(vals) < count:
        if rng.random() < 0.5:
            nbits = rng.randrange(width)                   # 0 .. width-1
            v = rng.getrandbits(nbits) if nbits else 0
            if nbits:
                v |= 1 << (nbits - 1)                      # exactly that bit length
        else:
            e = rng.randrange(FP16_MIN_EXP - 2, FP16_MAX_EXP + 2)
            q = max(e - FP16_FRAC_BITS, FP16_MIN_EXP)
            if e < q:
                num, exp = rng.choice([(1, e), (3, e - 1)])
            else:
                s = rng.randrange(1 << (e - q), 2 << (e - q))
                num, exp = rng.choice([(s, q), (2 * s + 1, q - 1)])
            v = rng.choice(_on_grid(num, exp, lsb))
            r = rng.random()
            if r < 0.3:
                v += rng.choice((-1, 1))
            elif r < 0.6 and exp - 1 - lsb > 0:
                j = rng.randrange(exp - 1 - lsb)
                v += rng.randrange(-(1 << j), (1 << j) + 1)
        v = -v if rng.random() < 0.5 else v
        if lo <= v <= hi:
            vals.append(v)
    return vals


def model(values: list[int]) -> tuple[list[int], list[int]]:
    """Expected (bits, overflow) from the reference model, in batches."""
    bits, over = [], []
    for i in range(0, len(values), BATCH):
        b, o = fixed_to_fp16(np.array(values[i:i + BATCH], dtype=object), LSB, ROUNDING,
                             SATURATE)
        bits += [int(x) for x in b]
        over += [int(x) for x in o]
    return bits, over


def read_testfloat(path: str) -> tuple[list[int], list[int], list[int]]:
    """TestFloat ``iN_to_f16`` lines: (signed inputs, result bits, overflow flags)."""
    values, bits, over = [], [], []
    with gzip.open(path, "rt") as f:
        for line in f:
            fields = line.split()
            if not fields:
                continue
            a_hex, r_hex, flags_hex = fields
            nbits = 4 * len(a_hex)
            a = int(a_hex, 16)
            a -= (a >> (nbits - 1)) << nbits                 # two's complement
            values.append(a)
            bits.append(int(r_hex, 16))
            over.append(int(bool(int(flags_hex, 16) & 0x04)))
    return values, bits, over


# --- bench ---------------------------------------------------------------------------------

def pack_lanes(values: list[int]) -> int:
    """One input payload: lane ``i`` at bits ``[i*WIDTH, (i+1)*WIDTH)``."""
    word = 0
    for i, v in enumerate(values):
        word |= (v & A_MASK) << (i * WIDTH)
    return word


def unpack_output(word: int) -> tuple[list[int], list[int]]:
    """One output payload: ``bits`` lanes then ``overflow`` lanes."""
    bits = [(word >> (16 * i)) & 0xFFFF for i in range(LANES)]
    over = [(word >> (16 * LANES + i)) & 1 for i in range(LANES)]
    return bits, over


class TB(UnitBench):
    """:class:`sim.stream.UnitBench` and the comparison with expectations."""

    def __init__(self, dut, stalls: bool):
        super().__init__(dut, random.Random(random.getrandbits(64)),
                         idle_prob=IDLE_PROB if stalls else 0.0,
                         backpressure_prob=BACKPRESSURE_PROB if stalls else 0.0,
                         clock_ns=CLOCK_NS)
        self.stalls = stalls

    async def run(self, values: list[int]) -> list[tuple[int, int]]:
        """Send ``values`` (padded with zeros to whole vectors); return (bits, overflow).

        :raises AssertionError: :meth:`sim.stream.UnitBench.transfer` failed.
        """
        n_vec = -(-len(values) // LANES)
        values = values + [0] * (n_vec * LANES - len(values))
        words = [pack_lanes(values[i:i + LANES]) for i in range(0, len(values), LANES)]
        got = []
        for word in (await self.transfer(words, LATENCY))[0]:
            bits, over = unpack_output(word)
            got += list(zip(bits, over))
        return got

    def check(self, values, got, exp_bits, exp_over, what: str) -> None:
        bad = []
        for i, v in enumerate(values):
            if got[i] != (exp_bits[i], exp_over[i]):
                bad.append(i)
        for i in bad[:10]:
            self.dut._log.error(
                "%s: input %d (%#x) lane %d: got bits %#06x overflow %d, expected %#06x %d",
                what, values[i], values[i] & A_MASK, i % LANES, got[i][0], got[i][1],
                exp_bits[i], exp_over[i])
        self.dut._log.info("%s: %d values, %d mismatches, %d output stall checks", what,
                           len(values), len(bad), self.outputs.stall_checks)
        assert not bad, f"{what}: {len(bad)} of {len(values)} outputs differ"
        if self.stalls:
            assert self.outputs.stall_checks > 0, f"{what}: no back-pressured output cycle"


@cocotb.test()
async def test_latency(dut):
    """Without stalls, output k leaves LATENCY cycles after input k, one per cycle."""
    tb = TB(dut, stalls=False)
    await tb.start()
    values = boundary_values(WIDTH, LSB)
    values = values[::max(1, len(values) // (LANES * 32))][:LANES * 32]   # spread out
    got = await tb.run(values)
    exp_bits, exp_over = model(values)
    tb.check(values, got, exp_bits, exp_over, "latency burst")
    acc, out = tb.inputs.cycles, tb.outputs.cycles
    assert all(b - a == 1 for a, b in zip(acc, acc[1:])), "input not accepted every cycle"
    lat = [o - a for a, o in zip(acc, out)]
    assert set(lat) == {LATENCY}, f"latency {sorted(set(lat))}, documented {LATENCY}"


@cocotb.test()
@cocotb.parametrize(stalls=[False, True])
async def test_conformance(dut, stalls):
    """TestFloat integer-to-FP16 vectors; bits and overflow flag must all match."""
    assert VECTORS, "FP16C_VECTORS names no TestFloat file"
    tb = TB(dut, stalls)
    await tb.start()
    for path in VECTORS:
        assert os.path.isfile(path), f"TestFloat file {path} is missing"
        values, exp_bits, exp_over = read_testfloat(path)
        assert values, f"no vectors in {path}"
        assert all(A_MIN <= v <= A_MAX for v in values), f"{path} does not fit {WIDTH} bits"
        if SATURATE:
            exp_bits = [(b & 0x8000) | FP16_MAX_BITS if o else b
                        for b, o in zip(exp_bits, exp_over)]
        else:
            assert all(((b & 0x7FFF) == INF_BITS) == bool(o)
                       for b, o in zip(exp_bits, exp_over)), "overflow flag without inf"
        got = await tb.run(values)
        tb.check(values, got, exp_bits, exp_over, os.path.basename(path))


@cocotb.test()
@cocotb.parametrize(stalls=[False, True])
async def test_model(dut, stalls):
    """Bit-exact against host.numerics.mvm.fixed_to_fp16 (exhaustive for small widths)."""
    tb = TB(dut, stalls)
    await tb.start()
    if WIDTH <= EXHAUSTIVE_WIDTH:
        values = list(range(A_MIN, A_MAX + 1))
        tb.rng.shuffle(values)
        what = "every input"
    else:
        values = boundary_values(WIDTH, LSB)
        values += random_values(tb.rng, max(0, COUNT - len(values)), WIDTH, LSB)
        what = f"{len(values)} boundary and random inputs"
    exp_bits, exp_over = model(values)
    got = await tb.run(values)
    tb.check(values, got, exp_bits, exp_over, what)
