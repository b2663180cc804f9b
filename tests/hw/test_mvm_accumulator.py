"""``hw.mvm.accumulator.BfpAccumulator`` alone, in Amaranth's simulator: the row-block
sums against Python integers, for shifts over the whole range (below the clamp at
``-(dot_bits - 1)``, where a term is the dot product's sign, up to ``max_shift``).

The MVM bench (``tests/hw/test_mvm_hw.py``) checks the accumulator inside the MVM, sums and
counters, against the reference model; this test drives its ports directly, so that gaps
in ``valid``, terms of both signs at the largest shifts and row blocks of one group are
exercised without the rest of the datapath.
"""

import random

import pytest
from amaranth.sim import Simulator

from host.spec.config import MvmConfig
from hw.mvm.accumulator import BfpAccumulator


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


@pytest.mark.parametrize("n,tiles,check", [(4, 1, True), (4, 2, True), (4, 3, True),
                                          (4, 3, False)])
def test_sums(n, tiles, check):
    """The row blocks' sums; without the narrow check (``narrow_check`` False) the same
    sums at the same latency, and ``narrow`` 0 throughout (``k`` = 1 here, which would
    make events with the check)."""
    config = MvmConfig(n=n, tiles=tiles, max_col_tiles=7, narrow_check=check)
    dut = BfpAccumulator(config)
    rng = random.Random(n * 10 + tiles)
    blocks = _groups(rng, config, 40)
    expected = [[sum(_term(d[t][i], s[t][i]) for d, s, _ in block for t in range(tiles))
                 for i in range(n)] for block in blocks]
    got = []

    async def drive(ctx):
        ctx.set(dut.k, 64 if check else 1)
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

    narrows = []

    async def collect(ctx):
        async for _, _, valid, result, narrow in ctx.tick().sample(
                dut.result_valid, dut.result, dut.narrow):
            narrows.append(narrow)
            if valid:
                got.append([result[i] for i in range(n)])

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(drive)
    sim.add_process(collect)
    sim.run_until(1e-8 * (sum(3 * len(b) for b in blocks) + 50))
    assert len(got) == len(expected)
    if not check:
        assert not any(narrows)
    for b, (g, e) in enumerate(zip(got, expected)):
        assert g == e, f"row block {b}"


def _narrow_events(block, tiles, n, k):
    """Cross-tile events (``docs/numerics.md`` section 5, rule 3) of each group of a row
    block: for column tiles ``c >= 1`` with a non-zero product, the running sum ``S``
    after adding tile ``c`` must satisfy ``-2**p <= S < 2**p``, ``p = k - 1 + shift``
    (``p < 0``: ``S == 0``). Returns the events per group and the number of sums
    checked."""
    sums = [0] * n
    events, checks = [], 0
    for g, (dots, shifts, engines) in enumerate(block):
        count = 0
        for t in range(tiles):
            if not engines[t]:
                continue
            for i in range(n):
                d, s = dots[t][i], shifts[t][i]
                sums[i] += _term(d, s)
                if g * tiles + t == 0 or d == 0:
                    continue
                p = k - 1 + s
                checks += 1
                fits = -(1 << p) <= sums[i] < (1 << p) if p >= 0 else sums[i] == 0
                count += not fits
        events.append(count)
    return events, checks


def _boundary_block(rng, config, k):
    """A row block whose running sums land on and beside the fit limits ``+-2**p``.

    Row ``i``: tile 0 puts ``+-2**p`` (``p = k - 1 + s`` for the later tiles' shift
    ``s``) in the accumulator, exactly where it can (``2**(dot_bits - 2)`` at shift
    ``p - dot_bits + 2``); each later tile adds ``+-1`` or ``+-2`` units of ``2**s``, so
    the sums visit ``+-2**p`` and its neighbours on the tile's own grid. ``p`` is drawn
    over the whole accumulator (every group of the check and its edges), and below 0.
    """
    c = config
    s_lo = -(c.dot_bits + 2)
    cols = rng.randint(2, c.max_col_tiles)
    per_row = []
    for _ in range(c.n):
        p = rng.choice([rng.randint(-3, c.acc_bits), rng.randrange(0, c.acc_bits, 8),
                        rng.randrange(7, c.acc_bits, 8)])
        s = min(max(p - (k - 1), s_lo), c.max_shift)
        p = k - 1 + s
        head = 1 << (c.dot_bits - 2)
        s0 = min(max(p - (c.dot_bits - 2), s_lo), c.max_shift)
        col = [(rng.choice((head, -head)), s0)]
        col += [(rng.choice((1, -1, 2, -2, 0)), s) for _ in range(cols - 1)]
        per_row.append(col)
    block = []
    for g in range(-(-cols // c.tiles)):
        engines = [g * c.tiles + t < cols for t in range(c.tiles)]
        dots = [[per_row[i][g * c.tiles + t][0] if engines[t] else 0 for i in range(c.n)]
                for t in range(c.tiles)]
        shifts = [[per_row[i][g * c.tiles + t][1] if engines[t] else 0 for i in range(c.n)]
                  for t in range(c.tiles)]
        block.append((dots, shifts, engines))
    return block


@pytest.mark.parametrize("n,tiles", [(4, 1), (4, 2), (4, 3), (16, 2)])
def test_narrow_count(n, tiles):
    """The cross-tile count of every group against :func:`_narrow_events`: sums on and
    beside the limits at every place of the accumulator, random sums, ``k`` from 1 to 64
    (one per row block), idle cycles between groups."""
    config = MvmConfig(n=n, tiles=tiles, max_col_tiles=7)
    dut = BfpAccumulator(config)
    rng = random.Random(1000 + n * 10 + tiles)
    blocks, ks = [], []
    for b in range(60 if n == 4 else 16):
        k = rng.choice([1, 2, 64, rng.randint(1, 64)])
        ks.append(k)
        if b % 3 == 2:
            blocks.append(_groups(rng, config, 1)[0])
        else:
            blocks.append(_boundary_block(rng, config, k))
    expected, checks = [], 0
    for block, k in zip(blocks, ks):
        events, checked = _narrow_events(block, tiles, n, k)
        expected += events
        checks += checked
    assert 0 < sum(expected) < checks                     # both outcomes are exercised
    sent, got = [], []

    async def drive(ctx):
        cycle = 0
        for block, k in zip(blocks, ks):
            for g, (dots, shifts, engines) in enumerate(block):
                while rng.random() < 0.3:
                    ctx.set(dut.valid, 0)
                    await ctx.tick()
                    cycle += 1
                ctx.set(dut.valid, 1)
                ctx.set(dut.k, k)
                ctx.set(dut.first, g == 0)
                ctx.set(dut.last, g == len(block) - 1)
                ctx.set(dut.engines, sum(e << t for t, e in enumerate(engines)))
                ctx.set(dut.dot, dots)
                ctx.set(dut.shift, shifts)
                sent.append(cycle)
                await ctx.tick()
                cycle += 1
            ctx.set(dut.valid, 0)

    async def collect(ctx):
        async for _, _, narrow in ctx.tick().sample(dut.narrow):
            got.append(narrow)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(drive)
    sim.add_process(collect)
    cycles = sum(3 * len(b) for b in blocks) + dut.narrow_latency + 50
    sim.run_until(1e-8 * cycles)
    lat = dut.narrow_latency
    assert len(sent) == len(expected)
    for j, (cycle, e) in enumerate(zip(sent, expected)):
        assert got[cycle + lat] == e, f"group {j} (sent at cycle {cycle})"
    idle = set(range(len(got))) - {cycle + lat for cycle in sent}
    assert all(got[j] == 0 for j in idle if j < len(got))
