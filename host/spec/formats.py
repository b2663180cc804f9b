"""Numeric formats shared by the host, the reference model and the gateware.

This module is the one place where the bit-level layout of the NPU's number formats is
written down (see ``docs/numerics.md``). The gateware in ``hw`` imports these definitions;
nothing here imports ``hw`` or ``sim``.

Constants
---------
FP16_* : IEEE 754 binary16 field widths and limits.
E8M0_BIAS : bias of the 8-bit shared-exponent code (OCP MX E8M0), 127.
E8M0_NAN : the reserved code 0xFF, never produced and rejected when read.
EXP_MIN, EXP_MAX : range of unbiased shared exponents, -127..127.
ZERO_BLOCK_EXP : exponent given to an all-zero block in dynamic mode (-127, code 0x00).
MVM_EXP_MAX : largest block exponent the matrix-vector unit accepts (15, the largest
    FP16 exponent); larger exponents are rejected on the device write path.
MAX_EXPONENT_CODE : largest E8M0 code the MVM accepts (142).
NARROW_WIDTH_MAX : largest narrow-accumulator width k (64).
CANONICAL_NAN : the one NaN every FP16 operation produces (0x7E00).
MVM_EXP_EXACT_MIN : smallest block exponent for which the BFP-long accumulator is exact
    (-24, the exponent of the smallest FP16 subnormal).
"""

from __future__ import annotations

import numbers

from amaranth.hdl import signed, unsigned
from amaranth.lib import data, enum

__all__ = [
    "FP16_BITS", "FP16_EXP_BITS", "FP16_FRAC_BITS", "FP16_BIAS", "FP16_MAX",
    "FP16_MIN_EXP", "FP16_MAX_EXP", "FP16_MAX_BITS",
    "E8M0_BIAS", "E8M0_NAN", "EXP_MIN", "EXP_MAX", "ZERO_BLOCK_EXP",
    "MVM_EXP_MAX", "MVM_EXP_EXACT_MIN", "MAX_EXPONENT_CODE", "NARROW_WIDTH_MAX",
    "CANONICAL_NAN",
    "MANTISSA_BITS_MIN", "MANTISSA_BITS_MAX",
    "Rounding", "block_layout", "block_bits", "block_bytes", "mantissa_max",
    "check_int",
]

FP16_BITS = 16
FP16_EXP_BITS = 5
FP16_FRAC_BITS = 10
FP16_BIAS = 15
FP16_MAX = 65504.0
FP16_MAX_BITS = 0x7BFF
#: floor(log2(|x|)) of the smallest positive FP16 subnormal (2**-24) and of FP16_MAX.
FP16_MIN_EXP = -24
FP16_MAX_EXP = 15

#: The one NaN every operation produces: positive, quiet, payload 0.
CANONICAL_NAN = 0x7E00

E8M0_BIAS = 127
E8M0_NAN = 0xFF
EXP_MIN = -127
EXP_MAX = 127
ZERO_BLOCK_EXP = EXP_MIN

MVM_EXP_MAX = FP16_MAX_EXP
MVM_EXP_EXACT_MIN = FP16_MIN_EXP
#: Largest E8M0 code the MVM accepts in a weight word or a static vector exponent
#: (``127 + MVM_EXP_MAX`` = 142): larger codes, 0xFF included, are rejected.
MAX_EXPONENT_CODE = E8M0_BIAS + MVM_EXP_MAX
#: Largest narrow-accumulator width ``k`` (``docs/numerics.md`` section 5).
NARROW_WIDTH_MAX = 64

MANTISSA_BITS_MIN = 2
MANTISSA_BITS_MAX = 16


class Rounding(enum.Enum, shape=1):
    """Rounding of a quantizer: to nearest, ties to even or ties away from zero."""
    NEAREST_EVEN = 0
    NEAREST_AWAY = 1

    @classmethod
    def parse(cls, value) -> "Rounding":
        """Accept a ``Rounding``, its value, or ``"nearest-even"``/``"nearest-away"``.

        Raises
        ------
        ValueError
            naming the value when it is none of these.
        """
        if isinstance(value, cls):
            return value
        names = {"nearest-even": cls.NEAREST_EVEN, "nearest-away": cls.NEAREST_AWAY}
        if isinstance(value, str) and value in names:
            return names[value]
        raise ValueError(
            f"rounding must be 'nearest-even' or 'nearest-away', not {value!r}")


class NamedCode:
    """Mixin of the op enums (``UnaryOp``, ``BinaryOp``, ``ReduceOp``): :meth:`parse`.

    Put it before ``enum.Enum`` in the bases: ``class UnaryOp(NamedCode, enum.Enum, shape=3)``.
    """

    @classmethod
    def parse(cls, value):
        """Accept a member, its name in any case (``"relu"``, ``"RELU"``) or its integer
        code (``bool`` is not an integer code here).

        Raises
        ------
        ValueError
            naming the value and listing the accepted names when it is none of these.
        """
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            for op in cls:
                if value.lower() == op.name.lower():
                    return op
        elif isinstance(value, numbers.Integral) and not isinstance(value, bool):
            try:
                return cls(int(value))
            except ValueError:
                pass
        names = ", ".join(repr(op.name.lower()) for op in cls)
        raise ValueError(f"op must be a {cls.__name__} or one of {names}, not {value!r}")


def check_int(name: str, value, lo: int, hi: int | None = None) -> int:
    """Return ``value`` if it is an ``int`` in ``[lo, hi]``; else raise naming ``name``.

    Raises
    ------
    TypeError
        if ``value`` is not an integer (``bool`` is refused too).
    ValueError
        if it is out of range.
    """
    import numbers
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer, not {value!r}")
    value = int(value)
    if value < lo or (hi is not None and value > hi):
        bound = f"from {lo} to {hi}" if hi is not None else f"at least {lo}"
        raise ValueError(f"{name} must be {bound}, not {value}")
    return value


def mantissa_max(mantissa_bits: int) -> int:
    """Largest mantissa magnitude, ``2**(m-1) - 1`` (the clamp is symmetric)."""
    return (1 << (mantissa_bits - 1)) - 1


def block_layout(block_size: int, mantissa_bits: int) -> data.StructLayout:
    """Bit layout of one BFP block as the device stores and transfers it.

    Bits ``[0, 8)`` hold the E8M0 exponent code; mantissa ``i`` (``m``-bit two's
    complement) occupies bits ``[8 + i*m, 8 + (i+1)*m)``. The host packer writes the same
    bits little-endian, padded with zeros to whole bytes (see ``host.numerics.bfp.pack``).
    """
    check_int("block_size", block_size, 1)
    check_int("mantissa_bits", mantissa_bits, MANTISSA_BITS_MIN, MANTISSA_BITS_MAX)
    return data.StructLayout({
        "exponent": unsigned(8),
        "mantissas": data.ArrayLayout(signed(mantissa_bits), block_size),
    })


def block_bits(block_size: int, mantissa_bits: int) -> int:
    """Width in bits of one block: ``8 + block_size * mantissa_bits``."""
    return 8 + block_size * mantissa_bits


def block_bytes(block_size: int, mantissa_bits: int) -> int:
    """Bytes of one packed block: the block's bits rounded up to whole bytes."""
    return (block_bits(block_size, mantissa_bits) + 7) // 8
