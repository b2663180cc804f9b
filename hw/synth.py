"""The synthesis recipe the project's ECP5 flows share: the board's ``make bitstream``
(:func:`hw.board.board.build_overrides`), ``make gatesim`` (:mod:`sim.gatesim`) and the
place-and-route benches (:mod:`bench.fpga`). Why each part, with the measurements:
``docs/fpga-flow.md`` ("Why -nowidelut", "Why Booth for narrow multipliers").

* :data:`SYNTH_ECP5_OPTS`: ``synth_ecp5`` builds 5- to 7-input functions from LUT4s
  alone, not with the slices' wide-function multiplexers.
* :func:`flatten_commands`: before ``synth_ecp5``, the design flattened and the names of
  its wires that end in an index made private, which Yosys's ABC9 would otherwise mistake
  for bits of another wire.
* :func:`booth_commands`: before ``synth_ecp5``, products whose operands are both at most
  :data:`BOOTH_MAX_WIDTH` bits become radix-4 Booth multipliers in LUTs and carry chains
  instead of unregistered MULT18X18Ds. The MVM's N x N x T narrow products are most of
  them: without it the N = 16 board build asks for 291 MULT18X18D of the 85F's 156.
"""

from __future__ import annotations

__all__ = ["BOOTH_MAX_WIDTH", "ECP5_CELLS", "SYNTH_ECP5_OPTS", "booth_commands",
           "flatten_commands"]

#: Reads the ECP5 cell library as ``synth_ecp5`` does at its start, for the commands that
#: run before it: :func:`booth_commands`' ``hierarchy -check`` must know every primitive
#: a design instantiates (the board's I/O buffers ``IB``/``OB``, ``EHXPLLL``,
#: ``MULT18X18D``). ``synth_ecp5`` reading it again changes nothing.
ECP5_CELLS = "read_verilog -lib -specify +/ecp5/cells_sim.v +/ecp5/cells_bb.v"

#: ``synth_ecp5`` options of every flow. ``-nowidelut``: on a MAC array of 4 x 4 Booth
#: multipliers 24 % fewer LUT4 sites and 11 % more Fmax (``docs/fpga-flow.md``).
SYNTH_ECP5_OPTS = ("-nowidelut",)

#: Products whose two operands are both at most this wide are built in LUTs (Booth,
#: generic shift-and-add below 4 x 4); wider ones go to the DSP blocks (which cap an
#: unregistered product near 120 MHz, and of which the LFE5U-85F has 156).
BOOTH_MAX_WIDTH = 8


def flatten_commands(top: str) -> list[str]:
    """Yosys commands, for after the design (top module ``top``) is read and before
    ``synth_ecp5``, that flatten it and give every wire whose name ends in an index
    (``x[1]``: Amaranth names the elements of an array port or layout so) a private name
    (``rename -hide``, which leaves ports alone). ``synth_ecp5`` repeats the ``proc``
    and ``flatten`` harmlessly.

    Why: ABC9 names the bits it maps ``x[1]`` too, so a wire ``x[1]`` of several bits
    beside a wire ``x`` met another's bit in its reintegration, and Yosys 0.70 stopped
    on the assertion ``GetSize(conn.first) == GetSize(conn.second)`` (``rtlil.cc``) or
    not, as the order of its names fell: the core alone stopped there with one more
    register in its plan checks, and with the bench's kept flip-flops before
    (``docs/fpga-flow.md``, "Indexed names"). The netlist's logic is the same; only those
    wires' names change (nextpnr shows them with a ``$``).
    """
    return [f"hierarchy -check -top {top}", "proc", "flatten", "rename -hide w:*]"]


def booth_commands(top: str, max_width: int = BOOTH_MAX_WIDTH) -> list[str]:
    """Yosys commands, for after the design (top module ``top``) is read and before
    ``synth_ecp5``, that build its ``$mul`` cells of operands at most ``max_width`` bits
    wide in LUTs. ``synth_ecp5`` repeats their ``proc``, ``flatten`` and ``wreduce``
    harmlessly. A design that instantiates ECP5 primitives needs the cell library read
    first (:data:`ECP5_CELLS`), since ``hierarchy -check`` runs here.

    Two Booth passes: ``booth`` skips products of fewer than 8 output bits, and ``wreduce``
    cuts a product down to the bits that are used (a 4 x 4 product kept in 7 bits, as the
    MVM's are), so the first pass runs on the widths the design gives and the second on
    the products that only ``wreduce`` brought under the limit; ``techmap`` builds those
    that ``booth`` leaves alone (under 4 x 4) as generic shift-and-add.

    Raises
    ------
    TypeError, ValueError
        ``max_width`` is not an integer from 1 to 18.
    """
    from host.spec.formats import check_int
    w = check_int("max_width", max_width, 1, 18)
    select = f"select -set lutmul t:$mul r:A_WIDTH<={w} %i r:B_WIDTH<={w} %i"
    return [
        f"hierarchy -check -top {top}",
        "proc",
        "flatten",
        "opt_expr",
        "opt_clean",
        select,
        "booth @lutmul",
        "select -clear",
        "wreduce",
        "opt_clean",
        select,
        "booth @lutmul",
        "techmap -map +/techmap.v t:$mul @lutmul %i",
        "select -clear",
    ]
