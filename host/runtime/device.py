"""One device API over every transport: :class:`Device`, streaming jobs.

``Device(transport)`` speaks ``host.spec.protocol`` through a ``host.runtime.transport.Transport`` and
offers the reference model's interface (``host.model.core.NpuModel``): ``info``, ``write``,
``read``, ``load_program``, ``push_input``, ``run``, ``pop_output``, ``counters``,
``clear_counters``, ``reset``, ``error``, ``clear_error``. Transfers larger than one
frame are split into frames and pipelined; refusals raise :class:`DeviceError` saying
what was refused and why. :meth:`Device.stream` runs many jobs through a loaded network
with a bounded window of runs in flight; :meth:`Device.load_image` loads a compiled network
(``host.spec.image.NetworkImage``). ``docs/protocol.md`` sections 7 to 10.
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass

import numpy as np

from host.spec import protocol as p
from host.spec.isa import ErrorCode, Space
from host.numerics.mvm import fp16_bits
from host.runtime.progress import Progress
from host.spec.formats import check_int
from host.spec.protocol import FrameError, Opcode, Status

__all__ = ["Device", "DeviceError", "LinkError", "StreamError",
           "STATUS_TEXT"]

#: What each refusal means, for messages.
STATUS_TEXT = {
    Status.BAD_CRC: "the request arrived corrupted (payload CRC mismatch)",
    Status.BAD_LENGTH: "its payload length is not what the opcode needs",
    Status.UNKNOWN_OPCODE: "the device does not know the opcode",
    Status.TRUNCATED: "the request arrived incomplete",
    Status.BAD_SPACE: "no such memory space in this build",
    Status.BAD_ADDRESS: "the address range is outside the memory",
    Status.BAD_COUNT: "the count is zero or too large for one frame",
    Status.DEVICE_ERROR: "the device reported an error",
    Status.QUEUE_EMPTY: "the output queue holds fewer vectors than asked for",
    Status.QUEUE_FULL: "the input queue has no room for them",
    Status.BUSY: "the device is busy running a program",
}


class DeviceError(Exception):
    """The device refused a request.

    Attributes
    ----------
    status : Status or None
        The reply's status (None for a :class:`LinkError`).
    opcode : Opcode or None
        The refused request.
    error : ErrorCode or None
        The device's error code for DEVICE_ERROR.
    details : dict
        Entries the reply carried (a failed RUN: ``pc``, ``instructions``, ...).
    """

    def __init__(self, message: str, *, status=None, opcode=None, error=None, details=None):
        super().__init__(message)
        self.status = status
        self.opcode = opcode
        self.error = error
        self.details = dict(details or {})


class LinkError(DeviceError):
    """The link failed: no reply in time, a reply corrupted on the way back, a reply lost.

    Whether the request was executed cannot be known; the device's STATUS tells.
    """


class StreamError(DeviceError):
    """A job of :meth:`Device.stream` failed.

    Attributes
    ----------
    job : int
        Index of the failed job. The results of jobs ``0 .. job-1`` were all yielded, in
        order; nothing of ``job`` or later was.
    in_flight : list of int
        Later jobs already sent when the failure was seen; the device refuses their runs
        while its error flag is set (``host.runtime.server.HALTING_OPCODES``), see ``ran``.
    ran : list of int
        Those of ``in_flight`` whose run nevertheless succeeded (only possible after a
        failure that sets no device error, such as QUEUE_FULL); their outputs were popped
        and dropped.
    cause : DeviceError
        The refusal that ended the stream.
    """

    def __init__(self, message, *, job, in_flight, ran, cause):
        super().__init__(message, status=cause.status, opcode=cause.opcode, error=cause.error,
                         details=cause.details)
        self.job = job
        self.in_flight = list(in_flight)
        self.ran = list(ran)
        self.cause = cause


@dataclass
class _Pending:
    tag: int
    opcode: Opcode
    what: str


class Device:
    """An NPU behind a transport, with the reference model's interface.

    Parameters
    ----------
    transport : host.runtime.transport.Transport
    timeout : float
        Seconds to wait for each reply (default 10).
    retries : int
        Times a request is sent again when the device answers BAD_CRC or TRUNCATED (it
        was corrupted on the way and not executed), 0 to 10 (default 2): single requests,
        and the frames of WRITE and READ transfers. The frames of other transfers
        (program chunks, queue data) and of :meth:`stream` are never resent, since their
        order matters.
    window : int
        Frames of one transfer sent ahead of their replies, 1 to 64 (default 8).

    Raises
    ------
    TypeError, ValueError
        naming a parameter out of range.
    """

    def __init__(self, transport, *, timeout: float = 10.0, retries: int = 2, window: int = 8):
        if not timeout > 0:
            raise ValueError(f"timeout must be positive, not {timeout!r}")
        self.transport = transport
        self.timeout = float(timeout)
        self.retries = check_int("retries", retries, 0, 10)
        self.window = check_int("window", window, 1, 64)
        self._decoder = p.FrameDecoder()
        self._events = collections.deque()
        self._outstanding = collections.deque()
        self._tag = 0
        self._info = None
        self._config = None

    @classmethod
    def open(cls, device: str, **kwargs) -> "Device":
        """``Device(connect(device), **kwargs)``; see ``host.runtime.transport.connect``."""
        from host.runtime.transport import connect
        return cls(connect(device), **kwargs)

    def close(self) -> None:
        self.transport.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"<Device on {self.transport.name}>"

    # --- requests and replies ------------------------------------------------------------

    def _send(self, opcode: Opcode, payload=b"", what: str = "") -> _Pending:
        tag = self._tag
        self._tag = (self._tag + 1) & 0xFF
        pending = _Pending(tag, opcode, what or opcode.name)
        self._outstanding.append(pending)
        self.transport.send(p.encode_frame(opcode, tag, payload))
        return pending

    def _next_event(self, deadline: float):
        while not self._events:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            data = self.transport.recv(65536, left)
            if data:
                self._events.extend(self._decoder.feed(data))
        return self._events.popleft()

    def _receive(self, pending: _Pending) -> tuple[Status, bytes]:
        """The reply to ``pending`` (the oldest outstanding request): its status and body.

        Raises
        ------
        LinkError
            no reply within ``timeout``, a corrupted reply, or a later request's reply
            first (this one was lost); every outstanding request is abandoned then.
        """
        assert self._outstanding and self._outstanding[0] is pending
        deadline = time.monotonic() + self.timeout
        while True:
            event = self._next_event(deadline)
            if event is None:
                self._abandon()
                raise LinkError(f"no reply to {pending.what} within {self.timeout:g} s "
                                f"from {self.transport.name}", opcode=pending.opcode)
            tags = [q.tag for q in self._outstanding]
            if event.tag not in tags or not event.opcode & p.REPLY:
                continue                   # a reply to an abandoned request, or an echo
            if event.tag != pending.tag:
                self._abandon()
                raise LinkError(f"the reply to {pending.what} was lost on the link "
                                f"(a reply to a later request came first)",
                                opcode=pending.opcode)
            if isinstance(event, FrameError):
                self._abandon()
                raise LinkError(f"the reply to {pending.what} arrived damaged "
                                f"({event.status.name}); the request may have been executed",
                                opcode=pending.opcode)
            self._outstanding.popleft()
            if event.opcode != pending.opcode.value | p.REPLY or not event.payload:
                self._abandon()
                raise LinkError(f"malformed reply to {pending.what}: opcode "
                                f"{event.opcode:#04x}, {len(event.payload)} bytes",
                                opcode=pending.opcode)
            try:
                status = Status(event.payload[0])
            except ValueError:
                raise LinkError(f"reply to {pending.what} has unknown status "
                                f"{event.payload[0]}", opcode=pending.opcode) from None
            return status, event.payload[1:]

    def _abandon(self):
        self._outstanding.clear()
        self._events.clear()

    def _refusal(self, pending: _Pending, status: Status, body: bytes) -> DeviceError:
        error, details, text = None, {}, STATUS_TEXT[status]
        if status is Status.DEVICE_ERROR and body:
            try:
                error = ErrorCode(body[0])
            except ValueError:
                error = body[0]
            name = getattr(error, "name", f"code {error}")
            try:
                details = p.unpack_entries(body[1:])
            except ValueError:
                details = {}
            text = f"device error {name}"
            if "pc" in details:
                text += f" at instruction {details['pc']}"
            if pending.opcode in (Opcode.PUSH_INPUT, Opcode.RUN, Opcode.POP_OUTPUT):
                text += " (the error flag is set: read it with .error, clear_error() " \
                        "to go on)"
        return DeviceError(f"{pending.what} refused: {status.name}: {text}", status=status,
                           opcode=pending.opcode, error=error, details=details)

    def _request(self, opcode: Opcode, payload=b"", what: str = "") -> bytes:
        """Send one request and wait for its reply; returns the reply body.

        Raises
        ------
        DeviceError
            the device refused it (after ``retries`` resends for BAD_CRC/TRUNCATED).
        LinkError
            see :meth:`_receive`.
        """
        for attempt in range(self.retries + 1):
            pending = self._send(opcode, payload, what)
            status, body = self._receive(pending)
            if status is Status.OK:
                return body
            if status not in (Status.BAD_CRC, Status.TRUNCATED) or attempt == self.retries:
                raise self._refusal(pending, status, body)

    def _transfer(self, requests) -> list[bytes]:
        """Send ``(opcode, payload, what)`` requests with up to ``window`` in flight;
        returns the reply bodies in order. WRITE and READ frames the device received
        corrupted are sent again (up to ``retries`` times; their order does not matter).
        On the first refusal the replies still due are read, then the refusal is raised.
        """
        requests = list(requests)
        bodies = [None] * len(requests)
        queue = collections.deque(range(len(requests)))
        attempts = collections.Counter()
        inflight = collections.deque()
        failure = None
        while True:
            while failure is None and queue and len(inflight) < self.window:
                i = queue.popleft()
                inflight.append((i, self._send(*requests[i])))
            if not inflight:
                break
            i, pending = inflight.popleft()
            status, body = self._receive(pending)
            if status is Status.OK:
                bodies[i] = body
            elif failure is None:
                if (status in (Status.BAD_CRC, Status.TRUNCATED)
                        and pending.opcode in (Opcode.WRITE, Opcode.READ)
                        and attempts[i] < self.retries):
                    attempts[i] += 1
                    queue.appendleft(i)
                else:
                    failure = self._refusal(pending, status, body)
        if failure is not None:
            raise failure
        return bodies

    # --- device information ----------------------------------------------------------------

    def info(self) -> dict:
        """Protocol version, ``max_payload``, the build parameters (as ``NpuModel.info``:
        ``unary_ops`` by name, ``unit_sets`` as each MFU's unit names, ``lanes`` also where
        the device does not send it, ``lanes = n``) and derived sizes.
        Cached after the first call."""
        if self._info is None:
            entries = p.unpack_info(self._request(Opcode.INFO))
            if entries["protocol_version"] != p.PROTOCOL_VERSION:
                raise LinkError(f"device speaks protocol version "
                                f"{entries['protocol_version']}, this host "
                                f"{p.PROTOCOL_VERSION}", opcode=Opcode.INFO)
            self._config = p.config_from_entries(entries)
            entries["unary_ops"] = [op.name.lower() for op in self._config.unary_ops]
            entries["unit_sets"] = p.unit_sets_info(self._config)
            entries[p.LANES_ENTRY] = self._config.lanes
            self._info = entries
        return dict(self._info)

    @property
    def config(self):
        """The device's ``NpuConfig`` (from INFO)."""
        if self._config is None:
            self.info()
        return self._config

    def status(self) -> dict:
        """``{"error": ErrorCode, "busy": bool, "input_level": int, "output_level": int}``."""
        status = p.unpack_status(self._request(Opcode.STATUS))
        try:
            status["error"] = ErrorCode(status["error"])
        except ValueError:
            pass                              # an unknown code stays an int
        return status

    @property
    def error(self) -> ErrorCode:
        """The device's sticky error flag."""
        return self.status()["error"]

    @property
    def input_level(self) -> int:
        return self.status()["input_level"]

    @property
    def output_level(self) -> int:
        return self.status()["output_level"]

    def clear_error(self) -> None:
        self._request(Opcode.CLEAR_ERROR)

    def counters(self) -> dict[str, int]:
        """Every counter of the device, by the names it reports."""
        return p.unpack_entries(self._request(Opcode.READ_COUNTERS))

    def clear_counters(self) -> None:
        self._request(Opcode.CLEAR_COUNTERS)

    def reset(self) -> None:
        """Memories, program, queues, registers, counters and error to power-on state."""
        self._request(Opcode.RESET)

    # --- memories ------------------------------------------------------------------------

    def _vectors(self, name: str, data) -> np.ndarray:
        """``data`` as FP16 bits ``(count >= 1, n)``: uint16 taken as bits, floats rounded
        to nearest even (``host.numerics.mvm.fp16_bits``: TypeError for other dtypes)."""
        arr = fp16_bits(data, name)
        n = self.config.n
        if arr.ndim != 2 or arr.shape[1] != n or not len(arr):
            raise ValueError(f"{name} must be native vectors of shape (count >= 1, {n}), not "
                             f"{arr.dtype} {arr.shape}")
        return arr

    def _chunks(self, total: int, per: int):
        return [(i, min(per, total - i)) for i in range(0, total, per)]

    def write(self, space, addr: int, data) -> None:
        """Write native vectors (uint16 or float16 ``(count, n)``) or MRF words (ints, or
        one int) to ``space`` from word ``addr``, in as many frames as needed.

        Raises
        ------
        ValueError
            for data of the wrong type or shape (nothing sent).
        DeviceError
            naming the frame the device refused (earlier frames were written).
        """
        self._transfer(self._write_requests(space, addr, data))

    def _write_requests(self, space, addr: int, data, job: str = ""):
        space = Space(space)
        size = p.word_bytes(self.config, space.value)
        if space is Space.MRF:
            words = [data] if isinstance(data, (int, np.integer)) else list(data)
            if not words:
                raise ValueError("data must hold at least one MRF word")
            try:
                raw = p.words_to_bytes(words, size)
            except (OverflowError, TypeError, ValueError) as exc:
                raise ValueError(f"MRF words must be integers of {size} bytes: {exc}") from None
            count = len(words)
        else:
            arr = self._vectors("data", data)
            raw = p.vectors_to_bytes(arr)
            count = len(arr)
        per = min((p.MAX_PAYLOAD - 8) // size, 0xFFFF)
        requests = []
        for start, k in self._chunks(count, per):
            body = raw[start * size:(start + k) * size]
            requests.append((Opcode.WRITE, p.pack_access(space.value, addr + start, k) + body,
                             f"{job}WRITE {space.name}[{addr + start}:{addr + start + k}]"))
        return requests

    def read(self, space, addr: int, count: int):
        """``count`` native vectors (uint16 ``(count, n)``) or MRF words (list of int) of
        ``space`` from word ``addr``.

        Raises
        ------
        DeviceError
            naming the frame the device refused.
        """
        space = Space(space)
        size = p.word_bytes(self.config, space.value)
        per = (p.MAX_PAYLOAD - 1) // size
        requests = [(Opcode.READ, p.pack_access(space.value, addr + start, k),
                     f"READ {space.name}[{addr + start}:{addr + start + k}]")
                    for start, k in self._chunks(count, per)]
        bodies = self._transfer(requests)
        raw = b"".join(bodies)
        if space is Space.MRF:
            return p.bytes_to_words(raw, size)
        return p.bytes_to_vectors(raw, self.config.n)

    def load_program(self, words) -> None:
        """Load a program (uint64 words); it replaces the one in force once all of it has
        arrived.

        Raises
        ------
        ValueError
            when ``words`` is not a non-empty 1-D array of 64-bit words.
        DeviceError
            when the device refuses it (too long: BAD_COUNT).
        """
        arr = np.asarray(words)
        if arr.ndim != 1 or not len(arr) or arr.dtype.kind not in "ui":
            raise ValueError(f"words must be a non-empty 1-D array of 64-bit words, not "
                             f"{arr.dtype} {arr.shape}")
        raw = p.program_to_bytes(arr)
        per = (p.MAX_PAYLOAD - 8) // 8
        total = len(arr)
        self._transfer([(Opcode.LOAD_PROGRAM,
                         p.pack_program_chunk(start, total, raw[start * 8:(start + k) * 8]),
                         f"LOAD_PROGRAM words {start}:{start + k} of {total}")
                        for start, k in self._chunks(total, per)])

    # --- queues and runs -----------------------------------------------------------------

    def _push_requests(self, vectors, job: str = ""):
        raw = p.vectors_to_bytes(self._vectors("vectors", vectors))
        width = 2 * self.config.n
        per = p.MAX_PAYLOAD // width
        return [(Opcode.PUSH_INPUT, raw[s * width:(s + k) * width],
                 f"{job}PUSH_INPUT of {k} vectors")
                for s, k in self._chunks(len(raw) // width, per)]

    def _check_job(self, x, vectors: int | None, what: str) -> None:
        """Refuse a job's input that is not ``(vectors, n)`` native vectors."""
        shape = np.shape(x)
        if len(shape) != 2 or shape[1] != self.config.n:
            raise ValueError(f"{what} must be native vectors of shape (k, {self.config.n}), "
                             f"not {shape}")
        if vectors is not None and shape[0] != vectors:
            raise ValueError(f"{what} has {shape[0]} vectors; each job takes {vectors}")

    def _check_job_runs(self, x, index: int, vectors: int | None, runs: int) -> None:
        """Refuse job ``index``'s input unless it is native vectors (``vectors`` of them if
        given) that split equally over ``runs``."""
        self._check_job(x, vectors, f"input of job {index}")
        if len(x) % runs:
            raise ValueError(f"input of job {index}: {len(x)} vectors do not split "
                             f"equally over the {runs} runs of a job")

    def _pop_requests(self, count: int, job: str = ""):
        count = check_int("count", count, 1)
        per = (p.MAX_PAYLOAD - 1) // (2 * self.config.n)
        return [(Opcode.POP_OUTPUT, p.pack_pop(k), f"{job}POP_OUTPUT of {k} vectors")
                for _, k in self._chunks(count, per)]

    def _vectors_of(self, bodies) -> np.ndarray:
        return p.bytes_to_vectors(b"".join(bodies), self.config.n)

    def push_input(self, vectors) -> None:
        """Append native vectors ``(k, n)`` to the input queue: uint16 FP16 bit patterns, or
        float16/32/64 values rounded to FP16 (nearest even), as ``NpuModel.push_input``.

        Raises
        ------
        TypeError
            for another dtype (nothing sent).
        ValueError
            for another shape (nothing sent).
        DeviceError
            QUEUE_FULL (that frame not queued), DEVICE_ERROR while the error flag is set.
        """
        self._transfer(self._push_requests(vectors))

    def pop_output(self, count: int) -> np.ndarray:
        """Take ``count`` native vectors (uint16 ``(count, n)``) from the output queue.

        Raises
        ------
        DeviceError
            QUEUE_EMPTY (nothing taken by that frame), DEVICE_ERROR while the error flag
            is set.
        """
        return self._vectors_of(self._transfer(self._pop_requests(count)))

    def run(self):
        """Run the loaded program to its ``end``; returns a ``host.model.core.RunResult``.

        Raises
        ------
        DeviceError
            DEVICE_ERROR when the run failed (``error`` the code, ``details["pc"]`` the
            failing instruction; the device's error flag is set) or the flag was already
            set.
        """
        return _run_result(self._request(Opcode.RUN))

    # --- streaming -----------------------------------------------------------------------

    def stream(self, inputs, *, outputs: int, window: int = 4, progress=None,
               total: int | None = None, prologue=(), vectors: int | None = None,
               runs: int = 1, keep: str = "all"):
        """Run one job per element of ``inputs`` through the loaded program; yield each
        job's outputs (uint16 ``(outputs, n)``; with several runs, ``(runs * outputs,
        n)`` or ``(outputs, n)``, see ``keep``), in order.

        A job is WRITE of the ``prologue`` memories (if any), PUSH_INPUT of its vectors
        (uint16 or float16 ``(k, n)``), RUN, POP_OUTPUT of ``outputs`` vectors. With
        ``runs`` > 1 (a network image's runs per job: a long sequence in chunks) the
        prologue is written once, then each run pushes its ``k / runs`` vectors, runs the
        program and pops ``outputs`` vectors; the device keeps its memories between the
        runs. Up to ``window`` runs are in flight (sent, results not yet read; a job of
        one run is one): a job of many runs is sent a run at a time as earlier replies
        come back, so the requests in flight stay within what the link buffers whatever
        the number of runs. ``inputs`` is consumed lazily, so memory stays bounded for any
        number of jobs.
        The device executes requests in order, so results come back in order.

        Parameters
        ----------
        inputs : iterable of arrays
        outputs : int
            Output vectors per job (>= 1).
        window : int
            Runs in flight, 1 to 64 (1: wait for each run before sending the next). The
            link must buffer the requests of ``window`` runs (the gateware's receive FIFO,
            or flow control).
        progress : callable(done, total), True, or None
            Called after each job; True shows a ``host.runtime.progress.Progress`` on
            stderr (a bar on a terminal, plain lines elsewhere).
        total : int, optional
            Jobs expected, for the progress display (default ``len(inputs)`` if it has one).
        prologue : sequence of (space, addr, data)
            Memories written before every job: the state each job starts from (an
            LSTM's ``h0`` and ``c0``), so that jobs are independent of each other.
        vectors : int, optional
            Input vectors every job must have (a network image's ``inputs``). When
            ``inputs`` is an array or a list, every job is checked before the first is
            sent, so a wrong size runs nothing.
        runs : int
            Runs of the program per job (>= 1; a network image's ``runs``); every job's
            vectors must split equally over them.
        keep : str
            With several runs, ``"all"``: a job yields every run's outputs in order;
            ``"last"``: the last run's (the others are popped and dropped).

        Raises
        ------
        StreamError
            when the device refuses any request of a job: every earlier job's results
            have been yielded, no later job's are; ``job`` says which failed. Requests of
            later jobs already sent are answered and their replies read first, so the link
            is clean afterwards.
        ValueError
            for an input of the wrong shape or size (or one that does not split equally
            over ``runs``): before anything is sent when ``inputs`` is an array or a
            list, else when that job is reached (the jobs before it are delivered); for
            ``runs`` below 1, an unknown ``keep`` or ``vectors`` that do not split over
            ``runs`` at once.
        """
        check_int("outputs", outputs, 1)
        check_int("window", window, 1, 64)
        runs = check_int("runs", runs, 1)
        if keep not in ("all", "last"):
            raise ValueError(f"keep must be 'all' or 'last', not {keep!r}")
        if vectors is not None:
            check_int("vectors", vectors, 0)
            if vectors % runs:
                raise ValueError(f"vectors ({vectors} per job) must split equally over the "
                                 f"{runs} runs")
        if isinstance(inputs, (np.ndarray, list, tuple)):
            for i, x in enumerate(inputs):
                self._check_job_runs(x, i, vectors, runs)
        if total is None and hasattr(inputs, "__len__"):
            total = len(inputs)
        bar = Progress(total) if progress is True else None
        report = bar if bar is not None else progress
        # The window counts runs in flight, not jobs: a job of many runs (a long sequence
        # in chunks) would otherwise send all its requests at once, more than the board's
        # receive FIFO holds. A run is (prologue, for the first,) its pushes, RUN and pops.
        flight = collections.deque()          # (job index, [pending...], [kept...], last)
        waiting = collections.deque()         # the current job's runs not yet sent
        source = iter(inputs)
        sent = done = 0
        bad_input = None                      # raised once the jobs before it are out
        pops = self._pop_requests(outputs)
        setup = [r for space, addr, data in prologue
                 for r in self._write_requests(space, addr, data)]
        bodies, failure = [], None            # the job being received
        try:
            while True:
                while len(flight) < window and bad_input is None:
                    if not waiting:
                        try:
                            x = next(source)
                        except StopIteration:
                            break
                        try:
                            waiting.extend(self._job_runs(x, sent, vectors, runs, keep,
                                                          setup, pops))
                        except ValueError as exc:
                            bad_input = exc
                            break
                        sent += 1
                    index, reqs, kept, last = waiting.popleft()
                    flight.append((index, [self._send(*r) for r in reqs], kept, last))
                if not flight:
                    if bad_input is not None:
                        raise bad_input
                    break
                index, pendings, kept, last = flight.popleft()
                for i, pending in enumerate(pendings):
                    status, body = self._receive(pending)
                    if status is not Status.OK and failure is None:
                        failure = self._refusal(pending, status, body)
                    if i in kept:
                        bodies.append(body)
                if not last:
                    continue
                if failure is not None:
                    waiting.clear()
                    self._fail_stream(index, failure, flight)
                yield self._vectors_of(bodies)
                bodies = []
                done += 1
                if report is not None:
                    report(done, total)
        finally:
            # Runs still in flight (the consumer stopped early, or an error) are answered
            # before the link is used again; runs not yet sent are dropped.
            self._drain(flight)
            if bar is not None:
                bar.close()

    def _job_runs(self, x, index, vectors, runs, keep, setup, pops):
        """The requests of job ``index`` (input ``x``), one ``(index, requests, kept,
        last)`` per run: ``kept`` the positions of the pops whose replies the job yields.

        Raises
        ------
        ValueError
            for an input of the wrong shape or size, or one that does not split equally
            over ``runs`` (nothing of the job is sent).
        """
        self._check_job_runs(x, index, vectors, runs)
        per = len(x) // runs
        label = f"job {index}: "
        out = []
        for r in range(runs):
            tag = f"{label}run {r + 1} of {runs}: " if runs > 1 else label
            reqs = [(op, pl, f"{label}{what}") for op, pl, what in setup] if r == 0 else []
            reqs += self._push_requests(x[r * per:(r + 1) * per], tag)
            reqs.append((Opcode.RUN, b"", f"{tag}RUN"))
            first = len(reqs)
            reqs += [(op, pl, f"{tag}{what}") for op, pl, what in pops]
            kept = set(range(first, len(reqs))) if keep == "all" or r == runs - 1 else set()
            out.append((index, reqs, kept, r == runs - 1))
        return out

    def _drain(self, flight) -> list[int]:
        """Read the replies of the runs in ``flight``; returns the indices of the jobs of
        which a RUN succeeded."""
        ran = []
        while flight:
            index, pendings, *_ = flight.popleft()
            for pending in pendings:
                if not self._outstanding or self._outstanding[0] is not pending:
                    continue                   # abandoned after a link error
                status, _ = self._receive(pending)
                if pending.opcode is Opcode.RUN and status is Status.OK \
                        and index not in ran:
                    ran.append(index)
        return ran

    def _fail_stream(self, index, failure, flight):
        in_flight = sorted({i for i, *_ in flight} - {index})
        ran = [i for i in self._drain(flight) if i != index]
        message = f"job {index} failed: {failure}; jobs 0..{index - 1} delivered"
        if in_flight:
            message += (f"; jobs {in_flight[0]}..{in_flight[-1]} were in flight and "
                        + (f"{ran} ran anyway, outputs dropped" if ran else "did not run"))
        raise StreamError(message, job=index, in_flight=in_flight, ran=ran, cause=failure)

    # --- images --------------------------------------------------------------------------

    def load_image(self, image) -> None:
        """Write a ``host.spec.image.NetworkImage``'s memories (``job_memories`` too),
        then load its program; jobs go through :meth:`stream` with
        ``prologue=image.job_memories``, ``vectors=image.inputs``, ``outputs=image.outputs``,
        ``runs=image.runs`` and ``keep=image.keep``.

        Raises
        ------
        ValueError
            when the image was built for other build parameters than the device's.
        DeviceError
            when the device refuses a write or the program.
        """
        image.check_config(self.config)
        for space, addr, data in image.memories + image.job_memories:
            self.write(space, addr, data)
        self.load_program(image.program)


def _run_result(body: bytes):
    from host.model.core import RunResult
    entries = p.unpack_entries(body)
    return RunResult(cycles_predicted=entries.get("cycles_predicted", 0),
                     chains=entries.get("chains", 0),
                     instructions=entries.get("instructions", 0),
                     error=ErrorCode.NONE, pc=entries.get("pc", 0))
