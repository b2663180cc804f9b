"""The issuer: each checked chain as one instance per iteration, to the reader, the
feeder, the writer and (a product's) the MVM, when the iteration's reads are clear of
the writes of the instances in flight (``docs/npu.md``, "Issue").

The front end hands over a chain that passed every check (:func:`checked_chain_layout`: the
addresses of iteration 0 and the increments); the issuer holds it as the current chain
and issues its iterations one a cycle at most, each iteration's addresses advanced by
the increments. An iteration issues when its reads overlap no write range of an
instance in flight (:class:`hw.core.scoreboard.Scoreboard`, which also bounds the
instances in flight to :data:`~hw.core.scoreboard.IN_FLIGHT`) and each of the four
instance queues has room; a chain is taken only when none is current.
"""

from amaranth.hdl import Module, Mux, Signal, Value, unsigned
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import bits_for

from host.spec.config import NpuConfig
from host.spec.formats import Rounding
from host.spec.isa import FIELDS, MAX_WRITES, Space
from host.spec.mfu import mfu_layout
from hw.core.decode import built_vrfs, iteration_bits, vrf_space
from hw.core.feeder import feeder_layout
from hw.core.reader import reader_layout
from hw.core.scoreboard import IN_FLIGHT, Scoreboard, read_count
from hw.core.vectors import checked_config, count_bits, pitch_bits
from hw.core.writer import writer_layout
from hw.mvm.mvm import command_layout
from hw.mvm.tile_engine import TileEngine

__all__ = ["Issuer", "checked_chain_layout", "vrf_base"]


def checked_chain_layout(config: NpuConfig) -> data.StructLayout:
    """A checked chain, handed from the checker to the issuer (addresses of iteration 0):
    the read (``rd_space``, ``rd_addr``, ``rd_inc``), the product (``has_mv``,
    ``mv_slot``, ``mv_inc``) and its window (``pix``, ``win_w``, ``win_h``, ``pitch``,
    ``lanes_cols``, ``cols``: column tiles, ``c_in``, ``extent``: the read's vectors an
    iteration), the sizes (``length``, ``lanes_last``, ``iters``), the quantizer's
    registers (``rounding``, ``static``, ``q_exponent``, ``narrow``), the MFU
    configuration (``mfu``), each VRF's ``vv_used``/``vv_inc`` (the base addresses are in
    ``mfu``, :func:`vrf_base`), the ends of iteration 0's read ranges (``rd_end``:
    ``rd_addr + extent``; ``vv_end``: each VRF's base ``+ length``; summed at the hand-off
    so that the issuer's range compares start from registers), and the writes
    (``w_valid``, ``w_space``, ``w_addr``, ``w_inc``)."""
    a = config.vector_addr_bits
    mfu = config.mfu
    vrfs = 2 * config.mfus
    inc = unsigned(FIELDS["inc"][1])
    return data.StructLayout({
        "rd_space": Space, "rd_addr": unsigned(a), "rd_inc": inc,
        "has_mv": unsigned(1), "mv_slot": unsigned(TileEngine.slot_bits(config.mvm)),
        "mv_inc": inc,
        "pix": unsigned(count_bits(config)), "win_w": unsigned(count_bits(config)),
        "win_h": unsigned(count_bits(config)), "pitch": unsigned(pitch_bits(config)),
        "lanes_cols": unsigned(bits_for(config.n)),
        "cols": unsigned(count_bits(config)), "c_in": unsigned(count_bits(config)),
        "extent": unsigned(a + 1), "rd_end": unsigned(a + 2),
        "length": unsigned(mfu.length_bits), "lanes_last": unsigned(mfu.lanes_bits),
        "iters": unsigned(iteration_bits(config)),
        "rounding": Rounding, "static": unsigned(1), "q_exponent": unsigned(8),
        "narrow": unsigned(7),
        "mfu": data.ArrayLayout(mfu_layout(mfu), config.mfus),
        "vv_used": unsigned(vrfs), "vv_inc": data.ArrayLayout(inc, vrfs),
        "vv_end": data.ArrayLayout(unsigned(mfu.addr_bits + 1), vrfs),
        "w_valid": unsigned(MAX_WRITES),
        "w_space": data.ArrayLayout(Space, MAX_WRITES),
        "w_addr": data.ArrayLayout(unsigned(a), MAX_WRITES),
        "w_inc": data.ArrayLayout(inc, MAX_WRITES),
    })


def vrf_base(mfu, k):
    """VRF ``k``'s base address in an MFU configuration array ``mfu``
    (``ArrayLayout(mfu_layout, mfus)``): the add/sub VRF (even ``k``) or the multiply VRF
    (odd ``k``) of MFU ``k // 2``."""
    f = mfu[k // 2]
    return f.addsub_addr if k % 2 == 0 else f.mul_addr


class Issuer(wiring.Component):
    """Instances of checked chains (module docstring).

    Parameters
    ----------
    config : host.spec.config.NpuConfig

    Ports
    -----
    chains : ``In(stream.Signature(checked_chain_layout(config)))``
        Checked chains; one is taken when no chain is current.
    reader : ``Out(stream.Signature(reader_layout(config)))``
    feeder : ``Out(stream.Signature(feeder_layout(config)))``
    writer : ``Out(stream.Signature(writer_layout(config)))``
        Every instance, to each unit, through a queue of :data:`IN_FLIGHT` each.
    mvm : ``Out(stream.Signature(command_layout(config.mvm)))``
        The product of each instance that has one (the MVM's command).
    idle : ``Out(1)``
        No chain is current and no instance is in flight.

    The writer's ``ready`` (taking the next instance) retires the oldest instance from
    the scoreboard: it has written the last vector of the one before.

    Raises
    ------
    TypeError
        ``config`` is not an :class:`host.spec.config.NpuConfig`.
    """

    def __init__(self, config):
        config = checked_config(self, config)
        self._config = config
        super().__init__({
            "chains": In(stream.Signature(checked_chain_layout(config))),
            "reader": Out(stream.Signature(reader_layout(config))),
            "feeder": Out(stream.Signature(feeder_layout(config))),
            "writer": Out(stream.Signature(writer_layout(config))),
            "mvm": Out(stream.Signature(command_layout(config.mvm))),
            "idle": Out(1),
        })

    @property
    def config(self):
        return self._config

    def elaborate(self, platform):
        m = Module()
        c = self._config
        a_bits = c.vector_addr_bits
        mcfg = c.mfu
        vrfs = 2 * c.mfus
        vrf_built = built_vrfs(c)
        desc = self.chains.payload
        cur = Signal(checked_chain_layout(c))
        cur_valid = Signal()
        left = Signal(iteration_bits(c))
        it_rd = Signal(a_bits)
        it_mv = Signal(TileEngine.slot_bits(c.mvm))
        it_vv = [Signal(mcfg.addr_bits, name=f"it_vv{k}") for k in range(vrfs)]
        it_wr = [Signal(a_bits, name=f"it_wr{k}") for k in range(MAX_WRITES)]

        take = Signal()
        m.d.comb += [self.chains.ready.eq(~cur_valid), take.eq(self.chains.valid & ~cur_valid)]
        with m.If(take):
            m.d.sync += [cur.eq(desc), cur_valid.eq(1), left.eq(desc.iters),
                         it_rd.eq(desc.rd_addr), it_mv.eq(desc.mv_slot)]
            m.d.sync += [it_vv[k].eq(vrf_base(desc.mfu, k)) for k in range(vrfs)]
            m.d.sync += [it_wr[k].eq(desc.w_addr[k]) for k in range(MAX_WRITES)]

        # In-flight instances: their write ranges (hw.core.scoreboard), oldest first.
        m.submodules.scoreboard = sb = Scoreboard(c)
        issue = Signal()
        m.d.comb += [sb.issue.eq(issue), sb.take.eq(take), sb.retire.eq(self.writer.ready)]
        # Next cycle's read ranges, the scoreboard's `reads_next`: after an issue, the next
        # iteration's, kept in registers an iteration ahead of it_rd and it_vv (advanced
        # at each issue); at a take, the taken chain's first, from the hand-off register
        # with its ends summed by the front end. So the compares start from registers
        # (issue 36, timing: an adder before them was the core's critical path). The ends
        # equal the sums wherever a read is compared: a handed-off chain passed the range
        # checks, so no start of its iterations wraps around.
        def advanced(value, inc):
            return (value + inc)[:len(value)]

        rd_next, rd_end_next = Signal(a_bits), Signal(a_bits + 2)
        vv_next = {k: Signal(mcfg.addr_bits, name=f"vv_next{k}") for k in vrf_built}
        vv_end_next = {k: Signal(mcfg.addr_bits + 1, name=f"vv_end_next{k}") for k in vrf_built}
        with m.If(take):
            m.d.sync += [rd_next.eq(advanced(desc.rd_addr, desc.rd_inc)),
                         rd_end_next.eq(advanced(desc.rd_end, desc.rd_inc))]
            m.d.sync += [vv_next[k].eq(advanced(vrf_base(desc.mfu, k), desc.vv_inc[k]))
                         for k in vrf_built]
            m.d.sync += [vv_end_next[k].eq(advanced(desc.vv_end[k], desc.vv_inc[k]))
                         for k in vrf_built]
        # Each read range selects between the two with a copy of `cur_valid` of its own
        # (set and cleared as `cur_valid` is, but from its own value, so that synthesis
        # does not merge the copies): `cur_valid` fans out widely, and its way to the
        # multiplexers was a third of the core's critical path at 74.19 MHz (issue 36).
        sel = [Signal(name=f"reads_cur{k}") for k in range(read_count(c))]
        with m.If(take):
            m.d.sync += [s.eq(1) for s in sel]
        reads_next = [(
            Mux(sel[0], cur.rd_space != Space.NETQ, desc.rd_space != Space.NETQ),
            Mux(sel[0], Value.cast(cur.rd_space), Value.cast(desc.rd_space)),
            Mux(sel[0], rd_next, desc.rd_addr), Mux(sel[0], rd_end_next, desc.rd_end))]
        for s, k in zip(sel[1:], vrf_built, strict=True):
            reads_next.append((
                Mux(s, cur.vv_used[k], desc.vv_used[k]), vrf_space(k),
                Mux(s, vv_next[k], vrf_base(desc.mfu, k)),
                Mux(s, vv_end_next[k], desc.vv_end[k])))
        for port, (on, space, lo, hi) in zip(sb.reads_next, reads_next, strict=True):
            m.d.comb += [port.on.eq(on), port.space.eq(space), port.lo.eq(lo), port.hi.eq(hi)]
        # The current iteration's write ranges; their ends kept beside the starts too.
        it_wr_end = [Signal(a_bits + 1, name=f"it_wr_end{k}") for k in range(MAX_WRITES)]
        with m.If(take):
            m.d.sync += [it_wr_end[k].eq(desc.w_addr[k] + desc.length) for k in range(MAX_WRITES)]
        for k, port in enumerate(sb.issued):
            m.d.comb += [port.on.eq(cur.w_valid[k] & (cur.w_space[k] != Space.NETQ)),
                         port.space.eq(cur.w_space[k]), port.lo.eq(it_wr[k]),
                         port.hi.eq(it_wr_end[k])]

        # The instance queues, one per unit.
        queues = {}
        for name, layout in (("reader", reader_layout(c)), ("feeder", feeder_layout(c)),
                             ("writer", writer_layout(c)), ("mvm", command_layout(c.mvm))):
            q = fifo.SyncFIFOBuffered(width=layout.size, depth=IN_FLIGHT)
            m.submodules[f"{name}_q"] = q
            out = getattr(self, name)
            m.d.comb += [out.valid.eq(q.r_rdy), out.payload.eq(q.r_data),
                         q.r_en.eq(out.ready)]
            queues[name] = (q, data.View(layout, q.w_data))
        (rq, rq_w), (fq, fq_w) = queues["reader"], queues["feeder"]
        (wq, wq_w), (cq, cq_w) = queues["writer"], queues["mvm"]

        m.d.comb += issue.eq(cur_valid & ~sb.conflict & ~sb.full & rq.w_rdy & fq.w_rdy
                             & wq.w_rdy & cq.w_rdy)
        m.d.comb += [
            rq.w_en.eq(issue), fq.w_en.eq(issue), wq.w_en.eq(issue),
            cq.w_en.eq(issue & cur.has_mv),
            rq_w.space.eq(cur.rd_space), rq_w.base.eq(it_rd), rq_w.pix.eq(cur.pix),
            rq_w.win_w.eq(cur.win_w), rq_w.win_h.eq(cur.win_h), rq_w.pitch.eq(cur.pitch),
            rq_w.lanes_cols.eq(cur.lanes_cols), rq_w.to_mvm.eq(cur.has_mv),
            cq_w.base.eq(it_mv), cq_w.row_tiles.eq(cur.length), cq_w.col_tiles.eq(cur.cols),
            cq_w.rounding.eq(cur.rounding), cq_w.static.eq(cur.static),
            cq_w.static_exponent.eq(cur.q_exponent), cq_w.narrow_width.eq(cur.narrow),
            fq_w.to_mvm.eq(cur.has_mv), fq_w.chain.length.eq(cur.length),
            fq_w.chain.lanes_last.eq(cur.lanes_last),
            wq_w.length.eq(cur.length), wq_w.valid.eq(cur.w_valid),
        ]
        for k in range(c.mfus):
            src = cur.mfu[k]
            dst = fq_w.chain.mfu[k]
            m.d.comb += [dst.order.eq(src.order), dst.addsub_op.eq(src.addsub_op),
                         dst.act_op.eq(src.act_op), dst.reduce_op.eq(src.reduce_op),
                         dst.addsub_addr.eq(it_vv[2 * k]), dst.mul_addr.eq(it_vv[2 * k + 1])]
        for k in range(MAX_WRITES):
            m.d.comb += [wq_w.space[k].eq(cur.w_space[k]), wq_w.addr[k].eq(it_wr[k])]
        with m.If(issue):
            m.d.sync += [it_rd.eq(rd_next), it_mv.eq(it_mv + cur.mv_inc), left.eq(left - 1)]
            m.d.sync += [it_vv[k].eq(advanced(it_vv[k], cur.vv_inc[k])) for k in range(vrfs)]
            m.d.sync += [rd_next.eq(advanced(rd_next, cur.rd_inc)),
                         rd_end_next.eq(advanced(rd_end_next, cur.rd_inc))]
            m.d.sync += [vv_next[k].eq(advanced(vv_next[k], cur.vv_inc[k])) for k in vrf_built]
            m.d.sync += [vv_end_next[k].eq(advanced(vv_end_next[k], cur.vv_inc[k]))
                         for k in vrf_built]
            m.d.sync += [it_wr[k].eq(it_wr[k] + cur.w_inc[k]) for k in range(MAX_WRITES)]
            m.d.sync += [it_wr_end[k].eq(advanced(it_wr_end[k], cur.w_inc[k]))
                         for k in range(MAX_WRITES)]
            with m.If(left == 1):
                m.d.sync += [cur_valid.eq(0), *(s.eq(0) for s in sel)]

        m.d.comb += self.idle.eq(~cur_valid & sb.empty)
        return m
