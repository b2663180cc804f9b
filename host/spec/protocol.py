"""The host link protocol: frames, opcodes, status codes and payload layouts, written once.

``docs/protocol.md`` is the prose version of this module. The gateware's input and output
message processors (IMP/OMP) import the enums and layouts from here; the software device
(``host.runtime.server``) and the host driver (``host.runtime.device``) use the codecs. Nothing here
imports ``hw`` or ``sim``.

Byte order: every multi-byte field is **little-endian**; a ``data.StructLayout`` below
describes the bytes of a field group with byte ``i`` being bits ``[8i, 8i + 8)`` of the
layout (Amaranth lays the first field in the lowest bits).

Frame (requests and replies alike)::

    offset  size  field
    0       2     sync     0xA5 0x5A
    2       1     opcode   request: an Opcode; reply: the request's opcode | 0x80
    3       1     tag      chosen by the host, echoed in the reply
    4       2     length   payload bytes, 0 .. MAX_PAYLOAD
    6       2     check    CRC-16/CCITT-FALSE of bytes 0..5
    8       n     payload
    8+n     4     crc      CRC-32 (IEEE 802.3, as zlib) of the payload

A reply's payload starts with a :class:`Status` byte; the rest depends on the opcode.

Why two CRCs: the header check lets a receiver decide after 8 bytes whether a length is
to be believed, so a corrupted or false header never makes it wait for thousands of bytes
that are not coming (it is small enough to evaluate on a sliding 8-byte window in
gateware). The payload CRC is CRC-32 because payloads reach 4 KiB, where CRC-16/CCITT no
longer guarantees Hamming distance 4 (it does up to 32,751 data bits) and lets one in
65,536 random corruptions through, against one in 4.3e9 for CRC-32. Both have C
implementations in the standard library (``binascii.crc_hqx``, ``zlib.crc32``), so host
framing runs at memory speed; :func:`crc16_bytewise` and :func:`crc32_bytewise` are the
table-driven byte-at-a-time definitions the gateware mirrors, and the tests check the two
against each other and against the catalogue check values of ``b"123456789"``.
"""

from __future__ import annotations

import binascii
import struct
import zlib
from dataclasses import dataclass

import numpy as np
from amaranth.hdl import unsigned
from amaranth.lib import data, enum

__all__ = [
    "PROTOCOL_VERSION", "SYNC", "HEADER_BYTES", "TRAILER_BYTES", "MAX_PAYLOAD", "REPLY",
    "TRUNCATE_TIMEOUT", "Opcode", "Status", "HEADER_LAYOUT", "ACCESS_LAYOUT",
    "PROGRAM_LAYOUT", "POP_LAYOUT", "STATUS_LAYOUT", "INFO_LAYOUT",
    "crc16", "crc32", "crc16_bytewise", "crc32_bytewise", "CRC16_CHECK", "CRC32_CHECK",
    "encode_frame", "encode_reply", "Frame", "FrameError", "FrameDecoder",
    "pack_access", "unpack_access", "pack_program_chunk", "unpack_program_chunk",
    "vectors_to_bytes", "bytes_to_vectors", "words_to_bytes", "bytes_to_words",
    "program_to_bytes", "bytes_to_program", "pack_pop", "unpack_pop", "pack_status",
    "unpack_status",
    "pack_entries", "unpack_entries", "pack_info", "unpack_info", "CONFIG_FIELDS",
    "OPTION_FIELDS", "UNIT_SETS_ENTRY", "LANES_ENTRY", "unit_sets_info",
    "config_entries", "config_from_entries", "space_depth", "word_bytes",
]

#: Version of this protocol, reported by INFO; bumped on any incompatible change.
PROTOCOL_VERSION = 1
#: The two bytes every frame starts with.
SYNC = b"\xA5\x5A"
HEADER_BYTES = 8
TRAILER_BYTES = 4
#: Largest payload of a frame, in bytes, requests and replies alike. The gateware's
#: receive buffer holds one payload (4 KiB: two ECP5 DP16KD block RAMs).
MAX_PAYLOAD = 4096
#: Bit set in a reply's opcode byte.
REPLY = 0x80
#: Seconds of silence in the middle of a frame after which the device abandons it and
#: replies TRUNCATED (the gateware counts it in clock cycles from its build parameters).
TRUNCATE_TIMEOUT = 0.05


class Opcode(enum.Enum, shape=8):
    """Request opcodes. The reply to opcode ``op`` carries ``op | REPLY``.

    ============== ==== ============================================ =========================
    member         code request payload                              reply payload after status
    ============== ==== ============================================ =========================
    INFO           0x01 (none)                                       :data:`INFO_LAYOUT` +
                                                                     entries (:func:`pack_info`)
    WRITE          0x02 :data:`ACCESS_LAYOUT` + ``count`` words      (none)
    READ           0x03 :data:`ACCESS_LAYOUT`                        ``count`` words
    LOAD_PROGRAM   0x04 :data:`PROGRAM_LAYOUT` + uint64 words        (none)
    PUSH_INPUT     0x05 whole FP16 vectors (``2*n`` bytes each)      (none)
    RUN            0x06 (none)                                       run result (``host.runtime.server``)
    POP_OUTPUT     0x07 :data:`POP_LAYOUT`                           ``count`` FP16 vectors
    READ_COUNTERS  0x08 (none)                                       entries (name, uint64)
    CLEAR_COUNTERS 0x09 (none)                                       (none)
    RESET          0x0A (none)                                       (none)
    STATUS         0x0B (none)                                       :data:`STATUS_LAYOUT`
    CLEAR_ERROR    0x0C (none)                                       (none)
    ============== ==== ============================================ =========================
    """
    INFO = 0x01
    WRITE = 0x02
    READ = 0x03
    LOAD_PROGRAM = 0x04
    PUSH_INPUT = 0x05
    RUN = 0x06
    POP_OUTPUT = 0x07
    READ_COUNTERS = 0x08
    CLEAR_COUNTERS = 0x09
    RESET = 0x0A
    STATUS = 0x0B
    CLEAR_ERROR = 0x0C


class Status(enum.Enum, shape=8):
    """First payload byte of every reply.

    ================ ==== ===============================================================
    member           code meaning
    ================ ==== ===============================================================
    OK               0    done; the rest of the payload is the opcode's reply
    BAD_CRC          1    header sound, payload CRC-32 wrong: nothing done
    BAD_LENGTH       2    length over MAX_PAYLOAD, or not what the opcode needs
    UNKNOWN_OPCODE   3    no such opcode (replies' opcodes included)
    TRUNCATED        4    the link went quiet for TRUNCATE_TIMEOUT inside the frame
    BAD_SPACE        5    no such memory space (or not readable/writable this way)
    BAD_ADDRESS      6    address range outside the space, or a program chunk out of order
    BAD_COUNT        7    count zero, or the reply would exceed MAX_PAYLOAD, or a
                          program longer than the program memory
    DEVICE_ERROR     8    the core reported an error; the next byte is its ``ErrorCode``
    QUEUE_EMPTY      9    POP_OUTPUT of more vectors than the output queue holds
    QUEUE_FULL       10   PUSH_INPUT of more vectors than the input queue has room for
    BUSY             11   the device cannot take this request now (a program is
                          running on a device that runs asynchronously); retry
    ================ ==== ===============================================================

    Every status other than OK leaves the device state as it was.
    """
    OK = 0
    BAD_CRC = 1
    BAD_LENGTH = 2
    UNKNOWN_OPCODE = 3
    TRUNCATED = 4
    BAD_SPACE = 5
    BAD_ADDRESS = 6
    BAD_COUNT = 7
    DEVICE_ERROR = 8
    QUEUE_EMPTY = 9
    QUEUE_FULL = 10
    BUSY = 11


#: The 8-byte frame header. ``sync`` reads 0x5AA5 (bytes A5 5A); ``check`` is the
#: CRC-16/CCITT-FALSE of the first six bytes.
HEADER_LAYOUT = data.StructLayout({
    "sync": unsigned(16),
    "opcode": unsigned(8),
    "tag": unsigned(8),
    "length": unsigned(16),
    "check": unsigned(16),
})

#: WRITE and READ request prefix (8 bytes): ``count`` words of memory space ``space``
#: from word address ``addr``. ``reserved`` is sent as 0 and ignored.
ACCESS_LAYOUT = data.StructLayout({
    "addr": unsigned(32),
    "count": unsigned(16),
    "space": unsigned(8),
    "reserved": unsigned(8),
})

#: LOAD_PROGRAM request prefix (8 bytes): the chunk's words go to ``offset`` of a program
#: of ``total`` words; the program in force is replaced when the last word arrives.
PROGRAM_LAYOUT = data.StructLayout({
    "offset": unsigned(32),
    "total": unsigned(32),
})

#: POP_OUTPUT request payload (2 bytes): how many vectors.
POP_LAYOUT = data.StructLayout({
    "count": unsigned(16),
})

#: STATUS reply after the status byte (12 bytes).
STATUS_LAYOUT = data.StructLayout({
    "error": unsigned(8),          # the sticky ErrorCode, NONE = 0
    "flags": unsigned(8),          # bit 0: busy
    "reserved": unsigned(16),
    "input_level": unsigned(32),   # vectors waiting in the input queue
    "output_level": unsigned(32),  # vectors waiting in the output queue
})

#: INFO reply after the status byte, before the entries (4 bytes).
INFO_LAYOUT = data.StructLayout({
    "version": unsigned(16),       # PROTOCOL_VERSION
    "max_payload": unsigned(16),   # MAX_PAYLOAD (4096 does not fit 12 bits, so 16)
})

_HEADER = struct.Struct("<2sBBH")
_CHECK = struct.Struct("<H")
_CRC = struct.Struct("<I")
_ACCESS = struct.Struct("<IHBB")
_PROGRAM = struct.Struct("<II")
_INFO = struct.Struct("<HH")
_POP = struct.Struct("<H")
_STATUS = struct.Struct("<BBHII")
_FP16 = np.dtype("<u2")
_WORD = np.dtype("<u8")
_ENTRY_VALUE = struct.Struct("<Q")

assert _HEADER.size + _CHECK.size == HEADER_BYTES == HEADER_LAYOUT.size // 8
assert _ACCESS.size == ACCESS_LAYOUT.size // 8 and _PROGRAM.size == PROGRAM_LAYOUT.size // 8
assert _INFO.size == INFO_LAYOUT.size // 8 and _POP.size == POP_LAYOUT.size // 8
assert _STATUS.size == STATUS_LAYOUT.size // 8


# --- CRCs ---------------------------------------------------------------------------------

#: ``crc16(b"123456789")`` and ``crc32(b"123456789")``: the catalogue check values of
#: CRC-16/CCITT-FALSE (poly 0x1021, init 0xFFFF, unreflected, no final xor) and CRC-32
#: (poly 0x04C11DB7 reflected, init and final xor 0xFFFFFFFF).
CRC16_CHECK = 0x29B1
CRC32_CHECK = 0xCBF43926


def _crc16_table() -> tuple[int, ...]:
    table = []
    for byte in range(256):
        crc = byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else (crc << 1)
        table.append(crc & 0xFFFF)
    return tuple(table)


def _crc32_table() -> tuple[int, ...]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0xEDB88320 if crc & 1 else crc >> 1
        table.append(crc)
    return tuple(table)


_CRC16_TABLE = _crc16_table()
_CRC32_TABLE = _crc32_table()


def crc16_bytewise(data: bytes, crc: int = 0xFFFF) -> int:
    """CRC-16/CCITT-FALSE, one table look-up per byte: the definition the gateware follows.

    ``crc`` continues an earlier value (start: 0xFFFF). Returns the 16-bit CRC.
    """
    for byte in data:
        crc = ((crc << 8) & 0xFFFF) ^ _CRC16_TABLE[(crc >> 8) ^ byte]
    return crc


def crc32_bytewise(data: bytes, crc: int = 0) -> int:
    """CRC-32 (zlib's), one table look-up per byte: the definition the gateware follows.

    ``crc`` continues an earlier *finished* value, as ``zlib.crc32`` does (start: 0).
    """
    crc ^= 0xFFFFFFFF
    for byte in data:
        crc = (crc >> 8) ^ _CRC32_TABLE[(crc ^ byte) & 0xFF]
    return crc ^ 0xFFFFFFFF


def crc16(data) -> int:
    """CRC-16/CCITT-FALSE of a bytes-like object (C speed, equal to :func:`crc16_bytewise`)."""
    return binascii.crc_hqx(data, 0xFFFF)


def crc32(data) -> int:
    """CRC-32 of a bytes-like object (C speed, equal to :func:`crc32_bytewise`)."""
    return zlib.crc32(data)


# --- frames -------------------------------------------------------------------------------

def _check_byte(name: str, value) -> int:
    from host.spec.formats import check_int
    return check_int(name, value, 0, 255)


def encode_frame(opcode, tag: int, payload=b"") -> bytes:
    """One frame: header, ``payload`` (bytes-like), CRC-32 trailer.

    ``opcode`` is an :class:`Opcode`, or any byte (tests send unknown ones; replies carry
    the REPLY bit).

    Raises
    ------
    TypeError, ValueError
        when ``opcode`` or ``tag`` is not a byte, or the payload is longer than
        ``MAX_PAYLOAD``.
    """
    opcode = _check_byte("opcode", opcode.value if isinstance(opcode, Opcode) else opcode)
    tag = _check_byte("tag", tag)
    if len(payload) > MAX_PAYLOAD:
        raise ValueError(f"payload of {len(payload)} bytes exceeds MAX_PAYLOAD ({MAX_PAYLOAD})")
    head = _HEADER.pack(SYNC, opcode, tag, len(payload))
    return b"".join((head, _CHECK.pack(crc16(head)), payload, _CRC.pack(crc32(payload))))


def encode_reply(opcode: int, tag: int, status: Status, body=b"") -> bytes:
    """The reply frame to request ``opcode`` (a byte): status byte, then ``body``."""
    return encode_frame((opcode | REPLY) & 0xFF, tag, bytes((Status(status).value,)) + body)


@dataclass(frozen=True)
class Frame:
    """A frame that passed every check: raw ``opcode`` byte, ``tag`` and ``payload``."""
    opcode: int
    tag: int
    payload: bytes


@dataclass(frozen=True)
class FrameError:
    """A frame whose header was sound but which could not be taken.

    ``status`` is BAD_LENGTH (length over the bound), BAD_CRC (payload CRC wrong) or
    TRUNCATED (the link went idle before the frame was complete); ``opcode`` and ``tag``
    come from its header, so the device can address its error reply.
    """
    status: Status
    opcode: int
    tag: int


class FrameDecoder:
    """Streaming frame decoder with resynchronisation, the receive side of both ends.

    :meth:`feed` takes bytes as they arrive and returns the events they complete, in
    order: :class:`Frame` for a good frame, :class:`FrameError` for a frame whose header
    was sound but whose payload was not. The algorithm, which the gateware's IMP
    implements (``docs/protocol.md`` section 4):

    1. Hunt: skip bytes until ``SYNC`` (counted in :attr:`skipped`).
    2. With 8 bytes, check the header: CRC-16 ``check`` right, else skip one byte and hunt
       again (no event: nothing about a broken header can be trusted).
    3. ``length > max_payload``: a BAD_LENGTH event, skip one byte, hunt.
    4. Wait for payload and trailer; CRC-32 right: a Frame, and the whole frame is
       consumed. Wrong: a BAD_CRC event, skip one byte (the first sync byte) and hunt
       again *through the bytes already received*, so a good frame swallowed by a
       truncated one is still found.
    5. :meth:`flush` (the link has been idle for ``TRUNCATE_TIMEOUT``): a sound header
       whose frame is incomplete gives a TRUNCATED event, skip one byte, hunt on through
       the rest; what cannot start a frame is dropped.

    Parameters
    ----------
    max_payload : int
        Length bound, 0 to MAX_PAYLOAD (default MAX_PAYLOAD).

    Attributes
    ----------
    skipped : int
        Bytes skipped while hunting (garbage and the sync bytes of failed frames).
    """

    def __init__(self, max_payload: int = MAX_PAYLOAD):
        from host.spec.formats import check_int
        self.max_payload = check_int("max_payload", max_payload, 0, MAX_PAYLOAD)
        self._buf = bytearray()
        self._pos = 0
        self.skipped = 0

    @property
    def pending(self) -> int:
        """Bytes received and not yet consumed."""
        return len(self._buf) - self._pos

    def feed(self, data) -> list:
        """Take ``data`` (bytes-like); return the :class:`Frame`/:class:`FrameError` events
        it completes, in order."""
        self._buf += data
        return self._scan(flush=False)

    def flush(self) -> list:
        """The link went idle: report an incomplete frame as TRUNCATED and drop what cannot
        begin a frame; returns the events, in order."""
        events = self._scan(flush=True)
        self.skipped += self.pending
        self._buf.clear()
        self._pos = 0
        return events

    def _skip(self, n: int):
        self._pos += n
        self.skipped += n

    def _scan(self, flush: bool) -> list:
        events = []
        buf = self._buf
        while True:
            at = buf.find(SYNC, self._pos)
            if at < 0:
                # Keep a last byte that may be the first half of a sync.
                keep = 1 if buf[-1:] == SYNC[:1] else 0
                self._skip(max(0, len(buf) - keep - self._pos))
                break
            self._skip(at - self._pos)
            pos = self._pos
            if len(buf) - pos < HEADER_BYTES:
                break
            _, opcode, tag, length = _HEADER.unpack_from(buf, pos)
            if crc16(memoryview(buf)[pos:pos + 6]) != _CHECK.unpack_from(buf, pos + 6)[0]:
                self._skip(1)
                continue
            if length > self.max_payload:
                events.append(FrameError(Status.BAD_LENGTH, opcode, tag))
                self._skip(1)
                continue
            end = pos + HEADER_BYTES + length
            if len(buf) < end + TRAILER_BYTES:
                if flush:
                    events.append(FrameError(Status.TRUNCATED, opcode, tag))
                    self._skip(1)
                    continue
                break
            payload = bytes(buf[pos + HEADER_BYTES:end])
            if crc32(payload) != _CRC.unpack_from(buf, end)[0]:
                events.append(FrameError(Status.BAD_CRC, opcode, tag))
                self._skip(1)
                continue
            events.append(Frame(opcode, tag, payload))
            self._pos = end + TRAILER_BYTES
        # Compact once consumed bytes dominate, so long streams stay linear in time.
        if self._pos > 65536 or self._pos * 2 > len(buf):
            del buf[:self._pos]
            self._pos = 0
        return events


# --- payload codecs -----------------------------------------------------------------------

def pack_access(space: int, addr: int, count: int) -> bytes:
    """WRITE/READ request prefix (:data:`ACCESS_LAYOUT`)."""
    return _ACCESS.pack(addr, count, space, 0)


def unpack_access(payload: bytes) -> tuple[int, int, int]:
    """``(space, addr, count)`` of a WRITE/READ payload of at least 8 bytes."""
    addr, count, space, _ = _ACCESS.unpack_from(payload)
    return space, addr, count


def vectors_to_bytes(vectors) -> bytes:
    """Native vectors (uint16 FP16 bits, ``(count, n)``) as their wire bytes."""
    return np.asarray(vectors, dtype=np.uint16).astype(_FP16).tobytes()


def bytes_to_vectors(raw, n: int) -> np.ndarray:
    """Wire bytes of whole native vectors as uint16 ``(count, n)``."""
    return np.frombuffer(raw, _FP16).astype(np.uint16).reshape(-1, n)


def words_to_bytes(words, size: int) -> bytes:
    """MRF words (ints) as their wire bytes, ``size`` bytes each, little-endian.

    Raises
    ------
    OverflowError, TypeError
        for a word that is not a non-negative integer of ``size`` bytes.
    """
    return b"".join(int(w).to_bytes(size, "little") for w in words)


def bytes_to_words(raw, size: int) -> list[int]:
    """Wire bytes of MRF words, ``size`` bytes each, as a list of ints."""
    return [int.from_bytes(raw[i:i + size], "little") for i in range(0, len(raw), size)]


def program_to_bytes(words) -> bytes:
    """Program words (uint64) as their wire bytes."""
    return np.asarray(words).astype(_WORD).tobytes()


def bytes_to_program(raw) -> np.ndarray:
    """Wire bytes of program words as uint64."""
    return np.frombuffer(raw, _WORD).astype(np.uint64)


def pack_pop(count: int) -> bytes:
    """POP_OUTPUT request payload (:data:`POP_LAYOUT`)."""
    return _POP.pack(count)


def unpack_pop(payload: bytes) -> int:
    """The count of a 2-byte POP_OUTPUT payload."""
    return _POP.unpack(payload)[0]


def pack_status(error: int, busy: bool, input_level: int, output_level: int) -> bytes:
    """STATUS reply body (:data:`STATUS_LAYOUT`)."""
    return _STATUS.pack(error, 1 if busy else 0, 0, input_level, output_level)


def unpack_status(body: bytes) -> dict:
    """``{"error": int, "busy": bool, "input_level": int, "output_level": int}`` of a
    STATUS reply body."""
    error, flags, _, input_level, output_level = _STATUS.unpack(body)
    return {"error": error, "busy": bool(flags & 1), "input_level": input_level,
            "output_level": output_level}


def pack_program_chunk(offset: int, total: int, words: bytes) -> bytes:
    """LOAD_PROGRAM payload: :data:`PROGRAM_LAYOUT` then ``words`` (uint64 LE bytes)."""
    return _PROGRAM.pack(offset, total) + words


def unpack_program_chunk(payload: bytes) -> tuple[int, int, bytes]:
    """``(offset, total, word bytes)`` of a LOAD_PROGRAM payload of at least 8 bytes."""
    offset, total = _PROGRAM.unpack_from(payload)
    return offset, total, payload[_PROGRAM.size:]


def pack_entries(entries: dict[str, int]) -> bytes:
    """Named values, in the dict's order: per entry ``name length (1 byte), name (ASCII),
    value (uint64)``. The INFO reply and the READ_COUNTERS reply carry such a list, so the
    host learns the names from the device (the gateware streams them from a ROM).

    Raises
    ------
    ValueError
        naming the entry whose name is not 1..255 ASCII bytes or whose value is not an
        integer from 0 to 2**64 - 1.
    """
    parts = []
    for name, value in entries.items():
        try:
            key = name.encode("ascii")
        except UnicodeEncodeError:
            key = b""
        if not 1 <= len(key) <= 255:
            raise ValueError(f"entry name {name!r} must be 1 to 255 ASCII bytes")
        if isinstance(value, bool) or not isinstance(value, int) \
                or not 0 <= value < (1 << 64):
            raise ValueError(f"entry {name!r} must be an integer from 0 to 2**64-1, "
                             f"not {value!r}")
        parts += [bytes((len(key),)), key, _ENTRY_VALUE.pack(value)]
    return b"".join(parts)


def unpack_entries(body: bytes) -> dict[str, int]:
    """Inverse of :func:`pack_entries`.

    Raises
    ------
    ValueError
        naming the byte offset of an entry that is cut short, nameless or not ASCII.
    """
    out = {}
    pos = 0
    while pos < len(body):
        size = body[pos]
        end = pos + 1 + size + _ENTRY_VALUE.size
        if size == 0 or end > len(body):
            raise ValueError(f"malformed entry at byte {pos} of the entry list")
        try:
            name = body[pos + 1:pos + 1 + size].decode("ascii")
        except UnicodeDecodeError:
            raise ValueError(f"entry name at byte {pos} is not ASCII") from None
        out[name] = _ENTRY_VALUE.unpack_from(body, pos + 1 + size)[0]
        pos = end
    return out


def pack_info(entries: dict[str, int], version: int = PROTOCOL_VERSION) -> bytes:
    """INFO reply body: :data:`INFO_LAYOUT` then :func:`pack_entries` of ``entries``.

    Raises
    ------
    ValueError
        as :func:`pack_entries`, or when the body would not fit one reply.
    """
    body = _INFO.pack(version, MAX_PAYLOAD) + pack_entries(entries)
    if len(body) + 1 > MAX_PAYLOAD:
        raise ValueError(f"INFO body of {len(body)} bytes does not fit a reply")
    return body


def unpack_info(body: bytes) -> dict[str, int]:
    """Inverse of :func:`pack_info`: ``{"protocol_version": v, "max_payload": p, ...}``.

    Raises
    ------
    ValueError
        when the body is cut short or an entry is malformed.
    """
    if len(body) < _INFO.size:
        raise ValueError(f"INFO body of {len(body)} bytes is shorter than {_INFO.size}")
    version, max_payload = _INFO.unpack_from(body)
    entries = unpack_entries(body[_INFO.size:])
    return {"protocol_version": version, "max_payload": max_payload, **entries}


# --- build parameters and memory geometry -------------------------------------------------

#: The ``NpuConfig`` fields INFO reports, in this order; ``unary_ops`` goes as a bit mask
#: (bit ``op.value`` set for each op built), the options (:data:`OPTION_FIELDS`) as 1 or 0.
#: After them a build with unit sets reports ``unit_sets`` (:data:`UNIT_SETS_ENTRY`).
CONFIG_FIELDS = ("n", "tiles", "mantissa_bits_v", "mantissa_bits_w", "mrf_depth",
                 "max_col_tiles", "counter_bits", "mfus", "ivrf_depth", "vrf_depth",
                 "netq_depth", "program_depth", "max_length", "unary_ops", "narrow_check")

#: The build options among :data:`CONFIG_FIELDS` and what a device whose INFO lacks one
#: has: a device built before the option existed had the logic it switches off
#: (``narrow_check``: the narrow-accumulator check, ``host.spec.config.MvmConfig``).
OPTION_FIELDS = {"narrow_check": True}

#: The INFO entry of ``NpuConfig.unit_sets``, right after :data:`CONFIG_FIELDS`: bit
#: ``4 * m + unit`` set for each ``host.spec.mfu.MfuUnit`` built in MFU ``m``
#: (``host.spec.mfu.unit_set_mask``). A build with every unit in every MFU (unit sets
#: None) does not send it, so that its INFO is what it was before unit sets existed, and a
#: reply without it (such a build, or one from before) means every unit in every MFU.
UNIT_SETS_ENTRY = "unit_sets"

#: The INFO entry of ``NpuConfig.lanes``, after :data:`UNIT_SETS_ENTRY`'s place. A build
#: whose vector units are ``n`` lanes wide does not send it, so that its INFO (and the
#: link's INFO ROM, ``hw.link``) is what it was before lanes existed, and a reply without
#: it means ``lanes = n``.
LANES_ENTRY = "lanes"


def config_entries(config) -> dict[str, int]:
    """INFO entries of an ``NpuConfig``: :data:`CONFIG_FIELDS`, ``unary_ops`` as a mask,
    options as 1 (built) or 0 (left out), then :data:`UNIT_SETS_ENTRY` where the build
    has unit sets and :data:`LANES_ENTRY` where its lanes are fewer than ``n``."""
    from host.spec.mfu import unit_set_mask
    out = {name: int(getattr(config, name)) for name in CONFIG_FIELDS if name != "unary_ops"}
    out["unary_ops"] = sum(1 << op.value for op in config.unary_ops)
    out = {name: out[name] for name in CONFIG_FIELDS}
    if config.unit_sets is not None:
        out[UNIT_SETS_ENTRY] = unit_set_mask(config.unit_sets, config.mfus)
    if config.lanes != config.n:
        out[LANES_ENTRY] = config.lanes
    return out


def build_info(config) -> dict:
    """What a device of build ``config`` (an ``NpuConfig``) says about itself: every
    ``NpuConfig`` field (``unary_ops`` as a list of names, options such as
    ``narrow_check`` as bools, ``unit_sets`` as one list of unit names per MFU, every
    unit where the build has no unit sets, then ``lanes``, also where it is ``n``), then
    the derived sizes
    ``mrf_words``, ``weight_block_bits``, ``macs_per_cycle`` and ``word_bits`` (the
    instruction width). The reference model's ``info()`` and the gateware's INFO reply
    are both made from it."""
    from host.spec.isa import WORD_BITS
    info = config.to_dict()
    info.pop("lanes", None)
    info["unit_sets"] = unit_sets_info(config)
    info["lanes"] = config.lanes
    info.update(mrf_words=config.mrf_words, weight_block_bits=config.mvm.weight_block_bits,
                macs_per_cycle=config.mvm.macs_per_cycle, word_bits=WORD_BITS)
    return info


def unit_sets_info(config) -> list[list[str]]:
    """The units of each MFU of build ``config`` by lower-case name, every unit of every
    MFU when it has no unit sets: the ``unit_sets`` of :func:`build_info` and of
    ``Device.info()``."""
    return [[u.name.lower() for u in config.units(m)] for m in range(config.mfus)]


def info_entries(config) -> dict[str, int]:
    """The INFO reply entries of build ``config``: :func:`config_entries`, then the other
    integer entries of :func:`build_info` (the derived sizes), in that order. ``lanes`` is
    :func:`config_entries`' to send or not: never added here."""
    entries = config_entries(config)
    for name, value in build_info(config).items():
        if name == LANES_ENTRY:
            continue
        if name not in entries and isinstance(value, int) and not isinstance(value, bool):
            entries[name] = value
    return entries


def config_from_entries(entries: dict[str, int]):
    """The ``NpuConfig`` an INFO reply describes (other entries are ignored). An option
    the reply does not name takes its :data:`OPTION_FIELDS` value; no ``unit_sets`` entry
    means every unit in every MFU, no ``lanes`` entry ``lanes = n``.

    Raises
    ------
    ValueError
        naming the missing fields, an option that is not 0 or 1, a ``unit_sets`` mask
        that is not one of ``mfus`` MFUs, or the field the config refuses.
    """
    from host.spec.config import NpuConfig
    from host.spec.mfu import unit_sets_from_mask
    from host.spec.ops import UnaryOp
    missing = [name for name in CONFIG_FIELDS
               if name not in entries and name not in OPTION_FIELDS]
    if missing:
        raise ValueError(f"INFO lacks the build parameters {', '.join(missing)}")
    fields = {name: entries[name] for name in CONFIG_FIELDS if name in entries}
    fields["unary_ops"] = tuple(op for op in UnaryOp if fields["unary_ops"] >> op.value & 1)
    for name, default in OPTION_FIELDS.items():
        value = fields.get(name, int(default))
        if value not in (0, 1):
            raise ValueError(f"INFO entry {name} must be 0 or 1, not {value!r}")
        fields[name] = bool(value)
    if UNIT_SETS_ENTRY in entries:
        try:
            fields["unit_sets"] = unit_sets_from_mask(entries[UNIT_SETS_ENTRY],
                                                      fields["mfus"])
        except (TypeError, ValueError) as exc:
            raise ValueError(f"INFO entry {UNIT_SETS_ENTRY}: {exc}") from None
    if LANES_ENTRY in entries:
        fields["lanes"] = entries[LANES_ENTRY]
    try:
        return NpuConfig(**fields)
    except TypeError as exc:
        raise ValueError(str(exc)) from None


def space_depth(config, space: int) -> int | None:
    """Words of memory space ``space`` (a byte) reachable by WRITE/READ in build
    ``config``, or None where there is no such space there (NETQ is reached by
    PUSH_INPUT/POP_OUTPUT only; VRFs of MFUs not built, and of units an MFU does not
    build, do not exist: ``host.spec.isa.vector_spaces``)."""
    from host.spec.isa import Space, vector_spaces
    try:
        space = Space(space)
    except ValueError:
        return None
    if space is Space.IVRF:
        return config.ivrf_depth
    if space is Space.MRF:
        return config.mrf_words
    if space in vector_spaces(config):
        return config.vrf_depth
    return None


def word_bytes(config, space: int) -> int:
    """Bytes of one word of ``space`` on the wire: ``2*n`` for a vector space (n FP16
    values, each uint16 LE), ``ceil((8 + n*m_w)/8)`` for an MRF word (its bits LE, as
    ``host.spec.formats.block_layout``)."""
    from host.spec.formats import block_bytes
    from host.spec.isa import Space
    if space == Space.MRF.value:
        return block_bytes(config.n, config.mantissa_bits_w)
    return 2 * config.n
