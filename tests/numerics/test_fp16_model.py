"""Tests of the FP16 element-wise model :mod:`host.numerics.fp16` (``docs/numerics.md`` section 6).

* TestFloat conformance: every ``f16_add``, ``f16_sub`` and ``f16_mul`` (``.rne``) vector,
  result bits exact (NaN results must be the canonical ``0x7E00``), and the overflow and
  NaN-created events against TestFloat's flags; ``b_sub_a`` on the ``f16_sub`` vectors with
  the operands swapped; ``max`` against the maximum derived from ``f16_lt`` and ``f16_le``.
  The ``.away`` files do not apply: the MFUs round to nearest even only.
* Two references written independently of the model: an exact one with
  ``fractions.Fraction`` and a correct-rounding routine (about 20,000 pairs per operation,
  plus every pair of special operands), and a vectorized integer one (millions of pairs).
* Directed cases with the expected bits written out, algebraic properties (hypothesis),
  the API and its errors.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from host.spec.formats import CANONICAL_NAN
from host.numerics.fp16 import (
    BinaryEvents, binary, binary_bits, binary_events, binary_events_bits,
)
from host.spec.ops import BinaryOp
from sim.fp16_vectors import (
    FLAG_INVALID, FLAG_OVERFLOW, SPECIALS, is_nan, max_from_compare, random_pairs,
    read_testfloat, find_testfloat,
)

OPS = list(BinaryOp)
ARITH = [BinaryOp.ADD, BinaryOp.A_SUB_B, BinaryOp.B_SUB_A, BinaryOp.MUL]


def load(name):
    """TestFloat vectors; a missing file fails the test (never a skip)."""
    try:
        return read_testfloat(find_testfloat(name))
    except FileNotFoundError as e:
        pytest.fail(str(e))


def canonical(bits):
    """TestFloat prints NaN results with payloads; the contract says 0x7E00."""
    bits = np.asarray(bits, dtype=np.uint16)
    return np.where(is_nan(bits), np.uint16(CANONICAL_NAN), bits).astype(np.uint16)


def mismatches(a, b, got, exp, limit=8):
    bad = np.flatnonzero(got != exp)
    return len(bad), [f"{a[i]:04X} {b[i]:04X}: got {got[i]:04X} expected {exp[i]:04X}"
                      for i in bad[:limit]]


# --- TestFloat ----------------------------------------------------------------------------

# (op, file, swap operands): b_sub_a(b, a) = a - b, so it runs on f16_sub swapped.
TESTFLOAT_ARITH = [
    pytest.param(BinaryOp.ADD, "f16_add.rne.txt.gz", False, id="add"),
    pytest.param(BinaryOp.A_SUB_B, "f16_sub.rne.txt.gz", False, id="a_sub_b"),
    pytest.param(BinaryOp.B_SUB_A, "f16_sub.rne.txt.gz", True, id="b_sub_a"),
    pytest.param(BinaryOp.MUL, "f16_mul.rne.txt.gz", False, id="mul"),
]


@pytest.mark.parametrize("op, name, swap", TESTFLOAT_ARITH)
def test_testfloat_arith(op, name, swap):
    v = load(name)
    assert len(v.a) == 46_464
    a, b = (v.b, v.a) if swap else (v.a, v.b)
    got = binary_bits(op, a, b)
    n, examples = mismatches(a, b, got, canonical(v.result))
    assert n == 0, f"{op.name}: {n} of {len(a)} results differ: {examples}"
    # Counters. TestFloat's overflow flag is exactly "a finite result rounded past 65504"
    # (with round to nearest it always gives inf). Its invalid flag is also raised for a
    # signalling NaN operand, which propagates a NaN rather than creating one.
    ev = binary_events_bits(op, a, b)
    assert np.array_equal(ev.overflow, (v.flags & FLAG_OVERFLOW) != 0)
    created = ((v.flags & FLAG_INVALID) != 0) & ~is_nan(a) & ~is_nan(b)
    assert np.array_equal(ev.nan_created, created)
    assert ev.overflow.sum() > 100 and ev.nan_created.sum() >= 2   # the cases are there


@pytest.mark.parametrize("name", ["f16_add.rne.txt.gz", "f16_mul.rne.txt.gz"])
def test_numpy_cast_rounds_once(name):
    """The claim the model rests on, without the model: exact float64, one NumPy cast."""
    v = load(name)
    x = v.a.view(np.float16).astype(np.float64)
    y = v.b.view(np.float16).astype(np.float64)
    with np.errstate(all="ignore"):
        exact = x + y if "add" in name else x * y
        got = exact.astype(np.float16).view(np.uint16)
    ok = is_nan(v.result)
    assert np.array_equal(is_nan(got), ok)
    assert np.array_equal(got[~ok], v.result[~ok])


@pytest.mark.parametrize("name", ["f16_lt.rne.txt.gz", "f16_le.rne.txt.gz"])
def test_testfloat_max(name):
    """``max`` against the maximum derived from TestFloat's ordered comparisons.

    ``max(a, b) = b if lt(a, b) else a`` (likewise with ``le``), plus the two rules the
    comparison does not decide: NaN if either is a NaN, and ``+0 > -0``
    (see :func:`sim.fp16_vectors.max_from_compare`).
    """
    v = load(name)
    assert len(v.a) == 46_464
    exp = max_from_compare(v.a, v.b, v.result)
    got = binary_bits("max", v.a, v.b)
    n, examples = mismatches(v.a, v.b, got, exp)
    assert n == 0, f"max: {n} of {len(v.a)} results differ: {examples}"
    ev = binary_events_bits("max", v.a, v.b)
    assert not ev.overflow.any() and not ev.nan_created.any()
    # The derivation is not vacuous: zeros of both signs and NaNs are among the vectors.
    zeros = ((v.a & 0x7FFF) == 0) & ((v.b & 0x7FFF) == 0)
    assert (zeros & (v.a != v.b)).sum() > 0 and (is_nan(v.a) | is_nan(v.b)).sum() > 100


# --- exact reference with fractions.Fraction -----------------------------------------------

def frac_decode(bits: int):
    """``(sign, Fraction magnitude)`` of a finite pattern, or ``"nan"`` / ``("inf", s)``."""
    s = bits >> 15
    e = (bits >> 10) & 31
    f = bits & 1023
    if e == 31:
        return "nan" if f else ("inf", s)
    m = f if e == 0 else f | 1024
    return s, Fraction(m) * Fraction(2) ** (max(e, 1) - 25)


def frac_round(sign: int, mag: Fraction) -> int:
    """Round ``(-1)**sign * mag`` to FP16, nearest, ties to even (bits)."""
    if mag == 0:
        return sign << 15
    k = mag.numerator.bit_length() - mag.denominator.bit_length()   # 2**k ~ mag
    if Fraction(2) ** k > mag:
        k -= 1                                                       # 2**k <= mag < 2**(k+1)
    ulp = Fraction(2) ** max(k - 10, -24)
    n = mag / ulp
    q = math.floor(n)
    rest = n - q
    if rest > Fraction(1, 2) or (rest == Fraction(1, 2) and q % 2):
        q += 1
    value = q * ulp
    if value >= 65536:                      # past 65504 + half an ulp: inf
        return (sign << 15) | 0x7C00
    if value < Fraction(2) ** -14:          # subnormal (or the carry into 2**-14 below)
        return (sign << 15) | int(value / Fraction(2) ** -24)
    e = value.numerator.bit_length() - value.denominator.bit_length()
    if Fraction(2) ** e > value:
        e -= 1
    m = value / Fraction(2) ** (e - 10)
    assert m.denominator == 1 and 1024 <= m < 2048
    return (sign << 15) | ((e + 15) << 10) | (int(m) - 1024)


def frac_reference(op: BinaryOp, a: int, b: int) -> int:
    """The contract of ``docs/numerics.md`` section 6, spelt out case by case."""
    x, y = frac_decode(a), frac_decode(b)
    if x == "nan" or y == "nan":
        return CANONICAL_NAN
    if op is BinaryOp.MAX:
        def key(v):
            if v[0] == "inf":
                return (-1 if v[1] else 1) * Fraction(10 ** 6), 0
            return (-1 if v[0] else 1) * v[1], -1 if v[0] else 0    # -0 below +0
        return a if key(x) >= key(y) else b
    if op is BinaryOp.B_SUB_A:
        op, x, y = BinaryOp.A_SUB_B, y, x
    if op is BinaryOp.A_SUB_B:                        # a - b = a + (-b)
        y = ("inf", 1 - y[1]) if y[0] == "inf" else (1 - y[0], y[1])
        op = BinaryOp.ADD
    if op is BinaryOp.ADD:
        if x[0] == "inf" and y[0] == "inf":
            return (x[1] << 15) | 0x7C00 if x[1] == y[1] else CANONICAL_NAN
        if x[0] == "inf" or y[0] == "inf":
            s = x[1] if x[0] == "inf" else y[1]
            return (s << 15) | 0x7C00
        total = (-x[1] if x[0] else x[1]) + (-y[1] if y[0] else y[1])
        if total == 0:                     # exact zero: -0 only for (-0) + (-0)
            return 0x8000 if (x[0] and y[0]) else 0
        return frac_round(int(total < 0), abs(total))
    # MUL
    xs = x[1] if x[0] == "inf" else x[0]
    ys = y[1] if y[0] == "inf" else y[0]
    s = xs ^ ys
    x_inf, y_inf = x[0] == "inf", y[0] == "inf"
    if x_inf or y_inf:
        other = y if x_inf else x
        if other[0] != "inf" and other[1] == 0:
            return CANONICAL_NAN                          # 0 * inf
        return (s << 15) | 0x7C00
    return frac_round(s, x[1] * y[1])


@pytest.mark.parametrize("op", OPS, ids=lambda o: o.name)
def test_fraction_reference(op):
    rng = np.random.default_rng(20_000 + op.value)
    a, b = random_pairs(rng, 20_000)
    sa, sb = np.meshgrid(SPECIALS, SPECIALS)
    a = np.concatenate([a, sa.ravel()])
    b = np.concatenate([b, sb.ravel()])
    exp = np.array([frac_reference(op, int(x), int(y)) for x, y in zip(a, b)],
                   dtype=np.uint16)
    got = binary_bits(op, a, b)
    n, examples = mismatches(a, b, got, exp)
    assert n == 0, f"{op.name}: {n} of {len(a)} differ from the exact reference: {examples}"


# --- fast integer reference -------------------------------------------------------------

def _bit_length(n):
    """Bit length of non-negative int64 values (vectorized, exact)."""
    bl = np.zeros_like(n)
    t = n.copy()
    for k in (32, 16, 8, 4, 2, 1):
        big = t >= (1 << k)
        bl += np.where(big, k, 0)
        t = np.where(big, t >> k, t)
    return bl + (t > 0)


def int_round(sign, n, q):
    """FP16 bits of ``(-1)**sign * n * 2**q`` rounded to nearest even (int64 arrays)."""
    top = _bit_length(n) - 1 + q                  # exponent of the leading one
    ulp = np.maximum(top - 10, -24)               # exponent of the result's last place
    s = ulp - q                                   # right shift onto that place
    rs = np.clip(s, 0, 62)
    ls = np.clip(-s, 0, 62)
    m = np.where(s > 0, n >> rs, n << ls)
    rem = np.where(s > 0, n & ((np.int64(1) << rs) - 1), 0)
    half = np.where(s > 0, np.int64(1) << np.maximum(rs - 1, 0), 1)
    up = (s > 0) & ((rem > half) | ((rem == half) & ((m & 1) == 1)))
    m = m + up
    carry = m >= 2048                             # rounded up to the next binade
    m = np.where(carry, m >> 1, m)
    ulp = ulp + carry
    normal = m >= 1024
    field = np.where(normal, ulp + 25, 0)
    bits = np.where(normal, (field << 10) | (m - 1024), m)
    bits = np.where(field >= 31, 0x7C00, bits)
    return ((sign << 15) | bits).astype(np.uint16)


def int_reference(op: BinaryOp, a, b):
    """An integer implementation of section 6, independent of the model's float64 path."""
    a = a.astype(np.int64)
    b = b.astype(np.int64)
    if op is BinaryOp.B_SUB_A:
        op, a, b = BinaryOp.A_SUB_B, b, a
    nan_in = ((a & 0x7FFF) > 0x7C00) | ((b & 0x7FFF) > 0x7C00)
    if op is BinaryOp.MAX:
        def key(x):                                # total order, -0 just below +0
            return np.where(x >> 15, -(x & 0x7FFF) - 1, x & 0x7FFF)
        r = np.where(key(a) >= key(b), a, b)
        return np.where(nan_in, CANONICAL_NAN, r).astype(np.uint16)
    if op is BinaryOp.A_SUB_B:
        b = b ^ 0x8000
    sa, sb = a >> 15, b >> 15
    ea, eb = (a >> 10) & 31, (b >> 10) & 31
    ma = np.where(ea == 0, a & 1023, (a & 1023) | 1024)
    mb = np.where(eb == 0, b & 1023, (b & 1023) | 1024)
    qa, qb = np.maximum(ea, 1) - 25, np.maximum(eb, 1) - 25
    a_inf, b_inf = (a & 0x7FFF) == 0x7C00, (b & 0x7FFF) == 0x7C00
    if op is BinaryOp.MUL:
        s = sa ^ sb
        r = int_round(s, ma * mb, qa + qb)
        zero_inf = (a_inf & ((b & 0x7FFF) == 0)) | (b_inf & ((a & 0x7FFF) == 0))
        r = np.where(a_inf | b_inf, (s << 15) | 0x7C00, r)
        r = np.where(zero_inf, CANONICAL_NAN, r)
    else:
        va = np.where(sa, -1, 1) * (ma << (qa + 24))  # units of 2**-24, below 2**41
        vb = np.where(sb, -1, 1) * (mb << (qb + 24))
        t = va + vb
        s = np.where(t == 0, sa & sb, t < 0)
        r = int_round(s, np.abs(t), np.full_like(t, -24))
        inf_sign = np.where(a_inf, sa, sb)
        r = np.where(a_inf | b_inf, (inf_sign << 15) | 0x7C00, r)
        r = np.where(a_inf & b_inf & (sa != sb), CANONICAL_NAN, r)
    return np.where(nan_in, CANONICAL_NAN, r).astype(np.uint16)


@pytest.mark.parametrize("op", OPS, ids=lambda o: o.name)
def test_integer_reference_random(op):
    """>= 1M random pairs per operation (a quarter of them hard cases, see random_pairs)."""
    rng = np.random.default_rng(1_000_000 + op.value)
    for _ in range(4):
        a, b = random_pairs(rng, 300_000)
        n, examples = mismatches(a, b, binary_bits(op, a, b), int_reference(op, a, b))
        assert n == 0, f"{op.name}: {n} differ from the integer reference: {examples}"


@pytest.mark.parametrize("op", OPS, ids=lambda o: o.name)
def test_integer_reference_every_a(op):
    """Every one of the 65,536 patterns as ``a`` against 48 ``b`` (specials and random)."""
    rng = np.random.default_rng(7 + op.value)
    a_all = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    bs = np.concatenate([SPECIALS[::3], rng.integers(0, 1 << 16, 30, dtype=np.uint16)])
    for bv in bs:
        b = np.full_like(a_all, bv)
        n, examples = mismatches(a_all, b, binary_bits(op, a_all, b),
                                 int_reference(op, a_all, b))
        assert n == 0, f"{op.name}: {n} differ from the integer reference: {examples}"


def test_integer_reference_matches_fraction_reference():
    """The two references agree with each other (so neither is checked by a clone)."""
    rng = np.random.default_rng(99)
    a, b = random_pairs(rng, 3000)
    for op in OPS:
        exp = [frac_reference(op, int(x), int(y)) for x, y in zip(a, b)]
        assert list(int_reference(op, a, b)) == exp, op


# --- directed cases, expected bits written out -----------------------------------------

DIRECTED = [
    # op, a, b, result, overflow, nan_created
    ("add", 0x3C00, 0x1000, 0x3C00, 0, 0),    # 1 + 2**-11: tie, to even (1)
    ("add", 0x3C01, 0x1000, 0x3C02, 0, 0),    # (1 + 2**-10) + 2**-11: tie, to even (up)
    ("add", 0x3C00, 0x1001, 0x3C01, 0, 0),    # just above the tie: up
    ("add", 0x3C00, 0xBC00, 0x0000, 0, 0),    # x + (-x) = +0
    ("add", 0x8000, 0x8000, 0x8000, 0, 0),    # (-0) + (-0) = -0
    ("add", 0x8000, 0x0000, 0x0000, 0, 0),    # (-0) + (+0) = +0
    ("a_sub_b", 0x0000, 0x0000, 0x0000, 0, 0),  # 0 - 0 = +0
    ("a_sub_b", 0x8000, 0x0000, 0x8000, 0, 0),  # (-0) - (+0) = -0
    ("b_sub_a", 0x0000, 0x8000, 0x8000, 0, 0),  # (-0) - (+0) = -0
    ("a_sub_b", 0x0401, 0x0400, 0x0001, 0, 0),  # difference of normals is subnormal
    ("add", 0x03FF, 0x0001, 0x0400, 0, 0),    # largest subnormal + smallest = 2**-14
    ("add", 0x7BFF, 0x4BFF, 0x7BFF, 0, 0),    # 65504 + 15.99: below 65520, stays
    ("add", 0x7BFF, 0x4C00, 0x7C00, 1, 0),    # 65504 + 16 = 65520: tie, to inf
    ("mul", 0x7BFF, 0x3C01, 0x7C00, 1, 0),    # overflow
    ("mul", 0xFBFF, 0x4000, 0xFC00, 1, 0),    # -65504 * 2 = -inf
    ("add", 0x7C00, 0xFC00, 0x7E00, 0, 1),    # inf - inf
    ("a_sub_b", 0x7C00, 0x7C00, 0x7E00, 0, 1),
    ("a_sub_b", 0xFC00, 0x7C00, 0xFC00, 0, 0),  # -inf - inf = -inf, not an overflow
    ("mul", 0x0000, 0xFC00, 0x7E00, 0, 1),    # 0 * inf
    ("mul", 0x8000, 0x3C00, 0x8000, 0, 0),    # -0 * 1 = -0
    ("mul", 0x8001, 0x3800, 0x8000, 0, 0),    # -2**-24 * 0.5: tie, to even (-0)
    ("mul", 0x0003, 0x3800, 0x0002, 0, 0),    # 3 * 2**-25: tie, to even (2 * 2**-24)
    ("mul", 0x0001, 0x3A00, 0x0001, 0, 0),    # 0.75 * 2**-24 rounds up to 2**-24
    ("mul", 0x0200, 0x4000, 0x0400, 0, 0),    # subnormal * 2 = smallest normal
    ("mul", 0x0400, 0x3400, 0x0100, 0, 0),    # normal * 0.25 = subnormal
    ("add", 0x7E01, 0x3C00, 0x7E00, 0, 0),    # NaN payloads are not propagated
    ("mul", 0xFC01, 0x0000, 0x7E00, 0, 0),    # signalling NaN: propagated, not created
    ("add", 0x7C00, 0x7BFF, 0x7C00, 0, 0),    # inf in, inf out: not an overflow
    ("max", 0x8000, 0x0000, 0x0000, 0, 0),    # +0 > -0
    ("max", 0x0000, 0x8000, 0x0000, 0, 0),
    ("max", 0x8000, 0x8000, 0x8000, 0, 0),
    ("max", 0x7E00, 0x3C00, 0x7E00, 0, 0),    # NaN if either is a NaN
    ("max", 0x3C00, 0xFD00, 0x7E00, 0, 0),
    ("max", 0xFC00, 0xBC00, 0xBC00, 0, 0),    # -inf < -1
    ("max", 0xC000, 0xBC00, 0xBC00, 0, 0),    # -2 < -1
    ("max", 0x0001, 0x8400, 0x0001, 0, 0),
]


@pytest.mark.parametrize("op, a, b, result, overflow, nan_created", DIRECTED)
def test_directed(op, a, b, result, overflow, nan_created):
    a16, b16 = np.uint16(a), np.uint16(b)
    assert int(binary_bits(op, a16, b16)) == result
    ev = binary_events_bits(op, a16, b16)
    assert (bool(ev.overflow), bool(ev.nan_created)) == (bool(overflow), bool(nan_created))


# --- properties --------------------------------------------------------------------------

fp16_bits = st.integers(0, 0xFFFF).map(np.uint16)


@settings(max_examples=2000, deadline=None)
@given(fp16_bits, fp16_bits)
def test_properties(a, b):
    def f(op, x, y):
        return int(binary_bits(op, x, y))
    neg_b = np.uint16(b ^ 0x8000)
    assert f("add", a, b) == f("add", b, a)
    assert f("mul", a, b) == f("mul", b, a)
    assert f("max", a, b) == f("max", b, a)
    assert f("a_sub_b", a, b) == f("add", a, neg_b) == f("b_sub_a", b, a)
    r = f("mul", a, b)
    if not is_nan(r):                             # the sign of a product is the XOR
        assert r >> 15 == (a ^ b) >> 15
    m = f("max", a, b)
    assert m == CANONICAL_NAN if (is_nan(a) or is_nan(b)) else m in (a, b)
    for op in OPS:
        if is_nan(f(op, a, b)):
            assert f(op, a, b) == CANONICAL_NAN


# --- API ---------------------------------------------------------------------------------

def test_float16_api():
    a = np.float16([1.0, 65504.0, -0.0, np.inf, 3.0])
    b = np.float16([2.0 ** -11, 16.0, 0.0, np.inf, 0.5])
    r = binary("add", a, b)
    assert r.dtype == np.float16
    assert r.view(np.uint16).tolist() == [0x3C00, 0x7C00, 0x0000, 0x7C00, 0x4300]
    assert binary(BinaryOp.MAX, a, b).view(np.uint16).tolist() == \
        binary_bits("max", a.view(np.uint16), b.view(np.uint16)).tolist()
    ev = binary_events("add", a, b)
    assert isinstance(ev, BinaryEvents)
    assert ev.overflow.tolist() == [False, True, False, False, False]
    ev = binary_events("a_sub_b", a, b)
    assert ev.nan_created.tolist() == [False, False, False, True, False]
    # NaN results are the canonical NaN, also through the float16 API.
    assert binary("mul", np.float16([0.0]), np.float16([np.inf])).view(np.uint16)[0] == 0x7E00


def test_broadcast_and_shapes():
    a = np.float16([[1.0], [2.0]])
    b = np.float16([1.0, 2.0, 3.0])
    assert binary("mul", a, b).tolist() == [[1, 2, 3], [2, 4, 6]]
    assert binary("add", np.float16(1.0), np.float16(2.0)) == 3.0   # 0-d works
    assert binary_bits("max", np.zeros((2, 0), np.uint16), np.uint16(5)).shape == (2, 0)


def test_every_op_name():
    assert [op.name.lower() for op in BinaryOp] == ["add", "a_sub_b", "b_sub_a", "mul", "max"]
    assert [op.value for op in BinaryOp] == [0, 1, 2, 3, 4]
    for op in BinaryOp:
        assert BinaryOp.parse(op.name.lower()) is op
        assert BinaryOp.parse(op) is op
        # The op enums share one parse rule (host.spec.formats.NamedCode): any case, or the code.
        assert BinaryOp.parse(op.name) is op
        assert BinaryOp.parse(op.value) is op and BinaryOp.parse(np.uint8(op.value)) is op
    x, y = np.float16([6.0]), np.float16([-2.0])
    assert [float(binary(op, x, y)[0]) for op in BinaryOp] == [4.0, 8.0, -8.0, -12.0, 6.0]


@pytest.mark.parametrize("call, error, message", [
    (lambda: binary("div", np.float16(1), np.float16(1)), ValueError,
     "op must be a BinaryOp or one of 'add', 'a_sub_b', 'b_sub_a', 'mul', 'max', not 'div'"),
    (lambda: binary("add ", np.float16(1), np.float16(1)), ValueError, "not 'add '"),
    (lambda: binary_bits(5, np.uint16(1), np.uint16(1)), ValueError, "not 5"),
    (lambda: binary_bits(True, np.uint16(1), np.uint16(1)), ValueError, "not True"),
    (lambda: binary("add", np.float32([1]), np.float16([1])), TypeError,
     "a must be a float16 array, not an array of float32"),
    (lambda: binary("add", np.float16([1]), [1.0]), TypeError,
     "b must be a float16 array, not an array of float64"),
    (lambda: binary_bits("add", np.float16([1]), np.uint16([1])), TypeError,
     "a must be a uint16 array of FP16 bit patterns, not an array of float16"),
    (lambda: binary_events_bits("mul", np.uint16([1]), np.int32([1])), TypeError,
     "b must be a uint16 array of FP16 bit patterns, not an array of int32"),
    (lambda: binary_events("max", np.float16([1, 2]), np.float16([1, 2, 3])), ValueError,
     "a and b must broadcast together, not shapes (2,) and (3,)"),
])
def test_errors(call, error, message):
    with pytest.raises(error) as info:
        call()
    assert message in str(info.value)
