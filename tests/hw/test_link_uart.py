"""The board's 8N1 UART (``hw.link.uart``) in Amaranth's simulator.

Transmitter into receiver at several divisors with random gaps; the receiver against a
line driven from Python with a bit time 3 % off either way, a glitch shorter than half a
bit, a stop bit held low (framing error, byte dropped, line must go high again) and a
byte not taken in time (overrun); the divisor rule and constructor errors.
"""

import random

import pytest
from amaranth.hdl import Module
from amaranth.sim import Simulator

from hw.link.uart import MIN_DIVISOR, UartRx, UartTx, divisor_for

pytestmark = pytest.mark.filterwarnings("ignore::amaranth.hdl.UnusedElaboratable")


@pytest.mark.parametrize("divisor", [MIN_DIVISOR, 7, 26])
def test_loopback(divisor):
    m = Module()
    m.submodules.tx = tx = UartTx(divisor)
    m.submodules.rx = rx = UartRx(divisor)
    m.d.comb += rx.rx.eq(tx.tx)
    rng = random.Random(divisor)
    sent = [rng.randrange(256) for _ in range(40)] + [0x00, 0xFF, 0x55, 0xAA]
    got = []

    async def source(ctx):
        for byte in sent:
            while rng.random() < 0.2:
                await ctx.tick().repeat(rng.randrange(1, 3 * divisor))
            ctx.set(tx.i_stream.valid, 1)
            ctx.set(tx.i_stream.payload, byte)
            await ctx.tick().until(tx.i_stream.ready)
            ctx.set(tx.i_stream.valid, 0)

    async def sink(ctx):
        ctx.set(rx.o_stream.ready, 1)
        while len(got) < len(sent):
            await ctx.tick()
            if ctx.get(rx.o_stream.valid):
                got.append(ctx.get(rx.o_stream.payload))
        await ctx.tick().repeat(12 * divisor)
        assert ctx.get(rx.overruns) == ctx.get(rx.framing_errors) == 0
        assert not ctx.get(rx.o_stream.valid)

    sim = Simulator(m)
    sim.add_clock(1e-6)
    sim.add_testbench(source)
    sim.add_testbench(sink)
    sim.run_until(1e-6 * 13 * divisor * (len(sent) + 50) * 3)
    assert got == sent


@pytest.mark.parametrize("skew", [0.97, 1.03])
def test_receiver_line(skew):
    divisor = 16
    rx = UartRx(divisor)
    rng = random.Random(5)
    data = [rng.randrange(256) for _ in range(20)]
    bit = divisor * skew
    got = []

    def frame(byte, stop=1):
        return [0] + [byte >> i & 1 for i in range(8)] + [stop]

    async def line(ctx):
        ctx.set(rx.rx, 1)
        await ctx.tick().repeat(20)
        t = 0.0

        async def send(bits):
            nonlocal t
            for b in bits:
                ctx.set(rx.rx, b)
                end = t + bit
                await ctx.tick().repeat(int(round(end)) - int(round(t)))
                t = end

        for byte in data[:10]:
            await send(frame(byte))
        ctx.set(rx.rx, 0)                           # glitch: 3/16 of a bit, no start
        await ctx.tick().repeat(3)
        await send([1] * 20)
        await send(frame(0x3C, stop=0) + [0] * 30 + [1] * 20)   # framing error, break
        for byte in data[10:]:
            await send(frame(byte))
        await send([1] * 40)

    async def sink(ctx):
        ctx.set(rx.o_stream.ready, 1)
        while True:
            await ctx.tick()
            if ctx.get(rx.o_stream.valid):
                got.append(ctx.get(rx.o_stream.payload))

    sim = Simulator(rx)
    sim.add_clock(1e-6)
    sim.add_testbench(line)
    sim.add_testbench(sink, background=True)
    sim.run()
    assert got == data

    # Overrun: nobody takes the first byte; the second is dropped and counted.
    rx2 = UartRx(divisor)

    async def overrun(ctx):
        ctx.set(rx2.rx, 1)
        ctx.set(rx2.o_stream.ready, 0)
        await ctx.tick().repeat(5)
        for byte in (0x12, 0x34):
            for b in frame(byte):
                ctx.set(rx2.rx, b)
                await ctx.tick().repeat(divisor)
        ctx.set(rx2.rx, 1)
        await ctx.tick().repeat(divisor)
        assert ctx.get(rx2.o_stream.valid) and ctx.get(rx2.o_stream.payload) == 0x12
        assert ctx.get(rx2.overruns) == 1

    sim = Simulator(rx2)
    sim.add_clock(1e-6)
    sim.add_testbench(overrun)
    sim.run()


def test_framing_error_counted():
    divisor = 8
    rx = UartRx(divisor)

    async def bench(ctx):
        ctx.set(rx.rx, 1)
        ctx.set(rx.o_stream.ready, 1)
        await ctx.tick().repeat(5)
        for b in [0] + [1, 0] * 4 + [0]:
            ctx.set(rx.rx, b)
            await ctx.tick().repeat(divisor)
        await ctx.tick().repeat(3 * divisor)
        assert ctx.get(rx.framing_errors) == 1 and not ctx.get(rx.o_stream.valid)

    sim = Simulator(rx)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()


def test_divisor_for():
    assert divisor_for(25_000_000, 1_000_000) == 25
    assert divisor_for(48_000_000, 3_000_000) == 16
    assert divisor_for(25_000_000, 115_200) == 217
    with pytest.raises(ValueError, match="baud 3000000 is too fast for clk_hz 10000000"):
        divisor_for(10_000_000, 3_000_000)
    with pytest.raises(ValueError, match=r"baud 3000000 at clk_hz 25000000 is 4\.2% off"):
        divisor_for(25_000_000, 3_000_000)
    with pytest.raises(ValueError, match="baud must be an integer >= 1|baud must be"):
        divisor_for(25_000_000, 0)


def test_constructor_errors():
    with pytest.raises(ValueError, match="divisor must be .*3"):
        UartRx(3)
    with pytest.raises(TypeError, match="divisor must be an integer"):
        UartTx(4.5)
