"""The pieces of ``make gatesim`` (``sim/gatesim.py``) that need no synthesis or
simulation: the netlist's build is the bitstream's, its Yosys script the board flow's,
its public ports exactly ``SimBoard``'s, the cell count read from Yosys's ``stat``. The
gate-level run itself is not part of ``make test`` (it takes most of an hour; its runs
are recorded in ``docs/notes/2026-11-28-gatesim.md``)."""

from hw.board.board import SimBoard, build_overrides, parse_args
from sim import gatesim
from sim.board import SIM_TRUNCATE_CYCLES


def test_build_is_the_bitstreams():
    """The netlist's configuration is what ``make bitstream`` builds without ``--config``."""
    config, _, _ = parse_args([])
    assert gatesim.netlist_config() == config


def test_script_is_the_board_flows():
    """Amaranth's ECP5 script with ``build_overrides`` (``read_rtlil``, ``synth_ecp5`` with
    its options, the collision commands and the rest of ``synth_ecp5``), then the netlist
    written as the JSON the board flow hands nextpnr."""
    ov = build_overrides(gatesim.NAME)
    script = gatesim.yosys_script()
    assert script[0] == f"read_rtlil {gatesim.NAME}.il"
    assert script[1] == ov["script_after_read"]
    assert script[2] == f"synth_ecp5 {ov['synth_opts']} -top {gatesim.NAME}"
    assert script[3] == ov["script_after_synth"]
    assert script[-1] == f"write_json {gatesim.NAME}.json"
    assert not any(line.startswith(("opt", "flatten", "synth", "techmap"))
                   for line in script[4:]), "the netlist must be the one synthesized"


def test_ports_are_simboards(tmp_path):
    """The ports made public to cocotb are exactly ``SimBoard``'s (its signature's members
    flattened as Amaranth names them, plus ``clk`` and ``rst``)."""
    board = SimBoard(gatesim.netlist_config(), truncate_cycles=SIM_TRUNCATE_CYCLES)
    board._MustUse__silence = True
    names = {"clk", "rst"} | {"__".join(map(str, path))
                              for path, _, _ in board.signature.flatten(board)}
    assert set(gatesim.PORTS) == names
    text = gatesim.port_config(tmp_path / "ports.vlt").read_text()
    assert text.startswith("`verilator_config\n")
    assert text.count("public_flat_rw") == len(names)


def test_cell_counts(tmp_path):
    (tmp_path / "stat.txt").write_text(
        "=== gateboard ===\n\n    77568 cells\n       58   $scopeinfo\n     6413   CCU2C\n"
        "       77   DP16KD\n    36793   LUT4\n")
    assert gatesim.cell_counts(tmp_path) == {"CCU2C": 6413, "DP16KD": 77, "LUT4": 36793}
