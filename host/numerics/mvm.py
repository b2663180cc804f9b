"""Bit-exact reference kernels for the NPU's numerics (see ``docs/numerics.md``).

These functions are the executable specification that the gateware is tested against.
They work on FP16 bit patterns (``uint16``) where the device does, and on exact integers
elsewhere.
"""

from __future__ import annotations

import math
import os
import sys
import warnings
from typing import NamedTuple

import numpy as np

from host.numerics import bfp
from host.numerics.fp16 import finite_to_float32 as _finite_fp16_to_f32
from host.numerics.fp16 import round_to_bits as _round_to_bits
from host.spec.formats import (
    E8M0_BIAS, EXP_MAX, FP16_MAX_BITS, MANTISSA_BITS_MAX, MANTISSA_BITS_MIN,
    MVM_EXP_EXACT_MIN, MVM_EXP_MAX, ZERO_BLOCK_EXP, Rounding, check_int, mantissa_max,
)

__all__ = [
    "QuantizedBlocks", "quantize_fp16", "fp16_bits", "fp16_from_bits",
    "fixed_to_fp16", "acc_lsb", "term_exponents", "tile_products", "accumulate",
    "NarrowCounts", "narrow_overflows", "MvmResult", "mvm",
    "fixed_to_fp16_exact", "accumulate_exact", "narrow_overflows_exact", "mvm_exact",
    "PreparedWeights", "prepare_weights", "PreparedGroup", "prepare_group", "mvm_group",
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
    return _quantize_values(bits, mantissa_bits, rounding, static_exponent_code)[0]


def _quantize_values(bits, mantissa_bits, rounding, static_exponent_code):
    """:func:`quantize_fp16` and, when its fast form ran, the dequantized values
    ``q * 2**(e - (m - 2))`` as float64 (else None)."""
    m = check_int("mantissa_bits", mantissa_bits, MANTISSA_BITS_MIN, MANTISSA_BITS_MAX)
    rounding = Rounding.parse(rounding)
    bits = np.asarray(bits)
    if bits.dtype != np.uint16:
        raise TypeError(f"bits must be a uint16 array of FP16 patterns, not {bits.dtype}")
    if static_exponent_code is not None:
        check_int("static_exponent_code", static_exponent_code, 0, 255)
    if static_exponent_code is None and bits.size >= _QUANTIZE_F32_MIN:
        fast = _quantize_fp16_f32(bits, m, rounding)
    else:
        fast = _quantize_fp16_f64(bits, m, rounding, static_exponent_code)
    if fast is not None:
        return fast
    return _quantize_fp16_bfp(bits, m, rounding, static_exponent_code), None


def _quantize_fp16_f64(bits, m: int, rounding: Rounding, static_exponent_code):
    """The fast form of :func:`_quantize_fp16_bfp` (equal to it, tested in
    ``tests/numerics/test_quantize_fp16_fast.py``) for finite inputs, with the
    dequantized values (float64, exact); None when ``bits`` holds an inf or NaN, or no
    blocks.

    Every FP16 value is exact in float64, and so is ``x * 2**(m - 2 - e)`` for any block
    exponent ``e`` from -127 to 127 (a power of two times it stays a normal float64), so
    ``rint`` (ties to even) and the tie test of nearest-away see the exact value, as
    :func:`host.numerics.bfp.quantize` does in float32 (where the scaled values the
    rounding can tell apart, those of magnitude 2**-2 or more, are exact too). The
    dynamic exponent is ``floor(log2(max |x|))`` of the block, read exactly by
    ``frexp``, and -127 for a zero block (the float32 exponent field bfp reads: FP16
    values are normal float32 numbers). A static code 0xFF scales as 127, as there.
    """
    if bits.size == 0 or bits.shape[-1] == 0:
        return None
    mag = np.bitwise_and(bits, 0x7FFF)
    amax = _block_max(mag) if mag.size > 1024 else mag.max(-1)  # |x| bits per block
    if int(amax.max()) >= 0x7C00:                                 # inf or NaN
        return None
    if static_exponent_code is None:
        e = np.frexp(amax.view(np.float16).astype(np.float64))[1] - 1
        e = np.where(amax == 0, ZERO_BLOCK_EXP, e)
        codes = (e + E8M0_BIAS).astype(np.uint8)
        nzb = amax != 0         # the largest |x| of a block rounds to 2**(m-2) or more
    else:
        code = int(static_exponent_code)
        e = np.full(amax.shape, min(code - E8M0_BIAS, EXP_MAX), np.int64)
        codes = np.full(amax.shape, code, np.uint8)
        nzb = None
    grid = e - (m - 2)
    top = mantissa_max(m)
    blocks = bits.reshape(-1, bits.shape[-1])
    n = blocks.shape[1]
    # Multiplying by a power of two is exact here (2**-153 .. 2**141 times an FP16 value
    # stays a normal float64), and much faster than ldexp with an integer array.
    down = np.ldexp(1.0, -grid).reshape(-1, 1)
    up = np.ldexp(1.0, grid).reshape(-1, 1)
    q = np.empty(blocks.shape, np.int16)
    # The dequantized values, the mantissas scaled back, as float32: exact, for |q| <
    # 2**15 and the grid exponent from -141 to 15 (multiples of 2**-149 below 2**31).
    values = np.empty(blocks.shape, np.float32)
    saturated = np.zeros(len(blocks), np.int64)
    # A piece of blocks at a time through one float64 buffer (a large batch would
    # otherwise make several fresh full-size temporaries; the arithmetic is per element).
    step = max(1, _QUANTIZE_PIECE // n)
    buf = np.empty((min(step, len(blocks)), n))
    for b0 in range(0, len(blocks), step):
        b1 = min(len(blocks), b0 + step)
        xs = buf[:b1 - b0]
        np.copyto(xs, blocks[b0:b1].view(np.float16))
        np.multiply(xs, down[b0:b1], out=xs)
        if rounding is Rounding.NEAREST_EVEN:
            np.rint(xs, out=xs)
        else:
            whole = np.trunc(xs)
            xs[...] = whole + np.copysign(np.abs(xs - whole) >= 0.5, xs)
        over = (xs > top) | (xs < -top)
        if over.any():
            np.clip(xs, -top, top, out=xs)
            saturated[b0:b1] = _block_count(over)
        np.copyto(q[b0:b1], xs, casting="unsafe")          # integers up to top: exact
        np.multiply(xs, up[b0:b1], out=values[b0:b1], casting="same_kind")
    q, values = q.reshape(bits.shape), values.reshape(bits.shape)
    if nzb is None:
        nzb = _block_any(q)
    # Also the grid exponent of each block (e - (m - 2); e = 127 for the static code 0xFF,
    # which the MVM refuses) and which blocks have a non-zero mantissa.
    return (QuantizedBlocks(codes, q, saturated.reshape(amax.shape),
                            np.zeros(amax.shape, np.int64)), (values, grid, nzb))


#: Elements per piece of the fast quantizer: its float64 scratch is at most 2 MiB (one
#: piece for the MVM's inputs; smaller pieces measured slower there).
_QUANTIZE_PIECE = 1 << 18
#: Inputs from this many elements take :func:`_quantize_fp16_f32` (dynamic exponent).
_QUANTIZE_F32_MIN = 1024


def _quantize_fp16_f32(bits, m: int, rounding: Rounding):
    """:func:`_quantize_fp16_f64` with the dynamic exponent, in float32 and with every
    element-wise step over the whole array (no short per-block loops): equal to it in
    every field and value (``tests/numerics/test_quantize_fp16_fast.py``).

    Why float32 is exact here: every FP16 value is a float32 number; with ``e`` the
    block exponent (-24 to 15 for a non-zero block) the scale ``2**(m - 2 - e)`` is from
    2**-15 to 2**38, and the scaled values ``x * 2**(m - 2 - e)`` of a non-zero ``x`` lie
    from 2**-39 to 2**(m - 1): normal float32 numbers with at most 11 significant bits,
    so the product is exact and ``rint`` and the tie test see the exact value. The
    dequantized values ``q * 2**(e - (m - 2))`` (``|q| < 2**15``, at least 2**-38) are
    exact too. A zero block (e = -127, whose scale would overflow float32) is scaled by
    1: its values are zeros whatever the scale. The block exponent is read from a table
    of ``floor(log2 |x|)`` over the finite magnitudes (:data:`_FP16_LOG2`); the
    per-block scales are repeated to one per element (``np.repeat``), which makes the
    products whole-array loops. With the dynamic exponent ``|x * scale| < 2**(m-1)``,
    so a rounded value is at most one past the top code: the saturated values are
    exactly those equal to ``+-(top + 1)``.
    """
    if bits.size == 0 or bits.shape[-1] == 0:
        return None
    n = bits.shape[-1]
    blocks = bits.reshape(-1, n)
    amax = _block_max(np.bitwise_and(blocks, 0x7FFF))            # |x| bits per block
    if int(amax.max()) >= 0x7C00:                                 # inf or NaN
        return None
    e = np.take(_FP16_LOG2, amax)                                 # -127 for zero blocks
    nzb = amax != 0
    grid = e - (m - 2)
    top = mantissa_max(m)
    x = _finite_fp16_to_f32(blocks).reshape(-1)
    down = np.repeat(np.ldexp(np.float32(1), np.where(nzb, -grid, 0)), n)
    np.multiply(x, down, out=x)
    if rounding is Rounding.NEAREST_EVEN:
        np.rint(x, out=x)
    else:
        whole = np.trunc(x)
        x = whole + np.copysign(np.abs(x - whole) >= 0.5, x)
    if float(x.max()) > top or float(x.min()) < -top:
        over = (x > top) | (x < -top)
        saturated = _block_count(over.reshape(-1, n))
        np.clip(x, -top, top, out=x)
    else:
        saturated = np.zeros(len(blocks), np.int64)
    q = x.astype(np.int16)                              # integers up to top: exact
    np.divide(x, down, out=x)                           # down holds powers of two: exact
    shape = bits.shape
    codes = (e + E8M0_BIAS).astype(np.uint8)
    return (QuantizedBlocks(codes.reshape(shape[:-1]), q.reshape(shape),
                            saturated.reshape(shape[:-1]), np.zeros(shape[:-1], np.int64)),
            (x.reshape(shape), grid.reshape(shape[:-1]), nzb.reshape(shape[:-1])))


#: ``floor(log2 x)`` of every finite FP16 magnitude pattern (0 .. 0x7BFF; -14 .. 15 for
#: normal numbers, -24 .. -15 for subnormals), and -127 (the zero block's exponent) for 0.
_FP16_LOG2 = np.concatenate([
    [np.int64(ZERO_BLOCK_EXP)],
    np.frexp(np.arange(1, 0x7C00, dtype=np.uint16).view(np.float16).astype(np.float64))[1]
    .astype(np.int64) - 1])


def _quantize_fp16_bfp(bits, m: int, rounding: Rounding, static_exponent_code):
    """:func:`quantize_fp16` through :func:`host.numerics.bfp.quantize`: the definition
    (and the path for inf and NaN); arguments checked by the caller."""
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


def fixed_to_fp16_exact(a, lsb_exponent: int, rounding=Rounding.NEAREST_EVEN,
                        saturate: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Convert exact integers ``a * 2**lsb_exponent`` to FP16, rounding once.

    The executable definition of the MVM's BFP-long to FP16 converter, one element at a
    time in Python integers; :func:`fixed_to_fp16` is the fast form, tested equal to it,
    and documents the parameters and results. ``a`` may hold Python integers of any size
    (``object`` arrays) or NumPy integers.
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
    A batch of vectors, ``codes_v`` ``(..., C)``, gives ``(..., rows, C)``.

    Raises ``ValueError`` if a block exponent exceeds 15, which the device rejects.
    """
    ev = np.asarray(codes_v, np.int64) - E8M0_BIAS
    ew = np.asarray(codes_w, np.int64) - E8M0_BIAS
    for name, e in (("vector", ev), ("weight", ew)):
        if e.size and e.max() > MVM_EXP_MAX:
            raise ValueError(f"{name} block exponent {int(e.max())} exceeds {MVM_EXP_MAX}, "
                             f"the largest the MVM accepts")
    return ev[..., None, :] + ew - (mantissa_bits_v - 2) - (mantissa_bits_w - 2)


def tile_products(qv, qw) -> np.ndarray:
    """Exact tile dot products ``d[i, c] = sum_j qv[c, j] * qw[i, c, j]`` (int64).

    ``qv``: ``(C, N)`` vector mantissas; ``qw``: ``(rows, C, N)`` weight mantissas.
    """
    return np.einsum("cj,icj->ic", np.asarray(qv, np.int64), np.asarray(qw, np.int64))


def _shift_floor(d, shift):
    """``floor(d * 2**shift)`` for Python ints, elementwise over object arrays."""
    return np.frompyfunc(lambda v, s: v << s if s >= 0 else v >> -s, 2, 1)(d, shift)


def accumulate_exact(d, exps, lsb: int, axis: int = -1):
    """BFP-long accumulation: ``sum_c floor(d[..., c] * 2**(exps[..., c] - lsb))``.

    The executable definition, in Python integers; :func:`accumulate` is the fast form.

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


def narrow_overflows_exact(qv, qw, exps, lsb: int, k: int) -> NarrowCounts:
    """Count the narrow-accumulator events of one matrix-vector product.

    The executable definition (the cross-tile sums in Python integers);
    :func:`narrow_overflows` is the fast form, tested equal to it, and documents the
    parameters and the events.
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


def _matrix_shape(x_bits, codes_w, qw, n: int) -> tuple[int, int, int]:
    """``(rows, width, C)`` of a product's matrix, checked against its exponent codes and
    the input ``x_bits`` (``(..., cols)``); ValueError naming the shapes otherwise."""
    rows, width = np.shape(qw)
    c = width // n
    if width != c * n or np.shape(codes_w) != (rows, c):
        raise ValueError(f"qw {np.shape(qw)} and codes_w {np.shape(codes_w)} do not hold "
                         f"{c} blocks of {n} per row")
    if x_bits.shape[-1] > width:
        raise ValueError(f"x has {x_bits.shape[-1]} elements but the matrix has {width} "
                         f"columns")
    return rows, width, c


def mvm_exact(x_bits, codes_w, qw, *, n: int, mantissa_bits_v: int, mantissa_bits_w: int,
              rounding=Rounding.NEAREST_EVEN, static_exponent_code: int | None = None,
              narrow_width: int | None = 64) -> MvmResult:
    """Reference matrix-vector product of the NPU's MVM: the executable definition.

    Every step in Python integers (:func:`accumulate_exact`, :func:`fixed_to_fp16_exact`,
    :func:`narrow_overflows_exact`); :func:`mvm` is the fast form, tested equal to it.

    Parameters
    ----------
    x_bits : uint16 ``(cols,)`` FP16 input vector (logical length).
    codes_w : uint8 ``(rows, C)`` weight exponent codes, one per tile row.
    qw : int ``(rows, C * n)`` weight mantissas (zero in the column padding).
        ``codes_w`` and ``qw`` are what the MRF holds: the weight matrix quantized along
        its rows in blocks of ``n`` (``host.numerics.bfp.quantize`` or the matrix quantizer).
    n : native dimension; the vector is zero padded to ``C * n`` and quantized per
        native vector with the given rounding and static exponent.
    narrow_width : int 1..64 or None
        ``k`` of the narrow-accumulator check; None: a build without the check
        (``MvmConfig.narrow_check`` False), every narrow count 0.

    Returns
    -------
    MvmResult
    """
    x_bits = np.asarray(x_bits, np.uint16)
    if narrow_width is not None:
        check_int("k", narrow_width, 1, 64)
    rows, width, c = _matrix_shape(x_bits, codes_w, qw, n)
    xv = bfp.split_vector(np.pad(x_bits, (0, width - x_bits.shape[-1])), n)
    qb = quantize_fp16(xv, mantissa_bits_v, rounding, static_exponent_code)
    exps = term_exponents(qb.exponent_codes, codes_w, mantissa_bits_v, mantissa_bits_w)
    lsb = acc_lsb(mantissa_bits_v, mantissa_bits_w)
    qw3 = np.asarray(qw, np.int64).reshape(rows, c, n)
    d = tile_products(qb.mantissas, qw3)
    acc = accumulate_exact(d, exps, lsb)
    out, over = fixed_to_fp16_exact(acc, lsb, Rounding.NEAREST_EVEN, saturate=True)
    return MvmResult(
        out_bits=out, accumulators=acc, lsb=lsb,
        vector_saturated=int(qb.saturated.sum()), vector_nonfinite=int(qb.nonfinite.sum()),
        narrow=(NarrowCounts(0, 0, 0) if narrow_width is None
                else narrow_overflows_exact(qb.mantissas, qw3, exps, lsb, narrow_width)),
        output_saturated=int(over.sum()),
    )


# --- fast forms -------------------------------------------------------------------------
#
# The public kernels below compute exactly what the ``*_exact`` definitions above compute,
# bit for bit (tests/numerics/test_fast_kernels.py), in int64 NumPy wherever a bound proved
# in the comments allows it, and through the exact Python-integer code for the rest only.
# docs/numerics.md ("Fast kernels") gives the argument in short.

#: Largest |lsb| the int64 converter takes; beyond it (never from an MVM) the exact path.
_LSB_FAST_MAX = 1 << 40
_U1 = np.uint64(1)
#: Dtypes whose magnitude bound is read off the dtype (no pass over the data).
_DTYPE_MAG = {np.dtype(t): max(abs(int(np.iinfo(t).min)), int(np.iinfo(t).max))
              for t in (np.int8, np.int16, np.int32, np.uint8, np.uint16, np.uint32)}


def _mag_bound(x: np.ndarray) -> int:
    """An upper bound of ``|x|`` over the integer array ``x``: from its dtype when that is
    at most 32 bits wide, from the data otherwise."""
    bound = _DTYPE_MAG.get(x.dtype)
    if bound is not None:
        return bound
    if x.size == 0:
        return 0
    return max(int(x.max()), -int(x.min()))


def _bit_length_u64(mag: np.ndarray) -> np.ndarray:
    """``int.bit_length`` of each element of a uint64 array (0 for 0), as int64."""
    e = np.frexp(mag.astype(np.float64))[1].astype(np.int64)
    # The float64 rounding may carry 2**b - small up to 2**b, one binade too high: then
    # mag >> (e - 1) is 0, and e is one too large. (mag <= 2**64 - 1 gives e <= 64.)
    high = (mag >> np.maximum(e - 1, 0).astype(np.uint64)) == 0
    return e - (high & (e > 0))


#: The float64 route of :func:`_i64_to_fp16`: ``|a| < 2**53`` and lsb in this range.
_FLOAT_LSB_MIN, _FLOAT_LSB_MAX = -1022, 970


def _i64_to_fp16(a: np.ndarray, lsb, away: bool, saturate: bool):
    """:func:`fixed_to_fp16_exact` of int64 ``a`` with a weight ``2**lsb`` per element
    (``lsb`` int64, broadcast to ``a``, ``|lsb| <= 2**40``); returns (bits, overflow).

    Nearest-even, ``|a| < 2**53`` and ``-1022 <= lsb <= 970``: ``a`` is a float64 exactly,
    and so is ``a * 2**lsb`` (``ldexp``; a power of two times it stays a normal float64,
    ``2**-1022 <= |a| 2**lsb < 2**1023``), and NumPy's float64 to float16 cast rounds it
    once, to nearest even, subnormals included, with -0 for a negative value that rounds
    to zero and +-inf beyond 65504 (0x7C00 - 1 is 0x7BFF, the saturated code). Everything
    else takes :func:`_i64_to_fp16_int`.
    """
    a = np.asarray(a, np.int64)
    lsb = np.asarray(lsb, np.int64)
    if away:
        return _i64_to_fp16_int(a, lsb, away, saturate)
    ok = (np.abs(a) < 1 << 53) & (lsb >= _FLOAT_LSB_MIN) & (lsb <= _FLOAT_LSB_MAX)
    if ok.all():
        return _f64_to_fp16(a, lsb, saturate)
    lsb = np.broadcast_to(lsb, a.shape)
    bits = np.empty(a.shape, np.uint16)
    over = np.empty(a.shape, bool)
    bits[ok], over[ok] = _f64_to_fp16(a[ok], lsb[ok], saturate)
    bits[~ok], over[~ok] = _i64_to_fp16_int(a[~ok], lsb[~ok], away, saturate)
    return bits, over


def _f64_to_fp16(a, lsb, saturate: bool):
    """The float64 route of :func:`_i64_to_fp16` (its conditions hold)."""
    with np.errstate(over="ignore"):
        half = np.ldexp(a.astype(np.float64), lsb).astype(np.float16)
    bits = np.array(half.view(np.uint16))
    over = (bits & 0x7FFF) == 0x7C00
    if saturate:
        bits[over] -= 1
    return bits, over


def _i64_to_fp16_int(a: np.ndarray, lsb, away: bool, saturate: bool):
    """:func:`fixed_to_fp16_exact` of int64 ``a`` (the whole int64 range) with a weight
    ``2**lsb`` per element (``lsb`` int64, broadcast to ``a``, ``|lsb| <= 2**40``).

    The steps are those of ``_fixed_to_fp16_one``, elementwise. The magnitude is uint64
    (``|int64 min| = 2**63`` fits); every left shift is by ``10 - (bit_length - 1)`` or
    less, so the significand stays below ``2**11``; right shifts of 64 or more, which
    NumPy does not define, are handled apart: they leave 0 and round up only on the tie
    ``mag == 2**63``, shift 64, nearest-away.
    """
    a = np.asarray(a, np.int64)
    lsb = np.asarray(lsb, np.int64)
    neg = a < 0
    mag = np.abs(a).astype(np.uint64)             # int64 min -> 2**63, exactly
    top = _bit_length_u64(mag) - 1 + lsb           # floor(log2(|value|)) where a != 0
    quantum = np.maximum(top - 10, -24)
    shift = quantum - lsb
    right = np.clip(shift, 0, 63).astype(np.uint64)
    left = np.clip(-shift, 0, 63).astype(np.uint64)
    sig = np.where(shift <= 0, mag << left, mag >> right)
    sig[shift >= 64] = 0
    rest = mag & ((_U1 << right) - _U1)
    half = _U1 << (np.maximum(right, _U1) - _U1)
    tie_up = True if away else (sig & _U1) == _U1
    up = (shift > 0) & (shift < 64) & ((rest > half) | ((rest == half) & tie_up))
    if away:
        up |= (shift == 64) & (mag == np.uint64(1 << 63))
    sig = (sig + up).astype(np.int64)
    carry = sig == 1 << 11                       # rounding carried into a new binade
    sig[carry] = 1 << 10
    quantum = quantum + carry
    normal = sig >= 1 << 10                      # else subnormal (quantum -24) or zero
    biased = quantum + 25
    over = normal & (biased >= 31)
    bits = np.where(normal, (np.minimum(biased, 31) << 10) | (sig - (1 << 10)), sig)
    bits[over] = FP16_MAX_BITS if saturate else 0x7C00
    bits |= np.where(neg, 0x8000, 0)
    return bits.astype(np.uint16), over


def fixed_to_fp16(a, lsb_exponent: int, rounding=Rounding.NEAREST_EVEN,
                  saturate: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Convert exact integers ``a * 2**lsb_exponent`` to FP16, rounding once.

    This is the MVM's BFP-long to FP16 converter, vectorized: integers in the int64
    range take an int64 path, larger Python integers (``object`` arrays) the exact
    per-element definition :func:`fixed_to_fp16_exact`, which this equals bit for bit.

    Parameters
    ----------
    a : integer array (NumPy integers, or Python integers of any size in an ``object``
        array)
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
    arr = np.asarray(a)
    if abs(lsb) > _LSB_FAST_MAX or not (arr.dtype.kind in "biu" or arr.dtype == object):
        return fixed_to_fp16_exact(a, lsb, rounding, saturate)
    if arr.dtype.kind in "bi" or (arr.dtype.kind == "u" and arr.dtype.itemsize < 8):
        return _i64_to_fp16(arr.astype(np.int64), lsb, away, saturate)
    flat = arr.reshape(-1)
    # object or uint64: the elements in the int64 range go the fast way
    fits = ((flat >= -(1 << 63)) & (flat < 1 << 63)).astype(bool)
    out = np.empty(flat.shape, np.uint16)
    over = np.empty(flat.shape, bool)
    out[fits], over[fits] = _i64_to_fp16(flat[fits].astype(np.int64), lsb, away, saturate)
    if not fits.all():
        out[~fits], over[~fits] = fixed_to_fp16_exact(flat[~fits], lsb, rounding, saturate)
    return out.reshape(arr.shape), over.reshape(arr.shape)


# BFP-long accumulation in int64.
#
# Row r holds terms floor(d_c * 2**sh_c), sh_c = E_c - L, of which those with d_c != 0
# matter. Let s = min sh_c over them and spread = max sh_c - s. When s >= 0 (every shift
# is a left shift, so nothing is floored) every term is d_c * 2**(sh_c - s) * 2**s, and
#     |sum over any subset of the C terms| <= C * max|d| * 2**spread
#                                          < 2**(ceil(log2 C) + bitlen(max|d|) + spread).
# The row is *fast* when that exponent is at most 62 (_FAST_BITS): then the terms, every
# partial sum and the total fit int64 with room to spare, and A = a * 2**s with
# a = sum_c d_c << (sh_c - s) computed in int64 is exact. Other rows (a spread too wide,
# e.g. x = w = [60000 x4 | 2**-24]; or a floored term, from an exponent below -24) take
# the exact Python-integer path, those rows only.
_FAST_BITS = 62


def _fast_rows(d: np.ndarray, sh: np.ndarray):
    """Classify and accumulate rows: ``d`` int64 ``(..., C)`` tile products, ``sh``
    int64 ``(..., C)`` = ``E - L``.

    Returns ``(terms, a, s, fast, nz)``: ``terms`` int64 ``(..., C)`` the row's terms in
    units of ``2**s`` (fast rows only; 0 where ``d`` is 0), ``a`` their sum, ``s`` int64
    ``(...)``, ``fast`` bool ``(...)`` (see the bound above), ``nz = d != 0``.
    """
    c = d.shape[-1]
    nz = d != 0
    any_nz = nz.any(-1)
    big = np.int64(1 << 62)
    shmin = np.where(nz, sh, big).min(-1) if c else np.zeros(d.shape[:-1], np.int64)
    shmax = np.where(nz, sh, -big).max(-1) if c else shmin
    dbits = _mag_bound(d).bit_length()
    budget = _FAST_BITS - dbits - (c - 1).bit_length() if c else 0
    fast = ~any_nz | ((shmin >= 0) & (shmax - shmin <= budget))
    if fast.all():
        s = np.where(any_nz, shmin, 0)
        shifts = np.where(nz, sh - s[..., None], 0)                 # 0..budget <= 62
        terms = d << shifts
    else:
        s = np.where(any_nz & fast, shmin, 0)
        shifts = np.where(nz & fast[..., None], sh - s[..., None], 0)
        terms = np.where(fast[..., None], d << shifts, 0)
    return terms, terms.sum(-1), s, fast, nz


def _as_accumulators(a, s, fast, d, exps, lsb):
    """The exact accumulators ``(...)`` (object): ``a << s`` on fast rows, the exact sum
    on the others."""
    if fast.all():
        return np.left_shift(a.astype(object), s.astype(object))
    acc = np.empty(a.shape, object)
    acc[fast] = np.left_shift(a[fast].astype(object), s[fast].astype(object))
    slow = ~fast
    if slow.any():
        acc[slow] = accumulate_exact(d[slow], exps[slow], lsb)
    return acc


def accumulate(d, exps, lsb: int, axis: int = -1):
    """BFP-long accumulation: ``sum_c floor(d[..., c] * 2**(exps[..., c] - lsb))``.

    Each term is placed on the accumulator grid on its own (bits below ``2**lsb`` are
    dropped by flooring, which never happens for exponents of FP16 origin), so the exact
    integer sum does not depend on the order of the terms or the number of tile engines.
    Returns Python integers (``object`` array), in units of ``2**lsb``.

    Rows whose terms provably fit int64 are summed in int64 (see the bound in the source);
    the others, and tile products beyond int64, take :func:`accumulate_exact`, which this
    equals.
    """
    lsb = int(lsb)
    darr = np.asarray(d)
    if darr.dtype == object or darr.dtype.kind == "u" and darr.dtype.itemsize == 8:
        try:
            darr = darr.astype(np.int64)
        except OverflowError:
            return accumulate_exact(d, exps, lsb, axis)
    if darr.dtype.kind not in "bi" and darr.dtype.kind != "u" or abs(lsb) > _LSB_FAST_MAX:
        return accumulate_exact(d, exps, lsb, axis)
    e = np.asarray(exps, np.int64)
    darr, e = np.broadcast_arrays(darr.astype(np.int64), e)
    darr, e = np.moveaxis(darr, axis, -1), np.moveaxis(e, axis, -1)
    if darr.shape[-1] == 0:
        return np.zeros(darr.shape[:-1], object)
    shape = darr.shape[:-1]
    d2 = darr.reshape(-1, darr.shape[-1])
    e2 = e.reshape(d2.shape)
    _, a, s, fast, _ = _fast_rows(d2, e2 - lsb)
    return _as_accumulators(a, s, fast, d2, e2, lsb).reshape(shape)


def _tree_counts(qv, qw, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Products and adder-tree events per job: ``qv`` ``(B, C, N)``, ``qw``
    ``(rows, C, N)``; int64 ``(B,)`` each.

    Every product is at most ``P = max|qv| * max|qw|`` in magnitude and every tree node,
    a sum of at most N products, at most ``N * P``: when ``N * P <= 2**(k-1) - 1`` no
    value can fail to fit and nothing is computed (always so at k = 64 for mantissas of
    16 bits or fewer, ``N <= 2**32``). Otherwise the values are formed in int64 as in
    :func:`narrow_overflows_exact`, a chunk of jobs at a time.
    """
    b, _, n = qv.shape
    products = np.zeros(b, np.int64)
    tree = np.zeros(b, np.int64)
    if n * _mag_bound(qv) * _mag_bound(qw) <= (1 << (k - 1)) - 1:
        return products, tree
    qv64, qw64 = qv.astype(np.int64), qw.astype(np.int64)
    step = max(1, (1 << 22) // max(1, qw.size))
    for j in range(0, b, step):
        level = qw64[None] * qv64[j:j + step, None]          # (b', rows, C, N)
        products[j:j + step] = _not_fit(level, k).sum(axis=(1, 2, 3))
        while level.shape[-1] > 1:
            level = level[..., 0::2] + level[..., 1::2]
            tree[j:j + step] += _not_fit(level, k).sum(axis=(1, 2, 3))
    return products, tree


def _cross_exact_rows(d, sh, k: int) -> np.ndarray:
    """Cross-tile events of rows ``d``, ``sh`` ``(rows, C)`` in Python integers (the
    definition of :func:`narrow_overflows_exact`), per row."""
    if d.shape[-1] < 2:
        return np.zeros(d.shape[0], np.int64)
    terms = _shift_floor(d.astype(object), sh.astype(object))
    running = np.cumsum(terms, axis=1)
    units = _shift_floor(running, (-sh).astype(object))
    return (_not_fit(units[:, 1:], k) & (d[:, 1:] != 0)).sum(axis=1).astype(np.int64)


def _cross_counts(terms, s, fast, nz, d, sh, k: int) -> np.ndarray:
    """Cross-tile events per row ``(...)`` (rule 3 of ``docs/numerics.md`` section 5).

    On a fast row the running sum after tile c is ``A^(c) = a^(c) * 2**s`` with
    ``a^(c)`` the int64 cumulative sum of ``terms`` and ``|a^(c)| < 2**62`` (the bound
    of :func:`_fast_rows`). In units of a non-zero tile's exponent it is
    ``floor(a^(c) * 2**(s - sh_c))`` with ``sh_c >= s``: an arithmetic right shift by
    ``sh_c - s <= 62``, whose magnitude is at most ``|a^(c)| < 2**62``. So at k = 64 no
    fast row can have a cross-tile event, and they are not computed; below 64 they are
    computed in int64 as above. Rows that are not fast take :func:`_cross_exact_rows`.
    """
    count = np.zeros(fast.shape, np.int64)
    if d.shape[-1] < 2:
        return count
    if k < 64:
        running = np.cumsum(terms[..., 1:], axis=-1) + terms[..., :1]
        down = np.where(nz[..., 1:] & fast[..., None], sh[..., 1:] - s[..., None], 0)
        units = running >> down
        hit = _not_fit(units, k) & nz[..., 1:] & fast[..., None]
        count += hit.sum(-1)
    slow = ~fast
    if slow.any():
        count[slow] = _cross_exact_rows(d[slow], sh[slow], k)
    return count


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

    The fast form of :func:`narrow_overflows_exact` (equal to it): no work for the values
    that provably fit (all of them at k = 64 unless a row's exponents spread too widely),
    int64 NumPy for the others, Python integers only for rows beyond the int64 bound.
    """
    k = check_int("k", k, 1, 64)
    qv = np.asarray(qv)
    qw = np.asarray(qw)
    n = qv.shape[-1]
    if n & (n - 1):
        raise ValueError(f"N must be a power of two for the adder tree, not {n}")
    lsb = int(lsb)
    if (abs(lsb) > _LSB_FAST_MAX or qv.dtype.kind not in "biu" or qw.dtype.kind not in "biu"
            or n * _mag_bound(qv) * _mag_bound(qw) >= 1 << 62):
        return narrow_overflows_exact(qv, qw, exps, lsb, k)
    products, tree = _tree_counts(qv[None], qw, k)
    d = tile_products(qv, qw)
    sh = np.asarray(exps, np.int64) - lsb
    terms, _, s, fast, nz = _fast_rows(d, sh)
    cross = _cross_counts(terms, s, fast, nz, d, sh, k)
    return NarrowCounts(int(products[0]), int(tree[0]), int(cross.sum()))


def _tile_products_batch(qv, qw) -> np.ndarray:
    """``d[b, i, c] = sum_j qv[b, c, j] * qw[i, c, j]`` exactly, int64 ``(B, rows, C)``.

    Through a float64 matrix product when every product and partial sum is an integer
    below ``2**53`` (``N * max|qv| * max|qw| < 2**53``; any summation order is then exact,
    fused multiply-adds included), else through int64 ``einsum``.
    """
    n = qv.shape[-1]
    if n * _mag_bound(qv) * _mag_bound(qw) < 1 << 53:
        # (C, rows, N) @ (C, N, B) -> (C, rows, B)
        prod = np.matmul(qw.transpose(1, 0, 2).astype(np.float64),
                         qv.transpose(1, 2, 0).astype(np.float64))
        return prod.transpose(2, 1, 0).astype(np.int64)
    return np.einsum("bcj,icj->bic", qv.astype(np.int64), qw.astype(np.int64))


def _stack_results(results, batch) -> MvmResult:
    """One batched :class:`MvmResult` of the results of single vectors."""
    def stack(values, dtype=None):
        return np.array(values, dtype).reshape(batch + np.shape(values[0]))
    return MvmResult(
        out_bits=stack([r.out_bits for r in results], np.uint16),
        accumulators=stack([r.accumulators for r in results], object),
        lsb=results[0].lsb,
        vector_saturated=stack([r.vector_saturated for r in results], np.int64),
        vector_nonfinite=stack([r.vector_nonfinite for r in results], np.int64),
        narrow=NarrowCounts(*(stack([r.narrow[i] for r in results], np.int64)
                              for i in range(3))),
        output_saturated=stack([r.output_saturated for r in results], np.int64))


# --- the float64 matrix product ----------------------------------------------------------
#
# Write the dequantized operands X[b, c*n + j] = qv[b, c, j] * 2**(e_v[b, c] - (m_v - 2))
# and W[i, c*n + j] = qw[i, c, j] * 2**(e_w[i, c] - (m_w - 2)) as float64 (exact: a
# mantissa below 2**31 times a power of two from 2**-160 to 2**15). Every product
# X[b, .] * W[i, .] is then qv * qw * 2**E with E the tile product exponent, and
# sum_c d[b, i, c] * 2**E[b, i, c] is the accumulator A * 2**lsb when no term is floored.
# Let lo_x[b] be the smallest e_v - (m_v - 2) of the row's non-zero blocks and
# lo_w[i] likewise, g = lo_x[b] + lo_w[i]; every product is an integer multiple of 2**g.
# Let |X[b, .]| < 2**hi_x[b] and |W[i, .]| < 2**hi_w[i] (frexp of the row maxima, exact).
# Any partial sum of the K = C * n products, in any order, with or without fused
# multiply-adds, is a multiple of 2**g of magnitude below K * 2**(hi_x + hi_w); when
#     ceil(log2 K) + hi_x[b] + hi_w[i] - lo_x[b] - lo_w[i] <= 53
# it is below 2**(53 + g), so representable, and the float64 matrix product (BLAS) is
# exact. When also g >= lsb (every non-zero term's exponent is at least lsb, so nothing
# is floored) the product is exactly A * 2**lsb; the cast to float16 rounds it once to
# nearest even (as _f64_to_fp16 uses; + 0.0 makes an exact zero +0 as the definition
# does). An all-zero row of X or W gives an exact 0 whatever the bound.
# Cross-tile events: after a tile c with d != 0 (so E_c >= g) the running sum, a partial
# sum, in units of 2**E_c is at most 2**53 in magnitude once floored, which fits k bits
# for k >= 55 (_FLOAT_K_MIN); smaller k take the int64 path. Rows (b, i) outside the
# bound take the int64 / Python-integer path above, those batch vectors only.

_FLOAT_K_MIN = 55
_FLOAT_BITS = 53
#: Weight mantissas at most this large (in magnitude) may take the float64 product.
_FLOAT_QW_MAX = 1 << 31


def _block_any(q: np.ndarray) -> np.ndarray:
    """``q.any(-1)`` for an integer array: through 64-bit words when the blocks are whole
    words (a short-axis reduction is slow in NumPy)."""
    n = q.shape[-1]
    if not (q.flags.c_contiguous and q.size and (n * q.itemsize) % 8 == 0):
        return q.any(-1)
    words = q.reshape(-1, n).view(np.uint64)
    acc = words[:, 0].copy()
    for j in range(1, words.shape[1]):
        acc |= words[:, j]
    return (acc != 0).reshape(q.shape[:-1])


def _block_count(mask: np.ndarray) -> np.ndarray:
    """``mask.sum(-1)`` (int64) of a bool array: 8 lanes at a time when the blocks are
    whole 64-bit words, each word's bytes (0 or 1) summed into its top byte by one
    multiplication (at most 8, no carry between bytes)."""
    n = mask.shape[-1]
    if not (mask.flags.c_contiguous and mask.size and n % 8 == 0):
        return mask.sum(-1, dtype=np.int64)
    words = mask.reshape(-1, n).view(np.uint64) * np.uint64(0x0101010101010101)
    acc = (words[:, 0] >> np.uint64(56)).astype(np.int64)
    for j in range(1, words.shape[1]):
        acc += (words[:, j] >> np.uint64(56)).astype(np.int64)
    return acc.reshape(mask.shape[:-1])


def _block_max(a: np.ndarray) -> np.ndarray:
    """``a.max(-1)`` (the last axis short): over a transposed copy, whose rows the
    reduction takes as long vectors."""
    n = a.shape[-1]
    if a.size == 0 or n < 4:
        return a.max(-1)
    return np.maximum.reduce(np.ascontiguousarray(a.reshape(-1, n).T), axis=0).reshape(
        a.shape[:-1])


class PreparedWeights(NamedTuple):
    """A product's weight operands in the form the float64 path of :func:`mvm` uses
    (:func:`prepare_weights`); pass it as ``mvm(..., prepared=...)`` when one matrix is
    used many times. ``usable`` is False for mantissas beyond the float64 path."""
    usable: bool
    wt: np.ndarray          # float64 (C * n, rows): W transposed (a view)
    hi: np.ndarray          # int64 (rows,): |W[i, .]| < 2**hi[i]
    lo: np.ndarray          # int64 (rows,): grid exponent of row i's non-zero blocks
    zero: np.ndarray        # bool (rows,): row i is all zero
    e_max: int              # largest weight block exponent (checked against 15)
    span_max: int           # max of hi - lo over the non-zero rows (0 without any)
    lo_min: int             # min of lo over the non-zero rows (0 without any)
    wt32: np.ndarray        # float32 (C * n, rows): wt, exact where span_max <= 24 - ...


def prepare_weights(codes_w, qw, *, n: int, mantissa_bits_w: int) -> PreparedWeights:
    """The float64 form of the weight operands ``codes_w`` ``(rows, C)`` and ``qw``
    ``(rows, C * n)`` (see the comment above :class:`PreparedWeights`)."""
    qw = np.asarray(qw)
    codes = np.asarray(codes_w)
    rows, width = qw.shape
    c = width // n
    ew = codes.astype(np.int64) - E8M0_BIAS
    e_max = int(ew.max()) if ew.size else -E8M0_BIAS
    if qw.dtype.kind not in "biu" or _mag_bound(qw) >= _FLOAT_QW_MAX or not c:
        empty = np.zeros(0)
        return PreparedWeights(False, empty, empty, empty, empty, e_max, 0, 0, empty)
    q3 = qw.reshape(rows, c, n)
    grid = ew - (mantissa_bits_w - 2)                           # (rows, C)
    w = (q3 * np.ldexp(1.0, grid)[..., None]).reshape(rows, width)
    nzb = _block_any(q3)                                        # (rows, C)
    zero = ~nzb.any(-1)
    lo = np.where(zero, 0, np.where(nzb, grid, 1 << 20).min(-1)).astype(np.int64)
    # |q| <= qmag < 2**bits, so |W[i, .]| < 2**(bits + the row's largest grid exponent).
    qmag = max(int(q3.max()), -int(q3.min()))
    hi = np.where(zero, 0, np.where(nzb, grid, -(1 << 20)).max(-1)
                  + qmag.bit_length()).astype(np.int64)
    live = ~zero
    span_max = int((hi - lo)[live].max()) if live.any() else 0
    lo_min = int(lo[live].min()) if live.any() else 0
    # The matrix product takes the transposed view (BLAS reads it in place). The float32
    # copy is exact when the row's values need at most 24 bits (the batch path checks
    # span_max; a grid exponent of -141 or more keeps them in float32's range).
    return PreparedWeights(True, w.T, hi, lo, zero, e_max, span_max, lo_min,
                           w.astype(np.float32).T)


#: float32's significand; below it the batched product may run in float32 (same bound).
_FLOAT32_BITS = 24
#: Batches from this many vectors use the float32 product where it is exact (one vector
#: does too, when it is).
_FLOAT32_BATCH = 8


def _float_product(qb, xq, pw: PreparedWeights, mantissa_bits_v: int, lsb: int):
    """``(y, fast)``: the products ``(B, rows)`` of the quantized vectors ``qb``
    (``(B, C, n)`` blocks; ``xq`` their ``(values, grid, nzb)`` from the fast quantizer,
    or None) with the prepared weights, float64 or float32 and exact where ``fast`` says
    (``fast`` is None when they all are).

    The bound of the comment above :class:`PreparedWeights` with 24 in place of 53 makes
    every partial sum exact in float32 too (products included: they are partial sums of
    one term). A batch runs its vectors within that bound for every weight row through
    a float32 matrix product (half the work of float64), the others in float64.
    """
    qv = qb.mantissas
    bsz, c, n = qv.shape
    if xq is None:
        grid = qb.exponent_codes.astype(np.int64) - (E8M0_BIAS + mantissa_bits_v - 2)
        x, nzb = qv * np.ldexp(1.0, grid)[..., None], _block_any(qv)
    else:
        x, grid, nzb = xq
    x = x.reshape(bsz, c * n)
    # |qv| <= 2**(m_v - 1) - 1, so |X[b, .]| < 2**hi with hi the largest grid exponent of
    # the row's non-zero blocks plus m_v - 1.
    big = 1 << 20
    lo = np.where(nzb, grid, big).min(-1)
    hi = np.where(nzb, grid, -big).max(-1) + (mantissa_bits_v - 1)
    kbits = (c * n - 1).bit_length()
    budget = _FLOAT_BITS - kbits
    x32 = x.astype(np.float32, copy=False)         # exact (see _quantize_fp16_f64)
    if bsz == 1:                        # one vector: the bound in Python integers
        lo0, hi0 = int(lo[0]), int(hi[0])
        if lo0 == big:
            return np.matmul(x32, pw.wt32), None
        if lo0 + pw.lo_min >= lsb:
            if hi0 - lo0 + pw.span_max <= _FLOAT32_BITS - kbits:
                return np.matmul(x32, pw.wt32), None
            if hi0 - lo0 + pw.span_max <= budget:
                return np.matmul(x.astype(np.float64), pw.wt), None
    zero = lo == big
    live = ~zero
    span = hi - lo
    if bsz >= _FLOAT32_BATCH:
        single = zero | ((span + pw.span_max <= _FLOAT32_BITS - kbits)
                         & (lo + pw.lo_min >= lsb))
        if single.all():
            return np.matmul(x32, pw.wt32), None
        y = np.matmul(x.astype(np.float64), pw.wt)
        if single.any():
            y[single] = np.matmul(x32[single], pw.wt32)
    else:
        y = np.matmul(x.astype(np.float64), pw.wt)
    if not live.any():
        return y, None
    lo_live = lo[live]
    if int(span[live].max()) + pw.span_max <= budget and \
            int(lo_live.min()) + pw.lo_min >= lsb:
        return y, None
    fast = (((span[:, None] + (pw.hi - pw.lo)[None, :] <= budget)
             & (lo[:, None] + pw.lo[None, :] >= lsb))
            | zero[:, None] | pw.zero[None, :])
    return y, fast


def _y_to_fp16(y):
    """Exact float64 (or float32) accumulator values to FP16, nearest even, saturating
    (the MVM's converter: :func:`host.numerics.fp16.round_to_bits` rounds once, to
    nearest even, subnormals and overflow included, as NumPy's cast to float16 does)."""
    y += 0                            # -0 to +0 (y is the caller's scratch)
    if y.size and float(y.max()) < 65520 and float(y.min()) > -65520:
        # Below 65520 in magnitude nothing rounds to an infinity (65520 is half-way
        # from 65504 to 2**16 and ties go to 2**16).
        return _round_to_bits(y), np.zeros(y.shape, bool)
    bits = _round_to_bits(y)
    over = (bits & 0x7FFF) == 0x7C00
    if over.any():
        bits = bits - over.astype(np.uint16)          # +-inf to +-65504
    return bits, over


def _y_to_accumulators(y, lsb: int):
    """The exact integers ``y * 2**-lsb`` (``object``) of exact float64 values."""
    mant, e = np.frexp(np.asarray(y, np.float64))
    m = np.ldexp(mant, _FLOAT_BITS).astype(np.int64).astype(object)
    s = e.astype(np.int64) - _FLOAT_BITS - lsb
    # y * 2**-lsb is an integer, so the right shift drops only zero bits.
    return (m << np.maximum(s, 0).astype(object)) >> np.maximum(-s, 0).astype(object)


def _mvm_int(qb, codes_w, qw3, lsb: int, k, accumulators: bool, mantissa_bits_v: int,
             mantissa_bits_w: int):
    """The int64 path (Python integers for rows beyond its bound) of a batch of
    quantized vectors: ``(out, over, acc, products, tree, cross)``, per vector ``(B, ...)``."""
    exps = term_exponents(qb.exponent_codes, codes_w, mantissa_bits_v, mantissa_bits_w)
    d = _tile_products_batch(qb.mantissas, qw3)                  # (B, rows, C)
    sh = exps - lsb
    terms, a, s, fast, nz = _fast_rows(d, sh)
    slow = ~fast
    acc = None
    if accumulators:
        acc = _as_accumulators(a, s, fast, d, exps, lsb)
    elif slow.any():                     # the exact values of the slow rows only
        acc = np.empty(a.shape, object)
        acc[slow] = accumulate_exact(d[slow], exps[slow], lsb)
    if not slow.any():
        out, over = _i64_to_fp16(a, lsb + s, False, True)
    else:
        out = np.empty(a.shape, np.uint16)
        over = np.empty(a.shape, bool)
        out[fast], over[fast] = _i64_to_fp16(a[fast], lsb + s[fast], False, True)
        out[slow], over[slow] = fixed_to_fp16_exact(acc[slow], lsb, Rounding.NEAREST_EVEN,
                                                    saturate=True)
    if k is None:                        # no check built: nothing to count
        products = tree = cross = np.zeros(len(d), np.int64)
    else:
        products, tree = _tree_counts(qb.mantissas, qw3, k)
        cross = _cross_counts(terms, s, fast, nz, d, sh, k).sum(-1)
    return out, over, acc, products, tree, cross


def _mvm_one(xv, pw: PreparedWeights, mantissa_bits_v: int, lsb: int):
    """One vector ``xv`` ``(C, n)`` (finite or not) with the dynamic exponent and
    nearest-even rounding, on the float path with few NumPy calls (the model's case):
    ``(out_bits (rows,), output saturations, vector saturations)``, or None when the
    vector needs anything else (an inf or NaN, a row beyond the bound, weights the float
    path does not take or the MVM refuses), which :func:`mvm` then does in full.

    The same arithmetic as :func:`_quantize_fp16_f64` and :func:`_float_product`: the
    block exponent ``floor(log2 max|x|)`` read from the largest magnitude's bits (FP16
    exponent field minus 15, or ``bit_length - 25`` for a subnormal), the mantissas
    ``rint(x * 2**-grid)`` clamped to the top code and counted, the dequantized values
    ``q * 2**grid`` (exact in float32), the bound and the product, the cast to FP16.
    ``tests/numerics/test_mvm_float_path.py`` compares it with :func:`mvm_exact`.
    """
    if not pw.usable or pw.e_max > MVM_EXP_MAX:
        return None
    c, n = xv.shape
    amax = np.bitwise_and(xv, 0x7FFF).max(-1).tolist()
    if max(amax) >= 0x7C00:
        return None
    grids = [((v >> 10) - 15 if v >= 0x400 else v.bit_length() - 25) - (mantissa_bits_v - 2)
             if v else None for v in amax]
    live = [g for g in grids if g is not None]
    kbits = (c * n - 1).bit_length()
    if live:
        lo, hi = min(live), max(live) + (mantissa_bits_v - 1)
        if lo + pw.lo_min < lsb:
            return None
        span = hi - lo + pw.span_max
        if span <= _FLOAT32_BITS - kbits:
            wt, dtype = pw.wt32, np.float32
        elif span <= _FLOAT_BITS - kbits:
            wt, dtype = pw.wt, np.float64
        else:
            return None
    else:
        wt, dtype = pw.wt32, np.float32
    # A zero block's scale is 1 (its values are 0 whatever the scale).
    down = np.array([1.0 if g is None else 2.0 ** -g for g in grids])[:, None]
    x = xv.view(np.float16).astype(np.float64)
    np.multiply(x, down, out=x)
    np.rint(x, out=x)
    top = mantissa_max(mantissa_bits_v)
    saturated = 0
    if float(np.abs(x).max()) > top:
        saturated = int(np.count_nonzero(np.abs(x) > top))
        np.clip(x, -top, top, out=x)
    np.divide(x, down, out=x)                     # q * 2**grid, exact
    y = np.matmul(x.reshape(1, c * n).astype(dtype), wt)[0]
    out, over = _y_to_fp16(y)
    return out, int(np.count_nonzero(over)), saturated


def _cached_quantize(cache: dict, xv, mantissa_bits_v, rounding, static_exponent_code):
    """``_quantize_values(xv, ...)``, or the results kept in ``cache`` when its input and
    parameters are equal to these (see :func:`mvm`'s ``quantized_cache``)."""
    key = (mantissa_bits_v, Rounding.parse(rounding), static_exponent_code)
    if cache.get("key") == key and np.array_equal(cache["x"], xv):
        return cache["q"]
    qb, xd = _quantize_values(xv, mantissa_bits_v, rounding, static_exponent_code)
    for a in list(qb) + ([] if xd is None else list(xd)):
        if isinstance(a, np.ndarray):
            a.flags.writeable = False       # shared by later calls: never written
    cache.clear()
    cache.update(key=key, x=xv.copy(), q=(qb, xd))
    return qb, xd


def _check_block_exponents(codes_v, e_max_w: int) -> None:
    """:func:`term_exponents`'s check, vector first: ValueError above 15."""
    if codes_v.size and int(codes_v.max()) - E8M0_BIAS > MVM_EXP_MAX:
        raise ValueError(f"vector block exponent {int(codes_v.max()) - E8M0_BIAS} exceeds "
                         f"{MVM_EXP_MAX}, the largest the MVM accepts")
    if e_max_w > MVM_EXP_MAX:
        raise ValueError(f"weight block exponent {e_max_w} exceeds {MVM_EXP_MAX}, the "
                         f"largest the MVM accepts")


def mvm(x_bits, codes_w, qw, *, n: int, mantissa_bits_v: int, mantissa_bits_w: int,
        rounding=Rounding.NEAREST_EVEN, static_exponent_code: int | None = None,
        narrow_width: int | None = 64, accumulators: bool = True,
        prepared: PreparedWeights | None = None,
        quantized_cache: dict | None = None) -> MvmResult:
    """Matrix-vector product of the NPU's MVM, bit-exact (the fast form of
    :func:`mvm_exact`, equal to it in every output, accumulator and count).

    Parameters
    ----------
    x_bits : uint16 ``(cols,)`` FP16 input vector (logical length), or a batch of
        vectors ``(..., cols)``, each its own product with the same matrix.
    codes_w : uint8 ``(rows, C)`` weight exponent codes, one per tile row.
    qw : int ``(rows, C * n)`` weight mantissas (zero in the column padding).
        ``codes_w`` and ``qw`` are what the MRF holds: the weight matrix quantized along
        its rows in blocks of ``n`` (``host.numerics.bfp.quantize`` or the matrix quantizer).
    n : native dimension; the vector is zero padded to ``C * n`` and quantized per
        native vector with the given rounding and static exponent.
    narrow_width : int 1..64 or None
        ``k`` of the narrow-accumulator check; None: a build without the check
        (``MvmConfig.narrow_check`` False), every narrow count 0 (and none computed).
    accumulators : bool
        False leaves ``MvmResult.accumulators`` None: the exact BFP-long values are
        Python integers, costly to build, and the device's outputs and counts do not
        need them (the model and the exported layers pass False).
    prepared : PreparedWeights, optional
        :func:`prepare_weights` of these ``codes_w`` and ``qw`` (the caller keeps it with
        them), to save that work when one matrix is used for many products.
    quantized_cache : dict, optional
        A dict the caller keeps across calls (empty at first): it holds the last
        quantized input (a copy of the padded vectors, the quantizer's parameters and its
        results, read-only). A call whose vectors and parameters are equal to those
        (``numpy.array_equal``, one comparison) takes the results instead of quantizing
        again; any other call replaces them. Several matrices applied to one input (an
        LSTM's gates) then quantize it once. The results are those without the cache.

    Returns
    -------
    MvmResult
        For a batch ``(..., cols)``: ``out_bits`` and ``accumulators`` are ``(..., rows)``
        and every count (the three of ``narrow`` included) an int64 array ``(...)``, one
        per vector.

    The products are one float64 matrix product where it is provably exact (the bound in
    the comment above :class:`PreparedWeights`; k >= 55 or no check), the int64 tile
    sums of :func:`accumulate` elsewhere.
    """
    x_bits = np.asarray(x_bits, np.uint16)
    if x_bits.ndim == 0:
        raise ValueError("x_bits must have at least one axis")
    qw = np.asarray(qw)
    rows, width, c = _matrix_shape(x_bits, codes_w, qw, n)
    k = None if narrow_width is None else check_int("k", narrow_width, 1, 64)
    batch = x_bits.shape[:-1]
    if x_bits.shape[-1] == c * n:
        xv = x_bits.reshape(-1, c, n)
    else:
        xv = np.zeros((math.prod(batch), c * n), np.uint16)
        xv[:, :x_bits.shape[-1]] = x_bits.reshape(-1, x_bits.shape[-1])
        xv = xv.reshape(-1, c, n)
    lsb = acc_lsb(mantissa_bits_v, mantissa_bits_w)
    if (batch == () and prepared is not None and not accumulators and quantized_cache is None
            and static_exponent_code is None and (k is None or k >= _FLOAT_K_MIN)
            and Rounding.parse(rounding) is Rounding.NEAREST_EVEN and qw.dtype.kind in "iu"):
        check_int("mantissa_bits_v", mantissa_bits_v, MANTISSA_BITS_MIN, MANTISSA_BITS_MAX)
        one = _mvm_one(xv[0], prepared, mantissa_bits_v, lsb)
        if one is not None:
            out, over_count, saturated = one
            return MvmResult(out_bits=out, accumulators=None, lsb=lsb,
                             vector_saturated=saturated, vector_nonfinite=0,
                             narrow=NarrowCounts(0, 0, 0), output_saturated=over_count)
    if quantized_cache is None:
        qb, xd = _quantize_values(xv, mantissa_bits_v, rounding, static_exponent_code)
    else:
        qb, xd = _cached_quantize(quantized_cache, xv, mantissa_bits_v, rounding,
                                  static_exponent_code)
    qw3 = qw.reshape(rows, c, n)
    if qw3.dtype.kind not in "biu" or n * _mag_bound(qb.mantissas) * _mag_bound(qw3) >= 1 << 62:
        # Weight "mantissas" far beyond 16 bits (not what an MRF holds): the definition.
        term_exponents(qb.exponent_codes, codes_w, mantissa_bits_v, mantissa_bits_w)
        kw = dict(n=n, mantissa_bits_v=mantissa_bits_v, mantissa_bits_w=mantissa_bits_w,
                  rounding=rounding, static_exponent_code=static_exponent_code,
                  narrow_width=narrow_width)
        if batch == ():
            return mvm_exact(x_bits, codes_w, qw, **kw)
        return _stack_results([mvm_exact(x, codes_w, qw, **kw)
                               for x in x_bits.reshape(-1, x_bits.shape[-1])], batch)
    pw = prepared
    if pw is None and (k is None or k >= _FLOAT_K_MIN):
        pw = prepare_weights(codes_w, qw, n=n, mantissa_bits_w=mantissa_bits_w)
    if pw is None or not pw.usable or not (k is None or k >= _FLOAT_K_MIN):
        term_exponents(qb.exponent_codes, codes_w, mantissa_bits_v, mantissa_bits_w)
        out, over, acc, products, tree, cross = _mvm_int(
            qb, codes_w, qw3, lsb, k, accumulators, mantissa_bits_v, mantissa_bits_w)
    else:
        _check_block_exponents(qb.exponent_codes, pw.e_max)
        y, fast = _float_product(qb, xd, pw, mantissa_bits_v, lsb)
        out, over = _y_to_fp16(y)
        acc = _y_to_accumulators(y, lsb) if accumulators else None
        # No event at k >= 55 on a vector whose rows are all within the bound: a product
        # or adder-tree node is below n * 2**(m_v - 1) * 2**bits(max|qw|) <= 2**53 (the
        # bound's span counts those bits), and cross-tile values are at most 2**53 (the
        # comment above PreparedWeights). Other vectors are redone on the int path.
        products = tree = cross = np.zeros(len(y), np.int64)
        redo = None if fast is None else ~fast.all(-1)
        if redo is not None and redo.any():      # vectors with a row beyond the bound
            products, tree, cross = (np.zeros(len(y), np.int64) for _ in range(3))
            sub = QuantizedBlocks(*(f[redo] for f in qb))
            r_out, r_over, r_acc, r_p, r_t, r_c = _mvm_int(
                sub, codes_w, qw3, lsb, k, accumulators, mantissa_bits_v, mantissa_bits_w)
            out[redo], over[redo] = r_out, r_over
            if accumulators:
                acc[redo] = r_acc
            products[redo], tree[redo], cross[redo] = r_p, r_t, r_c
    if batch == ():
        return MvmResult(
            out_bits=out[0], accumulators=acc[0] if accumulators else None, lsb=lsb,
            vector_saturated=int(qb.saturated.sum()),
            vector_nonfinite=int(qb.nonfinite.sum()),
            narrow=NarrowCounts(int(products[0]), int(tree[0]), int(cross[0])),
            output_saturated=int(over.sum()))
    return MvmResult(
        out_bits=out.reshape(batch + (rows,)),
        accumulators=acc.reshape(batch + (rows,)) if accumulators else None,
        lsb=lsb, vector_saturated=qb.saturated.sum(-1).reshape(batch),
        vector_nonfinite=qb.nonfinite.sum(-1).reshape(batch),
        narrow=NarrowCounts(products.reshape(batch), tree.reshape(batch),
                            cross.reshape(batch)),
        output_saturated=over.sum(-1).reshape(batch))


# --- several matrices, one input ----------------------------------------------------------


class PreparedGroup(NamedTuple):
    """Matrices applied to one input (:func:`prepare_group`, :func:`mvm_group`)."""
    weights: tuple          # ((codes_w, qw, PreparedWeights), ...) of the members
    wt32: np.ndarray        # float32 (C * n, sum of rows): the members' wt32 side by side
    bounds: tuple           # the members' row ranges in wt32's columns


def prepare_group(weights, *, n: int, mantissa_bits_w: int) -> PreparedGroup:
    """A :class:`PreparedGroup` of ``weights``, ``((codes_w, qw), ...)`` or ``((codes_w,
    qw, prepared), ...)`` (:func:`prepare_weights` made when missing)."""
    members, bounds, start = [], [], 0
    for w in weights:
        codes_w, qw = w[0], w[1]
        pw = w[2] if len(w) > 2 and w[2] is not None else prepare_weights(
            codes_w, qw, n=n, mantissa_bits_w=mantissa_bits_w)
        members.append((codes_w, qw, pw))
        rows = np.shape(qw)[0]
        bounds.append((start, start + rows))
        start += rows
    widths = {np.shape(qw)[1] for _, qw, _ in members}
    if len(widths) == 1 and all(pw.usable for _, _, pw in members):
        wt32 = np.concatenate([pw.wt32 for _, _, pw in members], axis=1)
    else:
        wt32 = np.zeros((0, 0), np.float32)             # never one product
    return PreparedGroup(tuple(members), wt32, tuple(bounds))


def mvm_group(x_bits, group: PreparedGroup, *, n: int, mantissa_bits_v: int,
              mantissa_bits_w: int, rounding=Rounding.NEAREST_EVEN,
              static_exponent_code: int | None = None, narrow_width: int | None = 64,
              quantized_cache: dict | None = None) -> list:
    """``[mvm(x_bits, codes_w, qw, ..., accumulators=False, prepared=pw) for codes_w, qw,
    pw in group.weights]``, equal to it in every output and count
    (``tests/numerics/test_mvm_float_path.py``), with one float32 matrix product for all
    the members when each of them would be a float32 product over the whole batch.

    That holds when every member's weights take the float path (usable, exponents
    within the MVM's range), the narrow check is off or ``k >= 55``, the input is a batch
    ``(B, cols)`` of at least ``_FLOAT32_BATCH`` finite vectors (the fast quantizer ran)
    and every vector is within the float32 bound of every member (the test of
    :func:`_float_product`). Each output is then exact in float32 whichever product
    computes it (an output row depends on its weight row alone), converted to FP16 per
    member as :func:`mvm` does, and no narrow event can occur (as there). Otherwise every
    member is its own :func:`mvm` call. The input is quantized once either way (through
    ``quantized_cache``, a dict kept by the caller or a fresh one).
    """
    cache = {} if quantized_cache is None else quantized_cache
    kw = {"n": n, "mantissa_bits_v": mantissa_bits_v, "mantissa_bits_w": mantissa_bits_w,
          "rounding": rounding, "static_exponent_code": static_exponent_code,
          "narrow_width": narrow_width, "accumulators": False, "quantized_cache": cache}

    def separately():
        return [mvm(x_bits, cw, qw, prepared=pw, **kw) for cw, qw, pw in group.weights]

    x_bits = np.asarray(x_bits, np.uint16)
    k = None if narrow_width is None else check_int("k", narrow_width, 1, 64)
    if (x_bits.ndim != 2 or len(x_bits) < _FLOAT32_BATCH or not group.wt32.size
            or not (k is None or k >= _FLOAT_K_MIN)
            or any(pw.e_max > MVM_EXP_MAX for _, _, pw in group.weights)):
        return separately()
    for codes_w, qw, _ in group.weights:
        c = _matrix_shape(x_bits, codes_w, np.asarray(qw), n)[2]
    if x_bits.shape[-1] == c * n:
        xv = x_bits.reshape(-1, c, n)
    else:
        xv = np.zeros((len(x_bits), c * n), np.uint16)
        xv[:, :x_bits.shape[-1]] = x_bits
        xv = xv.reshape(-1, c, n)
    m_v = check_int("mantissa_bits_v", mantissa_bits_v, MANTISSA_BITS_MIN, MANTISSA_BITS_MAX)
    qb, xd = _cached_quantize(cache, xv, m_v, rounding, static_exponent_code)
    if xd is None or (qb.exponent_codes.size
                      and int(qb.exponent_codes.max()) - E8M0_BIAS > MVM_EXP_MAX):
        return separately()
    if any(np.asarray(qw).dtype.kind not in "iu"
           or n * _mag_bound(qb.mantissas) * _mag_bound(np.asarray(qw)) >= 1 << 62
           for _, qw, _ in group.weights):
        return separately()
    values, grid, nzb = xd
    big = 1 << 20
    lo = np.where(nzb, grid, big).min(-1)
    span = np.where(nzb, grid, -big).max(-1) + (m_v - 1) - lo
    zero = lo == big
    limit = _FLOAT32_BITS - (c * n - 1).bit_length()
    lsb = acc_lsb(mantissa_bits_v, mantissa_bits_w)
    for _, _, pw in group.weights:
        if not (zero | ((span + pw.span_max <= limit) & (lo + pw.lo_min >= lsb))).all():
            return separately()
    y = np.matmul(values.reshape(len(values), c * n), group.wt32)
    saturated = qb.saturated.sum(-1)
    nonfinite = qb.nonfinite.sum(-1)
    none = NarrowCounts(*(np.zeros(len(y), np.int64) for _ in range(3)))
    out, over = _y_to_fp16(y)           # element by element: the members' columns
    return [MvmResult(out_bits=out[:, r0:r1], accumulators=None, lsb=lsb,
                      vector_saturated=saturated, vector_nonfinite=nonfinite,
                      narrow=none, output_saturated=over[:, r0:r1].sum(-1))
            for r0, r1 in group.bounds]
