"""Unit tests of ``host.spec.protocol``: CRCs, frame encoding, the resynchronising decoder,
payload codecs and the layouts the gateware will import.

Expected frames are assembled here byte by byte from ``docs/protocol.md`` with bitwise
CRC implementations written in this file, never with the encoder under test.
"""

import random
import struct

import pytest

from host.spec import protocol as p
from host.spec.protocol import Frame, FrameDecoder, FrameError, Opcode, Status


def crc16_bitwise(data: bytes) -> int:
    """CRC-16/CCITT-FALSE, one bit at a time: poly 0x1021, init 0xFFFF, MSB first."""
    crc = 0xFFFF
    for byte in data:
        for i in range(7, -1, -1):
            bit = (byte >> i) & 1
            top = (crc >> 15) & 1
            crc = (crc << 1) & 0xFFFF
            if top ^ bit:
                crc ^= 0x1021
    return crc


def crc32_bitwise(data: bytes) -> int:
    """CRC-32 (IEEE 802.3), one bit at a time: poly 0x04C11DB7, reflected, init/xorout ~0."""
    crc = 0xFFFFFFFF
    for byte in data:
        for i in range(8):
            bit = (byte >> i) & 1
            low = crc & 1
            crc >>= 1
            if low ^ bit:
                crc ^= 0xEDB88320
    return crc ^ 0xFFFFFFFF


def frame_by_hand(opcode: int, tag: int, payload: bytes) -> bytes:
    head = bytes([0xA5, 0x5A, opcode, tag, len(payload) & 0xFF, len(payload) >> 8])
    check = crc16_bitwise(head)
    crc = crc32_bitwise(payload)
    return head + bytes([check & 0xFF, check >> 8]) + payload + crc.to_bytes(4, "little")


# --- CRCs ---------------------------------------------------------------------------------

@pytest.mark.parametrize("fn", [p.crc16, p.crc16_bytewise, crc16_bitwise])
def test_crc16_check_values(fn):
    assert fn(b"123456789") == 0x29B1 == p.CRC16_CHECK
    assert fn(b"A") == 0xB915
    assert fn(b"") == 0xFFFF


@pytest.mark.parametrize("fn", [p.crc32, p.crc32_bytewise, crc32_bitwise])
def test_crc32_check_values(fn):
    assert fn(b"123456789") == 0xCBF43926 == p.CRC32_CHECK
    assert fn(b"The quick brown fox jumps over the lazy dog") == 0x414FA339
    assert fn(b"") == 0


def test_crc_implementations_agree_on_random_data():
    rng = random.Random(1)
    for _ in range(200):
        data = rng.randbytes(rng.randrange(0, 300))
        assert p.crc16(data) == p.crc16_bytewise(data) == crc16_bitwise(data)
        assert p.crc32(data) == p.crc32_bytewise(data) == crc32_bitwise(data)
        cut = rng.randrange(0, len(data) + 1)       # continuation from a partial value
        assert p.crc16_bytewise(data[cut:], p.crc16_bytewise(data[:cut])) == p.crc16(data)
        assert p.crc32_bytewise(data[cut:], p.crc32_bytewise(data[:cut])) == p.crc32(data)


# --- layouts and enums --------------------------------------------------------------------

def test_enum_shapes_and_codes():
    assert Opcode.as_shape().width == 8 and Status.as_shape().width == 8
    assert all(op.value < p.REPLY for op in Opcode)
    assert len({op.value for op in Opcode}) == len(Opcode)
    assert Status.OK.value == 0


def test_layouts_match_the_byte_codecs():
    assert p.HEADER_LAYOUT.size == 64 and p.ACCESS_LAYOUT.size == 64
    # Byte i of the bytes is bits [8i, 8i+8) of the layout's value: check field offsets.
    raw = int.from_bytes(p.pack_access(space=3, addr=0x12345678, count=0x0102), "little")
    fields = p.ACCESS_LAYOUT
    assert (raw >> fields["addr"].offset) & 0xFFFFFFFF == 0x12345678
    assert (raw >> fields["count"].offset) & 0xFFFF == 0x0102
    assert (raw >> fields["space"].offset) & 0xFF == 3
    frame = p.encode_frame(Opcode.RUN, 0x42, b"xyz")
    head = int.from_bytes(frame[:8], "little")
    assert (head >> p.HEADER_LAYOUT["sync"].offset) & 0xFFFF == 0x5AA5
    assert (head >> p.HEADER_LAYOUT["opcode"].offset) & 0xFF == Opcode.RUN.value
    assert (head >> p.HEADER_LAYOUT["tag"].offset) & 0xFF == 0x42
    assert (head >> p.HEADER_LAYOUT["length"].offset) & 0xFFFF == 3
    assert p.STATUS_LAYOUT.size == 96 and p.INFO_LAYOUT.size == 32
    assert p.PROGRAM_LAYOUT.size == 64 and p.POP_LAYOUT.size == 16


# --- encoding -----------------------------------------------------------------------------

@pytest.mark.parametrize("length", [0, 1, 7, 255, 256, p.MAX_PAYLOAD])
def test_encode_frame_matches_the_documented_bytes(length):
    payload = random.Random(length).randbytes(length)
    for op in Opcode:
        assert p.encode_frame(op, 0x9C, payload) == frame_by_hand(op.value, 0x9C, payload)
    assert p.encode_reply(0x05, 7, Status.QUEUE_FULL) == frame_by_hand(0x85, 7, b"\x0a")


def test_encode_frame_refuses_bad_arguments():
    with pytest.raises(ValueError, match="MAX_PAYLOAD"):
        p.encode_frame(Opcode.WRITE, 0, bytes(p.MAX_PAYLOAD + 1))
    with pytest.raises(ValueError, match="tag must be from 0 to 255, not 256"):
        p.encode_frame(Opcode.WRITE, 256)
    with pytest.raises(TypeError, match="opcode must be an integer"):
        p.encode_frame("RUN", 0)


# --- decoding -----------------------------------------------------------------------------

def _frames(rng, k):
    out = []
    for i in range(k):
        payload = rng.randbytes(rng.choice([0, 1, 5, 100, 1000]))
        out.append((Frame(rng.randrange(256), i & 0xFF, payload)))
    return out


def _encode(f: Frame) -> bytes:
    return frame_by_hand(f.opcode, f.tag, f.payload)


def test_decoder_frames_back_to_back_any_split():
    rng = random.Random(2)
    frames = _frames(rng, 20)
    stream = b"".join(_encode(f) for f in frames)
    for chunk in [1, 2, 3, 7, 64, len(stream)]:
        dec = FrameDecoder()
        got = []
        for i in range(0, len(stream), chunk):
            got += dec.feed(stream[i:i + chunk])
        assert got == frames and dec.skipped == 0 and dec.pending == 0


def test_decoder_skips_garbage_between_frames():
    rng = random.Random(3)
    frames = _frames(rng, 30)
    stream, garbage = b"", 0
    for f in frames:
        junk = rng.randbytes(rng.randrange(0, 50))
        if rng.random() < 0.3:
            junk += b"\xA5\x5A" + rng.randbytes(3)       # a false start of a header
        stream += junk + _encode(f)
        garbage += len(junk)
    dec = FrameDecoder()
    got = []
    for i in range(0, len(stream), 17):
        got += dec.feed(stream[i:i + 17])
    assert got == frames
    assert dec.skipped == garbage


def test_decoder_waits_for_incomplete_frames():
    data = frame_by_hand(0x06, 1, b"abc")
    dec = FrameDecoder()
    for i in range(len(data) - 1):
        assert dec.feed(data[i:i + 1]) == []
    assert dec.feed(data[-1:]) == [Frame(0x06, 1, b"abc")]


def test_decoder_rejects_a_corrupted_header_silently():
    good = frame_by_hand(0x02, 5, b"hello")
    for bit in range(64):
        bad = bytearray(good)
        bad[bit // 8] ^= 1 << (bit % 8)
        dec = FrameDecoder()
        # A header with any single bit flipped is never believed: no event, and the next
        # frame is found.
        assert dec.feed(bytes(bad) + good) == [Frame(0x02, 5, b"hello")]


def test_decoder_bad_length_then_resync():
    long_header = bytes([0xA5, 0x5A, 0x02, 9, 0x01, 0x10])          # length 4097
    check = crc16_bitwise(long_header)
    bad = long_header + bytes([check & 0xFF, check >> 8])
    good = frame_by_hand(0x0B, 10, b"")
    assert FrameDecoder().feed(bad + good) == [FrameError(Status.BAD_LENGTH, 0x02, 9),
                                              Frame(0x0B, 10, b"")]
    # A smaller bound is a bound too.
    assert FrameDecoder(max_payload=2).feed(frame_by_hand(1, 2, b"abc") + good) == [
        FrameError(Status.BAD_LENGTH, 1, 2), Frame(0x0B, 10, b"")]


def test_decoder_bad_crc_then_resync():
    rng = random.Random(4)
    for _ in range(50):
        payload = rng.randbytes(rng.randrange(1, 200))
        bad = bytearray(frame_by_hand(0x02, 3, payload))
        pos = rng.randrange(8, len(bad))                # payload or trailer
        bad[pos] ^= 1 << rng.randrange(8)
        good = frame_by_hand(0x03, 4, b"ok")
        assert FrameDecoder().feed(bytes(bad) + good) == [FrameError(Status.BAD_CRC, 0x02, 3),
                                                         Frame(0x03, 4, b"ok")]


def test_decoder_finds_a_frame_swallowed_by_a_truncated_one():
    # A frame cut short: its length claims 40 bytes, but only 10 came before the next
    # frame. The next frame's bytes are read as its payload, the CRC fails, and the
    # decoder hunts again through the bytes it already has.
    whole = frame_by_hand(0x02, 1, bytes(range(40)))
    cut = whole[:8 + 10]
    nxt = frame_by_hand(0x03, 2, b"next")
    tail = frame_by_hand(0x0B, 3, bytes(100))           # completes the first frame's length
    events = FrameDecoder().feed(cut + nxt + tail)
    assert events == [FrameError(Status.BAD_CRC, 0x02, 1), Frame(0x03, 2, b"next"),
                      Frame(0x0B, 3, bytes(100))]


def test_decoder_flush_reports_truncation_and_keeps_later_frames():
    whole = frame_by_hand(0x02, 1, bytes(200))
    nxt = frame_by_hand(0x03, 2, b"next")
    dec = FrameDecoder()
    assert dec.feed(whole[:50] + nxt) == []              # still waiting for 200 bytes
    assert dec.flush() == [FrameError(Status.TRUNCATED, 0x02, 1), Frame(0x03, 2, b"next")]
    assert dec.pending == 0
    # A partial header cannot be addressed: dropped without an event.
    assert dec.feed(whole[:5]) == [] and dec.flush() == [] and dec.pending == 0
    assert dec.feed(nxt) == [Frame(0x03, 2, b"next")]


def test_decoder_keeps_a_split_sync():
    dec = FrameDecoder()
    data = frame_by_hand(0x01, 0, b"")
    assert dec.feed(b"\x00\x11" + data[:1]) == []
    assert dec.skipped == 2 and dec.pending == 1
    assert dec.feed(data[1:]) == [Frame(0x01, 0, b"")]


def test_decoder_parameter_validation():
    with pytest.raises(ValueError, match="max_payload must be from 0 to 4096, not 5000"):
        FrameDecoder(max_payload=5000)


# --- codecs -------------------------------------------------------------------------------

def test_access_and_program_codecs():
    raw = p.pack_access(15, 0xDEADBEEF, 513)
    assert raw == struct.pack("<IHBB", 0xDEADBEEF, 513, 15, 0)
    assert p.unpack_access(raw + b"rest") == (15, 0xDEADBEEF, 513)
    chunk = p.pack_program_chunk(8, 100, b"\x01" * 16)
    assert chunk[:8] == struct.pack("<II", 8, 100)
    assert p.unpack_program_chunk(chunk) == (8, 100, b"\x01" * 16)


def test_info_codec_round_trip_and_errors():
    entries = {"n": 16, "tiles": 2, "zero": 0, "big": (1 << 64) - 1}
    body = p.pack_info(entries)
    assert body[:4] == struct.pack("<HH", p.PROTOCOL_VERSION, p.MAX_PAYLOAD)
    assert body[4:6] == b"\x01n" and body[6:14] == struct.pack("<Q", 16)
    assert p.unpack_info(body) == {"protocol_version": p.PROTOCOL_VERSION,
                                   "max_payload": p.MAX_PAYLOAD, **entries}
    assert p.unpack_entries(p.pack_entries(entries)) == entries
    with pytest.raises(ValueError, match="'x' must be an integer from 0 to 2\\*\\*64-1"):
        p.pack_entries({"x": -1})
    with pytest.raises(ValueError, match="name 'é' must be 1 to 255 ASCII bytes"):
        p.pack_entries({"é": 1})
    with pytest.raises(ValueError, match="malformed entry at byte 37 "):
        p.unpack_info(body[:-1])
    with pytest.raises(ValueError, match="shorter than 4"):
        p.unpack_info(b"\x01")


def test_data_codecs():
    import numpy as np
    v = np.array([[0x0001, 0xFFFF, 0x7C00, 0x8000]], np.uint16)
    assert p.vectors_to_bytes(v) == bytes([1, 0, 0xFF, 0xFF, 0, 0x7C, 0, 0x80])
    assert (p.bytes_to_vectors(p.vectors_to_bytes(v), 4) == v).all()
    assert p.words_to_bytes([0x123456, 1], 3) == bytes([0x56, 0x34, 0x12, 1, 0, 0])
    assert p.bytes_to_words(bytes([0x56, 0x34, 0x12, 1, 0, 0]), 3) == [0x123456, 1]
    with pytest.raises(OverflowError):
        p.words_to_bytes([1 << 24], 3)
    words = np.array([1, (1 << 64) - 1], np.uint64)
    assert p.program_to_bytes(words) == bytes([1] + [0] * 7 + [0xFF] * 8)
    assert (p.bytes_to_program(p.program_to_bytes(words)) == words).all()
    assert p.pack_pop(513) == b"\x01\x02" and p.unpack_pop(b"\x01\x02") == 513
    body = p.pack_status(7, True, 5, 70000)
    assert body == struct.pack("<BBHII", 7, 1, 0, 5, 70000)
    assert p.unpack_status(body) == {"error": 7, "busy": True, "input_level": 5,
                                     "output_level": 70000}


def test_info_entries_carry_the_narrow_check_option():
    """INFO reports ``narrow_check`` as 1 or 0 after the other build fields; the host
    rebuilds the configuration from it, takes a device that does not report it (built
    before the option) as having the check, and refuses another value naming it."""
    from host.spec.config import NpuConfig
    for flag in (True, False):
        cfg = NpuConfig(n=8, tiles=1, narrow_check=flag)
        entries = p.info_entries(cfg)
        assert entries["narrow_check"] == int(flag)
        assert list(entries)[:len(p.CONFIG_FIELDS)] == list(p.CONFIG_FIELDS)
        assert p.config_from_entries(entries) == cfg
        assert p.unpack_info(p.pack_info(entries))["narrow_check"] == int(flag)
    old = p.info_entries(NpuConfig(n=8, tiles=1))
    del old["narrow_check"]
    assert p.config_from_entries(old).narrow_check is True
    with pytest.raises(ValueError, match="INFO entry narrow_check must be 0 or 1, not 2"):
        p.config_from_entries({**old, "narrow_check": 2})
    with pytest.raises(ValueError, match="INFO lacks the build parameters tiles"):
        p.config_from_entries({k: v for k, v in old.items() if k != "tiles"})
