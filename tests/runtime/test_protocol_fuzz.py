"""Seeded fuzz test of ``host.runtime.server.ProtocolServer``: 12,000 random and mutated frames.

Each case feeds the server one unit of bytes: a valid request with random (often out of
range) fields, or one mutated (bits flipped anywhere, cut short, lengthened, wrong length
with a recomputed header check, random opcode, garbage around it). After each unit the
test checks that

* no exception escaped and the call returned (the server is synchronous: no hang);
* every reply is a well-formed reply frame to a request that was sent, with a known
  status;
* a unit whose replies are all refusals left the device state (model memories, queues,
  program, registers, counters, error flag, the server's program staging) exactly as it
  was. The one refusal allowed to change state is a RUN that executed and failed
  (DEVICE_ERROR while the flag was clear): it ran the chains before the failing one and
  set the flag, as documented.

The valid requests keep the model busy with real work (a small MLP program, queue
traffic, memory writes), so refusals are tested against varied states.
"""

import random
import struct

import numpy as np

from host.spec import protocol as p
from host.spec.isa import Space
from host.spec.protocol import Frame, FrameDecoder, Opcode, Status

from test_protocol_server import SMALL, Link, device_state, load_mlp

CASES = 12_000
SEED = 20240607


def _random_request(rng: random.Random, link: Link):
    """A request with random fields, legal often enough to change state."""
    n = SMALL.n
    op = rng.choice(list(Opcode))
    if op is Opcode.WRITE or op is Opcode.READ:
        space = rng.choice([0, 1, 1, 2, 3, 4, 5, 6, 15, 15, rng.randrange(256)])
        depth = p.space_depth(SMALL, space) or 16
        addr = rng.choice([0, rng.randrange(depth), depth - 1, depth, rng.randrange(1 << 32)])
        count = rng.choice([0, 1, 2, rng.randrange(1, 8), depth])
        payload = p.pack_access(space, addr, count)
        if op is Opcode.WRITE:
            size = p.word_bytes(SMALL, space) if 0 <= space < 256 else 8
            data = bytearray(rng.randbytes(count * size))
            if space == Space.MRF.value:
                for i in range(0, len(data), size):
                    data[i] = rng.randrange(0, 160)        # mostly legal exponent codes
            payload += bytes(data)
        return op, payload
    if op is Opcode.LOAD_PROGRAM:
        if rng.random() < 0.5:
            from test_protocol_server import mlp_network
            words = mlp_network(SMALL, np.random.default_rng(rng.randrange(1 << 30)))[0]
            raw = words.tobytes()
        else:
            raw = rng.randbytes(8 * rng.randrange(1, 12))
        total = len(raw) // 8
        offset = rng.choice([0, 0, 0, rng.randrange(4)])
        return op, p.pack_program_chunk(offset, rng.choice([total, total + 1, 65]), raw)
    if op is Opcode.PUSH_INPUT:
        return op, rng.randbytes(2 * n * rng.choice([1, 2, 6, 6, 17]))
    if op is Opcode.POP_OUTPUT:
        return op, struct.pack("<H", rng.choice([0, 1, 2, 6, 600]))
    return op, b""


def _mutate(rng: random.Random, frame: bytes) -> bytes:
    data = bytearray(frame)
    kind = rng.randrange(9)
    if kind == 0:                                   # flip bits anywhere
        for _ in range(rng.randrange(1, 4)):
            i = rng.randrange(len(data))
            data[i] ^= 1 << rng.randrange(8)
    elif kind == 1:                                 # cut short
        del data[rng.randrange(1, len(data)):]
    elif kind == 2:                                 # extra bytes inside the payload
        i = rng.randrange(p.HEADER_BYTES, len(data) + 1)
        data[i:i] = rng.randbytes(rng.randrange(1, 9))
    elif kind == 3:                                 # wrong length, header check recomputed
        length = rng.choice([0, 1, len(data) - 12 + rng.choice([-2, -1, 1, 8]), 4096, 4097,
                             0xFFFF])
        length = max(0, min(length, 0xFFFF))
        data[4:6] = struct.pack("<H", length)
        data[6:8] = struct.pack("<H", p.crc16(bytes(data[:6])))
    elif kind == 4:                                 # random opcode, header check recomputed
        data[2] = rng.randrange(256)
        data[6:8] = struct.pack("<H", p.crc16(bytes(data[:6])))
    elif kind == 5:                                 # payload corrupted, CRC recomputed
        if len(data) > 12:
            i = rng.randrange(8, len(data) - 4)
            data[i] = rng.randrange(256)
            data[-4:] = struct.pack("<I", p.crc32(bytes(data[8:-4])))
    elif kind == 6:                                 # garbage before
        data[0:0] = rng.randbytes(rng.randrange(1, 30))
    elif kind == 7:                                 # a false sync before
        data[0:0] = p.SYNC + rng.randbytes(rng.randrange(0, 7))
    else:                                           # pure garbage
        data = bytearray(rng.randbytes(rng.randrange(1, 64)))
    return bytes(data)


def test_fuzz_protocol_server():
    rng = random.Random(SEED)
    link = Link()
    load_mlp(link, np.random.default_rng(SEED))
    statuses = {s: 0 for s in Status}
    tag = 0
    for case in range(CASES):
        op, payload = _random_request(rng, link)
        tag = (tag + 1) & 0xFF
        frame = p.encode_frame(op, tag, payload)
        mutated = rng.random() < 0.6
        data = _mutate(rng, frame) if mutated else frame
        error_before = link.model.error
        before = device_state(link.server)
        out = link.server.feed(data)
        if link.server.pending:                        # the link goes quiet
            out += link.server.idle()
        assert link.server.pending == 0
        events = FrameDecoder().feed(out)
        replies = []
        for ev in events:
            assert isinstance(ev, Frame), f"case {case}: damaged reply {ev}"
            assert ev.opcode & p.REPLY and len(ev.payload) >= 1, f"case {case}"
            status = Status(ev.payload[0])
            statuses[status] += 1
            replies.append((ev.opcode & 0x7F, status, ev.payload))
        if not mutated:
            assert len(replies) == 1 and replies[0][0] == op.value, f"case {case}"
        state_may_change = any(
            status is Status.OK
            or (opc == Opcode.RUN.value and status is Status.DEVICE_ERROR
                and error_before.value == 0)
            for opc, status, _ in replies)
        if not state_may_change:
            assert device_state(link.server) == before, \
                f"case {case}: refused request changed the state ({replies})"
        if rng.random() < 0.02:                        # keep runs possible
            link.server.feed(p.encode_frame(Opcode.CLEAR_ERROR, 0))
    # The fuzzer reached every kind of reply (a weak fuzzer would pass trivially).
    missing = [s.name for s, k in statuses.items() if k == 0 and s is not Status.BUSY]
    assert not missing, f"statuses never produced: {missing}"
    assert statuses[Status.OK] > CASES // 10
