"""``host.runtime.transport.SerialTransport`` and ``connect`` against a pseudo-terminal whose far
end runs a ``ProtocolServer`` over the model (``host.runtime.server.PtyServer``): the real serial
code path (pyserial, termios, the kernel's tty layer) without a board.

The device-level tests in ``test_device.py`` run over this transport too; these are the
tests of the byte stream itself: timing-based truncation, long pipelined batches, garbage
on the wire, opening and closing.
"""

import struct
import time

import numpy as np
import pytest

from host.spec import protocol as p
from host.spec.config import NpuConfig
from host.runtime.device import Device
from host.spec.isa import Space
from host.model.core import NpuModel
from host.spec.protocol import Frame, FrameDecoder, Opcode, Status
from host.runtime.server import ProtocolServer, PtyServer
from host.runtime.transport import ModelTransport, SerialTransport, TransportError, connect

CFG = NpuConfig(n=4, tiles=2, mrf_depth=8, ivrf_depth=4096, vrf_depth=16, netq_depth=16,
                program_depth=64, max_length=4, max_col_tiles=4)


@pytest.fixture
def board():
    model = NpuModel(CFG)
    with PtyServer(ProtocolServer(model)) as server:
        yield server, model


def read_replies(transport, count, timeout=5.0):
    """``count`` reply frames from ``transport`` (fails the test on timeout)."""
    dec, got = FrameDecoder(), []
    deadline = time.monotonic() + timeout
    while len(got) < count:
        left = deadline - time.monotonic()
        assert left > 0, f"only {len(got)} of {count} replies arrived"
        got += dec.feed(transport.recv(65536, left))
    assert len(got) == count
    return got


def test_connect_opens_the_pty(board):
    server, model = board
    for spec in [f"serial:{server.port}", f"serial:{server.port}@9600"]:
        with Device(connect(spec)) as dev:
            assert dev.transport.name.startswith("serial:")
            assert dev.info()["ivrf_depth"] == 4096
    assert connect(f"serial:{server.port}@9600").name == f"serial:{server.port}@9600"


def test_truncated_frame_answered_after_the_quiet_time(board):
    server, model = board
    with SerialTransport(server.port) as t:
        frame = p.encode_frame(Opcode.WRITE, 7, p.pack_access(1, 0, 4) + bytes(32))
        start = time.monotonic()
        t.send(frame[:25])
        (reply,) = read_replies(t, 1)
        waited = time.monotonic() - start
        assert reply == Frame(Opcode.WRITE.value | p.REPLY, 7, bytes([Status.TRUNCATED.value]))
        assert waited >= p.TRUNCATE_TIMEOUT
        t.send(p.encode_frame(Opcode.STATUS, 8))
        (reply,) = read_replies(t, 1)
        assert reply.tag == 8 and reply.payload[0] == Status.OK.value
    assert not model.read(Space.IVRF, 0, 4).any()


def test_a_long_batch_sent_before_any_reply_is_read(board):
    # 120 READs of a full frame each: about 490 kB of replies pile up while the host is
    # still sending; neither side may block the other.
    server, model = board
    rng = np.random.default_rng(1)
    x = rng.integers(0, 1 << 16, (4096, 4), dtype=np.uint16)
    model.write(Space.IVRF, 0, x)
    per = (p.MAX_PAYLOAD - 1) // 8
    with SerialTransport(server.port) as t:
        batch = b"".join(p.encode_frame(Opcode.READ, i, p.pack_access(1, (i * 37) % 3000, per))
                         for i in range(120))
        t.send(batch)
        replies = read_replies(t, 120, timeout=30)
    for i, r in enumerate(replies):
        assert r.tag == i and r.payload[0] == Status.OK.value
        start = (i * 37) % 3000
        assert np.frombuffer(r.payload[1:], "<u2").reshape(per, 4).tolist() == \
            x[start:start + per].tolist()


def test_garbage_on_the_wire(board):
    server, model = board
    rng = np.random.default_rng(2)
    with SerialTransport(server.port) as t:
        stream = b""
        for i in range(30):
            stream += rng.bytes(int(rng.integers(0, 50))) + p.encode_frame(Opcode.STATUS, i)
        t.send(stream)
        replies = read_replies(t, 30)
    assert [r.tag for r in replies] == list(range(30))
    assert struct.unpack("<BBHII", replies[0].payload[1:]) == (0, 0, 0, 0, 0)


def test_same_bytes_as_the_model_transport(board):
    server, model = board
    requests = b"".join([p.encode_frame(Opcode.INFO, 1),
                         p.encode_frame(Opcode.WRITE, 2, p.pack_access(2, 3, 1) + bytes(range(8))),
                         p.encode_frame(Opcode.READ, 3, p.pack_access(2, 0, 5)),
                         p.encode_frame(Opcode.READ_COUNTERS, 4),
                         p.encode_frame(0x55, 5)])
    local = ModelTransport(NpuModel(CFG))
    local.send(requests)
    expected = local.recv(1 << 20, 0)
    with SerialTransport(server.port) as t:
        t.send(requests)
        got = b""
        while len(got) < len(expected):
            chunk = t.recv(65536, 5.0)
            assert chunk, "reply bytes stopped"
            got += chunk
    assert got == expected


def test_open_errors_and_closed_transport(board):
    server, _ = board
    with pytest.raises(TransportError, match="cannot open serial port '/nonexistent/tty'"):
        SerialTransport("/nonexistent/tty")
    with pytest.raises(ValueError, match="names no port"):
        connect("serial:")
    with pytest.raises(ValueError, match="baud rate 'fast'"):
        connect(f"serial:{server.port}@fast")
    with pytest.raises(ValueError, match="baudrate must be at least 1, not 0"):
        SerialTransport(server.port, 0)
    t = SerialTransport(server.port)
    t.close()
    with pytest.raises(TransportError, match="is closed"):
        t.send(b"x")
    t.close()                                            # closing twice is harmless


def test_connect_choices():
    with pytest.raises(ValueError, match="bad sim option: n must be an integer, not 'x'"):
        connect("sim:n=x")              # refused before any simulator starts
    with pytest.raises(ValueError, match="n must be a power of two, not 12"):
        connect("sim:n=12")
    with pytest.raises(ValueError, match="unknown device 'tcp:1'; choose one of: model"):
        connect("tcp:1")
    with pytest.raises(ValueError, match="bad model option in 'model:n': unknown build preset 'n'"):
        connect("model:n")
    with pytest.raises(ValueError, match="bad model option"):
        connect("model:bogus=1")
    with pytest.raises(ValueError, match="n must be a power of two, not 12"):
        connect("model:n=12")
    assert connect("model:ulx3s").backend.config.n == 16         # a preset
    assert connect("model:ulx3s_n4").backend.config.n == 4
    t = connect("model:n=8,tiles=1")
    assert isinstance(t, ModelTransport) and t.backend.config.n == 8
    assert t.backend.config.tiles == 1
    t.close()
    with pytest.raises(TransportError, match="model transport is closed"):
        t.send(b"")
