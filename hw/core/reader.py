"""The reader: the source vectors of each chain instance, from the input queue or a
vector memory, window by window, into the MVM's buffer (a product's input) or the direct
buffer (a chain without a product), ``docs/npu.md``, "Reader"."""

from amaranth.hdl import Module, Mux, Signal, unsigned
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import bits_for

from host.spec.config import NpuConfig
from host.spec.isa import Space, vector_spaces
from hw.core.vectors import (
    beat_layout,
    beat_select,
    count_bits,
    last_beat,
    pitch_bits,
    vector_layout,
)
from hw.slice import RegisterSlice

__all__ = ["RD_DATA_LATENCY", "Reader", "memory_spaces", "read_request_layout",
           "reader_layout"]

#: Cycles from a host read of the vector memories (``rd.en``) to its data on
#: :class:`hw.core.memories.VectorMemories`'s ``rd_data``: the block RAM's, and a
#: register behind it. (The reader's own inputs, each memory's data, come a cycle after
#: its read.)
RD_DATA_LATENCY = 2


def reader_layout(config: NpuConfig) -> data.StructLayout:
    """What the reader takes of an instance: ``space`` (the source: NETQ, the IVRF or a
    VRF), ``base`` (the first vector address), the window (``pix`` vectors a pixel,
    ``win_w`` x ``win_h`` pixels, rows ``pitch`` apart), ``lanes_cols`` (the lanes of a
    pixel's last vector that enter the MVM) and ``to_mvm`` (1: a product's input)."""
    a = config.vector_addr_bits
    cb = count_bits(config)
    return data.StructLayout({
        "space": Space, "base": unsigned(a), "pix": unsigned(cb), "win_w": unsigned(cb),
        "win_h": unsigned(cb), "pitch": unsigned(pitch_bits(config)),
        "lanes_cols": unsigned(bits_for(config.n)), "to_mvm": unsigned(1),
    })


def read_request_layout(config: NpuConfig) -> data.StructLayout:
    """A read of the core's vector memories: ``en``, ``space`` (4 bits, a Space code) and
    ``addr`` (a vector address); each memory's data comes the next cycle, the host's
    ``rd_data`` :data:`RD_DATA_LATENCY` cycles later."""
    return data.StructLayout({"en": 1, "space": 4, "addr": config.vector_addr_bits})


def memory_spaces(config: NpuConfig) -> dict:
    """The core's vector memories and the Space codes each holds: ``"ivrf"`` the IVRF;
    ``"vrf"`` (only if the unit sets build a VRF) the copies of the MFU VRFs."""
    spaces = {"ivrf": [Space.IVRF.value]}
    vrfs = [s.value for s in vector_spaces(config)[1:]]
    if vrfs:
        spaces["vrf"] = vrfs
    return spaces


def _paces(m, c, step, to_mvm):
    """The reader's two paces with lanes < n: ``(vector_step, p_beat)``. A product's
    source (``to_mvm``) is read N wide, one native vector per ``step`` (the MVM's input
    takes one per cycle); a chain without a product steps through ``(vector, beat)``,
    reading the same vector address B times, one beat per ``step`` into the direct
    buffer. ``vector_step`` is 1 where the reader moves on to the next vector (and
    pops the input queue's head), ``p_beat`` (``beat_bits``, a register: the beat read
    last cycle) selects the beat of the read data. With lanes == n: ``(step, None)``."""
    if c.beats == 1:
        return step, None
    r_beat = Signal(c.beat_bits)
    p_beat = Signal(c.beat_bits)
    vector_step = Signal()
    m.d.comb += vector_step.eq(step & (to_mvm | last_beat(c, r_beat)))
    with m.If(step & ~to_mvm):
        m.d.sync += r_beat.eq(r_beat + 1)
    m.d.sync += p_beat.eq(r_beat)
    return vector_step, p_beat


class Reader(wiring.Component):
    """Per instance, its ``pix`` x ``win_w`` x ``win_h`` source vectors in window order:
    from ``inq`` (NETQ) or through ``rd`` from a vector memory, whose data (``<memory>_data``,
    :func:`memory_spaces`) arrives the next cycle and is registered. A product's go N
    wide into the MVM's buffer (4 vectors, out on ``x_stream``, a queue without an
    output register); the others beat by beat (each vector read ``beats`` times) into
    the direct buffer (``config.direct_depth * beats`` beats), so that they wait for
    the MFU pipeline without holding back the next product's input; the direct
    buffer's output reaches ``direct`` through a :class:`hw.slice.RegisterSlice` (a
    cycle later, two beats more held). Lanes past COLS in each pixel's last vector of a
    product enter the MVM as zero. The reader reads only while its buffer has room for
    the vectors in flight.

    Parameters
    ----------
    config : NpuConfig
        The build; it fixes the widths, ``beats`` and the memories.

    Attributes
    ----------
    instances : ``In(stream.Signature(reader_layout(config)))``
        The instances issued, oldest first (the head of the reader queue); one is taken
        when the reader is free.
    inq : ``In(stream.Signature(vector_layout(config)))``
        The network input queue's head.
    rd : ``Out(read_request_layout(config))``
        The reader's memory read this cycle (when ``rd.en``).
    ivrf_data, vrf_data : ``In(vector_layout(config))``
        Each memory's read data (``vrf_data`` only where the build has VRFs).
    x_stream : ``Out(stream.Signature(vector_layout(config)))``
        Source vectors to the MVM (``Mvm.x_stream``).
    direct : ``Out(stream.Signature(beat_layout(config)))``
        Source beats of chains without a product (the feeder's ``direct``).
    """

    def __init__(self, config: NpuConfig):
        self._config = config
        members = {
            "instances": In(stream.Signature(reader_layout(config))),
            "inq": In(stream.Signature(vector_layout(config))),
            "rd": Out(read_request_layout(config)),
        }
        for key in memory_spaces(config):
            members[f"{key}_data"] = In(vector_layout(config))
        members["x_stream"] = Out(stream.Signature(vector_layout(config)))
        members["direct"] = Out(stream.Signature(beat_layout(config)))
        super().__init__(members)

    def elaborate(self, platform):
        c = self._config
        n = c.n
        beats = c.beats
        vec = vector_layout(c)
        a_bits = c.vector_addr_bits
        m = Module()
        m.submodules.mvm_buf = mb = fifo.SyncFIFO(width=vec.size, depth=4)
        m.submodules.direct_buf = db = fifo.SyncFIFOBuffered(width=beat_layout(c).size,
                                                             depth=c.direct_depth * beats)
        head = self.instances.payload
        r_on = Signal()
        r_k = Signal(count_bits(c))
        r_x = Signal(count_bits(c))
        r_y = Signal(count_bits(c))
        r_row = Signal(a_bits + pitch_bits(c))
        r_pixel = Signal(a_bits + pitch_bits(c))
        r_cfg = Signal(reader_layout(c))
        p_valid = Signal()            # a vector arrives in the buffer next cycle
        p_to_mvm = Signal()
        p_q = Signal(vec)
        # Whether each buffer has room for one more vector, counting the one read last
        # cycle (written this cycle): `fill` is the buffer's level plus that vector, kept
        # as a register (a step adds one, a read from the buffer takes one away), and
        # `room` (fill < depth - 1) is a register of its own, computed from fill's next
        # value. The level's adder, the in-flight term's and the compare were in front of
        # `step`, and with it of the vector memories' read enable and address, the core's
        # critical path (73.2 MHz; docs/notes/2026-11-28-core-timing-closure.md).
        is_netq = r_cfg.space == Space.NETQ
        step = Signal()
        rooms = {}
        for name, buf, to_buf in (("mvm_buf", mb, r_cfg.to_mvm),
                                  ("direct_buf", db, ~r_cfg.to_mvm)):
            fill = Signal(range(buf.depth + 1), name=f"{name}_fill")
            fill_next = Signal.like(fill, name=f"{name}_fill_next")
            room = Signal(init=1, name=f"{name}_room")
            m.d.comb += fill_next.eq(fill + (step & to_buf) - (buf.r_en & buf.r_rdy))
            m.d.sync += [fill.eq(fill_next), room.eq(fill_next < buf.depth - 1)]
            rooms[buf] = room
        m.d.comb += step.eq(r_on & Mux(r_cfg.to_mvm, rooms[mb], rooms[db])
                            & (~is_netq | self.inq.valid))
        vector_step, p_beat = _paces(m, c, step, r_cfg.to_mvm)
        m.d.comb += self.instances.ready.eq(~r_on)
        with m.If(self.instances.valid & self.instances.ready):
            m.d.sync += [r_on.eq(1), r_cfg.eq(head), r_k.eq(0), r_x.eq(0), r_y.eq(0),
                         r_row.eq(head.base), r_pixel.eq(head.base)]
        m.d.comb += self.inq.ready.eq(vector_step & is_netq)
        m.d.sync += [p_valid.eq(step), p_to_mvm.eq(r_cfg.to_mvm),
                     p_q.eq(self.inq.payload)]
        # Each lane's source in the buffer write, registered with the read: a vector
        # memory's read data, the input queue, or none (0: lanes past COLS in each
        # pixel's last vector do not enter the MVM). One-hot, so that a block RAM's
        # output meets an AND-OR instead of multiplexers in series (issue 36, timing).
        spaces = memory_spaces(c)
        p_from_q = Signal(n)
        p_from = {key: Signal(n, name=f"p_from_{key}") for key in spaces}
        for i in range(n):
            keep = ~(r_cfg.to_mvm & (r_k == r_cfg.pix - 1) & (r_cfg.lanes_cols <= i))
            m.d.sync += p_from_q[i].eq(is_netq & keep)
            for key, held_spaces in spaces.items():
                held = 0
                for s in held_spaces:
                    held = held | (r_cfg.space.as_value() == s)
                m.d.sync += p_from[key][i].eq(~is_netq & held & keep)
        # The address and space whatever the step: the memories read only on `rd.en`
        # (and hold their data otherwise), so `step` reaches the read enables alone.
        m.d.comb += [self.rd.en.eq(step & ~is_netq), self.rd.addr.eq(r_pixel + r_k),
                     self.rd.space.eq(r_cfg.space)]
        with m.If(vector_step):
            with m.If(r_k != r_cfg.pix - 1):
                m.d.sync += r_k.eq(r_k + 1)
            with m.Else():
                m.d.sync += r_k.eq(0)
                with m.If(r_x != r_cfg.win_w - 1):
                    m.d.sync += [r_x.eq(r_x + 1), r_pixel.eq(r_pixel + r_cfg.pix)]
                with m.Else():
                    m.d.sync += [r_x.eq(0), r_row.eq(r_row + r_cfg.pitch),
                                 r_pixel.eq(r_row + r_cfg.pitch)]
                    with m.If(r_y != r_cfg.win_h - 1):
                        m.d.sync += r_y.eq(r_y + 1)
                    with m.Else():
                        m.d.sync += r_on.eq(0)
        # Both buffers are written a cycle after the read data arrives, from registers:
        # each vector memory's read data as it came (the fabric's stand-in for the block
        # RAM's output register), the input queue's vector, each lane's source and the
        # beat's index. The vector memories' block RAMs have no output register (5.61 ns
        # from the clock to the data); their data met the lanes' choice (and the beat's)
        # and crossed the die into the direct buffer's block RAM in one cycle, the
        # board's critical path at 65.82 MHz (docs/link-hw.md section 5), and into the
        # MVM buffer's LUT RAM. The MVM buffer is a queue without an output register
        # (its LUT RAM read is combinational), so a product's vector still reaches
        # x_stream three cycles after its step; a direct beat reaches the direct buffer
        # a cycle later than before (Timing.direct_write_register). `fill` counts a vector
        # from its step until the buffer's read, so `room` holds.
        d_mvm = Signal()
        d_direct = Signal()
        d_q = Signal(vec)
        d_from_q = Signal(n)
        m.d.sync += [d_mvm.eq(p_valid & p_to_mvm), d_direct.eq(p_valid & ~p_to_mvm),
                     d_q.eq(p_q), d_from_q.eq(p_from_q)]
        d_beat = p_beat
        if p_beat is not None:
            d_beat = Signal.like(p_beat, name="d_beat")
            m.d.sync += d_beat.eq(p_beat)
        d_data, d_from = {}, {}
        for key in spaces:
            d_data[key] = Signal(vec, name=f"d_{key}_data")
            d_from[key] = Signal(n, name=f"d_from_{key}")
            m.d.sync += [d_data[key].eq(getattr(self, f"{key}_data")),
                         d_from[key].eq(p_from[key])]
        d_vec = Signal(vec)
        for i in range(n):
            lane = Mux(d_from_q[i], d_q[i], 0)
            for key in spaces:
                lane = lane | Mux(d_from[key][i], d_data[key][i], 0)
            m.d.comb += d_vec[i].eq(lane)
        m.d.comb += [mb.w_data.eq(d_vec), mb.w_en.eq(d_mvm),
                     db.w_data.eq(beat_select(c, d_vec.as_value(), d_beat)),
                     db.w_en.eq(d_direct)]
        m.d.comb += [self.x_stream.valid.eq(mb.r_rdy), self.x_stream.payload.eq(mb.r_data),
                     mb.r_en.eq(self.x_stream.ready)]
        # The direct buffer's block RAM has no output register; without the slice its data
        # crossed the die through the feeder into the MFU pipeline in one cycle, the core's
        # critical path (docs/notes/2026-11-28-core-timing-closure.md, section 10).
        m.submodules.direct_slice = ds = RegisterSlice(beat_layout(c))
        m.d.comb += [ds.i_stream.valid.eq(db.r_rdy), ds.i_stream.payload.eq(db.r_data),
                     db.r_en.eq(ds.i_stream.ready)]
        wiring.connect(m, ds.o_stream, wiring.flipped(self.direct))
        return m
