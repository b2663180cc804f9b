"""``hw.mvm.quantizer.VectorQuantizer``'s stated timing, in Amaranth's simulator: a vector
taken at an edge is offered ``LATENCY`` edges later, and its counts are in the counters
one edge after the block leaves (the cocotb bench, ``tests/hw/test_quantizer_hw.py``, checks
the values and the counters every cycle; the MVM's cycle formula relies on the latency).
"""

from amaranth.sim import Simulator

from hw.mvm.quantizer import LATENCY, VectorQuantizer

_INF = 0x7C00                        # FP16 +inf: counted as non-finite, becomes 65504
_ONE = 0x3C00


def test_latency_and_count_timing():
    dut = VectorQuantizer(n=4, mantissa_bits=4)
    trace = []

    async def bench(ctx):
        ctx.set(dut.o_stream.ready, 1)
        ctx.set(dut.static, 1)
        ctx.set(dut.static_exponent, 127 - 3)     # e = -3: 1.0 and 65504 saturate
        ctx.set(dut.i_stream.payload, [_INF, _ONE, 0, 0])
        ctx.set(dut.i_stream.valid, 1)
        await ctx.tick()                           # edge 1 takes the vector
        ctx.set(dut.i_stream.valid, 0)
        for edge in range(2, LATENCY + 5):
            await ctx.tick()
            trace.append((edge, ctx.get(dut.o_stream.valid), ctx.get(dut.saturations),
                          ctx.get(dut.nonfinite)))

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    valid_edges = [edge for edge, valid, _, _ in trace if valid]
    # Taken at edge 1 (accepted in cycle 0), offered in cycle LATENCY (after edge
    # LATENCY), taken by the sink at the next edge.
    assert valid_edges == [LATENCY]
    taken = LATENCY + 1
    counts = {edge: (sat, nonfinite) for edge, _, sat, nonfinite in trace}
    assert counts[taken] == (0, 0)
    assert counts[taken + 1] == (2, 1)
