"""``hw.board.board.NpuBoard`` on its serial lines, in Amaranth's simulator.

The whole board (UART receiver, receive FIFO, link, core, UART transmitter) at the
smallest build; requests go in as 8N1 bits on ``rx`` and the replies are read off ``tx``
by a second :class:`hw.link.uart.UartRx` (the UART itself is tested against a line driven
from Python in ``tests/hw/test_link_uart.py``). Every reply byte must equal what
``host.runtime.server.ProtocolServer`` over the reference model answers to the same bytes, and
the data read back must be the data written, also after a frame with a bad CRC (a
rejected request loses nothing). Requests go byte after byte, and again with idle bit
times between bytes. The message processors themselves are tested in depth on
``hw.board.board.SimBoard`` (``tests/hw/test_link_hw.py``); this test is about the board's
serial path around them.
"""

import random

import numpy as np
import pytest
from amaranth.hdl import Module
from amaranth.sim import Simulator

from host.spec import protocol as p
from host.spec.config import NpuConfig
from host.spec.isa import Space
from host.model.core import NpuModel
from host.spec.protocol import Opcode, Status
from host.runtime.server import ProtocolServer
from hw.board.board import NpuBoard
from hw.link.uart import UartRx, UartTx, divisor_for

pytestmark = pytest.mark.filterwarnings("ignore::amaranth.hdl.UnusedElaboratable")

#: 4 clock cycles per bit (``hw.link.uart.MIN_DIVISOR``): the fastest line the UART takes,
#: so that the simulation stays short.
CLK_HZ, BAUD = 400_000, 100_000
CONFIG = NpuConfig(n=4, tiles=1, mrf_depth=8, max_col_tiles=2, ivrf_depth=8, vrf_depth=8,
                   netq_depth=8, program_depth=16, max_length=2, unary_ops=("sigmoid",))


def _requests(rng):
    """``(frames, reads)``: the request frames, and for each READ's tag the bytes it
    must return (two IVRF words at address 3)."""
    data = rng.integers(0, 0x7C00, size=2 * CONFIG.n, dtype=np.uint16)    # finite FP16
    data = data.astype("<u2").tobytes()
    access = p.pack_access(Space.IVRF.value, 3, 2)
    bad = bytearray(p.encode_frame(Opcode.WRITE, 4, access + bytes(len(data))))
    bad[-1] ^= 0x01                      # the CRC no longer matches: nothing is written
    frames = [
        # (INFO's reply, 363 bytes at this build, would triple the simulation time.)
        p.encode_frame(Opcode.STATUS, 1),
        p.encode_frame(Opcode.WRITE, 2, access + data),
        p.encode_frame(Opcode.READ, 3, access),
        bytes(bad),
        p.encode_frame(Opcode.READ, 5, access),
        p.encode_frame(Opcode.STATUS, 6),
    ]
    return frames, {3: data, 5: data}


@pytest.mark.parametrize("gaps", [False, True], ids=["back_to_back", "idle_bits"])
def test_board_serial_requests(gaps):
    rng = np.random.default_rng(7)
    frames, reads = _requests(rng)
    server = ProtocolServer(NpuModel(CONFIG))
    expected = b"".join(server.feed(f) for f in frames)
    sent = b"".join(frames)

    divisor = divisor_for(CLK_HZ, BAUD)
    m = Module()
    m.submodules.board = board = NpuBoard(CONFIG, CLK_HZ, BAUD)
    m.submodules.host_tx = host_tx = UartTx(divisor)
    m.submodules.host_rx = host_rx = UartRx(divisor)
    m.d.comb += [board.rx.eq(host_tx.tx), host_rx.rx.eq(board.tx)]
    pause = random.Random(11)
    got = bytearray()

    async def sender(ctx):
        for byte in sent:
            if gaps and pause.random() < 0.3:
                await ctx.tick().repeat(pause.randrange(1, 3 * 10 * divisor))
            ctx.set(host_tx.i_stream.valid, 1)
            ctx.set(host_tx.i_stream.payload, byte)
            await ctx.tick().until(host_tx.i_stream.ready)
            ctx.set(host_tx.i_stream.valid, 0)

    async def receiver(ctx):
        ctx.set(host_rx.o_stream.ready, 1)
        # Every request and reply byte takes 10 bit times; the core answers within a few
        # hundred cycles of a request's last byte.
        budget = 10 * divisor * (len(sent) + len(expected)) * 3 + 2000
        for _ in range(budget):
            await ctx.tick()
            if ctx.get(host_rx.o_stream.valid):
                got.append(ctx.get(host_rx.o_stream.payload))
                if len(got) == len(expected):
                    break
        # Nothing more comes, and the line was clean.
        await ctx.tick().repeat(30 * divisor)
        assert not ctx.get(host_rx.o_stream.valid)
        assert ctx.get(host_rx.framing_errors) == ctx.get(host_rx.overruns) == 0

    sim = Simulator(m)
    sim.add_clock(1 / CLK_HZ)
    sim.add_testbench(sender)
    sim.add_testbench(receiver)
    sim.run()

    assert bytes(got) == expected
    # Independent of the reference server: the bad frame was refused, and both READs
    # (before and after it) return the words written (a reply payload: status, body).
    events = p.FrameDecoder().feed(bytes(got))
    assert all(isinstance(e, p.Frame) for e in events), events
    replies = {e.tag: e.payload for e in events}
    assert sorted(replies) == [1, 2, 3, 4, 5, 6]
    assert replies[4][0] == Status.BAD_CRC.value
    for tag, data in reads.items():
        assert replies[tag][0] == Status.OK.value
        assert replies[tag][1:] == data, f"READ tag {tag} did not return the words written"
