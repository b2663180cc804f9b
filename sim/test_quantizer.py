"""cocotb bench for :class:`hw.mvm.quantizer.VectorQuantizer`.

Every output block is compared bit for bit (exponent code and every mantissa) with the
reference model :func:`host.numerics.mvm.quantize_fp16` on the same inputs, and the two
saturating counters with the model's running totals. Each scenario runs with and without
random input idle cycles and output back-pressure; while back-pressured, the output
payload must not change.

The cocotb per-cycle overhead is the cost that matters, so the driver writes a whole
vector as one packed integer per cycle, the monitor keeps each output as one integer, and
all packing, unpacking and model work is done with NumPy on whole batches.

Parameters come from the environment (set by ``tests/hw/test_quantizer_hw.py``):

``VQ_N``, ``VQ_M``
    The build's ``n`` and ``mantissa_bits``.
``VQ_COUNTER_BITS``
    The build's ``counter_bits`` (default 32).
``VQ_SOURCES``
    The build's ``sources`` (default 1). With 2, every vector gets a random source, each
    block's ``o_source`` is compared with it, and each source's counters with the
    model's counts of that source's vectors.
``VQ_VECTORS``
    Random vectors per mode and per stall setting (default 100000).
"""

from __future__ import annotations

import os
import random
import time

import numpy as np

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, RisingEdge

from host.spec.formats import E8M0_BIAS, FP16_MAX_BITS, Rounding, block_bits, mantissa_max
from host.numerics.mvm import quantize_fp16
from sim.stream import StreamMonitor, StreamSink, StreamSource, stream_signals

#: Probability of an idle input cycle / of a back-pressured output cycle with stalls.
IDLE_PROB = 0.3
BACKPRESSURE_PROB = 0.3
#: Cycles to keep watching after the last expected block, to catch extra ones.
DRAIN_CYCLES = 32

CLOCK_NS = 10

#: Modes of the random test: dynamic exponent with either rounding, static exponent.
#: (Short identifiers, so that cocotb puts them in the test names.)
MODES = ("even", "away", "static")
STALLS = (False, True)


class Config:
    """Build parameters of the DUT, from the environment."""

    def __init__(self):
        self.n = int(os.environ.get("VQ_N", "8"))
        self.m = int(os.environ.get("VQ_M", "8"))
        self.counter_bits = int(os.environ.get("VQ_COUNTER_BITS", "32"))
        self.sources = int(os.environ.get("VQ_SOURCES", "1"))
        self.vectors = int(os.environ.get("VQ_VECTORS", "100000"))
        self.block_bits = block_bits(self.n, self.m)
        self.counter_max = (1 << self.counter_bits) - 1


# --- packing ---------------------------------------------------------------------------

def pack_vectors(bits: np.ndarray) -> list[int]:
    """``(V, n)`` uint16 FP16 patterns -> one integer per vector, lane i at bits 16i."""
    rows = np.ascontiguousarray(bits, dtype="<u2")
    raw = rows.tobytes()
    width = 2 * rows.shape[1]
    return [int.from_bytes(raw[i:i + width], "little") for i in range(0, len(raw), width)]


def unpack_blocks(words: list[int], n: int, m: int) -> tuple[np.ndarray, np.ndarray]:
    """Output payload integers -> exponent codes ``(B,)`` and signed mantissas ``(B, n)``.

    Layout of :func:`host.spec.formats.block_layout`: code in bits [0, 8), mantissa i in
    [8 + i*m, 8 + (i+1)*m), two's complement.
    """
    count = len(words)
    nbytes = (block_bits(n, m) + 7) // 8
    raw = b"".join(w.to_bytes(nbytes, "little") for w in words)
    rows = np.frombuffer(raw, np.uint8).reshape(count, nbytes)
    codes = rows[:, 0].copy()
    bits = np.unpackbits(rows[:, 1:], axis=1, bitorder="little")[:, :n * m]
    weights = (1 << np.arange(m, dtype=np.int64))
    u = bits.reshape(count, n, m).astype(np.int64) @ weights
    q = np.where(u >= 1 << (m - 1), u - (1 << m), u)
    return codes, q


# --- model -----------------------------------------------------------------------------

class Model:
    """The reference model applied to batches of vectors with per-vector settings."""

    def __init__(self, cfg: Config):
        self.cfg = cfg

    def expected(self, bits, rounding, static, code):
        """Model outputs for vectors ``bits (V, n)`` and per-vector settings ``(V,)``.

        ``rounding``: 0/1 (:class:`Rounding` values); ``static``: 0/1; ``code``: 0..255.
        One model call per distinct setting, each on a 2-D batch.
        """
        v = bits.shape[0]
        codes = np.zeros(v, np.uint8)
        mant = np.zeros((v, self.cfg.n), np.int64)
        sat = np.zeros(v, np.int64)
        nonfinite = np.zeros(v, np.int64)
        key = np.where(static == 1, 2 * 256 + code.astype(np.int64) * 2 + rounding,
                       rounding.astype(np.int64))
        for k in np.unique(key):
            sel = key == k
            rnd = Rounding(int(k) & 1)
            stat = int(code[sel][0]) if k >= 512 else None
            with np.errstate(over="ignore"):   # the model overflows float32 to inf: fine
                r = quantize_fp16(bits[sel], self.cfg.m, rnd, stat)
            codes[sel] = r.exponent_codes
            mant[sel] = r.mantissas
            sat[sel] = r.saturated
            nonfinite[sel] = r.nonfinite
        return codes, mant, sat, nonfinite

    def dynamic_codes(self, bits):
        """Dynamic exponent codes of each vector (to place static codes around)."""
        return quantize_fp16(bits, self.cfg.m).exponent_codes


# --- stimulus --------------------------------------------------------------------------

class Stimulus:
    """Random FP16 vectors from a mix of distributions."""

    def __init__(self, cfg: Config, rng: np.random.Generator):
        self.cfg = cfg
        self.rng = rng

    def _fp16(self, x):
        with np.errstate(over="ignore"):        # beyond 65504 becomes inf, on purpose
            return np.asarray(x, np.float64).astype(np.float16).view(np.uint16)

    def uniform(self, v):
        """All 65536 patterns equally likely: inf, NaN, subnormals, -0 appear."""
        return self.rng.integers(0, 1 << 16, (v, self.cfg.n), dtype=np.uint16)

    def scaled_normal(self, v):
        """Normal values times 2**k, k per vector across (and beyond) the FP16 range."""
        k = self.rng.integers(-30, 18, (v, 1))
        return self._fp16(self.rng.standard_normal((v, self.cfg.n)) * np.exp2(k))

    def wide_range(self, v):
        """Log-uniform magnitudes spanning up to the whole FP16 range within one vector."""
        lo = self.rng.uniform(-26, 16, (v, 1))
        hi = self.rng.uniform(lo, 16.1)
        e = self.rng.uniform(lo, hi, (v, self.cfg.n))
        x = np.exp2(e) * self.rng.choice([-1.0, 1.0], (v, self.cfg.n))
        x[self.rng.random((v, self.cfg.n)) < 0.1] = 0.0
        return self._fp16(x)

    def steps(self, v):
        """Values on and between the output grid: ties and near-top roundings are common.

        Lane values are ``j/4`` steps of ``2**(e - (m-2))`` for a per-vector ``e``; one
        lane holds ``2**e`` so that the dynamic exponent is ``e``.
        """
        m, n = self.cfg.m, self.cfg.n
        e = self.rng.integers(-24 + m, 16, (v, 1))
        quarters = self.rng.integers(0, 4 << (m - 1), (v, n))
        x = quarters / 4.0 * np.exp2(e - (m - 2)) * self.rng.choice([-1.0, 1.0], (v, n))
        x[:, 0] = np.exp2(e[:, 0])
        x = np.clip(x, -65504, 65504)
        out = self._fp16(x)
        self.rng.permuted(out, axis=1, out=out)
        return out

    def mix(self, v):
        """A shuffled mix of all the distributions."""
        kinds = (self.uniform, self.scaled_normal, self.wide_range, self.steps)
        weights = np.array([0.25, 0.3, 0.2, 0.25])
        counts = self.rng.multinomial(v, weights)
        out = np.concatenate([f(c) for f, c in zip(kinds, counts)])
        return out[self.rng.permutation(v)]

    def static_codes(self, dyn_codes):
        """Static codes near each vector's own exponent (values both fit and saturate),
        and now and then any code at all."""
        v = len(dyn_codes)
        m = self.cfg.m
        near = dyn_codes.astype(np.int64) + self.rng.integers(-3, m + 3, v)
        anywhere = self.rng.integers(0, 256, v)
        codes = np.where(self.rng.random(v) < 0.85, near, anywhere)
        return np.clip(codes, 0, 255).astype(np.int64)


class CounterChecker:
    """Checks ``saturations``/``nonfinite`` every cycle against the model's running sums.

    ``expected_counts`` gives, per output block in order, its source and the model's
    (saturated, nonfinite) counts. A transfer's counts are added to its source's
    counters at the edge after the one that takes it; a ``clear`` high at an edge zeroes
    all and drops the counts of the transfers at that edge and at the edge before (not
    yet added).
    """

    def __init__(self, tb, expected_counts):
        self.tb = tb
        self.counts = expected_counts
        self.taken = 0
        self.clears = 0
        cocotb.start_soon(self._run())

    async def _run(self):
        tb = self.tb
        cmax = tb.cfg.counter_max
        zero = [(0, 0)] * tb.cfg.sources
        want = list(zero)
        pending = None                       # (source, counts) of the last edge's transfer
        edge = RisingEdge(tb.dut.clk)
        while True:
            await edge
            got = tb.counters()
            assert got == want, (
                f"counters (saturations, nonfinite) per source = {got}, model {want} "
                f"after {self.taken} blocks")
            transfer = tb.o_valid.value and tb.o_ready.value
            if tb.clear.value:
                want = list(zero)
                pending = None
                self.clears += 1
            else:
                if pending is not None:
                    src, (sat, nf) = pending
                    want[src] = (min(want[src][0] + sat, cmax), min(want[src][1] + nf, cmax))
                pending = self.counts[self.taken] if transfer else None
            if transfer:
                self.taken += 1


# --- testbench ---------------------------------------------------------------------------

class TB:
    """Clock, reset, source, sink, monitor and scoreboard around one VectorQuantizer."""

    def __init__(self, dut, *, stalls: bool):
        self.dut = dut
        self.cfg = Config()
        self.log = dut._log
        seed = random.getrandbits(32)
        self.rng = np.random.default_rng(seed)
        self.model = Model(self.cfg)
        self.stim = Stimulus(self.cfg, self.rng)
        self.o_valid, self.o_ready = dut.o_stream__valid, dut.o_stream__ready
        self.saturations, self.nonfinite, self.clear = (
            dut.saturations, dut.nonfinite, dut.clear)
        self.stalls, self.seed = stalls, seed
        Clock(dut.clk, CLOCK_NS, unit="ns").start()
        # The rounding / static / static_exponent (and source) inputs travel with each
        # vector.
        sideband = [dut.rounding, dut.static, dut.static_exponent]
        if self.cfg.sources > 1:
            sideband.append(dut.source)
        self.source = StreamSource(
            dut.clk, *stream_signals(dut, "i_stream"),
            idle_prob=IDLE_PROB if stalls else 0.0, seed=seed + 1, sideband=sideband)
        self.sink = self.monitor = self.source_monitor = None   # started by reset()
        self.inputs = []                           # (bits, rounding, static, code) batches
        self.sources = []                          # the batches' source of each vector

    def counters(self):
        """``[(saturations, nonfinite)]`` per source, as the DUT shows them now."""
        cb, mask = self.cfg.counter_bits, self.cfg.counter_max
        sat, nf = self.saturations.value.to_unsigned(), self.nonfinite.value.to_unsigned()
        return [((sat >> (cb * s)) & mask, (nf >> (cb * s)) & mask)
                for s in range(self.cfg.sources)]

    async def reset(self):
        """Reset the DUT (whatever an earlier, failed test left in it), then start the
        sink and the monitor."""
        dut = self.dut
        dut.rst.value = 1
        dut.clear.value = 0
        dut.i_stream__valid.value = 0
        self.o_ready.value = 0
        for _ in range(3):
            await RisingEdge(dut.clk)
        dut.rst.value = 0
        await RisingEdge(dut.clk)
        assert not self.o_valid.value, "o_stream.valid high after reset"
        assert self.counters() == [(0, 0)] * self.cfg.sources
        # Started only now: they act from the first cycle on, and the monitor must not
        # sample o_stream during reset.
        self.sink = StreamSink(dut.clk, self.o_ready,
                               BACKPRESSURE_PROB if self.stalls else 0.0, seed=self.seed + 2)
        self.monitor = StreamMonitor(dut.clk, *stream_signals(dut, "o_stream"), "o_stream")
        if self.cfg.sources > 1:
            # The block's source, recorded with every transfer (and held while stalled).
            self.source_monitor = StreamMonitor(dut.clk, self.o_valid, self.o_ready,
                                                dut.o_source, "o_source")

    def send(self, bits, rounding, static, code):
        """Queue vectors ``bits (V, n)`` with per-vector settings (arrays or scalars);
        with several sources, each vector from a random one."""
        v = bits.shape[0]
        rounding = np.broadcast_to(np.asarray(rounding, np.int64), (v,))
        static = np.broadcast_to(np.asarray(static, np.int64), (v,))
        code = np.broadcast_to(np.asarray(code, np.int64), (v,))
        source = self.rng.integers(0, self.cfg.sources, v)
        self.inputs.append((bits, rounding, static, code))
        self.sources.append(source)
        words = pack_vectors(bits)
        side = [rounding.tolist(), static.tolist(), code.tolist()]
        if self.cfg.sources > 1:
            side.append(source.tolist())
        self.source.send(zip(words, *side))

    def send_switching(self, count):
        """Queue ``count`` random vectors whose rounding, static flag and static code
        change from one vector to the next."""
        bits = self.stim.mix(count)
        rounding = self.rng.integers(0, 2, count)
        static = self.rng.integers(0, 2, count)
        code = self.stim.static_codes(self.model.dynamic_codes(bits))
        self.send(bits, rounding, static, code)

    def expected(self):
        """Model outputs for everything sent so far, in order."""
        cat = [np.concatenate(x) for x in zip(*self.inputs)]
        return cat, self.model.expected(*cat)

    async def drain(self):
        """Wait until every queued vector came out, and a while longer for extra ones."""
        total = sum(b.shape[0] for b, *_ in self.inputs)
        await self.monitor.wait_for(total, CLOCK_NS)
        await ClockCycles(self.dut.clk, DRAIN_CYCLES)
        assert len(self.monitor.items) == total, (
            f"{len(self.monitor.items)} blocks came out for {total} vectors in")

    async def check(self, *, counters=True):
        """Drain, then compare every block and the counters with the model."""
        start = time.perf_counter()
        await self.drain()
        inputs, expected = self.expected()
        board = Scoreboard(self.cfg, self.log, inputs, expected)
        board.check_blocks(self.monitor.items)
        sources = np.concatenate(self.sources)
        if self.source_monitor is not None:
            got = np.array(self.source_monitor.items)
            bad = np.flatnonzero(got != sources)
            assert not bad.size, (f"{bad.size} blocks came out with another source; first "
                                  f"block {bad[0]}: o_source {got[bad[0]]}, sent "
                                  f"{sources[bad[0]]}")
        if counters:
            board.check_counters(self.counters(), sources)
        self.log.info("checked %d blocks (%d saturated values, %d non-finite, %d stall "
                      "checks) in %.2f s", len(inputs[0]), board.saturated.sum(),
                      board.nonfinite.sum(), self.monitor.stall_checks,
                      time.perf_counter() - start)
        return board.saturated, board.nonfinite


class Scoreboard:
    """Compares what came out with the model's outputs for what went in, in order."""

    def __init__(self, cfg, log, inputs, expected):
        self.cfg, self.log = cfg, log
        self.bits, self.rounding, self.static, self.code = inputs
        self.codes, self.mantissas, self.saturated, self.nonfinite = expected

    def check_blocks(self, words):
        """Every exponent code and every mantissa of the output payloads ``words``."""
        assert len(words) == len(self.bits), (
            f"{len(words)} blocks came out for {len(self.bits)} vectors in")
        codes, mant = unpack_blocks(words, self.cfg.n, self.cfg.m)
        bad = np.flatnonzero((codes != self.codes) | (mant != self.mantissas).any(axis=1))
        for i in bad[:5]:
            self.log.error(
                "vector %d (rounding=%s static=%d code=%d) in %s: got code %d %s, "
                "model code %d %s", i, Rounding(int(self.rounding[i])).name,
                self.static[i], self.code[i], " ".join(f"{b:04x}" for b in self.bits[i]),
                codes[i], mant[i].tolist(), self.codes[i], self.mantissas[i].tolist())
        assert not bad.size, f"{bad.size} of {len(self.bits)} blocks differ from the model"

    def check_counters(self, got, sources):
        """The counters after all blocks, ``[(saturations, nonfinite)]`` per source:
        the model's totals over that source's vectors, saturated at the top."""
        cmax = self.cfg.counter_max
        want = [(min(int(self.saturated[sources == s].sum()), cmax),
                 min(int(self.nonfinite[sources == s].sum()), cmax))
                for s in range(self.cfg.sources)]
        assert got == want, f"counters (saturations, nonfinite) per source {got}, model {want}"


def _mode_settings(mode, tb, bits):
    """Per-vector (rounding, static, code) for one mode of the random test."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}")
    if mode == "static":
        # Both rounding rules meet static codes; the code changes on every vector.
        rounding = tb.rng.integers(0, 2, bits.shape[0])
        return rounding, 1, tb.stim.static_codes(tb.model.dynamic_codes(bits))
    rounding = Rounding.NEAREST_AWAY if mode == "away" else Rounding.NEAREST_EVEN
    return rounding.value, 0, 0


async def _run_random(dut, mode, stalls, count):
    tb = TB(dut, stalls=stalls)
    await tb.reset()
    bits = tb.stim.mix(count)
    tb.send(bits, *_mode_settings(mode, tb, bits))
    start, cycles = time.perf_counter(), tb.monitor.cycle
    await tb.drain()
    elapsed, cycles = time.perf_counter() - start, tb.monitor.cycle - cycles
    tb.log.info("%d vectors in %d cycles, %.1f s (%.0f cycles/s)", count, cycles, elapsed,
                cycles / elapsed)
    await tb.check()


@cocotb.test()
@cocotb.parametrize(mode=MODES, stalls=STALLS)
async def test_random(dut, mode, stalls):
    """Random vectors (a mix of distributions), one mode for all, compared with the model."""
    await _run_random(dut, mode, stalls, Config().vectors)


@cocotb.test()
@cocotb.parametrize(stalls=STALLS)
async def test_random_switching(dut, stalls):
    """Random vectors whose rounding, static flag and code change on every vector."""
    tb = TB(dut, stalls=stalls)
    await tb.reset()
    count = max(1000, Config().vectors // 20)
    tb.send_switching(count)
    await tb.check()


# --- directed vectors -------------------------------------------------------------------

def _f16(x):
    return np.asarray(x, np.float64).astype(np.float16).view(np.uint16)


def directed_vectors(cfg: Config) -> np.ndarray:
    """Corner cases, as rows of ``n`` FP16 patterns."""
    n, m = cfg.n, cfg.m
    rows = []

    def full(pattern):
        rows.append(np.full(n, pattern, np.uint16))

    def with_lanes(base, lanes_values):
        r = np.full(n, base, np.uint16)
        for lane, val in lanes_values:
            r[lane % n] = val
        rows.append(r)

    # Zeros: +0, -0, a mix.
    full(0x0000)
    full(0x8000)
    rows.append(np.where(np.arange(n) % 2, 0x8000, 0x0000).astype(np.uint16))
    # One non-zero lane, each lane in turn.
    for lane in range(n):
        for val in (0x3C00, 0xBE00, 0x0001, 0x83FF, 0x7BFF, 0xFBFF, 0x3555):
            with_lanes(0, [(lane, val)])
    # Maxima.
    full(FP16_MAX_BITS)
    full(FP16_MAX_BITS | 0x8000)
    rows.append(np.where(np.arange(n) % 2, FP16_MAX_BITS | 0x8000, FP16_MAX_BITS)
                .astype(np.uint16))
    # Subnormals: smallest, largest, smallest normal, mixtures.
    for p in (0x0001, 0x8001, 0x03FF, 0x83FF, 0x0400, 0x0200, 0x0155):
        full(p)
    rows.append((np.arange(n) % 0x400).astype(np.uint16))
    rows.append((np.arange(n) * 37 % 0x400 | 0x8000).astype(np.uint16))
    # Block maximum 2**-24 (only the smallest subnormal) and 2**15 with tiny companions.
    with_lanes(0, [(0, 0x0001), (1, 0x8001)])
    with_lanes(0x0001, [(n - 1, 0x7800)])
    with_lanes(0x8001, [(0, 0xF800), (1, 0x3C00)])
    full(0x7800)
    full(0x7BFF)
    # Non-finite: +inf, -inf, quiet and signalling NaNs of both signs.
    specials = (0x7C00, 0xFC00, 0x7E00, 0x7C01, 0x7DFF, 0xFE00, 0xFFFF, 0x7FFF)
    for s in specials:
        full(s)
        with_lanes(0x3C00, [(n // 2, s)])
        with_lanes(0x0001, [(0, s)])
        with_lanes(0, [(n - 1, s)])
    rows.append(np.array([specials[i % len(specials)] for i in range(n)], np.uint16))
    # A NaN block plus one small value: the NaNs must not set the exponent.
    with_lanes(0x7E00, [(0, 0x0400)])

    # Ties and near-top values, on the grid of a block exponent e (lane 0 holds 2**e):
    # k + 1/2 steps for even and odd k; 2**(m-1) - 1/2 and - 1/4 steps round past the
    # top code, - 3/4 does not.
    top = mantissa_max(m)
    offsets = [0.5, 1.5, 2.5, 3.5, top - 1.5, top - 0.5, top - 0.25, top - 0.75, top + 0.0,
               0.25, 0.75, 1.0, 2.0]
    for e in (-24 + m, -14, -10, -1, 0, 1, 5, 14, 15):
        step = 2.0 ** (e - (m - 2))
        vals = np.array(offsets) * step
        for sign in (1.0, -1.0):
            lanes = np.resize(sign * vals, n)
            lanes[0] = 2.0 ** e
            if e == 15:
                lanes = np.clip(lanes, -65504, 65504)
            rows.append(_f16(lanes))
            # The same tie alone in the block: it sets the exponent itself.
            for off in (top - 0.5, top + 0.5, 1.0 * top):
                rows.append(_f16(np.full(n, min(sign * off * step, 65504) if sign > 0
                                         else max(sign * off * step, -65504))))
    return np.array(rows, np.uint16)


def directed_settings(cfg: Config, bits: np.ndarray, model: Model):
    """Every directed vector under dynamic even/away and a set of static codes, with
    the setting changing from one vector to the next."""
    m = cfg.m
    dyn = model.dynamic_codes(bits).astype(np.int64)
    fixed = [0, 1, E8M0_BIAS - 24, E8M0_BIAS - 24 - (m - 2), E8M0_BIAS, E8M0_BIAS + 15,
             E8M0_BIAS + 16, 254, 255]
    out_bits, rnd, stat, code = [], [], [], []
    for i, row in enumerate(bits):
        settings = [(0, 0, 0), (1, 0, 0)]
        for c in fixed + [dyn[i] - 1, dyn[i], dyn[i] + 1, dyn[i] - m]:
            if 0 <= c <= 255:
                settings += [(0, 1, c), (1, 1, c)]
        for r, s, c in settings:
            out_bits.append(row)
            rnd.append(r)
            stat.append(s)
            code.append(c)
    return np.array(out_bits, np.uint16), np.array(rnd), np.array(stat), np.array(code)


@cocotb.test()
@cocotb.parametrize(stalls=STALLS)
async def test_directed(dut, stalls):
    """Corner cases under all rounding/exponent settings, switching on every vector."""
    tb = TB(dut, stalls=stalls)
    await tb.reset()
    bits = directed_vectors(tb.cfg)
    tb.send(*directed_settings(tb.cfg, bits, tb.model))
    e_sat, e_nf = await tb.check()
    assert e_sat.sum() > 0 and e_nf.sum() > 0, "directed set lost its corner cases"


@cocotb.test()
@cocotb.parametrize(stalls=STALLS)
async def test_clear(dut, stalls):
    """Random ``clear`` pulses while blocks flow; the counters are checked every cycle."""
    tb = TB(dut, stalls=stalls)
    await tb.reset()
    count = max(2000, Config().vectors // 50)
    tb.send_switching(count)
    _, (_, _, e_sat, e_nf) = tb.expected()
    checker = CounterChecker(tb, list(zip(np.concatenate(tb.sources).tolist(),
                                          zip(e_sat.tolist(), e_nf.tolist()))))
    clear_rand = random.Random(random.getrandbits(32))
    edge = RisingEdge(dut.clk)
    while not tb.source.idle or len(tb.monitor.items) < count:
        tb.clear.value = int(clear_rand.random() < 0.01)
        await edge
    tb.clear.value = 0
    await tb.check(counters=False)
    await edge
    assert checker.taken == count and checker.clears > 0
    # A clear with nothing flowing leaves both at zero.
    tb.clear.value = 1
    await edge
    tb.clear.value = 0
    await edge
    await edge
    assert tb.counters() == [(0, 0)] * tb.cfg.sources
