"""A request's checks, from its header and payload prefix (``docs/link-hw.md`` section 3).

:class:`RequestChecks` computes every flag that ``host.runtime.server.ProtocolServer``
tests before it executes a request (``docs/protocol.md`` section 3); the executor
(:class:`hw.link.link.NpuLink`) chooses among them in the server's order.
"""

from __future__ import annotations

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import bits_for, ceil_log2

from host.spec import protocol as p
from host.spec.config import NpuConfig
from host.spec.formats import block_bytes
from host.spec.isa import Space
from host.spec.protocol import MAX_PAYLOAD, Opcode
from hw.core.npu import PROGRAM_ADDR_BITS, vector_space_exists
from hw.link.scanner import frame_header_layout

__all__ = ["RequestChecks"]


class RequestChecks(wiring.Component):
    """The checks of the request in ``header`` and ``prefix``, two cycles after them.

    Two stages of registers (timing closure: the sizes came out of a MULT18X18D into
    adders, comparators and the executor's priority chain in one cycle): the first holds
    the products and sums (the words' bytes, ``addr + count``, ``offset + words``, the
    input queue's level after a push), the second every comparison as one flag. The
    flags are those of the request two cycles after its inputs, which must hold
    meanwhile (the link keeps the request, and no RUN is in progress, so the core's
    levels and error hold). Only the flags that the opcode's checks use are updated; the
    others keep older values.

    Parameters
    ----------
    config : host.spec.config.NpuConfig
        The core's build (depths, word sizes, vector spaces).
    level_bits : int
        Bits of the core's queue levels.

    Attributes
    ----------
    header : ``In(hw.link.scanner.frame_header_layout())``
    prefix : ``In(64)``
        The payload's first 8 bytes (ACCESS, PROGRAM or POP layout).
    inq_level, outq_level : ``In(level_bits)``
    halted : ``In(1)``
        The core's sticky error is set.
    staged : ``In(PROGRAM_ADDR_BITS + 1)``
        Program words staged by earlier LOAD_PROGRAM chunks.
    staged_total : ``In(32)``
        The program length those chunks announced.
    words : ``Out(16)``
        LOAD_PROGRAM: program words of the payload (combinational).
    vectors : ``Out(16)``
        PUSH_INPUT: vectors of the payload (combinational).
    data_bytes : ``Out(16 + bits_for(max word bytes))``
        WRITE/READ: bytes of ``count`` words of the space.
    pop_bytes : ``Out(16 + bits_for(2 n))``
        POP_OUTPUT: bytes of ``count`` vectors.
    bad_length, bad_space, bad_count, bad_size, bad_address, program_more, queue_full, queue_empty, halted_at : ``Out(1)``
        The flags: the length does not fit the opcode; no such space; a count out of
        range; WRITE's length is not its words'; an access or chunk out of range;
        LOAD_PROGRAM's chunk is not the last; PUSH_INPUT would overfill the input queue;
        POP_OUTPUT asks for more than the output queue holds; the core was halted.
    """

    def __init__(self, config: NpuConfig, *, level_bits: int):
        self._MustUse__silence = True       # refused parameters: no unused-unit warning
        if not isinstance(config, NpuConfig):
            raise TypeError(f"config must be an NpuConfig, not {config!r}")
        self._MustUse__silence = False
        self._config = config
        c = config
        vb = 2 * c.n
        mb = block_bytes(c.n, c.mantissa_bits_w)
        flags = ("bad_length", "bad_space", "bad_count", "bad_size", "bad_address",
                 "program_more", "queue_full", "queue_empty", "halted_at")
        super().__init__({
            "header": In(frame_header_layout()), "prefix": In(64),
            "inq_level": In(level_bits), "outq_level": In(level_bits), "halted": In(1),
            "staged": In(PROGRAM_ADDR_BITS + 1), "staged_total": In(32),
            "words": Out(16), "vectors": Out(16),
            "data_bytes": Out(16 + bits_for(max(vb, mb, 8))),
            "pop_bytes": Out(16 + bits_for(vb)),
            **{name: Out(1) for name in flags}})

    def elaborate(self, platform):
        m = Module()
        c = self._config
        vb = 2 * c.n
        mb = block_bytes(c.n, c.mantissa_bits_w)
        op = self.header.opcode
        L = self.header.length
        acc = data.View(p.ACCESS_LAYOUT, self.prefix)
        prg = data.View(p.PROGRAM_LAYOUT, self.prefix)
        pop = data.View(p.POP_LAYOUT, self.prefix[:16])
        sp = acc.space
        is_mrf = sp == Space.MRF.value
        is_vec = vector_space_exists(c, sp)
        is_read = op == Opcode.READ.value
        depth = Mux(is_mrf, c.mrf_words, Mux(sp == Space.IVRF.value, c.ivrf_depth,
                                             c.vrf_depth))
        m.d.comb += [self.words.eq((L - 8) >> 3),
                     self.vectors.eq(L >> ceil_log2(vb))]

        access_end = Signal(33)                      # addr + count
        access_depth = Signal(range(max(c.mrf_words, c.ivrf_depth, c.vrf_depth) + 1))
        program_end = Signal(33)                     # offset + words
        inq_after = Signal(len(self.inq_level) + 16)
        m.d.sync += [self.data_bytes.eq(Mux(is_mrf, acc.count * mb, acc.count * vb)),
                     access_end.eq(acc.addr + acc.count), access_depth.eq(depth),
                     program_end.eq(prg.offset + self.words),
                     self.pop_bytes.eq(pop.count * vb),
                     inq_after.eq(self.inq_level + self.vectors)]

        m.d.sync += self.halted_at.eq(self.halted)
        with m.Switch(op):
            with m.Case(Opcode.WRITE, Opcode.READ):
                m.d.sync += [
                    self.bad_length.eq((L < 8) | (is_read & (L != 8))),
                    self.bad_space.eq(~is_mrf & ~is_vec),
                    self.bad_count.eq((acc.count == 0)
                                      | (is_read & (1 + self.data_bytes > MAX_PAYLOAD))),
                    self.bad_size.eq(~is_read & (L != 8 + self.data_bytes)),
                    self.bad_address.eq(access_end > access_depth)]
            with m.Case(Opcode.LOAD_PROGRAM):
                expect = Mux(prg.offset == 0, 0, self.staged)
                m.d.sync += [
                    self.bad_length.eq((L < 8) | (L[:3] != 0)),
                    self.bad_count.eq((self.words == 0) | (prg.total == 0)
                                      | (prg.total > c.program_depth)),
                    self.bad_address.eq((prg.offset != expect)
                                        | ((prg.offset != 0)
                                           & (prg.total != self.staged_total))
                                        | (program_end > prg.total)),
                    self.program_more.eq(program_end < prg.total)]
            with m.Case(Opcode.PUSH_INPUT):
                m.d.sync += [self.bad_length.eq((L == 0) | (L[:ceil_log2(vb)] != 0)),
                             self.queue_full.eq(inq_after > c.netq_depth)]
            with m.Case(Opcode.POP_OUTPUT):
                m.d.sync += [self.bad_length.eq(L != 2),
                             self.bad_count.eq((pop.count == 0)
                                               | (1 + self.pop_bytes > MAX_PAYLOAD)),
                             self.queue_empty.eq(self.outq_level < pop.count)]
            with m.Default():
                m.d.sync += self.bad_length.eq(L != 0)
        return m
