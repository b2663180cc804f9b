"""The cycle prediction at ``lanes`` l < n (issue 36 item 1, step 2 of
``docs/notes/2026-11-28-lanes-plan.md``, section 3): the MFU pipeline, the writer and the
reader's direct path count beats (``B = n / l`` a native vector), and at ``l == n`` the
prediction is the one of the native-vector model, cycle for cycle.

The beat-level expectations are derived by hand from the plan's rules, as differences
between the same program at l < n and at l = n, so that the constants shared by both
(decode, issue, read, fill) drop out:

* the writer takes one cycle per beat and destination, so a chain of L vectors and d
  destinations writes for ``L*B*d`` cycles instead of ``L*d``;
* a reduction waits for its last input beat (``L*B - 1`` after the first instead of
  ``L - 1``) and then gives ``L*B`` beats;
* a product's row block leaves the MVM every ``G = ceil(C/T)`` cycles and takes B cycles
  into the MFU, so its beats keep up when ``B <= G`` (the last beat of the last block is
  ``B - 1`` later than at l = n) and otherwise stream back to back, ``R*B`` beats from
  the first block on (against ``(R - 1)*G + 1`` cycles at l = n).
"""

import dataclasses

import pytest

from host.compiler.asm import assemble
from host.model.core import NpuModel, Timing
from host.spec.config import NpuConfig
from sim.randprog import random_program

SMALL = {"n": 8, "tiles": 1, "mrf_depth": 64, "max_col_tiles": 8, "ivrf_depth": 64,
         "vrf_depth": 32, "netq_depth": 64, "max_length": 4}

#: ``cycles_predicted`` of ``random_program(cfg, 3600 + seed, chains=30)``, seeds 0..5, on
#: three builds at ``lanes == n``, computed with the model of commit 5e314df (before the
#: beat-level timing, the direct path's latency, the register slice after the direct
#: buffer and the registered ``busy``, hence ``TIMING_5E314DF``): the native-vector
#: prediction that ``lanes == n`` must keep.
STORED = {
    "n8": ({}, [1615, 1978, 1954, 2214, 2020, 2985]),
    "n4t2": ({"n": 4, "tiles": 2}, [1256, 2103, 2239, 1816, 1468, 1926]),
    "n16t3": ({"n": 16, "tiles": 3, "max_length": 8}, [2224, 3496, 2239, 2218, 2415, 1996]),
}

TIMING_5E314DF = Timing(direct_latency=0, direct_write_register=0, direct_slice=0,
                         busy_register=0)


def _cycles(cfg, text):
    model = NpuModel(cfg)
    model.load_program(assemble(text))
    result = model.run()
    assert result.ok, result
    return result.cycles_predicted


@pytest.mark.parametrize("name", sorted(STORED))
def test_lanes_n_predicts_the_stored_native_cycles(name):
    extra, expected = STORED[name]
    cfg = NpuConfig(**{**SMALL, **extra})
    explicit = NpuConfig(**{**SMALL, **extra}, lanes=cfg.n)
    got = []
    for seed in range(len(expected)):
        prog = random_program(cfg, 3600 + seed, chains=30)
        result, _ = prog.run(NpuModel(cfg, TIMING_5E314DF))
        again, _ = prog.run(NpuModel(explicit, TIMING_5E314DF))
        assert result.ok and again.cycles_predicted == result.cycles_predicted
        got.append(result.cycles_predicted)
    assert got == expected


def test_random_programs_never_predict_fewer_cycles_with_fewer_lanes():
    cfg = NpuConfig(**SMALL)
    for seed in range(4):
        prog = random_program(cfg, 3700 + seed, chains=30)
        cycles = [prog.run(NpuModel(dataclasses.replace(cfg, lanes=lanes)))[0]
                  .cycles_predicted for lanes in (8, 4, 2)]
        assert cycles[0] <= cycles[1] <= cycles[2], (seed, cycles)
        assert cycles[0] < cycles[2], (seed, cycles)


def _chain(length, body, dests):
    writes = "".join(f"v_wr ivrf, {32 + 8 * k}\n" for k in range(dests))
    return f"s_wr rows, {8 * length}\nv_rd ivrf, 0\n{body}{writes}end_chain\nend\n"


@pytest.mark.parametrize("lanes", [4, 2])
@pytest.mark.parametrize("length", [1, 2, 4])
@pytest.mark.parametrize("dests", [1, 2, 3])
@pytest.mark.parametrize("body", ["", "v_relu\n", "vv_add 0\n", "v_sigm\nvv_mul 0\n"])
def test_direct_chain_writes_beats(lanes, length, dests, body):
    """A chain without a product: L vectors of B beats, d destinations, one cycle per beat
    and destination: ``L*(B - 1)*d`` more cycles than at l = n."""
    cfg = NpuConfig(**{**SMALL, "unary_ops": ("relu", "sigmoid")})
    beats = cfg.n // lanes
    text = _chain(length, body, dests)
    extra = _cycles(dataclasses.replace(cfg, lanes=lanes), text) - _cycles(cfg, text)
    assert extra == length * (beats - 1) * dests


@pytest.mark.parametrize("lanes", [4, 2])
@pytest.mark.parametrize("length", [1, 2, 4])
@pytest.mark.parametrize("op", ["v_sum_reduce", "v_max_reduce"])
def test_reduction_waits_for_the_last_beat(lanes, length, op):
    """A reduction's output waits for the last input beat, ``L*(B - 1)`` later than the
    last vector at l = n, then the writer writes ``L*B`` beats: ``2*L*(B - 1)`` more."""
    cfg = NpuConfig(**SMALL)
    beats = cfg.n // lanes
    text = _chain(length, f"{op}\n", 1)
    extra = _cycles(dataclasses.replace(cfg, lanes=lanes), text) - _cycles(cfg, text)
    assert extra == 2 * length * (beats - 1)


def _product(rows, cols):
    return (f"s_wr rows, {8 * rows}\ns_wr cols, {cols}\nv_rd ivrf, 0\nmv_mul 0\n"
            f"v_wr ivrf, 32\nend_chain\nend\n")


@pytest.mark.parametrize("tiles", [1, 2])
@pytest.mark.parametrize("lanes", [4, 2])
@pytest.mark.parametrize("rows", [1, 3, 4])
@pytest.mark.parametrize("cols", [8, 16, 32])
def test_product_beats(tiles, lanes, rows, cols):
    """One product, R row blocks every G = ceil(C/T) cycles (C in native vectors), one
    destination. With ``B <= G`` every block's beats are in before the next block comes,
    so only the last block's ``B - 1`` extra beats show; with ``B > G`` the beats queue
    and the last one is ``R*B - 1`` after the first block instead of ``(R - 1)*G``."""
    cfg = NpuConfig(**{**SMALL, "tiles": tiles})
    beats = cfg.n // lanes
    groups = -(-(cols // cfg.n) // tiles)
    text = _product(rows, cols)
    extra = _cycles(dataclasses.replace(cfg, lanes=lanes), text) - _cycles(cfg, text)
    if beats <= groups:
        assert extra == beats - 1
    else:
        assert extra == rows * beats - 1 - (rows - 1) * groups


@pytest.mark.parametrize("lanes", [4, 2])
def test_output_fifo_credits_hold_the_sequencer(lanes):
    """A product of R = 64 row blocks with G = 1 at B > 1: its beats leave the MVM's
    output FIFO (``hw.mvm.mvm.output_fifo_depth`` D row blocks) one per cycle from the
    first block's ``y_0 = seq + G + back - 1`` on, block j's last beat at
    ``y_0 + B*(j + 1) - 1``. Room is reserved before a block's last group is read and
    freed one edge after its last beat is taken, so block R - 1 is read one edge after
    block R - 1 - D has left: the sequencer is free at ``y_0 + B*(R - D) + 1`` instead
    of ``seq + R*G``."""
    from host.model.core import Timing, _Clock, mvm_latency
    from hw.mvm.mvm import output_fifo_depth

    cfg = NpuConfig(**{**SMALL, "max_length": 64})
    rows, groups, depth = 64, 1, output_fifo_depth(cfg.mvm)
    _, back = mvm_latency(cfg)
    native = _Clock(cfg, Timing())
    native.instance(1, rows, groups, [], [], [], 1)
    seq = native.seq_free - rows * groups
    clock = _Clock(dataclasses.replace(cfg, lanes=lanes), Timing())
    clock.instance(1, rows, groups, [], [], [], 1)
    beats = cfg.n // lanes
    held = seq + groups + back - 1 + beats * (rows - depth) + 1
    assert rows > depth and held > seq + rows * groups      # the credits bind
    assert clock.seq_free == held


@pytest.mark.parametrize("lanes", [8, 4, 2])
@pytest.mark.parametrize("register", ["direct_slice", "direct_write_register"])
def test_direct_registers_delay_a_read_limited_chain_by_one_cycle(lanes, register):
    """The register on the reader's write into its direct buffer and the register slice
    after the buffer: a chain without a product whose MFU pipeline is waiting (taken at
    issue, ``mfu_setup`` 0) gets its first beat from the reader ``read_latency +
    direct_latency + direct_write_register + direct_slice`` after issue, and with no ops
    the first output is that beat: one cycle later with each register than without it,
    and the chain's other beats follow one per cycle, so it retires one cycle later."""
    from host.model.core import _Clock

    cfg = NpuConfig(**{**SMALL, "lanes": lanes})
    beats = cfg.n // lanes
    retired = []
    for s in (0, 1):
        off = {"direct_slice": 0, "direct_write_register": 0}
        clock = _Clock(cfg, Timing(mfu_setup=0, **{**off, register: s}))
        clock.instance(2, 2, None, [], [], [], 1)
        retired.append(clock.retired[-1])
    t = Timing()                         # issued at fetch_latency: no chain decoded
    assert retired[0] == (t.fetch_latency + t.read_latency + t.direct_latency + 2 * beats - 1
                          + t.retire_latency)
    assert retired[1] == retired[0] + 1


def test_direct_write_register_holds_no_more_beats():
    """The reader's room counts the beat in the write register, so with the MFU pipeline
    busy until cycle 1000 and the buffer and slice full (as in the test below), the
    reader is free at the same cycle with the register as without it."""
    from host.model.core import _Clock

    cfg = NpuConfig(**{**SMALL, "max_length": 2})
    free = []
    for r in (0, 1):
        clock = _Clock(cfg, Timing(direct_slice=0, direct_write_register=r))
        clock.mfu_free = 1000
        for _ in range(3):
            clock.instance(2, 2, None, [], [], [], 1)
        free.append(clock.rd_free)
    assert free[0] == free[1] > 1000


def test_direct_slice_holds_two_more_beats():
    """The slice's two registers hold beats beyond the direct buffer's ``direct_depth``.
    With ``max_length`` 2 (a buffer of 4) and the MFU pipeline busy until cycle 1000,
    two direct chains of 2 vectors queue 4 beats (the first taken at 1000, its beats at
    1001 and 1002). Without the slice they fill the buffer, so the reader is free only
    a cycle after the first beat has gone on (1002); with it there is room, and the
    reader is free a cycle after its last read, as if nothing waited: the second chain
    is read from cycle 8 (the first chain's two reads from 5), so at 8 + 2 + 1."""
    from host.model.core import _Clock

    cfg = NpuConfig(**{**SMALL, "max_length": 2})
    assert cfg.direct_depth == 4
    free = []
    for s in (0, 1):
        clock = _Clock(cfg, Timing(direct_slice=s))
        clock.mfu_free = 1000
        for _ in range(2):
            clock.instance(2, 2, None, [], [], [], 1)
        assert clock.direct[:2] == [1001, 1002]
        free.append(clock.rd_free)
    assert free == [1002, 11]


def test_busy_register_delays_a_run_end_after_a_retirement_only():
    """The core registers the MVM's and the MFU's ``busy`` before the run's end
    (``Timing.busy_register``): a run whose last instance retires ends one cycle later
    with it than without it; an empty run ends at its decode, ``fetch_latency`` and one
    instruction plus ``end_latency``, with it or not."""
    from host.model.core import _Clock

    cfg = NpuConfig(**SMALL)
    t = Timing()
    ends, empty = [], []
    for b in (0, 1):
        clock = _Clock(cfg, Timing(busy_register=b))
        clock.instance(2, 2, None, [], [], [], 1)
        ends.append((clock.retired[-1], clock.total()))
        idle = _Clock(cfg, Timing(busy_register=b))
        idle.instructions(1)
        empty.append(idle.total())
    assert ends[0][0] == ends[1][0] and ends[0][1] == ends[0][0] + t.end_latency
    assert ends[1][1] == ends[0][1] + 1
    assert empty == [t.fetch_latency + t.decode_per_instruction + t.end_latency] * 2
