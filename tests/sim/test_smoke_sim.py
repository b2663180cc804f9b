"""Smoke test of the simulation flow: Amaranth -> Verilog -> simulator -> cocotb.

The design is deliberately trivial (a registered 8-bit adder behind ``lib.stream``
ports) so that a failure here means the flow is broken, not the design. The cocotb
side is ``sim/test_smoke.py``.
"""

from amaranth.hdl import Module, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from sim.runner import run_cocotb

WIDTH = 8


class SmokeSum(wiring.Component):
    """``o = (a + b) mod 2**width``, combinational: a submodule, so that the bench can
    check which signals the simulator shows (``sim.runner.VERILATOR_PUBLIC_ARGS``)."""

    def __init__(self, width):
        super().__init__({"a": In(width), "b": In(width), "o": Out(width)})

    def elaborate(self, platform):
        m = Module()
        m.d.comb += self.o.eq(self.a + self.b)     # truncates: wraps mod 2**width
        return m


class SmokeAdder(wiring.Component):
    """``o.payload = (a + b) mod 2**width`` one cycle after an ``i`` transfer.

    A one-entry pipeline register with standard stream handshakes: it takes a new input
    whenever its register is empty or being emptied in the same cycle. The sum is a
    submodule's (``sum``).
    """

    def __init__(self, width=WIDTH):
        self.width = width
        super().__init__({
            "i_stream": In(stream.Signature(data.StructLayout({"a": width, "b": width}))),
            "o_stream": Out(stream.Signature(width)),
        })

    def elaborate(self, platform):
        m = Module()
        i, o = self.i_stream, self.o_stream
        m.submodules.sum = total = SmokeSum(self.width)
        m.d.comb += [total.a.eq(i.payload.a), total.b.eq(i.payload.b),
                     i.ready.eq(~o.valid | o.ready)]
        with m.If(i.ready):
            m.d.sync += [o.valid.eq(i.valid), o.payload.eq(total.o)]
        return m


def test_smoke(simulator):
    run_cocotb(
        name=f"smoke_adder_w{WIDTH}",
        component=SmokeAdder(WIDTH),
        test_module="sim.test_smoke",
        simulator=simulator,
        extra_env={"SMOKE_WIDTH": str(WIDTH)},
    )


class Time0Comb(wiring.Component):
    """``o`` is ``0b1010`` from time 0 on: a combinational assignment under a condition
    whose input (a register) keeps its initial value for ever, so no input of the
    generated ``always @*`` block ever changes. Only its time-0 trigger runs it."""

    def __init__(self):
        super().__init__({"o": Out(4)})

    def elaborate(self, platform):
        m = Module()
        held = Signal(init=1)
        m.d.sync += held.eq(held)
        with m.If(held):
            m.d.comb += self.o.eq(0b1010)
        return m


def test_comb_blocks_run_at_time_zero(simulator):
    """Under cocotb's default Icarus flags (``-g2012``) ``o`` stays X: the regression
    test of ``sim.runner.ICARUS_BUILD_ARGS`` (``docs/setup.md``)."""
    run_cocotb(name="time0_comb", component=Time0Comb(), test_module="sim.test_time0",
               simulator=simulator)
