"""cocotb bench for :class:`hw.arith.fp16_reduce.Fp16Reduce` (``tests/hw/test_fp16_reduce_hw.py``).

Logical vectors go in as native vectors; every output vector (every lane and ``last``)
and the event totals are checked against :func:`host.numerics.reduction.reduce_vectors_bits`.
Lanes past ``lanes_last`` carry random bit patterns (NaNs included) with their ``keep``
bits clear, and every fourth logical vector also clears random ``keep`` bits of its other
lanes, which the model is given as the identity (``-0``, ``-inf``): the unit must ignore
what those lanes carry.

* ``test_random``: random logical lengths ``1 .. max_length * lanes`` (lengths 1, whole
  native vectors and the longest drawn on purpose), both ops mixed, six value styles in
  turn (:func:`random_logical_vector`);
* ``test_directed``: all NaN, ``inf`` with ``-inf``, overflowing sums, all ``-0``, signed
  zeros under max, subnormals, lone non-canonical NaNs, tie-order cases, every length
  of a few native vectors;
* ``test_throughput``: without stalls, logical vectors of one length follow each other
  with one native vector accepted and one sent every cycle; the first output comes
  ``latency`` cycles after the last input;

each of the first two with and without random idle input cycles and output
back-pressure. Events: the per-cycle counts are summed and must equal the model's
totals, and by the cycle a logical vector's last output vector leaves, at least the
events of it and all before it must have been reported.

Parameters from the environment (set by the pytest wrapper): ``RED_LANES``,
``RED_MAX_LENGTH``, ``RED_COUNT`` (random logical vectors per ``test_random`` run).
"""

from __future__ import annotations

import os
import random

import cocotb
import numpy as np
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, RisingEdge

from host.spec.ops import IDENTITY, ReduceOp
from host.numerics.reduction import reduce_vectors_bits
from hw.arith.fp16_reduce import Fp16Reduce, input_layout
from sim.fp16_vectors import SPECIALS
from sim.stream import StreamMonitor, StreamSink, StreamSource, stream_signals

LANES = int(os.environ.get("RED_LANES", "4"))
MAX_LENGTH = int(os.environ.get("RED_MAX_LENGTH", "8"))
COUNT = int(os.environ.get("RED_COUNT", "200"))
CLOCK_NS = 10
IDLE_PROB = 0.3
BACKPRESSURE_PROB = 0.3
#: Cycles the output is held at the start of a stalled run (more than the unit holds).
SQUEEZE_CYCLES = 400
DRAIN_CYCLES = 8


# --- stimulus -------------------------------------------------------------------------------

STYLES = 6


def random_logical_vector(rng: np.random.Generator, n: int, style=None) -> np.ndarray:
    """``n`` FP16 bit patterns in one of :data:`STYLES` styles (random unless given), so
    that long sums stay finite often enough to be interesting while specials, overflows,
    created NaNs and cancellations all occur: 0 any bits; 1 finite values of both signs
    near one binade; 2 large positive values (overflowing sums); 3 subnormals and zeros
    of both signs; 4 finite values with 5 % specials (:data:`sim.fp16_vectors.SPECIALS`);
    5 finite values with 10 % infinities of either sign (``inf - inf``)."""
    style = rng.integers(STYLES) if style is None else style
    sign = rng.integers(0, 2, n) << 15
    frac = rng.integers(0, 1024, n)
    if style == 0:
        x = rng.integers(0, 1 << 16, n)
    elif style == 1:
        exp = np.clip(rng.integers(1, 31) + rng.integers(-3, 2, n), 0, 30)
        x = sign | (exp << 10) | frac
    elif style == 2:
        x = (rng.integers(27, 31, n) << 10) | frac
    elif style == 3:
        x = sign | frac * rng.integers(0, 2, n)
    else:
        x = sign | (rng.integers(0, 31, n) << 10) | frac
        hit = rng.random(n) < (0.05 if style == 4 else 0.1)
        x[hit] = (rng.choice(SPECIALS, hit.sum()) if style == 4
                  else rng.choice([0x7C00, 0xFC00], hit.sum()))
    return x.astype(np.uint16)


class Job:
    """One logical vector: its native vectors (junk past ``lanes_last``), the words to
    send, and the model's output and events."""

    def __init__(self, rng: np.random.Generator, op: ReduceOp, bits: np.ndarray, what: str,
                 masked: bool = False):
        n = len(bits)
        self.op, self.what, self.n = op, what, n
        self.count = -(-n // LANES)
        self.lanes_last = n - (self.count - 1) * LANES
        flat = rng.integers(0, 1 << 16, self.count * LANES).astype(np.uint16)
        flat[:n] = bits
        self.vectors = flat.reshape(self.count, LANES)
        # keep[k, i]: lane i of vector k takes part; the model sees the identity if not.
        keep = np.ones((self.count, LANES), dtype=bool)
        keep[-1, self.lanes_last:] = False
        if masked:
            keep &= rng.random((self.count, LANES)) < 0.7
        self.keep = keep
        model_in = np.where(keep, self.vectors, np.uint16(IDENTITY[op]))
        self.expected = reduce_vectors_bits(op, model_in, self.lanes_last)

    def words(self) -> list[int]:
        layout = input_layout(LANES)
        raw = np.ascontiguousarray(self.vectors, dtype="<u2").tobytes()
        words = []
        for k in range(self.count):
            mask = sum(1 << i for i in range(LANES) if self.keep[k, i])
            words.append(int.from_bytes(raw[2 * LANES * k:2 * LANES * (k + 1)], "little")
                         | (self.op.value << layout["op"].offset)
                         | (int(k == self.count - 1) << layout["last"].offset)
                         | (mask << layout["keep"].offset))
        return words


def random_jobs(rng: np.random.Generator, count: int) -> list[Job]:
    longest = MAX_LENGTH * LANES
    jobs = []
    for k in range(count):
        kind = k % 8
        n = (1 if kind == 0 else longest if kind == 1
             else LANES * int(rng.integers(1, MAX_LENGTH + 1)) if kind == 2
             else int(rng.integers(1, longest + 1)))
        op = ReduceOp(int(rng.integers(2)))
        bits = random_logical_vector(rng, n, style=k % STYLES)
        jobs.append(Job(rng, op, bits, f"random #{k}", masked=k % 4 == 3))
    rng.shuffle(jobs)
    return jobs


def directed_jobs(rng: np.random.Generator) -> list[Job]:
    longest = MAX_LENGTH * LANES
    nan, pinf, ninf, pzero, nzero, big = 0x7E00, 0x7C00, 0xFC00, 0x0000, 0x8000, 0x7BFF
    cases = []
    for op in ReduceOp:
        for n in (1, 2, LANES, LANES + 1, longest):
            cases += [(op, [nan] * n, "all NaN"), (op, [nzero] * n, "all -0"),
                      (op, [0x7C01] * n, "all signalling NaN"),
                      (op, [IDENTITY[op]] * n, "all identity"),
                      (op, [0x0001] * n, "smallest subnormal"),
                      (op, [big] * n, "65504 repeated"),
                      (op, [0xFBFF] * n, "-65504 repeated")]
        for n in range(1, min(longest, 3 * LANES + 1) + 1):       # every short length
            cases.append((op, rng.choice(SPECIALS, n), f"specials, length {n}"))
        cases += [
            (op, [pinf, ninf], "inf, -inf"), (op, [ninf, pinf], "-inf, inf"),
            (op, [pinf] + [big] * (longest - 2) + [ninf], "inf ... -inf, far apart"),
            (op, [nzero, pzero, nzero], "signed zeros"), (op, [pzero], "+0"),
            (op, [nzero], "-0"), (op, [0xFFFF], "lone negative NaN"),
            (op, [0x8001, 0x0001, 0x03FF, 0x83FF], "subnormals of both signs"),
            (op, [0x03FF] * 2, "largest subnormal twice"),
            (op, [0x6800, 0x3C00, 0x3C00, 0x3C00], "2048, 1, 1, 1: tree-order ties"),
            (op, [0x3C00, 0x6800, 0x3C00], "1, 2048, 1"),
            (op, [big, 0x4C00], "65504 + 16: tie to inf"),
            (op, [big, 0x4800], "65504 + 8: tie to 65504"),
            (op, [big, big, 0xFBFF, 0xFBFF], "overflow both ways, then inf - inf"),
            (op, [0x4000, 0xC000] * (longest // 2), "x, -x repeated"),
        ]
    return [Job(rng, op, np.array(bits, np.uint16), what) for op, bits, what in cases]


# --- testbench ------------------------------------------------------------------------------

class EventMonitor:
    """Sums ``overflow_events`` and ``nan_events`` each cycle; keeps the running totals
    per cycle, counted the same way as :class:`StreamMonitor` counts its cycles."""

    def __init__(self, dut):
        self.dut = dut
        self.totals = [(0, 0)]             # totals[c]: reported up to and including cycle c
        cocotb.start_soon(self._run())

    async def _run(self):
        edge = RisingEdge(self.dut.clk)
        over, nan = self.dut.overflow_events, self.dut.nan_events
        o = n = 0
        while True:
            await edge
            o += over.value.to_unsigned()
            n += nan.value.to_unsigned()
            self.totals.append((o, n))


class TB:
    """Clock, reset, source, sink, monitors and scoreboard around one Fp16Reduce."""

    def __init__(self, dut, *, stalls: bool):
        self.dut = dut
        self.log = dut._log
        seed = random.getrandbits(32)
        self.rng = np.random.default_rng(seed)
        self.log.info("seed %d, %d lanes, max_length %d, stalls %s", seed, LANES,
                      MAX_LENGTH, stalls)
        Clock(dut.clk, CLOCK_NS, unit="ns").start()
        self.source = StreamSource(dut.clk, *stream_signals(dut, "i_stream"),
                                   IDLE_PROB if stalls else 0.0, seed=seed + 1)
        self.sink = StreamSink(dut.clk, dut.o_stream__ready,
                               BACKPRESSURE_PROB if stalls else 0.0, seed=seed + 2)
        # Started together, so their cycle counts agree.
        self.inputs = StreamMonitor(dut.clk, *stream_signals(dut, "i_stream"), "i_stream")
        self.outputs = StreamMonitor(dut.clk, *stream_signals(dut, "o_stream"), "o_stream")
        self.events = EventMonitor(dut)
        self.stalls = stalls
        self._squeezed = False
        self.jobs: list[Job] = []

    async def reset(self):
        dut = self.dut
        dut.rst.value = 1
        dut.i_stream__valid.value = 0
        await ClockCycles(dut.clk, 3)
        dut.rst.value = 0
        await RisingEdge(dut.clk)
        assert not dut.o_stream__valid.value, "o_stream.valid high after reset"

    def send(self, jobs: list[Job]):
        self.jobs += jobs
        self.source.send([w for job in jobs for w in job.words()])
        if self.stalls and not self._squeezed:
            # Random back-pressure alone does not always reach the input within a short
            # run (seen on Icarus with 300 vectors); holding the output long enough to
            # fill every buffer makes the input stall deterministically.
            self._squeezed = True
            cocotb.start_soon(self._squeeze())

    async def _squeeze(self):
        self.sink.hold(True)
        await ClockCycles(self.dut.clk, SQUEEZE_CYCLES)
        self.sink.hold(False)

    async def check(self):
        """Wait for every output vector; compare values, ``last`` and events."""
        total = sum(job.count for job in self.jobs)
        await self.outputs.wait_for(total, CLOCK_NS)
        await ClockCycles(self.dut.clk, DRAIN_CYCLES)
        items = self.outputs.items
        assert len(items) == total, f"{len(items)} output vectors for {total} in"
        value_mask = (1 << 16 * LANES) - 1
        bad = 0
        k = 0
        expected_events = np.zeros(2, np.int64)
        for job in self.jobs:
            value = int(job.expected.out[0, 0])
            for r in range(job.count):
                word = items[k]
                lanes = np.frombuffer((word & value_mask).to_bytes(2 * LANES, "little"),
                                      "<u2")
                last = word >> 16 * LANES
                if (lanes != value).any() or last != (r == job.count - 1):
                    bad += 1
                    if bad <= 8:
                        self.log.error(
                            "%s (%s, n=%d, lanes_last %d): output %d of %d: lanes %s last %d,"
                            " expected %04X last %d; input %s", job.what, job.op.name, job.n,
                            job.lanes_last, r, job.count,
                            " ".join(f"{v:04X}" for v in lanes), last, value,
                            int(r == job.count - 1),
                            " ".join(f"{v:04X}" for v in job.vectors.reshape(-1)[:job.n]))
                k += 1
            # Events of this job and every earlier one must have been reported by the
            # cycle its last output vector left.
            expected_events += (job.expected.overflow, job.expected.nan_created)
            reported = self.events.totals[self.outputs.cycles[k - 1]]
            if (np.array(reported) < expected_events).any():
                bad += 1
                self.log.error("%s: %s events reported when its last output left, "
                               "expected at least %s", job.what, reported,
                               tuple(expected_events))
        assert bad == 0, f"{bad} mismatches"
        assert tuple(self.events.totals[-1]) == tuple(expected_events), (
            f"event totals {self.events.totals[-1]}, model {tuple(expected_events)}")
        if self.stalls:
            assert self.outputs.stall_checks > 0, "no back-pressured output cycle"
            # Back-pressure reached the input through every level's buffer.
            assert self.inputs.stall_checks > 0, "the input was never stalled"
        self.log.info("%d logical vectors, %d native vectors out, events %s, stalled "
                      "cycles: %d output, %d input", len(self.jobs), total,
                      expected_events.tolist(), self.outputs.stall_checks,
                      self.inputs.stall_checks)
        return expected_events


@cocotb.test()
@cocotb.parametrize(stalls=[False, True])
async def test_random(dut, stalls):
    """Random lengths, both ops mixed, random value styles."""
    tb = TB(dut, stalls=stalls)
    await tb.reset()
    tb.send(random_jobs(tb.rng, COUNT))
    events = await tb.check()
    assert events.min() > 0, f"the random run reached no event of some kind: {events}"


@cocotb.test()
@cocotb.parametrize(stalls=[False, True])
async def test_directed(dut, stalls):
    """Special values, overflow, signed zeros, subnormals, tie order, short lengths."""
    tb = TB(dut, stalls=stalls)
    await tb.reset()
    tb.send(directed_jobs(tb.rng))
    await tb.check()


@cocotb.test()
async def test_throughput(dut):
    """No stalls: back-to-back logical vectors of one length go in and come out at one
    native vector per cycle; the first output follows the last input by ``latency``."""
    tb = TB(dut, stalls=False)
    await tb.reset()
    latency = Fp16Reduce(lanes=LANES, max_length=MAX_LENGTH).latency
    groups = []
    for length in (1, MAX_LENGTH, max(1, MAX_LENGTH // 2)):
        jobs = [Job(tb.rng, ReduceOp(k % 2), random_logical_vector(tb.rng, length * LANES),
                    f"length {length} #{k}") for k in range(12)]
        groups.append(jobs)
        first_in = len(tb.inputs.items)
        first_out = len(tb.outputs.items)
        tb.send(jobs)
        await tb.check()
        cycles_in = tb.inputs.cycles[first_in:]
        cycles_out = tb.outputs.cycles[first_out:]
        assert np.all(np.diff(cycles_in) == 1), f"length {length}: input stalled: {cycles_in}"
        assert np.all(np.diff(cycles_out) == 1), \
            f"length {length}: output not back to back: {cycles_out}"
        observed = cycles_out[0] - cycles_in[length - 1]
        assert observed == latency, f"latency {observed}, documented {latency}"
        tb.log.info("length %d: %d vectors in and out back to back, latency %d", length,
                    len(cycles_in), observed)
