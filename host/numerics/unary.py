"""FP16 unary functions of the multifunction units: the bit-exact reference model.

The MFUs' activation stage evaluates one of :class:`UnaryOp` on every lane of an FP16
vector. Relu and pass are exact; sigmoid, tanh, exp and reciprocal are evaluated by one
fixed-point algorithm per lane (``docs/unary-functions.md``):

* a table of linear segments (``c0 + c1 * dx``) read from one ROM whose contents are
  generated here (:func:`rom_words`), so that the model and the gateware share them;
* exp, sigmoid and tanh first reduce ``x`` to ``t = x * log2(e)`` (tanh: ``2|x|``) in
  fixed point and split it into ``2**i * 2**f``;
* sigmoid(x >= 0) and tanh(|x| >= 1/2) use the complement ``1 - v`` of the small value
  ``v = sigmoid(-|x|)`` (resp. ``2 * sigmoid(-2|x|)``);
* one final rounding (to nearest, ties away from zero, on the approximation) with IEEE
  subnormals, overflow to infinity and the canonical NaN ``0x7E00``.

:func:`unary_bits` is that algorithm in vectorized NumPy integer arithmetic; the gateware
(``hw/arith/fp16_unary.py``) computes exactly the same integers. :func:`unary` is the same on
``float16`` arrays. :func:`unary_events` gives the per-lane events that the MFU counters
count. :func:`reference_bits` is the independent float64 reference (correctly rounded
once to FP16) that the error table of the documentation is measured against.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
from host.spec.formats import CANONICAL_NAN, FP16_BIAS, FP16_FRAC_BITS
from host.spec.ops import TABLE_OPS, UnaryOp, parse_ops

__all__ = [
    "UnaryOp", "TABLE_OPS", "parse_ops", "unary", "unary_bits", "unary_events", "unary_counts",
    "reference_values", "reference_bits", "ulp_distance", "ErrorReport", "measure_error",
    "LOG2E_FRAC_BITS", "LOG2E_INT", "T_FRAC_BITS", "T_INT_BITS", "T_CLAMP_EXP",
    "C0_FRAC_BITS", "C0_BITS", "C1_BITS", "DX_BITS", "ROM_WORD_BITS", "Y_BITS",
    "SIG_TABLES", "TANH_SMALL_BINADES", "Region", "REGIONS", "rom_layout", "rom_depth",
    "rom_words", "rom_fields", "segment_fit",
]


# --- fixed-point formats ------------------------------------------------------------------

#: ``log2(e)`` is the integer :data:`LOG2E_INT` times ``2**-LOG2E_FRAC_BITS`` (18 bits,
#: off by ``0.076 * 2**-17``).
LOG2E_FRAC_BITS = 17
LOG2E_INT = round(2 ** LOG2E_FRAC_BITS / math.log(2))          # 189097
#: ``|t| = |x| * log2(e) * 2**c`` is kept as an unsigned fixed-point number with
#: :data:`T_INT_BITS` integer and :data:`T_FRAC_BITS` fraction bits, truncated.
T_FRAC_BITS = 16
T_INT_BITS = 6
#: ``|x| * 2**c >= 2**5`` (``|t| >= 46``) is clamped to the largest ``|t|``.
T_CLAMP_EXP = 5
#: The table value ``c0`` is unsigned with :data:`C0_FRAC_BITS` fraction bits (values in
#: ``[1/2, 2)``); the slope ``c1`` is two's complement, :data:`C1_BITS` wide, in the same
#: units, per whole segment.
C0_FRAC_BITS = 19
C0_BITS = C0_FRAC_BITS + 1
C1_BITS = 16
#: The position within a segment, ``dx``, is left-aligned to this many bits.
DX_BITS = 11
#: ROM word: ``c0`` in bits ``[0, 20)``, ``c1`` in bits ``[20, 36)``.
ROM_WORD_BITS = C0_BITS + C1_BITS
#: Width of the interpolated value ``y = c0 + ((c1 * dx) >> DX_BITS)`` (below ``2**20``).
Y_BITS = C0_FRAC_BITS + 1
#: Sigmoid tables ``g_i`` exist for ``i = -1 .. -SIG_TABLES``; below, ``2**t`` is used.
SIG_TABLES = 14
#: Binades ``e`` (``2**e <= |x| < 2**(e+1)``) of tanh's small-argument table; below them
#: ``tanh(x)`` rounds to ``x``, above them the complement path is used.
TANH_SMALL_BINADES = (-6, -2)

_F = T_FRAC_BITS
_WF = C0_FRAC_BITS
_NAN = CANONICAL_NAN
_INF = 0x7C00
_ONE = 0x3C00


class Region(NamedTuple):
    """One table of the ROM: ``2**index_bits`` segments per sub-table.

    name : str
    tables : int
        number of sub-tables (e.g. one per binade).
    index_bits : int
        segments per sub-table are ``2**index_bits``.
    dx_bits : int
        significant bits of the position within a segment (left-aligned to DX_BITS).
    """
    name: str
    tables: int
    index_bits: int
    dx_bits: int

    @property
    def size(self) -> int:
        return self.tables << self.index_bits


#: The ROM regions, in ROM order: ``2**f`` (exp, and sigmoid/tanh far from 0), the
#: sigmoid tables ``g_i(f) = 2**f / (1 + 2**(i + f))`` for ``i = -1 .. -14``, tanh of small
#: arguments per binade, and ``1/m``.
REGIONS = {
    "exp2": Region("exp2", 1, 7, _F - 7),
    "sigmoid": Region("sigmoid", SIG_TABLES, 5, _F - 5),
    "tanh_small": Region("tanh_small", TANH_SMALL_BINADES[1] - TANH_SMALL_BINADES[0] + 1,
                         5, FP16_FRAC_BITS - 5),
    "recip": Region("recip", 1, 8, FP16_FRAC_BITS - 8),
}
_OP_REGIONS = {
    UnaryOp.EXP: ("exp2",),
    UnaryOp.SIGMOID: ("exp2", "sigmoid"),
    UnaryOp.TANH: ("exp2", "sigmoid", "tanh_small"),
    UnaryOp.RECIP: ("recip",),
}


def rom_layout(ops=None) -> dict[str, int]:
    """Base address of each ROM region needed by ``ops`` (default: every op).

    Regions are packed in the order of :data:`REGIONS`; a build without table ops has an
    empty layout (and no ROM).
    """
    ops = parse_ops(ops)
    needed = {name for op in ops for name in _OP_REGIONS.get(op, ())}
    layout, base = {}, 0
    for name, region in REGIONS.items():
        if name in needed:
            layout[name] = base
            base += region.size
    return layout


def rom_depth(ops=None) -> int:
    """Number of ROM words for ``ops`` (0 when no op needs the ROM)."""
    return sum(REGIONS[name].size for name in rom_layout(ops))


# --- table generation ----------------------------------------------------------------------

def segment_fit(fun, a, h, shift=0.0):
    """Linear fit of ``fun`` on ``[a, a + h]`` with equal-ripple error (the minimax line
    of a convex or concave function): slope = secant, offset = half the deviation.

    ``shift`` moves the sample points by ``shift * h`` (the mean truncation of the
    argument). Returns ``(c0, c1)`` as real numbers, ``c1`` per whole segment.
    """
    u = np.linspace(0.0, 1.0, 1025)
    y = fun(a + (u + shift) * h)
    c1 = y[-1] - y[0]
    e = y - (y[0] + c1 * u)
    return y[0] + (e.max() + e.min()) / 2, c1


def _region_functions(name):
    """Per sub-table ``k``: the function of the segment variable and its domain start."""
    if name == "exp2":
        return [(lambda f: np.exp2(f), 0.0)]
    if name == "sigmoid":
        return [(lambda f, i=-1 - k: np.exp2(f) / (1.0 + np.exp2(i + f)), 0.0)
                for k in range(SIG_TABLES)]
    if name == "tanh_small":
        lo = TANH_SMALL_BINADES[0]
        return [(lambda m, e=lo + k: np.tanh(m * 2.0 ** e) / 2.0 ** e, 1.0)
                for k in range(REGIONS[name].tables)]
    if name == "recip":
        return [(lambda m: 1.0 / m, 1.0)]
    raise KeyError(name)


def _region_fields(name):
    """``(c0, c1)`` integer arrays of one region."""
    region = REGIONS[name]
    n = 1 << region.index_bits
    # exp2 and sigmoid are indexed by the fraction f of t, which was truncated twice
    # (|t| and its bits below dx): on average the true argument is half a unit of
    # 2**-T_FRAC_BITS higher. The mantissa-indexed regions see exact arguments.
    shift = 2.0 ** -(_F - region.index_bits + 1) if name in ("exp2", "sigmoid") else 0.0
    c0s, c1s = [], []
    for fun, start in _region_functions(name):
        for j in range(n):
            c0, c1 = segment_fit(fun, start + j / n, 1.0 / n, shift)
            c0s.append(c0)
            c1s.append(c1)
    # + 1/2: the truncated product (c1 * dx) >> DX_BITS is on average half a unit low.
    c0 = np.floor(np.array(c0s) * 2.0 ** _WF + 1.0).astype(np.int64)
    c1 = np.round(np.array(c1s) * 2.0 ** _WF).astype(np.int64)
    assert c0.min() >= 1 << (_WF - 1) and c0.max() < 1 << (_WF + 1), name
    assert np.abs(c1).max() < 1 << (C1_BITS - 1), name
    return c0, c1


_FIELDS_CACHE: dict[str, tuple[np.ndarray, np.ndarray]] = {}


def _fields(name):
    if name not in _FIELDS_CACHE:
        _FIELDS_CACHE[name] = _region_fields(name)
    return _FIELDS_CACHE[name]


def rom_fields(ops=None) -> tuple[np.ndarray, np.ndarray]:
    """``(c0, c1)`` of every ROM word for ``ops``, as int64 arrays (``c1`` signed)."""
    layout = rom_layout(ops)
    c0 = [_fields(name)[0] for name in layout]
    c1 = [_fields(name)[1] for name in layout]
    if not c0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.concatenate(c0), np.concatenate(c1)


def rom_words(ops=None) -> list[int]:
    """The ROM contents for ``ops``: ``c0 | (c1 mod 2**16) << 20`` per word."""
    c0, c1 = rom_fields(ops)
    words = c0 | ((c1 & ((1 << C1_BITS) - 1)) << C0_BITS)
    return [int(w) for w in words]


# --- the algorithm ---------------------------------------------------------------------------

def _decode(b):
    s = b >> 15
    e_field = (b >> 10) & 31
    frac = b & 1023
    sig = np.where(e_field > 0, frac | 1024, frac)
    ex = np.maximum(e_field, 1)                       # |x| = sig * 2**(ex - 25)
    return s, e_field, frac, sig, ex


def _t_parts(sig, ex, c, negate):
    """``t = +-|x| * log2(e) * 2**c`` split as ``i + f/2**16``: returns ``(i, f)``.

    ``T = floor(|t| * 2**16)`` (clamped for ``|x| * 2**c >= 32``); a negative ``t`` is
    taken as ``~T`` (that is ``-T - 1``), so ``i = -1 - (T >> 16)`` and the fraction bits
    are inverted.
    """
    p = sig * LOG2E_INT                                   # < 2**29
    # |t| * 2**F = p * 2**(ex + c - 25 - LOG2E_FRAC_BITS + F) = p >> (26 - ex - c)
    sh = (25 + LOG2E_FRAC_BITS - _F) - ex - c
    big = ex + c >= FP16_BIAS + T_CLAMP_EXP
    t_mag = np.where(big, (1 << (_F + T_INT_BITS)) - 1, p >> np.maximum(sh, 0))
    j = t_mag >> _F
    fr = t_mag & ((1 << _F) - 1)
    i = np.where(negate, -1 - j, j)
    f = np.where(negate, ((1 << _F) - 1) - fr, fr)
    return i, f


def _round(y, q):
    """Round ``y * 2**(q - 19)`` to FP16 (sign not included); ``y`` in ``[2**18, 2**20)``.

    ``n`` = 1 when the leading one is at bit 19 or 20, so the exponent is ``q - 1 + n``;
    results under ``2**-14`` are shifted further right (subnormals, at most 14 places).
    The kept bits plus one guard bit are ``g = y >> (7 + n + s)``; the significand is
    ``(g + 1) >> 1`` (to nearest, ties away); a carry out of it, into the exponent field
    or to infinity, is taken by adding it to the packed bits. Returns ``(bits, overflow)``.
    """
    n = np.minimum(y >> _WF, 1)
    e_out = q - 1 + n
    sub = np.clip(-14 - e_out, 0, 14)
    g = y >> (_WF - 12 + n + sub)
    sig = (g + 1) >> 1
    bits = ((np.maximum(e_out, -14) + 14) << 10) + sig
    ovf = bits >= _INF
    return np.where(ovf, _INF, bits), ovf


def _interp(addr, dx, c0s, c1s):
    return c0s[addr] + ((c1s[addr] * dx) >> DX_BITS)


def _log_path(op, s, sig, ex, layout, c0s, c1s):
    """exp, sigmoid, tanh through ``t``: returns the magnitude bits and overflow."""
    c = 1 if op is UnaryOp.TANH else 0
    negate = (s == 1) if op is UnaryOp.EXP else np.ones(s.shape, bool)
    i, f = _t_parts(sig, ex, c, negate)
    r_e = REGIONS["exp2"]
    addr = layout["exp2"] + (f >> r_e.dx_bits)
    dx = (f & ((1 << r_e.dx_bits) - 1)) << (DX_BITS - r_e.dx_bits)
    if op is UnaryOp.EXP:
        return _round(_interp(addr, dx, c0s, c1s), i)
    r_g = REGIONS["sigmoid"]
    in_g = i >= -SIG_TABLES
    addr = np.where(in_g, layout["sigmoid"] + ((-1 - np.maximum(i, -SIG_TABLES)) << r_g.index_bits)
                    + (f >> r_g.dx_bits), addr)
    dx = np.where(in_g, (f & ((1 << r_g.dx_bits) - 1)) << (DX_BITS - r_g.dx_bits), dx)
    y = _interp(addr, dx, c0s, c1s)
    q = i + c                             # v = y * 2**(q - 19) < 1
    direct = (s == 1) if op is UnaryOp.SIGMOID else np.zeros(s.shape, bool)
    # complement: 1 - v = A * 2**-20 with A = 2**20 - 1 - floor(v * 2**20), which is the
    # 20-bit inverse of v * 2**20 = y >> (-q - 1); then rounded like y = A, q = -1
    a = ((1 << (_WF + 1)) - 1) - (y >> np.minimum(-q - 1, _WF + 2))
    y = np.where(direct, y, a)
    q = np.where(direct, q, -1)
    return _round(y, q)


def _tanh_small(e_field, frac, layout, c0s, c1s):
    r_t = REGIONS["tanh_small"]
    e = e_field - FP16_BIAS
    k = np.clip(e - TANH_SMALL_BINADES[0], 0, r_t.tables - 1)
    addr = layout["tanh_small"] + (k << r_t.index_bits) + (frac >> r_t.dx_bits)
    dx = (frac & ((1 << r_t.dx_bits) - 1)) << (DX_BITS - r_t.dx_bits)
    return _round(_interp(addr, dx, c0s, c1s), e)[0]


def _recip(sig, ex, layout, c0s, c1s):
    """1/|x| for finite non-zero |x|: normalize subnormals, ``1/m`` from the table."""
    lz = np.zeros_like(sig)
    m = sig.copy()
    for k in (8, 4, 2, 1):       # leading-zero count of an 11-bit significand, as hardware
        sh = m < (1 << (11 - k))
        lz += np.where(sh, k, 0)
        m = np.where(sh, m << k, m)
    r_r = REGIONS["recip"]
    mant = m & 1023
    addr = layout["recip"] + (mant >> r_r.dx_bits)
    dx = (mant & ((1 << r_r.dx_bits) - 1)) << (DX_BITS - r_r.dx_bits)
    # x = m * 2**(ex - 15 - lz) with m in [1, 2): 1/x = (1/m) * 2**(15 + lz - ex)
    return _round(_interp(addr, dx, c0s, c1s), FP16_BIAS + lz - ex)


def _as_bits(x_bits, name="x_bits"):
    a = np.asarray(x_bits)
    if a.dtype != np.uint16:
        if a.dtype.kind not in "iu" or (a.size and (a.min() < 0 or a.max() > 0xFFFF)):
            raise ValueError(f"{name} must hold FP16 bit patterns (uint16), not {a.dtype} "
                             f"values {a.ravel()[:4].tolist()}...")
    return a.astype(np.int64)


def _evaluate(op, x_bits, ops):
    op = UnaryOp.parse(op)
    built = parse_ops(ops)
    b = _as_bits(x_bits)
    s, e_field, frac, sig, ex = _decode(b)
    is_nan = (e_field == 31) & (frac != 0)
    is_inf = (e_field == 31) & (frac == 0)
    is_zero = (e_field == 0) & (frac == 0)
    sign = s << 15
    ovf = np.zeros(b.shape, bool)
    if op not in built:
        out = np.full(b.shape, _NAN, np.int64)
    elif op is UnaryOp.PASS:
        out = b
    elif op is UnaryOp.RELU:
        out = np.where(s == 1, 0, b)
    else:
        layout = rom_layout(built)
        c0s, c1s = rom_fields(built)
        if op is UnaryOp.RECIP:
            mag, ovf = _recip(sig, ex, layout, c0s, c1s)
            mag = np.where(is_zero, _INF, np.where(is_inf, 0, mag))
            ovf = (ovf | is_zero) & ~is_inf
            out = mag | sign
        else:
            mag, ovf = _log_path(op, s, sig, ex, layout, c0s, c1s)
            if op is UnaryOp.EXP:
                out = np.where(is_inf, np.where(s == 1, 0, _INF), mag)
                ovf = ovf & ~is_inf
            elif op is UnaryOp.SIGMOID:
                out = np.where(is_inf, np.where(s == 1, 0, _ONE), mag)
            else:
                e = e_field - FP16_BIAS
                small = _tanh_small(e_field, frac, layout, c0s, c1s)
                mag = np.where(e < TANH_SMALL_BINADES[0], b & 0x7FFF,
                               np.where(e <= TANH_SMALL_BINADES[1], small, mag))
                out = np.where(is_inf, _ONE, mag) | sign
    out = np.where(is_nan, _NAN, out)
    nan_created = (out == _NAN) & ~is_nan
    overflow = ovf & ~is_nan
    return out.astype(np.uint16), overflow, nan_created


def unary_bits(op, x_bits, *, ops=None) -> np.ndarray:
    """The device's unary function ``op`` on FP16 bit patterns, bit for bit.

    Parameters
    ----------
    op : UnaryOp, its value, or its name (``"relu"``, ``"sigmoid"``, ``"tanh"``,
        ``"exp"``, ``"recip"``, ``"pass"``)
    x_bits : array of FP16 bit patterns (``uint16``, or integers in ``0..0xFFFF``)
    ops : collection of UnaryOp, optional
        The ops the device was built with (default: all). An op that was not built gives
        the canonical NaN on every lane (and counts as NaN created).

    Returns
    -------
    uint16 array of the same shape.

    Raises
    ------
    ValueError
        ``op`` is not a unary op; ``x_bits`` holds values that are not 16-bit patterns.
    """
    return _evaluate(op, x_bits, ops)[0]


def unary_events(op, x_bits, *, ops=None) -> tuple[np.ndarray, np.ndarray]:
    """Per-element events of :func:`unary_bits`: ``(overflow, nan_created)``, bool arrays.

    *overflow*: the result is +-inf and the input is finite (exp of a large ``x``,
    reciprocal of ``+-0`` and of ``|x| <= 2**-16``). *nan_created*: the result is NaN and
    the input is not; no built op creates a NaN (only an op missing from ``ops`` does).
    """
    _, overflow, nan_created = _evaluate(op, x_bits, ops)
    return overflow, nan_created


#: Every FP16 input's result and events, per ``(op, built ops)``: computed on first use.
_TABLES = {}


def _table(op, built):
    """``(out, overflow, nan_created, any_overflow, any_nan)`` of ``op`` on the 65536
    FP16 patterns in order (:func:`_evaluate`, the definition, run once)."""
    key = (op, built)
    table = _TABLES.get(key)
    if table is None:
        out, overflow, nan_created = _evaluate(op, np.arange(1 << 16, dtype=np.uint16), built)
        table = _TABLES[key] = (out, overflow, nan_created, bool(overflow.any()),
                                bool(nan_created.any()))
    return table


def unary_counts(op, x_bits, *, ops=None) -> tuple[np.ndarray, int, int]:
    """``(unary_bits, overflow count, NaN-created count)`` of ``op`` on ``x_bits``.

    The fast form of :func:`unary_bits` with :func:`unary_events` summed, for the model
    and the exported layers: a uint16 input is looked up in the table of all 65536
    patterns that the definition computed once (``tests/numerics/test_unary_model.py``
    compares the two on every pattern); other integer inputs take the definition.
    """
    op = UnaryOp.parse(op)
    built = parse_ops(ops)
    a = np.asarray(x_bits)
    if a.dtype != np.uint16:
        out, overflow, nan_created = _evaluate(op, a, built)
        return out, int(overflow.sum()), int(nan_created.sum())
    out, overflow, nan_created, any_overflow, any_nan = _table(op, built)
    # np.take rather than out[a]: the same elements, a few times faster for a large a.
    return (np.take(out, a), int(np.take(overflow, a).sum()) if any_overflow else 0,
            int(np.take(nan_created, a).sum()) if any_nan else 0)


def unary(name_or_op, x, *, ops=None) -> np.ndarray:
    """:func:`unary_bits` on values: ``float16`` array in, ``float16`` array out.

    ``x`` that is not ``float16`` (Python floats, float32/64 arrays) is first rounded to
    FP16 with round to nearest, ties to even, like every host tensor at the boundary.

    Raises
    ------
    ValueError
        ``name_or_op`` is not a unary op.
    TypeError
        ``x`` is not numeric.
    """
    op = UnaryOp.parse(name_or_op)
    a = np.asarray(x)
    if a.dtype != np.float16:
        if a.dtype.kind not in "fiub":
            raise TypeError(f"x must be numeric (float16 preferably), not {a.dtype}")
        with np.errstate(over="ignore"):
            a = a.astype(np.float16)
    return unary_bits(op, a.view(np.uint16), ops=ops).view(np.float16)


# --- reference and error measure ---------------------------------------------------------------

def _sigmoid64(v: float) -> float:
    if v >= 0:
        return 1.0 / (1.0 + math.exp(-v))
    e = math.exp(v)
    return e / (1.0 + e)


def _exact64(op: UnaryOp, v: float) -> float:
    """float64 value of the function at ``v`` (error well under 10 units of 2**-52)."""
    if math.isnan(v):
        return math.nan
    if op is UnaryOp.RELU:
        return v if v > 0 else 0.0
    if op is UnaryOp.PASS:
        return v
    if math.isinf(v):
        return {UnaryOp.EXP: math.inf if v > 0 else 0.0,
                UnaryOp.SIGMOID: 1.0 if v > 0 else 0.0,
                UnaryOp.TANH: math.copysign(1.0, v),
                UnaryOp.RECIP: math.copysign(0.0, v)}[op]
    if op is UnaryOp.EXP:
        return math.exp(v) if v < 710 else math.inf
    if op is UnaryOp.SIGMOID:
        return _sigmoid64(v)
    if op is UnaryOp.TANH:
        return math.tanh(v)
    if op is UnaryOp.RECIP:
        return 1.0 / v if v != 0 else math.copysign(math.inf, v)
    raise AssertionError(op)


def reference_values(op, x_bits) -> np.ndarray:
    """The float64 values of the exact function (``math.exp``/``tanh``, element-wise)."""
    op = UnaryOp.parse(op)
    b = _as_bits(x_bits).astype(np.uint16)
    xs = b.view(np.float16).astype(np.float64).ravel()
    return np.array([_exact64(op, float(v)) for v in xs]).reshape(b.shape)


def reference_bits(op, x_bits) -> np.ndarray:
    """The function rounded once to FP16 (nearest even) from float64; NaN as ``0x7E00``.

    float64 is close enough to decide every FP16 rounding: ``tests/numerics/test_unary_model.py``
    checks that no reference value lies within ``2**-40`` (relative) of an FP16 rounding
    boundary, far more than the float64 evaluation error (a few units of ``2**-52``).
    """
    with np.errstate(over="ignore"):
        out = reference_values(op, x_bits).astype(np.float16).view(np.uint16)
    return np.where(np.isnan(out.view(np.float16)), np.uint16(_NAN), out)


class ErrorReport(NamedTuple):
    """Error of :func:`unary_bits` against :func:`reference_bits` over the useful range.

    useful : int
        Inputs whose correctly rounded result is finite and non-zero.
    worst_ulp : int
        Largest :func:`ulp_distance` to the correctly rounded result there.
    worst_ulp_x : int
        First input (bit pattern) where it occurs (-1 when the worst is 0).
    not_correctly_rounded : int
        Inputs there whose result differs from the correctly rounded one.
    worst_abs : float
        Largest ``|result - f(x)|`` there, ``f(x)`` the float64 value.
    worst_abs_x : int
        Input (bit pattern) where it occurs.
    worst_err_ulps : float
        Largest ``|result - f(x)| / ulp(f(x))`` there, where ``ulp(v)`` is the FP16
        spacing at ``v``: ``2**(max(floor(log2|v|), -14) - 10)`` (a correctly rounded
        result has at most 0.5).
    worst_err_ulps_x : int
        Input (bit pattern) where it occurs.
    outside_mismatches : int
        Non-NaN inputs outside the useful range (zero, infinite or overflowing results)
        whose result differs from the correctly rounded one.
    """
    useful: int
    worst_ulp: int
    worst_ulp_x: int
    not_correctly_rounded: int
    worst_abs: float
    worst_abs_x: int
    worst_err_ulps: float
    worst_err_ulps_x: int
    outside_mismatches: int


def measure_error(op) -> ErrorReport:
    """Measure :func:`unary_bits` on all 65,536 inputs against the float64 reference."""
    op = UnaryOp.parse(op)
    x = np.arange(1 << 16).astype(np.uint16)
    got = unary_bits(op, x)
    ref = reference_bits(op, x)
    exact = reference_values(op, x)
    ref_v = ref.view(np.float16).astype(np.float64)
    x_nan = np.isnan(x.view(np.float16))
    useful = np.isfinite(ref_v) & (ref_v != 0) & ~x_nan
    dist = np.where(useful, ulp_distance(got, ref), 0)
    with np.errstate(invalid="ignore"):
        abs_err = np.where(useful, np.abs(got.view(np.float16).astype(np.float64) - exact),
                           0.0)
        mag = np.abs(np.where(useful, exact, 1.0))
        spacing = np.exp2(np.maximum(np.floor(np.log2(mag)), -14) - 10)
        ulp_err = np.where(useful, abs_err / spacing, 0.0)
    worst = int(dist.max())
    return ErrorReport(
        useful=int(useful.sum()),
        worst_ulp=worst,
        worst_ulp_x=int(np.argmax(dist)) if worst else -1,
        not_correctly_rounded=int((dist != 0).sum()),
        worst_abs=float(abs_err.max()),
        worst_abs_x=int(np.argmax(abs_err)),
        worst_err_ulps=float(ulp_err.max()),
        worst_err_ulps_x=int(np.argmax(ulp_err)),
        outside_mismatches=int(((got != ref) & ~useful & ~x_nan).sum()),
    )


def ulp_distance(a_bits, b_bits) -> np.ndarray:
    """Number of FP16 steps between two FP16 bit patterns (non-NaN).

    Both are placed on the ordered line of FP16 values (``+0`` and ``-0`` at the same
    place; ``+-inf`` one step beyond ``+-65504``); the distance is the difference of the
    places, i.e. how many representable values one must step over to get from one to the
    other.
    """
    def place(bits):
        v = _as_bits(bits)
        mag = v & 0x7FFF
        return np.where(v & 0x8000, -mag, mag)
    return np.abs(place(a_bits) - place(b_bits))
