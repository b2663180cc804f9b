"""cocotb bench for :class:`hw.arith.fp16_unary.Fp16Unary`: exhaustive and bit-exact.

Every FP16 input (all 65,536 patterns) goes through the hardware under every built op,
and every output lane (result, ``overflow``, ``nan_created``) is compared with the
reference model :func:`host.numerics.unary.unary_bits` / :func:`host.numerics.unary.unary_events`:

* ``test_exhaustive``: op by op, no stalls (one vector per cycle);
* ``test_exhaustive_mixed``: the same (op, input) pairs, but each vector's op drawn at
  random, so the op changes between consecutive vectors, with random idle input cycles
  and random output back-pressure (while back-pressured the payload must hold);
* ``test_latency``: a vector comes out exactly ``LATENCY`` cycles after it went in;
* ``test_unbuilt_ops``: ops missing from the build and the unused codes 6 and 7 give the
  canonical NaN with ``nan_created`` on every non-NaN lane.

The per-cycle cocotb overhead is what costs time, so the driver writes one packed integer
per vector, the monitor keeps one integer per output, and packing, unpacking and the model
run on whole NumPy batches.

Parameters come from the environment (set by ``tests/hw/test_fp16_unary_hw.py``):

``UN_LANES``
    The build's ``lanes`` (default 16).
``UN_OPS``
    Comma-separated names of the built ops (default: all).
``UN_INPUTS``
    How many of the 65,536 patterns per op (default all; fewer for a quick run).
"""

from __future__ import annotations

import os
import random
import time

import numpy as np

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, ReadOnly, RisingEdge

from host.spec.ops import UnaryOp
from host.numerics.unary import unary_bits, unary_events
from hw.arith.fp16_unary import LATENCY
from sim.stream import StreamMonitor, StreamSink, StreamSource

IDLE_PROB = 0.3
BACKPRESSURE_PROB = 0.3
DRAIN_CYCLES = 32
CLOCK_NS = 10


class Config:
    """Build parameters of the DUT, from the environment."""

    def __init__(self):
        self.lanes = int(os.environ.get("UN_LANES", "16"))
        names = os.environ.get("UN_OPS", "")
        self.ops = (tuple(UnaryOp.parse(n) for n in names.split(",")) if names
                    else tuple(UnaryOp))
        self.inputs = int(os.environ.get("UN_INPUTS", str(1 << 16)))


# --- packing -------------------------------------------------------------------------------

def pack_inputs(x: np.ndarray, op: np.ndarray, lanes: int) -> list[int]:
    """``(V, lanes)`` uint16 and ``(V,)`` op codes -> payload integers (x lanes, then op)."""
    raw = np.ascontiguousarray(x, dtype="<u2").tobytes()
    width = 2 * lanes
    shift = 16 * lanes
    return [int.from_bytes(raw[k * width:(k + 1) * width], "little") | (int(o) << shift)
            for k, o in enumerate(op.tolist())]


def unpack_outputs(words: list[int], lanes: int):
    """Output payload integers -> ``result (V, lanes)`` uint16, ``overflow`` and
    ``nan_created`` ``(V, lanes)`` bool."""
    count = len(words)
    nbytes = (18 * lanes + 7) // 8
    raw = b"".join(w.to_bytes(nbytes, "little") for w in words)
    rows = np.frombuffer(raw, np.uint8).reshape(count, nbytes)
    result = np.ascontiguousarray(rows[:, :2 * lanes]).view("<u2").astype(np.uint16)
    flags = np.unpackbits(rows, axis=1, bitorder="little")[:, 16 * lanes:18 * lanes]
    return result, flags[:, :lanes].astype(bool), flags[:, lanes:].astype(bool)


# --- model -----------------------------------------------------------------------------------

def model(x: np.ndarray, op: np.ndarray, built):
    """Expected ``(result, overflow, nan_created)`` for vectors ``x`` with ops ``op``."""
    res = np.empty_like(x)
    ovf = np.zeros(x.shape, bool)
    nanc = np.zeros(x.shape, bool)
    for code in np.unique(op):
        sel = op == code
        if int(code) in [o.value for o in UnaryOp]:
            res[sel] = unary_bits(int(code), x[sel], ops=built)
            ovf[sel], nanc[sel] = unary_events(int(code), x[sel], ops=built)
        else:                                   # the unused codes: no op, canonical NaN
            res[sel] = 0x7E00
            nanc[sel] = ~np.isnan(x[sel].view(np.float16))
    return res, ovf, nanc


# --- testbench ---------------------------------------------------------------------------------

class TB:
    """Clock, reset, source, sink, monitor and scoreboard around one Fp16Unary."""

    def __init__(self, dut, *, stalls: bool):
        self.dut = dut
        self.cfg = Config()
        self.log = dut._log
        seed = random.getrandbits(32)
        self.rng = np.random.default_rng(seed)
        Clock(dut.clk, CLOCK_NS, unit="ns").start()
        self.source = StreamSource(dut.clk, dut.i_stream__valid, dut.i_stream__ready,
                                   dut.i_stream__payload,
                                   IDLE_PROB if stalls else 0.0, seed=seed + 1)
        self.sink = StreamSink(dut.clk, dut.o_stream__ready,
                               BACKPRESSURE_PROB if stalls else 0.0, seed=seed + 2)
        self.monitor = StreamMonitor(dut.clk, dut.o_stream__valid, dut.o_stream__ready,
                                     dut.o_stream__payload)
        self.sent_x: list[np.ndarray] = []
        self.sent_op: list[np.ndarray] = []

    async def reset(self):
        dut = self.dut
        dut.rst.value = 1
        dut.i_stream__valid.value = 0
        for _ in range(3):
            await RisingEdge(dut.clk)
        dut.rst.value = 0
        await RisingEdge(dut.clk)
        assert not dut.o_stream__valid.value, "o_stream.valid high after reset"

    def send(self, x: np.ndarray, op: np.ndarray):
        """Queue vectors ``x (V, lanes)`` with op codes ``op (V,)``."""
        self.sent_x.append(x)
        self.sent_op.append(op)
        self.source.send(pack_inputs(x, op, self.cfg.lanes))

    async def check(self):
        """Wait for every output, then compare all of them with the model."""
        total = sum(len(o) for o in self.sent_op)
        start = time.perf_counter()
        cycles = self.monitor.cycle
        await self.monitor.wait_for(total, CLOCK_NS)
        await ClockCycles(self.dut.clk, DRAIN_CYCLES)
        assert len(self.monitor.items) == total, (
            f"{len(self.monitor.items)} vectors came out for {total} in")
        sim_s, cycles = time.perf_counter() - start, self.monitor.cycle - cycles
        x = np.concatenate(self.sent_x)
        op = np.concatenate(self.sent_op)
        e_res, e_ovf, e_nan = model(x, op, self.cfg.ops)
        g_res, g_ovf, g_nan = unpack_outputs(self.monitor.items, self.cfg.lanes)
        bad = (g_res != e_res) | (g_ovf != e_ovf) | (g_nan != e_nan)
        rows, cols = np.nonzero(bad)
        for v, lane in list(zip(rows, cols))[:8]:
            code = int(op[v])
            name = UnaryOp(code).name if code < len(UnaryOp) else str(code)
            self.log.error("vector %d lane %d: %s(%#06x) gave %#06x ovf=%d nan=%d, model "
                           "%#06x ovf=%d nan=%d", v, lane, name, x[v, lane], g_res[v, lane],
                           g_ovf[v, lane], g_nan[v, lane], e_res[v, lane], e_ovf[v, lane],
                           e_nan[v, lane])
        assert not bad.any(), f"{bad.sum()} of {bad.size} lane results differ from the model"
        self.log.info("checked %d vectors x %d lanes (%d overflow, %d nan_created events, "
                      "%d stall checks) in %d cycles, %.1f s (%.0f cycles/s)", total,
                      self.cfg.lanes, e_ovf.sum(), e_nan.sum(), self.monitor.stall_checks,
                      cycles, sim_s, cycles / max(sim_s, 1e-9))
        return e_ovf, e_nan

    def exhaustive_vectors(self, op_code: int) -> np.ndarray:
        """All (or ``UN_INPUTS``) patterns in random order, padded to whole vectors."""
        lanes = self.cfg.lanes
        xs = self.rng.permutation(1 << 16)[:self.cfg.inputs].astype(np.uint16)
        pad = -len(xs) % lanes
        xs = np.concatenate([xs, self.rng.integers(0, 1 << 16, pad).astype(np.uint16)])
        return xs.reshape(-1, lanes)


@cocotb.test()
@cocotb.parametrize(op=[op.name for op in UnaryOp])
async def test_exhaustive(dut, op):
    """Every input under one op, no stalls; events checked lane by lane."""
    tb = TB(dut, stalls=False)
    if UnaryOp[op] not in tb.cfg.ops:
        tb.log.info("%s is not built: test_unbuilt_ops covers it", op)
        return
    await tb.reset()
    code = UnaryOp[op].value
    x = tb.exhaustive_vectors(code)
    tb.send(x, np.full(len(x), code))
    e_ovf, e_nan = await tb.check()
    if UnaryOp[op] in (UnaryOp.EXP, UnaryOp.RECIP) and tb.cfg.inputs == 1 << 16:
        assert e_ovf.any(), "no overflow event in an exhaustive run"
    assert not e_nan.any()


@cocotb.test()
async def test_exhaustive_mixed(dut):
    """Every input under every built op, the op drawn per vector, with stalls."""
    tb = TB(dut, stalls=True)
    await tb.reset()
    xs, ops = [], []
    for op in tb.cfg.ops:
        x = tb.exhaustive_vectors(op.value)
        xs.append(x)
        ops.append(np.full(len(x), op.value))
    order = tb.rng.permutation(sum(len(o) for o in ops))
    x = np.concatenate(xs)[order]
    op = np.concatenate(ops)[order]
    switches = int((op[1:] != op[:-1]).sum())
    tb.log.info("%d vectors, the op changes %d times", len(op), switches)
    tb.send(x, op)
    await tb.check()
    assert tb.monitor.stall_checks > 0


@cocotb.test()
async def test_latency(dut):
    """Without stalls a vector comes out exactly LATENCY cycles after it was taken."""
    tb = TB(dut, stalls=False)
    await tb.reset()
    lanes = tb.cfg.lanes
    x = tb.rng.integers(0, 1 << 16, (40, lanes)).astype(np.uint16)
    op = tb.rng.choice([o.value for o in tb.cfg.ops], 40)
    tb.send(x, op)
    await tb.check()
    taken = tb.source.accept_cycles
    out = tb.monitor.cycles
    # Both count rising edges since their start; the monitor started one edge earlier
    # relative to the source's first edge (it starts in __init__, before reset).
    lat = [o - t for o, t in zip(out, taken)]
    assert len(set(lat)) == 1, f"latency varies: {lat}"
    offset = lat[0] - LATENCY
    # Re-check against an absolute reference: send one vector alone and count edges.
    dut.i_stream__payload.value = pack_inputs(x[:1], op[:1], lanes)[0]
    dut.i_stream__valid.value = 1
    await RisingEdge(dut.clk)
    dut.i_stream__valid.value = 0
    for k in range(1, LATENCY + 2):
        await ReadOnly()
        if dut.o_stream__valid.value:
            break
        await RisingEdge(dut.clk)
    assert k == LATENCY, f"first output {k} cycles after the input, expected {LATENCY}"
    tb.log.info("latency %d cycles (monitor/source clock offset %d)", LATENCY, offset)
    await RisingEdge(dut.clk)


@cocotb.test()
async def test_unbuilt_ops(dut):
    """Ops missing from the build and codes 6, 7: canonical NaN, nan_created."""
    tb = TB(dut, stalls=True)
    await tb.reset()
    lanes = tb.cfg.lanes
    codes = [code for code in range(8) if code >= len(UnaryOp)
             or UnaryOp(code) not in tb.cfg.ops]
    built = [o.value for o in tb.cfg.ops]
    count = 2000
    x = tb.rng.integers(0, 1 << 16, (count, lanes)).astype(np.uint16)
    # Interleave unbuilt codes with built ops, so the switch back is exercised too.
    op = tb.rng.choice(codes + built, count)
    tb.send(x, op)
    _, e_nan = await tb.check()
    assert e_nan.any()
