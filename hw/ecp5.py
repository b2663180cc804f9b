"""Global lines for the resets of the ECP5 builds.

nextpnr puts only clock nets on the ECP5's global network by itself; any other net, a
reset among them, goes on the general routing as one net with an arc to every slice it
reaches. The board's core reset (the sync reset or the link's soft reset) reaches the
``LSR`` of about 8,700 flip-flops (preset ``ulx3s``); the PLL's sync reset
(:class:`hw.board.pll.EcpPll`) that of about 1,100 more. On the general routing, nextpnr's
router had 124k of the board's 253k arcs left after 65 minutes; with the reset on a
global line, as many after 23 (``docs/notes/2026-11-board-build.md``). A ``DCCA`` (the
global buffer) in front of it moves it onto a global line, which nextpnr routes to
every ``LSR`` on the clock tree; :func:`reset_logic_off_global` takes the line's other
loads (LUTs that OR the reset with a clear) off it, between Yosys and nextpnr.

:func:`global_buffer` adds the buffer when the design is elaborated for the ECP5
(:func:`hw.arith.dsp.has_ecp5_dsp`: a real ECP5 board platform, or
:data:`hw.arith.dsp.ECP5_TARGET` of the place-and-route benches and ``make gatesim``);
elsewhere (the simulators) it returns the signal itself, so the simulated designs do not
change. ``sim/models/ecp5_cells.v`` models the ``DCCA`` for gate-level simulation.
"""

import json
from pathlib import Path

from amaranth.hdl import Const, Instance, Signal

from hw.arith.dsp import has_ecp5_dsp

__all__ = ["global_buffer", "reset_logic_off_global"]


def global_buffer(m, platform, signal, *, name):
    """``signal`` (one bit) through a ``DCCA`` (enable tied high) named ``name`` when
    ``platform`` is an ECP5, as a new signal ``<name>_global``; otherwise ``signal``.

    The buffer adds the global network's insertion delay (a few ns) to every path through
    ``signal``: for a reset, whose sources are registers a cycle away, that is the price
    of taking it off the general routing.

    Raises
    ------
    ValueError
        ``signal`` is not one bit wide.
    """
    if len(signal) != 1:
        raise ValueError(f"signal must be one bit wide, not {len(signal)} ({signal!r})")
    if not has_ecp5_dsp(platform):
        return signal
    line = Signal(name=f"{name}_global")
    m.submodules[name] = Instance("DCCA", i_CLKI=signal, i_CE=Const(1), o_CLKO=line)
    return line


def reset_logic_off_global(netlist) -> int:
    """In the JSON netlist file ``netlist`` (Yosys's, for nextpnr), give every load of a
    ``DCCA``'s global line but a flip-flop's ``LSR`` its own copy of the power-on
    register that drives the buffer, or the buffer's input; in place. Returns how many
    loads were moved.

    nextpnr reaches a LUT input from a global line through local wires that it locks
    before routing anything else; on the MVM (266 LUT inputs take the reset: a reset
    ORed with a clear) both routers then failed on other nets' arcs into the
    accumulator's slices ("Failed to find a route for arc"). So those loads leave the
    global line. Fed from the one power-on register instead, they were spread over the
    die and that net was the routed critical path (9 ns of route to a LUT before an
    ``LSR``; ``docs/mvm.md`` section 11). Each now takes a copy of the register that drives
    the buffer (same cell and parameters: the same value at every edge), which the
    placer puts beside it: the duplication a synthesis tool's fan-out limit makes. If
    the buffer's driver is not such a register (a flip-flop with only constant inputs
    besides its clock; the board's core reset is a LUT, the sync reset or the soft
    reset), the loads go back onto the buffer's input.
    """
    design = json.loads(Path(netlist).read_text())
    moved = 0
    for module in design["modules"].values():
        cells = module["cells"]
        next_bit = 1 + max((b for c in cells.values() for bits in c["connections"].values()
                            for b in bits if isinstance(b, int)), default=1)
        for name, dcca in [(n, c) for n, c in cells.items() if c["type"] == "DCCA"]:
            out, src = dcca["connections"]["CLKO"], dcca["connections"]["CLKI"]
            driver = next(((n, c) for n, c in cells.items()
                           if c["type"] == "TRELLIS_FF" and c["connections"].get("Q") == src),
                          None)
            if driver is not None and not all(
                    all(isinstance(b, str) for b in bits)
                    for port, bits in driver[1]["connections"].items()
                    if port not in ("CLK", "Q")):
                driver = None
            loads = [(cell, port) for cell in cells.values()
                     for port, bits in cell["connections"].items()
                     if (bits == out and cell["port_directions"].get(port) == "input"
                         and not (cell["type"] == "TRELLIS_FF" and port == "LSR"))]
            for k, (cell, port) in enumerate(loads):
                net = src
                if driver is not None:
                    copy = json.loads(json.dumps(driver[1]))
                    net = [next_bit]
                    next_bit += 1
                    copy["connections"]["Q"] = net
                    cells[f"{driver[0]}_copy{k}"] = copy
                    module.setdefault("netnames", {})[f"{name}_load{k}"] = {
                        "hide_name": 0, "bits": net, "attributes": {}}
                cell["connections"][port] = net
                moved += 1
    Path(netlist).write_text(json.dumps(design))
    return moved
