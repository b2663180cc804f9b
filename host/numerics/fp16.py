"""FP16 element-wise arithmetic of the multifunction units: the bit-exact reference model.

``docs/numerics.md`` section 6 is the contract, ``docs/mfu-arith.md`` the design notes.
This module holds the one definition of the binary operation codes (:class:`BinaryOp`,
imported by the ISA and by the gateware, ``hw.arith.fp16_arith``) and the model of the five
operations, vectorized over NumPy arrays.

Two flavours of every function:

* :func:`binary` and :func:`binary_events` take ``float16`` arrays (values), and
  :func:`binary` returns ``float16``;
* :func:`binary_bits` and :func:`binary_events_bits` take ``uint16`` arrays of FP16 bit
  patterns (what the device holds), and :func:`binary_bits` returns ``uint16``.

Other dtypes are refused rather than converted: rounding a wider value to FP16 is a
decision the caller makes (``x.astype(np.float16)``), never one made silently here.
``a`` and ``b`` broadcast against each other as in NumPy.

**Why this is exact.** Every FP16 value is ``m * 2**e`` with ``m < 2**11`` and
``-24 <= e <= 5``. The exact sum of two of them is a multiple of ``2**-24`` below
``2**17``, so it needs at most 41 significant bits; the exact product has at most 22.
Both are therefore computed *exactly* in ``float64`` (53 bits). NumPy's ``float64`` to
``float16`` cast then rounds that exact value once, to nearest with ties to even,
subnormals and overflow to infinity included (directly, not through ``float32``). The
claim is not taken on trust:
``tests/numerics/test_fp16_model.py`` checks the model against every Berkeley TestFloat ``f16_add``,
``f16_sub`` and ``f16_mul`` vector, against an exact ``fractions.Fraction`` reference and
against an independent integer implementation on millions of pairs.

Every NaN result is the canonical NaN ``0x7E00``, created or propagated.
"""

from __future__ import annotations

import threading
from typing import NamedTuple

import numpy as np
from host.spec.formats import CANONICAL_NAN
from host.spec.ops import BinaryOp

__all__ = [
    "BinaryOp", "BinaryEvents", "CANONICAL_NAN", "binary", "binary_bits", "binary_events",
    "binary_events_bits", "binary_counts_bits", "round_to_bits",
]

_SIGN = 0x8000
_MAG = 0x7FFF
_INF = 0x7C00


class BinaryEvents(NamedTuple):
    """Counter events of an element-wise operation, one bool per element.

    overflow : the result is +-inf although neither input is an infinity (a finite
        result rounded past 65504).
    nan_created : the result is a NaN although neither input is a NaN (``inf - inf``,
        ``0 * inf``).
    """
    overflow: np.ndarray
    nan_created: np.ndarray


def _operands(a, b, dtype):
    """``a`` and ``b`` as arrays of ``dtype``, broadcast together, viewed as uint16."""
    what = "float16 array" if dtype == np.float16 else "uint16 array of FP16 bit patterns"
    arrays = []
    for name, x in (("a", a), ("b", b)):
        arr = np.asarray(x)
        if arr.dtype != dtype:
            raise TypeError(f"{name} must be a {what}, not an array of {arr.dtype}")
        arrays.append(arr)
    try:
        a_arr, b_arr = np.broadcast_arrays(*arrays)
    except ValueError:
        raise ValueError(f"a and b must broadcast together, not shapes "
                         f"{arrays[0].shape} and {arrays[1].shape}") from None
    return a_arr.view(np.uint16), b_arr.view(np.uint16)


def _is_nan(bits):
    return (bits & _MAG) > _INF


def _is_inf(bits):
    return (bits & _MAG) == _INF


def _maximum(a, b):
    """IEEE 754-2019 ``maximum`` on bit patterns, NaN results not yet canonical.

    Built from the ordered comparison of the values (as TestFloat's ``lt`` defines it),
    then the two rules the comparison is silent about: a NaN operand gives a NaN, and of
    two zeros ``+0`` is the larger (the sign bits AND together).
    """
    fa, fb = a.view(np.float16), b.view(np.float16)
    with np.errstate(invalid="ignore"):
        r = np.where(fa < fb, b, a)
    zeros = ((a & _MAG) == 0) & ((b & _MAG) == 0)
    r = np.where(zeros, a & b, r)
    return np.where(_is_nan(a) | _is_nan(b), np.uint16(CANONICAL_NAN), r).astype(np.uint16)


def _evaluate(op: BinaryOp, a, b):
    """``(result bits, overflow, nan_created)`` for uint16 operands of the same shape."""
    if op is BinaryOp.MAX:
        r = _maximum(a, b)
    else:
        x = a.view(np.float16).astype(np.float64)
        y = b.view(np.float16).astype(np.float64)
        with np.errstate(all="ignore"):       # inf - inf, 0 * inf, overflow in the cast
            if op is BinaryOp.ADD:
                exact = x + y
            elif op is BinaryOp.A_SUB_B:
                exact = x - y
            elif op is BinaryOp.B_SUB_A:
                exact = y - x
            else:
                exact = x * y
            r = exact.astype(np.float16).view(np.uint16)
        r = np.where(_is_nan(r), np.uint16(CANONICAL_NAN), r).astype(np.uint16)
    overflow = _is_inf(r) & ~_is_inf(a) & ~_is_inf(b)
    nan_created = _is_nan(r) & ~_is_nan(a) & ~_is_nan(b)
    return r, overflow, nan_created


def binary_bits(op, a, b) -> np.ndarray:
    """Element-wise ``op(a, b)`` on FP16 bit patterns.

    Parameters
    ----------
    op : BinaryOp or str
        ``"add"``, ``"a_sub_b"``, ``"b_sub_a"``, ``"mul"``, ``"max"`` or the enum member.
    a, b : uint16 arrays (broadcastable)
        FP16 bit patterns.

    Returns
    -------
    uint16 array of the broadcast shape: IEEE 754 binary16 results, round to nearest even,
    subnormals kept, every NaN ``0x7E00`` (``docs/numerics.md`` section 6).

    Raises
    ------
    ValueError
        unknown ``op``; shapes that do not broadcast.
    TypeError
        ``a`` or ``b`` is not a ``uint16`` array.
    """
    op = BinaryOp.parse(op)
    a, b = _operands(a, b, np.uint16)
    return _evaluate(op, a, b)[0]


def binary(op, a, b) -> np.ndarray:
    """Element-wise ``op(a, b)`` on ``float16`` arrays; returns ``float16``.

    The values are those of :func:`binary_bits` (every NaN is the canonical NaN, bits
    ``0x7E00``). Raises like :func:`binary_bits`, with ``float16`` in place of ``uint16``.

    >>> import numpy as np
    >>> binary("add", np.float16([1, 65504]), np.float16([2**-11, 16]))
    array([ 1., inf], dtype=float16)
    """
    op = BinaryOp.parse(op)
    a, b = _operands(a, b, np.float16)
    return _evaluate(op, a, b)[0].view(np.float16)


def binary_events_bits(op, a, b) -> BinaryEvents:
    """The MFU counter events of ``op(a, b)`` on FP16 bit patterns (bool arrays).

    An element counts as *overflow* when its result is +-inf and neither input is an
    infinity, and as *NaN created* when its result is a NaN and neither input is a NaN.
    ``MAX`` never creates either. Arguments and errors as in :func:`binary_bits`.
    """
    op = BinaryOp.parse(op)
    a, b = _operands(a, b, np.uint16)
    _, overflow, nan_created = _evaluate(op, a, b)
    return BinaryEvents(overflow, nan_created)


def finite_to_float32(bits):
    """float32 values of the finite FP16 patterns ``bits`` (uint16; an inf or NaN
    pattern gives a wrong finite value): ``bits.view(np.float16).astype(np.float32)``,
    equal to it for every finite pattern (``tests/numerics/test_fast_mfu_kernels.py``)
    and about twice as fast (NumPy converts FP16 one element at a time).

    The pattern shifted to the top half of a 32-bit word and shifted back by 3 with sign
    extension puts the FP16 exponent and fraction fields where float32 has them; the
    three copies of the sign that lands in the exponent field's top bits are cleared.
    The float32 number of that pattern is ``x * 2**-112`` exactly (normal FP16 numbers
    become normal float32 numbers, subnormals subnormals, with the same fraction bits),
    and the product by 2**112 is exact."""
    x = np.empty(np.shape(bits), np.float32)
    _finite_to_float32_into(np.asarray(bits), x)
    return x


def _finite_to_float32_into(bits, x) -> None:
    """:func:`finite_to_float32` of uint16 ``bits`` into float32 ``x`` of their shape."""
    v = x.view(np.int32)
    np.left_shift(bits, 16, out=v, dtype=np.int32, casting="unsafe")
    np.right_shift(v, 3, out=v)
    np.bitwise_and(v, np.int32(-0x70000001), out=v)      # clears bits 28..30
    np.multiply(x, np.float32(2.0 ** 112), out=x)


#: Per float dtype: (unsigned integer view, fraction bits, exponent field mask, exponent
#: bias, the power of two that takes FP16's exponent range to the bottom of the dtype's
#: normal range, the shift that then leaves FP16's 15 magnitude bits, the sign's shift).
_ROUND_FORMATS = {
    np.dtype(np.float32): (np.uint32, 23, 0x7F800000, 127, np.float32(2.0 ** -112), 13, 16),
    np.dtype(np.float64): (np.uint64, 52, 0x7FF0000000000000, 1023, 2.0 ** -1008, 42, 48),
}


#: :func:`round_to_bits` casts arrays smaller than this (its dozen NumPy calls per piece
#: cost more than the cast's element loop on a few thousand values).
_ROUND_MIN = 2048
#: Elements per piece of :func:`round_to_bits`.
_ROUND_CHUNK = 65536


def round_to_bits(values) -> np.ndarray:
    """FP16 bit patterns of float32 or float64 ``values``, each rounded once to nearest
    with ties to even, subnormals kept, magnitudes from 65520 up to ``+-inf``: equal to
    ``values.astype(np.float16).view(np.uint16)`` for every value that is not a NaN
    (``tests/numerics/test_round_to_bits.py``), and that cast for fewer than
    ``_ROUND_MIN`` values; faster on more, because NumPy's cast to float16 converts one
    element at a time. The pattern a NaN gives is not specified: callers pass none.

    How: with ``a = |v|`` clamped to ``2**16`` and ``e`` the exponent of ``a`` (at least
    -14, FP16's smallest normal exponent), ``c = 2**(e + p - 11)`` for a dtype of ``p``
    significant bits has its last place at ``2**(e - 10)``, FP16's spacing at ``a``
    (``2**-24`` in the subnormal range), and ``a + c`` (``0 <= a < 2**(e + 1)``) stays
    in ``c``'s binade, so the addition rounds ``a`` to that grid once, ties to even
    because ``c`` is an even multiple of its last place; ``- c`` is then exact. The
    rounded value times the power of two ``2**(b - 15)`` (``b`` the dtype's bias, so
    ``2**-14`` lands on the smallest normal number) is exact and has FP16's exponent and
    top fraction bits at the top of its pattern, FP16's subnormals becoming the dtype's
    with the same fraction; ``2**16`` becomes the all-ones exponent, the infinity. The
    sign is the input's.

    Raises ``TypeError`` for arrays of other dtypes.
    """
    v = np.asarray(values)
    if v.dtype not in _ROUND_FORMATS:
        raise TypeError(f"values must be a float32 or float64 array, not an array of "
                        f"{v.dtype}")
    if v.size < _ROUND_MIN:
        with np.errstate(over="ignore"):
            return v.astype(np.float16).view(np.uint16)
    flat = v.reshape(-1)
    out = np.empty(flat.shape, np.uint16)
    # A piece at a time in reused buffers: fresh full-size temporaries cost more (page
    # faults) than the dozen passes over data that stays in cache.
    a, _, c, floor = _scratch(v.dtype)
    for s in range(0, flat.size, _ROUND_CHUNK):
        m = min(_ROUND_CHUNK, flat.size - s)
        _round_into(flat[s:s + m], out[s:s + m], a[:m], c[:m], floor[:m])
    return out.reshape(v.shape)


def _round_into(v, out, a, c, floor) -> None:
    """:func:`round_to_bits` of the 1-D float array ``v`` into uint16 ``out``, with
    scratch ``a`` (``v``'s dtype, not ``v``), ``c`` (its unsigned view type) and
    ``floor`` (:func:`_scratch`), all of one length.

    NumPy's minimum and maximum against a scalar take a slow loop, so the clamp to 2**16
    runs only when a value needs it and the exponent's floor is an array."""
    utype, frac, exp_mask, bias, scale, shift, sign_shift = _ROUND_FORMATS[v.dtype]
    ua = a.view(utype)
    np.abs(v, out=a)
    if not a.max() < 65536:                  # (a NaN too: fmin makes it 2**16)
        np.fmin(a, v.dtype.type(65536), out=a)
    np.bitwise_and(ua, utype(exp_mask), out=c)
    np.maximum(c, floor, out=c)
    c += utype((frac - 10) << frac)
    cf = c.view(v.dtype)
    a += cf
    a -= cf
    a *= scale
    np.right_shift(ua, utype(shift), out=c)
    np.right_shift(v.view(utype), utype(sign_shift), out=ua)
    np.bitwise_and(ua, utype(0x8000), out=ua)
    np.bitwise_or(c, ua, out=c)
    np.copyto(out, c, casting="unsafe")


#: Per thread: ``{dtype: (a, b, c, floor)}``, the scratch of :func:`round_to_bits` and
#: :func:`_float32_bits`, ``_ROUND_CHUNK`` elements each, made once: arrays this size are
#: above malloc's mmap threshold, so fresh ones cost page faults on every call.
_SCRATCH = threading.local()


def _scratch(dtype):
    """This thread's ``(a, b, c, floor)`` for float ``dtype``: two scratch arrays of that
    dtype, one of its unsigned view type, and the exponent field of 2**-14 in that type,
    repeated."""
    bufs = getattr(_SCRATCH, "bufs", None)
    if bufs is None:
        bufs = _SCRATCH.bufs = {}
    dtype = np.dtype(dtype)
    if dtype not in bufs:
        utype, frac, _, bias = _ROUND_FORMATS[dtype][:4]
        bufs[dtype] = (np.empty(_ROUND_CHUNK, dtype), np.empty(_ROUND_CHUNK, dtype),
                       np.empty(_ROUND_CHUNK, utype),
                       np.full(_ROUND_CHUNK, (bias - 14) << frac, utype))
    return bufs[dtype]


#: Elements per piece of a large :func:`binary_counts_bits` (float64 scratch in cache).
_CHUNK = 8192


def _arith_into(op, x, y) -> None:
    """``x = op(x, y)`` in place for ADD, A_SUB_B, B_SUB_A and MUL (float arrays)."""
    if op is BinaryOp.ADD:
        np.add(x, y, out=x)
    elif op is BinaryOp.A_SUB_B:
        np.subtract(x, y, out=x)
    elif op is BinaryOp.B_SUB_A:
        np.subtract(y, x, out=x)
    else:
        np.multiply(x, y, out=x)


def _chunked(op, a, b):
    """The rounded results of :func:`_evaluate`'s arithmetic for large operands, a piece
    at a time in two reused float64 buffers (the same operations, element by element;
    fresh full-size temporaries cost more than the arithmetic)."""
    af, bf = a.reshape(-1), b.reshape(-1)
    r = np.empty(af.shape, np.uint16)
    x, y = np.empty(_CHUNK), np.empty(_CHUNK)
    with np.errstate(all="ignore"):       # inf - inf, 0 * inf, overflow in the cast
        for s in range(0, af.size, _CHUNK):
            m = min(_CHUNK, af.size - s)
            xs, ys = x[:m], y[:m]
            np.copyto(xs, af[s:s + m].view(np.float16))
            np.copyto(ys, bf[s:s + m].view(np.float16))
            _arith_into(op, xs, ys)
            np.copyto(r[s:s + m].view(np.float16), xs, casting="same_kind")
    return r.reshape(a.shape)


#: Operands from this many elements try :func:`_float32_bits` first.
_F32_MIN = 4096


def _float32_bits(op, a, b):
    """The rounded results of ``op(a, b)`` (not MAX) computed in float32, or None when an
    operand is an inf or NaN (then the caller takes the float64 forms). Equal to
    :func:`_evaluate`'s results for finite operands (``tests/numerics/test_fast_mfu_kernels.py``
    compares them over every pattern against a set of others):

    * the operands are converted by :func:`finite_to_float32` (an inf or NaN pattern
      becomes a value of magnitude 2**16 or more, which no finite FP16 value reaches,
      so one maximum and one minimum per operand find them);
    * a product of two FP16 values has at most 22 significant bits and a magnitude of
      2**-48 or more when not zero: exact in float32, rounded once by :func:`_round_into`
      (:func:`round_to_bits`);
    * a sum or difference is rounded to float32 and then to FP16. Rounding twice to
      nearest gives the once-rounded result when the first precision is at least twice
      the second plus two (Figueroa, "When is double rounding innocuous?", 1995):
      float32's 24 bits against FP16's 11. Results below 2**-14 in magnitude (FP16's
      subnormal range, a fixed grid of 2**-24) are multiples of 2**-24 with at most 10
      significant bits, exact in float32, so only the last step rounds them; the finite
      sums stay below 2**17, and the overflow to infinity is decided on the value
      rounded as if the exponent were unbounded, as for the exact value.
    """
    af, bf = a.reshape(-1), b.reshape(-1)
    out = np.empty(af.shape, np.uint16)
    x, y, c, floor = _scratch(np.float32)
    lim = np.float32(65536)
    for s in range(0, af.size, _ROUND_CHUNK):       # in cache, as in round_to_bits
        m = min(_ROUND_CHUNK, af.size - s)
        xs, ys = x[:m], y[:m]
        _finite_to_float32_into(af[s:s + m], xs)
        _finite_to_float32_into(bf[s:s + m], ys)
        if not (xs.max() < lim and xs.min() > -lim and ys.max() < lim and ys.min() > -lim):
            return None
        _arith_into(op, xs, ys)       # a product up to 2**32 rounds to an infinity below
        _round_into(xs, out[s:s + m], ys, c[:m], floor[:m])
    return out.reshape(a.shape)


def binary_counts_bits(op, a, b) -> tuple[np.ndarray, int, int]:
    """``(binary_bits, overflow count, NaN-created count)`` of ``op(a, b)``: what an MFU
    unit outputs and adds to its counters, in one pass (the model and the exported
    layers use it). Arguments and errors as in :func:`binary_bits`.

    Equal to :func:`binary_bits` with :func:`binary_events_bits` summed: when no rounded
    result has the all-ones exponent field (no infinity, no NaN) there is no NaN to make
    canonical and neither event can hold, so the rest of :func:`_evaluate` is skipped;
    otherwise it runs as written. Large operands are converted and rounded a piece at a
    time (:func:`_chunked`), the same operations on each element.
    """
    op = BinaryOp.parse(op)
    if not (type(a) is np.ndarray and type(b) is np.ndarray and a.dtype == np.uint16
            and b.dtype == np.uint16 and a.shape == b.shape):
        a, b = _operands(a, b, np.uint16)
    if op is not BinaryOp.MAX and a.size >= _F32_MIN:
        r = _float32_bits(op, a, b)
        if r is not None and not (np.bitwise_and(r, _INF) == _INF).any():
            return r, 0, 0
    if op is not BinaryOp.MAX and a.size >= 2 * _CHUNK:
        r = _chunked(op, a, b)
        if not (np.bitwise_and(r, _INF) == _INF).any():
            return r, 0, 0
    elif op is not BinaryOp.MAX:
        x = a.view(np.float16).astype(np.float64)
        y = b.view(np.float16).astype(np.float64)
        with np.errstate(all="ignore"):       # inf - inf, 0 * inf, overflow in the cast
            if op is BinaryOp.ADD:
                exact = np.add(x, y, out=x)
            elif op is BinaryOp.A_SUB_B:
                exact = np.subtract(x, y, out=x)
            elif op is BinaryOp.B_SUB_A:
                exact = np.subtract(y, x, out=x)
            else:
                exact = np.multiply(x, y, out=x)
            r = exact.astype(np.float16).view(np.uint16)
        if not (np.bitwise_and(r, _INF) == _INF).any():
            return r, 0, 0
    r, overflow, nan_created = _evaluate(op, a, b)
    return r, int(overflow.sum()), int(nan_created.sum())


def binary_events(op, a, b) -> BinaryEvents:
    """:func:`binary_events_bits` for ``float16`` arrays."""
    op = BinaryOp.parse(op)
    a, b = _operands(a, b, np.float16)
    _, overflow, nan_created = _evaluate(op, a, b)
    return BinaryEvents(overflow, nan_created)
