"""cocotb test of one program through the host link, for the gate-level board
(``make gatesim``, ``sim/gatesim.py``); it runs on any ``SimBoard`` top, like
``sim/test_link.py``, whose :class:`~sim.test_link.LinkTB` it uses: every reply is compared
byte for byte with ``host.runtime.server.ProtocolServer`` over ``host.model.core.NpuModel``.

``test_program``: a random legal program of :func:`sim.randprog.random_program`
(``GATESIM_SEED``, default 5; ``GATESIM_CHAINS`` chains, default 8) with its whole memory
image (every vector memory filled, its matrices written as the MRF words the model makes
of them), loaded, its inputs pushed, run, its outputs popped, then every memory, the
counters and the status read back (``LinkTB.digest``).

Parameters (environment), as ``sim/test_link.py``: ``LINK_CONFIG``, ``LINK_TRUNCATE``.
"""

from __future__ import annotations

import os

import cocotb

from host.model.core import NpuModel
from host.runtime.server import ProtocolServer
from host.spec import protocol as p
from host.spec.isa import Space
from host.spec.protocol import MAX_PAYLOAD, Opcode, Status
from sim.randprog import random_program
from sim.test_link import LinkTB, program_frames

#: Bytes of a WRITE's access header (space, address, count).
_ACCESS = len(p.pack_access(1, 0, 1))


def _read_words(server, config, space, count):
    """The wire bytes of words ``0 .. count - 1`` of ``space`` from a reference server."""
    per = (MAX_PAYLOAD - 1) // p.word_bytes(config, space)
    out = bytearray()
    for addr in range(0, count, per):
        reply = server.feed(p.encode_frame(Opcode.READ, 0, p.pack_access(
            space, addr, min(per, count - addr))))
        assert reply[p.HEADER_BYTES] == Status.OK.value, reply.hex(" ")
        out += reply[p.HEADER_BYTES + 1:-p.TRAILER_BYTES]
    return bytes(out)


async def _write_space(tb, space, raw, count):
    size = len(raw) // count
    per = (MAX_PAYLOAD - _ACCESS) // size
    for addr in range(0, count, per):
        k = min(per, count - addr)
        await tb.request(Opcode.WRITE, p.pack_access(space, addr, k)
                         + raw[addr * size:(addr + k) * size])


@cocotb.test()
async def test_program(dut):
    """A random program with its memory image, through the link, against the model."""
    tb = LinkTB(dut, seed=3)
    await tb.reset()
    c, n = tb.config, tb.config.n
    seed = int(os.environ.get("GATESIM_SEED", "5"))
    prog = random_program(c, seed, chains=int(os.environ.get("GATESIM_CHAINS", "8")))
    dut._log.info(f"program: seed {seed}, {len(prog.instructions)} instructions, "
                  f"{prog.refs['chains']} chains, {len(prog.matrices)} matrices, "
                  f"{len(prog.inputs)} inputs, {prog.outputs} outputs")
    # The image as the host would send it: the model staged with the program gives the
    # MRF words its matrices become.
    staged = NpuModel(c)
    prog.load(staged)
    for space, addr, data in prog.vectors:
        assert addr == 0
        await _write_space(tb, space.value, p.vectors_to_bytes(data), len(data))
    if prog.matrices:
        raw = _read_words(ProtocolServer(staged), c, Space.MRF.value, c.mrf_words)
        await _write_space(tb, Space.MRF.value, raw, c.mrf_words)
    for payload in program_frames(prog.words, 500):
        await tb.request(Opcode.LOAD_PROGRAM, payload)
    per = MAX_PAYLOAD // (2 * n)
    for k in range(0, len(prog.inputs), per):
        await tb.request(Opcode.PUSH_INPUT, p.vectors_to_bytes(prog.inputs[k:k + per]))
    reply = await tb.request(Opcode.RUN, budget=2_000_000)
    assert reply[p.HEADER_BYTES] == Status.OK.value, f"RUN: {reply.hex(' ')}"
    per = (MAX_PAYLOAD - 1) // (2 * n)
    for k in range(0, prog.outputs, per):
        await tb.request(Opcode.POP_OUTPUT, p.pack_pop(min(per, prog.outputs - k)))
    await tb.request(Opcode.STATUS)
    await tb.digest()
    assert tb.runs == 1, f"{tb.runs} RUN replies with entries compared"
    await tb.finish("test_program")
