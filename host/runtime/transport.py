"""Byte-stream transports between the host driver (``host.runtime.device``) and an NPU.

Every transport carries the same bytes (``host.spec.protocol`` frames); the driver does not
know which one it talks through. ``docs/protocol.md`` section 8.

* :class:`ModelTransport`: the reference model in this process, behind a
  ``host.runtime.server.ProtocolServer``; byte for byte the protocol a board speaks.
* :class:`SerialTransport`: a serial port (pyserial), for a board on USB-UART, or a
  pseudo-terminal whose other end runs a ``ProtocolServer`` (the tests, ``host.runtime.server.PtyServer``).
* more kinds from a registry: :func:`connect` looks a device string's kind up among the
  built-in kinds (``model``, ``serial``), those added with :func:`register_transport`, and
  the entry points of group :data:`ENTRY_POINT_GROUP` of the installed packages. The
  simulated board (``sim.board.SimTransport``: link and core under Verilator or Icarus)
  registers itself that way from ``sim`` (``pyproject.toml``), so ``host`` never names
  ``hw`` or ``sim``.
"""

from __future__ import annotations

import abc
import importlib.metadata

__all__ = ["Transport", "TransportError", "ModelTransport", "SerialTransport", "connect",
           "DEVICE_CHOICES", "DEFAULT_BAUDRATE", "ENTRY_POINT_GROUP", "register_transport",
           "transport_kinds", "device_choices"]

#: Baud rate of ``serial:PORT`` without ``@BAUD``.
DEFAULT_BAUDRATE = 115200

#: Entry-point group through which packages add device kinds: each entry point is named
#: after its kind and refers to a callable that takes the text after ``KIND:`` and returns
#: an open :class:`Transport` (raising ValueError for bad options).
ENTRY_POINT_GROUP = "bfp_npu.transports"

#: What :func:`connect` accepts of the built-in kinds, for messages and ``--help``.
DEVICE_CHOICES = ("model", "model:[PRESET,]KEY=VALUE,...", "serial:PORT[@BAUD]")


class TransportError(OSError):
    """The byte stream itself failed: a port that cannot be opened, a closed transport."""


class Transport(abc.ABC):
    """A bidirectional byte stream to one device.

    Subclasses implement :meth:`send`, :meth:`recv` and :meth:`close`; a transport is a
    context manager that closes itself.
    """

    #: Short description for messages (``"model"``, ``"serial:/dev/ttyUSB0@115200"``).
    name = "transport"

    @abc.abstractmethod
    def send(self, data: bytes) -> None:
        """Send all of ``data``.

        Raises
        ------
        TransportError
            when the transport is closed or the stream fails.
        """

    @abc.abstractmethod
    def recv(self, n: int, timeout: float) -> bytes:
        """Up to ``n`` bytes: at least one, unless ``timeout`` seconds pass with none
        (then ``b""``).

        Raises
        ------
        TransportError
            when the transport is closed or the stream fails.
        """

    @abc.abstractmethod
    def close(self) -> None:
        """Release the stream; further sends and receives raise TransportError."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"<{type(self).__name__} {self.name}>"


class ModelTransport(Transport):
    """The reference model in process, reached through the byte protocol.

    :meth:`send` feeds the bytes to a ``ProtocolServer`` at once, which executes complete
    requests and queues their replies for :meth:`recv`. When :meth:`recv` finds no reply
    waiting, the link is idle: the server's truncation timeout is taken to have passed
    (``ProtocolServer.idle``), so a half-sent frame is answered TRUNCATED exactly as a
    board would answer it; ``timeout`` is never waited for, nothing else could arrive.

    Parameters
    ----------
    backend : object, optional
        What the server executes against (default: a new ``NpuModel(config)``).
    config : NpuConfig, optional
        Build parameters of the default model (default ``NpuConfig()``).
    """

    def __init__(self, backend=None, *, config=None):
        from host.runtime.server import ProtocolServer
        if backend is None:
            from host.model.core import NpuConfig, NpuModel
            backend = NpuModel(config if config is not None else NpuConfig())
        elif config is not None:
            raise ValueError("give ModelTransport a backend or a config, not both")
        self.server = ProtocolServer(backend)
        self.name = "model"
        self._out = bytearray()
        self._closed = False

    @property
    def backend(self):
        return self.server.backend

    def _check_open(self):
        if self._closed:
            raise TransportError(f"{self.name} transport is closed")

    def send(self, data: bytes) -> None:
        self._check_open()
        self._out += self.server.feed(data)

    def recv(self, n: int, timeout: float) -> bytes:
        self._check_open()
        if not self._out:
            self._out += self.server.idle()
        chunk = bytes(self._out[:n])
        del self._out[:n]
        return chunk

    def close(self) -> None:
        self._closed = True


class SerialTransport(Transport):
    """A serial port through pyserial (8N1, no flow control unless ``rtscts``).

    :meth:`send` writes in slices and moves whatever has arrived meanwhile into its own
    buffer, so a device that answers while a long batch of requests is still going out
    never finds the host's receive buffer full (there is no flow control to stop it).

    Parameters
    ----------
    port : str
        Device path (``/dev/ttyUSB0``, a pseudo-terminal, ``COM3``) or a pyserial URL.
    baudrate : int
        Bits per second (default :data:`DEFAULT_BAUDRATE`; the board's UART is built for
        one rate).
    rtscts : bool
        Hardware flow control.

    Raises
    ------
    TransportError
        naming the port when it cannot be opened.
    ValueError
        when ``baudrate`` is not a positive integer.
    """

    _SLICE = 1024

    def __init__(self, port: str, baudrate: int = DEFAULT_BAUDRATE, *, rtscts: bool = False):
        import serial
        from host.spec.formats import check_int
        check_int("baudrate", baudrate, 1)
        self.name = f"serial:{port}@{baudrate}"
        self._rx = bytearray()
        try:
            self._serial = serial.serial_for_url(port, baudrate=baudrate, rtscts=rtscts,
                                                 timeout=0, write_timeout=None)
        except (serial.SerialException, OSError, ValueError) as exc:
            raise TransportError(f"cannot open serial port {port!r}: {exc}") from exc
        self._serial_error = serial.SerialException

    def _io(self, what, op):
        """``op(port)`` with the open pyserial port; errors become TransportError."""
        if self._serial is None:
            raise TransportError(f"{self.name} is closed")
        try:
            return op(self._serial)
        except (self._serial_error, OSError) as exc:
            raise TransportError(f"{self.name}: {what} failed: {exc}") from exc

    def _drain_input(self):
        waiting = self._io("read", lambda port: port.in_waiting)
        if waiting:
            self._rx += self._io("read", lambda port: port.read(waiting))

    def send(self, data: bytes) -> None:
        view = memoryview(data)
        for i in range(0, len(view), self._SLICE):
            self._io("write", lambda port: port.write(view[i:i + self._SLICE]))
            self._drain_input()
        self._io("flush", lambda port: port.flush())

    def recv(self, n: int, timeout: float) -> bytes:
        if not self._rx:
            self._drain_input()
        if not self._rx:
            def wait_for_one(port):
                port.timeout = timeout
                try:
                    return port.read(1)
                finally:
                    port.timeout = 0
            first = self._io("read", wait_for_one)
            if not first:
                return b""
            self._rx += first
            self._drain_input()
        chunk = bytes(self._rx[:n])
        del self._rx[:n]
        return chunk

    def close(self) -> None:
        if self._serial is not None:
            try:
                self._serial.close()
            finally:
                self._serial = None


_REGISTERED: dict = {}


def register_transport(kind: str, factory) -> None:
    """Add device kind ``kind``: ``connect(f"{kind}:{text}")`` returns ``factory(text)``.
    A kind registered here takes precedence over an entry point of the same name.

    Raises
    ------
    ValueError
        for a kind that is not an identifier or is built in.
    """
    if not isinstance(kind, str) or not kind.isidentifier():
        raise ValueError(f"kind must be an identifier, not {kind!r}")
    if kind in ("model", "serial"):
        raise ValueError(f"kind {kind!r} is built in")
    _REGISTERED[kind] = factory


def _entry_points() -> dict:
    return {ep.name: ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}


def transport_kinds() -> tuple[str, ...]:
    """Every device kind :func:`connect` knows: built in, registered, from entry points."""
    return ("model", "serial", *sorted(set(_REGISTERED) | set(_entry_points())))


def device_choices() -> str:
    extra = [f"{kind}[:OPTIONS]" for kind in transport_kinds()[2:]]
    return ", ".join([*DEVICE_CHOICES, *extra])


def connect(device: str) -> Transport:
    """Open a transport from a device string.

    ``"model"``: the reference model with the default build parameters;
    ``"model:n=32,tiles=4"``, ``"model:ulx3s"``: that build (``host.spec.config.parse_config``:
    a preset name and ``KEY=VALUE`` fields);
    ``"serial:PORT"`` or ``"serial:PORT@BAUD"``: a serial port;
    ``"KIND"`` or ``"KIND:OPTIONS"``: a kind from the registry (:func:`transport_kinds`),
    such as ``"sim:n=8,tiles=1,simulator=icarus"``, the simulated board that ``sim``
    registers.

    Raises
    ------
    ValueError
        for an unknown device string (the message lists the choices), a malformed option
        or baud rate, and a registered kind whose package cannot be imported (naming it).
    TransportError
        when a serial port cannot be opened or the simulator does not come up.
    """
    kind, _, rest = device.partition(":")
    choices = device_choices()
    if kind == "model":
        from host.spec.config import parse_config
        try:
            config = parse_config(rest)
        except ValueError as exc:
            raise ValueError(f"bad model option in {device!r}: {exc}") from None
        return ModelTransport(config=config)
    if kind == "serial":
        port, at, baud = rest.rpartition("@") if "@" in rest else (rest, "", "")
        if not port:
            raise ValueError(f"device {device!r} names no port; expected serial:PORT[@BAUD]")
        if at:
            if not baud.isdigit() or int(baud) <= 0:
                raise ValueError(f"baud rate {baud!r} in {device!r} is not a positive integer")
            return SerialTransport(port, int(baud))
        return SerialTransport(port)
    factory = _REGISTERED.get(kind)
    if factory is None:
        entry = _entry_points().get(kind) if kind else None
        if entry is None:
            raise ValueError(f"unknown device {device!r}; choose one of: {choices}")
        try:
            factory = entry.load()
        except ImportError as exc:
            raise ValueError(f"the {kind!r} device ({entry.value}) cannot be imported: "
                             f"{exc}") from None
    return factory(rest)
