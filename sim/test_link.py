"""cocotb bench of the host link in gateware (``hw.board.board.SimBoard``: link and core).

Every byte sent to the board is also fed to ``host.runtime.server.ProtocolServer`` over a
``host.model.core.NpuModel`` of the same build, and the replies must be identical, byte for
byte. The one documented difference, RUN's entries (the core reports its measured
``cycles`` and ``pc``, the model its prediction): the reference server runs over an
adapter that reports ``cycles`` and ``pc`` too, and the board's ``cycles`` value is put
into the expected frame before the comparison (it must be positive).

State is compared through the protocol itself: :meth:`LinkTB.digest` reads every word of
every memory, the counters and the status from both sides.

Every test starts with a RESET request, so that memories an earlier test in the same
simulation wrote do not differ from the fresh model's. Letting the link go idle waits out
the board's truncation timeout only when either side holds bytes (the wait dominated the
fuzz's run time).

Parameters (environment): ``LINK_CONFIG`` (JSON ``NpuConfig`` fields), ``LINK_TRUNCATE``
(the board's truncation timeout in cycles), ``LINK_FUZZ`` and ``LINK_SEED`` (frames and
seed of the fuzz), ``LINK_DIGEST_AFTER_RESET`` (``0``: ``test_opcodes`` reads only the
status and counters after its final RESET, not every memory again; default ``1``).
``tests/hw/test_link_hw.py`` says what the regression runs. With ``LINK_DIGEST`` set (a
file path), each test appends a line of JSON to that file: its name and a digest of every
reply byte with the cycle it left in, so that a restructured link can be shown to answer
with the same bytes in the same cycles.
"""

from __future__ import annotations

import hashlib
import json
import os
import random

import cocotb
import numpy as np
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, RisingEdge

from host.spec import protocol as p
from host.compiler.asm import assemble
from host.spec.config import NpuConfig
from host.spec.isa import Instruction as I, Space, encode_program, vector_spaces
from host.model.core import NpuModel
from host.spec.protocol import MAX_PAYLOAD, Opcode, Status
from sim.randprog import random_fp16
from host.runtime.server import ProtocolServer
from sim.stream import StreamMonitor, StreamSink, StreamSource, stream_signals

PERIOD_NS = 10


def load_config() -> NpuConfig:
    return NpuConfig.from_json(os.environ["LINK_CONFIG"])


#: Programs the benches run: pass-through, a product with an activation, IVRF writes,
#: and three that fail (an all-zero word, no ``end``, a register out of range).
PROGRAMS = {
    "copy": "v_rd netq\nv_wr netq\nend_chain\nend",
    "mvm": "v_rd netq\nmv_mul 0\nv_relu\nv_wr netq\nend_chain\nend",
    "ivrf": "v_rd ivrf, 2\nv_sigm\nv_wr ivrf, 3\nv_wr netq\nend_chain\nend",
    "bad_reg": "s_wr rows, 0\nend",
}


def program_words(name: str) -> np.ndarray:
    if name == "zero":
        return np.zeros(3, np.uint64)
    if name == "no_end":                   # the assembler refuses it; encoded directly
        return encode_program([I.v_rd(Space.IVRF, 0), I.v_wr(Space.IVRF, 1), I.end_chain()])
    return assemble(PROGRAMS[name])


class _RunReport:
    """What the reference server reports for RUN: the board's entry names."""

    def __init__(self, result):
        self.error = result.error
        self._pc = result.pc

    def _asdict(self):
        return {"cycles": 0, "pc": self._pc}


class _ModelBackend:
    """``NpuModel`` with RUN reported as the board reports it."""

    def __init__(self, model):
        self._model = model

    def __getattr__(self, name):
        return getattr(self._model, name)

    def run(self):
        return _RunReport(self._model.run())


def split_frames(raw: bytes) -> list[bytes]:
    """A reply stream cut into whole frames (every reply is a well-formed frame)."""
    frames, pos = [], 0
    while pos < len(raw):
        assert raw[pos:pos + 2] == p.SYNC, f"reply stream out of frame at byte {pos}"
        length = int.from_bytes(raw[pos + 4:pos + 6], "little")
        end = pos + p.HEADER_BYTES + length + p.TRAILER_BYTES
        frames.append(raw[pos:end])
        pos = end
    return frames


class LinkTB:
    """Clock, reset, the byte-stream models and the reference server."""

    def __init__(self, dut, *, seed=0, idle=0.0, backpressure=0.0):
        self.dut = dut
        self.config = load_config()
        self.truncate = int(os.environ["LINK_TRUNCATE"])
        self.model = NpuModel(self.config)
        self.server = ProtocolServer(_ModelBackend(self.model))
        self.rand = random.Random(seed)
        self._stalls = (seed, idle, backpressure)
        cocotb.start_soon(Clock(dut.clk, PERIOD_NS, unit="ns").start())
        self.seen = 0
        self.runs = 0

    async def reset(self):
        self.dut.rst.value = 1
        self.dut.rx__valid.value = 0
        await ClockCycles(self.dut.clk, 3)
        self.dut.rst.value = 0
        await ClockCycles(self.dut.clk, 2)
        # The bus models start once the board is out of reset and its START state (its
        # outputs are defined).
        seed, idle, backpressure = self._stalls
        dut = self.dut
        self.src = StreamSource(dut.clk, *stream_signals(dut, "rx"), idle_prob=idle,
                                seed=seed)
        self.sink = StreamSink(dut.clk, dut.tx__ready, backpressure_prob=backpressure,
                               seed=seed + 1)
        self.mon = StreamMonitor(dut.clk, *stream_signals(dut, "tx"), name="tx")
        # The reset input leaves the memories as an earlier test in the same simulation
        # left them; the protocol's RESET zeroes them, as the fresh reference model is.
        await self.request(Opcode.RESET)

    async def _wait_bytes(self, target, budget):
        waited = 0
        while len(self.mon.items) < target:
            await RisingEdge(self.dut.clk)
            waited += 1
            assert waited < budget, (f"link hung: {len(self.mon.items) - self.seen} of "
                                     f"{target - self.seen} reply bytes after {waited} "
                                     f"cycles")

    async def _wait_waiting(self, budget):
        waited = 0
        while not (self.src.idle and self.dut.waiting.value):
            await RisingEdge(self.dut.clk)
            waited += 1
            assert waited < budget, f"link never waiting for bytes after {waited} cycles"

    async def exchange(self, data: bytes, idle: bool = False, budget: int = 200_000):
        """Send ``data`` (then, if ``idle``, let the link go idle past its timeout) and
        check the replies against the reference server's; returns them as frames."""
        expected = self.server.feed(data)
        holding = self.server.pending > 0
        late = self.server.idle() if idle else b""
        if data:
            self.src.send(list(data))
        await self._wait_bytes(self.seen + len(expected), budget + 40 * len(data))
        if idle:
            # Waiting out the timeout dominates the fuzz's run time, so it is skipped
            # when neither side holds a byte (the board may still hold bytes that
            # cannot start a frame, which the reference has already dropped).
            await self._wait_waiting(budget)
            if holding or late or self.dut.partial.value:
                await ClockCycles(self.dut.clk, self.truncate + 4)
            expected += late
            await self._wait_bytes(self.seen + len(expected), budget)
        got = bytes(self.mon.items[self.seen:self.seen + len(expected)])
        self.seen += len(expected)
        want_frames = split_frames(expected)
        got_frames = split_frames(got) if len(got) == len(expected) else [got]
        assert len(got_frames) == len(want_frames), (
            f"{len(got_frames)} reply frames, expected {len(want_frames)}")
        for want, have in zip(want_frames, got_frames):
            want = self._with_cycles(want, have)
            assert have == want, (f"reply differs:\n board {have.hex(' ')}\n model "
                                  f"{want.hex(' ')}")
        return got_frames

    def _with_cycles(self, want: bytes, have: bytes) -> bytes:
        """``want`` with the board's RUN ``cycles`` entry, which must be positive."""
        if want[2] != Opcode.RUN.value | p.REPLY or have[:4] != want[:4]:
            return want
        body_w, body_h = want[8:-4], have[8:-4]
        skip = 2 if body_w[0] == Status.DEVICE_ERROR.value else 1
        if len(body_w) == skip or len(body_h) != len(body_w):
            return want
        entries = p.unpack_entries(body_h[skip:])
        assert list(entries) == ["cycles", "pc"], f"RUN entries {list(entries)}"
        assert entries["cycles"] > 0, "RUN reported 0 cycles"
        self.runs += 1
        mine = p.unpack_entries(body_w[skip:])
        mine["cycles"] = entries["cycles"]
        return p.encode_frame(want[2], want[3], body_w[:skip] + p.pack_entries(mine))

    async def request(self, opcode, payload=b"", tag=None, **kw):
        tag = self.rand.randrange(256) if tag is None else tag
        frames = await self.exchange(p.encode_frame(opcode, tag, payload), **kw)
        assert len(frames) == 1
        return frames[0]

    async def digest(self):
        """Every word of every memory, the counters and the status, compared."""
        c = self.config
        spaces = [Space.IVRF, Space.MRF] + list(vector_spaces(c)[1:])
        for space in spaces:
            depth = p.space_depth(c, space.value)
            per = (MAX_PAYLOAD - 1) // p.word_bytes(c, space.value)
            for addr in range(0, depth, per):
                await self.request(Opcode.READ, p.pack_access(space.value, addr,
                                                              min(per, depth - addr)))
        await self.request(Opcode.READ_COUNTERS)
        await self.request(Opcode.STATUS)

    async def finish(self, name):
        await ClockCycles(self.dut.clk, 50)
        assert len(self.mon.items) == self.seen, (
            f"{len(self.mon.items) - self.seen} unexpected reply bytes")
        _write_digest(name, self.mon.items, self.mon.cycles)


def _write_digest(name, items, cycles):
    """One line of ``LINK_DIGEST`` (module docstring), when it is set."""
    path = os.environ.get("LINK_DIGEST")
    if not path:
        return
    timed = hashlib.sha256(json.dumps([items, cycles]).encode())
    with open(path, "a") as f:
        f.write(json.dumps({"test": name, "bytes": len(items), "last_cycle": cycles[-1],
                            "digest": timed.hexdigest()}) + "\n")


# --- request makers ---------------------------------------------------------------------

def vectors(rng, count, n):
    return p.vectors_to_bytes(random_fp16(rng, (count, n), specials=0.1))


def mrf_words(rng, config, count, bad=False):
    """Wire bytes of ``count`` random MRF words with legal exponent codes (0..142) and
    zero padding bits; with ``bad``, one word has a code above 142."""
    size = p.word_bytes(config, Space.MRF.value)
    raw = bytearray(rng.integers(0, 256, count * size, dtype=np.uint8).tobytes())
    pad = 8 * size - config.weight_block_bits
    for k in range(count):
        raw[k * size] = int(rng.integers(0, 143))
        raw[k * size + size - 1] &= 0xFF >> pad
    if bad:
        raw[int(rng.integers(count)) * size] = int(rng.integers(143, 256))
    return bytes(raw)


def program_frames(words, chunk):
    """LOAD_PROGRAM payloads of ``words`` in chunks of ``chunk`` words."""
    total = len(words)
    raw = p.program_to_bytes(words)
    out = []
    for off in range(0, total, chunk):
        out.append(p.pack_program_chunk(off, total, raw[8 * off:8 * min(total, off + chunk)]))
    return out


# --- directed tests -----------------------------------------------------------------------

async def _opcodes(dut, idle, backpressure):
    tb = LinkTB(dut, seed=1, idle=idle, backpressure=backpressure)
    await tb.reset()
    c, rng = tb.config, np.random.default_rng(5)
    n = c.n
    await tb.request(Opcode.INFO)
    await tb.request(Opcode.STATUS)
    await tb.request(Opcode.READ_COUNTERS)
    # Writes and reads of every space, at both ends of each.
    for k in range(2 * c.mfus):
        depth = c.vrf_depth
        await tb.request(Opcode.WRITE, p.pack_access(2 + k, depth - 3, 3) + vectors(rng, 3, n))
        await tb.request(Opcode.READ, p.pack_access(2 + k, depth - 4, 4))
    await tb.request(Opcode.WRITE, p.pack_access(Space.IVRF.value, 0, 5) + vectors(rng, 5, n))
    await tb.request(Opcode.READ, p.pack_access(Space.IVRF.value, 0, 6))
    last = c.mrf_words
    await tb.request(Opcode.WRITE, p.pack_access(Space.MRF.value, 0, 2 * n + 3)
                     + mrf_words(rng, c, 2 * n + 3))
    await tb.request(Opcode.WRITE, p.pack_access(Space.MRF.value, last - 5, 5)
                     + mrf_words(rng, c, 5))
    await tb.request(Opcode.READ, p.pack_access(Space.MRF.value, 0, 2 * n + 4))
    await tb.request(Opcode.READ, p.pack_access(Space.MRF.value, last - 6, 6))
    # A program in one chunk and one in three; runs that pass and one that fails.
    for payload in program_frames(program_words("copy"), 511):
        await tb.request(Opcode.LOAD_PROGRAM, payload)
    await tb.request(Opcode.PUSH_INPUT, vectors(rng, 3, n))
    await tb.request(Opcode.STATUS)
    for _ in range(3):
        await tb.request(Opcode.RUN)
    await tb.request(Opcode.POP_OUTPUT, p.pack_pop(2))
    await tb.request(Opcode.STATUS)
    for payload in program_frames(program_words("ivrf"), 2):
        await tb.request(Opcode.LOAD_PROGRAM, payload)
    await tb.request(Opcode.RUN)
    await tb.request(Opcode.POP_OUTPUT, p.pack_pop(2))
    await tb.request(Opcode.READ, p.pack_access(Space.IVRF.value, 0, 6))
    await tb.request(Opcode.RUN)                       # fails: input queue empty
    await tb.request(Opcode.STATUS)
    await tb.request(Opcode.RUN)                       # halted
    await tb.request(Opcode.CLEAR_ERROR)
    await tb.request(Opcode.STATUS)
    for payload in program_frames(program_words("mvm"), 511):
        await tb.request(Opcode.LOAD_PROGRAM, payload)
    await tb.request(Opcode.PUSH_INPUT, vectors(rng, 2, n))
    await tb.request(Opcode.RUN)
    await tb.request(Opcode.READ_COUNTERS)
    await tb.request(Opcode.CLEAR_COUNTERS)
    await tb.request(Opcode.READ_COUNTERS)
    await tb.digest()
    await tb.request(Opcode.RESET)
    if os.environ.get("LINK_DIGEST_AFTER_RESET", "1") == "1":
        await tb.digest()
    else:
        await tb.request(Opcode.READ_COUNTERS)
        await tb.request(Opcode.STATUS)
    assert tb.runs >= 5, f"only {tb.runs} RUN replies with entries compared"
    await tb.finish(f"opcodes idle={idle} backpressure={backpressure}")


@cocotb.test()
async def test_opcodes(dut):
    """Every opcode, with results, against the reference; streams without stalls."""
    await _opcodes(dut, 0.0, 0.0)


@cocotb.test()
async def test_opcodes_stalls(dut):
    """The same with idle cycles on rx and back-pressure on tx."""
    await _opcodes(dut, 0.3, 0.4)


@cocotb.test()
async def test_reset_mid_request(dut):
    """RESET zeroes every word wherever the requests before it left the executor: its MRF
    cursor in the middle of the MRF (a WRITE and a READ that end there) and its vector
    space at a VRF. The model zeroes all of its memories; the digest compares them."""
    tb = LinkTB(dut, seed=4)
    await tb.reset()
    c, rng = tb.config, np.random.default_rng(7)
    n = c.n
    await tb.request(Opcode.WRITE, p.pack_access(Space.MRF.value, 0, 2 * n + 3)
                     + mrf_words(rng, c, 2 * n + 3))
    await tb.request(Opcode.WRITE, p.pack_access(Space.IVRF.value, 1, 3) + vectors(rng, 3, n))
    vrf = vector_spaces(c)[-1].value
    await tb.request(Opcode.WRITE, p.pack_access(vrf, 2, 2) + vectors(rng, 2, n))
    await tb.request(Opcode.READ, p.pack_access(Space.MRF.value, n + 1, 1))
    await tb.request(Opcode.READ, p.pack_access(vrf, 2, 1))
    await tb.request(Opcode.RESET)
    await tb.digest()
    await tb.finish("reset mid request")


@cocotb.test()
async def test_errors(dut):
    """Every error reply; each followed by a valid request; state compared after each."""
    tb = LinkTB(dut, seed=2, idle=0.1, backpressure=0.2)
    await tb.reset()
    c, rng = tb.config, np.random.default_rng(6)
    n = c.n
    good = p.encode_frame(Opcode.STATUS, 7)
    await tb.request(Opcode.WRITE, p.pack_access(Space.IVRF.value, 0, 4) + vectors(rng, 4, n))
    for payload in program_frames(program_words("copy"), 511):
        await tb.request(Opcode.LOAD_PROGRAM, payload)
    await tb.request(Opcode.PUSH_INPUT, vectors(rng, 2, n))

    frames = []
    # Bad CRC (payload and trailer), length over the bound, unknown opcodes.
    f = bytearray(p.encode_frame(Opcode.WRITE, 1, p.pack_access(1, 0, 1) + vectors(rng, 1, n)))
    f[12] ^= 0x10
    frames.append(bytes(f))
    f = bytearray(p.encode_frame(Opcode.READ, 2, p.pack_access(1, 0, 1)))
    f[-1] ^= 0x80
    frames.append(bytes(f))
    head = p.SYNC + bytes((Opcode.READ.value, 3)) + (MAX_PAYLOAD + 1).to_bytes(2, "little")
    frames.append(head + p.crc16(head).to_bytes(2, "little"))
    for op in (0x00, 0x0D, 0x7F, 0x81, 0xFF):
        frames.append(p.encode_frame(op, 4))
    # Bad lengths per opcode.
    for op in (Opcode.INFO, Opcode.RUN, Opcode.STATUS, Opcode.READ_COUNTERS,
               Opcode.CLEAR_COUNTERS, Opcode.RESET, Opcode.CLEAR_ERROR):
        frames.append(p.encode_frame(op, 5, b"\x00"))
    frames += [p.encode_frame(Opcode.WRITE, 6, bytes(7)),
               p.encode_frame(Opcode.READ, 6, p.pack_access(1, 0, 1) + b"\x00"),
               p.encode_frame(Opcode.WRITE, 6, p.pack_access(1, 0, 2) + vectors(rng, 1, n)),
               p.encode_frame(Opcode.POP_OUTPUT, 6, b"\x01"),
               p.encode_frame(Opcode.PUSH_INPUT, 6, bytes(2 * n + 2)),
               p.encode_frame(Opcode.PUSH_INPUT, 6),
               p.encode_frame(Opcode.LOAD_PROGRAM, 6, bytes(12)),
               p.encode_frame(Opcode.LOAD_PROGRAM, 6, bytes(4))]
    # Spaces (with the VRFs the unit sets leave out, if any), counts, addresses.
    absent = [s for s in range(2, 2 + 2 * c.mfus) if p.space_depth(c, s) is None]
    for space in (0, 2 + 2 * c.mfus, 10, 14, 16, 255, *absent):
        frames.append(p.encode_frame(Opcode.READ, 8, p.pack_access(space, 0, 1)))
    for space in absent:
        frames.append(p.encode_frame(Opcode.WRITE, 8, p.pack_access(space, 0, 1)
                                     + vectors(rng, 1, n)))
    frames += [
        p.encode_frame(Opcode.READ, 9, p.pack_access(1, 0, 0)),
        p.encode_frame(Opcode.READ, 9, p.pack_access(1, 0, (MAX_PAYLOAD - 1) // (2 * n) + 1)),
        p.encode_frame(Opcode.READ, 9, p.pack_access(15, 0, 4096)),
        p.encode_frame(Opcode.WRITE, 9, p.pack_access(1, 0, 0)),
        p.encode_frame(Opcode.READ, 10, p.pack_access(1, c.ivrf_depth - 1, 2)),
        p.encode_frame(Opcode.READ, 10, p.pack_access(1, 0xFFFFFFFF, 1)),
        p.encode_frame(Opcode.READ, 10, p.pack_access(15, c.mrf_words, 1)),
        p.encode_frame(Opcode.WRITE, 10, p.pack_access(2, c.vrf_depth, 1) + vectors(rng, 1, n)),
        p.encode_frame(Opcode.WRITE, 11, p.pack_access(15, 0, 3) + mrf_words(rng, c, 3, True)),
        p.encode_frame(Opcode.POP_OUTPUT, 12, p.pack_pop(0)),
        p.encode_frame(Opcode.POP_OUTPUT, 12, p.pack_pop(MAX_PAYLOAD)),
        p.encode_frame(Opcode.POP_OUTPUT, 12, p.pack_pop(1)),
        p.encode_frame(Opcode.PUSH_INPUT, 13, vectors(rng, c.netq_depth, n)[:MAX_PAYLOAD
                                                                          // (2 * n) * 2 * n]),
    ]
    # Program chunks: out of order, wrong total, too long, zero words.
    words = p.program_to_bytes(program_words("mvm"))
    frames += [
        p.encode_frame(Opcode.LOAD_PROGRAM, 14, p.pack_program_chunk(2, 6, words[16:32])),
        p.encode_frame(Opcode.LOAD_PROGRAM, 14, p.pack_program_chunk(0, 6, words[:16])),
        p.encode_frame(Opcode.LOAD_PROGRAM, 14, p.pack_program_chunk(2, 7, words[16:32])),
        p.encode_frame(Opcode.LOAD_PROGRAM, 14, p.pack_program_chunk(4, 6, words[32:48])),
        p.encode_frame(Opcode.LOAD_PROGRAM, 14, p.pack_program_chunk(2, 6, words[16:64])),
        p.encode_frame(Opcode.LOAD_PROGRAM, 14, p.pack_program_chunk(0, 0, words[:8])),
        p.encode_frame(Opcode.LOAD_PROGRAM, 14,
                       p.pack_program_chunk(0, c.program_depth + 1, words[:8])),
        p.encode_frame(Opcode.LOAD_PROGRAM, 14, p.pack_program_chunk(0, 6, b"")),
    ]
    for frame in frames:
        await tb.exchange(frame)
        await tb.exchange(good)
    await tb.digest()
    # Garbage (with false syncs and false headers) between frames.
    for k in range(6):
        junk = bytes(rng.integers(0, 256, int(rng.integers(1, 40)), dtype=np.uint8))
        junk += p.SYNC + junk[:3]
        await tb.exchange(junk + good + junk[:5] + p.encode_frame(Opcode.READ, k,
                                                                  p.pack_access(1, 0, 2)))
    # Truncated frames: alone, and swallowing a good one that the re-scan finds.
    trunc = p.encode_frame(Opcode.WRITE, 20, p.pack_access(1, 0, 2) + vectors(rng, 2, n))
    await tb.exchange(trunc[:30], idle=True)
    await tb.exchange(good)
    await tb.exchange(trunc[:10] + good, idle=True)
    await tb.exchange(trunc[:5], idle=True)
    await tb.exchange(trunc[:30] + p.SYNC, idle=True)
    await tb.exchange(good)
    # A run that fails, then halting and the queues.
    for payload in program_frames(program_words("zero"), 511):
        await tb.request(Opcode.LOAD_PROGRAM, payload)
    await tb.request(Opcode.RUN)
    await tb.request(Opcode.PUSH_INPUT, vectors(rng, 1, n))
    await tb.request(Opcode.POP_OUTPUT, p.pack_pop(1))
    await tb.request(Opcode.RUN)
    await tb.digest()
    await tb.request(Opcode.CLEAR_ERROR)
    for name in ("no_end", "bad_reg"):
        for payload in program_frames(program_words(name), 511):
            await tb.request(Opcode.LOAD_PROGRAM, payload)
        await tb.request(Opcode.RUN)
        await tb.request(Opcode.CLEAR_ERROR)
    # An abandoned load leaves the old program running.
    for payload in program_frames(program_words("copy"), 511):
        await tb.request(Opcode.LOAD_PROGRAM, payload)
    await tb.request(Opcode.LOAD_PROGRAM, program_frames(program_words("ivrf"), 2)[0])
    await tb.request(Opcode.PUSH_INPUT, vectors(rng, 1, n))
    await tb.request(Opcode.RUN)
    await tb.request(Opcode.POP_OUTPUT, p.pack_pop(1))
    await tb.digest()
    await tb.finish("test_errors")


# --- fuzz -----------------------------------------------------------------------------------

class FrameFuzzer:
    """Seeded random requests, valid and mutated, as byte chunks with an idle flag."""

    def __init__(self, config, seed):
        self.c = config
        self.rng = np.random.default_rng(seed)
        self.tag = 0

    def _frame(self, opcode, payload=b""):
        self.tag = (self.tag + 1) & 0xFF
        return p.encode_frame(opcode, self.tag, payload)

    def valid(self) -> bytes:
        c, rng, n = self.c, self.rng, self.c.n
        kind = int(rng.integers(14))
        if kind == 0:
            return self._frame(Opcode.INFO)
        if kind in (1, 2):
            space = int(rng.choice([1, 15] + [s.value for s in vector_spaces(c)[1:]]))
            depth = p.space_depth(c, space)
            count = int(rng.integers(1, min(depth, 6) + 1))
            addr = int(rng.integers(0, depth - count + 1))
            if kind == 1:
                data = (mrf_words(rng, c, count, bad=rng.random() < 0.2) if space == 15
                        else vectors(rng, count, n))
                return self._frame(Opcode.WRITE, p.pack_access(space, addr, count) + data)
            return self._frame(Opcode.READ, p.pack_access(space, addr, count))
        if kind == 3:
            name = str(rng.choice(["copy", "mvm", "ivrf", "no_end", "bad_reg", "zero"]))
            chunks = program_frames(program_words(name), int(rng.integers(1, 5)))
            if rng.random() < 0.2:                     # abandoned or out of order
                chunks = chunks[int(rng.integers(len(chunks))):][:1]
            return b"".join(self._frame(Opcode.LOAD_PROGRAM, ch) for ch in chunks)
        if kind in (4, 5):
            return self._frame(Opcode.PUSH_INPUT, vectors(rng, int(rng.integers(1, 4)), n))
        if kind in (6, 7):
            return self._frame(Opcode.RUN)
        if kind == 8:
            return self._frame(Opcode.POP_OUTPUT, p.pack_pop(int(rng.integers(0, 4))))
        if kind == 9:
            return self._frame(Opcode.READ_COUNTERS)
        if kind == 10:
            return self._frame(Opcode.CLEAR_COUNTERS)
        if kind == 11:
            return self._frame(Opcode.STATUS)
        if kind == 12:
            return self._frame(Opcode.CLEAR_ERROR)
        return self._frame(Opcode.RESET) if rng.random() < 0.1 else self._frame(Opcode.STATUS)

    def mutate(self, frame: bytes) -> bytes:
        rng = self.rng
        raw = bytearray(frame)
        how = int(rng.integers(7))
        if how == 0:                                   # bit flips anywhere
            for _ in range(int(rng.integers(1, 4))):
                raw[int(rng.integers(len(raw)))] ^= 1 << int(rng.integers(8))
        elif how == 1:                                 # cut short
            raw = raw[:int(rng.integers(1, len(raw)))]
        elif how == 2:                                 # random opcode, header re-checked
            return self._frame(int(rng.integers(256)), bytes(raw[8:-4]))
        elif how == 3:                                 # wrong length, sound CRCs
            payload = bytes(raw[8:-4])
            cut = int(rng.integers(0, len(payload) + 1))
            payload = payload[:cut] + bytes(rng.integers(0, 256, int(rng.integers(0, 3)),
                                                         dtype=np.uint8))
            return p.encode_frame(raw[2], raw[3], payload)
        elif how == 4:                                 # garbage before
            raw = bytearray(rng.integers(0, 256, int(rng.integers(1, 20)),
                                         dtype=np.uint8)) + raw
        elif how == 5:                                 # a false sync inside
            pos = int(rng.integers(len(raw)))
            raw[pos:pos] = p.SYNC
        else:                                          # length field corrupted, header ok
            head = bytearray(raw[:6])
            head[4:6] = int(rng.integers(0, 0x10000)).to_bytes(2, "little")
            raw[:8] = head + p.crc16(head).to_bytes(2, "little")
            raw = raw[:int(rng.integers(8, len(raw) + 1))]
        return bytes(raw)

    def chunk(self) -> tuple[bytes, bool, int]:
        """Bytes of one to three frames, whether the link then goes idle, frames made."""
        frames = []
        for _ in range(int(self.rng.integers(1, 4))):
            frame = self.valid()
            frames.append(self.mutate(frame) if self.rng.random() < 0.35 else frame)
        return b"".join(frames), bool(self.rng.random() < 0.04), len(frames)


@cocotb.test()
async def test_fuzz(dut):
    """Seeded random and mutated frames (``LINK_FUZZ`` of them): replies identical to the
    reference, state compared every 400 frames and at the end, no hang."""
    total = int(os.environ.get("LINK_FUZZ", "1000"))
    seed = int(os.environ.get("LINK_SEED", "7"))
    tb = LinkTB(dut, seed=seed, idle=0.1, backpressure=0.2)
    await tb.reset()
    fuzz = FrameFuzzer(tb.config, seed)
    done = next_digest = 0
    statuses = set()
    while done < total:
        data, idle, frames = fuzz.chunk()
        replies = await tb.exchange(data, idle=idle)
        statuses.update(Status(r[8]).name for r in replies)
        done += frames
        if done >= next_digest:
            await tb.exchange(b"", idle=True)          # flush whatever is pending
            await tb.digest()
            next_digest += 400
            dut._log.info(f"fuzz: {done} of {total} frames, state equal")
    await tb.exchange(b"", idle=True)
    await tb.digest()
    await tb.finish("test_fuzz")
    dut._log.info(f"fuzz: {done} frames, statuses {sorted(statuses)}, {tb.runs} runs, "
                  f"{tb.server.stats['skipped']} bytes skipped")
    for name in ("OK", "BAD_CRC", "BAD_LENGTH", "UNKNOWN_OPCODE", "TRUNCATED", "BAD_ADDRESS",
                 "DEVICE_ERROR"):
        assert name in statuses, f"the fuzz never reached {name}"
