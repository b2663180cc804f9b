"""Tile engine of the matrix-vector multiplier: N dot-product engines and their MRF slice.

See ``docs/mvm.md`` for the architecture and ``docs/numerics.md`` (sections 4 and 5) for
the arithmetic these modules implement bit for bit.

Besides :class:`DotProductEngine` and :class:`TileEngine` this module holds the small
building blocks the MVM's other modules share: the narrow-width fit test
(:func:`not_fits`, :func:`fit_thermometer`), popcount, a pipelined adder tree, a wide OR
(:func:`or_all`) and the shift that places a tile product on the accumulator grid
(:func:`shift_offset`).
"""

import functools
import operator

from amaranth.hdl import Cat, Const, Module, Mux, Shape, Signal, signed
from amaranth.lib import data, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from host.spec.config import MvmConfig
from host.spec.formats import E8M0_BIAS, block_layout, check_int

from hw.arith.dsp import (
    DSP_WIDTH, has_ecp5_dsp, pair_fits, registered_product, registered_product_pair,
)
from hw.ram import READ_COLLISION_UNUSED

__all__ = [
    "DotProductEngine", "TileEngine", "check_dsp_options", "shift_offset", "shift_range",
    "shift_shape", "fit_thermometer", "not_fits", "popcount", "pipelined_sum", "sum_stages",
    "or_all",
    "NARROW_WIDTH_BITS", "TREE_LEVELS_PER_STAGE",
]

#: Bits of the run-time narrow-accumulator width ``k`` (1..64) as it travels with a command.
NARROW_WIDTH_BITS = 7

#: Adder-tree levels between two pipeline registers in a dot-product engine. Two levels of
#: small adders (at most 11 bits at N = 16, m = 4) plus a fit test stay well inside 10 ns
#: on ECP5; see ``docs/mvm.md``.
TREE_LEVELS_PER_STAGE = 2


def _check_config(config):
    if not isinstance(config, MvmConfig):
        raise TypeError(f"config must be an MvmConfig, not {config!r}")
    return config


def check_dsp_options(config, dsp_lanes, dsp_packing):
    """Validate :class:`TileEngine`'s (and ``hw.mvm.mvm.Mvm``'s) DSP options; return them.

    Raises ``TypeError`` for a non-integer and ``ValueError`` for ``dsp_lanes`` outside
    0..n, ``dsp_packing`` not 1 or 2, or ``dsp_packing = 2`` with mantissa widths whose
    packed operand does not fit a MULT18X18D (:func:`hw.arith.dsp.pair_fits`).
    """
    dsp_lanes = check_int("dsp_lanes", dsp_lanes, 0, config.n)
    dsp_packing = check_int("dsp_packing", dsp_packing, 1, 2)
    mv, mw = config.mantissa_bits_v, config.mantissa_bits_w
    if dsp_packing == 2 and not pair_fits(signed(mv), signed(mw)):
        raise ValueError(
            f"dsp_packing 2 needs mantissa_bits_v + 2 * mantissa_bits_w + 1 <= {DSP_WIDTH} "
            f"(two products on one MULT18X18D), not {mv} + 2 * {mw} + 1 = {mv + 2 * mw + 1}")
    return dsp_lanes, dsp_packing


def shift_offset(config: MvmConfig) -> int:
    """Constant ``K`` with ``s = code_v + code_w - K`` the left shift of a tile product.

    A tile product of exponent ``E = e_v + e_w - (m_v - 2) - (m_w - 2)`` lands on the
    accumulator grid (LSB weight ``2**L``, ``L = config.acc_lsb``) shifted left by
    ``s = E - L``; with E8M0 codes ``e = code - 127`` that is ``code_v + code_w - K``,
    ``K = 2*127 + (m_v - 2) + (m_w - 2) + L`` (206 for every mantissa width, since
    ``L`` moves with them).
    """
    return (2 * E8M0_BIAS + (config.mantissa_bits_v - 2) + (config.mantissa_bits_w - 2)
            + config.acc_lsb)


def shift_range(config: MvmConfig) -> tuple[int, int]:
    """Smallest and largest ``code_v + code_w - shift_offset`` for any two 8-bit codes."""
    k = shift_offset(config)
    return -k, 2 * 255 - k


def shift_shape(config: MvmConfig) -> Shape:
    """Signed shape holding every shift of :func:`shift_range`."""
    lo, hi = shift_range(config)
    return Shape.cast(range(lo, hi + 1))


def fit_thermometer(k, width):
    """``width`` bits, bit ``b`` set iff ``b >= k - 1``: the bits a value must not use.

    A signed value fits ``k`` bits iff, XORed with its own sign, it has no set bit at or
    above place ``k - 1`` (:func:`not_fits`). ``k`` is a 1..64 run-time value.
    """
    return Cat(*[(k <= b + 1) for b in range(width)])


def not_fits(value, therm):
    """1 when signed ``value`` is outside ``[-2**(k-1), 2**(k-1) - 1]``.

    ``therm`` is :func:`fit_thermometer` of ``k``, at least ``len(value) - 1`` bits wide.
    ``value ^ sign`` has a set bit at place ``p >= k - 1`` exactly when the value needs
    more than ``k`` bits of two's complement; one AND-OR per bit, no comparator.
    """
    width = len(value)
    if width < 2:
        return Const(0, 1)
    sign = value[width - 1]
    return ((value[:width - 1] ^ sign.replicate(width - 1)) & therm[:width - 1]).any()


def popcount(bits):
    """Number of set bits of a sequence of 1-bit values, as a balanced adder tree."""
    level = list(bits)
    if not level:
        return Const(0, 1)
    while len(level) > 1:
        nxt = [level[i] + level[i + 1] for i in range(0, len(level) - 1, 2)]
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
    return level[0]


def sum_stages(count, levels_per_stage=1):
    """Register stages :func:`pipelined_sum` takes for ``count`` values."""
    return -(-ceil_log2(count) // levels_per_stage) if count > 1 else 0


def pipelined_sum(m, values, name, levels_per_stage=1):
    """Sum ``values`` through a balanced adder tree with a register after every
    ``levels_per_stage`` levels (and after the last).

    Returns ``(sum, stages)``: the registered sum and the number of register stages
    (:func:`sum_stages`; 0 for a single value, which is returned as is). Unsigned or
    signed alike; each level widens by one bit, so nothing overflows. A popcount is the
    sum of 1-bit values.
    """
    level = list(values)
    stages = depth = 0
    while len(level) > 1:
        nxt = [level[j] + level[j + 1] for j in range(0, len(level) - 1, 2)]
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
        depth += 1
        if depth == levels_per_stage or len(level) == 1:
            regs = []
            for j, v in enumerate(level):
                r = Signal(Shape.cast(v.shape()), name=f"{name}_l{stages}_{j}")
                m.d.sync += r.eq(v)
                regs.append(r)
            level = regs
            stages += 1
            depth = 0
    assert stages == sum_stages(len(values), levels_per_stage)
    return level[0], stages


class DotProductEngine(wiring.Component):
    """One dot-product engine: exact integer dot product of two BFP blocks, pipelined.

    Free running (no stall, no valid): every cycle it takes a weight block and a vector
    block and, :attr:`dot_latency` cycles later, presents

    * ``dot = sum_j qv[j] * qw[j]`` (exact, ``config.dot_bits`` signed bits), summed by a
      balanced pairwise tree in lane order (level 1 adds lanes (0,1), (2,3), ...), with
      two registers after the products (:attr:`PRODUCT_STAGES`) and one after every
      :data:`TREE_LEVELS_PER_STAGE` levels;
    * ``shift = code_v + code_w - shift_offset(config)``: the left shift that places
      ``dot`` on the BFP-long grid (negative: right shift with floor);

    and, :attr:`narrow_latency` cycles after the blocks, ``narrow``: how many of the
    ``N`` products and ``N - 1`` tree nodes do not fit a ``k``-bit signed integer
    (``docs/numerics.md`` section 5, rules 1 and 2). Each value is tested from a register
    (:meth:`flag_plan`), and the tests are counted by a pipelined popcount. A block pair
    that does not take part in a product is fed as an all-zero vector, which makes every
    value 0, and 0 fits any ``k >= 1``: no valid bit is needed to keep the count exact.

    **Reset.** The data registers (products, tree sums, ``shift``) have no reset; the
    caller qualifies ``dot`` and ``shift`` with valid bits of its own. The thermometer's
    registers, the fit-test flags and the counts have one, so a value loaded before a
    reset travels with the reset thermometer (0: every value fits) and ``narrow`` counts
    nothing for it. At power-on every register holds its initial value, 0.

    **DSP blocks.** Elaborated for an ECP5 (:func:`hw.arith.dsp.has_ecp5_dsp`), the products
    of lanes ``0 .. dsp_lanes - 1`` are each a MULT18X18D (:func:`hw.arith.dsp.registered_product`)
    whose input registers stand for the caller's registers of ``weights`` and ``vector``
    (so they take ``weights_next`` and ``vector_next``, the values those registers load)
    and whose output register is the product register: same stage, same result. Each
    takes 27 LUT4 sites of the fabric's Booth product off the fabric (``docs/mvm.md``
    section 11). Without an ECP5 these lanes are in the fabric and
    ``weights_next``/``vector_next`` are unused.

    **Without the check.** With ``config.narrow_check`` False the engine has no fit
    test, thermometer register or count: ``therm`` is unused and ``narrow`` is always 0
    (``dot``, ``shift`` and their latency are unchanged).

    **Products from outside.** Or the products of lanes ``0 .. outer_lanes - 1`` are
    not formed here: the caller gives them in ``lane_products``, in the cycle this
    engine's own product registers take theirs (one cycle after the blocks).
    :class:`TileEngine` does so for two products per DSP (``docs/dsp.md``).

    Parameters
    ----------
    config : MvmConfig
    dsp_lanes : int, 0..n, default 0
        Products formed on DSP blocks when elaborated for an ECP5.
    outer_lanes : int, 0..n, default 0
        Lanes whose products come from ``lane_products``; not with ``dsp_lanes``.

    Attributes
    ----------
    weights : ``In(block_layout(n, mantissa_bits_w))``
        The weight block (one MRF word), registered by the caller.
    vector : ``In(block_layout(n, mantissa_bits_v))``
        The vector block, registered by the caller (all zero when not in use).
    weights_next, vector_next : ``In(block_layout(...))``
        Only with ``dsp_lanes > 0``: what the caller's registers of ``weights`` and
        ``vector`` load this cycle.
    lane_products : ``In(ArrayLayout(signed(config.product_bits), outer_lanes))``
        Only with ``outer_lanes > 0``: ``vector.mantissas[j] * weights.mantissas[j]`` of
        the blocks of the previous cycle, for ``j < outer_lanes`` (the low
        ``product_bits`` bits, as the fabric form takes them).
    therm : ``In(config.dot_bits - 1)``
        :func:`fit_thermometer` of the narrow width ``k``, sampled with the blocks.
    dot : ``Out(signed(config.dot_bits))``
    shift : ``Out(shift_shape(config))``
    narrow : ``Out(range(2 * n))``
        Events of the block pair taken :attr:`narrow_latency` cycles earlier.
    dot_latency, narrow_latency : int
        Cycles from ``weights``/``vector`` to ``dot``/``shift`` and to ``narrow``.
    """

    def __init__(self, config, *, dsp_lanes=0, outer_lanes=0):
        self._config = _check_config(config)
        c = config
        self._dsp_lanes = check_int("dsp_lanes", dsp_lanes, 0, c.n)
        self._outer_lanes = check_int("outer_lanes", outer_lanes, 0, c.n)
        if self._dsp_lanes and self._outer_lanes:
            raise ValueError(f"dsp_lanes ({dsp_lanes}) and outer_lanes ({outer_lanes}) "
                             f"cannot both be set")
        self._tree_stages = self.tree_stages(c)
        ports = {
            "weights": In(block_layout(c.n, c.mantissa_bits_w)),
            "vector": In(block_layout(c.n, c.mantissa_bits_v)),
            "therm": In(c.dot_bits - 1),
            "dot": Out(signed(c.dot_bits)),
            "shift": Out(shift_shape(c)),
            "narrow": Out(range(2 * c.n)),
        }
        if self._dsp_lanes:
            ports["weights_next"] = In(block_layout(c.n, c.mantissa_bits_w))
            ports["vector_next"] = In(block_layout(c.n, c.mantissa_bits_v))
        if self._outer_lanes:
            ports["lane_products"] = In(
                data.ArrayLayout(signed(c.product_bits), self._outer_lanes))
        super().__init__(ports)

    @property
    def dsp_lanes(self):
        """Products formed on DSP blocks when elaborated for an ECP5."""
        return self._dsp_lanes

    @property
    def outer_lanes(self):
        """Lanes whose products come from ``lane_products``."""
        return self._outer_lanes

    @staticmethod
    def tree_stages(config):
        """Register stages of the adder tree: ``ceil(log2(n) / TREE_LEVELS_PER_STAGE)``."""
        return -(-config.log2_n // TREE_LEVELS_PER_STAGE)

    #: Registers of every product before the adder tree: the multiplier's own (a DSP
    #: lane's output register) and one more, which the placer puts beside the tree. A
    #: DSP block sits in the die's DSP rows, and its product took 5.8 ns of routing to
    #: reach its engine's tree in a routed one-engine build (``docs/mvm.md`` section 11);
    #: the fabric lanes get the register too, so that all lanes stay aligned.
    PRODUCT_STAGES = 2

    @classmethod
    def dot_latency_of(cls, config):
        """Cycles from the input blocks to ``dot`` and ``shift``: products + tree stages."""
        return cls.PRODUCT_STAGES + cls.tree_stages(config)

    @property
    def dot_latency(self):
        return self.dot_latency_of(self._config)

    @classmethod
    def flag_plan(cls, config):
        """Fit tests per flag stage: ``plan[s]`` flags are registered ``PRODUCT_STAGES +
        1 + s`` cycles after the input blocks (``s = 0 .. tree_stages``): the inputs of
        tree stage ``s`` (the products, then the previous stage's sums; the dot product
        in the last flag stage) and the sums of every level but the last of tree stage
        ``s - 1``, from registers of their own."""
        width, plan, inner = config.n, [], 0
        levels = config.log2_n
        for stage in range(cls.tree_stages(config)):
            plan.append(width + inner)          # the stage's inputs, the last one's inner sums
            in_stage = min(TREE_LEVELS_PER_STAGE, levels - stage * TREE_LEVELS_PER_STAGE)
            inner = sum(width >> (level + 1) for level in range(in_stage - 1))
            width >>= in_stage
        return plan + [1 + inner]

    @classmethod
    def narrow_latency_of(cls, config):
        """Cycles from the input blocks to ``narrow``: the last flag stage's popcount
        (:meth:`flag_plan`, two adder levels per register), then the sum of the stages'
        counts (a register per level)."""
        plan = cls.flag_plan(config)
        ready = max(s + sum_stages(k, 2) for s, k in enumerate(plan))
        return cls.PRODUCT_STAGES + 1 + ready + sum_stages(len(plan))

    @property
    def narrow_latency(self):
        """Cycles from the input blocks to ``narrow``."""
        return self.narrow_latency_of(self._config)

    def elaborate(self, platform):
        m = Module()
        c = self._config
        n = c.n

        # --- stage 1: the N mantissa products and the block pair's shift -------------
        dsp_lanes = self._dsp_lanes if has_ecp5_dsp(platform) else 0
        values = []
        for j in range(n):
            if j < self._outer_lanes:
                p = self.lane_products[j]
            elif j < dsp_lanes:
                # The DSP's input registers load what the caller's registers load; its
                # output register is this one. The low bits are taken as the fabric
                # form takes them.
                p = Signal(signed(c.product_bits), name=f"product{j}")
                full = registered_product(m, self.vector_next.mantissas[j],
                                          self.weights_next.mantissas[j],
                                          enable=Const(1, 1), name=f"mul{j}")
                m.d.comb += p.eq(full)
            else:
                p = Signal(signed(c.product_bits), name=f"product{j}", reset_less=True)
                m.d.sync += p.eq(self.vector.mantissas[j] * self.weights.mantissas[j])
            # Stage 2: the product once more, beside the tree.
            p2 = Signal(signed(c.product_bits), name=f"product{j}_s2", reset_less=True)
            m.d.sync += p2.eq(p)
            values.append(p2)
        shift = Signal(shift_shape(c), name="shift_s1", reset_less=True)
        m.d.sync += shift.eq(self.vector.exponent + self.weights.exponent - shift_offset(c))
        shift2 = Signal(shift_shape(c), name="shift_s2", reset_less=True)
        m.d.sync += shift2.eq(shift)
        shift = shift2
        # Without the narrow check (MvmConfig.narrow_check) there is no thermometer, no
        # fit test and no count: `narrow` is 0. The registers below are kept
        # (attrs), so they must not be made at all, or synthesis would keep them.
        narrow_check = c.narrow_check
        keep = {"keep": 1}
        therm = None
        if narrow_check:
            # The thermometer is the same in every engine, and Yosys merged these
            # registers across all of them: one register then drove the fit tests of
            # engines across the die (the routed critical path of the T = 2 build at
            # seed 3, docs/mvm.md section 11). Kept, each engine has its own beside its
            # tests.
            therm = Signal(c.dot_bits - 1, name="therm_s1", attrs=keep)
            m.d.sync += therm.eq(self.therm)
            therm2 = Signal(c.dot_bits - 1, name="therm_s2", attrs=keep)
            m.d.sync += therm2.eq(therm)
            therm = therm2

        # --- tree stages: TREE_LEVELS_PER_STAGE levels each, then a register -----------
        # Fit tests (narrow flags): flag stage s registers the tests of stage s's inputs
        # (the products in stage 0, the previous stage's registered sums after; the dot
        # product itself in a last flag stage) and of the sums of every level of stage
        # s - 1 but its last, which are registered for the tests alone. So every test is
        # a LUT tree from registers: one adder and a test in one cycle was the routed
        # critical path of the one-engine build (docs/mvm.md section 11), and two adder
        # levels and a test before that.
        flag_regs = []
        inner = []                               # registered inner sums of the last stage
        first = self.PRODUCT_STAGES + 1          # stage number of the first tree registers

        def flag_stage(stage, tested):
            # The inner sums were registered with this stage's inputs: same blocks, same k.
            if not narrow_check:
                return
            r = Signal(len(tested), name=f"narrow_flags_s{stage + first}")
            m.d.sync += r.eq(Cat(*[not_fits(v, therm) for v in tested]))
            flag_regs.append(r)

        for stage in range(self._tree_stages):
            tested, inner = values + inner, []
            for level in range(TREE_LEVELS_PER_STAGE):
                if len(values) == 1:
                    break
                values = [values[2 * j] + values[2 * j + 1] for j in range(len(values) // 2)]
                if not narrow_check:
                    continue                     # inner sums are registered for tests only
                if level < TREE_LEVELS_PER_STAGE - 1 and len(values) > 1:
                    for j, v in enumerate(values):
                        r = Signal(v.shape(), name=f"inner_s{stage + first}_l{level}_{j}",
                                   reset_less=True)
                        m.d.sync += r.eq(v)
                        inner.append(r)
                elif level < TREE_LEVELS_PER_STAGE - 1:
                    break                         # the last sum: tested from its register
            regs = []
            for j, v in enumerate(values):
                r = Signal(v.shape(), name=f"tree_s{stage + first}_{j}", reset_less=True)
                m.d.sync += r.eq(v)
                regs.append(r)
            values = regs
            flag_stage(stage, tested)
            next_shift = Signal(shift_shape(c), name=f"shift_s{stage + first}",
                                reset_less=True)
            m.d.sync += next_shift.eq(shift)
            shift = next_shift
            if narrow_check:
                next_therm = Signal(c.dot_bits - 1, name=f"therm_s{stage + first}",
                                    attrs=keep)
                m.d.sync += next_therm.eq(therm)
                therm = next_therm
        flag_stage(self._tree_stages, values + inner)     # the dot product, the last inner sums
        m.d.comb += [self.dot.eq(values[0]), self.shift.eq(shift)]
        if not narrow_check:
            return m                                      # `narrow` stays 0

        # Counts: each flag stage's popcount (two adder levels per register), delayed to
        # meet the slowest, then their sum. The counts trail the data; nothing waits.
        counts = []
        plan = self.flag_plan(c)
        ready = max(s_ + sum_stages(k, 2) for s_, k in enumerate(plan))
        for s_, flag_reg in enumerate(flag_regs):
            assert len(flag_reg) == plan[s_]
            cnt, stages = pipelined_sum(m, list(flag_reg), f"narrow_pop_s{s_ + first}", 2)
            for d in range(ready - s_ - stages):
                r = Signal(cnt.shape(), name=f"narrow_pop_s{s_ + first}_d{d}")
                m.d.sync += r.eq(cnt)
                cnt = r
            counts.append(cnt)
        count, _ = pipelined_sum(m, counts, "narrow_count")
        m.d.comb += self.narrow.eq(count)
        return m


def or_all(values):
    """The bitwise OR of ``values`` (an iterable of equally wide values)."""
    return functools.reduce(operator.or_, values)


class TileEngine(wiring.Component):
    """A tile engine: ``N`` dot-product engines, each with its own MRF memory, and the
    engine's bank of the vector buffer.

    Dot-product engine ``i`` holds row ``i`` of every tile slot of this engine: its memory
    has ``config.mrf_depth`` words of ``config.weight_block_bits`` bits
    (``block_layout(n, m_w)``). Every cycle all ``N`` memories read the word at
    ``rd_addr`` and the vector bank reads the block at ``vrd_addr``; three cycles later
    (:attr:`READ_LATENCY`) each engine gets its weight word and its *own*
    registered copy of the vector block (the fan-out to ``N x N`` multipliers is what
    limits Fmax otherwise; ``docs/mvm.md`` section 6). The vector block is registered
    beside its block RAM before it fans out to the ``N`` copies, and each word is
    registered twice to meet it; the word's first register is in the fabric (Yosys does
    not use the DP16KD's own). ``enable`` low turns the vector copy into zeros (a column
    tile past ``C`` or no compute read at all), so the product and its narrow events are
    zero. The memories have no read enable: a read enable would be one net from the
    sequencer to every block RAM of the MRF, across the die, and a read that no compute
    uses is harmless (``enable`` masks it). The vector block's registers have no reset
    (``enable``'s have): a reset ORed with the mask into one LUT per register, on the
    reset's one net, was what kept the bench's T = 2 build from routing
    (``docs/mvm.md`` section 11).

    The memories have no read/write collision logic: the MVM never uses a read of an MRF
    memory (or of a vector-buffer half) taken in a cycle that writes it. They carry
    :data:`hw.ram.READ_COLLISION_UNUSED`, so that synthesis for a block RAM adds none
    either.

    Parameters
    ----------
    config : MvmConfig
    dsp_lanes : int, 0..n, default 0
        Lanes ``0 .. dsp_lanes - 1`` of every dot-product engine have their products
        formed on MULT18X18D blocks when elaborated for an ECP5: by each engine itself
        (:class:`DotProductEngine`) with one product per DSP, by this tile engine (the
        engines' ``lane_products``) with two. Elsewhere every product is in the fabric.
    dsp_packing : int, 1 or 2, default 1
        Products per MULT18X18D: 2 puts lane ``j`` of engines ``2i`` and ``2i + 1``
        (which share the vector element) on one DSP (:func:`hw.arith.dsp.registered_product_pair`),
        ``N * dsp_lanes / 2`` DSPs per tile engine instead of ``N * dsp_lanes``. Needs
        ``m_v + 2 m_w + 1 <= 18``.

    Attributes
    ----------
    rd_addr : ``In(slot_bits)``
        MRF read (compute or read-back): the slot all ``N`` memories read, every cycle.
    vrd_addr : ``In(vbuf_addr_bits)``
        Vector-buffer address read with a compute read.
    enable : ``In(1)``
        This engine's column tile takes part in the compute read of this cycle.
    therm : ``In(config.dot_bits - 1)``
        :func:`fit_thermometer` of the command's narrow width, with the read.
    wr_addr : ``In(slot_bits)``, wr_data : ``In(config.weight_block_bits)``,
    wr_rows : ``In(n)``
        MRF write: ``wr_rows`` is one-hot (or zero) over the dot-product engines.
    vwr_addr : ``In(vbuf_addr_bits)``, vwr_data : ``In(config.vector_block_bits)``,
    vwr_en : ``In(1)``
        Vector-buffer write.
    rb_clear : ``In(n)``, rb_word : ``Out(config.weight_block_bits)``
        Read-back. Bit ``i`` of ``rb_clear``, given with a read, leaves engine ``i``'s
        word out of ``rb_word``, the OR of all ``N`` (first) word registers, 2 cycles
        after the read. A read-back of row ``r`` clears every other row (and a read-back
        in another tile engine clears all ``N``), so ``rb_word`` is that row's word; the
        OR tree (with the clear in its first level, two words per LUT4) is about a third
        of the LUTs of an ``N``:1 multiplexer. The word registers themselves take the
        memory's data as it is: a clear there put a LUT between each block RAM's output
        (5.8 ns after the clock) and its register.
    dot : ``Out(ArrayLayout(signed(config.dot_bits), n))``,
    shift : ``Out(ArrayLayout(shift_shape(config), n))``
        Per output row, :attr:`dot_latency` cycles after the read.
    narrow : ``Out(range(n * (2n - 1) + 1))``
        Product and tree events of all ``N`` engines, :attr:`narrow_latency` cycles after
        the read; always 0 in a build without the check (``config.narrow_check`` False,
        which also leaves ``therm`` unused).
    """

    def __init__(self, config, *, dsp_lanes=0, dsp_packing=1):
        self._config = _check_config(config)
        c = config
        self._dsp_lanes, self._dsp_packing = check_dsp_options(c, dsp_lanes, dsp_packing)
        self._narrow_sum_stages = ceil_log2(c.n)
        super().__init__({
            "rd_addr": In(self.slot_bits(c)),
            "vrd_addr": In(self.vbuf_addr_bits(c)),
            "enable": In(1),
            "therm": In(c.dot_bits - 1),
            "wr_addr": In(self.slot_bits(c)),
            "wr_data": In(c.weight_block_bits),
            "wr_rows": In(c.n),
            "vwr_addr": In(self.vbuf_addr_bits(c)),
            "vwr_data": In(c.vector_block_bits),
            "vwr_en": In(1),
            "rb_clear": In(c.n),
            "rb_word": Out(c.weight_block_bits),
            "dot": Out(data.ArrayLayout(signed(c.dot_bits), c.n)),
            "shift": Out(data.ArrayLayout(shift_shape(c), c.n)),
            "narrow": Out(range(c.n * (2 * c.n - 1) + 1)),
        })

    # Geometry shared with the MVM top.
    @staticmethod
    def slot_bits(config):
        """Width of an MRF slot address (at least 1)."""
        return max(1, ceil_log2(config.mrf_depth))

    @staticmethod
    def vbuf_half_bits(config):
        """Address bits of one half of a vector-buffer bank (``ceil(log2(G_max))``)."""
        return ceil_log2(config.col_groups_max)

    @classmethod
    def vbuf_addr_bits(cls, config):
        """Vector-buffer address: ``{half, group}``, the half in the top bit."""
        return cls.vbuf_half_bits(config) + 1

    #: Cycles from a compute read to the dot-product engines' inputs: the memories'
    #: registered read, a register beside each (the vector block's, the word's), then
    #: the vector copies and the word's second register.
    READ_LATENCY = 3

    @classmethod
    def dot_latency_of(cls, config):
        """Cycles from a compute read to ``dot``/``shift``."""
        return cls.READ_LATENCY + DotProductEngine.dot_latency_of(config)

    @classmethod
    def narrow_latency_of(cls, config):
        """Cycles from a compute read to its ``narrow`` count."""
        return (cls.READ_LATENCY + DotProductEngine.narrow_latency_of(config)
                + sum_stages(config.n))

    @property
    def dot_latency(self):
        return self.dot_latency_of(self._config)

    @property
    def narrow_latency(self):
        return self.narrow_latency_of(self._config)

    def elaborate(self, platform):
        m = Module()
        c = self._config
        n = c.n

        # Vector-buffer bank: two halves of 2**ceil(log2(G_max)) blocks.
        vbuf = Memory(shape=c.vector_block_bits, depth=2 << self.vbuf_half_bits(c), init=[],
                      attrs=READ_COLLISION_UNUSED)
        m.submodules.vbuf = vbuf
        vwp = vbuf.write_port()
        vrp = vbuf.read_port(domain="sync", transparent_for=())
        m.d.comb += [
            vwp.addr.eq(self.vwr_addr), vwp.data.eq(self.vwr_data), vwp.en.eq(self.vwr_en),
            vrp.addr.eq(self.vrd_addr),
        ]
        # Cycle 1: the vector block leaves the block RAM. Its data output has no
        # register (Yosys maps the memories with REGMODE NOREG), and it took 5.8 ns of
        # clock-to-output plus two die-wide routes to reach the N copies below in one
        # cycle: the routed critical path (docs/mvm.md section 11). One register beside
        # the block RAM takes it first; the copies load from that register in cycle 2.
        # The block is masked here, on its way into that register (enable low: zeros),
        # so that the copies load a register and no LUT sits between it and the N
        # copies spread over the engine.

        # The side signals catch up with the read (both blocks reach the engines in
        # cycle 3).
        def delayed(value, name, cycles):
            for k in range(1, cycles + 1):
                r = Signal.like(value, name=f"{name}_c{k}")
                m.d.sync += r.eq(value)
                value = r
            return value
        enable1 = delayed(self.enable, "enable", 1)
        vblock = Signal(c.vector_block_bits, name="vector_block_c2", reset_less=True)
        m.d.sync += vblock.eq(Mux(enable1, vrp.data, 0))
        # Without the narrow check the engines take no thermometer (and count nothing).
        therm3 = delayed(self.therm, "therm", 3) if c.narrow_check else None
        rb_clear2 = delayed(self.rb_clear, "rb_clear", 2)

        dsp = has_ecp5_dsp(platform)
        words = []
        dpes = []
        narrows = []
        for i in range(n):
            mem = Memory(shape=c.weight_block_bits, depth=c.mrf_depth, init=[],
                         attrs=READ_COLLISION_UNUSED)
            m.submodules[f"mrf{i}"] = mem
            wp = mem.write_port()
            rp = mem.read_port(domain="sync", transparent_for=())
            m.d.comb += [
                wp.addr.eq(self.wr_addr), wp.data.eq(self.wr_data), wp.en.eq(self.wr_rows[i]),
                rp.addr.eq(self.rd_addr),
            ]
            # Cycle 2: the word's output register (fabric flip-flops; the read-back takes
            # its words here). Cycle 3: the word once more, to meet the vector block, and
            # this engine's own copy of the vector block (kept: merging the N copies back
            # defeats their purpose). Reading the weights a cycle later instead, from a
            # register per memory, would have saved these flip-flops, but Yosys 0.70
            # (yowasp) then fails an assertion in ABC9's reintegration (docs/mvm.md
            # section 11).
            word = Signal(block_layout(n, c.mantissa_bits_w), name=f"word{i}")
            m.d.sync += word.eq(rp.data)
            word3 = Signal(block_layout(n, c.mantissa_bits_w), name=f"word{i}_c3")
            m.d.sync += word3.eq(word)
            vec = Signal(block_layout(n, c.mantissa_bits_v), name=f"vector{i}",
                         attrs={"keep": 1}, reset_less=True)
            vec_next = vblock
            m.d.sync += vec.eq(vec_next)
            words.append(word)

            # One product per DSP: the engine forms its DSP lanes itself. Two, on an
            # ECP5: this tile engine forms them for each pair of engines (below).
            # Elsewhere every engine forms all its products in the fabric.
            paired = self._dsp_packing == 2
            dpe = DotProductEngine(c, dsp_lanes=0 if paired else self._dsp_lanes,
                                   outer_lanes=self._dsp_lanes if paired and dsp else 0)
            m.submodules[f"dpe{i}"] = dpe
            dpes.append(dpe)
            if self._dsp_lanes and not paired:
                m.d.comb += [dpe.weights_next.eq(word), dpe.vector_next.eq(vec_next)]
            m.d.comb += [
                dpe.weights.eq(word3),
                dpe.vector.eq(vec),
                self.dot[i].eq(dpe.dot),
                self.shift[i].eq(dpe.shift),
            ]
            if c.narrow_check:
                m.d.comb += dpe.therm.eq(therm3)
                narrows.append(dpe.narrow)

        if self._dsp_lanes and self._dsp_packing == 2 and dsp:
            # The DSPs' input registers stand for the word's second register and the
            # vector copy (they load what those load: the word's first register and the
            # masked vector block); their output register is the product register.
            vector_next = block_layout(n, c.mantissa_bits_v)(vblock)
            for j in range(self._dsp_lanes):
                for i in range(0, n, 2):
                    lo, hi = registered_product_pair(
                        m, vector_next.mantissas[j], words[i].mantissas[j],
                        words[i + 1].mantissas[j], enable=Const(1, 1),
                        name=f"mul{i}_{i + 1}_{j}")
                    m.d.comb += [dpes[i].lane_products[j].eq(lo),
                                 dpes[i + 1].lane_products[j].eq(hi)]

        m.d.comb += self.rb_word.eq(or_all(
            Mux(rb_clear2[i], 0, w.as_value()) for i, w in enumerate(words)))

        if c.narrow_check:
            total, stages = pipelined_sum(m, narrows, "narrow_sum")
            assert stages == self._narrow_sum_stages
            m.d.comb += self.narrow.eq(total)
        return m
