"""Bit-exact reference kernels for the NPU's numerics (see ``docs/numerics.md``).

These functions are the executable specification that the gateware is tested against.
They work on FP16 bit patterns (``uint16``) where the device does, and on exact integers
elsewhere.
"""

from __future__ import annotations

import os
import sys
import warnings
from typing import NamedTuple

import numpy as np

from host.numerics import bfp
from host.spec.formats import (
    E8M0_BIAS, FP16_MAX_BITS, MANTISSA_BITS_MAX, MANTISSA_BITS_MIN, MVM_EXP_EXACT_MIN,
    MVM_EXP_MAX, Rounding, check_int,
)

__all__ = [
    "QuantizedBlocks", "quantize_fp16", "fp16_bits", "fp16_from_bits",
    "fixed_to_fp16", "acc_lsb", "term_exponents", "tile_products", "accumulate",
    "NarrowCounts", "narrow_overflows", "MvmResult", "mvm",
]


class QuantizedBlocks(NamedTuple):
    """What the vector quantizer emits for each block (native vector).

    exponent_codes : uint8 ``(...,)`` E8M0 codes.
    mantissas : int16 ``(..., N)``.
    saturated : int64 ``(...,)`` values clamped to the top code, per block.
    nonfinite : int64 ``(...,)`` inf/NaN inputs, per block.
    """
    exponent_codes: np.ndarray
    mantissas: np.ndarray
    saturated: np.ndarray
    nonfinite: np.ndarray


#: The dtypes :func:`fp16_bits` rounds to FP16 (``float16`` is taken as it is).
_FP16_SOURCE_FLOATS = (np.float16, np.float32, np.float64)
_HOST_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _stacklevel() -> int:
    """The ``warnings.warn`` stacklevel of the first frame outside the ``host`` package."""
    level, frame = 1, sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_HOST_DIR + os.sep):
        frame, level = frame.f_back, level + 1
    return level


def fp16_bits(x, name: str = "x") -> np.ndarray:
    """FP16 data as bit patterns: the one conversion every host entry point uses.

    Parameters
    ----------
    x : array_like
        ``float16``, ``float32`` or ``float64`` values, rounded to binary16 once, to
        nearest with ties to even (NumPy's direct cast; subnormals kept, beyond the FP16
        range to +-inf, NaN stays NaN); or ``uint16`` FP16 bit patterns, taken as they
        are. Lists of Python floats are ``float64``.
    name : str
        The argument's name, for the messages.

    Returns
    -------
    uint16 array of the shape of ``x``, a new array (never a view of ``x``).

    Raises
    ------
    TypeError
        ``x`` has any other dtype: signed or other unsigned integers, bool, complex,
        ``longdouble``, object, strings. An integer array is neither values nor bit
        patterns unambiguously, so it is refused rather than reinterpreted.

    Warns
    -----
    RuntimeWarning
        when finite ``float32`` or ``float64`` values overflow to +-inf in the rounding;
        the message names ``name`` and the count.
    """
    arr = np.asarray(x)
    if arr.dtype == np.uint16:
        return arr.copy()
    if arr.dtype not in _FP16_SOURCE_FLOATS:
        raise TypeError(f"{name} must be a float16, float32 or float64 array (values) or a "
                        f"uint16 array (FP16 bit patterns), not an array of {arr.dtype}")
    if arr.dtype == np.float16:
        return arr.view(np.uint16).copy()
    with np.errstate(over="ignore", invalid="ignore"):
        half = arr.astype(np.float16)
    overflowed = int(np.count_nonzero(np.isinf(half) & np.isfinite(arr)))
    if overflowed:
        warnings.warn(f"{name}: {overflowed} finite value{'s' if overflowed > 1 else ''} "
                      f"beyond the FP16 range (magnitude 65520 or more) rounded to +-inf in "
                      f"the conversion to FP16", RuntimeWarning, stacklevel=_stacklevel())
    return half.view(np.uint16)


def fp16_from_bits(bits) -> np.ndarray:
    """``float16`` values of bit patterns."""
    return np.asarray(bits, dtype=np.uint16).view(np.float16)


def quantize_fp16(bits, mantissa_bits: int, rounding=Rounding.NEAREST_EVEN,
                  static_exponent_code: int | None = None) -> QuantizedBlocks:
    """The device's vector quantizer: FP16 blocks in, BFP blocks out.

    Parameters
    ----------
    bits : uint16 array ``(..., N)``
        FP16 bit patterns; each last-axis row is one block (a native vector).
    mantissa_bits : int, 2..16
    rounding : Rounding or its string name
    static_exponent_code : None or int 0..255
        ``None`` for the dynamic exponent. Otherwise the E8M0 code of the static exponent;
        the hardware applies ``e = code - 127`` to every code, so 0xFF acts as ``e = 128``
        (every FP16 value then rounds to zero) although it is never a valid exponent.

    Non-finite inputs follow the device rule: NaN is 0, +-inf is +-65504, and each is
    counted in ``nonfinite``.
    """
    m = check_int("mantissa_bits", mantissa_bits, MANTISSA_BITS_MIN, MANTISSA_BITS_MAX)
    rounding = Rounding.parse(rounding)
    bits = np.asarray(bits)
    if bits.dtype != np.uint16:
        raise TypeError(f"bits must be a uint16 array of FP16 patterns, not {bits.dtype}")
    x = bits.view(np.float16)
    n = x.shape[-1]
    if static_exponent_code is None:
        t = bfp.quantize(x, n, m, rounding, nonfinite="saturate")
        codes = t.exponent_codes
    else:
        code = check_int("static_exponent_code", static_exponent_code, 0, 255)
        e = code - E8M0_BIAS
        # e = 128 (code 0xFF) is outside what bfp.quantize accepts; it scales every FP16
        # value below 2**-(128-16+2-m) <= 2**-98, which rounds to zero exactly as e = 127
        # does, so e = 127 gives the same mantissas.
        t = bfp.quantize(x, n, m, rounding, exponent=min(e, 127), nonfinite="saturate")
        codes = np.full(x.shape[:-1], code, np.uint8)
    return QuantizedBlocks(
        exponent_codes=codes.reshape(x.shape[:-1]),
        mantissas=t.mantissas,
        saturated=t.saturations[..., 0],
        nonfinite=t.nonfinite[..., 0],
    )


# --- wide fixed point to FP16 ------------------------------------------------------------

def _fixed_to_fp16_one(a: int, lsb: int, away: bool, saturate: bool) -> tuple[int, bool]:
    """One exact integer ``a`` scaled by ``2**lsb`` to FP16 bits; returns (bits, overflow)."""
    sign = 0x8000 if a < 0 else 0
    mag = -a if a < 0 else a
    if mag == 0:
        return 0, False                     # an exact zero is +0
    top = mag.bit_length() - 1 + lsb        # floor(log2(|value|))
    quantum = max(top - 10, -24)            # exponent of the result's last place
    shift = quantum - lsb
    if shift <= 0:
        sig = mag << -shift
    else:
        sig = mag >> shift
        rest = mag & ((1 << shift) - 1)
        half = 1 << (shift - 1)
        if rest > half or (rest == half and (away or sig & 1)):
            sig += 1
    if sig == 1 << 11:                      # rounding carried into a new binade
        sig >>= 1
        quantum += 1
    if sig < 1 << 10:                       # subnormal (quantum is -24), or zero
        return sign | sig, False
    biased = quantum + 25
    if biased >= 31:
        return sign | (FP16_MAX_BITS if saturate else 0x7C00), True
    return sign | (biased << 10) | (sig - (1 << 10)), False


def fixed_to_fp16(a, lsb_exponent: int, rounding=Rounding.NEAREST_EVEN,
                  saturate: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Convert exact integers ``a * 2**lsb_exponent`` to FP16, rounding once.

    This is the MVM's BFP-long to FP16 converter. ``a`` may hold Python integers of any
    size (``object`` arrays) or NumPy integers.

    Parameters
    ----------
    a : integer array
    lsb_exponent : int
        Weight of the least significant bit of ``a``.
    rounding : Rounding
        The MVM uses nearest-even; nearest-away is offered for conformance tests.
    saturate : bool
        True (the MVM): results beyond the FP16 range become +-65504. False: +-inf (IEEE).

    Returns
    -------
    bits : uint16 array, FP16 patterns. Zero is +0; a negative value that rounds to zero
        is -0, as in IEEE 754.
    overflow : bool array, True where the rounded magnitude exceeded 65504.
    """
    away = Rounding.parse(rounding) is Rounding.NEAREST_AWAY
    lsb = int(lsb_exponent)
    flat = np.asarray(a, dtype=object).reshape(-1)
    out = np.empty(flat.shape, np.uint16)
    over = np.empty(flat.shape, bool)
    for i, value in enumerate(flat):        # exact big-integer work; one row per output
        out[i], over[i] = _fixed_to_fp16_one(int(value), lsb, away, saturate)
    shape = np.shape(a)
    return out.reshape(shape), over.reshape(shape)


# --- MVM: tile products, BFP-long accumulation, narrow-accumulator check -------------------

def acc_lsb(mantissa_bits_v: int, mantissa_bits_w: int) -> int:
    """Exponent of the BFP-long accumulator's least significant bit.

    ``2 * (-24) - (m_v - 2) - (m_w - 2)``: the smallest product exponent of two blocks
    whose exponents come from FP16 values, so those products are accumulated exactly.
    """
    return 2 * MVM_EXP_EXACT_MIN - (mantissa_bits_v - 2) - (mantissa_bits_w - 2)


def term_exponents(codes_v, codes_w, mantissa_bits_v: int, mantissa_bits_w: int):
    """Exponent of each tile product: ``e_v[c] + e_w[i, c] - (m_v - 2) - (m_w - 2)``.

    ``codes_v`` is ``(C,)``, ``codes_w`` is ``(rows, C)``; returns int64 ``(rows, C)``.

    Raises ``ValueError`` if a block exponent exceeds 15, which the device rejects.
    """
    ev = np.asarray(codes_v, np.int64) - E8M0_BIAS
    ew = np.asarray(codes_w, np.int64) - E8M0_BIAS
    for name, e in (("vector", ev), ("weight", ew)):
        if e.size and e.max() > MVM_EXP_MAX:
            raise ValueError(f"{name} block exponent {int(e.max())} exceeds {MVM_EXP_MAX}, "
                             f"the largest the MVM accepts")
    return ev[None, :] + ew - (mantissa_bits_v - 2) - (mantissa_bits_w - 2)


def tile_products(qv, qw) -> np.ndarray:
    """Exact tile dot products ``d[i, c] = sum_j qv[c, j] * qw[i, c, j]`` (int64).

    ``qv``: ``(C, N)`` vector mantissas; ``qw``: ``(rows, C, N)`` weight mantissas.
    """
    return np.einsum("cj,icj->ic", np.asarray(qv, np.int64), np.asarray(qw, np.int64))


def _shift_floor(d, shift):
    """``floor(d * 2**shift)`` for Python ints, elementwise over object arrays."""
    return np.frompyfunc(lambda v, s: v << s if s >= 0 else v >> -s, 2, 1)(d, shift)


def accumulate(d, exps, lsb: int, axis: int = -1):
    """BFP-long accumulation: ``sum_c floor(d[..., c] * 2**(exps[..., c] - lsb))``.

    Each term is placed on the accumulator grid on its own (bits below ``2**lsb`` are
    dropped by flooring, which never happens for exponents of FP16 origin), so the exact
    integer sum does not depend on the order of the terms or the number of tile engines.
    Returns Python integers (``object`` array), in units of ``2**lsb``.
    """
    terms = _shift_floor(np.asarray(d, dtype=object),
                         (np.asarray(exps, np.int64) - lsb).astype(object))
    return terms.sum(axis=axis) if terms.shape[axis] else np.zeros(
        np.delete(terms.shape, axis), object)


class NarrowCounts(NamedTuple):
    """Values that do not fit a k-bit signed integer, by where they arise."""
    products: int
    tree: int
    cross_tile: int

    @property
    def total(self) -> int:
        return self.products + self.tree + self.cross_tile


def _not_fit(v, k):
    return (v < -(1 << (k - 1))) | (v > (1 << (k - 1)) - 1)


def narrow_overflows(qv, qw, exps, lsb: int, k: int) -> NarrowCounts:
    """Count the narrow-accumulator events of one matrix-vector product.

    Parameters
    ----------
    qv : ``(C, N)`` vector mantissas, N a power of two.
    qw : ``(rows, C, N)`` weight mantissas.
    exps : ``(rows, C)`` tile product exponents (:func:`term_exponents`).
    lsb : accumulator LSB exponent (:func:`acc_lsb`).
    k : check width, 1..64.

    Events (``docs/numerics.md``): every mantissa product; every node of the balanced
    pairwise adder tree over lanes 0..N-1 (N-1 nodes, the root included); and, in logical
    column-tile order, every accumulator value after adding a tile ``j >= 1`` whose tile
    product is non-zero, taken in units of that tile's product exponent (floored).
    """
    k = check_int("k", k, 1, 64)
    qv = np.asarray(qv, np.int64)
    qw = np.asarray(qw, np.int64)
    level = qw * qv[None, :, :]
    n = level.shape[-1]
    if n & (n - 1):
        raise ValueError(f"N must be a power of two for the adder tree, not {n}")
    products = int(_not_fit(level, k).sum())
    tree = 0
    while level.shape[-1] > 1:
        level = level[..., 0::2] + level[..., 1::2]
        tree += int(_not_fit(level, k).sum())
    d = level[..., 0]
    cross = 0
    if d.shape[1] > 1:
        terms = _shift_floor(d.astype(object), (np.asarray(exps, np.int64) - lsb).astype(object))
        running = np.cumsum(terms, axis=1)
        units = _shift_floor(running, (lsb - np.asarray(exps, np.int64)).astype(object))
        hit = _not_fit(units[:, 1:], k) & (d[:, 1:] != 0)
        cross = int(hit.sum())
    return NarrowCounts(products, tree, cross)


class MvmResult(NamedTuple):
    """Outputs and events of one matrix-vector product (:func:`mvm`)."""
    out_bits: np.ndarray        # uint16 (rows,) FP16 results
    accumulators: np.ndarray    # object (rows,) BFP-long values in units of 2**lsb
    lsb: int
    vector_saturated: int       # vector quantizer clamps
    vector_nonfinite: int       # inf/NaN in the input vector
    narrow: NarrowCounts
    output_saturated: int       # results clamped to +-65504


def mvm(x_bits, codes_w, qw, *, n: int, mantissa_bits_v: int, mantissa_bits_w: int,
        rounding=Rounding.NEAREST_EVEN, static_exponent_code: int | None = None,
        narrow_width: int = 64) -> MvmResult:
    """Reference matrix-vector product of the NPU's MVM.

    Parameters
    ----------
    x_bits : uint16 ``(cols,)`` FP16 input vector (logical length).
    codes_w : uint8 ``(rows, C)`` weight exponent codes, one per tile row.
    qw : int ``(rows, C * n)`` weight mantissas (zero in the column padding).
        ``codes_w`` and ``qw`` are what the MRF holds: the weight matrix quantized along
        its rows in blocks of ``n`` (``host.numerics.bfp.quantize`` or the matrix quantizer).
    n : native dimension; the vector is zero padded to ``C * n`` and quantized per
        native vector with the given rounding and static exponent.

    Returns
    -------
    MvmResult
    """
    x_bits = np.asarray(x_bits, np.uint16)
    rows, width = np.shape(qw)
    c = width // n
    if width != c * n or np.shape(codes_w) != (rows, c):
        raise ValueError(f"qw {np.shape(qw)} and codes_w {np.shape(codes_w)} do not hold "
                         f"{c} blocks of {n} per row")
    if x_bits.shape[-1] > width:
        raise ValueError(f"x has {x_bits.shape[-1]} elements but the matrix has {width} "
                         f"columns")
    xv = bfp.split_vector(np.pad(x_bits, (0, width - x_bits.shape[-1])), n)
    qb = quantize_fp16(xv, mantissa_bits_v, rounding, static_exponent_code)
    exps = term_exponents(qb.exponent_codes, codes_w, mantissa_bits_v, mantissa_bits_w)
    lsb = acc_lsb(mantissa_bits_v, mantissa_bits_w)
    qw3 = np.asarray(qw, np.int64).reshape(rows, c, n)
    d = tile_products(qb.mantissas, qw3)
    acc = accumulate(d, exps, lsb)
    out, over = fixed_to_fp16(acc, lsb, Rounding.NEAREST_EVEN, saturate=True)
    return MvmResult(
        out_bits=out, accumulators=acc, lsb=lsb,
        vector_saturated=int(qb.saturated.sum()), vector_nonfinite=int(qb.nonfinite.sum()),
        narrow=narrow_overflows(qb.mantissas, qw3, exps, lsb, narrow_width),
        output_saturated=int(over.sum()),
    )
