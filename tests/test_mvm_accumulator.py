"""``hw.mvm_accumulator.BfpAccumulator`` alone, in Amaranth's simulator: the row-block
sums against Python integers, for shifts over the whole range (below the clamp at
``-(dot_bits - 1)``, where a term is the dot product's sign, up to ``max_shift``).

The MVM bench (``tests/test_mvm_hw.py``) checks the accumulator inside the MVM, sums and
counters, against the reference model; this test drives its ports directly, so that gaps
in ``valid``, terms of both signs at the largest shifts and row blocks of one group are
exercised without the rest of the datapath.
"""

import random

import pytest
from amaranth.sim import Simulator

from host.config import MvmConfig
from hw.mvm_accumulator import BfpAccumulator


def _term(dot, shift):
    """``floor(dot * 2**shift)``, the accumulator's term (in units of ``2**acc_lsb``)."""
    return dot << shift if shift >= 0 else dot >> -shift


def _groups(rng, config, blocks):
    """Row blocks of random groups: ``(dots, shifts, engines)`` per group, where dots and
    shifts are ``[t][i]``. Half the terms sit at the largest shift with a full-scale dot
    of either sign, so that sums carry and borrow across the whole accumulator; the other
    half draw the shift from below the clamp up to ``max_shift``."""
    c = config
    dot_max = (1 << (c.dot_bits - 1)) - 1
    lo_shift = -(c.dot_bits + 2)
    out = []
    for _ in range(blocks):
        cols = rng.randint(1, c.max_col_tiles)
        groups = -(-cols // c.tiles)
        block = []
        for g in range(groups):
            engines = [g * c.tiles + t < cols for t in range(c.tiles)]
            dots, shifts = [], []
            for t in range(c.tiles):
                row_d, row_s = [], []
                for _ in range(c.n):
                    if not engines[t]:
                        d, s = 0, 0
                    elif rng.random() < 0.5:
                        d, s = rng.choice((dot_max, -dot_max - 1)), c.max_shift
                    else:
                        d, s = rng.randint(-dot_max - 1, dot_max), rng.randint(lo_shift,
                                                                              c.max_shift)
                    row_d.append(d)
                    row_s.append(s)
                dots.append(row_d)
                shifts.append(row_s)
            block.append((dots, shifts, engines))
        out.append(block)
    return out


@pytest.mark.parametrize("n,tiles", [(4, 1), (4, 2), (4, 3)])
def test_sums(n, tiles):
    config = MvmConfig(n=n, tiles=tiles, max_col_tiles=7)
    dut = BfpAccumulator(config)
    rng = random.Random(n * 10 + tiles)
    blocks = _groups(rng, config, 40)
    expected = [[sum(_term(d[t][i], s[t][i]) for d, s, _ in block for t in range(tiles))
                 for i in range(n)] for block in blocks]
    got = []

    async def drive(ctx):
        ctx.set(dut.k, 64)
        for block in blocks:
            for g, (dots, shifts, engines) in enumerate(block):
                while rng.random() < 0.3:                   # idle cycles between groups
                    ctx.set(dut.valid, 0)
                    await ctx.tick()
                ctx.set(dut.valid, 1)
                ctx.set(dut.first, g == 0)
                ctx.set(dut.last, g == len(block) - 1)
                ctx.set(dut.engines, sum(e << t for t, e in enumerate(engines)))
                ctx.set(dut.dot, dots)
                ctx.set(dut.shift, shifts)
                await ctx.tick()
            ctx.set(dut.valid, 0)
        for _ in range(dut.result_latency + 2):
            await ctx.tick()

    async def collect(ctx):
        async for _, _, valid, result in ctx.tick().sample(dut.result_valid, dut.result):
            if valid:
                got.append([result[i] for i in range(n)])

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(drive)
    sim.add_process(collect)
    sim.run_until(1e-8 * (sum(3 * len(b) for b in blocks) + 50))
    assert len(got) == len(expected)
    for b, (g, e) in enumerate(zip(got, expected)):
        assert g == e, f"row block {b}"
