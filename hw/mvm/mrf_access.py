"""The MVM's MRF access from outside: the write stage (quantized weight rows and packed
words) and the read-back (``docs/mvm.md`` section 9)."""

from amaranth.hdl import Cat, Const, Module, Mux, Signal, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from host.spec.formats import MAX_EXPONENT_CODE, block_layout

from hw.mvm.layouts import engine_bits, mrf_address_layout, mrf_word_layout, weight_row_layout
from hw.mvm.tile_engine import TileEngine, _check_config, or_all

__all__ = ["MrfWriter", "MrfReadback"]


def _word_bad(config, engine, slot, block):
    """The word is rejected: exponent code above 142, no such engine or slot."""
    return ((block[:8] > MAX_EXPONENT_CODE) | (engine >= config.tiles)
            | (slot >= config.mrf_depth))


class MrfWriter(wiring.Component):
    """The MRF write stage and the gate that keeps MRF access and commands apart.

    Writes, and read-back requests (:class:`MrfReadback`), are open (``writes_open``)
    only while no command is in the MVM (``cmd_busy`` one edge late, a register, so
    that the handshakes do not start from its wide OR; or in the check's first stage,
    which covers the edge that lag misses), no command is offered and no read-back is in
    flight. With ``shared`` they also wait for ``cmd_busy`` two edges late: the value
    the loader's mode copies hold (:class:`hw.mvm.loader.Loader`).

    A row taken from ``w_stream`` is quantized (by the matrix quantizer, or with
    ``shared`` through the loader's input register by the shared one); its MRF address
    waits beside the quantizer in the weight-side FIFO. The write stage takes a word
    every cycle, quantized rows before packed words (``mrf_w``): each source is checked
    before the choice, the choice is registered (``mrf_write_*``) beside the engines'
    block RAMs. A rejected word (exponent code above 142, ``engine >= T``,
    ``slot >= mrf_depth``) is not written and raises ``error``.

    Parameters
    ----------
    config : MvmConfig
    shared : bool
        One quantizer for vectors and weight rows: the gate also waits for ``cmd_busy``
        two edges late.

    Attributes
    ----------
    w_stream : ``In(stream.Signature(weight_row_layout(config)))``
        FP16 tile rows; only ``valid`` and the address are used here (the rows go to the
        quantizer when ``row_taken``).
    mrf_w : ``In(stream.Signature(mrf_word_layout(config)))``
        Packed words.
    cmd_busy : ``In(1)``
        A command is between acceptance and its last MRF read.
    cmd_first_stage : ``In(1)``, cmd_offered : ``In(1)``
        A command is in the check's first stage; one is offered on ``cmd``.
    readback_busy : ``In(1)``
        A read-back is in flight.
    writes_open : ``Out(1)``
        MRF writes and read-back requests may be taken.
    cmd_busy_r : ``Out(1)``
        ``cmd_busy`` one edge late (the source of the loader's mode copies).
    row_taken : ``Out(1)``
        A row is taken from ``w_stream`` into the quantizer in this cycle.
    side_w_en : ``Out(1)``, side_w_data : ``Out(mrf_address_layout(config))``,
    side_w_rdy : ``In(1)``, side_r_en : ``Out(1)``,
    side_r_data : ``In(mrf_address_layout(config))``
        The weight-side FIFO of MRF addresses beside the quantizer.
    q_valid : ``In(1)``, q_block : ``In(block_layout(n, mantissa_bits_w))``
        A quantized row leaves the quantizer (always taken).
    wr_addr : ``Out(TileEngine.slot_bits(config))``,
    wr_data : ``Out(config.weight_block_bits)``,
    wr_rows : ``Out(ArrayLayout(unsigned(n), tiles))``
        The engines' MRF write ports: bit ``i`` of ``wr_rows[t]`` writes row ``i`` of
        engine ``t``.
    error : ``Out(1)``
        A word is rejected in this cycle.
    busy : ``Out(1)``
        A word is in the write stage.

    Raises
    ------
    TypeError
        ``config`` is not an :class:`~host.spec.config.MvmConfig`.
    """

    def __init__(self, config, *, shared):
        self._config = c = _check_config(config)
        self._shared = bool(shared)
        addr = mrf_address_layout(c)
        super().__init__({
            "w_stream": In(stream.Signature(weight_row_layout(c))),
            "mrf_w": In(stream.Signature(mrf_word_layout(c))),
            "cmd_busy": In(1),
            "cmd_first_stage": In(1),
            "cmd_offered": In(1),
            "readback_busy": In(1),
            "writes_open": Out(1),
            "cmd_busy_r": Out(1),
            "row_taken": Out(1),
            "side_w_en": Out(1),
            "side_w_data": Out(addr),
            "side_w_rdy": In(1),
            "side_r_en": Out(1),
            "side_r_data": In(addr),
            "q_valid": In(1),
            "q_block": In(block_layout(c.n, c.mantissa_bits_w)),
            "wr_addr": Out(TileEngine.slot_bits(c)),
            "wr_data": Out(c.weight_block_bits),
            "wr_rows": Out(data.ArrayLayout(unsigned(c.n), c.tiles)),
            "error": Out(1),
            "busy": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        c = self._config
        n = c.n
        cmd_busy_r = Signal(name="cmd_busy_r")
        m.d.sync += cmd_busy_r.eq(self.cmd_busy)
        settled = Const(1, 1)
        if self._shared:
            cmd_busy_r2 = Signal(name="cmd_busy_r2")
            m.d.sync += cmd_busy_r2.eq(cmd_busy_r)
            settled = ~cmd_busy_r2
        writes_open = Signal()
        m.d.comb += writes_open.eq(~cmd_busy_r & settled & ~self.cmd_first_stage
                                   & ~self.cmd_offered & ~self.readback_busy)
        w_in = self.w_stream.payload
        w_out = self.q_valid
        m.d.comb += [
            self.writes_open.eq(writes_open),
            self.cmd_busy_r.eq(cmd_busy_r),
            # The quantizer never stalls: its output is always taken.
            self.w_stream.ready.eq(writes_open & self.side_w_rdy),
            self.row_taken.eq(self.w_stream.valid & writes_open & self.side_w_rdy),
            self.side_w_en.eq(self.w_stream.valid & self.w_stream.ready),
            self.side_w_data.eq(Cat(w_in.engine, w_in.row, w_in.slot)),
            # The write stage takes a word every cycle, so quantized rows never wait,
            # and they go before packed words.
            self.side_r_en.eq(w_out),
            self.mrf_w.ready.eq(writes_open & ~w_out),
        ]
        from_q = w_out
        from_d = self.mrf_w.valid & self.mrf_w.ready
        q_addr = self.side_r_data
        mw = self.mrf_w.payload
        src_engine = Mux(from_q, q_addr.engine, mw.engine)
        src_row = Mux(from_q, q_addr.row, mw.row)
        src_slot = Mux(from_q, q_addr.slot, mw.slot)
        src_block = Mux(from_q, self.q_block.as_value(), mw.block.as_value())
        # Each source is checked before the choice. Checked after it, the check shared
        # the choice's LUTs with the write-data register beside the engines' block RAMs,
        # and its result crossed the die back to `error`: a one-engine build's routed
        # critical path (docs/mvm.md section 11).
        bad_word = Mux(from_q, _word_bad(c, q_addr.engine, q_addr.slot, self.q_block.as_value()),
                       _word_bad(c, mw.engine, mw.slot, mw.block.as_value()))
        wr_valid = Signal(name="mrf_write_valid")
        wr_engine = Signal(engine_bits(c), name="mrf_write_engine")
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
        m.d.comb += [
            self.error.eq(attempt & bad_word),
            self.busy.eq(wr_valid),
            self.wr_addr.eq(wr_slot),
            self.wr_data.eq(wr_data),
        ]
        for t in range(c.tiles):
            m.d.comb += self.wr_rows[t].eq(Mux(wr_valid & (wr_engine == t), wr_rows, 0))
        return m


class MrfReadback(wiring.Component):
    """MRF read-back: request -> read (c0) -> memory data (c1) -> the engines' output
    register (c2) -> response register. One request at a time, taken only while MRF
    writes are open, nothing else is in flight and no write is offered; 4 cycles to
    the response.

    Every engine but the addressed one clears all its word registers for the read
    (``rb_clear``), so the response is the OR of the engines' ``rb_word``. A request for
    a non-existent engine or slot raises ``error`` and reads as all zeros.

    Parameters
    ----------
    config : MvmConfig

    Attributes
    ----------
    req : ``In(stream.Signature(mrf_address_layout(config)))``
    resp : ``Out(stream.Signature(block_layout(n, mantissa_bits_w)))``
        The MVM's ``mrf_r_req`` and ``mrf_r_resp``.
    writes_open : ``In(1)``, io_busy : ``In(1)``
        From :class:`MrfWriter`; an MRF write or read-back is in flight.
    writes_offered : ``In(1)``
        ``w_stream`` or ``mrf_w`` is valid: a read waits for writes.
    slot : ``Out(TileEngine.slot_bits(config))``
        The slot being read (the engines' read address while the sequencer is idle).
    rb_clear : ``Out(ArrayLayout(unsigned(n), tiles))``
        Per engine, the word registers to clear in this cycle.
    words : ``In(ArrayLayout(unsigned(config.weight_block_bits), tiles))``
        The engines' ``rb_word``.
    busy : ``Out(1)``
        A read is between request and response register.
    error : ``Out(1)``
        A bad request is taken in this cycle.

    Raises
    ------
    TypeError
        ``config`` is not an :class:`~host.spec.config.MvmConfig`.
    """

    def __init__(self, config):
        self._config = c = _check_config(config)
        super().__init__({
            "req": In(stream.Signature(mrf_address_layout(c))),
            "resp": Out(stream.Signature(block_layout(c.n, c.mantissa_bits_w))),
            "writes_open": In(1),
            "io_busy": In(1),
            "writes_offered": In(1),
            "slot": Out(TileEngine.slot_bits(c)),
            "rb_clear": Out(data.ArrayLayout(unsigned(c.n), c.tiles)),
            "words": In(data.ArrayLayout(unsigned(c.weight_block_bits), c.tiles)),
            "busy": Out(1),
            "error": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        c = self._config
        n = c.n
        rb = [Signal(name=f"readback_c{j}") for j in range(3)]
        rb_addr = Signal(mrf_address_layout(c), name="readback_addr")
        resp = self.resp
        m.d.comb += [
            self.busy.eq(rb[0] | rb[1] | rb[2]),
            self.slot.eq(rb_addr.slot),
            self.req.ready.eq(self.writes_open & ~self.io_busy & ~resp.valid
                              & ~self.writes_offered),
        ]
        # A read-back keeps only its own word (engine, row) in the word registers.
        for t in range(c.tiles):
            m.d.comb += self.rb_clear[t].eq(rb[0].replicate(n) & ~Mux(
                rb_addr.engine == t, Const(1, n) << rb_addr.row, 0))
        req_taken = self.req.valid & self.req.ready
        req = self.req.payload
        req_bad = (req.engine >= c.tiles) | (req.slot >= c.mrf_depth)
        rb_bad = Signal(name="readback_bad")
        m.d.comb += self.error.eq(req_taken & req_bad)
        m.d.sync += [rb[0].eq(req_taken), rb[1].eq(rb[0]), rb[2].eq(rb[1])]
        with m.If(req_taken):
            m.d.sync += [rb_addr.eq(req), rb_bad.eq(req_bad)]
        # Every engine but the addressed one cleared all its words for this read.
        rb_word = Signal(c.weight_block_bits, name="readback_word")
        m.d.comb += rb_word.eq(or_all(self.words[t] for t in range(c.tiles)))
        with m.If(rb[2]):
            # A word that does not exist reads as all zeros (not whatever the memory
            # model gives for an address past its end).
            m.d.sync += [resp.valid.eq(1), resp.payload.eq(Mux(rb_bad, 0, rb_word))]
        with m.Elif(resp.ready):
            m.d.sync += resp.valid.eq(0)
        return m
