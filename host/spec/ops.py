"""The operation codes of the multifunction units: the one definition that the ISA, the
MFU chain encoding, the gateware and the reference model share.

:class:`BinaryOp` (element-wise, ``vv_*``), :class:`UnaryOp` (activations, ``v_relu`` ...)
with :data:`TABLE_OPS` and :func:`parse_ops`, :class:`ReduceOp` (reductions) with the
FP16 :data:`IDENTITY` each pads with.
"""

from __future__ import annotations

from amaranth.lib import enum

from host.spec.formats import NamedCode

__all__ = ["BinaryOp", "UnaryOp", "TABLE_OPS", "parse_ops", "ReduceOp", "IDENTITY"]


class BinaryOp(NamedCode, enum.Enum, shape=3):
    """Element-wise binary operations of an MFU (``vv_add``, ``vv_a_sub_b``, ...).

    The values are the operation codes carried with a vector through the MFU pipeline
    (``hw.arith.fp16_arith``) and encoded in ``vv_*`` instructions. Codes 5 to 7 are not
    operations.

    ========== ===== ==========================================
    member     code  result
    ========== ===== ==========================================
    ADD        0     ``a + b``
    A_SUB_B    1     ``a - b``
    B_SUB_A    2     ``b - a``
    MUL        3     ``a * b``
    MAX        4     IEEE 754-2019 ``maximum(a, b)``
    ========== ===== ==========================================
    """
    ADD = 0
    A_SUB_B = 1
    B_SUB_A = 2
    MUL = 3
    MAX = 4


class UnaryOp(NamedCode, enum.Enum, shape=3):
    """The unary function codes (the one definition; the ISA and the gateware use it)."""
    RELU = 0
    SIGMOID = 1
    TANH = 2
    EXP = 3
    RECIP = 4
    PASS = 5



#: The ops evaluated through the ROM (the others are exact bit manipulations).
TABLE_OPS = (UnaryOp.SIGMOID, UnaryOp.TANH, UnaryOp.EXP, UnaryOp.RECIP)


def parse_ops(ops) -> tuple[UnaryOp, ...]:
    """The set of ops of a build, sorted by code; ``None`` means every op.

    Raises
    ------
    TypeError
        ``ops`` is a single op or name rather than a collection.
    ValueError
        an element is not a unary op (naming it).
    """
    if ops is None:
        return tuple(UnaryOp)
    if isinstance(ops, (str, UnaryOp)):
        raise TypeError(f"ops must be a collection of UnaryOp, not {ops!r}")
    try:
        parsed = {UnaryOp.parse(op) for op in ops}
    except TypeError:
        raise TypeError(f"ops must be a collection of UnaryOp, not {ops!r}") from None
    return tuple(sorted(parsed, key=lambda op: op.value))


class ReduceOp(NamedCode, enum.Enum, shape=1):
    """The reduction operations of an MFU (the one definition; the gateware uses it).

    ====== ===== ================================================
    member code  result
    ====== ===== ================================================
    MAX    0     IEEE 754-2019 ``maximum`` over the logical vector
    SUM    1     sum over the logical vector, in the fixed tree order
    ====== ===== ================================================
    """
    MAX = 0
    SUM = 1


    @property
    def binary_op(self) -> BinaryOp:
        """The element-wise operation of one tree node: ``MAX`` or ``ADD``."""
        return BinaryOp.MAX if self is ReduceOp.MAX else BinaryOp.ADD

    @property
    def identity(self) -> int:
        """FP16 bits of the padding value: ``0xFC00`` (-inf) or ``0x8000`` (-0)."""
        return IDENTITY[self]


#: FP16 bits of each operation's identity (the padding value).
IDENTITY = {ReduceOp.MAX: 0xFC00, ReduceOp.SUM: 0x8000}
