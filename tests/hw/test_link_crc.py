"""The link's CRC units (``hw.link.crc``) against ``host.spec.protocol``'s CRCs.

The Python definitions over random data and the catalogue check values; the byte-wide
unit in Amaranth's simulator over random messages (one byte per cycle, with gaps), its
residue flag on a message followed by its own CRC; the combinational multi-byte check of
the header window.
"""

import random

import pytest
from amaranth.hdl import Const, Module, Signal
from amaranth.sim import Simulator

from host.spec import protocol as p
from hw.link.crc import CRC16_CCITT_FALSE, CRC32, ByteCrc, CrcDef

# Components built here only to look at them are never elaborated, on purpose.
pytestmark = pytest.mark.filterwarnings("ignore::amaranth.hdl.UnusedElaboratable")


def test_definitions_match_host():
    rng = random.Random(1)
    assert CRC16_CCITT_FALSE.compute(b"123456789") == p.CRC16_CHECK
    assert CRC32.compute(b"123456789") == p.CRC32_CHECK
    for size in list(range(0, 20)) + [rng.randrange(20, 5000) for _ in range(30)]:
        data = rng.randbytes(size)
        assert CRC16_CCITT_FALSE.compute(data) == p.crc16(data) == p.crc16_bytewise(data)
        assert CRC32.compute(data) == p.crc32(data) == p.crc32_bytewise(data)


def test_residue():
    rng = random.Random(2)
    for _ in range(20):
        data = rng.randbytes(rng.randrange(50))
        reg = CRC32.init
        for byte in data + p.crc32(data).to_bytes(4, "little"):
            reg = CRC32.update(reg, byte)
        assert reg == CRC32.residue == 0xDEBB20E3
        reg = CRC16_CCITT_FALSE.init
        for byte in data + p.crc16(data).to_bytes(2, "big"):
            reg = CRC16_CCITT_FALSE.update(reg, byte)
        assert reg == CRC16_CCITT_FALSE.residue == 0


@pytest.mark.parametrize("crc", [CRC16_CCITT_FALSE, CRC32], ids=lambda c: c.name)
def test_byte_unit(crc):
    dut = ByteCrc(crc)
    rng = random.Random(3)
    messages = [rng.randbytes(rng.randrange(0, 300)) for _ in range(12)] + [b"123456789"]
    host = {"crc16": p.crc16, "crc32": p.crc32}[crc.name]
    order = "little" if crc.reflected else "big"

    async def bench(ctx):
        for data in messages:
            ctx.set(dut.clear, 1)
            await ctx.tick()
            ctx.set(dut.clear, 0)
            trailer = host(data).to_bytes(crc.width // 8, order)
            for i, byte in enumerate(data + trailer):
                while rng.random() < 0.3:           # gaps: en low
                    ctx.set(dut.en, 0)
                    await ctx.tick()
                ctx.set(dut.en, 1)
                ctx.set(dut.data, byte)
                if i == len(data):
                    assert ctx.get(dut.value) == host(data)
                last = i == len(data) + len(trailer) - 1
                assert ctx.get(dut.residue_next) == int(last) or not last
                await ctx.tick()
            ctx.set(dut.en, 0)
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()


def test_of_bytes_header_check():
    """The combinational CRC-16 of six bytes (the IMP's sliding header check)."""
    values = [Signal(8, name=f"b{i}") for i in range(6)]
    out = Signal(16)
    m = Module()
    m.d.comb += out.eq(CRC16_CCITT_FALSE.of_bytes(values))
    rng = random.Random(4)
    cases = [bytes(6), b"\xff" * 6, p.encode_frame(1, 2)[:6]] + \
        [rng.randbytes(6) for _ in range(200)]

    async def bench(ctx):
        for data in cases:
            for v, byte in zip(values, data):
                ctx.set(v, byte)
            assert ctx.get(out) == p.crc16(data), data.hex()
        assert CRC32.of_bytes([Const(0x31, 8)]).shape().width == 32

    sim = Simulator(m)
    sim.add_testbench(bench)
    sim.run()


def test_constructor_errors():
    with pytest.raises(TypeError, match="crc must be a CrcDef, not 'crc32'"):
        ByteCrc("crc32")
    assert isinstance(CRC32, CrcDef)
