"""Property tests of ``host.numerics.bfp`` (hypothesis).

The reference here is an exact scalar model written from the rules of
``docs/numerics.md`` section 2 with ``fractions.Fraction``:

    e = floor(log2(max |x_i|))  (clamped below at -127; -127 for an all-zero block)
    step = 2^(e - (m - 2))
    q_i = sign(x_i) * min(round(|x_i| / step), 2^(m-1) - 1)

with ``round`` to nearest, ties to even or away from zero.
"""

import math
from fractions import Fraction

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from host.numerics import bfp
from host.numerics.bfp import BfpTensor

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])
ROUNDINGS = ("nearest-even", "nearest-away")


# --- exact scalar reference --------------------------------------------------------------

def floor_log2(v: Fraction) -> int:
    """floor(log2(v)) of a positive rational, exactly (integer arithmetic only)."""
    assert v > 0
    p, q = v.numerator, v.denominator
    k = p.bit_length() - q.bit_length()
    # 2^k <= p/q ?  If not, the answer is k - 1 (p/q is within a factor of 2 of 2^k).
    below = (p < (q << k)) if k >= 0 else ((p << -k) < q)
    return k - 1 if below else k


def round_nearest(v: Fraction, away: bool) -> int:
    """Round a non-negative rational to the nearest integer; ties even or away."""
    assert v >= 0
    whole, frac = divmod(v, 1)
    whole = int(whole)
    half = Fraction(1, 2)
    if frac > half or (frac == half and (away or whole % 2 == 1)):
        return whole + 1
    return whole


def ref_block(values, m, rounding, exponent=None):
    """Exact model of one block: returns (e, [q_i], saturated count)."""
    xs = [Fraction(float(v)) for v in values]
    if exponent is None:
        amax = max((abs(x) for x in xs), default=Fraction(0))
        e = -127 if amax == 0 else max(floor_log2(amax), -127)
    else:
        e = exponent
    step = Fraction(2) ** (e - (m - 2))
    top = 2 ** (m - 1) - 1
    qs, sat = [], 0
    for x in xs:
        r = round_nearest(abs(x) / step, rounding == "nearest-away")
        if r > top:
            sat += 1
            r = top
        qs.append(-r if x < 0 else r)
    return e, qs, sat


# --- strategies ----------------------------------------------------------------------------

def _elements(dtype):
    width = {np.float16: 16, np.float32: 32, np.float64: 64}[dtype]
    # float64 magnitudes stay below 2^127: larger ones have no E8M0 scale (rejected).
    big = float(np.finfo(dtype).max) if width < 64 else 1e38
    generic = st.floats(width=width, allow_nan=False, min_value=-big, max_value=big)

    # Values on a fine power-of-two grid produce exact ties and near-top maxima.
    @st.composite
    def grid(draw):
        k = draw(st.integers(-(2 ** 11), 2 ** 11))
        j = draw(st.integers(-30 if width == 16 else -150, 4 if width == 16 else 100))
        return float(np.asarray(math.ldexp(k, j), dtype))

    return st.one_of(generic, grid(), st.just(0.0))


@st.composite
def float_arrays(draw, dtypes=(np.float16, np.float32, np.float64), max_last=40):
    dtype = draw(st.sampled_from(dtypes))
    lead = draw(hnp.array_shapes(min_dims=0, max_dims=2, min_side=1, max_side=3))
    last = draw(st.integers(1, max_last))
    shape = tuple(lead) + (last,)
    x = draw(hnp.arrays(dtype, shape, elements=_elements(dtype)))
    return x


# --- (a) quantization error bound ----------------------------------------------------------

def _check_error_bounds(x, t, m, exps, dynamic):
    """Per element, exactly:

    * not saturated: |dequant - x| <= step/2, step = 2^(e-(m-2)) of its block;
    * saturated (defined from x alone: |x| >= (2^(m-1) - 1/2) * step, the point from which
      round(|x|/step) exceeds the top code in both tie modes because 2^(m-1) is even):
      dequant = sign(x) * (2^(m-1) - 1) * step, and |x| > (2^(m-1) - 1) * step;
    * the per-block saturation counts equal the number of such elements;
    * dynamic mode only: every |x| < 2^(e+1) (e = floor(log2 amax), or -127 when that is
      lower), so a saturated element lies in [2^(e+1) - step/2, 2^(e+1)) and its error
      is below one step: saturation happens only when rounding passes the top code.
    """
    n = t.block_size
    top = 2 ** (m - 1) - 1
    y = t.dequantize()
    flat_x = x.reshape(-1, x.shape[-1])
    flat_y = y.reshape(-1, x.shape[-1])
    flat_e = np.asarray(exps).reshape(-1, t.nblocks)
    flat_sat = t.saturations.reshape(-1, t.nblocks)
    for row in range(flat_x.shape[0]):
        for b in range(t.nblocks):
            e = int(flat_e[row, b])
            step = Fraction(2) ** (e - (m - 2))
            count = 0
            for i in range(b * n, min((b + 1) * n, x.shape[-1])):
                xv = Fraction(float(flat_x[row, i]))
                yv = Fraction(float(flat_y[row, i]))
                if abs(xv) >= (top + Fraction(1, 2)) * step:
                    count += 1
                    assert abs(xv) > top * step
                    assert yv == (top * step if xv > 0 else -top * step), (xv, yv, e)
                else:
                    assert abs(yv - xv) <= step / 2, (xv, yv, e, m)
                if dynamic:
                    assert abs(xv) < Fraction(2) ** (e + 1)
                    assert abs(yv - xv) < step
            assert count == flat_sat[row, b]


@settings(max_examples=150, **SETTINGS)
@given(x=float_arrays(), n=st.integers(1, 40), m=st.integers(2, 16),
       rounding=st.sampled_from(ROUNDINGS))
def test_dynamic_error_bound(x, n, m, rounding):
    t = bfp.quantize(x, n, m, rounding)
    _check_error_bounds(x, t, m, t.exponents, dynamic=True)


@st.composite
def static_case(draw):
    x = draw(float_arrays(max_last=24))
    n = draw(st.integers(1, 12))
    nblocks = -(-x.shape[-1] // n)
    if draw(st.booleans()):
        exps = draw(st.integers(-127, 127))
    else:
        exps = draw(hnp.arrays(np.int32, x.shape[:-1] + (nblocks,),
                               elements=st.integers(-127, 127)))
    return x, n, exps


@settings(max_examples=150, **SETTINGS)
@given(case=static_case(), m=st.integers(2, 16), rounding=st.sampled_from(ROUNDINGS))
def test_static_error_bound(case, m, rounding):
    x, n, exps = case
    t = bfp.quantize(x, n, m, rounding, exponent=exps)
    full = np.broadcast_to(exps, t.exponents.shape)
    np.testing.assert_array_equal(t.exponents, full)
    _check_error_bounds(x, t, m, full, dynamic=False)


# --- (b) pack / unpack round trip ----------------------------------------------------------

@st.composite
def bfp_tensors(draw):
    n = draw(st.integers(1, 40))
    m = draw(st.integers(2, 16))
    lead = tuple(draw(hnp.array_shapes(min_dims=0, max_dims=2, min_side=0, max_side=3)))
    last = draw(st.integers(0, 3 * n))
    nblocks = -(-last // n)
    top = 2 ** (m - 1) - 1
    codes = draw(hnp.arrays(np.int64, lead + (nblocks,), elements=st.integers(0, 254)))
    mant = draw(hnp.arrays(np.int16, lead + (last,), elements=st.integers(-top, top)))
    padded = np.zeros(lead + (nblocks * n,), np.int16)
    padded[..., :last] = mant
    zeros = np.zeros(codes.shape, np.int64)
    return BfpTensor(exponents=(codes - 127).astype(np.int16), mantissas=padded,
                     block_size=n, mantissa_bits=m, shape=lead + (last,),
                     saturations=zeros, nonfinite=zeros.copy())


@settings(max_examples=200, **SETTINGS)
@given(t=bfp_tensors())
def test_pack_unpack_round_trip(t):
    n, m = t.block_size, t.mantissa_bits
    raw = bfp.pack(t)
    assert raw.dtype == np.uint8
    assert raw.size == t.exponents.size * -(-(8 + n * m) // 8)
    back = bfp.unpack(raw.tobytes(), t.shape, n, m)
    assert back == t
    np.testing.assert_array_equal(back.exponents, t.exponents)
    np.testing.assert_array_equal(back.mantissas, t.mantissas)
    assert bfp.pack(back).tobytes() == raw.tobytes()


@settings(max_examples=60, **SETTINGS)
@given(x=float_arrays(dtypes=(np.float16, np.float32)), n=st.integers(1, 40),
       m=st.integers(2, 16))
def test_quantize_pack_unpack_dequantize(x, n, m):
    t = bfp.quantize(x, n, m)
    back = bfp.unpack(bfp.pack(t), x.shape, n, m)
    assert back == t
    np.testing.assert_array_equal(back.dequantize(), t.dequantize())


# --- (c) split / merge round trip -----------------------------------------------------------

@settings(max_examples=150, **SETTINGS)
@given(w=hnp.arrays(np.int32, hnp.array_shapes(min_dims=2, max_dims=2, min_side=0, max_side=20),
                    elements=st.integers(1, 1000)),
       n=st.integers(1, 9))
def test_split_merge_matrix(w, n):
    rows, cols = w.shape
    tiles = bfp.split_matrix(w, n)
    big_r, big_c = -(-rows // n), -(-cols // n)
    assert tiles.shape == (big_r, big_c, n, n)
    for r in range(big_r):
        for c in range(big_c):
            for i in range(n):
                for j in range(n):
                    gi, gj = r * n + i, c * n + j
                    want = w[gi, gj] if gi < rows and gj < cols else 0   # zero padding
                    assert tiles[r, c, i, j] == want
    np.testing.assert_array_equal(bfp.merge_matrix(tiles, (rows, cols)), w)


@settings(max_examples=150, **SETTINGS)
@given(x=hnp.arrays(np.float32, hnp.array_shapes(min_dims=1, max_dims=3, min_side=0, max_side=12),
                    elements=st.integers(1, 10 ** 6).map(float)),
       n=st.integers(1, 9))
def test_split_merge_vector(x, n):
    length = x.shape[-1]
    tiles = bfp.split_vector(x, n)
    count = -(-length // n)
    assert tiles.shape == x.shape[:-1] + (count, n)
    flat = tiles.reshape(x.shape[:-1] + (count * n,))
    np.testing.assert_array_equal(flat[..., :length], x)
    np.testing.assert_array_equal(flat[..., length:], 0)      # zero padding
    np.testing.assert_array_equal(bfp.merge_vector(tiles, length), x)


# --- (d) dynamic exponent, exactly --------------------------------------------------------

@settings(max_examples=200, **SETTINGS)
@given(x=float_arrays(dtypes=(np.float16, np.float32)), n=st.integers(1, 40))
def test_dynamic_exponent_is_exact_floor_log2(x, n):
    t = bfp.quantize(x, n, 8)
    flat = x.reshape(-1, x.shape[-1])
    got = t.exponents.reshape(-1, t.nblocks)
    for row in range(flat.shape[0]):
        for b in range(t.nblocks):
            block = flat[row, b * n:(b + 1) * n]
            amax = max(abs(Fraction(float(v))) for v in block)
            want = -127 if amax == 0 else max(floor_log2(amax), -127)
            assert got[row, b] == want, (block, amax)


def test_floor_log2_reference_itself():
    # The reference must be right at and around powers of two.
    for k in range(-160, 140):
        p = Fraction(2) ** k
        assert floor_log2(p) == k
        assert floor_log2(p * Fraction(2 ** 53 - 1, 2 ** 53)) == k - 1
        assert floor_log2(p * Fraction(2 ** 53 + 1, 2 ** 53)) == k
    assert floor_log2(Fraction(3)) == 1 and floor_log2(Fraction(1, 3)) == -2


# --- (e) float16 blocks against the exact scalar model -------------------------------------

@st.composite
def fp16_patterns(draw):
    """Finite FP16 patterns; half of them with few significant bits, to make exact ties."""
    sign = draw(st.sampled_from([0, 0x8000]))
    if draw(st.booleans()):
        return sign | draw(st.integers(0, 0x7BFF))
    field = draw(st.integers(0, 30))
    frac = (draw(st.integers(0, 7)) << draw(st.integers(0, 7))) & 0x3FF
    return sign | (field << 10) | frac


@settings(max_examples=300, **SETTINGS)
@given(bits=hnp.arrays(np.uint16, st.tuples(st.integers(1, 3), st.integers(1, 40)),
                       elements=fp16_patterns()),
       n=st.integers(1, 40), m=st.integers(2, 16), rounding=st.sampled_from(ROUNDINGS),
       static=st.one_of(st.none(), st.integers(-127, 127)))
def test_float16_blocks_match_exact_model(bits, n, m, rounding, static):
    x = bits.view(np.float16)
    t = bfp.quantize(x, n, m, rounding, exponent=static)
    length = x.shape[-1]
    for row in range(x.shape[0]):
        for b in range(t.nblocks):
            block = x[row, b * n:(b + 1) * n]
            e, qs, sat = ref_block(block, m, rounding, static)
            assert t.exponents[row, b] == e
            assert t.mantissas[row, b * n:b * n + len(qs)].tolist() == qs
            assert t.saturations[row, b] == sat
    np.testing.assert_array_equal(t.mantissas[:, length:], 0)


def test_reference_on_documented_examples():
    # docs/numerics.md 2.6, to show the reference itself is right.
    assert ref_block([1.5, -0.375, 0, 2.75], 4, "nearest-even") == (1, [3, -1, 0, 6], 0)
    assert ref_block([0.125, 0.375, -0.625, 1], 4, "nearest-away") == (0, [1, 2, -3, 4], 0)
    assert ref_block([1.96875, 1, 0, 0], 4, "nearest-even") == (0, [7, 4, 0, 0], 1)
    assert ref_block([2.0 ** -24, 2.0 ** -23, 0, 0], 4, "nearest-even") == (-23, [2, 4, 0, 0], 0)
    assert ref_block([3, 100, -0.01, 0], 4, "nearest-even", 2) == (2, [3, 7, 0, 0], 1)
    assert ref_block([0, 0], 8, "nearest-even") == (-127, [0, 0], 0)
