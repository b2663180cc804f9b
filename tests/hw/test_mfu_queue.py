"""The MFU pipeline's output queue (``hw.mfu.mfu._queue``) in Amaranth's simulator.

The queue takes an item whenever its source offers one (the MFUs have no back-pressure)
and must neither lose, duplicate nor reorder items under any pattern of output stalls,
as long as the source keeps within the queue's room. The MFU pipeline benches
(``tests/hw/test_mfu_hw.py``) run it under Verilator and Icarus inside the pipeline; this
file drives it alone to the edges that a pipeline bench rarely reaches: a ring filled to
the last entry, a ring of one entry, and the one-cycle pass-through when nothing waits.
"""

import random

import pytest
from amaranth.hdl import Module
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.sim import Simulator

from hw.mfu.mfu import _queue

WIDTH = 12


class QueueHarness(wiring.Component):
    """``_queue`` with ports: ``i_valid``/``i_data`` in, an ordinary stream out."""

    def __init__(self, depth):
        self.depth = depth
        super().__init__({
            "i_valid": In(1),
            "i_data": In(WIDTH),
            "o_stream": Out(stream.Signature(WIDTH)),
        })

    def elaborate(self, platform):
        m = Module()
        valid, payload = _queue(m, "q", WIDTH, self.depth, self.i_valid, self.i_data,
                                self.o_stream.ready)
        m.d.comb += [self.o_stream.valid.eq(valid), self.o_stream.payload.eq(payload)]
        return m


def run_queue(depth, *, limit, offer_prob, ready_prob, cycles, seed):
    """Offer items with probability ``offer_prob`` while fewer than ``limit`` are inside,
    take them with probability ``ready_prob``; return (sent, received, max inside,
    first-item latency in cycles)."""
    dut = QueueHarness(depth)
    rng = random.Random(seed)
    sent, received = [], []
    stats = {"inside": 0, "latency": None}

    async def bench(ctx):
        counter = 0
        held = None                      # (valid, payload) seen while stalled
        for cycle in range(cycles):
            inside = len(sent) - len(received)
            offer = inside < limit and rng.random() < offer_prob
            ready = rng.random() < ready_prob
            ctx.set(dut.i_valid, offer)
            ctx.set(dut.i_data, counter)
            ctx.set(dut.o_stream.ready, ready)
            valid = ctx.get(dut.o_stream.valid)
            payload = ctx.get(dut.o_stream.payload)
            if held is not None:
                # Stream rule: once offered, valid and payload hold until taken.
                assert valid and payload == held, f"cycle {cycle}: output changed"
            if valid and ready:
                received.append(payload)
                if stats["latency"] is None:
                    stats["latency"] = cycle
            held = payload if valid and not ready else None
            if offer:
                sent.append(counter)
                counter = (counter + 1) % (1 << WIDTH)
            stats["inside"] = max(stats["inside"], len(sent) - len(received))
            await ctx.tick()
        # Drain: no more offers, always ready.
        ctx.set(dut.i_valid, 0)
        ctx.set(dut.o_stream.ready, 1)
        for _ in range(depth + 8):
            if ctx.get(dut.o_stream.valid):
                received.append(ctx.get(dut.o_stream.payload))
            await ctx.tick()
        assert not ctx.get(dut.o_stream.valid)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    return sent, received, stats["inside"], stats["latency"]


@pytest.mark.parametrize("depth", [1, 2, 3, 8])
@pytest.mark.parametrize("ready_prob", [1.0, 0.7, 0.3, 0.05])
def test_order_and_no_loss(depth, ready_prob):
    """Items leave in order, none lost or repeated, for ``depth + 3`` items inside (the
    ring, the memory's read port and the two-register buffer): more than the pipeline
    ever puts in (``depth``)."""
    sent, received, inside, _ = run_queue(depth, limit=depth + 3, offer_prob=0.8,
                                          ready_prob=ready_prob, cycles=600,
                                          seed=depth * 100 + int(ready_prob * 10))
    assert received == sent
    if ready_prob <= 0.3:
        assert inside == depth + 3, "the stalls never filled the queue"


def test_pass_through_is_one_cycle():
    """With the output always ready, an item offered in cycle 0 is on the output in
    cycle 1 (as through a two-register buffer alone), and one item per cycle passes."""
    sent, received, inside, latency = run_queue(4, limit=7, offer_prob=1.0, ready_prob=1.0,
                                                cycles=50, seed=1)
    assert latency == 1
    assert received == sent and inside == 1


def test_ring_overflow_is_caught():
    """The check above can fail: one item more than the queue holds is lost."""
    sent, received, _, _ = run_queue(2, limit=2 + 4, offer_prob=1.0, ready_prob=0.0,
                                     cycles=20, seed=3)
    assert received != sent
