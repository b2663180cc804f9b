"""Instruction decoder of the NPU core: one 64-bit word to its fields and its error code.

The word layout, the opcodes and every enum come from :mod:`host.spec.isa`; the checks and
their priority are those of :func:`host.spec.isa.decode` (and ``Instruction.__post_init__``),
so a word the model refuses is refused here with the same :class:`host.spec.isa.ErrorCode`.

The core decodes a word when the host writes it (:class:`WordCheck`) and keeps its checks
with the word's fields in the program memory (:data:`STORED_WORD_LAYOUT`), so that the
fetched word's checks and the front end's decision terms are stored bits instead of the
decoder's logic (issue 36, timing).
"""

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import bits_for

from host.spec.config import NpuConfig
from host.spec.isa import (
    FIELDS, WORD_BITS, ErrorCode, Opcode, Reg, Space, register_limits, vector_spaces,
)
from host.spec.mfu import MfuUnit
from host.spec.ops import BinaryOp
from host.spec.ops import ReduceOp
from host.spec.ops import UnaryOp
from hw.core.vectors import checked_config

__all__ = ["InstructionDecoder", "FUNC_LIMIT", "PREDECODE_LAYOUT", "KEPT_FIELDS",
           "STORED_WORD_LAYOUT", "WordCheck", "FETCHED_TERMS_LAYOUT", "word_error", "unit_of",
           "iteration_bits", "built_vrfs", "vrf_space"]


def iteration_bits(config: NpuConfig) -> int:
    """Width of an iteration count: ITERATIONS's range (:func:`host.spec.isa.register_limits`)."""
    return bits_for(register_limits(config)[Reg.ITERATIONS][1])


def built_vrfs(config: NpuConfig) -> list[int]:
    """The VRFs the build has, as indices ``2m + bank`` (space ``2 + index``), in order:
    every one without unit sets (:func:`host.spec.isa.vector_spaces`)."""
    return [s.value - 2 for s in vector_spaces(config)[1:]]


def vrf_space(index: int) -> int:
    """The Space code of VRF ``index`` (``2m + bank``): AddSubVrf ``m`` or MulVrf ``m``."""
    return 2 + index


#: Largest legal function code of each opcode that has a function field.
FUNC_LIMIT = {
    Opcode.VV: max(op.value for op in BinaryOp),
    Opcode.V_UNARY: max(op.value for op in UnaryOp),
    Opcode.V_REDUCE: max(op.value for op in ReduceOp),
    Opcode.S_WR: max(r.value for r in Reg),
}
_USES_SPACE = (Opcode.V_RD, Opcode.V_WR)
_USES_INC = (Opcode.V_RD, Opcode.V_WR, Opcode.MV_MUL, Opcode.VV)
_USES_OPERAND = (Opcode.V_RD, Opcode.V_WR, Opcode.MV_MUL, Opcode.VV, Opcode.S_WR)


def _one_of(value, codes):
    result = 0
    for c in codes:
        result = result | (value == c)
    return result


class InstructionDecoder(wiring.Component):
    """Combinational decoder of one instruction word.

    Attributes
    ----------
    word : ``In(64)``
        The instruction word (``host.spec.isa.INSTRUCTION_LAYOUT``).
    opcode : ``Out(5)``, space : ``Out(4)``, func : ``Out(5)``, inc : ``Out(16)``,
    operand : ``Out(32)``
        The raw fields.
    error : ``Out(ErrorCode)``
        ``NONE`` for a legal word; else ILLEGAL_OPCODE (unassigned opcode or function
        code) or ILLEGAL_FIELD (reserved bits, an unassigned space, a field the opcode
        does not use that is not zero, ``MRF`` in ``v_rd``/``v_wr``, ``netq`` with an
        address or increment), with :func:`host.spec.isa.decode`'s priority.
    """

    def __init__(self):
        super().__init__({
            "word": In(WORD_BITS),
            "opcode": Out(FIELDS["opcode"][1]),
            "space": Out(FIELDS["space"][1]),
            "func": Out(FIELDS["func"][1]),
            "inc": Out(FIELDS["inc"][1]),
            "operand": Out(FIELDS["operand"][1]),
            "error": Out(ErrorCode),
        })

    def elaborate(self, platform):
        m = Module()

        def field(name):
            off, width = FIELDS[name]
            return self.word[off:off + width]

        reserved = field("reserved")
        op, space, func = field("opcode"), field("space"), field("func")
        inc, operand = field("inc"), field("operand")
        m.d.comb += [self.opcode.eq(op), self.space.eq(space), self.func.eq(func),
                     self.inc.eq(inc), self.operand.eq(operand)]

        bad_opcode = ~_one_of(op, [o.value for o in Opcode])
        bad_space = ~_one_of(space, [s.value for s in Space])
        bad_func = 0
        no_func = 1
        for o, limit in FUNC_LIMIT.items():
            bad_func = bad_func | ((op == o.value) & (func > limit))
            no_func = no_func & (op != o.value)
        uses_space = _one_of(op, [o.value for o in _USES_SPACE])
        uses_inc = _one_of(op, [o.value for o in _USES_INC])
        uses_operand = _one_of(op, [o.value for o in _USES_OPERAND])
        netq = space == Space.NETQ.value
        bad_use = ((no_func & (func != 0))
                   | (~uses_space & ~netq)
                   | (uses_space & (space == Space.MRF.value))
                   | (~uses_inc & (inc != 0))
                   | (~uses_operand & (operand != 0))
                   | (uses_space & netq & ((operand != 0) | (inc != 0))))
        with m.If(bad_opcode):
            m.d.comb += self.error.eq(ErrorCode.ILLEGAL_OPCODE)
        with m.Elif((reserved != 0) | bad_space):
            m.d.comb += self.error.eq(ErrorCode.ILLEGAL_FIELD)
        with m.Elif(bad_func):
            m.d.comb += self.error.eq(ErrorCode.ILLEGAL_OPCODE)
        with m.Elif(bad_use):
            m.d.comb += self.error.eq(ErrorCode.ILLEGAL_FIELD)
        with m.Else():
            m.d.comb += self.error.eq(ErrorCode.NONE)
        return m


#: The terms of a word that the front end's decisions test, stored with the word (in
#: :data:`PREDECODE_LAYOUT`) so that they come out of the program memory's register
#: with no logic after the block RAM (issue 36, timing): ``legal`` (the decoder accepts it);
#: one flag per opcode the front end tells apart, each set only for a legal word;
#: ``mfu_op`` for a legal ``vv``, ``v_unary`` or ``v_reduce``; ``unit_bit``, the one-hot of
#: the op's MFU unit, for such an op only. All zero for an all-zero word.
FETCHED_TERMS_LAYOUT = data.StructLayout({
    "legal": 1, "end": 1, "s_wr": 1, "v_rd": 1, "mv_mul": 1, "mfu_op": 1, "v_wr": 1,
    "end_chain": 1, "unit_bit": 4,
})

# The opcodes behind each opcode flag of FETCHED_TERMS_LAYOUT.
_TERM_OPCODES = {"end": (Opcode.END,), "s_wr": (Opcode.S_WR,), "v_rd": (Opcode.V_RD,),
                 "mv_mul": (Opcode.MV_MUL,),
                 "mfu_op": (Opcode.VV, Opcode.V_UNARY, Opcode.V_REDUCE),
                 "v_wr": (Opcode.V_WR,), "end_chain": (Opcode.END_CHAIN,)}


#: The checks the core stores with each program word, all zero for an all-zero word:
#: ``field`` (an illegal word's error is ILLEGAL_FIELD, else ILLEGAL_OPCODE: with
#: ``terms.legal``, the decoder's error code; an all-zero word, opcode 0, is
#: ILLEGAL_OPCODE, so the memory's power-on contents read as what they decode to);
#: whether an ``s_wr``'s operand is outside its register's range (``REGISTER_VALUE``
#: when the word runs, if it is legal); whether a ``v_unary``'s function is one the build
#: does not have (``ILLEGAL_OPCODE`` at the chain's check); the front end's decision
#: terms (:data:`FETCHED_TERMS_LAYOUT`, with the one-hot of an op's MFU unit).
PREDECODE_LAYOUT = data.StructLayout({"field": 1, "s_wr_out_of_range": 1,
                                      "unary_unbuilt": 1, "terms": FETCHED_TERMS_LAYOUT})

#: The fields of a program word (``host.spec.isa.FIELDS``) that the front end reads after
#: the fetch, and so the program memory keeps.
KEPT_FIELDS = ("space", "func", "inc", "operand")

#: A program word as the program memory keeps it (72 bits: four DP16KD at depth 1,024):
#: the fields the front end reads after the fetch, and the word's checks
#: (:data:`PREDECODE_LAYOUT`). The opcode and the reserved bits are not kept: the checks
#: say all the front end needs of them.
STORED_WORD_LAYOUT = data.StructLayout({
    **{name: FIELDS[name][1] for name in KEPT_FIELDS},
    "checks": PREDECODE_LAYOUT,
})


class WordCheck(wiring.Component):
    """The checks of a program word that depend on the word alone, done when it is written.

    Parameters
    ----------
    config : NpuConfig
        The build: its scalar registers' ranges (:func:`host.spec.isa.register_limits`)
        and its unary functions (``unary_ops``).

    Attributes
    ----------
    word : ``In(64)``
        The instruction word.
    stored : ``Out(STORED_WORD_LAYOUT)``
        What the program memory keeps of it: the fields the front end reads and the
        checks (:class:`InstructionDecoder`'s error as ``terms.legal`` and ``field``, the
        ``s_wr`` range flag, the unbuilt-function flag and the decision terms).

    Raises
    ------
    TypeError
        ``config`` is not an :class:`host.spec.config.NpuConfig`.
    """

    def __init__(self, config):
        config = checked_config(self, config)
        self._limits = register_limits(config)
        self._unary_ops = tuple(config.unary_ops)
        super().__init__({"word": In(WORD_BITS), "stored": Out(STORED_WORD_LAYOUT)})

    def elaborate(self, platform):
        m = Module()
        m.submodules.decoder = dec = InstructionDecoder()
        m.d.comb += dec.word.eq(self.word)
        stored = self.stored
        m.d.comb += [getattr(stored, name).eq(getattr(dec, name)) for name in KEPT_FIELDS]
        out = stored.checks
        m.d.comb += out.field.eq(dec.error == ErrorCode.ILLEGAL_FIELD)
        op, func = dec.opcode, dec.func
        bad = 0
        for reg in Reg:
            lo, hi = self._limits[reg]
            bad = bad | ((func == reg.value) & ((dec.operand < lo) | (dec.operand > hi)))
        m.d.comb += out.s_wr_out_of_range.eq((op == Opcode.S_WR.value) & bad)
        unit = Signal(MfuUnit)
        with m.Switch(op):
            with m.Case(Opcode.VV.value):
                m.d.comb += unit.eq(Mux(func == BinaryOp.MUL.value, MfuUnit.MUL, MfuUnit.ADDSUB))
            with m.Case(Opcode.V_UNARY.value):
                m.d.comb += unit.eq(MfuUnit.ACT)
            with m.Case(Opcode.V_REDUCE.value):
                m.d.comb += unit.eq(MfuUnit.REDUCE)
        m.d.comb += out.unary_unbuilt.eq((op == Opcode.V_UNARY.value)
                                         & ~_one_of(func, [u.value for u in self._unary_ops]))
        terms = out.terms
        m.d.comb += terms.legal.eq(dec.error == ErrorCode.NONE)
        for name, codes in _TERM_OPCODES.items():
            m.d.comb += getattr(terms, name).eq(terms.legal
                                                & _one_of(op, [o.value for o in codes]))
        m.d.comb += terms.unit_bit.eq(Mux(terms.mfu_op, 1 << unit.as_value(), 0))
        return m


def word_error(m, checks):
    """The :class:`host.spec.isa.ErrorCode` of a stored word's checks (``checks``, a view
    of :data:`PREDECODE_LAYOUT`), as a signal driven in ``m``'s combinational domain: the
    inverse of :class:`WordCheck`'s encoding."""
    error = Signal(ErrorCode, name="word_error")
    with m.If(checks.terms.legal):
        m.d.comb += error.eq(ErrorCode.NONE)
    with m.Elif(checks.field):
        m.d.comb += error.eq(ErrorCode.ILLEGAL_FIELD)
    with m.Else():
        m.d.comb += error.eq(ErrorCode.ILLEGAL_OPCODE)
    return error


def unit_of(unit_bit):
    """The :class:`host.spec.mfu.MfuUnit` code of a one-hot ``unit_bit``
    (:data:`FETCHED_TERMS_LAYOUT`): the OR of the codes of the bits set."""
    code = 0
    for u in MfuUnit:
        code = code | Mux(unit_bit[u.value], u.value, 0)
    return code
