"""The ULX3S top (``hw.board.board.ULX3STop``) as ``make bitstream`` builds it, short of the tools.

``amaranth_boards``' ULX3S-85F platform prepares the build (elaboration, RTLIL, pin
constraints and build script) without running Yosys or nextpnr; what that checks:
the top is an elaboratable the platform accepts, the serial lines are on the FTDI pins,
the clock is the board's 25 MHz oscillator, and on the real platform the multipliers are
the ECP5 form (``hw.arith.dsp``) that the simulations of ``tests/hw/test_dsp_hw.py`` cover.
"""

import pytest
# amaranth-boards comes with the fpga extra, which `make venv` installs: a missing one
# fails this module at collection instead of leaving its tests unrun.
from amaranth_boards import ulx3s

from host.spec.config import NpuConfig, preset


def _plan(config, baud=1_000_000):
    from hw.board.board import ULX3STop, build_overrides
    return ulx3s.ULX3S_85F_Platform().prepare(ULX3STop(config, baud), name="npu",
                                              **build_overrides("npu"))


def _small_config():
    """A small NPU (one unary function, short memories): quick to elaborate."""
    return NpuConfig(n=4, tiles=1, mrf_depth=16, max_col_tiles=4, ivrf_depth=16,
                     vrf_depth=16, netq_depth=16, program_depth=16, max_length=2,
                     unary_ops=["relu"])


def _text(data):
    return data if isinstance(data, str) else data.decode()


def test_ulx3s_top_prepares():
    files = _plan(_small_config()).files
    assert {"npu.il", "npu.lpf", "build_npu.sh"} <= set(files)
    lpf = _text(files["npu.lpf"])
    # FTDI UART: the FPGA receives on M1 and sends on L4; the clock is G2 at 25 MHz.
    for site in ('"M1"', '"L4"', '"G2"'):
        assert site in lpf, f"{site} missing from the pin constraints:\n{lpf}"
    assert "FREQUENCY PORT" in lpf and "25000000" in lpf.replace(".0", "")
    il = _text(files["npu.il"])
    # The MFUs' MUL units are MULT18X18D instances with their own registers on an ECP5.
    assert "cell \\MULT18X18D " in il


def test_ulx3s_build_leaves_marked_collisions_undefined():
    """``make bitstream`` runs the collision commands of ``hw.ram`` inside ``synth_ecp5``
    (after ``memory_collect``, before ``memory_libmap``), on a design that has marked
    memories (what the commands do is ``tests/hw/test_fpga_flow.py``'s)."""
    from hw.ram import READ_COLLISION_UNUSED, yosys_collision_commands
    files = _plan(_small_config()).files
    (attr,) = READ_COLLISION_UNUSED
    assert f"attribute \\{attr} 1" in _text(files["npu.il"])
    script = [line.strip() for line in _text(files["npu.ys"]).splitlines() if line.strip()]
    synth = [i for i, line in enumerate(script) if line.startswith("synth_ecp5 ")]
    assert len(synth) == 2, script
    first, second = synth
    assert script[first].split()[1:4] == ["-nowidelut", "-run", "begin:map_ram"], \
        script[first]
    assert script[second].split()[1:] == ["-nowidelut", "-top", "npu", "-run", "map_ram:"], \
        script[second]
    # hw.synth's recipe, as the place-and-route benches have it: the narrow products
    # built in LUTs before synth_ecp5 (the N = 16 MVM would ask for 291 MULT18X18D of 156).
    from hw.synth import ECP5_CELLS, booth_commands, flatten_commands
    read = script.index("read_rtlil npu.il")
    assert script[read + 1:first] == [ECP5_CELLS, *flatten_commands("npu"),
                                      *booth_commands("npu")], \
        script[read + 1:first]
    assert script[first + 1:second] == yosys_collision_commands()
    assert script[second + 1].startswith("write_json npu.json"), script[second + 1:]


def test_ulx3s_top_refuses_bad_parameters():
    from hw.board.board import ULX3STop
    with pytest.raises(TypeError, match="config must be an NpuConfig, not 16"):
        ULX3STop(16)


def test_command_line_defaults_and_overrides():
    from hw.board.board import ULX3S_CONFIG, parse_args
    config, baud, build_dir = parse_args([])
    assert (config.n, config.tiles) == (ULX3S_CONFIG["n"], ULX3S_CONFIG["tiles"]) == (16, 1)
    assert config.mfus == NpuConfig().mfus and config == preset("ulx3s")
    config, baud, build_dir = parse_args(["--config", "n=8,max_length=0x10", "--baud",
                                          "115200", "--build-dir", "x"])
    assert (config.n, config.tiles, config.max_length) == (8, 1, 16)
    assert (baud, build_dir) == (115200, "x")


@pytest.mark.parametrize("text, message", [
    ("n=8,colour=3", "'colour' is not a build field"),
    ("unary_ops=3", "unary_ops='3': "),
    ("n=eight", "n must be an integer, not 'eight'"),
    ("board9", "unknown build preset 'board9'; choose one of: default, ulx3s, ulx3s_n4"),
    ("n=6", "n must be a power of two, not 6"),
])
def test_command_line_errors(text, message, capsys):
    from hw.board.board import parse_args
    with pytest.raises(SystemExit) as info:
        parse_args(["--config", text])
    assert info.value.code == 2
    assert message in capsys.readouterr().err
