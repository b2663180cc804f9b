"""The register slice (``hw.slice.RegisterSlice``) in Amaranth's simulator.

The link's benches (``tests/hw/test_link_hw.py``, Verilator and Icarus) run it in place on
the MRF word port, where the core rarely stalls a word; this file drives it alone through
every pattern of offers and stalls, checks the stream rules on both sides, and checks
what it is for: that no output depends on an input in the same cycle.
"""

import random

import pytest
from amaranth.lib import data
from amaranth.sim import Simulator

from hw.slice import RegisterSlice

LAYOUT = data.StructLayout({"a": 5, "b": 7})
MASK = (1 << LAYOUT.size) - 1


def run_slice(*, offer_prob, ready_prob, items, seed, probe=False):
    """Send ``items`` numbered items through a slice, offering with ``offer_prob`` and
    taking with ``ready_prob`` each cycle; return (received, first-item latency in
    cycles, cycles taken). With ``probe``, every cycle also flips each input after
    reading the outputs and asserts that no output moved."""
    dut = RegisterSlice(LAYOUT)
    rng = random.Random(seed)
    received = []
    stats = {"latency": None, "cycles": 0}

    async def bench(ctx):
        sent = 0
        offering = False
        held = None
        cycle = 0
        while len(received) < items:
            assert cycle < 50 * items, "the slice stopped passing items"
            if not offering and sent < items and rng.random() < offer_prob:
                offering = True              # a source holds its offer until taken
            ready = rng.random() < ready_prob
            ctx.set(dut.i_stream.valid, offering)
            ctx.set(dut.i_stream.payload.as_value(), sent if offering else rng.getrandbits(12))
            ctx.set(dut.o_stream.ready, ready)
            in_ready = ctx.get(dut.i_stream.ready)
            valid = ctx.get(dut.o_stream.valid)
            payload = ctx.get(dut.o_stream.payload.as_value())
            empty = ctx.get(dut.empty)
            assert empty == (len(received) == sent), \
                f"cycle {cycle}: empty is {empty} with {sent - len(received)} items inside"
            if held is not None:
                # Stream rule: once offered, valid and payload hold until taken.
                assert valid and payload == held, f"cycle {cycle}: output changed"
            if probe:
                ctx.set(dut.o_stream.ready, not ready)
                ctx.set(dut.i_stream.valid, not offering)
                ctx.set(dut.i_stream.payload.as_value(), ~sent & MASK)
                assert ctx.get(dut.i_stream.ready) == in_ready, \
                    f"cycle {cycle}: i_stream.ready follows an input combinationally"
                assert ctx.get(dut.o_stream.valid) == valid and \
                    (ctx.get(dut.o_stream.payload.as_value())) == payload, \
                    f"cycle {cycle}: o_stream follows an input combinationally"
                ctx.set(dut.o_stream.ready, ready)
                ctx.set(dut.i_stream.valid, offering)
                ctx.set(dut.i_stream.payload.as_value(), sent)
            if valid and ready:
                received.append(payload)
                if stats["latency"] is None:
                    stats["latency"] = cycle
            held = payload if valid and not ready else None
            if offering and in_ready:
                sent += 1
                offering = False
            await ctx.tick()
            cycle += 1
        stats["cycles"] = cycle
        ctx.set(dut.i_stream.valid, 0)
        ctx.set(dut.o_stream.ready, 1)
        await ctx.tick()
        assert ctx.get(dut.empty) and not ctx.get(dut.o_stream.valid), \
            "an item left over after the last was taken"

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    return received, stats["latency"], stats["cycles"]


@pytest.mark.parametrize("offer_prob", [1.0, 0.6, 0.2])
@pytest.mark.parametrize("ready_prob", [1.0, 0.7, 0.3, 0.05])
def test_order_and_no_loss(offer_prob, ready_prob):
    """Items leave in order, none lost or repeated, under random offers and stalls."""
    received, _, _ = run_slice(offer_prob=offer_prob, ready_prob=ready_prob, items=300,
                               seed=int(offer_prob * 10) * 100 + int(ready_prob * 100))
    assert received == list(range(300))


def test_no_output_follows_an_input():
    """Every output is a register: flipping ``o_stream.ready``, ``i_stream.valid`` and
    the payload within a cycle moves neither ``i_stream.ready`` nor ``o_stream``."""
    received, _, _ = run_slice(offer_prob=0.7, ready_prob=0.5, items=200, seed=5,
                               probe=True)
    assert received == list(range(200))


def test_one_cycle_latency_and_full_rate():
    """Always offered, always ready: the first item is out the next cycle and one item
    passes per cycle after it."""
    received, latency, cycles = run_slice(offer_prob=1.0, ready_prob=1.0, items=100, seed=1)
    assert received == list(range(100))
    assert latency == 1 and cycles == 101


def test_shape_is_checked():
    with pytest.raises(TypeError, match="shape must be shape-castable, not 'twelve'"):
        RegisterSlice("twelve")
