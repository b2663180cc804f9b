"""The core's vector memories alone (``hw.core.memories.VectorMemories``) in Amaranth's
simulator: random writes of beats and reads of every space the build has (the IVRF and
each VRF copy, sharing one memory), with idle cycles, against a dict per space. Each
read's data is checked the next cycle on its memory's own output (the reader's input)
and :data:`hw.core.reader.RD_DATA_LATENCY` cycles later on ``rd_data`` (the host's),
each held until the next read's, at one, two and four beats a vector. The whole core is ``tests/hw/test_npu_hw.py``.
"""

import random

import pytest
from amaranth.sim import Simulator

from host.spec.isa import Space, vector_spaces
from hw.core.memories import VectorMemories
from hw.core.reader import RD_DATA_LATENCY, memory_spaces
from tests.hw.test_npu_hw import ALL_BUILDS


@pytest.mark.parametrize("build", ["n8t1l8", "n8t1u", "n8t1"])
def test_memories_against_a_dict(build):
    config = ALL_BUILDS[build]
    rng = random.Random(f"memories {build}")
    spaces = [s.value for s in vector_spaces(config)]
    held_by = {s: key for key, held in memory_spaces(config).items() for s in held}
    depth = {s: config.ivrf_depth if s == Space.IVRF.value else config.vrf_depth
             for s in spaces}
    beats, beat_bits = config.beats, 16 * config.lanes
    dut = VectorMemories(config)
    contents = {s: {} for s in spaces}        # space -> addr -> vector (int)
    checks = {"reads": 0, "host reads": 0}

    def vector(space, addr):
        return contents[space].get(addr, 0)

    async def bench(ctx):
        # (space, data) of the latest read issued, as seen on the memory's own output
        # and on rd_data: the reads of the last RD_DATA_LATENCY cycles, oldest first.
        issued = [None] * RD_DATA_LATENCY
        for _ in range(3000):
            ctx.set(dut.rd.en, 0)
            ctx.set(dut.wr.en, 0)
            # Both at once: the writer and the reader share nothing but the memories.
            write = None
            if rng.random() < 0.6:
                s = rng.choice(spaces)
                a = rng.randrange(min(depth[s], 12))      # few addresses: reads hit writes
                b = rng.randrange(beats)
                value = rng.getrandbits(beat_bits)
                ctx.set(dut.wr.en, 1)
                ctx.set(dut.wr.space, s)
                ctx.set(dut.wr.addr, a)
                if beats > 1:
                    ctx.set(dut.wr.beat, b)
                ctx.set(dut.wr.data.as_value(), value)
                write = (s, a, b, value)
            read = None
            s, a = rng.choice(spaces), rng.randrange(12)
            ctx.set(dut.rd.space, s)          # held by an idle read port, or read
            ctx.set(dut.rd.addr, a)
            if rng.random() < 0.6 and a < depth[s]:
                ctx.set(dut.rd.en, 1)
                read = (s, vector(s, a))      # the read sees the memory before the write
            # Last cycle's read on its memory's output, with this cycle's request on the
            # port, and the one RD_DATA_LATENCY cycles back on rd_data: each stays until
            # the next read's.
            if issued[-1] is not None:
                s_last, want = issued[-1]
                own = getattr(dut, f"{held_by[s_last]}_data")
                assert ctx.get(own).as_value().value == want, (s_last, hex(want))
                checks["reads"] += 1
            if issued[0] is not None:
                s_host, want = issued[0]
                assert ctx.get(dut.rd_data).as_value().value == want, (s_host, hex(want))
                checks["host reads"] += 1
            await ctx.tick()
            if write is not None:
                s, a, b, value = write
                mask = ((1 << beat_bits) - 1) << (b * beat_bits)
                contents[s][a] = vector(s, a) & ~mask | value << (b * beat_bits)
            issued = issued[1:] + [read or issued[-1]]

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    assert checks["reads"] > 1000 and checks["host reads"] > 1000


def test_memories_refuse_a_bad_config():
    with pytest.raises(TypeError, match="config must be an NpuConfig, not 'n8t1'"):
        VectorMemories("n8t1")
