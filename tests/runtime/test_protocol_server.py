"""``host.runtime.server.ProtocolServer`` against the reference model: every opcode, every error
reply, and the state left intact by every refused request.

Requests are built with ``host.spec.protocol.encode_frame`` (checked byte for byte against
hand-assembled frames in ``test_protocol.py``); reply payloads are unpacked here with
``struct`` from the layouts of ``docs/protocol.md``. Expected data come from a twin
``NpuModel`` driven directly through its own API, never from the server.
"""

import dataclasses
import enum
import hashlib
import random
import struct

import numpy as np
import pytest

from host.spec import protocol as p
from host.spec.config import NpuConfig
from host.spec.isa import ErrorCode, Instruction as I, Reg, Space, encode_program
from host.model.core import NpuModel
from host.spec.protocol import Frame, FrameDecoder, Opcode, Status
from host.runtime.server import ProtocolServer

#: A small build: every memory a few words deep, so that ranges are quick to exceed and
#: state snapshots are cheap.
SMALL = NpuConfig(n=4, tiles=2, mrf_depth=8, ivrf_depth=16, vrf_depth=16, netq_depth=16,
                  program_depth=64, max_length=4, max_col_tiles=4)
VECTOR_SPACES = [Space.IVRF, Space.ASVRF0, Space.MULVRF0, Space.ASVRF1, Space.MULVRF1]


# --- helpers shared with the fuzz, device and CLI tests ------------------------------------

def state_digest(obj) -> str:
    """A digest of everything an object holds (arrays, dicts, nested objects), to tell
    whether a request changed any state at all."""
    h = hashlib.sha256()

    def walk(x):
        if isinstance(x, np.ndarray):
            h.update(f"a{x.dtype}{x.shape}".encode())
            h.update(np.ascontiguousarray(x).tobytes())
        elif isinstance(x, dict):
            h.update(b"d")
            for k, v in x.items():
                walk(k)
                walk(v)
        elif isinstance(x, (list, tuple)):
            h.update(f"l{len(x)}".encode())
            for v in x:
                walk(v)
        elif isinstance(x, (bytes, bytearray)):
            h.update(b"b" + bytes(x))
        elif isinstance(x, enum.Enum) or (dataclasses.is_dataclass(x)
                                          and x.__dataclass_params__.frozen):
            h.update(repr(x).encode())               # immutable: its repr says it all
        elif hasattr(x, "__dict__") and not isinstance(x, type):
            h.update(type(x).__name__.encode())
            walk(vars(x))
        else:
            h.update(repr(x).encode())

    walk(obj)
    return h.hexdigest()


def device_state(server: ProtocolServer) -> str:
    """Digest of the backend's state and the server's program staging."""
    return state_digest([server.backend, bytes(server._staged), server._staged_total])


def random_vectors(rng, count, n):
    """Random FP16 bit patterns, NaN and inf included."""
    return rng.integers(0, 1 << 16, (count, n), dtype=np.uint16)


def random_mrf_words(rng, count, config):
    """Random MRF words with legal exponent codes (0..142)."""
    bits = 8 + config.n * config.mantissa_bits_w
    return [(int(rng.integers(0, 1 << 62)) << 64 | int(rng.integers(0, 1 << 62))) % (1 << bits)
            & ~0xFF | int(rng.integers(0, 143)) for _ in range(count)]


def mlp_network(config, rng, steps=3):
    """A two-layer MLP over logical vectors of 2n values, run over a sequence of
    ``steps`` vectors: ``sigmoid(W2 relu(W1 x + b))``. Returns ``(program, memories)``
    with ``memories`` a list of ``(space, addr, data)``; each job pushes ``2*steps``
    vectors and pops ``2*steps``.
    """
    n = config.n
    scratch = NpuModel(config)
    w1 = (rng.standard_normal((2 * n, 2 * n)) * 0.5).astype(np.float16)
    w2 = (rng.standard_normal((2 * n, 2 * n)) * 0.5).astype(np.float16)
    scratch.write_weights(0, w1)
    scratch.write_weights(2, w2)
    words = 4 * config.tiles * n                 # tile slots 0..3 of every engine
    bias = rng.standard_normal((2, n)).astype(np.float16).view(np.uint16)
    memories = [(Space.MRF, 0, scratch.read(Space.MRF, 0, words)), (Space.ASVRF0, 0, bias)]
    program = encode_program([
        I.s_wr(Reg.ROWS, 2 * n), I.s_wr(Reg.COLS, 2 * n), I.s_wr(Reg.ITERATIONS, steps),
        I.v_rd(Space.NETQ), I.mv_mul(0), I.vv("add", 0), I.unary("relu"),
        I.v_wr(Space.IVRF, 0, 2), I.end_chain(),
        I.v_rd(Space.IVRF, 0, 2), I.mv_mul(2), I.unary("sigmoid"), I.v_wr(Space.NETQ),
        I.end_chain(), I.end()])
    return program, memories


class Link:
    """A ProtocolServer over a model, and a twin model for the expected results."""

    def __init__(self, config=SMALL, backend=None):
        self.model = backend if backend is not None else NpuModel(config)
        self.twin = NpuModel(self.model.config)
        self.server = ProtocolServer(self.model)
        self.config = self.model.config
        self.tag = 0

    def send_raw(self, data: bytes, idle=False):
        """Feed bytes; returns the replies as ``(opcode, tag, Status, body)``."""
        out = self.server.feed(data)
        if idle:
            out += self.server.idle()
        replies = []
        for ev in FrameDecoder().feed(out):
            assert isinstance(ev, Frame) and ev.opcode & p.REPLY and ev.payload
            replies.append((ev.opcode, ev.tag, Status(ev.payload[0]), ev.payload[1:]))
        return replies

    def request(self, opcode, payload=b""):
        """One request; asserts exactly one reply with its opcode and tag; returns
        ``(Status, body)``."""
        self.tag = (self.tag + 1) & 0xFF
        op = opcode.value if isinstance(opcode, Opcode) else opcode
        replies = self.send_raw(p.encode_frame(op, self.tag, payload))
        assert len(replies) == 1
        r_op, r_tag, status, body = replies[0]
        assert (r_op, r_tag) == (op | p.REPLY, self.tag)
        return status, body

    def ok(self, opcode, payload=b""):
        status, body = self.request(opcode, payload)
        assert status is Status.OK, (status, body)
        return body

    def write(self, space, addr, data):
        size = p.word_bytes(self.config, space.value)
        if space is Space.MRF:
            raw = b"".join(w.to_bytes(size, "little") for w in data)
        else:
            raw = np.asarray(data, "<u2").tobytes()
        return p.pack_access(space.value, addr, len(data)) + raw

    def read_vectors(self, space, addr, count):
        body = self.ok(Opcode.READ, p.pack_access(space.value, addr, count))
        return np.frombuffer(body, "<u2").reshape(count, self.config.n)

    def state(self):
        return device_state(self.server)


def load_mlp(link, rng, steps=3):
    program, memories = mlp_network(link.config, rng, steps)
    for space, addr, data in memories:
        link.ok(Opcode.WRITE, link.write(space, addr, data))
        link.twin.write(space, addr, data)
    link.ok(Opcode.LOAD_PROGRAM, p.pack_program_chunk(0, len(program), program.tobytes()))
    link.twin.load_program(program)
    return program


# --- every opcode ---------------------------------------------------------------------------

def test_info_reports_version_and_build_parameters():
    link = Link()
    body = link.ok(Opcode.INFO)
    version, max_payload = struct.unpack_from("<HH", body)
    assert (version, max_payload) == (p.PROTOCOL_VERSION, 4096)
    entries = p.unpack_entries(body[4:])
    fields = dataclasses.asdict(SMALL)
    mask = sum(1 << op.value for op in fields.pop("unary_ops"))
    # Every unit in every MFU: no unit_sets entry (host.spec.protocol.UNIT_SETS_ENTRY).
    assert fields.pop("unit_sets") is None and "unit_sets" not in entries
    # Vector units as wide as n: no lanes entry (host.spec.protocol.LANES_ENTRY).
    assert fields.pop("lanes") == SMALL.n and "lanes" not in entries
    assert {k: entries[k] for k in fields} == fields
    assert entries["unary_ops"] == mask
    assert entries["mrf_words"] == SMALL.tiles * SMALL.n * SMALL.mrf_depth


@pytest.mark.parametrize("space", VECTOR_SPACES)
def test_write_then_read_every_vector_space(space):
    link = Link()
    rng = np.random.default_rng(space.value)
    data = random_vectors(rng, 5, SMALL.n)
    link.ok(Opcode.WRITE, link.write(space, 3, data))
    link.twin.write(space, 3, data)
    assert (link.model.read(space, 0, 16) == link.twin.read(space, 0, 16)).all()
    assert (link.read_vectors(space, 3, 5) == data).all()
    assert (link.read_vectors(space, 0, 16) == link.twin.read(space, 0, 16)).all()


def test_write_then_read_mrf_words():
    link = Link()
    rng = np.random.default_rng(7)
    words = random_mrf_words(rng, 9, SMALL)
    link.ok(Opcode.WRITE, link.write(Space.MRF, 5, words))
    size = p.word_bytes(SMALL, Space.MRF.value)
    assert size == (8 + SMALL.n * SMALL.mantissa_bits_w + 7) // 8
    body = link.ok(Opcode.READ, p.pack_access(Space.MRF.value, 5, 9))
    assert [int.from_bytes(body[i:i + size], "little") for i in range(0, len(body), size)] \
        == words == link.model.read(Space.MRF, 5, 9)


def test_push_run_pop_match_the_model():
    link = Link()
    rng = np.random.default_rng(8)
    load_mlp(link, rng, steps=3)
    for _ in range(3):
        x = rng.standard_normal((6, SMALL.n)).astype(np.float16).view(np.uint16)
        link.ok(Opcode.PUSH_INPUT, x.astype("<u2").tobytes())
        link.twin.push_input(x)
        entries = p.unpack_entries(link.ok(Opcode.RUN))
        want = link.twin.run()
        assert want.ok
        assert entries == {"cycles_predicted": want.cycles_predicted, "chains": want.chains,
                           "instructions": want.instructions, "pc": want.pc}
        status = struct.unpack("<BBHII", link.ok(Opcode.STATUS))
        assert status == (0, 0, 0, 0, 6)
        body = link.ok(Opcode.POP_OUTPUT, struct.pack("<H", 6))
        assert (np.frombuffer(body, "<u2").reshape(6, SMALL.n) == link.twin.pop_output(6)).all()
    assert p.unpack_entries(link.ok(Opcode.READ_COUNTERS)) == link.twin.counters()
    assert any(link.twin.counters().values())        # the comparison saw non-zero counts


def test_load_program_in_chunks():
    config = dataclasses.replace(SMALL, program_depth=1200)
    link = Link(config)
    rng = np.random.default_rng(9)
    _, memories = mlp_network(config, rng)
    for space, addr, data in memories:
        link.ok(Opcode.WRITE, link.write(space, addr, data))
    # 1100 s_wr, then one chain: RUN's instruction count shows every chunk arrived.
    words = encode_program([I.s_wr(Reg.ITERATIONS, 1 + i % 3) for i in range(1100)]
                           + [I.s_wr(Reg.ITERATIONS, 1), I.v_rd(Space.IVRF, 0),
                              I.v_wr(Space.NETQ), I.end_chain(), I.end()])
    total = len(words)
    cuts = [0, 511, 1022, total]
    for a, b in zip(cuts, cuts[1:]):
        link.ok(Opcode.LOAD_PROGRAM, p.pack_program_chunk(a, total, words[a:b].tobytes()))
    entries = p.unpack_entries(link.ok(Opcode.RUN))
    assert entries["instructions"] == total and entries["pc"] == total - 1


def test_counters_clear_reset_status_clear_error():
    link = Link()
    rng = np.random.default_rng(10)
    load_mlp(link, rng)
    x = np.full((6, SMALL.n), 0x7BFF, np.uint16)        # FP16 max: saturates the quantizer
    link.ok(Opcode.PUSH_INPUT, x.tobytes())
    link.ok(Opcode.RUN)
    assert p.unpack_entries(link.ok(Opcode.READ_COUNTERS)) == link.model.counters()
    assert link.model.counters()["vector_saturations"] > 0
    assert link.ok(Opcode.CLEAR_COUNTERS) == b""
    assert set(p.unpack_entries(link.ok(Opcode.READ_COUNTERS)).values()) == {0}
    # A failed run sets the sticky error; STATUS shows it and CLEAR_ERROR clears it.
    status, body = link.request(Opcode.RUN)
    assert status is Status.DEVICE_ERROR and body[0] == ErrorCode.QUEUE_UNDERFLOW.value
    assert p.unpack_entries(body[1:])["pc"] == 3
    assert struct.unpack("<BBHII", link.ok(Opcode.STATUS))[0] == ErrorCode.QUEUE_UNDERFLOW.value
    link.ok(Opcode.CLEAR_ERROR)
    assert struct.unpack("<BBHII", link.ok(Opcode.STATUS)) == (0, 0, 0, 0, 6)
    link.ok(Opcode.RESET)
    assert link.state() == Link().state()


# --- error replies --------------------------------------------------------------------------

def _prepared(rng_seed=11):
    """A link whose model holds data everywhere, a program and queued vectors."""
    link = Link()
    rng = np.random.default_rng(rng_seed)
    load_mlp(link, rng)
    for space in VECTOR_SPACES[1:]:
        link.ok(Opcode.WRITE, link.write(space, 8, random_vectors(rng, 4, SMALL.n)))
    link.ok(Opcode.PUSH_INPUT, random_vectors(rng, 3, SMALL.n).tobytes())
    return link


def _then_valid(link, before):
    """The state is what it was, and a valid request succeeds."""
    assert link.state() == before
    assert (link.read_vectors(Space.ASVRF1, 8, 4) == link.model.read(Space.ASVRF1, 8, 4)).all()
    link.ok(Opcode.STATUS)


def test_bad_crc():
    link = _prepared()
    before = link.state()
    frame = bytearray(p.encode_frame(Opcode.WRITE, 0x33, link.write(
        Space.IVRF, 0, np.zeros((2, 4), np.uint16))))
    frame[12] ^= 0x10                                   # a payload byte
    assert link.send_raw(bytes(frame)) == [(Opcode.WRITE.value | p.REPLY, 0x33,
                                            Status.BAD_CRC, b"")]
    _then_valid(link, before)


def test_bad_length_over_the_bound():
    link = _prepared()
    before = link.state()
    head = struct.pack("<2sBBH", p.SYNC, Opcode.WRITE.value, 5, p.MAX_PAYLOAD + 1)
    frame = head + struct.pack("<H", p.crc16(head)) + bytes(p.MAX_PAYLOAD + 5)
    assert link.send_raw(frame) == [(Opcode.WRITE.value | p.REPLY, 5, Status.BAD_LENGTH, b"")]
    _then_valid(link, before)


@pytest.mark.parametrize("opcode,payload", [
    (Opcode.INFO, b"\x00"),
    (Opcode.WRITE, b"\x00" * 7),                                   # prefix cut short
    (Opcode.WRITE, p.pack_access(Space.IVRF.value, 0, 2) + bytes(15)),   # 16 expected
    (Opcode.READ, p.pack_access(Space.IVRF.value, 0, 2) + b"\x00"),
    (Opcode.LOAD_PROGRAM, p.pack_program_chunk(0, 1, bytes(7))),
    (Opcode.LOAD_PROGRAM, b"\x00" * 4),
    (Opcode.PUSH_INPUT, bytes(12)),                                # not whole vectors
    (Opcode.PUSH_INPUT, b""),
    (Opcode.RUN, b"\x00"),
    (Opcode.POP_OUTPUT, b"\x01"),
    (Opcode.READ_COUNTERS, b"\x00"), (Opcode.CLEAR_COUNTERS, b"\x00"),
    (Opcode.RESET, b"\x00"), (Opcode.STATUS, b"\x00"), (Opcode.CLEAR_ERROR, b"\x00"),
])
def test_bad_length_for_the_opcode(opcode, payload):
    link = _prepared()
    before = link.state()
    assert link.request(opcode, payload) == (Status.BAD_LENGTH, b"")
    _then_valid(link, before)


@pytest.mark.parametrize("opcode", [0x00, 0x0D, 0x7F, 0x80, 0x81, 0xFF])
def test_unknown_opcode(opcode):
    link = _prepared()
    before = link.state()
    assert link.request(opcode, b"abc") == (Status.UNKNOWN_OPCODE, b"")
    _then_valid(link, before)


def test_truncated_frame():
    link = _prepared()
    before = link.state()
    frame = p.encode_frame(Opcode.WRITE, 9, link.write(Space.IVRF, 0, np.ones((3, 4),
                                                                          np.uint16)))
    assert link.send_raw(frame[:20]) == []               # waits for the rest
    assert link.state() == before
    assert link.send_raw(b"", idle=True) == [(Opcode.WRITE.value | p.REPLY, 9,
                                              Status.TRUNCATED, b"")]
    _then_valid(link, before)


def test_truncated_frame_followed_by_a_valid_one():
    # The truncated frame swallows the next request; the server still finds and runs it.
    link = _prepared()
    before = link.state()
    cut = p.encode_frame(Opcode.WRITE, 1, link.write(Space.IVRF, 0, np.ones((8, 4),
                                                                        np.uint16)))[:30]
    status = p.encode_frame(Opcode.STATUS, 2)
    replies = link.send_raw(cut + status, idle=True)
    assert [(r[1], r[2]) for r in replies] == [(1, Status.TRUNCATED), (2, Status.OK)]
    _then_valid(link, before)


@pytest.mark.parametrize("opcode", [Opcode.WRITE, Opcode.READ])
@pytest.mark.parametrize("space,addr,count,status", [
    (Space.NETQ.value, 0, 1, Status.BAD_SPACE),         # queues: PUSH/POP only
    (10, 0, 1, Status.BAD_SPACE), (14, 0, 1, Status.BAD_SPACE), (16, 0, 1, Status.BAD_SPACE),
    (255, 0, 1, Status.BAD_SPACE),
    (Space.ASVRF2.value, 0, 1, Status.BAD_SPACE),       # MFU 2 is not built (mfus=2)
    (Space.MULVRF3.value, 0, 1, Status.BAD_SPACE),
    (Space.IVRF.value, 0, 0, Status.BAD_COUNT),
    (Space.IVRF.value, 16, 1, Status.BAD_ADDRESS),
    (Space.IVRF.value, 15, 2, Status.BAD_ADDRESS),
    (Space.ASVRF1.value, 0xFFFFFFFF, 1, Status.BAD_ADDRESS),
    (Space.MRF.value, SMALL.mrf_words - 1, 2, Status.BAD_ADDRESS),
])
def test_out_of_range_access(opcode, space, addr, count, status):
    link = _prepared()
    before = link.state()
    payload = p.pack_access(space, addr, count)
    if opcode is Opcode.WRITE and status is not Status.BAD_SPACE:
        payload += bytes(count * p.word_bytes(SMALL, space))
    assert link.request(opcode, payload) == (status, b"")
    _then_valid(link, before)


def test_read_count_beyond_one_reply():
    link = Link(dataclasses.replace(SMALL, ivrf_depth=2048))
    per = (p.MAX_PAYLOAD - 1) // (2 * SMALL.n)
    assert link.request(Opcode.READ, p.pack_access(Space.IVRF.value, 0, per + 1)) == (
        Status.BAD_COUNT, b"")
    assert len(link.ok(Opcode.READ, p.pack_access(Space.IVRF.value, 0, per))) == per * 8


def test_checks_come_in_the_documented_order():
    link = _prepared()
    # Space before count before data length before address.
    assert link.request(Opcode.WRITE, p.pack_access(12, 99, 0))[0] is Status.BAD_SPACE
    assert link.request(Opcode.WRITE, p.pack_access(1, 99, 0))[0] is Status.BAD_COUNT
    assert link.request(Opcode.WRITE, p.pack_access(1, 99, 1))[0] is Status.BAD_LENGTH
    assert link.request(Opcode.WRITE, p.pack_access(1, 99, 1) + bytes(8))[0] \
        is Status.BAD_ADDRESS
    # The opcode before the length; the length before the halted state.
    assert link.request(0x42, bytes(3))[0] is Status.UNKNOWN_OPCODE


def test_queue_full_and_empty():
    link = _prepared()                                   # 3 vectors queued of 16
    before = link.state()
    assert link.request(Opcode.PUSH_INPUT, bytes(14 * 8)) == (Status.QUEUE_FULL, b"")
    _then_valid(link, before)
    assert link.request(Opcode.POP_OUTPUT, struct.pack("<H", 1)) == (Status.QUEUE_EMPTY, b"")
    assert link.request(Opcode.POP_OUTPUT, struct.pack("<H", 0)) == (Status.BAD_COUNT, b"")
    _then_valid(link, before)
    link.ok(Opcode.PUSH_INPUT, bytes(13 * 8))            # exactly full
    assert link.model.input_level == 16


def test_device_error_from_the_backend_changes_nothing():
    link = _prepared()
    before = link.state()
    word = random_mrf_words(np.random.default_rng(1), 1, SMALL)[0] & ~0xFF | 200
    status, body = link.request(Opcode.WRITE, link.write(Space.MRF, 0, [word]))
    assert (status, body) == (Status.DEVICE_ERROR, bytes([ErrorCode.MRF_WORD.value]))
    _then_valid(link, before)
    assert link.model.error is ErrorCode.NONE        # host requests never set the flag


def test_error_flag_halts_queue_and_run_requests():
    link = Link()
    rng = np.random.default_rng(12)
    load_mlp(link, rng)
    link.ok(Opcode.PUSH_INPUT, random_vectors(rng, 2, SMALL.n).tobytes())   # 6 needed
    status, body = link.request(Opcode.RUN)
    assert status is Status.DEVICE_ERROR and body[0] == ErrorCode.QUEUE_UNDERFLOW.value
    before = link.state()
    code = bytes([ErrorCode.QUEUE_UNDERFLOW.value])
    assert link.request(Opcode.PUSH_INPUT, bytes(8)) == (Status.DEVICE_ERROR, code)
    assert link.request(Opcode.RUN) == (Status.DEVICE_ERROR, code)
    assert link.request(Opcode.POP_OUTPUT, struct.pack("<H", 1)) == (Status.DEVICE_ERROR, code)
    _then_valid(link, before)
    link.ok(Opcode.WRITE, link.write(Space.IVRF, 0, np.ones((1, 4), np.uint16)))   # allowed
    link.ok(Opcode.CLEAR_ERROR)
    link.ok(Opcode.PUSH_INPUT, random_vectors(rng, 4, SMALL.n).tobytes())
    link.ok(Opcode.RUN)


def test_busy_backend():
    class Busy(NpuModel):
        busy = True

    link = Link(backend=Busy(SMALL))
    before = link.state()
    for opcode, payload in [(Opcode.WRITE, link.write(Space.IVRF, 0, np.ones((1, 4),
                                                                           np.uint16))),
                            (Opcode.RUN, b""), (Opcode.RESET, b""), (Opcode.PUSH_INPUT, bytes(8))]:
        assert link.request(opcode, payload) == (Status.BUSY, b"")
    assert link.state() == before
    link.ok(Opcode.INFO)
    link.ok(Opcode.READ_COUNTERS)
    assert struct.unpack("<BBHII", link.ok(Opcode.STATUS))[1] == 1


def test_program_chunks_out_of_order_or_too_long():
    config = dataclasses.replace(SMALL, program_depth=1200)
    link = Link(config)
    load_mlp(link, np.random.default_rng(13))
    before = link.state()
    word = encode_program([I.end()]).tobytes()
    assert link.request(Opcode.LOAD_PROGRAM, p.pack_program_chunk(5, 10, word * 5)) == (
        Status.BAD_ADDRESS, b"")                          # no load in progress
    assert link.request(Opcode.LOAD_PROGRAM, p.pack_program_chunk(0, 1201, word)) == (
        Status.BAD_COUNT, b"")                            # beyond program_depth
    assert link.request(Opcode.LOAD_PROGRAM, p.pack_program_chunk(0, 0, word)) == (
        Status.BAD_COUNT, b"")
    assert link.request(Opcode.LOAD_PROGRAM, p.pack_program_chunk(0, 2, word * 3)) == (
        Status.BAD_ADDRESS, b"")                          # more words than the total
    _then_valid(link, before)
    # A load begun and abandoned leaves the program in force; a gap is refused.
    link.ok(Opcode.LOAD_PROGRAM, p.pack_program_chunk(0, 10, word * 4))
    staged = link.state()
    assert link.request(Opcode.LOAD_PROGRAM, p.pack_program_chunk(5, 10, word * 5)) == (
        Status.BAD_ADDRESS, b"")
    assert link.request(Opcode.LOAD_PROGRAM, p.pack_program_chunk(4, 11, word * 7)) == (
        Status.BAD_ADDRESS, b"")                          # the total changed
    assert link.state() == staged
    x = random_vectors(np.random.default_rng(2), 6, SMALL.n)
    link.ok(Opcode.PUSH_INPUT, x.tobytes())
    assert p.unpack_entries(link.ok(Opcode.RUN))["chains"] == 6     # the MLP still runs


def test_garbage_between_frames():
    link = _prepared()
    rng = random.Random(14)
    before = link.state()
    stream, tags = b"", []
    for tag in range(40):
        stream += rng.randbytes(rng.randrange(0, 40))
        if rng.random() < 0.3:
            stream += p.SYNC + rng.randbytes(rng.randrange(0, 6))    # false starts
        stream += p.encode_frame(Opcode.STATUS, tag)
        tags.append(tag)
    replies = []
    for i in range(0, len(stream), 23):
        replies += link.send_raw(stream[i:i + 23])
    assert [r[1] for r in replies] == tags
    assert all(r[2] is Status.OK for r in replies)
    assert link.state() == before
    assert link.server.stats["skipped"] > 0
