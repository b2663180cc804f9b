# amaranth: UnusedElaboratable=no
# (constructor tests build components only to inspect them or to see __init__ raise)
"""Tests of :class:`hw.mvm.convert.FixedToFp16`, the BFP-long to FP16 converter.

* Simulator tests (cocotb bench ``sim/test_fp16_convert.py``, Verilator and Icarus):
  TestFloat ``i32_to_f16`` / ``i64_to_f16`` conformance, the MVM configuration against
  :func:`host.numerics.mvm.fixed_to_fp16` on >= 100,000 values, and a few extreme geometries.
* A quick sweep of extreme geometries with Amaranth's own simulator (every input).
* Constructor validation.

The TestFloat files are looked up in ``$NPU_CONFORMANCE_DIR`` or else in
``<repo>/tests/data/conformance`` (``testfloat/`` below it); if they are missing the tests
fail.
"""

from pathlib import Path

import numpy as np
import pytest
from amaranth.sim import Simulator

from host.spec.config import MvmConfig
from host.spec.formats import Rounding
from host.numerics.mvm import fixed_to_fp16
from hw.mvm.convert import LATENCY, FixedToFp16
from sim.fp16_vectors import find_testfloat
from sim.runner import run_cocotb

BENCH = "sim.test_fp16_convert"
RNE, AWAY = Rounding.NEAREST_EVEN, Rounding.NEAREST_AWAY
_MODE = {RNE: "nearest-even", AWAY: "nearest-away"}


def conformance_file(name: str) -> Path:
    """Path of a TestFloat vector file; fails the test (never skips) when it is absent."""
    try:
        return find_testfloat(name)
    except FileNotFoundError as error:
        pytest.fail(str(error))


def run_bench(simulator, *, lanes, width, lsb, rounding, saturate, testcases,
              vectors=(), count=0):
    dut = FixedToFp16(lanes=lanes, width=width, lsb=lsb, rounding=rounding,
                      saturate=saturate)
    name = (f"fp16c_l{lanes}_w{width}_lsb{'m' if lsb < 0 else ''}{abs(lsb)}_"
            f"{'rne' if rounding is RNE else 'away'}_{'sat' if saturate else 'inf'}")
    run_cocotb(
        name=name,
        component=dut,
        test_module=BENCH,
        simulator=simulator,
        testcase=",".join(testcases),
        extra_env={
            "FP16C_LANES": str(lanes),
            "FP16C_WIDTH": str(width),
            "FP16C_LSB": str(lsb),
            "FP16C_ROUNDING": _MODE[rounding],
            "FP16C_SATURATE": str(int(saturate)),
            "FP16C_LATENCY": str(dut.latency),
            "FP16C_VECTORS": ",".join(str(v) for v in vectors),
            "FP16C_COUNT": str(count),
        },
    )


BOTH_STALLS = ("/stalls=False", "/stalls=True")


def _cases(*names):
    return [n + s for n in names for s in BOTH_STALLS]


# --- TestFloat conformance (lsb = 0: the IEEE integer conversion) -------------------------

CONFORMANCE = [
    # width, rounding, TestFloat files
    pytest.param(32, RNE, ("i32_to_f16.rne.txt.gz",), id="i32-rne"),
    pytest.param(32, AWAY, ("i32_to_f16.away.txt.gz",), id="i32-away"),
    # i32 vectors sign-extended to 64 bits too: same results.
    pytest.param(64, RNE, ("i64_to_f16.rne.txt.gz", "i32_to_f16.rne.txt.gz"), id="i64-rne"),
]


@pytest.mark.parametrize("saturate", [False, True], ids=["inf", "sat"])
@pytest.mark.parametrize("width, rounding, files", CONFORMANCE)
def test_conformance(simulator, width, rounding, files, saturate):
    vectors = [conformance_file(f) for f in files]
    run_bench(simulator, lanes=2, width=width, lsb=0, rounding=rounding, saturate=saturate,
              vectors=vectors, testcases=["test_latency", *_cases("test_conformance")])


# --- the MVM's converter against the model -----------------------------------------------

def test_mvm_config(simulator):
    cfg = MvmConfig()
    run_bench(simulator, lanes=cfg.n, width=cfg.acc_bits, lsb=cfg.acc_lsb, rounding=RNE,
              saturate=True, count=100_000,
              testcases=["test_latency", *_cases("test_model")])


# --- extreme geometries against the model ------------------------------------------------

GEOMETRIES = [
    # lanes, width, lsb, rounding, saturate, random count (0: every input)
    pytest.param(3, 12, -30, AWAY, False, 0, id="subnormal-sticky"),
    pytest.param(2, 10, 8, RNE, True, 0, id="overflow-heavy"),
    pytest.param(1, 256, -140, RNE, True, 20_000, id="w256"),
]


@pytest.mark.parametrize("lanes, width, lsb, rounding, saturate, count", GEOMETRIES)
def test_geometry(simulator, lanes, width, lsb, rounding, saturate, count):
    run_bench(simulator, lanes=lanes, width=width, lsb=lsb, rounding=rounding,
              saturate=saturate, count=count,
              testcases=["test_latency", *_cases("test_model")])


# --- Amaranth simulator: every input of small extreme geometries -------------------------

def _pysim_all_inputs(width, lsb, rounding, saturate, lanes=4):
    dut = FixedToFp16(lanes=lanes, width=width, lsb=lsb, rounding=rounding,
                      saturate=saturate)
    values = list(range(-(1 << (width - 1)), 1 << (width - 1)))
    values += [0] * (-len(values) % lanes)
    vectors = [values[i:i + lanes] for i in range(0, len(values), lanes)]
    mask = (1 << width) - 1
    got = []

    async def bench(ctx):
        ctx.set(dut.o_stream.ready, 1)
        ctx.set(dut.i_stream.valid, 1)
        sent = 0
        while len(got) < len(vectors):
            if sent < len(vectors):
                ctx.set(dut.i_stream.payload.as_value(),
                        sum((v & mask) << (j * width) for j, v in enumerate(vectors[sent])))
            else:
                ctx.set(dut.i_stream.valid, 0)
            _, _, ready, valid, payload = await ctx.tick().sample(
                dut.i_stream.ready, dut.o_stream.valid, dut.o_stream.payload)
            sent += int(ready and sent < len(vectors))
            if valid:
                got.append(payload)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    exp_bits, exp_over = fixed_to_fp16(np.array(values, dtype=object), lsb, rounding,
                                       saturate)
    for k, payload in enumerate(got):
        for j in range(lanes):
            i = k * lanes + j
            assert (int(payload.bits[j]), int(payload.overflow[j])) == \
                (exp_bits[i], int(exp_over[i])), (
                    f"input {values[i]} (lsb {lsb}): got {int(payload.bits[j]):#06x}/"
                    f"{int(payload.overflow[j])}, expected {exp_bits[i]:#06x}/{exp_over[i]}")


@pytest.mark.parametrize("width, lsb", [
    (2, -300), (2, 300), (3, 17), (6, 15), (6, 16), (4, -27), (4, -26), (4, -25),
    (9, -14), (8, -33), (10, 0),
])
@pytest.mark.parametrize("rounding, saturate", [(RNE, True), (AWAY, False)])
def test_geometry_pysim(width, lsb, rounding, saturate):
    _pysim_all_inputs(width, lsb, rounding, saturate)


# --- constructor -------------------------------------------------------------------------


def test_properties():
    dut = FixedToFp16(lanes=16, width=95, lsb=-52, rounding="nearest-away", saturate=False)
    assert (dut.lanes, dut.width, dut.lsb, dut.rounding, dut.saturate, dut.latency) == \
        (16, 95, -52, AWAY, False, LATENCY)
    assert FixedToFp16(lanes=1, width=2, lsb=0).rounding is RNE
    assert FixedToFp16(lanes=1, width=2, lsb=0).saturate is True


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(lanes=0), ValueError, "lanes must be from 1 to 64, not 0"),
    (dict(lanes=65), ValueError, "lanes must be from 1 to 64, not 65"),
    (dict(lanes=2.0), TypeError, "lanes must be an integer, not 2.0"),
    (dict(lanes=True), TypeError, "lanes must be an integer, not True"),
    (dict(width=1), ValueError, "width must be from 2 to 256, not 1"),
    (dict(width=257), ValueError, "width must be from 2 to 256, not 257"),
    (dict(width="95"), TypeError, "width must be an integer, not '95'"),
    (dict(lsb=-301), ValueError, "lsb must be from -300 to 300, not -301"),
    (dict(lsb=301), ValueError, "lsb must be from -300 to 300, not 301"),
    (dict(lsb=None), TypeError, "lsb must be an integer, not None"),
    (dict(rounding="even"), ValueError,
     "rounding must be 'nearest-even' or 'nearest-away', not 'even'"),
    (dict(saturate=1), TypeError, "saturate must be a bool, not 1"),
])
def test_constructor_errors(kwargs, error, message):
    args = dict(lanes=4, width=32, lsb=0) | kwargs
    with pytest.raises(error) as info:
        FixedToFp16(**args)
    assert str(info.value) == message


def test_keyword_only():
    with pytest.raises(TypeError):
        FixedToFp16(4, 32, 0)
