"""The executor's parts alone (``hw.link.executor``), in Amaranth's simulator, against
expectations written from ``docs/link-hw.md`` section 3 and ``host.spec``:

* ``MrfCursor``: every flat address of a three-tile MRF, loaded and stepped, against
  ``host.spec.isa.mrf_address``;
* ``WordLoader``: words of 1 to 32 bytes from a modelled block RAM (data a cycle after its
  address), one byte a cycle, across words and after a seek;
* ``MrfPrescan``: a bad exponent code or a set padding bit in any word, and sound words;
* ``ReplyEmitter``: command, status, code and template bytes under back-pressure;
* ``ReadBack``: each source's words, least significant byte first, with the requests'
  addresses stepped and stalls on the responses and the OMP.

The whole link, byte for byte against ``ProtocolServer``, is ``tests/hw/test_link_hw.py``.
"""

import dataclasses
import random

from amaranth.sim import Simulator

from host.spec.config import preset
from host.spec.formats import MAX_EXPONENT_CODE, block_bytes
from host.spec.isa import Space, mrf_address
from hw.link.executor import (
    MrfCursor,
    MrfPrescan,
    ReadBack,
    ReadSource,
    ReplyEmitter,
    WordLoader,
    word_bytes_max,
)

CONFIG = preset("ulx3s_n4")


def run(dut, bench, *processes):
    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    for process in processes:
        sim.add_process(process)
    sim.run()


def test_cursor_walks_the_mrf_in_flat_order():
    c = dataclasses.replace(CONFIG, tiles=3, mrf_depth=5)
    dut = MrfCursor(c)
    flat_of = {}
    got = []

    async def bench(ctx):
        for start in (0, 7, c.mrf_words - 5):
            ctx.set(dut.flat, start)
            ctx.set(dut.load, 1)
            await ctx.tick()
            ctx.set(dut.load, 0)
            ctx.set(dut.step, 1)
            for k in range(c.mrf_words - start):
                addr = (ctx.get(dut.engine), ctx.get(dut.row), ctx.get(dut.slot))
                got.append((start + k, mrf_address(c, *addr), ctx.get(dut.last)))
                await ctx.tick()
            ctx.set(dut.step, 0)
            ctx.set(dut.clear, 1)
            await ctx.tick()
            ctx.set(dut.clear, 0)
            flat_of[start] = (ctx.get(dut.engine), ctx.get(dut.row), ctx.get(dut.slot))

    run(dut, bench)
    for want, have, last in got:
        assert have == want, f"step to flat {want} gave {have}"
        assert last == (want == c.mrf_words - 1), f"last {last} at {want}"
    assert all(addr == (0, 0, 0) for addr in flat_of.values())


async def run_to_done(ctx, dut, limit):
    """Raise ``run`` and wait for ``done``; returns the cycles waited."""
    ctx.set(dut.run, 1)
    cycles = 0
    while not ctx.get(dut.done):
        await ctx.tick()
        cycles += 1
        assert cycles < limit, f"no done in {limit} cycles"
    return cycles


def buffer_process(dut, memory):
    """The receive buffer: ``data`` is the byte at ``addr`` of the cycle before."""
    async def process(ctx):
        async for _clk, _rst, addr in ctx.tick().sample(dut.addr):
            ctx.set(dut.data, memory[addr % len(memory)])
    return process


def test_loader_takes_each_words_bytes_in_order():
    dut = WordLoader(CONFIG)
    rng = random.Random(3)
    memory = [rng.randrange(256) for _ in range(1 << len(dut.addr))]
    wb_max = word_bytes_max(CONFIG)
    sizes = [1, 3, wb_max, 8, 2, wb_max]
    got = []

    async def bench(ctx):
        at = 8187                        # words that wrap around the buffer's end
        ctx.set(dut.at, at)
        ctx.set(dut.seek, 1)
        await ctx.tick()
        ctx.set(dut.seek, 0)
        for k, size in enumerate(sizes):
            if k == 3:                   # a seek between words
                at = 100
                ctx.set(dut.at, at)
                ctx.set(dut.seek, 1)
                await ctx.tick()
                ctx.set(dut.seek, 0)
            ctx.set(dut.bytes, size)
            cycles = await run_to_done(ctx, dut, 100)
            await ctx.tick()
            ctx.set(dut.run, 0)
            for _ in range(rng.randrange(3)):       # idle cycles between words
                await ctx.tick()
            word = ctx.get(dut.word)
            got.append((at, size, cycles, [(word >> 8 * i) & 0xFF for i in range(size)]))
            at += size

    run(dut, bench, buffer_process(dut, memory))
    for at, size, cycles, have in got:
        want = [memory[(at + i) % len(memory)] for i in range(size)]
        assert have == want, f"{size} bytes at {at}: {have}, want {want}"
        # A byte a cycle, plus the block RAM's and the byte register's cycles.
        assert cycles == size + 1, f"{size} bytes took {cycles} cycles"


def prescan_words(config, rng, count, bad=None):
    """``count`` MRF words as bytes; ``bad``: (word, "exponent" or "padding")."""
    mb = block_bytes(config.n, config.mantissa_bits_w)
    pad = 8 * mb - config.weight_block_bits
    out = []
    for k in range(count):
        word = [rng.randrange(MAX_EXPONENT_CODE + 1)] + [rng.randrange(256)
                                                           for _ in range(mb - 1)]
        if pad:
            word[-1] &= (1 << (8 - pad)) - 1
        if bad and bad[0] == k:
            if bad[1] == "exponent":
                word[0] = rng.randrange(MAX_EXPONENT_CODE + 1, 256)
            else:
                word[-1] |= 1 << rng.randrange(8 - pad, 8)
        out += word
    return out


def run_prescan(config, cases):
    dut = MrfPrescan(config)
    memory = [0] * (1 << len(dut.addr))
    got = []

    async def bench(ctx):
        for at, payload in cases:
            memory[at:at + len(payload)] = payload
            mb = block_bytes(config.n, config.mantissa_bits_w)
            ctx.set(dut.at, at)
            ctx.set(dut.count, len(payload) // mb)
            ctx.set(dut.start, 1)
            await ctx.tick()
            ctx.set(dut.start, 0)
            await run_to_done(ctx, dut, 1000)
            got.append(ctx.get(dut.bad))
            await ctx.tick()
            ctx.set(dut.run, 0)

    run(dut, bench, buffer_process(dut, memory))
    return got


def test_prescan_finds_any_bad_word():
    rng = random.Random(5)
    padded = dataclasses.replace(CONFIG, mantissa_bits_w=3)      # 20 bits in 3 bytes
    assert 8 * block_bytes(4, 3) > padded.weight_block_bits
    for config, kinds in ((CONFIG, ("exponent",)), (padded, ("exponent", "padding"))):
        cases, want = [], []
        for count in (1, 2, 7):
            cases.append((40, prescan_words(config, rng, count)))
            want.append(0)
            for kind in kinds:
                for k in {0, count - 1, rng.randrange(count)}:
                    cases.append((40, prescan_words(config, rng, count, (k, kind))))
                    want.append(1)
        assert run_prescan(config, cases) == want, config.mantissa_bits_w


ROM_ENTRIES = 40


def template_byte(pos):
    return (7 * pos + 3) & 0xFF


def test_emitter_sends_command_status_code_and_template():
    dut = ReplyEmitter(ROM_ENTRIES)
    rng = random.Random(9)
    replies = [  # status, length, code or None, template [lo, hi), data follows
        (0x00, 1, None, (0, 0), 0),
        (0x80, 2, 0x05, (0, 0), 1),
        (0x00, 6, None, (3, 8), 0),
        (0x80, 12, 0x11, (30, 40), 0),
        (0x00, 2, None, (39, 40), 1),
    ]
    got = []
    template_at = []                     # the template's pos, per cycle

    async def template(ctx):
        # The byte of the place three cycles before (ReplyTemplate's latency).
        async for _clk, _rst, pos in ctx.tick().sample(dut.pos):
            template_at.append(pos)
            if len(template_at) >= 3:
                ctx.set(dut.byte, template_byte(template_at[-3]))

    async def bench(ctx):
        await ctx.tick()                 # out of START, as the link's own state machine
        ctx.set(dut.opcode, 0x42)
        for status, length, code, (lo, hi), follows in replies:
            cmd = {"status": status, "length": length, "code": code or 0,
                   "has_code": code is not None, "t_lo": lo, "t_hi": hi,
                   "data_follows": follows}
            tag = rng.randrange(256)
            ctx.set(dut.tag, tag)
            ctx.set(dut.cmd, cmd)
            ctx.set(dut.start, 1)
            await ctx.tick()
            ctx.set(dut.start, 0)
            seen = {"cmd": [], "body": [], "done": 0}
            for _ in range(200):
                ready_c, ready_b = rng.random() < 0.6, rng.random() < 0.6
                ctx.set(dut.omp_cmd.ready, ready_c)
                ctx.set(dut.body.ready, ready_b)
                await ctx.delay(1e-8)
                if ready_c and ctx.get(dut.omp_cmd.valid):
                    seen["cmd"].append(ctx.get(dut.omp_cmd.payload))
                if ready_b and ctx.get(dut.body.valid):
                    seen["body"].append(ctx.get(dut.body.payload))
                done = ctx.get(dut.done)
                seen["done"] += done
                follows_out = ctx.get(dut.data_follows)
                await ctx.tick()
                if done:
                    break
            got.append((tag, seen, follows_out))

    run(dut, bench, template)
    for (status, length, code, (lo, hi), follows), (tag, seen, follows_out) in zip(
            replies, got, strict=True):
        assert seen["done"] == 1, f"done {seen['done']} times"
        assert [(c.opcode, c.tag, c.length) for c in seen["cmd"]] == [(0x42, tag, length)]
        want = [status] + ([code] if code is not None else []) + [
            template_byte(pos) for pos in range(lo, hi)]
        assert seen["body"] == want, f"body {seen['body']}, want {want}"
        assert follows_out == follows


def test_read_back_sends_each_sources_words():
    c = dataclasses.replace(CONFIG, tiles=2)
    dut = ReadBack(c)
    rng = random.Random(11)
    vb, mb = 2 * c.n, block_bytes(c.n, c.mantissa_bits_w)
    jobs = [(ReadSource.VECTOR, 3, vb), (ReadSource.MRF, 4, mb), (ReadSource.OUTPUT, 2, vb),
            (ReadSource.MRF, 1, mb)]
    got = []

    def word_of(source, key, size):
        return random.Random(hash((source.value, key))).getrandbits(8 * size)

    async def bench(ctx):
        addr, mrf = 17, [0, 0, 0]                      # engine, row, slot
        ctx.set(dut.space, 3)
        await ctx.tick()                 # out of START, as the link's own state machine
        for source, count, size in jobs:
            ctx.set(dut.source, source)
            ctx.set(dut.count, count)
            ctx.set(dut.bytes, size)
            ctx.set(dut.start, 1)
            await ctx.tick()
            ctx.set(dut.start, 0)
            requests, body, pending, queue_k = [], [], [], 0
            for _ in range(2000):
                ctx.set(dut.addr, addr)
                ctx.set(dut.engine, mrf[0])
                ctx.set(dut.row, mrf[1])
                ctx.set(dut.slot, mrf[2])
                ready_q, ready_b = rng.random() < 0.7, rng.random() < 0.6
                ctx.set(dut.vec_r_req.ready, ready_q)
                ctx.set(dut.mrf_r_req.ready, ready_q)
                ctx.set(dut.body.ready, ready_b)
                # One response at a time, some cycles after its request.
                respond = bool(pending) and rng.random() < 0.5
                resp_word = pending[0] if respond else 0
                for port in (dut.vec_r_resp, dut.mrf_r_resp):
                    ctx.set(port.valid, respond)
                    ctx.set(port.payload.as_value(), resp_word)
                out_word = word_of(source, ("q", queue_k), size)
                out_valid = rng.random() < 0.5
                ctx.set(dut.outq.valid, out_valid)
                ctx.set(dut.outq.payload.as_value(), out_word)
                await ctx.delay(1e-8)
                if ctx.get(dut.vec_r_req.valid) and ready_q:
                    assert ctx.get(dut.addr_step)
                    req = ctx.get(dut.vec_r_req.payload)
                    requests.append(("vec", req.space, req.addr))
                    pending.append(word_of(source, req.addr, size))
                    addr += 1
                if ctx.get(dut.mrf_r_req.valid) and ready_q:
                    assert ctx.get(dut.mrf_step)
                    req = ctx.get(dut.mrf_r_req.payload)
                    requests.append(("mrf", req.engine, req.row, req.slot))
                    pending.append(word_of(source, (req.engine, req.row, req.slot), size))
                    mrf = step_mrf(c, mrf)
                responded = respond and (ctx.get(dut.vec_r_resp.ready)
                                         or ctx.get(dut.mrf_r_resp.ready))
                if responded:
                    pending.pop(0)
                if out_valid and ctx.get(dut.outq.ready):
                    requests.append(("outq", queue_k))
                    queue_k += 1
                if ready_b and ctx.get(dut.body.valid):
                    body.append(ctx.get(dut.body.payload))
                done = ctx.get(dut.done)
                await ctx.tick()
                if done:
                    break
            got.append((requests, body, done))

    run(dut, bench)
    addr, mrf = 17, [0, 0, 0]
    for (source, count, size), (requests, body, done) in zip(jobs, got, strict=True):
        assert done, f"{source.name}: no done"
        want_req, want_body = [], []
        for k in range(count):
            if source == ReadSource.VECTOR:
                want_req.append(("vec", Space(3), addr))
                word = word_of(source, addr, size)
                addr += 1
            elif source == ReadSource.MRF:
                want_req.append(("mrf", *mrf))
                word = word_of(source, tuple(mrf), size)
                mrf = step_mrf(c, mrf)
            else:
                want_req.append(("outq", k))
                word = word_of(source, ("q", k), size)
            want_body += list(word.to_bytes(size, "little"))
        assert requests == want_req, f"{source.name}: requests {requests}"
        assert body == want_body, f"{source.name}: bytes differ"


def step_mrf(c, mrf):
    """The next MRF address after (engine, row, slot), by way of the flat address."""
    flat = mrf_address(c, *mrf) + 1
    return [(flat // c.n) % c.tiles, flat % c.n, flat // (c.n * c.tiles)]
