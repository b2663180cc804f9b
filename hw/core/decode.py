"""Instruction decoder of the NPU core: one 64-bit word to its fields and its error code.

The word layout, the opcodes and every enum come from :mod:`host.spec.isa`; the checks and
their priority are those of :func:`host.spec.isa.decode` (and ``Instruction.__post_init__``),
so a word the model refuses is refused here with the same :class:`host.spec.isa.ErrorCode`.
"""

from amaranth.hdl import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from host.spec.ops import BinaryOp
from host.spec.isa import FIELDS, WORD_BITS, ErrorCode, Opcode, Reg, Space
from host.spec.ops import ReduceOp
from host.spec.ops import UnaryOp

__all__ = ["InstructionDecoder", "FUNC_LIMIT"]

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

