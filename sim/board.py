"""The simulated board: ``hw.board.board.SimBoard`` under an HDL simulator behind a socket.

Two halves in one module:

* :class:`SimTransport`, a ``host.runtime.transport.Transport``: it listens on a Unix socket,
  starts ``python -m sim.board`` in a subprocess (which builds the board with
  ``sim.runner.run_cocotb``, cached per build, and runs this module's cocotb test
  :func:`serve`) and carries the protocol's bytes over the socket.
  ``host.runtime.transport.connect("sim[:KEY=VALUE,...]")`` imports it lazily, so ``host``
  keeps not importing ``sim`` (``docs/link-hw.md``, section "simulated board").
* :func:`serve`, the cocotb side: bytes from the socket go into the board's ``rx``
  stream, bytes from ``tx`` go back. Simulated time only advances while there is work
  (bytes to take, a request executing, a reply going out); when the board waits for
  bytes the bridge blocks on the socket instead. If the board holds part of a frame and
  nothing arrives for ``host.spec.protocol.TRUNCATE_TIMEOUT`` of wall time, the bridge runs
  the clock past the board's truncation timeout, so a half-sent frame is answered
  TRUNCATED as a board on a serial line answers it.

Options of ``sim:``: the ``NpuConfig`` fields as integers, and ``simulator=icarus``
(default verilator).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import select
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from host.spec.config import NpuConfig
from host.spec.protocol import TRUNCATE_TIMEOUT
from host.runtime.transport import Transport, TransportError

__all__ = ["SimTransport", "serve", "SIM_TRUNCATE_CYCLES", "board_name", "run_board",
           "FAST_BUILD_FLAGS", "SMALL_CONFIG"]

#: The simulated board's truncation timeout, in clock cycles (the bridge lets this much
#: simulated time pass when the host has been silent for TRUNCATE_TIMEOUT mid-frame).
SIM_TRUNCATE_CYCLES = 4096
#: Clock cycles the bridge runs between looks at the socket; well under the timeout, so
#: the board never times out while the host's bytes are still on their way.
_SLICE = 256
_PERIOD_NS = 10
#: The small board the tests and the bench simulate (N = 8, T = 1, the core bench's
#: ``n8t1`` memories): ``tests/hw/test_link_hw.py``, the simulated-board LSTM test of
#: ``tests/runtime/test_device.py`` and ``bench.link`` use it, so they share one cached build.
SMALL_CONFIG = NpuConfig(n=8, tiles=1, mrf_depth=128, max_col_tiles=16, ivrf_depth=64,
                         vrf_depth=32, netq_depth=64, program_depth=512, max_length=4)
_REPO_ROOT = Path(__file__).resolve().parent.parent


def board_name(config: NpuConfig) -> str:
    """Build name of the simulated board of ``config`` (``build/sim/<name>``)."""
    return "simboard_" + hashlib.sha256(config.to_json().encode()).hexdigest()[:12]


#: The Verilated model's optimisation. Link plus core is ~9 MB of Verilog, and the model
#: itself, not the cocotb side, sets the simulation speed (measured on the loaded
#: development machine: ``-Os``, the default, ~45 min to build, ~1,060 cycles/s;
#: ``-O0``, as the core's bench uses, ~1.5 min of CPU to build but ~200 cycles/s;
#: ``-O1``, ~6.5 min of CPU and ~1,300 cycles/s). The tests on this board run a few
#: hundred thousand cycles, so ``-O1`` costs the least in all.
FAST_BUILD_FLAGS = "OPT_FAST=-O1"


def run_board(config: NpuConfig, *, test_module: str, simulator: str = "verilator",
              testcase: str | None = None, extra_env: dict | None = None) -> None:
    """Build (cached) and simulate the simulated board of ``config`` with cocotb tests
    ``test_module``: ``SimBoard(config, truncate_cycles=SIM_TRUNCATE_CYCLES)`` named
    :func:`board_name`, so the transport and the link bench (``tests/hw/test_link_hw.py``)
    share one build per configuration and simulator. Verilator builds at ``-O1``
    (:data:`FAST_BUILD_FLAGS`) unless ``MAKEFLAGS`` already sets ``OPT_FAST``.

    Raises what :func:`sim.runner.run_cocotb` raises.
    """
    from hw.board.board import SimBoard
    from sim.runner import run_cocotb

    flags = os.environ.get("MAKEFLAGS", "")
    saved = os.environ.get("MAKEFLAGS")
    if "OPT_FAST" not in flags:
        os.environ["MAKEFLAGS"] = f"{flags} {FAST_BUILD_FLAGS}".strip()
    try:
        run_cocotb(name=board_name(config),
                   component=SimBoard(config, truncate_cycles=SIM_TRUNCATE_CYCLES),
                   test_module=test_module, simulator=simulator, testcase=testcase,
                   extra_env=extra_env)
    finally:
        if saved is None:
            os.environ.pop("MAKEFLAGS", None)
        else:
            os.environ["MAKEFLAGS"] = saved


class _Starting:
    """What :class:`SimTransport` says while the simulator builds and starts."""

    INTERVAL_S = 10.0

    def __init__(self, config, simulator, log_path, stream):
        self.stream = sys.stderr if stream is True else stream
        self.log_path = log_path
        self.start = self.last = time.monotonic()
        if self.stream is not None:
            self._say(f"starting the simulated board ({simulator}, n={config.n}, "
                      f"tiles={config.tiles}); a first build takes minutes, later starts "
                      f"reuse it")

    def _say(self, text):
        self.stream.write(f"sim: {text}\n")
        self.stream.flush()

    def tick(self):
        now = time.monotonic()
        if self.stream is None or now - self.last < self.INTERVAL_S:
            return
        self.last = now
        try:
            lines = Path(self.log_path).read_text(errors="replace").splitlines()
        except OSError:
            lines = []
        last = next((line.strip() for line in reversed(lines) if line.strip()), "")
        self._say(f"{now - self.start:.0f} s" + (f": {last[:100]}" if last else ""))

    def done(self):
        if self.stream is not None:
            self._say(f"up after {time.monotonic() - self.start:.1f} s")


class SimTransport(Transport):
    """The simulated board as a transport (see the module docstring).

    Parameters
    ----------
    config : NpuConfig, optional
        Build parameters (default ``NpuConfig()``).
    simulator : str
        ``"verilator"`` (default) or ``"icarus"``.
    start_timeout : float
        Seconds to wait for the simulator to build and connect (a first Verilator build
        of a large configuration takes minutes; later starts reuse it).

    Raises
    ------
    ValueError
        for an unknown simulator.
    TransportError
        when the simulator does not come up; the message ends with its log.
    """

    def __init__(self, config: NpuConfig | None = None, *, simulator: str = "verilator",
                 start_timeout: float = 3600.0, progress=None):
        if simulator not in ("verilator", "icarus"):
            raise ValueError(f"simulator must be 'verilator' or 'icarus', not {simulator!r}")
        self.config = config if config is not None else NpuConfig()
        self.name = f"sim:{simulator}"
        self._dir = tempfile.TemporaryDirectory(prefix="npu-sim-")
        path = os.path.join(self._dir.name, "link")
        self._log_path = os.path.join(self._dir.name, "sim.log")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(path)
        listener.listen(1)
        self._log = open(self._log_path, "wb")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            filter(None, [str(_REPO_ROOT), os.environ.get("PYTHONPATH")]))}
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "sim.board", "--socket", path, "--simulator", simulator,
             "--config", self.config.to_json()],
            cwd=_REPO_ROOT, stdout=self._log, stderr=subprocess.STDOUT, env=env)
        self._sock = None
        say = _Starting(self.config, simulator, self._log_path, progress)
        try:
            deadline = time.monotonic() + start_timeout
            while self._sock is None:
                say.tick()
                if self._proc.poll() is not None:
                    raise TransportError(f"the simulator exited ({self._proc.returncode}) "
                                         f"before connecting:\n{self._log_tail()}")
                if time.monotonic() > deadline:
                    raise TransportError(f"the simulator did not connect within "
                                         f"{start_timeout} s:\n{self._log_tail()}")
                ready, _, _ = select.select([listener], [], [], 0.5)
                if ready:
                    self._sock, _ = listener.accept()
            say.done()
        except BaseException:
            self._stop()
            raise
        finally:
            listener.close()

    def _log_tail(self, lines=30) -> str:
        self._log.flush()
        text = Path(self._log_path).read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    def _check_open(self):
        if self._sock is None:
            raise TransportError(f"{self.name} transport is closed")

    def send(self, data: bytes) -> None:
        self._check_open()
        try:
            self._sock.sendall(data)
        except OSError as exc:
            raise TransportError(f"{self.name}: send failed: {exc}\n{self._log_tail()}") \
                from exc

    def recv(self, n: int, timeout: float) -> bytes:
        self._check_open()
        ready, _, _ = select.select([self._sock], [], [], timeout)
        if not ready:
            return b""
        data = self._sock.recv(n)
        if not data:
            raise TransportError(f"{self.name}: the simulator closed the link:\n"
                                 f"{self._log_tail()}")
        return data

    def _stop(self):
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._proc.poll() is None:
            try:
                self._proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._log.close()
        self._dir.cleanup()

    def close(self) -> None:
        if self._sock is not None or self._proc.poll() is None:
            self._stop()

    @classmethod
    def from_options(cls, text: str) -> "SimTransport":
        """The transport of ``connect("sim:" + text)``: a build as
        ``host.spec.config.parse_config`` takes it (a preset, ``KEY=VALUE`` fields) and
        ``simulator=verilator|icarus``.

        Raises
        ------
        ValueError
            naming a malformed item or a field ``NpuConfig`` refuses.
        """
        from host.spec.config import parse_config
        simulator, rest = "verilator", []
        for item in filter(None, text.split(",")):
            key, sep, value = item.partition("=")
            if key == "simulator" and sep:
                simulator = value
            else:
                rest.append(item)
        try:
            config = parse_config(",".join(rest))
        except ValueError as exc:
            raise ValueError(f"bad sim option: {exc}") from None
        return cls(config, simulator=simulator, progress=True)


# --- the simulator side ---------------------------------------------------------------------

def _main(argv=None):
    """``python -m sim.board --socket PATH --config JSON [--simulator S]``: build and run
    the board, serving the socket (started by :class:`SimTransport`)."""
    parser = argparse.ArgumentParser(prog="python -m sim.board")
    parser.add_argument("--socket", required=True)
    parser.add_argument("--config", required=True)
    parser.add_argument("--simulator", default="verilator")
    args = parser.parse_args(argv)
    config = NpuConfig.from_json(args.config)
    run_board(config, test_module="sim.board", simulator=args.simulator,
              extra_env={"NPU_SIM_SOCKET": args.socket,
                         "NPU_SIM_TRUNCATE": str(SIM_TRUNCATE_CYCLES)})


try:
    import cocotb
except ImportError:                 # the transport half works without cocotb
    cocotb = None


if cocotb is not None:
    @cocotb.test()
    async def serve(dut):
        """Bridge the board's byte streams to ``$NPU_SIM_SOCKET`` until it closes."""
        from cocotb.clock import Clock
        from cocotb.triggers import ClockCycles

        from sim.stream import StreamMonitor, StreamSink, StreamSource, stream_signals

        truncate = int(os.environ["NPU_SIM_TRUNCATE"])
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(os.environ["NPU_SIM_SOCKET"])
        sock.setblocking(False)
        cocotb.start_soon(Clock(dut.clk, _PERIOD_NS, unit="ns").start())
        dut.rst.value = 1
        dut.rx__valid.value = 0
        await ClockCycles(dut.clk, 3)
        dut.rst.value = 0
        await ClockCycles(dut.clk, 2)          # the link's START state
        src = StreamSource(dut.clk, *stream_signals(dut, "rx"))
        StreamSink(dut.clk, dut.tx__ready)
        mon = StreamMonitor(dut.clk, *stream_signals(dut, "tx"), name="tx")

        def take(block):
            """Bytes from the host into the source; False once the host has closed."""
            if block is not False:
                select.select([sock], [], [], block)
            try:
                data = sock.recv(1 << 16)
            except BlockingIOError:
                return True
            if not data:
                return False
            src.send(list(data))
            return True

        open_ = True
        while open_:
            open_ = take(False)
            await ClockCycles(dut.clk, _SLICE)
            out = bytes(mon.items)
            if out:
                mon.items.clear()
                mon.cycles.clear()
                sock.setblocking(True)
                sock.sendall(out)
                sock.setblocking(False)
            elif src.idle and dut.waiting.value:
                if not dut.partial.value:
                    open_ = take(None)          # nothing to do until the host sends
                else:
                    ready, _, _ = select.select([sock], [], [], TRUNCATE_TIMEOUT)
                    if not ready:               # the host went quiet inside a frame
                        await ClockCycles(dut.clk, truncate + 8)
        sock.close()


if __name__ == "__main__":
    _main()
