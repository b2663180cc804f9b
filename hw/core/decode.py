"""Instruction decoder of the NPU core: one 64-bit word to its fields and its error code.

The word layout, the opcodes and every enum come from :mod:`host.spec.isa`; the checks and
their priority are those of :func:`host.spec.isa.decode` (and ``Instruction.__post_init__``),
so a word the model refuses is refused here with the same :class:`host.spec.isa.ErrorCode`.

The core decodes a word when the host writes it (:class:`WordCheck`) and keeps the verdict
beside the word in the program memory (:data:`PREDECODE_LAYOUT`), so that the fetched
word's checks and the front end's decision terms are stored bits instead of the
decoder's logic (issue 36, timing).
"""

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import data, enum, wiring
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

__all__ = ["InstructionDecoder", "FUNC_LIMIT", "Verdict", "PREDECODE_LAYOUT", "WordCheck",
           "FETCHED_TERMS_LAYOUT", "verdict_error", "iteration_bits",
           "built_vrfs", "vrf_space"]


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


class Verdict(enum.Enum, shape=2):
    """The decoder's error code of a program word, as the program memory keeps it.

    ``ILLEGAL_OPCODE`` is code 0 because an all-zero word (opcode 0, unassigned) is
    illegal: a word of the memory's power-on contents then reads as what it decodes to.
    """
    ILLEGAL_OPCODE = 0
    NONE = 1
    ILLEGAL_FIELD = 2


#: The terms of a word that the front end's decisions test, stored with the word (in
#: :data:`PREDECODE_LAYOUT`) so that they come out of the program memory's register
#: with no logic after the block RAM (issue 36, timing): ``legal`` (its verdict is NONE);
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


#: The bits the core stores beside each 64-bit program word, all zero for an all-zero
#: word: the decoder's :class:`Verdict`; whether an ``s_wr``'s operand is outside its
#: register's range (``REGISTER_VALUE`` when the word runs, if the verdict is NONE); the
#: MFU unit of a ``vv``, ``v_unary`` or ``v_reduce`` (``ADDSUB``, code 0, for any other
#: opcode); whether a ``v_unary``'s function is one the build does not have
#: (``ILLEGAL_OPCODE`` at the chain's check); the front end's decision terms
#: (:data:`FETCHED_TERMS_LAYOUT`).
PREDECODE_LAYOUT = data.StructLayout({"verdict": Verdict, "s_wr_out_of_range": 1,
                                      "unit": MfuUnit, "unary_unbuilt": 1,
                                      "terms": FETCHED_TERMS_LAYOUT})


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
    predecode : ``Out(PREDECODE_LAYOUT)``
        Its :class:`Verdict` (:class:`InstructionDecoder`'s error), the ``s_wr`` range
        flag, the op's MFU unit, the unbuilt-function flag and the decision terms.

    Raises
    ------
    TypeError
        ``config`` is not an :class:`host.spec.config.NpuConfig`.
    """

    def __init__(self, config):
        config = checked_config(self, config)
        self._limits = register_limits(config)
        self._unary_ops = tuple(config.unary_ops)
        super().__init__({"word": In(WORD_BITS), "predecode": Out(PREDECODE_LAYOUT)})

    def elaborate(self, platform):
        m = Module()
        m.submodules.decoder = dec = InstructionDecoder()
        m.d.comb += dec.word.eq(self.word)
        out = self.predecode
        with m.Switch(dec.error):
            with m.Case(ErrorCode.NONE):
                m.d.comb += out.verdict.eq(Verdict.NONE)
            with m.Case(ErrorCode.ILLEGAL_FIELD):
                m.d.comb += out.verdict.eq(Verdict.ILLEGAL_FIELD)
            with m.Default():
                m.d.comb += out.verdict.eq(Verdict.ILLEGAL_OPCODE)
        op, func = dec.opcode, dec.func
        bad = 0
        for reg in Reg:
            lo, hi = self._limits[reg]
            bad = bad | ((func == reg.value) & ((dec.operand < lo) | (dec.operand > hi)))
        m.d.comb += out.s_wr_out_of_range.eq((op == Opcode.S_WR.value) & bad)
        with m.Switch(op):
            with m.Case(Opcode.VV.value):
                m.d.comb += out.unit.eq(Mux(func == BinaryOp.MUL.value,
                                            MfuUnit.MUL, MfuUnit.ADDSUB))
            with m.Case(Opcode.V_UNARY.value):
                m.d.comb += out.unit.eq(MfuUnit.ACT)
            with m.Case(Opcode.V_REDUCE.value):
                m.d.comb += out.unit.eq(MfuUnit.REDUCE)
        m.d.comb += out.unary_unbuilt.eq((op == Opcode.V_UNARY.value)
                                         & ~_one_of(func, [u.value for u in self._unary_ops]))
        terms = out.terms
        m.d.comb += terms.legal.eq(dec.error == ErrorCode.NONE)
        for name, codes in _TERM_OPCODES.items():
            m.d.comb += getattr(terms, name).eq(terms.legal
                                                & _one_of(op, [o.value for o in codes]))
        m.d.comb += terms.unit_bit.eq(Mux(terms.mfu_op, 1 << out.unit.as_value(), 0))
        return m


def verdict_error(m, verdict):
    """The :class:`host.spec.isa.ErrorCode` of a stored :class:`Verdict` (``verdict``, a
    value of that shape), as a signal driven in ``m``'s combinational domain: the
    inverse of :class:`WordCheck`'s encoding."""
    error = Signal(ErrorCode, name="word_error")
    with m.Switch(verdict):
        with m.Case(Verdict.NONE):
            m.d.comb += error.eq(ErrorCode.NONE)
        with m.Case(Verdict.ILLEGAL_FIELD):
            m.d.comb += error.eq(ErrorCode.ILLEGAL_FIELD)
        with m.Default():
            m.d.comb += error.eq(ErrorCode.ILLEGAL_OPCODE)
    return error


