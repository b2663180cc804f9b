"""cocotb bench for :class:`hw.mfu.mfu.MfuPipeline`: chains, VRFs, counters and softmax.

Every output vector, its ``last`` flag and both counters of every MFU are compared with
the reference model :func:`host.model.mfu.run_chain` / :class:`host.model.mfu.MfuCounters`:

* ``test_random_chains``: batches of random legal op lists (all units, every op, random
  order within an MFU), random lengths ``1..max_length``, ``lanes_last``, VRF contents
  and addresses, inputs rich in specials (NaN, inf, subnormals, signed zeros, values that
  overflow), chains queued back to back; counters after each batch, random clears;
* ``test_counters``: event-heavy chains, counters checked after every chain, random
  clears, saturation (a small ``counter_bits`` build must reach the top);
* ``test_softmax``: the three softmax chains of :mod:`host.model.softmax` on logical vectors
  of 1 to ``n * max_length`` elements, the testbench writing chain results into the
  VRFs through ``vrf_w`` as a ``v_wr`` would; bit-exact with :func:`host.model.softmax
  .run_softmax`, and within :func:`host.model.softmax.softmax_bound` of a float64 softmax;
* ``test_timing``: cycles from chain acceptance to the first output and between chains
  without stalls, against :func:`chain_cycles` (the formula of ``docs/mfu.md``).

Each runs with and without stalls (random idle cycles on ``chain``, ``i_stream`` and
``vrf_w``, random back-pressure on ``o_stream``) where it says ``stalls``.

A build of ``lanes`` < ``n`` is driven in beats: each native vector goes into ``i_stream``
and ``vrf_w`` (at beat addresses) as ``n / lanes`` beats in lane order, and the beats of
``o_stream`` are joined back into native vectors before they are compared; ``last`` must
be on the chain's final beat only. The model knows nothing of beats.

Parameters come from the environment (set by ``tests/hw/test_mfu_hw.py``): ``MFU_N``,
``MFU_LANES`` (default ``n``), ``MFU_MFUS``, ``MFU_VRF_DEPTH``, ``MFU_MAX_LENGTH``,
``MFU_COUNTER_BITS``, ``MFU_OPS`` (comma-separated unary ops, default all),
``MFU_UNIT_SETS`` (the text form of ``host.spec.mfu.parse_unit_sets``, default every unit
in every MFU; the random chains and VRF contents follow it) and ``MFU_CHAINS`` (random
chains per run).
"""

from __future__ import annotations

import os
import random

import numpy as np

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, ReadOnly, RisingEdge

from host.spec.ops import BinaryOp
from host.spec.mfu import (
    MfuConfig, MfuOp, MfuUnit, VrfBank, allocate, encode_chain, vrf_write_layout,
)
from host.model.mfu import MfuCounters, MfuVrfs, run_chain
from host.spec.ops import ReduceOp
from host.model.softmax import run_softmax, softmax_bound, softmax_ops, softmax_reference
from host.spec.ops import UnaryOp
from sim.stream import StreamMonitor, StreamSink, StreamSource, stream_signals

IDLE_PROB = 0.3
BACKPRESSURE_PROB = 0.3
CLOCK_NS = 10
IDLE_TIMEOUT_CYCLES = 5000


def config_from_env() -> MfuConfig:
    names = os.environ.get("MFU_OPS", "")
    ops = tuple(UnaryOp.parse(n) for n in names.split(",")) if names else tuple(UnaryOp)
    lanes = os.environ.get("MFU_LANES")
    return MfuConfig(n=int(os.environ.get("MFU_N", "4")),
                     lanes=int(lanes) if lanes else None,
                     mfus=int(os.environ.get("MFU_MFUS", "2")),
                     vrf_depth=int(os.environ.get("MFU_VRF_DEPTH", "16")),
                     max_length=int(os.environ.get("MFU_MAX_LENGTH", "8")),
                     unary_ops=ops,
                     counter_bits=int(os.environ.get("MFU_COUNTER_BITS", "32")),
                     unit_sets=os.environ.get("MFU_UNIT_SETS") or None)


def chain_cycles(cfg: MfuConfig, ops, length: int) -> int:
    """Clock edges from the one that takes a chain to the one after which its first
    output is valid on ``o_stream``, without stalls, the input offered from the cycle
    after acceptance (``docs/mfu.md``, section 6).

    1 (the last vector into the output queue's buffer) plus, per op, its unit's input
    registers (``hw.mfu.mfu.INPUT_STAGES``) and latency (ADDSUB, MUL 6; ACT 15; REDUCE
    ``L * beats - 1`` more beats in, then its latency, which does not depend on the
    lanes); plus 1 when the first op reads a VRF (its first operand is in the read-ahead
    ring only 2 edges after acceptance, and the pipeline holds the input).
    """
    from hw.arith.fp16_arith import LATENCY as BINARY
    from hw.arith.fp16_reduce import Fp16Reduce
    from hw.arith.fp16_unary import LATENCY as UNARY
    from hw.mfu.mfu import INPUT_STAGES
    reduce_latency = Fp16Reduce(lanes=cfg.n, max_length=cfg.max_length).latency
    cycles = 1
    latency = {MfuUnit.ADDSUB: BINARY, MfuUnit.MUL: BINARY, MfuUnit.ACT: UNARY,
               MfuUnit.REDUCE: length * cfg.beats - 1 + reduce_latency}
    for op in ops:
        cycles += INPUT_STAGES + latency[op.unit]
    if ops and ops[0].unit in (MfuUnit.ADDSUB, MfuUnit.MUL):
        cycles += 1
    return cycles


# --- stimulus --------------------------------------------------------------------------------

#: FP16 patterns the random values are mixed with: zeros, the smallest and largest
#: subnormal, the smallest normal, one, the largest finite, infinities, NaNs (quiet,
#: signalling, negative, other payloads).
SPECIALS = np.array([0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x83FF, 0x0400, 0x8400,
                     0x3C00, 0xBC00, 0x7BFF, 0xFBFF, 0x7C00, 0xFC00, 0x7E00, 0xFE00,
                     0x7C01, 0x7D55, 0xFFFF, 0x7A00, 0xFA00, 0x5BFF], np.uint16)


def random_values(rng, shape, special_prob=0.15):
    """FP16 patterns: mostly moderate values (exponents 2**-14 .. 2**12, so that
    products and sums of large ones overflow), some uniformly random patterns, some
    specials."""
    sign = rng.integers(0, 2, shape).astype(np.uint16) << 15
    exp = rng.integers(1, 28, shape).astype(np.uint16) << 10
    frac = rng.integers(0, 1 << 10, shape).astype(np.uint16)
    x = sign | exp | frac
    pick = rng.random(shape)
    x = np.where(pick < 0.1, rng.integers(0, 1 << 16, shape).astype(np.uint16), x)
    x = np.where(pick > 1 - special_prob, rng.choice(SPECIALS, shape), x)
    return x.astype(np.uint16)


def random_op(rng, cfg, length):
    """One random MfuOp (VRF address so that the operand window fits)."""
    unit = MfuUnit(int(rng.integers(0, 4)))
    if unit in (MfuUnit.ADDSUB, MfuUnit.MUL):
        addr = int(rng.integers(0, cfg.vrf_depth - length + 1))
        op = (BinaryOp.MUL if unit is MfuUnit.MUL
              else BinaryOp(int(rng.choice([0, 1, 2, 4]))))
        return MfuOp.binary(op, addr)
    if unit is MfuUnit.ACT:
        return MfuOp.unary(UnaryOp(int(rng.integers(0, len(UnaryOp)))))
    return MfuOp.reduce(ReduceOp(int(rng.integers(0, 2))))


def random_chain(rng, cfg):
    """A random legal chain: ``(ops, length, lanes_last)``; 0 to 8 ops."""
    length = int(rng.integers(1, cfg.max_length + 1))
    while True:
        ops = [random_op(rng, cfg, length) for _ in range(int(rng.integers(0, 9)))]
        try:
            allocate(ops, cfg.mfus, cfg.unit_sets)
        except ValueError:
            continue
        return ops, length, int(rng.integers(1, cfg.n + 1))


# --- testbench -------------------------------------------------------------------------------

def pack_vector(v: np.ndarray) -> int:
    return int.from_bytes(np.ascontiguousarray(v, dtype="<u2").tobytes(), "little")


def pack_beats(cfg: MfuConfig, vectors: np.ndarray) -> list[int]:
    """The transfers of native vectors ``(L, n)``: ``L * beats`` beats of ``lanes``
    lanes, beat ``b`` of vector ``j`` holding its lanes ``b*lanes ..``."""
    return [pack_vector(beat) for beat in np.asarray(vectors).reshape(-1, cfg.lanes)]


class TB:
    """Clock, reset, the three sources, the sink and monitor, the model and checks."""

    def __init__(self, dut, *, stalls: bool):
        self.dut = dut
        self.cfg = cfg = config_from_env()
        self.log = dut._log
        seed = random.getrandbits(32)
        self.log.info("seed %d, %s, stalls=%s", seed, cfg, stalls)
        self.rng = np.random.default_rng(seed)
        idle = IDLE_PROB if stalls else 0.0
        Clock(dut.clk, CLOCK_NS, unit="ns").start()
        self.chain_src = StreamSource(dut.clk, *stream_signals(dut, "chain"), idle, seed + 1)
        self.in_src = StreamSource(dut.clk, *stream_signals(dut, "i_stream"), idle, seed + 2)
        self.vrf_src = StreamSource(dut.clk, *stream_signals(dut, "vrf_w"), idle, seed + 3)
        self.sink = StreamSink(dut.clk, dut.o_stream__ready,
                               BACKPRESSURE_PROB if stalls else 0.0, seed + 4)
        self.monitor = StreamMonitor(dut.clk, *stream_signals(dut, "o_stream"))
        self.vrfs = MfuVrfs(cfg)
        self.counters = MfuCounters(cfg)
        self.expected: list[np.ndarray] = []     # one (L, n) array per chain
        self.checked = 0                         # output vectors compared so far
        self.chains = 0
        layout = vrf_write_layout(cfg)
        self._w_offsets = {name: field.offset for name, field in layout}

    async def reset(self):
        dut = self.dut
        dut.rst.value = 1
        dut.clear.value = 0
        for name in ("chain", "i_stream", "vrf_w"):
            getattr(dut, f"{name}__valid").value = 0
        await ClockCycles(dut.clk, 3)
        dut.rst.value = 0
        await RisingEdge(dut.clk)
        assert not dut.o_stream__valid.value, "o_stream.valid high after reset"
        assert not dut.busy.value, "busy after reset"

    # --- driving ---------------------------------------------------------------------------

    def write_vrf(self, mfu: int, bank: VrfBank, addr: int, vectors: np.ndarray):
        """Queue VRF writes of ``vectors`` at ``addr ..`` and apply them to the model (one
        write per beat, beat ``b`` of the vector at ``a`` at beat address ``a * beats +
        b``)."""
        off = self._w_offsets
        beats = self.cfg.beats
        words = [(mfu << off["mfu"]) | (bank.value << off["bank"])
                 | ((addr * beats + k) << off["addr"]) | (beat << off["values"])
                 for k, beat in enumerate(pack_beats(self.cfg, vectors))]
        self.vrf_src.send(words)
        self.vrfs.write(mfu, bank, addr, vectors)

    async def fill_vrfs(self):
        """Random contents for every VRF of every MFU; waits until written."""
        cfg = self.cfg
        for mfu in range(cfg.mfus):
            for bank in VrfBank:
                if cfg.has_vrf(mfu, bank):
                    self.write_vrf(mfu, bank, 0,
                                   random_values(self.rng, (cfg.vrf_depth, cfg.n)))
        await self.writes_done()

    async def writes_done(self):
        while not self.vrf_src.idle:
            await RisingEdge(self.dut.clk)
        await RisingEdge(self.dut.clk)

    def send_chain(self, ops, x: np.ndarray, lanes_last: int):
        """Queue one chain (configuration and inputs) and its expected result."""
        result = run_chain(self.cfg, ops, x, lanes_last, self.vrfs)
        self.chain_src.send([encode_chain(self.cfg, ops, len(x), lanes_last)])
        self.in_src.send(pack_beats(self.cfg, x))
        self.expected.append(result.out)
        self.counters.add(result)
        self.chains += 1
        return result

    async def clear(self):
        self.dut.clear.value = 1
        await RisingEdge(self.dut.clk)
        self.dut.clear.value = 0
        self.counters.clear()

    # --- checking --------------------------------------------------------------------------

    async def wait_idle(self):
        """Every queued chain has left o_stream and busy is low."""
        total = sum(len(e) for e in self.expected) * self.cfg.beats
        await self.monitor.wait_for(total, CLOCK_NS)
        for _ in range(IDLE_TIMEOUT_CYCLES):
            await ReadOnly()
            if not self.dut.busy.value:
                break
            await RisingEdge(self.dut.clk)
        else:
            raise AssertionError("busy stays high after the last output")
        await RisingEdge(self.dut.clk)
        assert len(self.monitor.items) == total, (
            f"{len(self.monitor.items)} beats came out for {total} expected")

    def check_outputs(self) -> list[np.ndarray]:
        """Compare every output vector (joined from its beats) and ``last`` (on the
        chain's final beat only) received since the last check; returns the received
        chains' outputs."""
        lanes, beats = self.cfg.lanes, self.cfg.beats
        got_chains = []
        k = 0                                   # beats
        for c, exp in enumerate(self.expected):
            for j in range(len(exp)):
                if k < self.checked:
                    k += beats
                    continue
                got = np.empty(self.cfg.n, np.uint16)
                for b in range(beats):
                    word = self.monitor.items[k + b]
                    got[b * lanes:(b + 1) * lanes] = np.frombuffer(
                        (word & ((1 << 16 * lanes) - 1)).to_bytes(2 * lanes, "little"), "<u2")
                    last = word >> (16 * lanes)
                    final = j == len(exp) - 1 and b == beats - 1
                    assert last == final, (
                        f"chain {c} vector {j} beat {b}: last = {last}, length {len(exp)}")
                if j == 0:
                    got_chains.append(np.empty_like(exp))
                got_chains[-1][j] = got
                bad = np.nonzero(got != exp[j])[0]
                assert not len(bad), (
                    f"chain {c} vector {j}: lanes {bad.tolist()} gave "
                    f"{[hex(v) for v in got[bad]]}, model {[hex(v) for v in exp[j][bad]]}")
                k += beats
        self.checked = k
        return got_chains

    def check_counters(self):
        cfg = self.cfg
        mask = cfg.counter_max
        for name in ("overflow", "nan_created"):
            word = getattr(self.dut, name).value.to_unsigned()
            got = tuple((word >> (cfg.counter_bits * k)) & mask for k in range(cfg.mfus))
            exp = getattr(self.counters, name)
            assert got == exp, f"{name} counters {got}, model {exp}"


# --- tests -------------------------------------------------------------------------------------

def _chain_count(default):
    return int(os.environ.get("MFU_CHAINS", str(default)))


@cocotb.test()
@cocotb.parametrize(stalls=[False, True])
async def test_random_chains(dut, stalls):
    """Random legal chains in batches over random VRF contents; everything checked."""
    tb = TB(dut, stalls=stalls)
    await tb.reset()
    cfg = tb.cfg
    total = _chain_count(60)
    units_seen, ops_seen = set(), set()
    batch = 0
    while tb.chains < total:
        await tb.fill_vrfs()
        for _ in range(min(12, total - tb.chains)):
            ops, length, lanes_last = random_chain(tb.rng, cfg)
            for op in ops:
                units_seen.add(op.unit)
                ops_seen.add(op.op)
            tb.send_chain(ops, random_values(tb.rng, (length, cfg.n)), lanes_last)
        await tb.wait_idle()
        tb.check_outputs()
        tb.check_counters()
        batch += 1
        if tb.rng.random() < 0.5:
            await tb.clear()
            await RisingEdge(dut.clk)
            tb.check_counters()
    assert units_seen == set(MfuUnit), f"units used: {units_seen}"
    assert tb.monitor.stall_checks > 0 or not stalls
    tb.log.info("%d chains in %d batches, %d vectors, %d ops kinds, counters %s %s",
                tb.chains, batch, tb.checked, len(ops_seen), tb.counters.overflow,
                tb.counters.nan_created)


@cocotb.test()
@cocotb.parametrize(stalls=[False, True])
async def test_counters(dut, stalls):
    """Event-heavy chains, counters after every chain, random clears, saturation."""
    tb = TB(dut, stalls=stalls)
    await tb.reset()
    cfg = tb.cfg
    # Operands that overflow when added to or multiplied by large inputs, and infinities
    # that make inf - inf and 0 * inf: every unit has events to count.
    for mfu in range(cfg.mfus):
        for bank in VrfBank:
            big = tb.rng.choice(np.array([0x7BFF, 0xFBFF, 0x7C00, 0xFC00, 0x0000, 0x7A00],
                                         np.uint16), (cfg.vrf_depth, cfg.n))
            tb.write_vrf(mfu, bank, 0, big)
    await tb.writes_done()
    saturated = False
    for c in range(max(8, _chain_count(60) // 2)):
        length = int(tb.rng.integers(1, cfg.max_length + 1))
        addr = int(tb.rng.integers(0, cfg.vrf_depth - length + 1))
        ops = [MfuOp.binary("mul", addr), MfuOp.binary("a_sub_b", addr), MfuOp.unary("exp"),
               MfuOp.reduce("sum"), MfuOp.unary("recip"), MfuOp.binary("add", addr)]
        ops = ops[int(tb.rng.integers(0, 3)):]
        x = tb.rng.choice(np.array([0x7BFF, 0x7800, 0x0000, 0x7C00, 0x5BFF, 0xDBFF],
                                   np.uint16), (length, cfg.n))
        tb.send_chain(ops, x, int(tb.rng.integers(1, cfg.n + 1)))
        await tb.wait_idle()
        tb.check_outputs()
        tb.check_counters()
        saturated |= cfg.counter_max in tb.counters.overflow + tb.counters.nan_created
        if tb.rng.random() < 0.25:
            await tb.clear()
            await RisingEdge(dut.clk)
            tb.check_counters()
    events = sum(tb.counters.overflow) + sum(tb.counters.nan_created)
    tb.log.info("counters at the end: %s %s (saturated seen: %s)", tb.counters.overflow,
                tb.counters.nan_created, saturated)
    if cfg.counter_bits <= 8:
        assert saturated, "a small-counter build never reached saturation"
    assert events or tb.chains, "no events"


@cocotb.test()
@cocotb.parametrize(stalls=[False, True])
async def test_softmax(dut, stalls):
    """Softmax in three chains on vectors of 1 to 8 native vectors, bit-exact with the
    model and within the proven bound of a float64 softmax."""
    tb = TB(dut, stalls=stalls)
    await tb.reset()
    cfg = tb.cfg
    n = cfg.n
    worst = 0.0
    count = max(8, _chain_count(60) // 6)
    for k in range(count):
        # Every length 1..max_length native vectors in turn; lanes_last random, so the
        # logical length is rarely a multiple of n.
        length = 1 + k % cfg.max_length
        lanes_last = int(tb.rng.integers(1, n + 1))
        sigma = [0.5, 3.0, 12.0, 100.0][k % 4]
        x = (tb.rng.standard_normal((length, n)) * sigma).astype(np.float16)
        x = x.view(np.uint16).copy()
        x_addr = int(tb.rng.integers(0, cfg.vrf_depth - length + 1))
        e_addr = int(tb.rng.integers(0, cfg.vrf_depth - length + 1))
        model = run_softmax(cfg, x, lanes_last, tb.vrfs.copy(), x_addr=x_addr,
                            e_addr=e_addr)
        store_ops, a_ops, b_ops = softmax_ops(x_addr, e_addr)
        # chain 0: x through no ops, written to AddSubVrf (as its v_wr would).
        tb.send_chain(store_ops, x, lanes_last)
        await tb.wait_idle()
        (stored,) = tb.check_outputs()
        tb.write_vrf(0, VrfBank.ADDSUB, x_addr, stored)
        await tb.writes_done()
        # chain A: e = exp(x - max x), written to MulVrf, and the input of chain B.
        tb.send_chain(a_ops, x, lanes_last)
        await tb.wait_idle()
        (e,) = tb.check_outputs()
        tb.write_vrf(0, VrfBank.MUL, e_addr, e)
        await tb.writes_done()
        tb.send_chain(b_ops, e, lanes_last)
        await tb.wait_idle()
        (out,) = tb.check_outputs()
        assert (out == model.out).all(), "softmax differs from run_softmax"
        tb.check_counters()
        # Against float64: only the logical vector's elements.
        logical = (length - 1) * n + lanes_last
        xs = x.reshape(-1)[:logical]
        p = out.reshape(-1)[:logical].view(np.float16).astype(np.float64)
        err = np.abs(p - softmax_reference(xs))
        bound = softmax_bound(xs)
        assert (err <= bound).all(), (
            f"softmax error {err.max()} beyond the bound at element {np.argmax(err / bound)}")
        worst = max(worst, float((err / bound).max()))
    tb.log.info("%d softmax vectors; largest error / bound %.3f", count, worst)


@cocotb.test()
async def test_timing(dut):
    """Without stalls: chain acceptance to first output as :func:`chain_cycles` says, one
    output per cycle after it, and ``chain.ready`` back the cycle after the last one."""
    tb = TB(dut, stalls=False)
    await tb.reset()
    cfg = tb.cfg
    await tb.fill_vrfs()
    cases = [
        [],
        [MfuOp.binary("add", 0)],
        [MfuOp.unary("relu"), MfuOp.binary("mul", 0)],
        [MfuOp.reduce("max"), MfuOp.binary("b_sub_a", 0), MfuOp.unary("exp")],
        [MfuOp.binary("mul", 0), MfuOp.binary("max", 0), MfuOp.unary("tanh"),
         MfuOp.binary("mul", 0), MfuOp.reduce("sum")],
    ]
    for ops in cases:
        for length in sorted({1, cfg.max_length}):
            x = random_values(tb.rng, (length, cfg.n))
            result = run_chain(cfg, ops, x, cfg.n, tb.vrfs)
            tb.expected.append(result.out)
            tb.counters.add(result)
            first = len(tb.monitor.items)
            await RisingEdge(dut.clk)
            assert dut.chain__ready.value, "chain.ready low while idle"
            dut.chain__payload.value = encode_chain(cfg, ops, length, cfg.n)
            dut.chain__valid.value = 1
            tb.in_src.send(pack_beats(cfg, x))              # offered from the next cycle
            await RisingEdge(dut.clk)                       # the chain is taken here
            dut.chain__valid.value = 0
            cycles = 0
            while True:
                await ReadOnly()
                if dut.o_stream__valid.value:
                    break
                await RisingEdge(dut.clk)
                cycles += 1
            beats = length * cfg.beats
            await tb.monitor.wait_for(first + beats, CLOCK_NS)
            outs = tb.monitor.cycles[first:]
            await ReadOnly()
            assert dut.chain__ready.value, "chain.ready not back after the last output"
            expected = chain_cycles(cfg, ops, length)
            names = [str(o) for o in ops]
            assert outs == list(range(outs[0], outs[0] + beats)), (
                f"{names}: output beats not back to back: {outs}")
            assert cycles == expected, (
                f"{names} L={length}: first output {cycles} cycles after acceptance, "
                f"chain_cycles says {expected}")
            tb.log.info("%s L=%d: first output %d cycles after acceptance", names, length,
                        cycles)
            await RisingEdge(dut.clk)
            await tb.wait_idle()
            tb.check_outputs()
    tb.check_counters()
