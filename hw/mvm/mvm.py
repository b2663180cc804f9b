"""The matrix-vector multiplier (MVM): vector quantizer, T tile engines holding the matrix
register file (MRF), BFP-long accumulation and FP16 output conversion.

``docs/mvm.md`` describes the architecture, the ports, where a logical matrix lives in the
MRF, the pipeline and its cycle counts; ``docs/numerics.md`` the arithmetic, which
:func:`host.numerics.mvm.mvm` models bit for bit.

:class:`Mvm` connects the blocks of ``docs/mvm.md`` section 1, each a component:
:class:`~hw.mvm.command.CommandChecker`, :class:`~hw.mvm.loader.Loader`,
:class:`~hw.mvm.quantizer.VectorQuantizer`, :class:`~hw.mvm.sequencer.VectorWriter`,
:class:`~hw.mvm.sequencer.Sequencer`, :class:`~hw.mvm.tile_engine.TileEngine`,
:class:`~hw.mvm.accumulator.BfpAccumulator`, :class:`~hw.mvm.convert.FixedToFp16`,
:class:`~hw.mvm.mrf_access.MrfWriter` and :class:`~hw.mvm.mrf_access.MrfReadback`, with
the FIFOs between them; it keeps the event counters, ``error`` and ``busy``.
"""

from amaranth.hdl import Cat, Module, Mux, Signal, unsigned
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from host.spec.config import MvmConfig
from host.spec.formats import FP16_BITS, block_layout

from hw.mvm.accumulator import BfpAccumulator
from hw.mvm.command import STAGES as _VALIDATE_STAGES
from hw.mvm.command import CommandChecker
from hw.mvm.convert import LATENCY as CONVERTER_LATENCY
from hw.mvm.convert import FixedToFp16
from hw.mvm.layouts import (
    command_layout, mrf_address_layout, mrf_word_layout, params_layout, tag_layout,
    weight_row_layout,
)
from hw.mvm.loader import INPUT_STAGES as _X_STAGES
from hw.mvm.loader import TAG_DEPTH as _VTAG_DEPTH
from hw.mvm.loader import Loader
from hw.mvm.mrf_access import MrfReadback, MrfWriter
from hw.mvm.quantizer import LATENCY as QUANTIZER_LATENCY
from hw.mvm.quantizer import VectorQuantizer
from hw.mvm.sequencer import Sequencer, VectorWriter
from hw.mvm.tile_engine import TileEngine, check_dsp_options, popcount

__all__ = [
    "Mvm", "command_layout", "weight_row_layout", "mrf_word_layout", "mrf_address_layout",
    "latency", "compute_latency", "output_fifo_depth",
]


#: Depth of the FIFO of MRF addresses beside the matrix quantizer: its rows in flight
#: (one more for the input register a shared quantizer's rows pass, see Mvm).
_WSIDE_DEPTH = 1 << ceil_log2(QUANTIZER_LATENCY + 2)
#: Commands accepted by the loader and not yet started by the sequencer.
_PARAMS_DEPTH = 8


def compute_latency(config: MvmConfig) -> int:
    """Cycles from a group's MRF read to its row block entering the output FIFO: MRF read
    and output register, dot-product engine, accumulator, FP16 converter."""
    return (TileEngine.dot_latency_of(config) + BfpAccumulator.result_latency_of(config)
            + CONVERTER_LATENCY)


def output_fifo_depth(config: MvmConfig) -> int:
    """Row blocks the output FIFO holds: room for every row block in flight at one per
    cycle, so that without back-pressure the sequencer never waits for credit."""
    return 1 << ceil_log2(compute_latency(config) + 4)


def latency(config: MvmConfig) -> int:
    """``LATENCY`` in ``cycles = C + R*G + LATENCY`` (``docs/mvm.md`` has the trace).

    Counting edges from the one that takes the command: the command check
    (``_VALIDATE_STAGES``), then the loader takes it and the C vectors are taken from
    ``x_stream`` into the input register on the next C edges and enter the vector
    quantizer ``_X_STAGES`` edges later; each block enters the block FIFO
    ``QUANTIZER_LATENCY`` edges after its vector entered and is written into the vector
    buffer on the next edge, and the edge that writes the last one marks the half full;
    one edge later the sequencer starts, and its R*G group reads follow on the next R*G
    edges; each row block then needs ``compute_latency`` edges to enter the output FIFO
    and 2 more (FIFO write, buffered read register) to leave on ``y_stream``.
    """
    return (_VALIDATE_STAGES + _X_STAGES + QUANTIZER_LATENCY + 2 + compute_latency(config)
            + 2)


class Mvm(wiring.Component):
    """Matrix-vector multiplier: ``y = W x`` with BFP weights held on chip.

    A command (``cmd``) names a matrix of R x C native tiles stored in the MRF from slot
    ``base`` on; the MVM takes the C native FP16 vectors of ``x`` from ``x_stream``,
    quantizes them to BFP (``m_v``-bit mantissas), multiplies them with the BFP weights
    (``m_w``), accumulates each output row exactly in a BFP-long accumulator and sends R
    native FP16 vectors of ``y`` on ``y_stream``. Results, counters and errors are those
    of :func:`host.numerics.mvm.mvm`, bit for bit, for any number of tile engines.

    Parameters
    ----------
    config : MvmConfig
        The build parameters; every width derives from it.
    dsp_lanes : int, 0..n, default 0
        Products of each dot-product engine formed on the ECP5's MULT18X18D blocks when
        the MVM is elaborated for an ECP5 (``T * N * dsp_lanes`` of them, lanes
        ``0 .. dsp_lanes - 1`` of every engine; :class:`hw.mvm.tile_engine.DotProductEngine`).
        A mapping choice only: no result, cycle or port changes, and without an ECP5 it
        has no effect.
    dsp_packing : int, 1 or 2, default 1
        Products per MULT18X18D: with 2, lane ``j`` of dot-product engines ``2i`` and
        ``2i + 1`` share one DSP (``T * N * dsp_lanes / 2`` of them;
        :func:`hw.arith.dsp.registered_product_pair`). Needs ``m_v + 2 m_w + 1 <= 18``.

    Attributes
    ----------
    cmd : ``In(stream.Signature(command_layout(config)))``
        Commands; a bad one (``docs/mvm.md``) sets ``error`` and is dropped.
    x_stream : ``In(stream.Signature(ArrayLayout(unsigned(16), n)))``
        The input native vectors of the commands, in order, C per command.
    y_stream : ``Out(stream.Signature(ArrayLayout(unsigned(16), n)))``
        The output native vectors, R per command, FP16.
    w_stream : ``In(stream.Signature(weight_row_layout(config)))``
        FP16 tile rows quantized on chip (matrix quantizer, ``m_w``) into the MRF.
    mrf_w : ``In(stream.Signature(mrf_word_layout(config)))``
        Packed BFP words (``host.numerics.bfp.pack`` of a tile row) written into the MRF as
        they are.
    mrf_r_req : ``In(stream.Signature(mrf_address_layout(config)))``,
    mrf_r_resp : ``Out(stream.Signature(block_layout(n, m_w)))``
        MRF read-back.
    vector_saturations, vector_nonfinite, weight_saturations, weight_nonfinite,
    narrow_events, output_saturations : ``Out(counter_bits)``
        Saturating event counters (``docs/numerics.md`` section 5). In a build without
        the narrow check (``config.narrow_check`` False) ``narrow_events`` is always 0;
        commands still carry ``narrow_width`` and one outside 1..64 is still rejected.
    clear : ``In(1)``
        Zeroes every counter (wins over events in the same cycle).
    error : ``Out(1)``
        Sticky: a command or an MRF word was rejected.
    error_clear : ``In(1)``
        Clears ``error`` (an error detected in the same cycle wins).
    busy : ``Out(1)``
        A command, an MRF access or a result is in progress (``docs/mvm.md``).
    config : MvmConfig
    latency : int
        ``LATENCY`` of the cycle formula in ``docs/mvm.md``.
    shared_quantizer : bool
        ``m_v == m_w``: one quantizer takes both the vectors and the weight rows of
        ``w_stream`` (which then pass the vectors' input register, one edge more on
        their way into the MRF). Nothing else changes: the two never meet in it.

    Raises
    ------
    TypeError
        ``config`` is not an :class:`~host.spec.config.MvmConfig`; ``dsp_lanes`` or
        ``dsp_packing`` is not an integer.
    ValueError
        ``dsp_lanes`` is not from 0 to ``config.n``; ``dsp_packing`` is not 1 or 2, or 2
        with mantissa widths that do not fit (the message names them).
    """

    def __init__(self, config, *, dsp_lanes=0, dsp_packing=1):
        if not isinstance(config, MvmConfig):
            raise TypeError(f"config must be an MvmConfig, not {config!r}")
        self._config = c = config
        self._dsp_lanes, self._dsp_packing = check_dsp_options(c, dsp_lanes, dsp_packing)
        cb = c.counter_bits
        super().__init__({
            "cmd": In(stream.Signature(command_layout(c))),
            "x_stream": In(stream.Signature(data.ArrayLayout(unsigned(FP16_BITS), c.n))),
            "y_stream": Out(stream.Signature(data.ArrayLayout(unsigned(FP16_BITS), c.n))),
            "w_stream": In(stream.Signature(weight_row_layout(c))),
            "mrf_w": In(stream.Signature(mrf_word_layout(c))),
            "mrf_r_req": In(stream.Signature(mrf_address_layout(c))),
            "mrf_r_resp": Out(stream.Signature(block_layout(c.n, c.mantissa_bits_w))),
            "vector_saturations": Out(cb),
            "vector_nonfinite": Out(cb),
            "weight_saturations": Out(cb),
            "weight_nonfinite": Out(cb),
            "narrow_events": Out(cb),
            "output_saturations": Out(cb),
            "clear": In(1),
            "error": Out(1),
            "error_clear": In(1),
            "busy": Out(1),
        })

    @property
    def config(self):
        """The build parameters."""
        return self._config

    @property
    def dsp_lanes(self):
        """Products per dot-product engine on DSP blocks when elaborated for an ECP5."""
        return self._dsp_lanes

    @property
    def dsp_packing(self):
        """Products per DSP block (1 or 2)."""
        return self._dsp_packing

    @property
    def shared_quantizer(self):
        """One quantizer for vectors and weight rows (``m_v == m_w``)."""
        return self._config.mantissa_bits_v == self._config.mantissa_bits_w

    # --- pipeline geometry (docs/mvm.md) ------------------------------------------------

    @property
    def compute_latency(self):
        """See :func:`compute_latency`."""
        return compute_latency(self._config)

    @property
    def output_fifo_depth(self):
        """See :func:`output_fifo_depth`."""
        return output_fifo_depth(self._config)

    @property
    def latency(self):
        """See :func:`latency`."""
        return latency(self._config)

    def elaborate(self, platform):
        m = Module()
        c = self._config
        n, tiles = c.n, c.tiles
        cb = c.counter_bits
        narrow_check = c.narrow_check
        depth = output_fifo_depth(c)

        # --- the datapath units ------------------------------------------------------
        # One quantizer for the vectors and the weight rows when their mantissa widths
        # agree (source 0: vectors, 1: weight rows). The two never meet in it: MRF
        # writes are open only while no command is in the MVM (MrfWriter.writes_open),
        # and a command starts only once no row is in flight (io_busy). docs/mvm.md
        # section 5.
        shared = self.shared_quantizer
        if shared:
            m.submodules.quantizer = vq = wq = VectorQuantizer(
                n=n, mantissa_bits=c.mantissa_bits_v, counter_bits=cb, sources=2)
            counters = (vq.saturations[0], vq.nonfinite[0],
                        vq.saturations[1], vq.nonfinite[1])
            v_out = vq.o_stream.valid & ~vq.o_source
            w_out = vq.o_stream.valid & vq.o_source
        else:
            m.submodules.vector_quantizer = vq = VectorQuantizer(
                n=n, mantissa_bits=c.mantissa_bits_v, counter_bits=cb)
            m.submodules.matrix_quantizer = wq = VectorQuantizer(
                n=n, mantissa_bits=c.mantissa_bits_w, counter_bits=cb)
            counters = (vq.saturations, vq.nonfinite, wq.saturations, wq.nonfinite)
            v_out, w_out = vq.o_stream.valid, wq.o_stream.valid
        engines = []
        for t in range(tiles):
            e = TileEngine(c, dsp_lanes=self._dsp_lanes, dsp_packing=self._dsp_packing)
            m.submodules[f"engine{t}"] = e
            engines.append(e)
        m.submodules.accumulator = acc = BfpAccumulator(c)
        m.submodules.converter = conv = FixedToFp16(
            lanes=n, width=c.acc_bits, lsb=c.acc_lsb)

        # --- the control components and the FIFOs between them ----------------------
        m.submodules.cmd_check = check = CommandChecker(c)
        m.submodules.loader = loader = Loader(c, shared=shared)
        m.submodules.writer = writer = VectorWriter(c)
        m.submodules.sequencer = seq = Sequencer(c, credits=depth)
        m.submodules.mrf_writer = mrf_writer = MrfWriter(c, shared=shared)
        m.submodules.readback = readback = MrfReadback(c)
        m.submodules.output_fifo = ofifo = fifo.SyncFIFOBuffered(width=n * FP16_BITS,
                                                                 depth=depth)
        addr_layout = mrf_address_layout(c)
        m.submodules.weight_side = wside = fifo.SyncFIFO(width=addr_layout.size,
                                                         depth=_WSIDE_DEPTH)
        m.submodules.vector_tags = vtags = fifo.SyncFIFO(width=tag_layout(c).size,
                                                         depth=_VTAG_DEPTH)
        m.submodules.command_params = cparams = fifo.SyncFIFO(
            width=params_layout(c).size, depth=_PARAMS_DEPTH)
        # The vector quantizer runs free (its output is always taken): blocks wait for
        # their half in this FIFO after it, not in its pipeline (docs/mvm.md section 5).
        m.submodules.vector_blocks = vblocks = fifo.SyncFIFO(
            width=vq.o_stream.payload.shape().size, depth=_VTAG_DEPTH)

        cmd_busy = Signal()     # a command is between acceptance and its last MRF read
        io_busy = Signal()      # an MRF write or read-back is in flight

        # Command check -> loader -> (params FIFO) -> sequencer.
        wiring.connect(m, wiring.flipped(self.cmd), check.cmd)
        wiring.connect(m, check.o_stream, loader.cmd)
        wiring.connect(m, wiring.flipped(self.x_stream), loader.x_stream)
        m.d.comb += [
            check.hold.eq(io_busy),
            cparams.w_en.eq(loader.params_w_en),
            cparams.w_data.eq(loader.params_w_data),
            loader.params_w_rdy.eq(cparams.w_rdy),
            seq.params_r_rdy.eq(cparams.r_rdy),
            seq.params_r_data.eq(cparams.r_data),
            cparams.r_en.eq(seq.params_r_en),
        ]

        # Loader -> input register -> quantizer -> block FIFO -> writer -> vector
        # buffer; the tags travel beside, through the tag FIFO.
        m.d.comb += [
            vtags.w_en.eq(loader.tag_w_en),
            vtags.w_data.eq(loader.tag_w_data),
            loader.tag_level.eq(vtags.level),
            vq.i_stream.valid.eq(loader.q_valid),
            vq.i_stream.payload.eq(loader.q_payload),
            vq.rounding.eq(loader.q_rounding),
            vq.static.eq(loader.q_static),
            vq.static_exponent.eq(loader.q_static_exponent),
            vq.o_stream.ready.eq(1),
            vblocks.w_en.eq(v_out),
            vblocks.w_data.eq(vq.o_stream.payload),
            writer.block_r_rdy.eq(vblocks.r_rdy),
            writer.block_r_data.eq(vblocks.r_data),
            vblocks.r_en.eq(writer.block_r_en),
            writer.tag.eq(vtags.r_data),
            vtags.r_en.eq(writer.tag_r_en),
            writer.release.eq(seq.release),
            seq.full.eq(writer.full),
        ]
        if shared:
            m.d.comb += [
                vq.source.eq(loader.q_source),
                loader.w_row.eq(self.w_stream.payload),
                loader.w_taken.eq(mrf_writer.row_taken),
                loader.weight_mode_src.eq(mrf_writer.cmd_busy_r),
            ]
        else:
            m.d.comb += [
                wq.i_stream.valid.eq(mrf_writer.row_taken),
                wq.i_stream.payload.eq(self.w_stream.payload.values),
                wq.rounding.eq(self.w_stream.payload.rounding),
                wq.static.eq(self.w_stream.payload.static),
                wq.static_exponent.eq(self.w_stream.payload.static_exponent),
            ]

        # MRF writes (w_stream through the matrix quantizer, mrf_w) and read-back.
        wiring.connect(m, wiring.flipped(self.w_stream), mrf_writer.w_stream)
        wiring.connect(m, wiring.flipped(self.mrf_w), mrf_writer.mrf_w)
        wiring.connect(m, wiring.flipped(self.mrf_r_req), readback.req)
        wiring.connect(m, readback.resp, wiring.flipped(self.mrf_r_resp))
        m.d.comb += [
            mrf_writer.cmd_busy.eq(cmd_busy),
            mrf_writer.cmd_first_stage.eq(check.first_stage),
            mrf_writer.cmd_offered.eq(self.cmd.valid),
            mrf_writer.readback_busy.eq(readback.busy),
            wside.w_en.eq(mrf_writer.side_w_en),
            wside.w_data.eq(mrf_writer.side_w_data),
            mrf_writer.side_w_rdy.eq(wside.w_rdy),
            wside.r_en.eq(mrf_writer.side_r_en),
            mrf_writer.side_r_data.eq(wside.r_data),
            wq.o_stream.ready.eq(1),
            mrf_writer.q_valid.eq(w_out),
            mrf_writer.q_block.eq(wq.o_stream.payload),
            readback.writes_open.eq(mrf_writer.writes_open),
            readback.io_busy.eq(io_busy),
            readback.writes_offered.eq(self.w_stream.valid | self.mrf_w.valid),
        ]

        # The tile engines: MRF and vector-buffer ports, read by the sequencer (or the
        # read-back while it is idle), written by the writers.
        for t, e in enumerate(engines):
            m.d.comb += [
                e.rd_addr.eq(Mux(seq.reading, seq.slot, readback.slot)),
                e.vrd_addr.eq(seq.vrd_addr),
                e.enable.eq(seq.enable[t]),
                e.rb_clear.eq(readback.rb_clear[t]),
                readback.words[t].eq(e.rb_word),
                e.wr_addr.eq(mrf_writer.wr_addr),
                e.wr_data.eq(mrf_writer.wr_data),
                e.wr_rows.eq(mrf_writer.wr_rows[t]),
                e.vwr_addr.eq(writer.vwr_addr),
                e.vwr_data.eq(writer.vwr_data),
                e.vwr_en.eq(writer.vwr_en[t]),
                acc.dot[t].eq(e.dot),
                acc.shift[t].eq(e.shift),
            ]
            if narrow_check:
                m.d.comb += e.therm.eq(seq.therm)

        # Accumulator (the group's side information from the sequencer, delayed there
        # to meet its tile products) -> converter -> output FIFO -> y_stream.
        m.d.comb += [
            acc.valid.eq(seq.group.valid),
            acc.first.eq(seq.group.first),
            acc.last.eq(seq.group.last),
            acc.engines.eq(seq.group.engines),
            conv.i_stream.valid.eq(acc.result_valid),
            conv.i_stream.payload.eq(acc.result),
            # Room is reserved for every row block before its last group is read, so the
            # FIFO always has space here: the converter runs free. Its ready taken from
            # the FIFO's level would be the one enable of all its registers (thousands of
            # flip-flops, two LUT levels behind the FIFO's level register), a net that
            # spans the converter, as the vector quantizer's did (docs/mvm.md section 11).
            conv.o_stream.ready.eq(1),
            ofifo.w_en.eq(conv.o_stream.valid),
            ofifo.w_data.eq(conv.o_stream.payload.bits),
            self.y_stream.valid.eq(ofifo.r_rdy),
            self.y_stream.payload.eq(ofifo.r_data),
            ofifo.r_en.eq(self.y_stream.ready),
            seq.out_taken.eq(self.y_stream.valid & self.y_stream.ready),
        ]
        if narrow_check:
            m.d.comb += acc.k.eq(seq.group.k)

        # --- counters, error, busy ---------------------------------------------------
        m.d.comb += [vq.clear.eq(self.clear), wq.clear.eq(self.clear)]
        m.d.comb += [
            self.vector_saturations.eq(counters[0]),
            self.vector_nonfinite.eq(counters[1]),
            self.weight_saturations.eq(counters[2]),
            self.weight_nonfinite.eq(counters[3]),
        ]
        if narrow_check:
            narrow_total = Signal(range(tiles * n * (2 * n - 1) + n * tiles + 1),
                                  name="narrow_total")
            m.d.sync += narrow_total.eq(sum(e.narrow for e in engines) + acc.narrow)
            _saturating(m, self.narrow_events, narrow_total, self.clear)
        # else: no counter; narrow_events is never driven and reads 0.
        conv_taken = conv.o_stream.valid & conv.o_stream.ready
        # The popcount is registered before the add: in one cycle, the converter's flags
        # (placed beside its lanes), their popcount and the counter's add were the routed
        # critical path of a one-engine build (docs/mvm.md section 11). The count trails
        # its row block by one edge, and `busy` stays up while a count is pending.
        out_sat = Signal(range(n + 1), name="output_saturation_count", reset_less=True)
        m.d.sync += out_sat.eq(Mux(conv_taken, popcount(conv.o_stream.payload.overflow), 0))
        _saturating(m, self.output_saturations, out_sat, self.clear)

        # Each error condition is registered before the sticky flag takes it: they come
        # from checks spread over the MVM (command, MRF write, read-back), and their
        # OR, with error_clear, into one flip-flop was a routed path of over 10 ns.
        # `error` rises one edge later; `busy` waits for it.
        error_set = [check.error, mrf_writer.error, readback.error]
        error_pending = Signal(len(error_set), name="error_pending")
        m.d.sync += error_pending.eq(Cat(*error_set))
        with m.If(error_pending.any()):
            m.d.sync += self.error.eq(1)
        with m.Elif(self.error_clear):
            m.d.sync += self.error.eq(0)

        # Counts trail the data: keep `busy` up until the last group's events are in.
        count_tail = max(TileEngine.narrow_latency_of(c),
                         TileEngine.dot_latency_of(c) + acc.narrow_latency) + 2
        history = Signal(count_tail, name="count_history")
        m.d.sync += history.eq(Cat(seq.fire, history[:-1]))
        m.d.comb += [
            cmd_busy.eq(check.busy | loader.busy | vtags.r_rdy | writer.full.any()
                        | seq.reading | cparams.r_rdy),
            io_busy.eq(wside.r_rdy | mrf_writer.busy | readback.busy),
            self.busy.eq(cmd_busy | io_busy | (seq.reserved != 0) | history.any()
                         | (out_sat != 0) | error_pending.any() | self.mrf_r_resp.valid),
        ]
        return m


def _saturating(m, counter, increment, clear):
    """Drive ``counter`` (a saturating event counter, all ones at most) from the
    ``increment`` of each cycle; ``clear`` zeroes it and wins over the increment."""
    cb = len(counter)
    total = Signal(cb + 1 + len(increment), name=f"{counter.name}_next")
    m.d.comb += total.eq(counter + increment)
    with m.If(clear):
        m.d.sync += counter.eq(0)
    with m.Else():
        # All ones is the top: the sum is past it iff a bit above it is set.
        m.d.sync += counter.eq(Mux(total[cb:].any(), (1 << cb) - 1, total))
