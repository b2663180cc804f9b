"""The multifunction units (MFUs) and the MFU pipeline: units, crossbars, VRFs, counters.

The bit-exact reference is :func:`host.model.mfu.run_chain`; the chain configuration, the
allocation rule and the VRF write payload are defined once in :mod:`host.spec.mfu`. Design
notes, timing and measurements: ``docs/mfu.md``.
"""

from amaranth.hdl import Cat, Const, Module, Mux, Signal, Value, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from host.spec.formats import FP16_BITS, check_int
from host.spec.ops import BinaryOp
from host.spec.mfu import (
    UNITS, MfuConfig, MfuUnit, VrfBank, chain_layout, mfu_layout, vrf_write_layout,
)
from host.spec.ops import ReduceOp
from host.spec.ops import UnaryOp
from hw.arith.fp16_arith import Fp16Binary
from hw.arith.fp16_reduce import Fp16Reduce
from hw.arith.fp16_unary import Fp16Unary

__all__ = ["INPUT_STAGES", "Mfu", "MfuPipeline", "OPERAND_BUFFER", "OPERAND_ENTRIES",
           "vector_layout", "output_layout", "mfu_vrf_write_layout"]

#: Registers between a unit's crossbar (and VRF operand) and the unit: the first is
#: placed near the sources, the second near the lanes, so that neither the route from
#: another unit's lanes nor the one to this unit's lanes shares a cycle with logic.
#: With one, the route across the die into the lanes' first comparator was the
#: critical path (docs/mfu.md section 10). host.model.core.Timing repeats it.
INPUT_STAGES = 2

#: Operands a VRF reader keeps read ahead (in flight plus buffered): a read issued in
#: cycle t is in the buffer from t + 2, so three keep one operand per cycle flowing.
OPERAND_BUFFER = 3

#: Entries of a VRF reader's ring: one more than :data:`OPERAND_BUFFER`, because the
#: reader's count learns of a pop a cycle late (``pop_seen``) and so counts the operand
#: taken in the cycle before as still buffered.
OPERAND_ENTRIES = OPERAND_BUFFER + 1

#: The ops of the ADDSUB unit's Fp16Binary (every BinaryOp but MUL, which is the MUL
#: unit's; host.spec.mfu.MfuOp refuses it on ADDSUB).
_ADDSUB_OPS = tuple(op for op in BinaryOp if op is not BinaryOp.MUL)

#: Crossbar sources, in this order: the MFU's input, then the units' outputs by code.
_SOURCES = 1 + UNITS


def vector_layout(cfg: MfuConfig) -> data.ArrayLayout:
    """A beat: ``cfg.lanes`` FP16 lanes, lane ``i`` at bits ``[16i, 16i + 16)``; with
    ``lanes == n`` a native vector. Beat ``b`` of a native vector holds its lanes
    ``b*lanes .. b*lanes + lanes - 1`` (``host.spec.mfu.MfuConfig.lanes``)."""
    return data.ArrayLayout(unsigned(FP16_BITS), cfg.lanes)


def output_layout(cfg: MfuConfig) -> data.StructLayout:
    """``MfuPipeline.o_stream`` payload: ``values`` (a beat), then ``last`` (1 on the
    chain's last beat) at bit ``16 * lanes``."""
    return data.StructLayout({"values": vector_layout(cfg), "last": unsigned(1)})


def _in_beats(cfg: MfuConfig, vectors):
    """``vectors`` (a count or an address of native vectors) in beats: ``vectors *
    beats``; ``vectors`` itself when ``lanes == n``, so that that build is the design
    it was before lanes existed."""
    return vectors if cfg.beats == 1 else Cat(Const(0, cfg.beat_bits), vectors)


def mfu_vrf_write_layout(cfg: MfuConfig) -> data.StructLayout:
    """``Mfu.vrf_w`` payload: :func:`host.spec.mfu.vrf_write_layout` without ``mfu``."""
    fields = dict(vrf_write_layout(cfg).members)
    del fields["mfu"]
    return data.StructLayout(fields)


def _check_cfg(cfg):
    if not isinstance(cfg, MfuConfig):
        raise TypeError(f"cfg must be an MfuConfig, not {cfg!r}")
    return cfg


def _skid(m, name, width, i_valid, i_payload, o_ready):
    """A two-register stream buffer with a registered ``ready`` and registered outputs.

    Takes one item (``width`` bits) per cycle while ``o_ready`` is high; ``i_ready`` is
    a flip-flop, so no combinational path runs from ``o_ready`` back to the source.
    Returns ``(i_ready, o_valid, o_payload)``.
    """
    main_valid = Signal(name=f"{name}_valid")
    spare_valid = Signal(name=f"{name}_spare_valid")
    i_ready = Signal(name=f"{name}_ready")
    main = Signal(width, name=f"{name}_main", reset_less=True)
    spare = Signal(width, name=f"{name}_spare", reset_less=True)
    # The main register loads when it is empty or being read (from the spare register
    # if that is full); otherwise an item offered while the spare one is empty is parked.
    # What a register loads while its item is not valid is never marked valid.
    load = o_ready | ~main_valid
    m.d.comb += i_ready.eq(~spare_valid)
    m.d.sync += [
        main_valid.eq(Mux(load, spare_valid | i_valid, main_valid)),
        spare_valid.eq(~load & (spare_valid | i_valid)),
    ]
    with m.If(load):
        m.d.sync += main.eq(Mux(spare_valid, spare, i_payload))
    with m.Elif(~spare_valid):
        m.d.sync += spare.eq(i_payload)
    return i_ready, main_valid, main


def _queue(m, name, width, depth, i_valid, i_payload, o_ready):
    """A queue for a source without back-pressure: ``width``-bit items, ``depth`` + 3 of
    them (the ``depth``-entry ring, the ring's read port, the two-register buffer).

    The source offers an item whenever ``i_valid`` is high and it is always taken; the
    caller guarantees that no more items than that are ever in the queue (an item more
    is lost). The output is a :func:`_skid` buffer (registered ``valid``, payload and
    upstream ready); an item goes straight into it (one cycle, as through a bare
    ``_skid``) while it can take one and nothing older waits, and otherwise into the
    ring, which refills the buffer in order. The memory's read data waits on its port (a
    read is issued only when the previous one is taken), so no extra register holds it.
    Returns ``(o_valid, o_payload)``.

    The ring's count takes each write a cycle late: ``stored`` plus ``written`` (the
    last cycle's write) is the count of items written and not issued, and every
    decision reads that sum's zero test, an OR of registers. So ``i_valid``, which comes
    through every unit a chain does not use, reaches only the write's enable and
    ``written``, not the count's carry chain (issue 36, timing: the chain handshake from
    the MVM's output through both MFUs into the count was the core alone's critical
    path, 76.03 MHz). No cycle changes.
    """
    mem = Memory(shape=unsigned(width), depth=depth, init=[])
    m.submodules[f"{name}_mem"] = mem
    wp = mem.write_port()
    rp = mem.read_port(domain="sync", transparent_for=())
    stored = Signal(range(depth + 1), name=f"{name}_stored")   # counted, read not issued
    written = Signal(name=f"{name}_written")                   # written, not yet counted
    have = Signal(name=f"{name}_have")                         # rp.data holds an item
    ring_empty = (stored == 0) & ~written
    wr = Signal(range(depth), name=f"{name}_wr")
    rd = Signal(range(depth), name=f"{name}_rd")
    skid_valid = Signal(name=f"{name}_push")
    skid_data = Signal(width, name=f"{name}_next")
    skid_ready, o_valid, o_payload = _skid(m, name, width, skid_valid, skid_data, o_ready)
    consume = have & skid_ready
    bypass = ~have & ring_empty & skid_ready
    to_mem = i_valid & ~bypass
    issue = ~ring_empty & (~have | consume)
    m.d.comb += [
        skid_valid.eq(have | (i_valid & bypass)),
        skid_data.eq(Mux(have, rp.data, Value.cast(i_payload))),
        wp.addr.eq(wr), wp.data.eq(i_payload), wp.en.eq(to_mem),
        rp.addr.eq(rd), rp.en.eq(issue),
    ]
    with m.If(to_mem):
        m.d.sync += wr.eq(Mux(wr == depth - 1, 0, wr + 1))
    with m.If(issue):
        m.d.sync += rd.eq(Mux(rd == depth - 1, 0, rd + 1))
    m.d.sync += [stored.eq(stored + written - issue), written.eq(to_mem),
                 have.eq(issue | (have & ~consume))]
    return o_valid, o_payload


def _popcount(bits):
    """Sum of 1-bit values in a balanced tree (Amaranth widens each sum)."""
    level = list(bits)
    while len(level) > 1:
        level = [a + b for a, b in zip(level[0::2], level[1::2])] + level[len(level) & ~1:]
    return level[0]


class _Configured(wiring.Component):
    """A component built from one :class:`host.spec.mfu.MfuConfig` (kept as :attr:`cfg`);
    subclasses give their signature members as ``_members(cfg)`` and check their other
    parameters in ``_check(cfg, **params)``."""

    def __init__(self, cfg, **params):
        # A component whose configuration was refused is no unused elaboratable worth a
        # warning.
        self._MustUse__silence = True
        self._cfg = _check_cfg(cfg)
        self._check(self._cfg, **params)
        self._MustUse__silence = False
        super().__init__(self._members(self._cfg))

    def _check(self, cfg):
        pass

    @property
    def cfg(self):
        """The build's :class:`host.spec.mfu.MfuConfig`."""
        return self._cfg


class Mfu(_Configured):
    """One multifunction unit: four units joined by a crossbar, two VRFs, two counters.

    **Units** (:class:`host.spec.mfu.MfuUnit`): ADDSUB (:class:`hw.arith.fp16_arith.Fp16Binary`,
    operand ``b`` from AddSubVrf), MUL (``Fp16Binary`` computing ``BinaryOp.MUL``, ``b``
    from MulVrf), ACT (:class:`hw.arith.fp16_unary.Fp16Unary` with ``cfg.unary_ops``), REDUCE
    (:class:`hw.arith.fp16_reduce.Fp16Reduce`). ``a`` is always the chain's value.

    **Unit sets.** MFU ``index`` builds only ``cfg.units(index)`` (``MfuConfig.unit_sets``):
    a unit left out has no operator, no input registers, no crossbar source, no select and
    no counter inputs, and the AddSubVrf (MulVrf) is left out with ADDSUB (MUL). The
    allocation (``host.spec.mfu.allocate``) never gives such an MFU an op of a unit it
    lacks, so its chain configuration never names one; VRF writes to a VRF it lacks are
    refused before they reach it (the core's ILLEGAL_FIELD) and would be dropped here.
    The units it has keep their latencies.

    **No back-pressure.** Both streams are ``always_ready``: the MFU takes a vector
    whenever ``i_stream.valid`` is high, and whoever reads ``o_stream`` must take every
    vector it offers. Inside, every unit's output is always taken, so the units never
    stall and no ``ready`` net runs from one unit back to the lanes of another, which
    on the ECP5 were the long nets across the die (``docs/mfu.md`` section 10).
    :class:`MfuPipeline` absorbs a stalled output in a queue and paces the input.

    **Crossbar.** Each unit's input is a multiplexer over the MFU input and the other
    units' outputs; the MFU output one over the MFU input and every unit output. The
    selects are one-hot registers decoded from the chain's order slots when ``start`` is
    high: the unit of used slot ``k`` takes the output of slot ``k - 1`` (slot 0 the MFU
    input), the output takes the last used slot (the input if none). ``valid`` and the
    payload go through the same selects; an unused unit sees ``valid = 0``. Every unit
    input is :data:`INPUT_STAGES` registers holding the unit's whole input payload: no
    combinational path runs from one unit into another (which also keeps the crossbar
    free of combinational loops), and each unit's first stage starts from registers.

    **Beats.** The MFU is ``cfg.lanes`` lanes wide: a native vector passes as
    ``cfg.beats`` beats in lane order, one per cycle at most, and every unit, crossbar,
    VRF word and register below is one beat wide (with ``lanes == n``, one beat is a
    native vector and every count below is in native vectors). REDUCE is
    ``Fp16Reduce(lanes=cfg.lanes, max_length=cfg.max_length * cfg.beats)``, fed every
    beat of the chain with ``last`` on the final one and each beat of the last native
    vector with its slice of the ``lanes_last`` mask, so that it computes the N-lane tree
    node for node (``docs/reductions.md`` section 2).

    **VRFs.** AddSubVrf and MulVrf are ``lib.memory.Memory`` of ``vrf_depth * beats``
    beats with one write port (``vrf_w``, a beat address) and one synchronous read port;
    beat ``b`` of the native vector at address ``a`` is at ``a * beats + b``. On
    ``start`` each reader of a used unit is loaded with its base address and reads the
    beats of ``addr``, ``addr + 1``, ... ``addr + L - 1`` in order ahead (the first read
    in the cycle of ``start``) into a :data:`OPERAND_ENTRIES`-entry ring of registers; the
    beat from the crossbar is joined with the ring's head (selected by a read pointer,
    which is all a pop moves) in front of the unit's input register, so beat ``b`` of
    native vector ``j`` meets beat ``b`` of operand ``addr + j``. The first operand is in
    the ring two cycles after ``start``, and from then on the ring has the next operand
    whenever a beat comes (at most one per cycle). So the contract: **a vector may reach
    an op that reads a VRF no earlier than the second cycle after** ``start``; only a
    chain whose first op reads a VRF can break it, and :class:`MfuPipeline` holds such a
    chain's input for a cycle. The read address and enable depend on registers (and, for
    the first read, on ``start`` and ``config``) only; the memory output goes straight
    into the ring. The read port is not transparent: a write to an address the running
    chain still has to read gives that chain the old or the new vector
    (``docs/mfu.md``).

    **Counters.** ``overflow`` and ``nan_created`` add up the events of every unit
    (the per-lane flags of ADDSUB, MUL, ACT on each output beat, and the REDUCE
    tree's event counts) three cycles (REDUCE: two) after the unit reports them,
    saturating at ``2**counter_bits - 1``; ``clear`` sets both to 0 (events still
    pending are added afterwards). ``pending`` is high while events are on their way.

    Parameters
    ----------
    cfg : host.spec.mfu.MfuConfig
    index : int
        Which MFU of the chain this is (0 to ``cfg.mfus - 1``, default 0): its units are
        ``cfg.units(index)``.

    Attributes
    ----------
    i_stream : ``In(stream.Signature(vector_layout(cfg), always_ready=True))``
    o_stream : ``Out(stream.Signature(vector_layout(cfg), always_ready=True))``
    start : ``In(1)``
        Load ``config``, ``length`` and ``lanes_last`` for the next chain. Only legal
        while the MFU holds no vector of a chain.
    config : ``In(host.spec.mfu.mfu_layout(cfg))``
    length : ``In(cfg.length_bits)``, ``lanes_last`` : ``In(cfg.lanes_bits)``
        In native vectors and lanes of ``n``, as the chain encoding has them.
    vrf_w : ``In(stream.Signature(mfu_vrf_write_layout(cfg)))``
        One beat written per transfer; ``ready`` is always 1.
    overflow, nan_created : ``Out(cfg.counter_bits)``
    clear : ``In(1)``
    pending : ``Out(1)``

    Raises
    ------
    TypeError
        ``cfg`` is not an :class:`host.spec.mfu.MfuConfig`, ``index`` not an integer.
    ValueError
        ``index`` out of range.
    """

    def __init__(self, cfg, index: int = 0):
        super().__init__(cfg, index=index)

    def _check(self, cfg, *, index):
        self._index = check_int("index", index, 0, cfg.mfus - 1)

    @property
    def units(self) -> tuple:
        """The units this MFU builds (``cfg.units(index)``)."""
        return self._cfg.units(self._index)

    @staticmethod
    def _members(cfg):
        return {
            "i_stream": In(stream.Signature(vector_layout(cfg), always_ready=True)),
            "o_stream": Out(stream.Signature(vector_layout(cfg), always_ready=True)),
            "start": In(1),
            "config": In(mfu_layout(cfg)),
            "length": In(cfg.length_bits),
            "lanes_last": In(cfg.lanes_bits),
            "vrf_w": In(stream.Signature(mfu_vrf_write_layout(cfg))),
            "overflow": Out(cfg.counter_bits),
            "nan_created": Out(cfg.counter_bits),
            "clear": In(1),
            "pending": Out(1),
        }

    def elaborate(self, platform):
        m = Module()
        cfg = self._cfg
        vec = vector_layout(cfg)
        built = self.units
        # Crossbar sources that exist: the MFU input (0) and the outputs of the units
        # built (1 + code); a select bit of any other source is a constant 0.
        live = [0] + [1 + u.value for u in built]

        def source_bit(s, bit):
            return bit if s in live else Const(0, 1)

        # --- chain configuration: decoded into one-hot crossbar selects at start --------
        # used_k: slot k and every slot before it are used (the used slots are a prefix).
        cfg_in = self.config
        used, prefix = [], 1
        for k in range(UNITS):
            prefix = prefix & cfg_in.order[k].used
            used.append(prefix)
        slot_is = [[used[k] & (cfg_in.order[k].unit == u) for u in MfuUnit]
                   for k in range(UNITS)]
        # src_sel[u][s]: unit u takes source s; out_sel[s]: the MFU output takes s.
        src_sel = [Signal(_SOURCES, name=f"sel_{u.name.lower()}") for u in MfuUnit]
        out_sel = Signal(_SOURCES, name="sel_out")
        use_now = [_any(slot_is[k][u.value] for k in range(UNITS)) for u in MfuUnit]
        addsub_op = Signal(BinaryOp, name="addsub_op")
        act_op = Signal(UnaryOp, name="act_op")
        reduce_op = Signal(ReduceOp, name="reduce_op")
        length = Signal(cfg.length_bits, name="length")
        # REDUCE's lane mask on the chain's last vector (n bits, whatever the beats),
        # decoded here once per chain.
        last_keep = Signal(cfg.n, name="reduce_last_keep")
        with m.If(self.start):
            for u in built:
                bits = [slot_is[0][u.value]]
                bits += [source_bit(s, _any(slot_is[k][u.value] & slot_is[k - 1][s - 1]
                                            for k in range(1, UNITS)))
                         for s in range(1, _SOURCES)]
                m.d.sync += src_sel[u.value].eq(Cat(*bits))
            last_slot = [used[k] & (~used[k + 1] if k + 1 < UNITS else 1)
                         for k in range(UNITS)]
            out_bits = [~used[0]] + [source_bit(s, _any(last_slot[k] & slot_is[k][s - 1]
                                                        for k in range(UNITS)))
                                     for s in range(1, _SOURCES)]
            m.d.sync += [
                out_sel.eq(Cat(*out_bits)),
                addsub_op.eq(cfg_in.addsub_op),
                act_op.eq(cfg_in.act_op),
                reduce_op.eq(cfg_in.reduce_op),
                length.eq(self.length),
                last_keep.eq(Cat(self.lanes_last > i for i in range(cfg.n))),
            ]

        # --- units (those of the unit set) --------------------------------------------------
        make = {
            # Each Fp16Binary is built with the ops it can be given: ADDSUB has no
            # multiplier (host.spec.mfu refuses MUL on it), MUL nothing but one.
            MfuUnit.ADDSUB: lambda: Fp16Binary(lanes=cfg.lanes, ops=_ADDSUB_OPS),
            MfuUnit.MUL: lambda: Fp16Binary(lanes=cfg.lanes, ops=(BinaryOp.MUL,)),
            MfuUnit.ACT: lambda: Fp16Unary(lanes=cfg.lanes, ops=cfg.unary_ops),
            # Its items are beats: max_length native vectors are max_length * beats.
            MfuUnit.REDUCE: lambda: Fp16Reduce(lanes=cfg.lanes,
                                               max_length=cfg.max_length * cfg.beats),
        }
        units = {u: make[u]() for u in built}
        for u, unit in units.items():
            m.submodules[u.name.lower()] = unit

        # No back-pressure inside the MFU: every unit's output is always taken, so the
        # units never stall (their stall logic is constant) and no ready net runs from
        # one unit back across the die to the lanes of another (the ready paths were
        # the critical paths of every earlier form, docs/mfu.md section 10). The pipeline
        # keeps the chain's vectors within what its output queue holds.
        for unit in units.values():
            m.d.comb += unit.o_stream.ready.eq(1)

        # Crossbar sources: (valid, values) of the MFU input and each unit output.
        def out_values(u):
            p = units[u].o_stream.payload
            return p.values if u is MfuUnit.REDUCE else p.result
        src_valid = {0: self.i_stream.valid}
        src_values = {0: self.i_stream.payload}
        for u in built:
            src_valid[1 + u.value] = units[u].o_stream.valid
            src_values[1 + u.value] = out_values(u)

        def crossbar(name, sel, sources):
            """The selected source's valid and values (AND-OR over the one-hot select)."""
            valid = Signal(name=f"{name}_valid")
            values = Signal(vec, name=f"{name}_values")
            m.d.comb += [
                valid.eq(_any(sel[s] & src_valid[s] for s in sources)),
                values.eq(_any(Mux(sel[s], src_values[s].as_value(), 0) for s in sources)),
            ]
            return valid, values

        # MFU output.
        o_valid, o_values = crossbar("out", out_sel, live)
        m.d.comb += [self.o_stream.valid.eq(o_valid), self.o_stream.payload.eq(o_values)]

        # Unit inputs: crossbar, (ADDSUB, MUL) the VRF operand join, then the input
        # register, which holds the unit's whole input payload, so each unit's first
        # stage starts from registers and no combinational path runs from one unit into
        # another (ADDSUB can feed MUL and MUL ADDSUB). The operand is always there when
        # the vector is (the read-ahead keeps one per cycle flowing once the first is in,
        # and MfuPipeline offers a chain's first vector no earlier than that).
        for u, unit in units.items():
            name = u.name.lower()
            inp = unit.i_stream
            # A unit never takes its own output.
            x_valid, x_values = crossbar(f"{name}_in", src_sel[u.value],
                                         [s for s in live if s != 1 + u.value])
            payload = Signal(inp.payload.shape(), name=f"{name}_in_payload")
            if u in (MfuUnit.ADDSUB, MfuUnit.MUL):
                head = self._vrf_reader(m, name, VrfBank(u.value), use_now[u.value],
                                        x_valid)
                m.d.comb += [
                    payload.a.eq(x_values),
                    payload.b.eq(head),
                    payload.op.eq(addsub_op if u is MfuUnit.ADDSUB else BinaryOp.MUL),
                ]
            elif u is MfuUnit.ACT:
                m.d.comb += [payload.x.eq(x_values), payload.op.eq(act_op)]
            else:
                # The reduction needs `last` on the chain's last beat: count them. Beat
                # `b` of the last vector keeps its slice of the vector's mask (the beat
                # is the count's low bits); the mux is in front of the input register.
                count = Signal(cfg.length_bits + cfg.beat_bits, name="reduce_in_count")
                last = Signal(name="reduce_in_last")
                ones = (1 << cfg.lanes) - 1
                if cfg.beats == 1:
                    m.d.comb += last.eq(count == length - 1)
                    keep = Mux(last, last_keep, ones)
                else:
                    beat = count[:cfg.beat_bits]
                    last_vector = Signal(name="reduce_in_last_vector")
                    m.d.comb += [
                        last_vector.eq(count[cfg.beat_bits:] == length - 1),
                        last.eq(last_vector & beat.all()),
                    ]
                    keep = Mux(last_vector, last_keep.word_select(beat, cfg.lanes), ones)
                m.d.comb += [
                    payload.values.eq(x_values),
                    payload.op.eq(reduce_op),
                    payload.last.eq(last),
                    # A bit per lane, so that the input register holds one flip-flop per
                    # lane for Fp16Reduce's mask (hw.arith.fp16_reduce.input_layout).
                    payload.keep.eq(keep),
                ]
                with m.If(x_valid):
                    m.d.sync += count.eq(Mux(last, 0, count + 1))
                with m.If(self.start):
                    m.d.sync += count.eq(0)
            for stage in range(INPUT_STAGES):
                in_valid = Signal(name=f"{name}_in_valid{stage}")
                in_payload = Signal(inp.payload.shape(), name=f"{name}_in_reg{stage}",
                                    reset_less=True)
                m.d.sync += [in_valid.eq(x_valid), in_payload.eq(payload)]
                x_valid, payload = in_valid, in_payload
            m.d.comb += [inp.valid.eq(x_valid), inp.payload.eq(payload)]

        if not {MfuUnit.ADDSUB, MfuUnit.MUL} & set(built):
            m.d.comb += self.vrf_w.ready.eq(1)      # no VRF: writes are dropped
        self._counters(m, units)
        return m

    def _vrf_reader(self, m, name, bank, use_now, pop):
        """The VRF ``bank``, its write port, and the read-ahead reader of one chain.

        Returns ``head``: the operand of the unit's next vector, there from the second
        cycle after ``start`` on and then whenever a vector comes (the MFU's contract).
        ``use_now`` (valid with ``start``) says whether the chain uses the unit; ``pop`` is
        high when the head is taken.
        """
        cfg = self._cfg
        vec = vector_layout(cfg)
        # One beat per word, the beats of a vector at consecutive addresses (Cat(beat,
        # addr)): the reader takes one beat a cycle, straight into the ring registers.
        mem = Memory(shape=vec, depth=cfg.vrf_depth * cfg.beats, init=[])
        m.submodules[f"{name}_vrf"] = mem
        wp = mem.write_port()
        rp = mem.read_port(domain="sync", transparent_for=())
        w = self.vrf_w
        m.d.comb += [
            w.ready.eq(1),
            wp.addr.eq(w.payload.addr),
            wp.data.eq(w.payload.values),
            wp.en.eq(w.valid & (w.payload.bank == bank)),
        ]

        # Reads left to issue, next (beat) address, a read in flight, buffered operands.
        todo = Signal(cfg.length_bits + cfg.beat_bits, name=f"{name}_todo")
        addr = Signal(cfg.addr_bits + cfg.beat_bits, name=f"{name}_rd_addr")
        in_flight = Signal(name=f"{name}_in_flight")
        count = Signal(range(OPERAND_ENTRIES + 1), name=f"{name}_buffered")
        entries = [Signal(vec, name=f"{name}_operand{k}", reset_less=True)
                   for k in range(OPERAND_ENTRIES)]
        # The first read is issued in the cycle the chain is taken, straight from the
        # configuration input (the previous chain has issued all of its reads). The
        # memory reads on every `start`, used or not: only whether the word enters the
        # ring (`first`) depends on the chain's decode, so the read enable, which loads
        # the whole read-data register, is `start` and registers only (the decode in
        # front of it was the critical path once the ready nets were gone).
        first = Signal(name=f"{name}_first")
        base = _in_beats(cfg, self.config.addsub_addr if bank is VrfBank.ADDSUB
                         else self.config.mul_addr)
        # `issue` (a read of addr + 1, addr + 2, ...) is a register holding what
        # (todo != 0) & (count + in_flight < OPERAND_ENTRIES) will be, computed from the
        # next values of those registers: it enables the counters here and the read-data
        # register by the block RAM, and as logic between them it put two long routes in
        # one cycle. Two copies (`keep`), one for each end.
        # `count` learns of a pop a cycle late, from `pop_seen`: `pop` comes from the
        # crossbar's valid (possibly across the die), and through `count_next` into
        # `issue`, placed by the block RAM, it was the core's critical path. So `count`
        # is the operands buffered plus the one popped in the cycle before: in a cycle
        # with a pop the condition is the one of OPERAND_BUFFER on the true count (reads
        # are issued in the same cycles while beats flow), in a pause the reader reads
        # one operand further ahead, which the ring's extra entry holds.
        issue = Signal(name=f"{name}_issue", attrs={"keep": 1})
        issue_mem = Signal(name=f"{name}_issue_mem", attrs={"keep": 1})
        todo_next = Signal.like(todo, name=f"{name}_todo_next")
        in_flight_next = Signal(name=f"{name}_in_flight_next")
        push = in_flight
        pop_seen = Signal(name=f"{name}_pop_seen")
        m.d.sync += pop_seen.eq(pop)
        count_next = Signal.like(count, name=f"{name}_buffered_next")
        issue_next = Signal(name=f"{name}_issue_next")
        m.d.comb += [
            first.eq(self.start & use_now),
            todo_next.eq(Mux(self.start, Mux(use_now, _in_beats(cfg, self.length) - 1, 0),
                             Mux(issue, todo - 1, todo))),
            in_flight_next.eq(issue | first),
            count_next.eq(count - pop_seen + push),
            issue_next.eq((todo_next != 0) & (count_next + in_flight_next < OPERAND_ENTRIES)),
            rp.addr.eq(Mux(self.start, base, addr)),
            rp.en.eq(issue_mem | self.start),
        ]
        m.d.sync += [todo.eq(todo_next), in_flight.eq(in_flight_next), count.eq(count_next),
                     issue.eq(issue_next), issue_mem.eq(issue_next)]
        with m.If(self.start):
            m.d.sync += addr.eq(base + 1)
        with m.Elif(issue):
            m.d.sync += addr.eq(addr + 1)

        # The buffer: a ring. A push writes the entry at `wr`, a pop only moves `rd` on.
        # The entries' enables depend on registers only, and `pop` (which comes from the
        # crossbar's valid, possibly from across the die) reaches a few flip-flops, not
        # the enables of every entry (a shifting buffer's pop was the critical path).
        # Each entry's enable is a register of its own, computed from the next values of
        # `push` and `wr` (the same value, a cycle earlier): decoded from `wr` in front of
        # the entry's 16n clock enables, it was the critical path once the unit inputs had
        # two registers (docs/mfu.md section 10).
        wr = Signal(range(OPERAND_ENTRIES), name=f"{name}_wr")
        rd = Signal(range(OPERAND_ENTRIES), name=f"{name}_rd")
        wr_next = Signal.like(wr, name=f"{name}_wr_next")
        m.d.comb += wr_next.eq(Mux(push, Mux(wr == OPERAND_ENTRIES - 1, 0, wr + 1), wr))
        m.d.sync += wr.eq(wr_next)
        for k, entry in enumerate(entries):
            load = Signal(name=f"{name}_load{k}")
            m.d.sync += load.eq(in_flight_next & (wr_next == k))
            with m.If(load):
                m.d.sync += entry.eq(rp.data)
        with m.If(pop):
            m.d.sync += rd.eq(Mux(rd == OPERAND_ENTRIES - 1, 0, rd + 1))
        head = Signal(vec, name=f"{name}_head")
        m.d.comb += head.eq(entries[-1])
        for k in reversed(range(OPERAND_ENTRIES - 1)):
            with m.If(rd == k):
                m.d.comb += head.eq(entries[k])
        return head

    def _counters(self, m, units):
        """Per-unit event flags (registered), their counts (registered), the sum of the
        counts (registered), the counters."""
        cfg = self._cfg
        stages, pending = {"overflow": [], "nan_created": []}, []
        lane_units = [u for u in (MfuUnit.ADDSUB, MfuUnit.MUL, MfuUnit.ACT) if u in units]
        for u in lane_units:
            o = units[u].o_stream
            taken = o.valid & o.ready
            for kind in stages:
                # The flags come from every lane's output register, across the unit's
                # spread: registered first, so that the route and the popcount are not
                # in one cycle (together they were the critical path, 10.0 ns).
                flags = Signal(cfg.lanes, name=f"{u.name.lower()}_{kind}_flags")
                m.d.sync += flags.eq(Mux(taken, getattr(o.payload, kind).as_value(), 0))
                count = Signal(range(cfg.lanes + 1), name=f"{u.name.lower()}_{kind}_events")
                m.d.sync += count.eq(_popcount(flags[i] for i in range(cfg.lanes)))
                stages[kind].append(count)
                pending += [flags.any(), count != 0]
        red = units.get(MfuUnit.REDUCE)
        events = len(lane_units) * cfg.lanes + 1      # bound of one cycle's events
        if red is not None:
            stages["overflow"].append(red.overflow_events)
            stages["nan_created"].append(red.nan_events)
            pending += [red.overflow_events != 0, red.nan_events != 0]
            events += 2 ** len(red.overflow_events) - 1
        top = cfg.counter_max
        for kind, counts in stages.items():
            total = Signal(range(events), name=f"{kind}_events")
            m.d.sync += total.eq(sum(counts))
            pending.append(total != 0)
            counter = getattr(self, kind)
            new = counter + total
            with m.If(self.clear):
                m.d.sync += counter.eq(0)
            with m.Else():
                m.d.sync += counter.eq(Mux(new[cfg.counter_bits:].any(), top,
                                           new[:cfg.counter_bits]))
        m.d.comb += self.pending.eq(_any(pending))


def _any(values):
    """OR of Amaranth values (0 for none)."""
    result = 0
    for v in values:
        result = result | v
    return result


class MfuPipeline(_Configured):
    """``cfg.mfus`` MFUs in series (MFU ``m``'s output feeds MFU ``m + 1``'s input).

    A chain is configured through ``chain`` (a :func:`host.spec.mfu.chain_layout` word,
    :func:`host.spec.mfu.encode_chain`), then exactly ``L = length`` native vectors enter
    through ``i_stream`` and ``L`` results leave through ``o_stream``, ``last`` on the
    final one. Both streams carry beats of ``cfg.lanes`` lanes (:class:`Mfu`): a native
    vector is ``cfg.beats`` transfers in lane order (``x.reshape(-1, lanes)``), and
    ``last`` is on the final beat. Results are those of
    :func:`host.model.mfu.run_chain`, bit for bit, for every ``lanes``; the counters
    those of :class:`host.model.mfu.MfuCounters`.

    **Drain.** ``chain`` is taken only when the previous chain has fully left ``o_stream``
    (``chain.ready`` is a register, high while no chain is active): chains do not overlap,
    so the units, the crossbar selects and the VRF readers change only when empty. The
    cost is the fill latency of every chain (``docs/mfu.md``); a later version may overlap
    chains. ``i_stream.ready`` is low outside a chain and after its ``L``-th vector,
    and in the cycle after acceptance when the chain's first op reads a VRF (the
    :class:`Mfu` contract).

    ``vrf_w`` writes one beat into the AddSubVrf (``bank`` 0) or MulVrf (1) of MFU
    ``mfu``, at a beat address (:func:`host.spec.mfu.vrf_write_layout`: one native
    vector is ``cfg.beats`` writes); it is always ready. MFU ``m`` builds the units
    ``cfg.units(m)`` only (:class:`Mfu`); a write to a VRF that its unit set leaves out is
    dropped. The VRF readers of a chain start reading at ``chain`` acceptance: write a
    chain's operands before its configuration.

    **Output queue.** The MFUs have no back-pressure, so the last MFU's output goes into
    a queue of ``max_length * beats`` beats (a memory ring) in front of a two-register
    buffer: a chain never has more than ``L * beats <= max_length * beats`` beats in the
    pipeline, so whatever ``o_stream``'s stalls, nothing is lost. While the buffer can
    take a beat and the ring is empty, a beat goes straight into the buffer, in one
    cycle, as without the ring. ``o_stream.valid`` and its payload are registers and
    ``o_stream.ready`` reaches no MFU.

    Parameters
    ----------
    cfg : host.spec.mfu.MfuConfig

    Attributes
    ----------
    chain : ``In(stream.Signature(host.spec.mfu.chain_layout(cfg)))``
    i_stream : ``In(stream.Signature(vector_layout(cfg)))``
    o_stream : ``Out(stream.Signature(output_layout(cfg)))``
    vrf_w : ``In(stream.Signature(host.spec.mfu.vrf_write_layout(cfg)))``
    overflow, nan_created : ``Out(ArrayLayout(unsigned(cfg.counter_bits), cfg.mfus))``
        The counters of each MFU.
    clear : ``In(1)``
        Sets every counter to 0 (clear while ``busy`` is low for a defined result).
    busy : ``Out(1)``
        High from the acceptance of a chain until its last vector has left ``o_stream``
        and all its events are in the counters.

    Raises
    ------
    TypeError
        ``cfg`` is not an :class:`host.spec.mfu.MfuConfig`.
    """

    @staticmethod
    def _members(cfg):
        counters = data.ArrayLayout(unsigned(cfg.counter_bits), cfg.mfus)
        return {
            "chain": In(stream.Signature(chain_layout(cfg))),
            "i_stream": In(stream.Signature(vector_layout(cfg))),
            "o_stream": Out(stream.Signature(output_layout(cfg))),
            "vrf_w": In(stream.Signature(vrf_write_layout(cfg))),
            "overflow": Out(counters),
            "nan_created": Out(counters),
            "clear": In(1),
            "busy": Out(1),
        }

    def elaborate(self, platform):
        m = Module()
        cfg = self._cfg
        mfus = [Mfu(cfg, k) for k in range(cfg.mfus)]
        for k, mfu in enumerate(mfus):
            m.submodules[f"mfu{k}"] = mfu

        # --- chain acceptance ------------------------------------------------------------
        active = Signal()
        # The chain's length and both counts in beats (native vectors when lanes == n).
        length = Signal(cfg.length_bits + cfg.beat_bits)
        in_count = Signal(cfg.length_bits + cfg.beat_bits)
        out_count = Signal(cfg.length_bits + cfg.beat_bits)
        start = Signal()
        chain = self.chain.payload
        m.d.comb += [self.chain.ready.eq(~active), start.eq(self.chain.valid & ~active)]
        for k, mfu in enumerate(mfus):
            m.d.comb += [
                mfu.start.eq(start),
                mfu.config.eq(chain.mfu[k]),
                mfu.length.eq(chain.length),
                mfu.lanes_last.eq(chain.lanes_last),
                mfu.clear.eq(self.clear),
                self.overflow[k].eq(mfu.overflow),
                self.nan_created[k].eq(mfu.nan_created),
            ]
        with m.If(start):
            m.d.sync += [active.eq(1), length.eq(_in_beats(cfg, chain.length)),
                         in_count.eq(0), out_count.eq(0)]

        # --- input: exactly `length` beats per chain --------------------------------------
        # The MFUs take a vector whenever one comes. The chain's first op that reads a
        # VRF has its first operand from the second cycle after acceptance on: if that is
        # the chain's first op (in the first MFU that has ops), the input opens a cycle
        # later, as the operand join's stall did when the MFUs had ready.
        first_vrf, before = 0, 1
        for k in range(cfg.mfus):
            slot0 = chain.mfu[k].order[0]
            reads = (slot0.unit == MfuUnit.ADDSUB) | (slot0.unit == MfuUnit.MUL)
            first_vrf = first_vrf | (before & slot0.used & reads)
            before = before & ~slot0.used
        #
        # So the input is open while the chain is active, not in that one cycle, and until
        # `length` beats are in. `open_` is that condition as a register, loaded a cycle
        # ahead, so that the input's ready, which fans out across the MFUs, starts at a
        # flip-flop rather than at a compare (the core's critical path,
        # docs/notes/2026-11-28-core-timing-closure.md section 9). `active` cannot fall
        # while beats are still to come; a chain the encoding allows has length >= 1.
        first = mfus[0].i_stream
        open_ = Signal()
        with m.If(start):
            m.d.sync += open_.eq(~first_vrf & chain.length.any())
        with m.Elif(first.valid):
            m.d.sync += open_.eq(in_count + 1 != length)
        with m.Else():
            m.d.sync += open_.eq(active & (in_count != length))
        m.d.comb += [
            first.valid.eq(self.i_stream.valid & open_),
            first.payload.eq(self.i_stream.payload),
            self.i_stream.ready.eq(open_),
        ]
        with m.If(first.valid):
            m.d.sync += in_count.eq(in_count + 1)
        for prev, nxt in zip(mfus, mfus[1:]):
            wiring.connect(m, prev.o_stream, nxt.i_stream)

        # --- output queue, `last`, end of chain --------------------------------------------
        # A chain has at most max_length * beats beats in the pipeline (the next is taken
        # only when the last has left), so a queue of that many holds whatever the MFUs
        # emit while o_stream is stalled.
        last_mfu = mfus[-1].o_stream
        o_valid, o_values = _queue(m, "out_queue", vector_layout(cfg).size,
                                   cfg.max_length * cfg.beats, last_mfu.valid,
                                   last_mfu.payload, self.o_stream.ready)
        final = out_count == length - 1
        m.d.comb += [
            self.o_stream.valid.eq(o_valid),
            self.o_stream.payload.values.eq(o_values),
            self.o_stream.payload.last.eq(final),
        ]
        with m.If(self.o_stream.valid & self.o_stream.ready):
            m.d.sync += out_count.eq(out_count + 1)
            with m.If(final):
                m.d.sync += active.eq(0)

        # --- VRF writes --------------------------------------------------------------------
        w = self.vrf_w
        m.d.comb += w.ready.eq(1)
        for k, mfu in enumerate(mfus):
            m.d.comb += [
                mfu.vrf_w.valid.eq(w.valid & (w.payload.mfu == k)),
                mfu.vrf_w.payload.bank.eq(w.payload.bank),
                mfu.vrf_w.payload.addr.eq(w.payload.addr),
                mfu.vrf_w.payload.values.eq(w.payload.values),
            ]

        m.d.comb += self.busy.eq(active | _any(mfu.pending for mfu in mfus))
        return m
