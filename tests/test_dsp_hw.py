# amaranth: UnusedElaboratable=no
"""The ECP5 form of the multipliers (``hw.dsp``): MULT18X18D instances with their own
registers in place of the fabric's operand and product registers.

Elaborated for the ECP5 (``hw.dsp.ECP5_TARGET``, what ``bench.fpga`` and the ULX3S build
use), ``Fp16Binary`` and ``Fp16Unary`` instantiate the primitive; the HDL simulators run
them on the model ``sim/models/MULT18X18D.v`` with the units' own cocotb benches, bit-exact
against the reference model as the fabric form is (``tests/test_fp16_arith_hw.py``,
``tests/test_fp16_unary_hw.py``): TestFloat vectors, random pairs and the latency for the
binary unit, every FP16 input of every unary op (Verilator; Icarus a sample), with and
without stalls; the MVM with some of each dot-product engine's products on DSP blocks
(``dsp_lanes``) runs the MVM's own bench (``tests/test_mvm_hw.py``). Structural checks:
where the instances are and are not, and the operand limits.
"""

import re

import pytest
from amaranth.back import rtlil
from amaranth.hdl import Const, Module, Signal, signed, unsigned

from host.config import MvmConfig
from host.fp16 import BinaryOp
from hw.dsp import ECP5_TARGET, has_ecp5_dsp, registered_product
from hw.fp16_arith import Fp16Binary
from hw.fp16_unary import Fp16Unary
from hw.mvm import Mvm
from sim.fp16_vectors import find_testfloat
from sim.runner import ECP5_MODELS, run_cocotb
from sim.test_mvm import config_env

STALLS = ("/stalls=False", "/stalls=True")


def _instances(component, platform):
    text = rtlil.convert(component, name="top", platform=platform, emit_src=False)
    return len(re.findall(r"^\s*cell \\MULT18X18D ", text, flags=re.M))


def test_binary_ecp5(simulator):
    lanes = 4
    dut = Fp16Binary(lanes=lanes)
    for name in ("f16_mul.rne.txt.gz", "f16_add.rne.txt.gz"):
        try:
            find_testfloat(name)
        except FileNotFoundError as e:
            pytest.fail(str(e))
    count = 30_000 if simulator == "verilator" else 3_000
    run_cocotb(
        name=f"fp16_binary_l{lanes}_ecp5",
        component=dut,
        test_module="sim.test_fp16_arith",
        simulator=simulator,
        platform=ECP5_TARGET,
        extra_sources=ECP5_MODELS,
        testcase=",".join(["test_latency", *(f"test_conformance{s}" for s in STALLS),
                           *(f"test_model{s}" for s in STALLS)]),
        extra_env={"FP16A_LANES": str(lanes), "FP16A_LATENCY": str(dut.latency),
                   "FP16A_COUNT": str(count)},
    )


def test_unary_ecp5(simulator):
    lanes = 4
    # Every input on Verilator; Icarus (about 15 times slower) a random eighth.
    inputs = 1 << 16 if simulator == "verilator" else 8192
    run_cocotb(
        name=f"fp16_unary_l{lanes}_ecp5",
        component=Fp16Unary(lanes=lanes),
        test_module="sim.test_fp16_unary",
        simulator=simulator,
        platform=ECP5_TARGET,
        extra_sources=ECP5_MODELS,
        extra_env={"UN_LANES": str(lanes), "UN_INPUTS": str(inputs)},
    )


#: An MVM build with 3 of each engine's 8 products on DSP blocks (48 MULT18X18D): lanes
#: on DSPs and lanes in the fabric side by side, in two engines.
MVM_CONFIG = MvmConfig(n=8, tiles=2, mrf_depth=32, max_col_tiles=8)
MVM_DSP_LANES = 3


def test_mvm_ecp5(simulator):
    """Every test of the MVM bench (random shapes, edge values, both roundings, static
    exponents, stalls, counters, MRF writes and read-back) on the ECP5 form."""
    c = MVM_CONFIG
    run_cocotb(
        name=f"mvm_n{c.n}_t{c.tiles}_dsp{MVM_DSP_LANES}_ecp5",
        component=Mvm(c, dsp_lanes=MVM_DSP_LANES),
        test_module="sim.test_mvm",
        simulator=simulator,
        platform=ECP5_TARGET,
        extra_sources=ECP5_MODELS,
        extra_env={
            **config_env(c),
            "MVM_PRODUCTS": "12" if simulator == "verilator" else "4",
            "MVM_MATRICES": "3",
        },
    )


def test_mvm_instances():
    """``T * N * dsp_lanes`` instances on an ECP5, none elsewhere or with 0 lanes."""
    c = MVM_CONFIG
    assert _instances(Mvm(c, dsp_lanes=MVM_DSP_LANES), ECP5_TARGET) == 2 * 8 * MVM_DSP_LANES
    assert _instances(Mvm(c, dsp_lanes=8), ECP5_TARGET) == 2 * 8 * 8
    assert _instances(Mvm(c), ECP5_TARGET) == 0
    assert _instances(Mvm(c, dsp_lanes=MVM_DSP_LANES), None) == 0


@pytest.mark.parametrize("value, error, message", [
    (-1, ValueError, "dsp_lanes must be from 0 to 8, not -1"),
    (9, ValueError, "dsp_lanes must be from 0 to 8, not 9"),
    (1.0, TypeError, "dsp_lanes must be an integer, not 1.0"),
    (True, TypeError, "dsp_lanes must be an integer, not True"),
])
def test_mvm_dsp_lanes_errors(value, error, message):
    with pytest.raises(error) as info:
        Mvm(MVM_CONFIG, dsp_lanes=value)
    assert str(info.value) == message


def test_instances_only_on_ecp5():
    """One MULT18X18D per lane in a binary unit with MUL, none without it, two per lane
    in the unary unit (sig * log2(e), c1 * dx); none when elaborated for no platform."""
    assert _instances(Fp16Binary(lanes=3), ECP5_TARGET) == 3
    assert _instances(Fp16Binary(lanes=3, ops=[BinaryOp.ADD, BinaryOp.MAX]), ECP5_TARGET) == 0
    assert _instances(Fp16Unary(lanes=3), ECP5_TARGET) == 6
    assert _instances(Fp16Unary(lanes=3, ops=["relu", "pass"]), ECP5_TARGET) == 0
    assert _instances(Fp16Binary(lanes=3), None) == 0
    assert _instances(Fp16Unary(lanes=3), None) == 0


def test_platform_detection():
    class Board:
        family = "ecp5"

    class Other:
        family = "ice40"

    assert has_ecp5_dsp(ECP5_TARGET) and has_ecp5_dsp(Board())
    assert not has_ecp5_dsp(None) and not has_ecp5_dsp(Other())


@pytest.mark.parametrize("a_shape, b_shape, bad", [
    (unsigned(19), unsigned(4), "operand a of shape unsigned(19)"),
    (unsigned(4), signed(19), "operand b of shape signed(19)"),
    (unsigned(18), signed(4), "operand a of shape unsigned(18)"),   # no room for a sign
])
def test_operand_limits(a_shape, b_shape, bad):
    m = Module()
    with pytest.raises(ValueError, match=re.escape(bad) + r".*at most 1[78] bits"):
        registered_product(m, Signal(a_shape), Signal(b_shape), enable=Const(1), name="x")


@pytest.mark.parametrize("a_shape, b_shape, width", [
    (unsigned(18), unsigned(18), 36), (signed(16), unsigned(11), 27),
    (unsigned(11), unsigned(18), 29), (signed(18), signed(18), 36),
])
def test_product_shape(a_shape, b_shape, width):
    p = registered_product(Module(), Signal(a_shape), Signal(b_shape), enable=Const(1),
                           name="x")
    assert p.shape().width == width
    assert p.shape().signed == (a_shape.signed or b_shape.signed)
