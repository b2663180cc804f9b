# amaranth: UnusedElaboratable=no
"""The ECP5 form of the multipliers (``hw.arith.dsp``): MULT18X18D instances with their own
registers in place of the fabric's operand and product registers.

Elaborated for the ECP5 (``hw.arith.dsp.ECP5_TARGET``, what ``bench.fpga`` and the ULX3S build
use), ``Fp16Binary`` and ``Fp16Unary`` instantiate the primitive; the HDL simulators run
them on the model ``sim/models/MULT18X18D.v`` with the units' own cocotb benches, bit-exact
against the reference model as the fabric form is (``tests/hw/test_fp16_arith_hw.py``,
``tests/hw/test_fp16_unary_hw.py``): TestFloat vectors, random pairs and the latency for the
binary unit (Icarus a sample of TestFloat and fewer random pairs), every FP16 input of
every unary op (Verilator; Icarus a sample), with and without stalls; the MVM with some
of each dot-product engine's products on DSP blocks (``dsp_lanes``) runs the MVM's own
bench (``tests/hw/test_mvm_hw.py``). Structural checks: where the instances are and are
not, and the operand limits.
"""

import re

import pytest
from amaranth.back import rtlil
from amaranth.hdl import Const, Module, Signal, signed, unsigned
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from host.spec.config import MvmConfig
from host.spec.ops import BinaryOp
from hw.arith.dsp import (
    ECP5_TARGET, has_ecp5_dsp, pair_fits, registered_product, registered_product_pair,
)
from hw.arith.fp16_arith import Fp16Binary
from hw.arith.fp16_unary import Fp16Unary
from hw.mvm.mvm import Mvm
from hw.mvm.tile_engine import DotProductEngine
from sim.fp16_vectors import conformance_cases, find_testfloat
from sim.runner import ECP5_MODELS, run_cocotb
from sim.test_mvm import config_env
from tests.hw.test_mvm_hw import CYCLE_SHAPES

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
                   "FP16A_COUNT": str(count),
                   "FP16A_TESTFLOAT_CASES": str(conformance_cases(simulator))},
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


@pytest.mark.parametrize("packing", [1, 2])
def test_mvm_ecp5(simulator, packing):
    """Every test of the MVM bench (random shapes, edge values, both roundings, static
    exponents, stalls, counters, MRF writes and read-back) on the ECP5 form, with one
    product per DSP and with two (engines 2i and 2i + 1 sharing each)."""
    c = MVM_CONFIG
    run_cocotb(
        name=f"mvm_n{c.n}_t{c.tiles}_dsp{MVM_DSP_LANES}x{packing}_ecp5",
        component=Mvm(c, dsp_lanes=MVM_DSP_LANES, dsp_packing=packing),
        test_module="sim.test_mvm",
        simulator=simulator,
        platform=ECP5_TARGET,
        extra_sources=ECP5_MODELS,
        extra_env={
            **config_env(c),
            "MVM_PRODUCTS": "6" if simulator == "verilator" else "2",
            "MVM_MATRICES": "2",
            "MVM_CYCLE_SHAPES": CYCLE_SHAPES[simulator],
        },
    )


class PairProduct(wiring.Component):
    """:func:`hw.arith.dsp.registered_product_pair` of three signed operands, for its bench."""

    def __init__(self, a_bits, b_bits):
        self._a_bits, self._b_bits = a_bits, b_bits
        super().__init__({
            "a": In(signed(a_bits)), "b1": In(signed(b_bits)), "b2": In(signed(b_bits)),
            "p1": Out(signed(a_bits + b_bits)), "p2": Out(signed(a_bits + b_bits)),
        })

    def elaborate(self, platform):
        m = Module()
        p1, p2 = registered_product_pair(m, self.a, self.b1, self.b2, enable=Const(1, 1),
                                         name="pair")
        m.d.comb += [self.p1.eq(p1), self.p2.eq(p2)]
        return m


#: The widest operands one DSP takes two products of (5 + 2 * 6 + 1 = 18), and the
#: MVM bench's 4 x 4.
PAIR_WIDTHS = [(5, 6), (4, 4)]


@pytest.mark.parametrize("a_bits, b_bits", PAIR_WIDTHS)
def test_pair_ecp5(simulator, a_bits, b_bits):
    """Both products of every combination of operand values, on the MULT18X18D model
    (Icarus: 20,000 random triples and the corners at the widest operands)."""
    assert pair_fits(signed(a_bits), signed(b_bits))
    env = {"PAIR_A_BITS": str(a_bits), "PAIR_B_BITS": str(b_bits)}
    if simulator == "icarus" and (a_bits, b_bits) == PAIR_WIDTHS[0]:
        env["PAIR_COUNT"] = "20000"
    run_cocotb(
        name=f"dsp_pair_a{a_bits}_b{b_bits}",
        component=PairProduct(a_bits, b_bits),
        test_module="sim.test_dsp_pair",
        simulator=simulator,
        platform=ECP5_TARGET,
        extra_sources=ECP5_MODELS,
        extra_env=env,
    )


@pytest.mark.parametrize("a_shape, b_shape, message", [
    (signed(5), signed(7), "do not fit one 18-bit MULT18X18D operand pair"),
    (signed(6), signed(6), r"width\(a\) \+ 2 width\(b\) \+ 1 = 19 > 18"),
    (unsigned(4), signed(4), "operands must be signed"),
    (signed(4), unsigned(4), "operands must be signed"),
])
def test_pair_limits(a_shape, b_shape, message):
    with pytest.raises(ValueError, match=message):
        registered_product_pair(Module(), Signal(a_shape), Signal(b_shape), Signal(b_shape),
                                enable=Const(1), name="x")


def test_pair_operands_of_one_shape():
    with pytest.raises(ValueError, match=r"b1 signed\(4\), b2 signed\(5\)"):
        registered_product_pair(Module(), Signal(signed(4)), Signal(signed(4)),
                                Signal(signed(5)), enable=Const(1), name="x")


def test_mvm_instances():
    """On an ECP5, ``T * N * dsp_lanes / dsp_packing`` product instances and one for the
    command check's ``R*G``; none elsewhere."""
    c = MVM_CONFIG
    check = 1                                   # R*G of the command check
    assert (_instances(Mvm(c, dsp_lanes=MVM_DSP_LANES), ECP5_TARGET)
            == 2 * 8 * MVM_DSP_LANES + check)
    assert _instances(Mvm(c, dsp_lanes=8), ECP5_TARGET) == 2 * 8 * 8 + check
    assert _instances(Mvm(c, dsp_lanes=MVM_DSP_LANES, dsp_packing=2),
                      ECP5_TARGET) == 2 * 8 * MVM_DSP_LANES // 2 + check
    assert _instances(Mvm(c), ECP5_TARGET) == check
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


@pytest.mark.parametrize("config, value, error, message", [
    (MVM_CONFIG, 0, ValueError, "dsp_packing must be from 1 to 2, not 0"),
    (MVM_CONFIG, 3, ValueError, "dsp_packing must be from 1 to 2, not 3"),
    (MVM_CONFIG, 2.0, TypeError, "dsp_packing must be an integer, not 2.0"),
    (MvmConfig(n=8, tiles=2, mrf_depth=32, max_col_tiles=8, mantissa_bits_v=4,
               mantissa_bits_w=7), 2, ValueError,
     "dsp_packing 2 needs mantissa_bits_v + 2 * mantissa_bits_w + 1 <= 18 (two products "
     "on one MULT18X18D), not 4 + 2 * 7 + 1 = 19"),
])
def test_mvm_dsp_packing_errors(config, value, error, message):
    with pytest.raises(error) as info:
        Mvm(config, dsp_lanes=2, dsp_packing=value)
    assert str(info.value) == message


def test_engine_lane_sources_exclusive():
    """A dot-product engine forms its DSP lanes itself or takes them from outside."""
    with pytest.raises(ValueError, match=r"^dsp_lanes \(2\) and outer_lanes \(1\) cannot "
                                         r"both be set$"):
        DotProductEngine(MVM_CONFIG, dsp_lanes=2, outer_lanes=1)


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
