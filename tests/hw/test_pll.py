"""The ECP5 PLL (``hw.board.pll``) and the ULX3S top clocked by it (issue 36 item 4).

The divider search against a brute force over every legal divider triple, with the
limits written out here again from prjtrellis's ``ecppll.cpp``; the ``EHXPLLL`` instance
in Amaranth's RTLIL; the lock-to-reset synchronizer in Amaranth's simulator (the PLL
itself cannot be simulated); the ULX3S top with and without the PLL, prepared for the
board's platform without the tools (amaranth-boards comes with the fpga extra, which
`make venv` installs); the build's command line.
"""

import gc
from fractions import Fraction

import pytest
from amaranth.back import rtlil
from amaranth.hdl import ClockDomain, Fragment, Module
from amaranth.sim import Simulator
from amaranth_boards import ulx3s

from host.spec.config import NpuConfig
from hw.board import pll as _pll
from hw.board.pll import EcpPll, LockReset, PllParams, pll_params, reachable_range
from hw.link.uart import divisor_for

MHZ = 1_000_000
OSC = 25 * MHZ
# ecppll.cpp (libtrellis/tools): PFD 3.125-400 MHz, VCO 400-800 MHz, output 10-400 MHz,
# CLKI_DIV 1-128, CLKFB_DIV 1-80, CLKOP_DIV 1-128; among equal errors the VCO nearest
# 600 MHz, then the first triple found (CLKI_DIV, CLKFB_DIV, CLKOP_DIV ascending).
PFD = (Fraction(3_125_000), Fraction(400 * MHZ))
VCO = (Fraction(400 * MHZ), Fraction(800 * MHZ))
OUT = (Fraction(10 * MHZ), Fraction(400 * MHZ))


def _legal_triples(f_in):
    """Every ``(f_out, f_vco, f_pfd, clki_div, clkfb_div, clkop_div)`` within the limits."""
    rows = []
    for clki in range(1, 129):
        pfd = Fraction(f_in, clki)
        if not PFD[0] <= pfd <= PFD[1]:
            continue                                # no triple with this CLKI_DIV
        for clkfb in range(1, 81):
            for clkop in range(1, 129):
                vco = pfd * clkfb * clkop
                out = vco / clkop
                if VCO[0] <= vco <= VCO[1] and OUT[0] <= out <= OUT[1]:
                    rows.append((out, vco, pfd, clki, clkfb, clkop))
    return rows


@pytest.fixture(scope="module")
def legal_25mhz():
    return _legal_triples(OSC)


#: Halfway between two outputs, where the VCO nearer 600 MHz decides (and the search order
#: alone would take the other): target, the output chosen.
MIDWAY = {55_625_000: 55 * MHZ, 65_312_500: 65_625_000, 94_375_000: 95 * MHZ}


def test_search_matches_brute_force(legal_25mhz):
    """25 MHz in, 40 to 200 MHz out in 1 MHz steps and a few targets halfway between two
    outputs: the chosen triple is the brute force's (least error, then VCO nearest
    600 MHz, then search order)."""
    exact = 0
    for target in [mhz * MHZ for mhz in range(40, 201)] + list(MIDWAY):
        mhz = target / MHZ
        p = pll_params(OSC, target, tolerance=1)
        best = min(legal_25mhz, key=lambda r: (abs(r[0] - target), abs(r[1] - 600 * MHZ),
                                               r[3], r[4], r[5]))
        assert abs(p.f_out_hz - target) == abs(best[0] - target), mhz
        assert (p.clki_div, p.clkfb_div, p.clkop_div) == best[3:], mhz
        assert (p.f_out_hz, p.f_vco_hz, p.f_pfd_hz) == best[:3], mhz
        # The frequencies follow from the dividers and stay within the limits.
        assert p.f_pfd_hz == Fraction(OSC, p.clki_div)
        assert p.f_out_hz == p.f_pfd_hz * p.clkfb_div
        assert p.f_vco_hz == p.f_out_hz * p.clkop_div
        assert PFD[0] <= p.f_pfd_hz <= PFD[1] and VCO[0] <= p.f_vco_hz <= VCO[1]
        assert (p.clkop_cphase, p.clkop_fphase) == (p.clkop_div // 2, 0)
        exact += p.f_out_hz == target
        if target in MIDWAY:
            assert p.f_out_hz == MIDWAY[target]
    assert exact == 33      # 40, 50, ..., 100, 125, 200 and the others that divide


@pytest.mark.parametrize("f_out, dividers, vco", [
    (100 * MHZ, (1, 4, 6), 600 * MHZ),
    (125 * MHZ, (1, 5, 5), 625 * MHZ),
    (50 * MHZ, (1, 2, 12), 600 * MHZ),
    (40 * MHZ, (5, 8, 15), 600 * MHZ),
])
def test_exact_frequencies(f_out, dividers, vco):
    p = pll_params(OSC, f_out, tolerance=0)
    assert isinstance(p, PllParams)
    assert (p.clki_div, p.clkfb_div, p.clkop_div) == dividers
    assert p.f_out_hz == f_out and p.clk_hz == f_out and p.f_vco_hz == vco
    assert p.f_pfd_hz == Fraction(OSC, dividers[0])
    with pytest.raises(AttributeError):
        p.clkop_div = 1                                  # frozen


def test_limits_at_their_edges():
    """Each limit where it decides: the PFD's minimum (3.125 MHz, inclusive), CLKFB_DIV's
    80, the VCO's 400 and 800 MHz (both inclusive; the tie goes to the smaller divider)."""
    p = pll_params(OSC, 103_125_000, tolerance=0)        # 25 MHz / 8 * 33 only
    assert (p.clki_div, p.clkfb_div, p.f_pfd_hz) == (8, 33, 3_125_000)
    # From 24 MHz, 123 MHz needs CLKI_DIV 8, a 3 MHz PFD: not within the limits.
    assert pll_params(24 * MHZ, 123 * MHZ, tolerance=1).f_out_hz != 123 * MHZ
    # 253.125 MHz is 25 MHz / 8 * 81 and nothing else: CLKFB_DIV stops at 80.
    p = pll_params(OSC, 253_125_000, tolerance=1)
    assert p.f_out_hz != 253_125_000 and p.clkfb_div <= 80
    p = pll_params(OSC, 400 * MHZ, tolerance=0)          # VCO 400 or 800 MHz: as near 600
    assert (p.clkop_div, p.f_vco_hz) == (1, 400 * MHZ)


def test_nearest_frequency_is_exact_rational():
    p = pll_params(OSC, 33_333_333)
    assert p.f_out_hz == Fraction(100 * MHZ, 3) and p.clk_hz == 33_333_333
    assert p.describe() == "33.3333 MHz (EHXPLLL 25 MHz / 3 * 4, VCO 600 MHz / 18)"
    assert p.to_dict()["f_out_hz"] == pytest.approx(100e6 / 3)


def test_reachable_range():
    assert reachable_range(OSC) == (10 * MHZ, 400 * MHZ)
    # 8 MHz in: PFD >= 3.125 MHz leaves CLKI_DIV 1 and 2, so 4 MHz steps from 12 MHz.
    assert reachable_range(8 * MHZ) == (12 * MHZ, 400 * MHZ)


@pytest.mark.parametrize("args, kwargs, error, message", [
    ((OSC, 9_999_999), {}, ValueError,
     ("f_out_hz 9999999 is outside the range an EHXPLLL reaches from f_in_hz 25000000: "
      "10 MHz to 400 MHz")),
    ((OSC, 400_000_001), {}, ValueError,
     ("f_out_hz 400000001 is outside the range an EHXPLLL reaches from f_in_hz 25000000: "
      "10 MHz to 400 MHz")),
    ((8 * MHZ, 11 * MHZ), {}, ValueError, "from f_in_hz 8000000: 12 MHz to 400 MHz"),
    ((7_999_999, 100 * MHZ), {}, ValueError,
     "f_in_hz 7999999 is outside the EHXPLLL's input range 8 MHz to 400 MHz"),
    ((400_000_001, 100 * MHZ), {}, ValueError,
     "f_in_hz 400000001 is outside the EHXPLLL's input range 8 MHz to 400 MHz"),
    ((25e6, 100 * MHZ), {}, TypeError, "f_in_hz must be an integer, not 25000000.0"),
    ((OSC, 100.5e6), {}, TypeError, "f_out_hz must be an integer, not 100500000.0"),
    ((OSC, "100"), {}, TypeError, "f_out_hz must be an integer, not '100'"),
    ((OSC, True), {}, TypeError, "f_out_hz must be an integer, not True"),
    ((-OSC, 100 * MHZ), {}, ValueError, "f_in_hz must be at least 1, not -25000000"),
    ((OSC, -100 * MHZ), {}, ValueError, "f_out_hz must be at least 1, not -100000000"),
    ((OSC, 101 * MHZ), {}, ValueError,
     ("f_out_hz 101000000 from f_in_hz 25000000: the nearest an EHXPLLL reaches is 100 "
      "MHz, 0.990% off, more than the tolerance 0.500%")),
    ((OSC, 100 * MHZ), {"tolerance": -0.1}, ValueError,
     "tolerance must be at least 0, not -0.1"),
    ((OSC, 100 * MHZ), {"tolerance": "1%"}, TypeError,
     "tolerance must be a real number, not '1%'"),
])
def test_refusals(args, kwargs, error, message):
    with pytest.raises(error) as info:
        pll_params(*args, **kwargs)
    assert message in str(info.value)


def test_tolerance():
    assert _pll.DEFAULT_TOLERANCE == 0.005
    assert pll_params(OSC, 101 * MHZ, tolerance=0.01).f_out_hz == 100 * MHZ
    assert pll_params(OSC, 100_400_000).f_out_hz == 100 * MHZ       # 0.4 % off


def test_ecp_pll_rtlil():
    """The instance, its parameters and attributes as ``ecppll`` writes them, CLKOP fed
    back, and the reset synchronizer's flip-flops."""
    m = Module()
    m.domains.sync = ClockDomain()
    m.submodules.pll = pll = EcpPll(pll_params(OSC, 100 * MHZ))
    text = rtlil.convert(m, ports=[pll.clk_in, pll.locked])
    assert text.count("cell \\EHXPLLL ") == 1
    cell = text[text.index("cell \\EHXPLLL "):]
    cell = cell[:cell.index("\n  end")]
    for line in ["parameter \\CLKI_DIV 1", "parameter \\CLKFB_DIV 4",
                 "parameter \\CLKOP_DIV 6", "parameter \\CLKOP_CPHASE 3",
                 "parameter \\CLKOP_FPHASE 0", 'parameter \\FEEDBK_PATH "CLKOP"',
                 'parameter \\CLKOP_ENABLE "ENABLED"', 'parameter \\PLLRST_ENA "DISABLED"',
                 "connect \\CLKI \\clk_in", "connect \\LOCK \\locked", "connect \\RST 1'0"]:
        assert line in cell, f"{line!r} missing from\n{cell}"
    # CLKOP drives the domain's clock and comes back as CLKFB.
    clkop = next(ln.split()[-1] for ln in cell.splitlines() if "connect \\CLKOP " in ln)
    clkfb = next(ln.split()[-2] for ln in cell.splitlines() if "connect \\CLKFB " in ln)
    assert clkop == clkfb
    for attr, value in [("FREQUENCY_PIN_CLKI", "25"), ("FREQUENCY_PIN_CLKOP", "100"),
                        ("ICP_CURRENT", "12"), ("LPF_RESISTOR", "8"),
                        ("MFG_ENABLE_FILTEROPAMP", "1"), ("MFG_GMCREF_SEL", "2")]:
        assert f'attribute \\{attr} "{value}"' in text
    assert "wire width 1 \\stage0" in text and "\\stage1" in text
    assert "DCCA" not in text                       # no global buffer for the simulators


def test_ecp_pll_refuses_bad_parameters():
    with pytest.raises(TypeError, match="params must be a PllParams .from pll_params., "
                                        "not 100000000"):
        EcpPll(100 * MHZ)
    with pytest.raises(ValueError, match="reset_stages must be at least 2, not 1"):
        EcpPll(pll_params(OSC, 100 * MHZ), reset_stages=1)
    with pytest.raises(TypeError, match="domain must be a string, not 3"):
        EcpPll(pll_params(OSC, 100 * MHZ), domain=3)
    with pytest.raises(ValueError, match="stages must be at least 2, not 0"):
        LockReset(stages=0)


@pytest.mark.parametrize("stages", [2, 3])
def test_lock_reset(stages):
    """Reset while unlocked (from configuration on), released ``stages`` clock edges
    after lock, reasserted without a clock edge when the lock is lost."""
    dut = LockReset(stages=stages)
    sim = Simulator(dut)
    sim.add_clock(1e-8)          # 100 MHz: edges at 0, 10, 20 ... ns
    seen = []

    async def bench(ctx):
        assert ctx.get(dut.rst) == 1
        await ctx.tick().repeat(5)
        assert ctx.get(dut.rst) == 1                    # not locked yet
        for _ in range(2):
            await ctx.delay(3e-9)                        # between edges
            ctx.set(dut.locked, 1)
            for _ in range(stages - 1):
                await ctx.tick()
                assert ctx.get(dut.rst) == 1
            await ctx.tick()
            assert ctx.get(dut.rst) == 0                 # released on the stages-th edge
            await ctx.tick().repeat(4)
            assert ctx.get(dut.rst) == 0
            await ctx.delay(4e-9)
            ctx.set(dut.locked, 0)                       # lock lost mid-cycle
            await ctx.delay(1e-9)                        # no edge since
            seen.append(ctx.get(dut.rst))
            await ctx.tick().repeat(3)
            assert ctx.get(dut.rst) == 1                 # held while unlocked

    sim.add_testbench(bench)
    sim.run()
    assert seen == [1, 1]


def test_lock_reset_glitch_is_stretched():
    """A lock dropping for less than a clock period still resets for ``stages`` edges."""
    dut = LockReset(stages=2)
    sim = Simulator(dut)
    sim.add_clock(1e-8)

    async def bench(ctx):
        ctx.set(dut.locked, 1)
        await ctx.tick().repeat(4)
        assert ctx.get(dut.rst) == 0
        await ctx.delay(2e-9)
        ctx.set(dut.locked, 0)
        await ctx.delay(2e-9)
        ctx.set(dut.locked, 1)                           # back before the next edge
        assert ctx.get(dut.rst) == 1
        await ctx.tick()
        assert ctx.get(dut.rst) == 1
        await ctx.tick()
        assert ctx.get(dut.rst) == 0

    sim.add_testbench(bench)
    sim.run()


# ULX3S top -------------------------------------------------------------------------------


def _small_config():
    """A small NPU (one unary function, short memories): quick to elaborate."""
    return NpuConfig(n=4, tiles=1, mrf_depth=16, max_col_tiles=4, ivrf_depth=16,
                     vrf_depth=16, netq_depth=16, program_depth=16, max_length=2,
                     unary_ops=["relu"])


@pytest.mark.parametrize("clk_hz, baud", [(None, 1_000_000), (100 * MHZ, 1_000_000),
                                          (33_333_333, 3_000_000)])
def test_ulx3s_top_clock(clk_hz, baud):
    """The NpuBoard's divisor follows the clock; the PLL replaces the platform's own
    ``sync`` domain (oscillator and global set/reset) when a frequency is given."""
    from hw.board.board import ULX3STop, build_overrides
    top = ULX3STop(_small_config(), baud, clk_hz)
    platform = ulx3s.ULX3S_85F_Platform()
    # Elaborated once, here, to reach the parts; then prepared as make bitstream does.
    fragment = Fragment.get(top, platform)
    parts = {name: sub.origins[0] for sub, name, _ in fragment.subfragments}
    npu = parts["npu"]
    if clk_hz is None:
        assert top.pll is None and "pll" not in parts
        assert npu.divisor == divisor_for(OSC, baud) == 25
    else:
        assert top.pll == pll_params(OSC, clk_hz)
        assert npu.divisor == divisor_for(top.pll.clk_hz, baud)
        assert parts["pll"].params == top.pll
    files = platform.prepare(fragment, name="npu", **build_overrides("npu")).files
    il, lpf = files["npu.il"], files["npu.lpf"]
    il = il if isinstance(il, str) else il.decode()
    lpf = lpf if isinstance(lpf, str) else lpf.decode()
    # nextpnr derives the PLL's output constraint from the oscillator's.
    assert '"G2"' in lpf and "FREQUENCY PORT" in lpf
    # The core's reset on a global line; with the PLL, the sync reset on another.
    if clk_hz is None:
        assert "EHXPLLL" not in il and "cell \\SGSR " in il
        assert il.count("cell \\DCCA ") == 1
    else:
        assert il.count("cell \\EHXPLLL ") == 1 and "SGSR" not in il
        assert il.count("cell \\DCCA ") == 2 and "cell \\DCCA \\reset_buffer" in il
        assert f"parameter \\CLKFB_DIV {top.pll.clkfb_div}" in il


def test_ulx3s_top_refuses_clock():
    from hw.board.board import ULX3STop
    config = _small_config()
    with pytest.raises(ValueError) as info:
        ULX3STop(config, 3_000_000, 40 * MHZ)     # 13.33 cycles per bit
    assert str(info.value) == (
        "clk_hz 40000000 (the PLL makes 40000000 Hz) cannot time the UART: baud 3000000 "
        "at clk_hz 40000000 is 2.6% off with divisor 13; at most 2 % is accepted")
    with pytest.raises(ValueError, match="clk_hz 450000000 from the ULX3S's oscillator: "
                                         "f_out_hz 450000000 is outside the range"):
        ULX3STop(config, 1_000_000, 450 * MHZ)
    with pytest.raises(TypeError, match="clk_hz must be an integer, not 100.0"):
        ULX3STop(config, 1_000_000, 100.0)


# Command line ----------------------------------------------------------------------------


def test_command_line_clock():
    from hw.board.board import BOARD_CLK_HZ, parse_args, parse_build_args
    args = parse_build_args([])
    assert args.clk_hz == BOARD_CLK_HZ == 40 * MHZ and args.pll == pll_params(OSC, 40 * MHZ)
    args = parse_build_args(["--oscillator"])
    assert args.clk_hz is None and args.pll is None
    assert len(parse_args([])) == 3
    args = parse_build_args(["--clk-mhz", "100"])
    assert args.clk_hz == 100 * MHZ and args.pll == pll_params(OSC, 100 * MHZ)
    assert parse_build_args(["--clk-mhz", "62.5"]).clk_hz == 62_500_000


def test_command_line_seed():
    """``--seed`` reaches nextpnr's options; without it nextpnr places with its own."""
    from hw.board.board import build_overrides, parse_build_args
    assert parse_build_args([]).seed is None
    assert parse_build_args(["--seed", "2"]).seed == 2
    assert parse_build_args(["--seed", "0", "--oscillator"]).seed == 0
    assert build_overrides("npu")["nextpnr_opts"].split() == ["--report", "report.json"]
    assert build_overrides("npu", 7)["nextpnr_opts"].split() == \
        ["--report", "report.json", "--seed", "7"]


def test_command_line_router_and_density():
    """``--router`` and ``--placer-density`` reach nextpnr as ``--router`` and
    ``--placer-heap-beta``; bad values in :func:`build_overrides` raise naming them."""
    from hw.board.board import build_overrides, parse_build_args
    args = parse_build_args([])
    assert args.router is None and args.placer_density is None
    args = parse_build_args(["--router", "router2", "--placer-density", "0.75", "--seed", "4"])
    assert (args.router, args.placer_density, args.seed) == ("router2", 0.75, 4)
    assert build_overrides("npu", **args.nextpnr_options())["nextpnr_opts"].split() == [
        "--report", "report.json", "--seed", "4", "--router", "router2",
        "--placer-heap-beta", "0.75"]
    assert build_overrides("npu", placer_density=1)["nextpnr_opts"].split()[-2:] == \
        ["--placer-heap-beta", "1.0"]
    with pytest.raises(ValueError, match="router must be one of router1, router2, not 'r3'"):
        build_overrides("npu", router="r3")
    with pytest.raises(ValueError, match="placer_density must be above 0 and at most 1, not 0"):
        build_overrides("npu", placer_density=0)


@pytest.mark.parametrize("argv, message", [
    (["--clk-mhz", "fast"], "argument --clk-mhz: not a frequency in MHz: 'fast'"),
    (["--clk-mhz", "100.0000001"], "100.0000001 MHz is not a whole number of Hz"),
    (["--clk-mhz", "101"], ("--clk-mhz: clk_hz 101000000 from the ULX3S's oscillator: "
                            "f_out_hz 101000000 from f_in_hz 25000000: the nearest")),
    (["--clk-mhz", "500"], "10 MHz to 400 MHz"),
    (["--clk-mhz", "-5"], "--clk-mhz: clk_hz must be at least 1, not -5000000"),
    (["--clk-mhz", "40", "--baud", "3000000"], "cannot time the UART"),
    (["--baud", "3000000"], "cannot time the UART"),      # the default clock's check too
    (["--clk-mhz", "50", "--oscillator"], "not allowed with argument --clk-mhz"),
    (["--seed", "two"], "argument --seed: not a whole number: 'two'"),
    (["--seed", "1.5"], "argument --seed: not a whole number: '1.5'"),
    (["--seed", "-1"], "argument --seed: -1 is not from 0 to 2147483647"),
    (["--seed", "2147483648"], "2147483648 is not from 0 to 2147483647"),
    (["--router", "router3"], "argument --router: invalid choice: 'router3'"),
    (["--placer-density", "dense"], "argument --placer-density: not a number: 'dense'"),
    (["--placer-density", "0"], "argument --placer-density: 0 is not above 0 and at most 1"),
    (["--placer-density", "1.2"], "1.2 is not above 0 and at most 1"),
    (["--placer-density", "nan"], "nan is not above 0 and at most 1"),
])
def test_command_line_clock_errors(argv, message, capsys):
    from hw.board.board import parse_build_args
    with pytest.raises(SystemExit) as info:
        parse_build_args(argv)
    assert info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("argv, clock, clk_hz, nextpnr", [
    (["--oscillator"], "clock 25 MHz from the oscillator", OSC, {}),
    (["--clk-mhz", "100"], "clock 100 MHz (EHXPLLL 25 MHz / 1 * 4, VCO 600 MHz / 6)",
     100 * MHZ, {}),
    ([], "clock 40 MHz (EHXPLLL 25 MHz / 5 * 8, VCO 600 MHz / 15)", 40 * MHZ, {}),
    (["--seed", "3"], "VCO 600 MHz / 15), nextpnr seed 3;", 40 * MHZ, {"seed": 3}),
    (["--placer-density", "0.8", "--router", "router2"],
     "VCO 600 MHz / 15), nextpnr router router2, nextpnr placer density 0.8;", 40 * MHZ,
     {"router": "router2", "placer_density": 0.8}),
])
# The top main builds is handed to the stand-in for the build, which does not elaborate it.
@pytest.mark.filterwarnings("ignore::amaranth.hdl.UnusedElaboratable")
def test_main_banner_and_record(argv, clock, clk_hz, nextpnr, monkeypatch):
    """``main`` echoes the clock and records it in ``build.json``'s info (the build
    itself replaced: no tools run)."""
    import hw.board.flow
    from hw.board.board import main
    from hw.ecp5 import reset_logic_off_global
    for var in ("YOSYS", "NEXTPNR_ECP5", "ECPPACK", "OPENFPGALOADER"):
        monkeypatch.setenv(var, "true")
    calls = []
    seeds = []

    def fake_run_stages(platform, top, **kwargs):
        calls.append(top.pll)
        seeds.append(kwargs["overrides"]["nextpnr_opts"])
        # Only flip-flop LSR pins stay on the core reset's global line (hw.ecp5).
        assert kwargs["netlist_pass"] is reset_logic_off_global
        return kwargs["info"]

    monkeypatch.setattr(hw.board.flow, "run_stages", fake_run_stages)
    lines = []
    info = main(argv, out=lines.append)
    assert clock in lines[0], lines
    assert info["clk_hz"] == clk_hz
    for key in ("seed", "router", "placer_density"):
        assert info[key] == nextpnr.get(key)
    words = {"seed": "--seed", "router": "--router", "placer_density": "--placer-heap-beta"}
    assert seeds == [" ".join(["--report report.json"]
                              + [f"{words[k]} {v}" for k, v in nextpnr.items()])]
    (pll,) = calls
    if argv == ["--oscillator"]:
        assert "seed" not in lines[0]
        assert info["pll"] is None and pll is None
    else:
        assert (info["pll"]["clki_div"], info["pll"]["clkfb_div"]) == \
            {100 * MHZ: (1, 4), 40 * MHZ: (5, 8)}[clk_hz]
        assert info["pll"]["f_vco_hz"] == 600e6
        assert pll == pll_params(OSC, clk_hz)
    del info
    gc.collect()                 # the unused top goes here, under this test's filter
