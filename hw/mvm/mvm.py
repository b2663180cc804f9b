"""The matrix-vector multiplier (MVM): vector quantizer, T tile engines holding the matrix
register file (MRF), BFP-long accumulation and FP16 output conversion.

``docs/mvm.md`` describes the architecture, the ports, where a logical matrix lives in the
MRF, the pipeline and its cycle counts; ``docs/numerics.md`` the arithmetic, which
:func:`host.numerics.mvm.mvm` models bit for bit.
"""

from amaranth.hdl import Cat, Const, Module, Mux, Signal, unsigned
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import bits_for, ceil_log2

from host.spec.config import MvmConfig
from host.spec.formats import (
    FP16_BITS, MAX_EXPONENT_CODE, NARROW_WIDTH_MAX, Rounding, block_layout,
)

from hw.mvm.convert import LATENCY as CONVERTER_LATENCY
from hw.mvm.convert import FixedToFp16
from hw.mvm.accumulator import BfpAccumulator
from hw.mvm.quantizer import LATENCY as QUANTIZER_LATENCY
from hw.mvm.quantizer import VectorQuantizer
from hw.arith.dsp import DSP_WIDTH, has_ecp5_dsp, registered_product
from hw.mvm.tile_engine import (
    NARROW_WIDTH_BITS, TileEngine, check_dsp_options, fit_thermometer, or_all, popcount,
)

__all__ = [
    "Mvm", "command_layout", "weight_row_layout", "mrf_word_layout", "mrf_address_layout",
    "latency", "compute_latency", "output_fifo_depth",
]


#: Stages of the command check (field checks and G; R*G; slot range; the decision).
_VALIDATE_STAGES = 4
#: Register stages in front of the vector quantizer (the vector's input register).
_X_STAGES = 1
#: Depth of the FIFO that carries the buffer places of vector blocks beside the vector
#: quantizer. A tag is written when its vector is in the input register (one edge after
#: it is taken from x_stream) and read when its block is written into the buffer; x_stream
#: is ready only while the FIFO has room for the tag of the vector in the input register
#: as well, so the tags also bound the blocks in the input register, the quantizer and
#: the block FIFO after it, which therefore never overflows. Room for
#: every block in flight at one per cycle (x_stream taken to buffer write is
#: _X_STAGES + QUANTIZER_LATENCY + 2 edges), so that it never throttles a stream.
_VTAG_DEPTH = 1 << ceil_log2(_X_STAGES + QUANTIZER_LATENCY + 2)
#: Depth of the FIFO of MRF addresses beside the matrix quantizer: its rows in flight
#: (one more for the input register a shared quantizer's rows pass, see Mvm).
_WSIDE_DEPTH = 1 << ceil_log2(QUANTIZER_LATENCY + 2)
#: Commands accepted by the loader and not yet started by the sequencer.
_PARAMS_DEPTH = 8


def _engine_bits(config):
    return max(1, ceil_log2(config.tiles))


def mrf_address_layout(config: MvmConfig) -> data.StructLayout:
    """``{engine, row, slot}``: one MRF word, that is row ``row`` (dot-product engine) of
    tile slot ``slot`` in tile engine ``engine``."""
    return data.StructLayout({
        "engine": unsigned(_engine_bits(config)),
        "row": unsigned(config.log2_n),
        "slot": unsigned(TileEngine.slot_bits(config)),
    })


def mrf_word_layout(config: MvmConfig) -> data.StructLayout:
    """``mrf_w`` payload: an MRF address and the packed block to store there."""
    return data.StructLayout({
        "engine": unsigned(_engine_bits(config)),
        "row": unsigned(config.log2_n),
        "slot": unsigned(TileEngine.slot_bits(config)),
        "block": block_layout(config.n, config.mantissa_bits_w),
    })


def weight_row_layout(config: MvmConfig) -> data.StructLayout:
    """``w_stream`` payload: an MRF address, one FP16 tile row and how to quantize it."""
    return data.StructLayout({
        "engine": unsigned(_engine_bits(config)),
        "row": unsigned(config.log2_n),
        "slot": unsigned(TileEngine.slot_bits(config)),
        "values": data.ArrayLayout(unsigned(FP16_BITS), config.n),
        "rounding": Rounding,
        "static": unsigned(1),
        "static_exponent": unsigned(8),
    })


def command_layout(config: MvmConfig) -> data.StructLayout:
    """``cmd`` payload: one matrix-vector product.

    ``base``: first tile slot; ``row_tiles`` R and ``col_tiles`` C: the matrix is R x C
    native tiles, placed as :meth:`host.spec.config.MvmConfig.tile_slot` says; ``rounding``,
    ``static``, ``static_exponent``: how the C input vectors are quantized;
    ``narrow_width``: ``k`` of the narrow-accumulator check, 1..64.
    """
    return data.StructLayout({
        "base": unsigned(TileEngine.slot_bits(config)),
        "row_tiles": unsigned(bits_for(config.mrf_depth)),
        "col_tiles": unsigned(bits_for(config.max_col_tiles)),
        "rounding": Rounding,
        "static": unsigned(1),
        "static_exponent": unsigned(8),
        "narrow_width": unsigned(NARROW_WIDTH_BITS),
    })


def _group_divider(config, c_bits):
    """``(mul, shift)`` with ``(x * mul) >> shift == x // T`` for every ``x`` that
    ``C + T - 1`` can take: G = ceil(C/T) without a divider."""
    t = config.tiles
    x_max = (1 << c_bits) - 1 + t - 1
    for shift in range(64):
        mul = -(-(1 << shift) // t)
        if all((x * mul) >> shift == x // t for x in range(x_max + 1)):
            return mul, shift
    raise AssertionError("no reciprocal found")  # pragma: no cover


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
        Packed BFP words (``host.numerics.bfp.pack`` of a tile row) written into the MRF as they are.
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
        cmax = (1 << cb) - 1

        # ================================================================================
        # Sub-units
        # ================================================================================
        # One quantizer for the vectors and the weight rows when their mantissa widths
        # agree (source 0: vectors, 1: weight rows). The two never meet in it: MRF
        # writes are open only while no command is in the MVM (writes_open), and a
        # command starts only once no row is in flight (io_busy). docs/mvm.md section 5.
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
        depth = output_fifo_depth(c)
        m.submodules.output_fifo = ofifo = fifo.SyncFIFOBuffered(width=n * FP16_BITS,
                                                                 depth=depth)
        addr_layout = mrf_address_layout(c)
        m.submodules.weight_side = wside = fifo.SyncFIFO(width=addr_layout.size,
                                                         depth=_WSIDE_DEPTH)

        m.d.comb += [vq.clear.eq(self.clear), wq.clear.eq(self.clear)]
        m.d.comb += [
            self.vector_saturations.eq(counters[0]),
            self.vector_nonfinite.eq(counters[1]),
            self.weight_saturations.eq(counters[2]),
            self.weight_nonfinite.eq(counters[3]),
        ]

        error_set = []                       # conditions that set the sticky error

        # ================================================================================
        # Busy terms, defined up front and driven below
        # ================================================================================
        cmd_busy = Signal()     # a command is between acceptance and its last MRF read
        io_busy = Signal()      # an MRF write or read-back is in flight

        # ================================================================================
        # Command check: V1 (fields, G), V2 (R*G, last group), V3 (slot range), V4 (the
        # loader takes it, or it is dropped). Every check result is registered before V4,
        # whose one decision loads the loader's registers: the check's carry chains in
        # front of that fan-out were a routed path of 12.5 ns (docs/mvm.md section 11).
        # ================================================================================
        cl = command_layout(c)
        c_bits = cl.members["col_tiles"].width
        mul, shift = _group_divider(c, c_bits)
        v1 = Signal(name="cmd_v1")
        v2 = Signal(name="cmd_v2")
        v3 = Signal(name="cmd_v3")
        v4 = Signal(name="cmd_v4")
        f1 = Signal(cl, name="cmd_f1")
        f2 = Signal(cl, name="cmd_f2")
        f3 = Signal(cl, name="cmd_f3")
        f4 = Signal(cl, name="cmd_f4")
        gmax = c.col_groups_max
        r_max = (1 << cl.members["row_tiles"].width) - 1
        g2 = Signal(range(gmax + 1), name="cmd_groups_v2")
        g3 = Signal(range(gmax + 1), name="cmd_groups_v3")
        g4 = Signal(range(gmax + 1), name="cmd_groups_v4")
        err2 = Signal(name="cmd_err_v2")
        err3 = Signal(name="cmd_err_v3")
        err4 = Signal(name="cmd_err_v4")
        therm2 = Signal(c.dot_bits - 1, name="cmd_therm_v2")
        therm3 = Signal(c.dot_bits - 1, name="cmd_therm_v3")
        therm4 = Signal(c.dot_bits - 1, name="cmd_therm_v4")
        rg_shape = range(r_max * gmax + 1)
        rg4 = Signal(rg_shape, name="cmd_slots_v4")
        lastmask3 = Signal(tiles, name="cmd_lastmask_v3")
        lastmask4 = Signal(tiles, name="cmd_lastmask_v4")

        loader_free = Signal()
        v4_go = Signal()
        advance_v = Signal()
        m.d.comb += [
            advance_v.eq(~v4 | v4_go),
            # A command waits for MRF writes and reads already accepted; MRF writes and
            # reads wait while a command is offered (so the command is not starved).
            self.cmd.ready.eq(advance_v & ~io_busy),
        ]
        with m.If(advance_v):
            m.d.sync += [
                v1.eq(self.cmd.valid & ~io_busy),
                f1.eq(self.cmd.payload),
                v2.eq(v1), f2.eq(f1),
                v3.eq(v2), f3.eq(f2),
                v4.eq(v3), f4.eq(f3),
            ]
        # V1: field checks, G = ceil(C / T), the narrow-width thermometer.
        cc, rr, kk = f1.col_tiles, f1.row_tiles, f1.narrow_width
        bad_fields = ((cc == 0) | (cc > c.max_col_tiles) | (rr == 0)
                      | (kk == 0) | (kk > NARROW_WIDTH_MAX)
                      | (f1.static & (f1.static_exponent > MAX_EXPONENT_CODE)))
        groups = (((cc + (tiles - 1)) * mul) >> shift)[:g2.shape().width]
        # The narrow width k is checked on every build (the command field exists and a
        # bad one is an error either way); the thermometer is made only with the check.
        narrow_check = c.narrow_check
        with m.If(advance_v):
            m.d.sync += [err2.eq(bad_fields), g2.eq(groups)]
            if narrow_check:
                m.d.sync += therm2.eq(fit_thermometer(kk, c.dot_bits - 1))
        # V2: R*G slots (registered twice: V3 and V4), and which engines the last group
        # uses (C - (G-1)*T of them). On an ECP5 the product is a MULT18X18D with its own
        # registers (they stand for R and G in V2 and for R*G in V3); used without them
        # it was a routed path of 11 ns.
        last_count = f2.col_tiles - (g2 - 1) * tiles
        rg3 = Signal(rg_shape, name="cmd_slots_v3")
        room3 = Signal(range(c.mrf_depth + 1), name="cmd_room_v3")
        if has_ecp5_dsp(platform) and rr.shape().width <= DSP_WIDTH \
                and groups.shape().width <= DSP_WIDTH:
            product = registered_product(m, rr, groups, enable=advance_v, name="cmd_slots")
            m.d.comb += rg3.eq(product)
        else:
            with m.If(advance_v):
                m.d.sync += rg3.eq(f2.row_tiles * g2)
        with m.If(advance_v):
            if narrow_check:
                m.d.sync += therm3.eq(therm2)
            m.d.sync += [
                err3.eq(err2),
                g3.eq(g2),
                lastmask3.eq(Cat(*[last_count > t for t in range(tiles)])),
                # The room V3 compares R*G with (slots base .. base + R*G - 1 exist iff
                # R*G <= mrf_depth - base), so that V3 is one comparison after the
                # product's register.
                room3.eq(c.mrf_depth - f2.base),
            ]
        # V3: the slots exist.
        with m.If(advance_v):
            if narrow_check:
                m.d.sync += therm4.eq(therm3)
            m.d.sync += [
                err4.eq(err3 | (rg3 > room3)),
                g4.eq(g3),
                rg4.eq(rg3),
                lastmask4.eq(lastmask3),
            ]
        # V4: the loader takes a good command; a bad one is dropped here.
        m.d.comb += v4_go.eq(v4 & (err4 | loader_free))
        error_set.append(v4_go & err4)

        # Parameters the compute sequencer needs, travelling loader -> writer -> half
        # (k and its thermometer only with the narrow check).
        params_fields = {
            "base": unsigned(TileEngine.slot_bits(c)),
            "last_step": range(max(2, c.mrf_depth)),          # R*G - 1
            "last_group": range(max(2, gmax)),
            "lastmask": unsigned(tiles),
        }
        if narrow_check:
            params_fields.update(k=unsigned(NARROW_WIDTH_BITS),
                                 therm=unsigned(c.dot_bits - 1))
        params_layout = data.StructLayout(params_fields)
        v4_params = Signal(params_layout, name="cmd_params_v4")
        m.d.comb += [
            v4_params.base.eq(f4.base),
            v4_params.last_step.eq(rg4 - 1),
            v4_params.last_group.eq(g4 - 1),
            v4_params.lastmask.eq(lastmask4),
        ]
        if narrow_check:
            m.d.comb += [v4_params.k.eq(f4.narrow_width), v4_params.therm.eq(therm4)]

        # ================================================================================
        # Loader: feeds each command's C vectors into the vector quantizer, tagging each
        # with where its block goes; the command's compute parameters go to a FIFO that
        # the sequencer reads when it starts the command (commands stay in order).
        # ================================================================================
        tag_layout = data.StructLayout({
            "half": unsigned(1),
            "bank": range(tiles),
            "group": range(max(2, gmax)),
            "last": unsigned(1),
        })
        m.submodules.vector_tags = vtags = fifo.SyncFIFO(width=tag_layout.size,
                                                         depth=_VTAG_DEPTH)
        m.submodules.command_params = cparams = fifo.SyncFIFO(width=params_layout.size,
                                                              depth=_PARAMS_DEPTH)
        l_count = Signal(range(c.max_col_tiles + 1), name="loader_count")
        l_total = Signal(range(c.max_col_tiles + 1), name="loader_total")
        # Half of the command being loaded: toggles with every command, from 0.
        l_half = Signal(name="loader_half", init=1)
        l_bank = Signal(range(tiles), name="loader_bank")
        l_group = Signal(range(max(2, gmax)), name="loader_group")
        l_cmd = Signal(cl, name="loader_cmd")
        # The loader's state describes the next vector to account for: vectors left
        # (l_more), the next is the command's last (l_last), its bank, group and half.
        # A vector taken from x_stream is accounted for one edge later, when it is in
        # the input register (x_in_valid): x_stream.valid then drives one flip-flop, not
        # the enables of the loader's registers and the tag FIFO (in the routed one-engine
        # build that handshake was the slowest path, and its length depended on where
        # the placer put the register that drives valid: docs/mvm.md section 11).
        l_more = Signal(name="loader_more")
        l_last = Signal(name="loader_last")
        x_taken = Signal()
        # Vectors are registered on their way into the vector quantizer (its first stage
        # decodes all N lanes and ORs across them), with the command's quantizer setting.
        x_in_valid = Signal(name="x_in_valid")
        x_in = Signal.like(self.x_stream.payload, name="x_in")
        x_in_cmd = Signal(cl, name="x_in_cmd")
        # The vector in the input register is its command's last: the loader is done with
        # the command once that is accounted for on this edge.
        l_ending = Signal()
        # Room in the tag FIFO for one more vector beside the one in the input register,
        # whose tag is written on this edge: the tags then still bound the blocks in
        # flight, and the block FIFO, as deep, never overflows.
        tag_room = Signal()
        m.d.comb += [
            l_ending.eq(x_in_valid & l_last),
            tag_room.eq(vtags.level < _VTAG_DEPTH - 1),
            # A LUT from flip-flops: loader state, the input register's valid and the
            # tag FIFO's level. The quantizer never stalls (see the writer), so its
            # enable does not join this handshake.
            self.x_stream.ready.eq(l_more & ~l_ending & tag_room),
            x_taken.eq(self.x_stream.valid & self.x_stream.ready),
            loader_free.eq((~l_more | l_ending) & cparams.w_rdy),
            vq.i_stream.payload.eq(x_in),
            vq.rounding.eq(x_in_cmd.rounding),
            vq.static.eq(x_in_cmd.static),
            vq.static_exponent.eq(x_in_cmd.static_exponent),
            # Block c of the command: bank c % T, group c // T of the command's half.
            vtags.w_en.eq(x_in_valid),
            vtags.w_data.eq(Cat(l_half, l_bank, l_group, l_last)),
            cparams.w_en.eq(v4_go & ~err4),
            cparams.w_data.eq(v4_params),
        ]
        # The input register takes the payload and the loader's command on every edge,
        # taken or not, so that no enable fans out to its bits; x_in_valid marks a vector
        # that was taken. l_cmd is the taken vector's command: a command is loaded only
        # once the vectors of the one before are all taken, and its own come later.
        m.d.sync += x_in_valid.eq(x_taken)
        if not shared:
            m.d.comb += vq.i_stream.valid.eq(x_in_valid)
            m.d.sync += [x_in.eq(self.x_stream.payload), x_in_cmd.eq(l_cmd)]
        with m.If(x_in_valid):
            m.d.sync += [
                l_count.eq(l_count + 1),
                l_last.eq(l_count + 2 == l_total),
            ]
            with m.If(l_last):
                m.d.sync += l_more.eq(0)
            with m.If(l_bank == tiles - 1):
                m.d.sync += [l_bank.eq(0), l_group.eq(l_group + 1)]
            with m.Else():
                m.d.sync += l_bank.eq(l_bank + 1)
        # A command is taken once the last vector of the one before is accounted for, on
        # that edge at the earliest (loader_free); its loading wins over that accounting.
        with m.If(v4_go & ~err4):
            m.d.sync += [
                l_more.eq(1), l_last.eq(f4.col_tiles == 1),
                l_count.eq(0), l_total.eq(f4.col_tiles), l_cmd.eq(f4),
                l_bank.eq(0), l_group.eq(0), l_half.eq(~l_half),
            ]

        # ================================================================================
        # Writer: quantized blocks into the vector buffer, into a half only once the
        # sequencer is done with it (ping-pong); the last block marks the half full.
        # ================================================================================
        # The vector quantizer runs free (its output is always taken): blocks wait for
        # their half in a FIFO after it, not in its pipeline. A stall of the quantizer
        # would be one enable for all its registers, driven by the writer's and the
        # loader's handshakes; in the routed build (docs/mvm.md section 11) that net
        # crossed the die twice in one cycle. The FIFO costs one edge of latency.
        m.submodules.vector_blocks = vblocks = fifo.SyncFIFO(
            width=vq.o_stream.payload.shape().size, depth=_VTAG_DEPTH)
        m.d.comb += [
            vq.o_stream.ready.eq(1),
            vblocks.w_en.eq(v_out),
            vblocks.w_data.eq(vq.o_stream.payload),
        ]
        full = [Signal(name=f"half{h}_full") for h in range(2)]
        tag = tag_layout(vtags.r_data)
        w_fire = Signal()
        m.d.comb += [
            # A block in the FIFO has its tag: tags are written before, and read with,
            # their blocks.
            w_fire.eq(vblocks.r_rdy & ~Mux(tag.half, full[1], full[0])),
            vblocks.r_en.eq(w_fire),
            vtags.r_en.eq(w_fire),
        ]
        half_bits = TileEngine.vbuf_half_bits(c)
        for t, e in enumerate(engines):
            m.d.comb += [
                e.vwr_addr.eq(Cat(tag.group[:half_bits], tag.half)),
                e.vwr_data.eq(vblocks.r_data),
                e.vwr_en.eq(w_fire & (tag.bank == t)),
            ]
        for h in range(2):
            with m.If(w_fire & tag.last & (tag.half == h)):
                m.d.sync += full[h].eq(1)

        # ================================================================================
        # Compute sequencer: one group of T tiles per cycle
        # ================================================================================
        s_valid = Signal(name="seq_valid")
        s_half = Signal(name="seq_half")
        s_next = Signal(name="seq_next_half")
        s_slot = Signal(TileEngine.slot_bits(c), name="seq_slot")
        s_group = Signal(range(max(2, gmax)), name="seq_group")
        s_left = Signal(range(max(2, c.mrf_depth)), name="seq_steps_left")
        s_params = Signal(params_layout, name="seq_params")
        reserved = Signal(range(depth + 1), name="output_reserved")
        fire = Signal()
        final = Signal()
        start = Signal()
        last_group = Signal()
        # The comparisons of the step and group counters are registers of their own
        # (updated with the counters), so that `start`, which loads the sequencer from
        # the params FIFO, is two LUT levels from flip-flops.
        s_end = Signal(name="seq_at_last_step")           # s_left == 0
        next_full = Mux(s_next, full[1], full[0])
        m.d.comb += [
            fire.eq(s_valid & (reserved < depth)),
            final.eq(fire & s_end),
            start.eq(next_full & (~s_valid | final)),
        ]
        s_lastg = Signal(name="seq_at_last_group")        # s_group == last_group
        m.d.comb += last_group.eq(s_lastg)
        with m.If(fire):
            m.d.sync += [
                s_slot.eq(s_slot + 1),
                s_group.eq(Mux(last_group, 0, s_group + 1)),
                s_lastg.eq(Mux(last_group, s_params.last_group == 0,
                               s_group + 1 == s_params.last_group)),
                s_left.eq(s_left - 1),
                s_end.eq(s_left == 1),
            ]
        with m.If(final):
            m.d.sync += s_valid.eq(0)
            for h in range(2):
                with m.If(s_half == h):
                    m.d.sync += full[h].eq(0)
        m.d.comb += cparams.r_en.eq(start)
        with m.If(start):
            nxt = params_layout(cparams.r_data)
            m.d.sync += [
                s_valid.eq(1), s_half.eq(s_next), s_next.eq(~s_next),
                s_slot.eq(nxt.base), s_group.eq(0), s_left.eq(nxt.last_step),
                s_params.eq(nxt),
                s_end.eq(nxt.last_step == 0), s_lastg.eq(nxt.last_group == 0),
            ]

        # MRF read-back (only while no command is in the MVM).
        rb = [Signal(name=f"readback_c{j}") for j in range(3)]
        rb_addr = Signal(addr_layout, name="readback_addr")
        rb_busy = Signal()
        m.d.comb += rb_busy.eq(rb[0] | rb[1] | rb[2])

        enables = Cat(*[~last_group | s_params.lastmask[t] for t in range(tiles)])
        for t, e in enumerate(engines):
            m.d.comb += [
                e.rd_addr.eq(Mux(s_valid, s_slot, rb_addr.slot)),
                e.vrd_addr.eq(Cat(s_group[:half_bits], s_half)),
                e.enable.eq(fire & enables[t]),
                # A read-back keeps only its own word (engine, row) in the word registers.
                e.rb_clear.eq(rb[0].replicate(n) & ~Mux(
                    rb_addr.engine == t, Const(1, n) << rb_addr.row, 0)),
            ]

        if narrow_check:
            m.d.comb += [e.therm.eq(s_params.therm) for e in engines]

        # Side information of each group, delayed to meet its tile products (k only
        # with the narrow check).
        side = Cat(fire, s_group == 0, last_group, fire.replicate(tiles) & enables,
                   *([s_params.k] if narrow_check else []))
        for j in range(TileEngine.dot_latency_of(c)):
            r = Signal(len(side), name=f"group_side_d{j + 1}")
            m.d.sync += r.eq(side)
            side = r
        m.d.comb += [
            acc.valid.eq(side[0]),
            acc.first.eq(side[1]),
            acc.last.eq(side[2]),
            acc.engines.eq(side[3:3 + tiles]),
        ]
        if narrow_check:
            m.d.comb += acc.k.eq(side[3 + tiles:])
        for t, e in enumerate(engines):
            m.d.comb += [acc.dot[t].eq(e.dot), acc.shift[t].eq(e.shift)]

        # ================================================================================
        # Output: FP16 conversion, FIFO, credits
        # ================================================================================
        m.d.comb += [
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
        ]
        # A taken vector frees its place one edge late: the credit count's adder then
        # starts from registers only, not from y_stream.ready (an input from wherever
        # the consumer is). The FIFO has room for this edge (output_fifo_depth).
        y_taken = Signal(name="output_taken", reset_less=True)
        m.d.sync += [
            y_taken.eq(self.y_stream.valid & self.y_stream.ready),
            reserved.eq(reserved + (fire & last_group) - y_taken),
        ]

        # ================================================================================
        # MRF writes: matrix quantizer (w_stream) and packed words (mrf_w)
        # ================================================================================
        # A command is in the MVM: cmd_busy one edge late (a register, so that the write
        # and read-back handshakes do not start from its wide OR), or in the first check
        # stage, which covers the edge that lag would miss.
        cmd_busy_r = Signal(name="cmd_busy_r")
        m.d.sync += cmd_busy_r.eq(cmd_busy)
        # With the shared quantizer, writes also wait for cmd_busy two edges late: the
        # value the mode copies that steer its input register (below) hold.
        settled = Const(1, 1)
        if shared:
            cmd_busy_r2 = Signal(name="cmd_busy_r2")
            m.d.sync += cmd_busy_r2.eq(cmd_busy_r)
            settled = ~cmd_busy_r2
        writes_open = Signal()
        m.d.comb += writes_open.eq(~cmd_busy_r & settled & ~v1 & ~self.cmd.valid & ~rb_busy)
        w_in = self.w_stream.payload
        m.d.comb += [
            # The quantizer never stalls: its output is always taken.
            self.w_stream.ready.eq(writes_open & wside.w_rdy),
            wside.w_en.eq(self.w_stream.valid & self.w_stream.ready),
            wside.w_data.eq(Cat(w_in.engine, w_in.row, w_in.slot)),
            # The write stage takes a word every cycle, so quantized rows never wait,
            # and they go before packed words.
            wq.o_stream.ready.eq(1),
            wside.r_en.eq(w_out),
            self.mrf_w.ready.eq(writes_open & ~w_out),
        ]
        if shared:
            # A row taken from w_stream goes through the vectors' input register: each
            # lane's copy of the mode (~cmd_busy two edges late, a kept flip-flop loaded
            # from cmd_busy_r: loaded from cmd_busy's wide OR, the copies spread over
            # the lanes were a routed critical path) selects what the register loads. A
            # row is taken only with writes_open, which needs ~cmd_busy two edges late; a
            # vector only with l_more, which, or the V3 and V4 before it, kept cmd_busy
            # high two edges before.
            w_in_valid = Signal(name="w_in_valid")
            weights = [Signal(name=f"quantizer_weights{i}", attrs={"keep": 1})
                       for i in range(n)]
            m.d.sync += [w.eq(~cmd_busy_r) for w in weights]
            m.d.sync += [x_in[i].eq(Mux(weights[i], w_in.values[i], self.x_stream.payload[i]))
                         for i in range(n)]
            m.d.sync += [
                w_in_valid.eq(self.w_stream.valid & self.w_stream.ready),
                x_in_cmd.rounding.eq(Mux(weights[0], w_in.rounding, l_cmd.rounding)),
                x_in_cmd.static.eq(Mux(weights[0], w_in.static, l_cmd.static)),
                x_in_cmd.static_exponent.eq(Mux(weights[0], w_in.static_exponent,
                                                l_cmd.static_exponent)),
            ]
            m.d.comb += [vq.i_stream.valid.eq(x_in_valid | w_in_valid),
                         vq.source.eq(w_in_valid)]
        else:
            m.d.comb += [
                wq.i_stream.valid.eq(self.w_stream.valid & writes_open & wside.w_rdy),
                wq.i_stream.payload.eq(w_in.values),
                wq.rounding.eq(w_in.rounding),
                wq.static.eq(w_in.static),
                wq.static_exponent.eq(w_in.static_exponent),
            ]
        from_q = w_out
        from_d = self.mrf_w.valid & self.mrf_w.ready
        q_addr = addr_layout(wside.r_data)
        src_engine = Mux(from_q, q_addr.engine, self.mrf_w.payload.engine)
        src_row = Mux(from_q, q_addr.row, self.mrf_w.payload.row)
        src_slot = Mux(from_q, q_addr.slot, self.mrf_w.payload.slot)
        src_block = Mux(from_q, wq.o_stream.payload.as_value(),
                        self.mrf_w.payload.block.as_value())

        def word_bad(engine, slot, block):
            return (block[:8] > MAX_EXPONENT_CODE) | (engine >= tiles) | (slot >= c.mrf_depth)
        # Each source is checked before the choice. Checked after it, the check shared
        # the choice's LUTs with the write-data register beside the engines' block RAMs,
        # and its result crossed the die back to `error`: a one-engine build's routed
        # critical path (docs/mvm.md section 11).
        mw = self.mrf_w.payload
        bad_word = Mux(from_q, word_bad(q_addr.engine, q_addr.slot, wq.o_stream.payload.as_value()),
                       word_bad(mw.engine, mw.slot, mw.block.as_value()))
        wr_valid = Signal(name="mrf_write_valid")
        wr_engine = Signal(_engine_bits(c), name="mrf_write_engine")
        wr_rows = Signal(n, name="mrf_write_rows")
        wr_slot = Signal(TileEngine.slot_bits(c), name="mrf_write_slot")
        wr_data = Signal(c.weight_block_bits, name="mrf_write_data")
        attempt = from_q | from_d
        m.d.sync += [
            wr_valid.eq(attempt & ~bad_word),
            wr_engine.eq(src_engine),
            wr_rows.eq(Const(1, n) << src_row),
            wr_slot.eq(src_slot),
            wr_data.eq(src_block),
        ]
        error_set.append(attempt & bad_word)
        for t, e in enumerate(engines):
            m.d.comb += [
                e.wr_addr.eq(wr_slot),
                e.wr_data.eq(wr_data),
                e.wr_rows.eq(Mux(wr_valid & (wr_engine == t), wr_rows, 0)),
            ]

        # MRF read-back: request -> read (c0) -> memory data (c1) -> output register (c2)
        # -> response register. One request at a time; it waits for writes in flight.
        resp = self.mrf_r_resp
        m.d.comb += self.mrf_r_req.ready.eq(
            writes_open & ~io_busy & ~resp.valid & ~self.w_stream.valid & ~self.mrf_w.valid)
        req_taken = self.mrf_r_req.valid & self.mrf_r_req.ready
        req = self.mrf_r_req.payload
        req_bad = (req.engine >= tiles) | (req.slot >= c.mrf_depth)
        rb_bad = Signal(name="readback_bad")
        error_set.append(req_taken & req_bad)
        m.d.sync += [rb[0].eq(req_taken), rb[1].eq(rb[0]), rb[2].eq(rb[1])]
        with m.If(req_taken):
            m.d.sync += [rb_addr.eq(self.mrf_r_req.payload), rb_bad.eq(req_bad)]
        # Every engine but the addressed one cleared all its words for this read.
        rb_word = Signal(c.weight_block_bits, name="readback_word")
        m.d.comb += rb_word.eq(or_all(e.rb_word for e in engines))
        with m.If(rb[2]):
            # A word that does not exist reads as all zeros (not whatever the memory
            # model gives for an address past its end).
            m.d.sync += [resp.valid.eq(1), resp.payload.eq(Mux(rb_bad, 0, rb_word))]
        with m.Elif(resp.ready):
            m.d.sync += resp.valid.eq(0)

        # ================================================================================
        # Counters, error, busy
        # ================================================================================
        def saturating(counter, increment):
            total = Signal(cb + 1 + len(increment), name=f"{counter.name}_next")
            m.d.comb += total.eq(counter + increment)
            with m.If(self.clear):
                m.d.sync += counter.eq(0)
            with m.Else():
                # cmax is all ones: the sum is past it iff a bit above it is set.
                m.d.sync += counter.eq(Mux(total[cb:].any(), cmax, total))

        if narrow_check:
            narrow_total = Signal(range(tiles * n * (2 * n - 1) + n * tiles + 1),
                                  name="narrow_total")
            m.d.sync += narrow_total.eq(sum(e.narrow for e in engines) + acc.narrow)
            saturating(self.narrow_events, narrow_total)
        # else: no counter; narrow_events is never driven and reads 0.
        conv_taken = conv.o_stream.valid & conv.o_stream.ready
        # The popcount is registered before the add: in one cycle, the converter's flags
        # (placed beside its lanes), their popcount and the counter's add were the routed
        # critical path of a one-engine build (docs/mvm.md section 11). The count trails
        # its row block by one edge, and `busy` stays up while a count is pending.
        out_sat = Signal(range(n + 1), name="output_saturation_count", reset_less=True)
        m.d.sync += out_sat.eq(Mux(conv_taken, popcount(conv.o_stream.payload.overflow), 0))
        saturating(self.output_saturations, out_sat)

        # Each error condition is registered before the sticky flag takes it: they come
        # from checks spread over the MVM (command, MRF write, read-back), and their
        # OR, with error_clear, into one flip-flop was a routed path of over 10 ns.
        # `error` rises one edge later; `busy` waits for it.
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
        m.d.sync += history.eq(Cat(fire, history[:-1]))
        m.d.comb += [
            cmd_busy.eq(v1 | v2 | v3 | v4 | l_more | vtags.r_rdy | full[0] | full[1] | s_valid
                        | cparams.r_rdy),
            io_busy.eq(wside.r_rdy | wr_valid | rb_busy),
            self.busy.eq(cmd_busy | io_busy | (reserved != 0) | history.any()
                         | (out_sat != 0) | error_pending.any() | resp.valid),
        ]
        return m
