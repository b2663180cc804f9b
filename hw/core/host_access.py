"""Host access: the host's requests into the core's memories and program while no program
runs, each checked before it reaches a memory, ``docs/npu.md``, "Host access"."""

from amaranth.hdl import Module, Mux, Signal, Value, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from host.spec.config import NpuConfig
from host.spec.formats import MAX_EXPONENT_CODE, block_layout
from host.spec.isa import ErrorCode, Space, vector_spaces
from hw.core.decode import STORED_WORD_LAYOUT, WordCheck
from hw.core.reader import RD_DATA_LATENCY, read_request_layout
from hw.core.vectors import beat_select, checked_config, vector_layout
from hw.core.writer import write_bus_layout
from hw.mvm.mvm import mrf_address_layout, mrf_word_layout, weight_row_layout

__all__ = [
    "HOST_ADDR_BITS", "PROGRAM_ADDR_BITS", "HostAccess", "program_port_layout",
    "program_write_layout", "vector_read_layout", "vector_space_depth", "vector_space_exists",
    "vector_write_layout",
]

#: Width of the address field of the host's vector-memory ports (the ISA's 2**24).
HOST_ADDR_BITS = 24
#: Width of the address field of the program-write port (program_depth <= 2**20).
PROGRAM_ADDR_BITS = 20


def vector_write_layout(config: NpuConfig) -> data.StructLayout:
    """``vec_w`` payload: ``space`` (Space), ``addr`` (24 bits), ``values`` (a vector)."""
    return data.StructLayout({"space": Space, "addr": unsigned(HOST_ADDR_BITS),
                              "values": vector_layout(config)})


def vector_read_layout(config: NpuConfig) -> data.StructLayout:
    """``vec_r_req`` payload: ``space`` (Space), ``addr`` (24 bits)."""
    return data.StructLayout({"space": Space, "addr": unsigned(HOST_ADDR_BITS)})


def program_write_layout(config: NpuConfig) -> data.StructLayout:
    """``prog_w`` payload: ``addr`` (20 bits), ``word`` (64-bit instruction)."""
    return data.StructLayout({"addr": unsigned(PROGRAM_ADDR_BITS), "word": unsigned(64)})


def program_port_layout(config: NpuConfig) -> data.StructLayout:
    """A write of the program memory: ``en``, ``addr`` (20 bits, below ``program_depth``
    when ``en``) and ``data`` (what the memory keeps of the word:
    :data:`hw.core.decode.STORED_WORD_LAYOUT`)."""
    return data.StructLayout({"en": 1, "addr": unsigned(PROGRAM_ADDR_BITS),
                              "data": STORED_WORD_LAYOUT})


def vector_space_exists(config: NpuConfig, space) -> Value:
    """1 where ``space`` (a value holding a :class:`host.spec.isa.Space` code) is a vector
    memory of build ``config``: the IVRF or a VRF that its unit sets build
    (``host.spec.isa.vector_spaces``). The core's and the link's one check."""
    space = Value.cast(space)
    vrfs = 2 * config.mfus
    built = [s.value for s in vector_spaces(config)[1:]]
    if len(built) < vrfs:
        result = space == Space.IVRF.value
        for s in built:
            result = result | (space == s)
        return result
    return (space == Space.IVRF.value) | ((space >= 2) & (space < 2 + vrfs))


def vector_space_depth(config: NpuConfig, space) -> Value:
    """The depth in vectors of vector memory ``space`` (a value holding a Space code):
    ``ivrf_depth`` for the IVRF, ``vrf_depth`` for any other."""
    return Mux(Value.cast(space) == Space.IVRF.value, config.ivrf_depth, config.vrf_depth)


class HostAccess(wiring.Component):
    """The host's ports of the core, checked, onto the core's memory buses and the MVM's
    MRF ports. Every request waits while ``open`` is low (a program runs). A refused
    request (a space the build lacks, an address out of range, an MRF word with an
    exponent code above 142) writes nothing, reports its error code on ``access_set`` for
    the cycle it is taken, and is answered at once (a read with an all-zero word).

    Parameters
    ----------
    config : host.spec.config.NpuConfig

    Attributes
    ----------
    vec_w, vec_r_req, vec_r_resp, mrf_w, w_rows, mrf_r_req, mrf_r_resp, prog_w
        The core's host ports, as :class:`hw.core.npu.NpuCore` documents them.
    mvm_mrf_w, mvm_w_rows, mvm_mrf_r_req : ``Out(stream.Signature(...))``,
    mvm_mrf_r_resp : ``In(stream.Signature(block_layout(n, m_w)))``
        The MVM's MRF ports (``mrf_w``, ``w_stream``, ``mrf_r_req``, ``mrf_r_resp``): the
        accepted requests and their responses.
    open : ``In(1)``
        No program runs: requests are taken.
    rd : ``Out(read_request_layout(config))``, rd_data : ``In(vector_layout(config))``
        A vector read (``rd.en``) and, :data:`hw.core.reader.RD_DATA_LATENCY` cycles
        later, the memory's data.
    wr : ``Out(write_bus_layout(config))``
        A vector write, one beat a cycle (``beats`` cycles a vector with lanes < n).
    prog : ``Out(program_port_layout(config))``
        A program word and its checks (:class:`hw.core.decode.WordCheck`) into the memory.
    prog_len : ``Out(range(program_depth + 1))``
        The program's length: 1 after a write at address 0, then one more than the highest
        address written.
    access_set : ``Out(ErrorCode)``
        The error of a request refused this cycle, NONE otherwise.

    Raises
    ------
    TypeError
        ``config`` is not an :class:`host.spec.config.NpuConfig`.
    """

    def __init__(self, config):
        config = checked_config(self, config)
        self._config = c = config
        mvm = c.mvm
        word = block_layout(c.n, c.mantissa_bits_w)
        super().__init__({
            "vec_w": In(stream.Signature(vector_write_layout(c))),
            "vec_r_req": In(stream.Signature(vector_read_layout(c))),
            "vec_r_resp": Out(stream.Signature(vector_layout(c))),
            "mrf_w": In(stream.Signature(mrf_word_layout(mvm))),
            "w_rows": In(stream.Signature(weight_row_layout(mvm))),
            "mrf_r_req": In(stream.Signature(mrf_address_layout(mvm))),
            "mrf_r_resp": Out(stream.Signature(word)),
            "prog_w": In(stream.Signature(program_write_layout(c))),
            "mvm_mrf_w": Out(stream.Signature(mrf_word_layout(mvm))),
            "mvm_w_rows": Out(stream.Signature(weight_row_layout(mvm))),
            "mvm_mrf_r_req": Out(stream.Signature(mrf_address_layout(mvm))),
            "mvm_mrf_r_resp": In(stream.Signature(word)),
            "open": In(1),
            "rd": Out(read_request_layout(c)),
            "rd_data": In(vector_layout(c)),
            "wr": Out(write_bus_layout(c)),
            "prog": Out(program_port_layout(c)),
            "prog_len": Out(range(c.program_depth + 1)),
            "access_set": Out(ErrorCode),
        })

    def elaborate(self, platform):
        m = Module()
        c = self._config
        beats = c.beats
        host_ok = self.open

        def space_depth(space):
            return vector_space_depth(c, space)

        # The assignments to access_set below are in the order of the core before the
        # split (the last one wins); the link sends one request at a time.

        # Vector write: with lanes < n, B beat writes on the write bus (the MFU VRFs take
        # beats), `ready` with the last; a refused request is still answered at once.
        w = self.vec_w.payload
        w_bad_space = ~vector_space_exists(c, w.space)
        w_bad_addr = w.addr >= space_depth(w.space)
        host_wr_en = Signal()
        if beats == 1:
            m.d.comb += self.vec_w.ready.eq(host_ok)
        else:
            host_beat = Signal(c.beat_bits)
            m.d.comb += [self.vec_w.ready.eq(
                host_ok & (w_bad_space | w_bad_addr | (host_beat == beats - 1))),
                self.wr.beat.eq(host_beat)]
            with m.If(host_wr_en):
                m.d.sync += host_beat.eq(host_beat + 1)
        with m.If(self.vec_w.valid & host_ok):
            with m.If(w_bad_space):
                m.d.comb += self.access_set.eq(ErrorCode.ILLEGAL_FIELD)
            with m.Elif(w_bad_addr):
                m.d.comb += self.access_set.eq(ErrorCode.ADDRESS_RANGE)
            with m.Else():
                m.d.comb += host_wr_en.eq(1)
        m.d.comb += [
            self.wr.en.eq(host_wr_en), self.wr.space.eq(w.space), self.wr.addr.eq(w.addr),
            self.wr.data.eq(w.values if beats == 1
                            else beat_select(c, w.values.as_value(), host_beat)),
        ]

        # Vector read: one request at a time, the response held until taken.
        r = self.vec_r_req.payload
        resp_valid = Signal()
        # A read in flight, one bit a cycle: bit k set k + 1 cycles after it was issued.
        resp_pending = Signal(RD_DATA_LATENCY)
        resp_zero = Signal()
        resp_data = Signal(vector_layout(c))
        r_bad_space = ~vector_space_exists(c, r.space)
        r_bad_addr = r.addr >= space_depth(r.space)
        r_idle = ~resp_valid & ~resp_pending.any()
        take_r = self.vec_r_req.valid & host_ok & r_idle
        m.d.comb += self.vec_r_req.ready.eq(host_ok & r_idle)
        m.d.sync += resp_pending.eq(resp_pending << 1)
        with m.If(take_r):
            m.d.sync += [resp_pending.eq(1), resp_zero.eq(r_bad_space | r_bad_addr)]
            with m.If(r_bad_space):
                m.d.comb += self.access_set.eq(ErrorCode.ILLEGAL_FIELD)
            with m.Elif(r_bad_addr):
                m.d.comb += self.access_set.eq(ErrorCode.ADDRESS_RANGE)
            with m.Else():
                m.d.comb += self.rd.en.eq(1)
        m.d.comb += [self.rd.addr.eq(r.addr), self.rd.space.eq(r.space)]
        with m.If(resp_pending[-1]):
            m.d.sync += [resp_valid.eq(1),
                         resp_data.eq(Mux(resp_zero, 0, self.rd_data.as_value()))]
        with m.If(self.vec_r_resp.valid & self.vec_r_resp.ready):
            m.d.sync += resp_valid.eq(0)
        m.d.comb += [self.vec_r_resp.valid.eq(resp_valid),
                     self.vec_r_resp.payload.eq(resp_data)]

        # MRF words, weight rows and read-back go to the MVM after a range check.
        mw, wr, mr = self.mrf_w.payload, self.w_rows.payload, self.mrf_r_req.payload

        def mrf_bad(p):
            return (p.engine >= c.tiles) | (p.slot >= c.mrf_depth)

        mw_bad = mrf_bad(mw)
        mw_bad_word = mw.block.exponent > MAX_EXPONENT_CODE
        wr_bad = mrf_bad(wr)
        wr_bad_word = wr.static & (wr.static_exponent > MAX_EXPONENT_CODE)
        mvm_w, mvm_rows = self.mvm_mrf_w, self.mvm_w_rows
        m.d.comb += [
            mvm_w.payload.eq(mw),
            mvm_w.valid.eq(self.mrf_w.valid & host_ok & ~mw_bad & ~mw_bad_word),
            self.mrf_w.ready.eq(host_ok & (mvm_w.ready | mw_bad | mw_bad_word)),
            mvm_rows.payload.eq(wr),
            mvm_rows.valid.eq(self.w_rows.valid & host_ok & ~wr_bad & ~wr_bad_word),
            self.w_rows.ready.eq(host_ok & (mvm_rows.ready | wr_bad | wr_bad_word)),
        ]
        with m.If(self.mrf_w.valid & host_ok):
            with m.If(mw_bad):
                m.d.comb += self.access_set.eq(ErrorCode.ADDRESS_RANGE)
            with m.Elif(mw_bad_word):
                m.d.comb += self.access_set.eq(ErrorCode.MRF_WORD)
        with m.If(self.w_rows.valid & host_ok):
            with m.If(wr_bad):
                m.d.comb += self.access_set.eq(ErrorCode.ADDRESS_RANGE)
            with m.Elif(wr_bad_word):
                m.d.comb += self.access_set.eq(ErrorCode.MRF_WORD)
        # Read-back: one request at a time, as vector reads, so that responses leave in
        # the order of the requests; a refused request is answered with an all-zero word
        # here (zero_resp), an accepted one by the MVM (mvm_wait until it is taken).
        mr_bad = mrf_bad(mr)
        zero_resp = Signal()
        mvm_wait = Signal()
        idle = host_ok & ~zero_resp & ~mvm_wait
        req, resp = self.mvm_mrf_r_req, self.mvm_mrf_r_resp
        m.d.comb += [
            req.payload.eq(mr),
            req.valid.eq(self.mrf_r_req.valid & idle & ~mr_bad),
            self.mrf_r_req.ready.eq(idle & (req.ready | mr_bad)),
            self.mrf_r_resp.valid.eq(resp.valid | zero_resp),
            self.mrf_r_resp.payload.eq(Mux(zero_resp, 0, resp.payload.as_value())),
            resp.ready.eq(self.mrf_r_resp.ready & ~zero_resp),
        ]
        with m.If(self.mrf_r_req.valid & self.mrf_r_req.ready):
            with m.If(mr_bad):
                m.d.sync += zero_resp.eq(1)
                m.d.comb += self.access_set.eq(ErrorCode.ADDRESS_RANGE)
            with m.Else():
                m.d.sync += mvm_wait.eq(1)
        with m.If(zero_resp & self.mrf_r_resp.ready):
            m.d.sync += zero_resp.eq(0)
        with m.If(resp.valid & resp.ready):
            m.d.sync += mvm_wait.eq(0)

        # Program words, with their checks (WordCheck: decoded when the host writes a
        # word, so the fetched word needs no decoder logic before the front end's
        # decisions).
        pw = self.prog_w.payload
        m.submodules.word_check = word_check = WordCheck(c)
        m.d.comb += [self.prog_w.ready.eq(host_ok), self.prog.addr.eq(pw.addr),
                     word_check.word.eq(pw.word),
                     self.prog.data.eq(word_check.stored)]
        prog_len = self.prog_len
        with m.If(self.prog_w.valid & host_ok):
            with m.If(pw.addr >= c.program_depth):
                m.d.comb += self.access_set.eq(ErrorCode.PROGRAM_RANGE)
            with m.Else():
                m.d.comb += self.prog.en.eq(1)
                with m.If(pw.addr == 0):
                    m.d.sync += prog_len.eq(1)
                with m.Elif(pw.addr >= prog_len):
                    m.d.sync += prog_len.eq(pw.addr + 1)
        return m
