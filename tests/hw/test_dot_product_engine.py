"""``hw.mvm.tile_engine.DotProductEngine`` alone, in Amaranth's simulator: the dot product,
the shift and the narrow-accumulator count of every block pair against Python integers,
at the latencies the engine states.

The MVM bench (``tests/hw/test_mvm_hw.py``) checks the engines inside the MVM against the
reference model; this test drives one engine with a new block pair every cycle, so that
each fit test is seen in the flag stage ``DotProductEngine.flag_plan`` gives it and each
count arrives exactly ``narrow_latency`` cycles after its blocks, for several N.
"""

import random

import pytest
from amaranth.sim import Simulator

from host.spec.config import MvmConfig
from hw.mvm.tile_engine import DotProductEngine, shift_offset


def _fits(value, k):
    return -(1 << (k - 1)) <= value < (1 << (k - 1))


def _reference(qv, qw, k):
    """``(dot, events)``: the exact dot product, and how many of the N products and the
    N - 1 nodes of the balanced pairwise tree in lane order do not fit k bits."""
    level = [a * b for a, b in zip(qv, qw)]
    events = sum(not _fits(v, k) for v in level)
    while len(level) > 1:
        level = [level[j] + level[j + 1] for j in range(0, len(level), 2)]
        events += sum(not _fits(v, k) for v in level)
    return level[0], events


def _pack(code, mantissas, m):
    word = code
    for j, q in enumerate(mantissas):
        word |= (q & ((1 << m) - 1)) << (8 + j * m)
    return word


def _therm(k, width):
    return sum(1 << b for b in range(width) if b >= k - 1)


@pytest.mark.parametrize("n,mv,mw,check", [(4, 6, 3, True), (8, 4, 4, True),
                                          (16, 4, 4, True), (32, 3, 5, True),
                                          (8, 4, 4, False)])
def test_dot_shift_narrow(n, mv, mw, check):
    """With ``narrow_check`` False (a build without the check) the dot products and
    shifts are the same at the same latency, and the count is 0 at every cycle."""
    config = MvmConfig(n=n, tiles=1, mantissa_bits_v=mv, mantissa_bits_w=mw,
                       narrow_check=check)
    dut = DotProductEngine(config)
    rng = random.Random(n * 100 + mv * 10 + mw)
    qmax_v, qmax_w = (1 << (mv - 1)) - 1, (1 << (mw - 1)) - 1
    pairs = []
    for i in range(300):
        # Full-scale blocks now and then, so that the top nodes overflow small k.
        full = i % 5 == 0
        qv = [rng.choice((qmax_v, -qmax_v)) if full else rng.randint(-qmax_v, qmax_v)
              for _ in range(n)]
        # A packed MRF word may hold the most negative code; the engine takes it.
        qw = [rng.choice((qmax_w, -qmax_w - 1)) if full else rng.randint(-qmax_w - 1, qmax_w)
              for _ in range(n)]
        k = rng.choice((1, 2, 3, rng.randint(1, 64)))
        pairs.append((qv, qw, rng.randint(0, 255), rng.randint(0, 254), k))
    latency, nlatency = dut.dot_latency, dut.narrow_latency
    outs = []

    async def bench(ctx):
        for step in range(len(pairs) + nlatency):
            qv, qw, cv, cw, k = pairs[step % len(pairs)]
            ctx.set(dut.vector.as_value(), _pack(cv, qv, mv))
            ctx.set(dut.weights.as_value(), _pack(cw, qw, mw))
            ctx.set(dut.therm, _therm(k, config.dot_bits - 1))
            await ctx.tick()
            outs.append((ctx.get(dut.dot), ctx.get(dut.shift), ctx.get(dut.narrow)))

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert sum(_reference(qv, qw, k)[1] for qv, qw, _, _, k in pairs) > 0
    for i, (qv, qw, cv, cw, k) in enumerate(pairs):
        dot, events = _reference(qv, qw, k)
        assert outs[i + latency - 1][0] == dot, f"pair {i}: dot"
        assert outs[i + latency - 1][1] == cv + cw - shift_offset(config), f"pair {i}: shift"
        assert outs[i + nlatency - 1][2] == (events if check else 0), \
            f"pair {i}: narrow count, k = {k}"
    if not check:
        assert not any(narrow for _, _, narrow in outs)


def test_flag_plan_tests_every_value_once():
    """The flag stages test the N products and N - 1 tree nodes, no more, no less."""
    for n in (4, 8, 16, 32, 64):
        plan = DotProductEngine.flag_plan(MvmConfig(n=n, tiles=1))
        assert sum(plan) == 2 * n - 1, n
        assert plan[0] == n                       # the products, from their registers
