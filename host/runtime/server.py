"""The device side of the host link in software: requests in, replies out.

:class:`ProtocolServer` executes ``host.spec.protocol`` requests against a backend with the
``host.model.core.NpuModel`` interface. It is what the model transport runs in process, what
the pseudo-terminal board stand-in (:class:`PtyServer`) runs behind a serial port, and
the behaviour the gateware's message processors must reproduce byte for byte
(``docs/protocol.md`` sections 5 and 6 list every check in the order made here).

Every request that is malformed, corrupted, truncated or out of range gets an error
reply and changes nothing in the backend; so does every request the backend refuses
(``NpuError``), whose code goes back with DEVICE_ERROR.
"""

from __future__ import annotations

import errno
import os
import select
import threading
import time
from collections import Counter

import numpy as np

from host.spec import protocol as p
from host.spec.isa import Space
from host.model.core import NpuError
from host.spec.protocol import Frame, FrameError, Opcode, Status

__all__ = ["ProtocolServer", "PtyServer", "HALTING_OPCODES", "BUSY_EXEMPT_OPCODES"]

#: Requests refused with DEVICE_ERROR (and the sticky code) while the device's error flag
#: is set: the ones that move data through a run. A stream of jobs thus stops at the
#: first failed job instead of running later jobs on a half-consumed input queue.
HALTING_OPCODES = frozenset({Opcode.PUSH_INPUT, Opcode.RUN, Opcode.POP_OUTPUT})

#: Requests a busy device still answers.
BUSY_EXEMPT_OPCODES = frozenset({Opcode.INFO, Opcode.STATUS, Opcode.READ_COUNTERS})



class _Reject(Exception):
    """A request refused with ``status`` (and, for DEVICE_ERROR, ``code``)."""

    def __init__(self, status: Status, code: int = 0, extra: bytes = b""):
        super().__init__(status)
        self.status = status
        self.code = code
        self.extra = extra


class ProtocolServer:
    """Executes protocol requests against ``backend``; see the module docstring.

    Parameters
    ----------
    backend : NpuModel or alike
        Needs ``config`` (``NpuConfig``), ``info()``, ``write``, ``read``,
        ``load_program``, ``push_input``, ``pop_output``, ``input_level``,
        ``output_level``, ``run()``, ``counters()``, ``clear_counters()``, ``error``,
        ``clear_error()`` and ``reset()``; it refuses requests by raising
        ``host.model.core.NpuError`` (other exceptions are bugs and propagate). An optional ``busy``
        attribute, true while a program runs asynchronously, makes requests other than
        :data:`BUSY_EXEMPT_OPCODES` answer BUSY.

    Attributes
    ----------
    stats : collections.Counter
        ``"frames"`` taken, ``"replies"`` sent, one count per reply status name, and
        ``"skipped"`` bytes (garbage) of the decoder.
    """

    def __init__(self, backend):
        self.backend = backend
        self.config = backend.config
        self.stats = Counter()
        self._decoder = p.FrameDecoder()
        self._staged = bytearray()       # LOAD_PROGRAM words received so far
        self._staged_total = 0
        self._handlers = {
            Opcode.INFO: self._info, Opcode.WRITE: self._write, Opcode.READ: self._read,
            Opcode.LOAD_PROGRAM: self._load_program, Opcode.PUSH_INPUT: self._push_input,
            Opcode.RUN: self._run, Opcode.POP_OUTPUT: self._pop_output,
            Opcode.READ_COUNTERS: self._read_counters,
            Opcode.CLEAR_COUNTERS: self._clear_counters, Opcode.RESET: self._reset,
            Opcode.STATUS: self._status, Opcode.CLEAR_ERROR: self._clear_error,
        }

    # --- byte stream ---------------------------------------------------------------------

    def feed(self, data) -> bytes:
        """Take request bytes; return the reply bytes of every request they complete."""
        return self._answer(self._decoder.feed(data))

    def idle(self) -> bytes:
        """The link has been quiet for ``TRUNCATE_TIMEOUT``: answer an incomplete frame
        TRUNCATED and drop what cannot start one; returns the reply bytes."""
        return self._answer(self._decoder.flush())

    @property
    def pending(self) -> int:
        """Bytes received that do not yet form a complete frame."""
        return self._decoder.pending

    def _answer(self, events) -> bytes:
        replies = []
        for event in events:
            if isinstance(event, FrameError):
                reply = p.encode_reply(event.opcode, event.tag, event.status)
            else:
                self.stats["frames"] += 1
                reply = self.handle(event)
            self.stats[Status(reply[p.HEADER_BYTES]).name] += 1
            replies.append(reply)
        self.stats["replies"] += len(replies)
        self.stats["skipped"] = self._decoder.skipped
        return b"".join(replies)

    # --- requests ------------------------------------------------------------------------

    def handle(self, frame: Frame) -> bytes:
        """Execute one well-formed frame; returns its reply frame."""
        try:
            opcode = Opcode(frame.opcode)
        except ValueError:
            return p.encode_reply(frame.opcode, frame.tag, Status.UNKNOWN_OPCODE)
        try:
            if opcode not in BUSY_EXEMPT_OPCODES and getattr(self.backend, "busy", False):
                raise _Reject(Status.BUSY)
            body = self._handlers[opcode](frame.payload)
        except _Reject as r:
            body = bytes((r.code,)) + r.extra if r.status is Status.DEVICE_ERROR else b""
            return p.encode_reply(frame.opcode, frame.tag, r.status, body)
        return p.encode_reply(frame.opcode, frame.tag, Status.OK, body)

    def _call(self, fn, *args):
        """Run a backend operation; an ``NpuError`` becomes a DEVICE_ERROR reply."""
        try:
            return fn(*args)
        except NpuError as exc:
            raise _Reject(Status.DEVICE_ERROR, exc.code.value) from None

    def _empty(self, payload):
        if payload:
            raise _Reject(Status.BAD_LENGTH)

    def _not_halted(self):
        code = self.backend.error
        if code.value:
            raise _Reject(Status.DEVICE_ERROR, code.value)

    def _access(self, payload, with_data: bool):
        """Checks shared by WRITE and READ, in the documented order; returns
        ``(space, addr, count, word_bytes)``."""
        if len(payload) < p.ACCESS_LAYOUT.size // 8 or (not with_data and len(payload) != 8):
            raise _Reject(Status.BAD_LENGTH)
        space, addr, count = p.unpack_access(payload)
        depth = p.space_depth(self.config, space)
        if depth is None:
            raise _Reject(Status.BAD_SPACE)
        size = p.word_bytes(self.config, space)
        if count == 0 or (not with_data and 1 + count * size > p.MAX_PAYLOAD):
            raise _Reject(Status.BAD_COUNT)
        if with_data and len(payload) != 8 + count * size:
            raise _Reject(Status.BAD_LENGTH)
        if addr + count > depth:
            raise _Reject(Status.BAD_ADDRESS)
        return space, addr, count, size

    def _info(self, payload):
        self._empty(payload)
        return p.pack_info(p.info_entries(self.backend.config))

    def _write(self, payload):
        space, addr, count, size = self._access(payload, with_data=True)
        raw = payload[8:]
        if space == Space.MRF.value:
            data = p.bytes_to_words(raw, size)
        else:
            data = p.bytes_to_vectors(raw, self.config.n)
        self._call(self.backend.write, Space(space), addr, data)
        return b""

    def _read(self, payload):
        space, addr, count, size = self._access(payload, with_data=False)
        got = self._call(self.backend.read, Space(space), addr, count)
        if space == Space.MRF.value:
            return p.words_to_bytes(got, size)
        return p.vectors_to_bytes(got)

    def _load_program(self, payload):
        if len(payload) < p.PROGRAM_LAYOUT.size // 8 or len(payload) % 8:
            raise _Reject(Status.BAD_LENGTH)
        offset, total, words = p.unpack_program_chunk(payload)
        if not words or not 1 <= total <= self.config.program_depth:
            raise _Reject(Status.BAD_COUNT)
        staged = 0 if offset == 0 else len(self._staged) // 8
        if (offset != staged or (offset and total != self._staged_total)
                or offset + len(words) // 8 > total):
            raise _Reject(Status.BAD_ADDRESS)
        if offset + len(words) // 8 < total:
            if offset == 0:
                self._staged = bytearray()
                self._staged_total = total
            self._staged += words
            return b""
        program = p.bytes_to_program(bytes(self._staged[:offset * 8]) + words)
        self._call(self.backend.load_program, program)
        self._staged = bytearray()          # only once loaded: a refused chunk changes nothing
        return b""

    def _push_input(self, payload):
        width = 2 * self.config.n
        if not payload or len(payload) % width:
            raise _Reject(Status.BAD_LENGTH)
        self._not_halted()
        count = len(payload) // width
        if self.backend.input_level + count > self.config.netq_depth:
            raise _Reject(Status.QUEUE_FULL)
        self._call(self.backend.push_input, p.bytes_to_vectors(payload, self.config.n))
        return b""

    def _run(self, payload):
        self._empty(payload)
        self._not_halted()
        result = self._call(self.backend.run)
        entries = p.pack_entries(_run_entries(result))
        code = result.error.value
        if code:
            raise _Reject(Status.DEVICE_ERROR, code, entries)
        return entries

    def _pop_output(self, payload):
        if len(payload) != p.POP_LAYOUT.size // 8:
            raise _Reject(Status.BAD_LENGTH)
        self._not_halted()
        count = p.unpack_pop(payload)
        if count == 0 or 1 + count * 2 * self.config.n > p.MAX_PAYLOAD:
            raise _Reject(Status.BAD_COUNT)
        if self.backend.output_level < count:
            raise _Reject(Status.QUEUE_EMPTY)
        return p.vectors_to_bytes(self._call(self.backend.pop_output, count))

    def _read_counters(self, payload):
        self._empty(payload)
        return p.pack_entries(self.backend.counters())

    def _clear_counters(self, payload):
        self._empty(payload)
        self.backend.clear_counters()
        return b""

    def _reset(self, payload):
        self._empty(payload)
        self.backend.reset()
        self._staged = bytearray()
        return b""

    def _status(self, payload):
        self._empty(payload)
        return p.pack_status(self.backend.error.value, getattr(self.backend, "busy", False),
                             self.backend.input_level, self.backend.output_level)

    def _clear_error(self, payload):
        self._empty(payload)
        self.backend.clear_error()
        return b""


def _run_entries(result) -> dict[str, int]:
    """The RUN reply entries: the integer fields of the backend's run result, by name."""
    if hasattr(result, "_asdict"):
        fields = result._asdict()
    elif hasattr(result, "__dataclass_fields__"):
        fields = {name: getattr(result, name) for name in result.__dataclass_fields__}
    else:
        fields = dict(result)
    return {name: int(value) for name, value in fields.items()
            if isinstance(value, (int, np.integer)) and not isinstance(value, bool)}


class PtyServer:
    """A board stand-in: a :class:`ProtocolServer` on the far end of a pseudo-terminal.

    ``port`` is the path of the terminal side; open it with ``SerialTransport(port)``
    (or ``npu --device serial:PORT``) and the real serial code path talks to the server,
    which runs in a thread. The thread reads and writes the pty master without blocking
    (replies wait in its own buffer), so the host may send a long batch without reading,
    and calls :meth:`ProtocolServer.idle` after ``TRUNCATE_TIMEOUT`` of silence inside a
    frame. POSIX only. Use as a context manager, or :meth:`start` and :meth:`stop`.

    Parameters
    ----------
    server : ProtocolServer
    """

    def __init__(self, server: ProtocolServer):
        self.server = server
        self.port = None
        self._master = self._slave = None
        self._thread = None
        self._stop = threading.Event()
        self.error = None            # an exception that ended the thread, for the tests

    def start(self) -> "PtyServer":
        import tty
        self._master, self._slave = os.openpty()
        tty.setraw(self._slave)      # no line discipline: bytes pass unchanged
        os.set_blocking(self._master, False)
        self.port = os.ttyname(self._slave)
        self._stop.clear()
        self._thread = threading.Thread(target=self._serve, name="pty-server", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread and close both ends; re-raises an exception that ended it."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        for fd in (self._master, self._slave):
            if fd is not None:
                os.close(fd)
        self._master = self._slave = None
        if self.error is not None:
            raise self.error

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def _serve(self):
        out = bytearray()
        last = time.monotonic()
        try:
            while not self._stop.is_set():
                wlist = [self._master] if out else []
                readable, writable, _ = select.select([self._master], wlist, [], 0.01)
                data = b""
                if readable:
                    try:
                        data = os.read(self._master, 65536)
                    except BlockingIOError:
                        pass
                    except OSError as exc:       # EIO: no process has the terminal open
                        if exc.errno != errno.EIO:
                            raise
                        time.sleep(0.01)
                if data:
                    last = time.monotonic()
                    out += self.server.feed(data)
                elif (self.server.pending
                      and time.monotonic() - last >= p.TRUNCATE_TIMEOUT):
                    out += self.server.idle()
                if writable and out:
                    try:
                        sent = os.write(self._master, out)
                    except BlockingIOError:
                        sent = 0
                    del out[:sent]
        except BaseException as exc:           # surfaced by stop()
            self.error = exc
