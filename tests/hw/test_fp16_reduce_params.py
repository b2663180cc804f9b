# amaranth: UnusedElaboratable=no
"""Build parameters of :class:`hw.arith.fp16_reduce.Fp16Reduce`: validation, derived figures,
layouts, elaboration at the extremes, and the corner builds in Amaranth's simulator.

The HDL-simulator bench (``tests/hw/test_fp16_reduce_hw.py``) covers the 4- and 16-lane
builds; here Amaranth's own simulator runs the builds with no lane tree (1 lane), no
vector tree (``max_length`` 1) and both (the extra level of ``lanes = max_length = 1``)
against :func:`host.numerics.reduction.reduce_vectors_bits`, with random input gaps and output
back-pressure, and shows that a logical vector longer than ``max_length`` neither stops
the unit nor disturbs the logical vectors after it.
"""

import random

import numpy as np
import pytest
from amaranth.hdl import Fragment
from amaranth.sim import Simulator

from host.spec.ops import ReduceOp
from host.numerics.reduction import reduce_vectors_bits
from hw.arith.fp16_reduce import Fp16Reduce, input_layout, lane_mask, output_layout


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(lanes=0, max_length=8), ValueError, "lanes must be from 1 to 64, not 0"),
    (dict(lanes=128, max_length=8), ValueError, "lanes must be from 1 to 64, not 128"),
    (dict(lanes=12, max_length=8), ValueError,
     "lanes must be a power of two from 1 to 64, not 12"),
    (dict(lanes=4.0, max_length=8), TypeError, "lanes must be an integer, not 4.0"),
    (dict(lanes=True, max_length=8), TypeError, "lanes must be an integer, not True"),
    (dict(lanes=4, max_length=0), ValueError, "max_length must be from 1 to 8192, not 0"),
    (dict(lanes=4, max_length=16384), ValueError,
     "max_length must be from 1 to 8192, not 16384"),
    (dict(lanes=4, max_length=6), ValueError,
     "max_length must be a power of two from 1 to 8192, not 6"),
    (dict(lanes=4, max_length="8"), TypeError, "max_length must be an integer, not '8'"),
    (dict(lanes=4, max_length=None), TypeError, "max_length must be an integer, not None"),
])
def test_constructor_errors(kwargs, error, message):
    with pytest.raises(error) as info:
        Fp16Reduce(**kwargs)
    assert str(info.value) == message


def test_keyword_only():
    with pytest.raises(TypeError):
        Fp16Reduce(4, 8)


@pytest.mark.parametrize("lanes, max_length, levels, event_bits, latency", [
    # levels: (lane tree, vector tree); latency 6 per level and 1 per buffer between
    # levels, plus the input register, the result FIFO and the broadcast register.
    (16, 8, (4, 3), 5, 51),        # at most 15 + 3 = 18 events a cycle
    (4, 8, (2, 3), 3, 37),         # 3 + 3 = 6
    (1, 1, (0, 1), 1, 9),          # the one extra level: every element meets a node
    (1, 4, (0, 2), 2, 16),
    (2, 1, (1, 0), 1, 9),
    (64, 256, (6, 8), 7, 100),      # 63 + 8 = 71
    # An MFU of l lanes builds max_length * N / l items: the latency of N lanes.
    (2, 256 * 32, (1, 13), 4, 100),  # N = 64, M = 256 at l = 2: 1 + 13 = 14
    (4, 8 * 4, (2, 5), 4, 51),      # N = 16, M = 8 at l = 4: 3 + 5 = 8
])
def test_derived_figures(lanes, max_length, levels, event_bits, latency):
    dut = Fp16Reduce(lanes=lanes, max_length=max_length)
    assert (dut.lanes, dut.max_length) == (lanes, max_length)
    assert (dut.lane_levels, dut.vector_levels) == levels
    assert (dut.event_bits, dut.latency) == (event_bits, latency)
    assert len(dut.overflow_events) == len(dut.nan_events) == event_bits


def test_layouts():
    lay = input_layout(16)
    assert [(name, lay[name].offset) for name in ("values", "op", "last", "keep")] \
        == [("values", 0), ("op", 256), ("last", 257), ("keep", 258)]
    assert lay["op"].shape is ReduceOp
    assert (lay["keep"].shape.width, lay.size) == (16, 274)
    assert input_layout(1)["keep"].shape.width == 1
    assert input_layout(64)["keep"].shape.width == 64
    out = output_layout(4)
    assert (out["last"].offset, out.size) == (64, 65)
    dut = Fp16Reduce(lanes=4, max_length=2)
    assert dut.i_stream.payload.shape() == input_layout(4)
    assert dut.o_stream.payload.shape() == output_layout(4)


@pytest.mark.parametrize("lanes, max_length", [(64, 256), (1, 1), (2, 1), (1, 256),
                                               (2, 8192)])
def test_elaborates(lanes, max_length):
    Fragment.get(Fp16Reduce(lanes=lanes, max_length=max_length), None)


# --- Amaranth simulator: the corner builds ------------------------------------------------------

def _simulate(dut, items, expected_count, seed, stalls=True):
    """Drive ``items`` (payload dicts) with random gaps and back-pressure; return the
    output ``(values, last)`` tuples and the event totals. Checks the stream rules and,
    unless ``expected_count`` is None, the number of outputs."""
    rand = random.Random(seed)
    got, events = [], [0, 0]

    async def source(ctx):
        for item in items:
            while stalls and rand.random() < 0.3:
                ctx.set(dut.i_stream.valid, 0)
                await ctx.tick()
            ctx.set(dut.i_stream.valid, 1)
            ctx.set(dut.i_stream.payload, item)
            await ctx.tick().until(dut.i_stream.ready)
        ctx.set(dut.i_stream.valid, 0)

    async def sink(ctx):
        held = None
        idle = 0
        while idle < 4 * dut.latency + 20:
            ready = int(not stalls or rand.random() >= 0.3)
            ctx.set(dut.o_stream.ready, ready)
            _, _, valid, payload, over, nan = await ctx.tick().sample(
                dut.o_stream.valid, dut.o_stream.payload, dut.overflow_events, dut.nan_events)
            events[0] += over
            events[1] += nan
            idle += 1
            if not valid:
                assert held is None, "o_stream.valid fell before the transfer"
                continue
            word = ([int(payload.values[i]) for i in range(dut.lanes)], int(payload.last))
            assert held is None or word == held, "o_stream.payload changed while stalled"
            if ready:
                got.append(word)
                held, idle = None, 0
            else:
                held = word
        assert expected_count is None or len(got) == expected_count, (
            f"{len(got)} outputs, expected {expected_count}")

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(source)
    sim.add_testbench(sink)
    sim.run()
    return got, events


def _items(op, vectors, lanes_last):
    lanes = vectors.shape[1]
    return [{"values": [int(x) for x in row], "op": op, "last": int(k == len(vectors) - 1),
             "keep": lane_mask(lanes, lanes_last if k == len(vectors) - 1 else lanes)}
            for k, row in enumerate(vectors)]


def _random_vectors(rng, count, lanes):
    """Finite values of mixed sign around one scale, some specials, large values."""
    x = (rng.integers(0, 2, (count, lanes)) << 15) | (rng.integers(20, 31, (count, lanes))
                                                      << 10) | rng.integers(0, 1024,
                                                                            (count, lanes))
    special = rng.random((count, lanes)) < 0.04
    x[special] = rng.choice([0x7C00, 0xFC00, 0x7E01, 0x8000, 0x0001], special.sum())
    return x.astype(np.uint16)


@pytest.mark.parametrize("lanes, max_length", [(1, 1), (1, 4), (2, 1), (8, 2)])
def test_corner_builds_against_the_model(lanes, max_length):
    dut = Fp16Reduce(lanes=lanes, max_length=max_length)
    rng = np.random.default_rng(lanes * 10 + max_length)
    items, expected, events = [], [], np.zeros(2, int)
    for k in range(40):
        count = 1 if k < 4 else int(rng.integers(1, max_length + 1))
        vectors = _random_vectors(rng, count, lanes)
        lanes_last = int(rng.integers(1, lanes + 1))
        op = ReduceOp(k % 2)
        if k < 4:                                   # a lone (non-canonical) NaN
            vectors[0, 0], lanes_last = 0x7E01 + k, 1
        elif k < 12 and vectors.size >= 2:          # inf - inf; 65504 + 65504
            vectors.reshape(-1)[:2] = (0x7C00, 0xFC00) if k < 8 else (0x7BFF, 0x7BFF)
            lanes_last = max(lanes_last, 2) if count == 1 else lanes_last
        out, over, nan = reduce_vectors_bits(op, vectors, lanes_last)
        items += _items(op, vectors, lanes_last)
        expected += [(row.tolist(), int(r == count - 1)) for r, row in enumerate(out)]
        events += (over, nan)
    got, got_events = _simulate(dut, items, len(expected), seed=lanes + max_length)
    bad = [(k, g, e) for k, (g, e) in enumerate(zip(got, expected)) if g != e]
    assert not bad, bad[:4]
    assert got_events == events.tolist()
    if lanes * max_length > 1:                     # else every node has an identity
        assert events.min() > 0, "no event of some kind: the event check proves little"


@pytest.mark.parametrize("n, lanes, max_length", [(8, 4, 4), (8, 2, 2), (16, 4, 2),
                                                  (4, 1, 2)])
def test_beats_give_the_n_lane_results(n, lanes, max_length):
    """An MFU of ``lanes`` lanes (l < N): ``Fp16Reduce(lanes=l, max_length=M * N / l)``
    fed each native vector of N lanes as N / l beats in lane order, the last one's
    trailing beats too, with its slice of the N-lane ``keep``; its outputs, joined back
    into native vectors, and its events are :func:`reduce_vectors_bits` of the N-lane
    vectors (docs/reductions.md section 2), with random gaps and back-pressure."""
    beats = n // lanes
    dut = Fp16Reduce(lanes=lanes, max_length=max_length * beats)
    rng = np.random.default_rng(n * 100 + lanes * 10 + max_length)
    items, expected, events = [], [], np.zeros(2, int)
    ties = 0
    for k in range(40):
        count = 1 if k < 2 else int(rng.integers(1, max_length + 1))
        vectors = _random_vectors(rng, count, n)
        lanes_last = int(rng.integers(1, n + 1))
        op = ReduceOp(k % 2)
        if k < 2:                                   # a lone (non-canonical) NaN
            vectors[0, 0], lanes_last = 0x7E01 + k, 1
        elif k < 8:                                 # inf - inf; 65504 + 65504
            vectors.reshape(-1)[:2] = (0x7C00, 0xFC00) if k < 5 else (0x7BFF, 0x7BFF)
            lanes_last = max(lanes_last, 2) if count == 1 else lanes_last
        elif k < 12:
            # 2048 + 1 + 1 + 1 in the tree's order is 2050, in another 2048: the beat
            # order must pair as the N-lane tree does.
            op, ties = ReduceOp.SUM, ties + 1
            vectors[:] = 0x8000
            vectors[0, :4] = (0x6800, 0x3C00, 0x3C00, 0x3C00)
        out, over, nan = reduce_vectors_bits(op, vectors, lanes_last)
        keep = lane_mask(n, lanes_last)
        for j, row in enumerate(vectors):
            for b in range(beats):
                final = j == count - 1
                items.append({
                    "values": [int(x) for x in row[b * lanes:(b + 1) * lanes]], "op": op,
                    "last": int(final and b == beats - 1),
                    "keep": (keep >> b * lanes) & ((1 << lanes) - 1) if final
                    else (1 << lanes) - 1})
        expected += [(row[b * lanes:(b + 1) * lanes].tolist(),
                      int(r == count - 1 and b == beats - 1))
                     for r, row in enumerate(out) for b in range(beats)]
        events += (over, nan)
    got, got_events = _simulate(dut, items, len(expected), seed=n + lanes + max_length)
    bad = [(k, g, e) for k, (g, e) in enumerate(zip(got, expected)) if g != e]
    assert not bad, bad[:4]
    assert got_events == events.tolist()
    assert events.min() > 0 and ties == 4


def test_too_long_a_logical_vector_does_not_stop_the_unit():
    """Out of contract: 5 native vectors into a max_length-2 build. Some output comes out
    (how much is unspecified, but it ends with ``last``), and the logical vectors after
    it are reduced correctly: the unit keeps no state across a ``last``."""
    dut = Fp16Reduce(lanes=2, max_length=2)
    rng = np.random.default_rng(7)
    items = _items(ReduceOp.SUM, _random_vectors(rng, 5, 2), 2)
    expected = []
    for k in range(6):
        vectors = _random_vectors(rng, int(rng.integers(1, 3)), 2)
        lanes_last = int(rng.integers(1, 3))
        out = reduce_vectors_bits(ReduceOp(k % 2), vectors, lanes_last).out
        items += _items(ReduceOp(k % 2), vectors, lanes_last)
        expected += [(row.tolist(), int(r == len(out) - 1)) for r, row in enumerate(out)]
    got, _ = _simulate(dut, items, None, seed=1)
    extra = len(got) - len(expected)
    assert extra >= 1 and got[extra - 1][1] == 1, got[:extra + 1]
    assert got[extra:] == expected


def test_lane_mask():
    assert [lane_mask(4, v) for v in (1, 2, 3, 4)] == [0b1, 0b11, 0b111, 0b1111]
    for bad in (0, 5):
        with pytest.raises(ValueError, match=f"valid.*{bad}"):
            lane_mask(4, bad)
