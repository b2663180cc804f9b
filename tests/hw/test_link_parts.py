"""The link's parts alone, in Amaranth's simulator: ``FrameScanner`` (frames, bad CRC,
truncation, the buffer lent to the executor), ``RequestChecks`` (each flag on directed
requests, expected values from ``docs/protocol.md`` section 3) and ``ReplyTemplate``
(constant and live bytes, three cycles after their place, a new place every cycle).

The whole link, byte for byte against ``ProtocolServer``, is ``tests/hw/test_link_hw.py``.
"""

import pytest
from amaranth.sim import Simulator

from host.spec import protocol as p
from host.spec.config import preset
from host.spec.formats import block_bytes
from host.spec.isa import Space
from host.spec.protocol import MAX_PAYLOAD, Opcode
from hw.link.checks import RequestChecks
from hw.link.scanner import FrameScanner
from hw.link.template import ReplyTemplate, TemplateRom

CONFIG = preset("ulx3s_n4")
VB = 2 * CONFIG.n                                      # bytes of a vector
MB = block_bytes(CONFIG.n, CONFIG.mantissa_bits_w)     # bytes of an MRF word


def run(dut, bench):
    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()


# --- FrameScanner ------------------------------------------------------------------------
class ScannerBench:
    """Feeds bytes to a FrameScanner with ``recv`` high and records its events."""

    def __init__(self, dut, ctx):
        self.dut, self.ctx = dut, ctx
        self.events = []

    async def step(self, verify_next):
        dut, ctx = self.dut, self.ctx
        ev = [name for name in ("bad_length", "frame_end", "truncated")
              if ctx.get(getattr(dut, name))]
        if ctx.get(dut.verify):
            ev.append("crc_ok" if ctx.get(dut.crc_ok) else "crc_bad")
        self.events += ev
        # The executor's part: after frame_end it leaves RECV for one cycle (VERIFY).
        end = "frame_end" in ev
        await ctx.tick()
        ctx.set(dut.recv, 0 if end else 1)
        ctx.set(dut.verify, 1 if end else 0)
        return ev

    async def feed(self, data, idle_after=40):
        dut, ctx = self.dut, self.ctx
        ctx.set(dut.recv, 1)
        for byte in data:
            ctx.set(dut.rx.valid, 1)
            ctx.set(dut.rx.payload, byte)
            while True:
                ready = ctx.get(dut.rx.ready)
                await self.step(False)
                if ready:
                    break
        ctx.set(dut.rx.valid, 0)
        for _ in range(idle_after):
            await self.step(False)


def test_scanner_frames_and_errors():
    """A good frame, its CRC-32 broken, garbage and a truncated frame, in one stream."""
    dut = FrameScanner(truncate_cycles=20)
    payload = bytes(range(10, 30))
    good = p.encode_frame(Opcode.WRITE, 7, payload)
    broken = bytearray(p.encode_frame(Opcode.READ, 8, payload))
    broken[-1] ^= 0x40
    over = bytearray(p.encode_frame(Opcode.INFO, 9))
    over[4:6] = (MAX_PAYLOAD + 1).to_bytes(2, "little")     # header: sync, op, tag, length
    over[6:8] = p.crc16(bytes(over[:6])).to_bytes(2, "little")
    found = {}

    async def bench(ctx):
        tb = ScannerBench(dut, ctx)
        await tb.feed(good)
        assert tb.events == ["frame_end", "crc_ok"], tb.events
        found["header"] = (ctx.get(dut.header.opcode), ctx.get(dut.header.tag),
                           ctx.get(dut.header.length))
        found["prefix"] = ctx.get(dut.prefix).to_bytes(8, "little")
        at = ctx.get(dut.payload_at)
        # The buffer, read at the executor's address while recv is low.
        ctx.set(dut.recv, 0)
        got = []
        for k in range(len(payload)):
            ctx.set(dut.read_addr, at + k)
            await ctx.tick()
            got.append(ctx.get(dut.read_data))
        found["buffer"] = bytes(got)
        assert ctx.get(dut.idle) and not ctx.get(dut.partial)
        tb.events.clear()
        await tb.feed(bytes(broken))
        assert tb.events == ["frame_end", "crc_bad"], tb.events
        tb.events.clear()
        await tb.feed(bytes(over))
        assert tb.events == ["bad_length"], tb.events
        assert ctx.get(dut.header.tag) == 9
        tb.events.clear()
        await tb.feed(good[:12])
        assert tb.events == ["truncated"], tb.events
        tb.events.clear()
        await tb.feed(good)
        assert tb.events == ["frame_end", "crc_ok"], tb.events

    run(dut, bench)
    assert found["header"] == (Opcode.WRITE.value, 7, len(payload))
    assert found["prefix"] == payload[:8]
    assert found["buffer"] == payload


def test_scanner_finds_a_frame_after_a_bad_one():
    """A frame whose length swallows the next frame fails its CRC; the re-scan from the
    byte after its sync finds the one inside, as FrameDecoder does."""
    dut = FrameScanner(truncate_cycles=30)
    inner = p.encode_frame(Opcode.STATUS, 3)
    outer = p.encode_frame(Opcode.WRITE, 4, bytes(8))[:8]     # header of 8 + 4 bytes
    stream = outer + inner + bytes(4)                         # filler to complete it

    async def bench(ctx):
        tb = ScannerBench(dut, ctx)
        await tb.feed(stream, idle_after=200)
        assert tb.events[:2] == ["frame_end", "crc_bad"], tb.events
        assert tb.events[2:4] == ["frame_end", "crc_ok"], tb.events
        assert (ctx.get(dut.header.opcode), ctx.get(dut.header.tag)) == \
            (Opcode.STATUS.value, 3)

    run(dut, bench)


def test_scanner_finds_a_frame_in_a_truncated_one():
    """A frame cut short swallows a whole frame; when the line goes idle it is truncated
    and the re-scan from the byte after its sync finds the frame inside."""
    dut = FrameScanner(truncate_cycles=30)
    inner = p.encode_frame(Opcode.INFO, 5)
    outer = p.encode_frame(Opcode.WRITE, 6, bytes(100))[:8]   # 100 bytes announced

    async def bench(ctx):
        tb = ScannerBench(dut, ctx)
        await tb.feed(outer + inner, idle_after=200)
        assert tb.events == ["truncated", "frame_end", "crc_ok"], tb.events
        assert (ctx.get(dut.header.opcode), ctx.get(dut.header.tag)) == \
            (Opcode.INFO.value, 5)
        assert ctx.get(dut.idle) and not ctx.get(dut.partial)

    run(dut, bench)


def test_scanner_parameter_checked():
    with pytest.raises(ValueError, match="truncate_cycles"):
        FrameScanner(truncate_cycles=0)


# --- RequestChecks -----------------------------------------------------------------------
FLAGS = ("bad_length", "bad_space", "bad_count", "bad_size", "bad_address",
         "program_more", "queue_full", "queue_empty", "halted_at")

_ivrf = Space.IVRF.value
_prog = p.pack_program_chunk
CASES = [
    # (opcode, payload, inputs, flags set, other outputs)
    (Opcode.WRITE, p.pack_access(_ivrf, 0, 2) + bytes(2 * VB), {}, set(),
     {"data_bytes": 2 * VB}),
    (Opcode.WRITE, p.pack_access(_ivrf, 0, 2) + bytes(2 * VB - 1), {}, {"bad_size"}, {}),
    (Opcode.WRITE, p.pack_access(_ivrf, CONFIG.ivrf_depth - 1, 2) + bytes(2 * VB), {},
     {"bad_address"}, {}),
    (Opcode.WRITE, p.pack_access(Space.MRF.value, 0, 3) + bytes(3 * MB), {}, set(),
     {"data_bytes": 3 * MB}),
    # Space 0 is the input queue, no vector memory.
    (Opcode.WRITE, bytes(4), {}, {"bad_length", "bad_space", "bad_count", "bad_size"}, {}),
    (Opcode.READ, p.pack_access(_ivrf, 0, 1) + b"x", {}, {"bad_length"}, {}),
    (Opcode.READ, p.pack_access(99, 0, 1), {}, {"bad_space"}, {}),
    (Opcode.READ, p.pack_access(_ivrf, 0, 0), {}, {"bad_count"}, {}),
    (Opcode.READ, p.pack_access(_ivrf, 0, MAX_PAYLOAD // VB), {}, {"bad_count"}, {}),
    (Opcode.READ, p.pack_access(_ivrf, CONFIG.ivrf_depth - 1, 2), {}, {"bad_address"}, {}),
    (Opcode.LOAD_PROGRAM, _prog(0, 3, bytes(16)), {}, {"program_more"}, {"words": 2}),
    (Opcode.LOAD_PROGRAM, _prog(2, 3, bytes(8)), {"staged": 2, "staged_total": 3}, set(),
     {"words": 1}),
    (Opcode.LOAD_PROGRAM, _prog(1, 3, bytes(8)), {"staged": 2, "staged_total": 3},
     {"bad_address", "program_more"}, {}),
    (Opcode.LOAD_PROGRAM, _prog(2, 4, bytes(8)), {"staged": 2, "staged_total": 3},
     {"bad_address", "program_more"}, {}),
    (Opcode.LOAD_PROGRAM, _prog(0, CONFIG.program_depth + 1, bytes(8)), {},
     {"bad_count", "program_more"}, {}),
    (Opcode.LOAD_PROGRAM, _prog(0, 1, bytes(8))[:-1], {},
     {"bad_length", "bad_count", "program_more"}, {"words": 0}),
    (Opcode.PUSH_INPUT, bytes(3 * VB), {"inq_level": CONFIG.netq_depth - 3}, set(),
     {"vectors": 3}),
    (Opcode.PUSH_INPUT, bytes(3 * VB), {"inq_level": CONFIG.netq_depth - 2},
     {"queue_full"}, {}),
    (Opcode.PUSH_INPUT, bytes(5), {}, {"bad_length"}, {}),
    (Opcode.POP_OUTPUT, p.pack_pop(3), {"outq_level": 3}, set(), {"pop_bytes": 3 * VB}),
    (Opcode.POP_OUTPUT, p.pack_pop(3), {"outq_level": 2}, {"queue_empty"}, {}),
    (Opcode.POP_OUTPUT, p.pack_pop(0), {}, {"bad_count"}, {}),
    (Opcode.RUN, b"", {"halted": 1}, {"halted_at"}, {}),
    (Opcode.INFO, b"", {}, set(), {}),
    (Opcode.INFO, b"\0", {}, {"bad_length"}, {}),
]


def test_request_checks():
    """Each case's flags, two cycles after its request (the flags of other opcodes are
    cleared first by a request that sets none)."""
    dut = RequestChecks(CONFIG, level_bits=16)
    results = []

    async def bench(ctx):
        for op, payload, inputs, _, _ in CASES:
            for clear_op in (Opcode.WRITE, Opcode.LOAD_PROGRAM, Opcode.PUSH_INPUT,
                             Opcode.POP_OUTPUT):
                # A sound request of each kind: every flag it updates cleared.
                ctx.set(dut.header.opcode, clear_op.value)
                ctx.set(dut.header.length, {Opcode.WRITE: 8 + VB,
                                            Opcode.LOAD_PROGRAM: 16,
                                            Opcode.PUSH_INPUT: VB,
                                            Opcode.POP_OUTPUT: 2}[clear_op])
                ctx.set(dut.prefix, int.from_bytes({
                    Opcode.WRITE: p.pack_access(_ivrf, 0, 1),
                    Opcode.LOAD_PROGRAM: _prog(0, 1, b""),
                    Opcode.PUSH_INPUT: bytes(8),
                    Opcode.POP_OUTPUT: p.pack_pop(1) + bytes(6)}[clear_op], "little"))
                for name in ("inq_level", "outq_level", "halted", "staged",
                             "staged_total"):
                    ctx.set(getattr(dut, name), 1 if name == "outq_level" else 0)
                await ctx.tick().repeat(2)
            ctx.set(dut.header.opcode, op.value)
            ctx.set(dut.header.length, len(payload))
            ctx.set(dut.prefix, int.from_bytes(payload[:8].ljust(8, b"\0"), "little"))
            for name in ("inq_level", "outq_level", "halted", "staged", "staged_total"):
                ctx.set(getattr(dut, name), inputs.get(name, 0))
            await ctx.tick().repeat(2)
            results.append(({f for f in FLAGS if ctx.get(getattr(dut, f))},
                            {name: ctx.get(getattr(dut, name))
                             for name in ("data_bytes", "pop_bytes", "words", "vectors")}))

    run(dut, bench)
    for (op, payload, _, want, outputs), (got, values) in zip(CASES, results, strict=True):
        assert got == want, f"{op.name} {payload[:8].hex()}: flags {got}, want {want}"
        for name, value in outputs.items():
            assert values[name] == value, f"{op.name}: {name} {values[name]}, want {value}"


def test_request_checks_config_checked():
    with pytest.raises(TypeError, match="config"):
        RequestChecks({"n": 4}, level_bits=16)


# --- ReplyTemplate -----------------------------------------------------------------------
def template_rom():
    rom = TemplateRom()
    rom.segment("a", [1, 2, ("x", 2), 3])
    rom.segment("b", TemplateRom.entries(["y"]))
    return rom


def test_template_bytes_follow_their_place():
    rom = template_rom()
    dut = ReplyTemplate(rom, {"x": 16, "y": 40})
    want = [1, 2, 0xEF, 0xBE, 3,                                     # segment a
            1, ord("y"), 0x9A, 0x78, 0x56, 0x34, 0x12, 0, 0, 0]        # segment b
    assert rom.segments == {"a": (0, 5), "b": (5, 15)} and rom.length("b") == 10
    order = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 3, 3, 9, 0, 14, 2]
    got = []

    async def bench(ctx):
        ctx.set(dut.live.x, 0xBEEF)
        ctx.set(dut.live.y, 0x123456789A)
        for k, pos in enumerate(order + [0, 0, 0]):
            ctx.set(dut.pos, pos)
            await ctx.tick()
            if k >= 2:
                got.append(ctx.get(dut.byte))   # the byte of order[k - 2], set 3 ticks ago

    run(dut, bench)
    assert got[:len(order)] == [want[pos] for pos in order]


def test_template_widths_checked():
    with pytest.raises(ValueError, match="missing \\['y'\\]"):
        ReplyTemplate(template_rom(), {"x": 16})
    with pytest.raises(ValueError, match="out of range {'y': 65}"):
        ReplyTemplate(template_rom(), {"x": 16, "y": 65})
