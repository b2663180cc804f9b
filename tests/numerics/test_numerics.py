"""Tests of the bit-exact reference kernels in ``host.numerics.mvm``.

Expected values come from outside the code under test:

* Berkeley TestFloat 3 vectors (``i32_to_f16``, ``i64_to_f16``) for the FP16 converter;
* exact models written here from ``docs/numerics.md``: FP16 decoding by bit fields,
  ``fractions.Fraction`` arithmetic, and correct rounding to FP16 by searching the table of
  all FP16 values (nearest value; a tie goes to the even bit pattern, or away from zero).

The conformance vectors are looked up in ``$NPU_CONFORMANCE_DIR`` or else in
``<repo>/tests/data/conformance``; when they are missing the tests fail (never skip).
"""

import bisect
import gzip
import math
from fractions import Fraction

import numpy as np
import pytest

from host.numerics import mvm as numerics
from host.spec.formats import Rounding
from sim.fp16_vectors import find_testfloat

EVEN, AWAY = "nearest-even", "nearest-away"


# --- conformance vectors ---------------------------------------------------------------

def load_testfloat(name: str):
    """Integer operands (two's complement), FP16 results and flags of one vector file."""
    path = find_testfloat(f"{name}.txt.gz")
    if not path.is_file():
        pytest.fail(f"conformance file missing: {path}", pytrace=False)
    width = 64 if name.startswith("i64") else 32
    ops, results, flags = [], [], []
    with gzip.open(path, "rt") as f:
        for line in f:
            a, r, fl = line.split()
            v = int(a, 16)
            ops.append(v - (1 << width) if v >> (width - 1) else v)
            results.append(int(r, 16))
            flags.append(int(fl, 16))
    assert ops, f"{path} is empty"
    return ops, np.array(results, np.uint16), np.array(flags, np.uint8)


# --- exact FP16 model ------------------------------------------------------------------

def fp16_value(bits: int) -> Fraction:
    """Exact value of a finite FP16 pattern, from its fields (docs/numerics.md, section 1)."""
    sign = -1 if bits & 0x8000 else 1
    field, frac = (bits >> 10) & 31, bits & 1023
    assert field != 31
    if field == 0:
        return sign * Fraction(frac, 1 << 24)
    return sign * Fraction(1024 + frac) * Fraction(2) ** (field - 25)


# All non-negative finite FP16 values in units of 2^-24, indexed by their bit pattern,
# plus 2^16 at index 0x7C00: "the next value" that stands for overflow when rounding.
_TABLE = [int(fp16_value(p) * (1 << 24)) for p in range(0x7C00)] + [1 << 40]
assert all(a < b for a, b in zip(_TABLE, _TABLE[1:]))


def round_to_fp16(y: Fraction, rounding=EVEN, saturate=True):
    """Correctly rounded FP16 bits of an exact value, and whether it overflowed.

    The nearest table entry wins; on a tie the even bit pattern (ties to even) or the
    larger magnitude (ties away). Landing on 0x7C00 is an overflow: +-inf, or +-65504
    (0x7BFF) when saturating. An exact zero is +0; a negative value rounding to 0 is -0.
    """
    if y == 0:
        return 0x0000, False
    sign = 0x8000 if y < 0 else 0
    mag = abs(y) * (1 << 24)
    i = bisect.bisect_left(_TABLE, mag)
    if i == len(_TABLE):
        p = 0x7C00
    elif _TABLE[i] == mag:
        p = i
    else:
        lo, hi = i - 1, i
        dlo, dhi = mag - _TABLE[lo], _TABLE[hi] - mag
        if dlo < dhi:
            p = lo
        elif dhi < dlo:
            p = hi
        else:
            p = hi if (rounding == AWAY or hi % 2 == 0) else lo
    if p == 0x7C00:
        return sign | (0x7BFF if saturate else 0x7C00), True
    return sign | p, False


def test_round_to_fp16_model_on_documented_examples():
    # docs/numerics.md section 4, examples
    assert round_to_fp16(Fraction(2049)) == (0x6800, False)
    assert round_to_fp16(Fraction(2051)) == (0x6802, False)
    assert round_to_fp16(Fraction(65519)) == (0x7BFF, False)
    assert round_to_fp16(Fraction(65520)) == (0x7BFF, True)
    assert round_to_fp16(Fraction(65520), saturate=False) == (0x7C00, True)
    assert round_to_fp16(Fraction(3, 1 << 26)) == (0x0001, False)
    assert round_to_fp16(Fraction(1, 1 << 26)) == (0x0000, False)
    assert round_to_fp16(Fraction(-1, 1 << 26)) == (0x8000, False)
    assert round_to_fp16(Fraction(-(1 << 20)), saturate=False) == (0xFC00, True)


# --- (a) fixed_to_fp16 -----------------------------------------------------------------

@pytest.mark.parametrize("name, rounding", [
    ("i32_to_f16.rne", EVEN), ("i32_to_f16.away", AWAY), ("i64_to_f16.rne", EVEN)])
def test_fixed_to_fp16_testfloat(name, rounding):
    ops, want, flags = load_testfloat(name)
    a = np.array(ops, dtype=object)
    overflow = (flags & 0x04) != 0

    bits, over = numerics.fixed_to_fp16(a, 0, rounding, saturate=False)
    bad = np.flatnonzero(bits != want)
    assert bad.size == 0, (f"{bad.size} mismatches, first: {ops[bad[0]]} -> "
                           f"{int(bits[bad[0]]):04x}, TestFloat {int(want[bad[0]]):04x}")
    np.testing.assert_array_equal(over, overflow)

    bits, over = numerics.fixed_to_fp16(a, 0, rounding, saturate=True)
    sat = np.where(want & 0x8000, 0xFBFF, 0x7BFF).astype(np.uint16)
    np.testing.assert_array_equal(bits, np.where(overflow, sat, want))
    np.testing.assert_array_equal(over, overflow)
    # the files do contain overflows and both signs of them
    assert overflow.sum() > 10 and (want[overflow] & 0x8000).any()


def _fixed_cases():
    rng = np.random.default_rng(7)
    cases = []
    for _ in range(1500):
        nbits = int(rng.integers(1, 120))
        a = int(rng.integers(0, 1 << 62)) | 1
        a = (a << 64 | int(rng.integers(0, 1 << 62))) >> max(0, 126 - nbits)
        if rng.random() < 0.5:
            a = -a
        cases.append((a, int(rng.integers(-80, 21))))
    # exact ties: an FP16 value plus half its ulp, placed on various grids
    for _ in range(600):
        p = int(rng.integers(1, 0x7BFF))
        lo = fp16_value(p)
        hi = fp16_value(p + 1)
        mid = (lo + hi) / 2                      # denominator 2^d
        lsb = -(mid.denominator.bit_length() - 1) - int(rng.integers(0, 30))
        a = mid * Fraction(2) ** -lsb
        assert a.denominator == 1
        sign = -1 if rng.random() < 0.5 else 1
        cases.append((sign * int(a), lsb))
    # the overflow boundary and the subnormal range
    for a, lsb in [(65519, 0), (65520, 0), (-65520, 0), (131039, -1), (131040, -1),
                   (1, -25), (3, -26), (1, -26), (-1, -26), (2 ** 70, -80), (2 ** 200, -80),
                   (0, -5), (0, 20), (-(2 ** 40) + 1, -24), (2047, -34), (4095, -35)]:
        cases.append((a, lsb))
    return cases


FIXED_CASES = _fixed_cases()


@pytest.mark.parametrize("rounding", [EVEN, AWAY])
@pytest.mark.parametrize("saturate", [True, False])
def test_fixed_to_fp16_scaled_against_exact_rounding(rounding, saturate):
    by_lsb = {}
    for a, lsb in FIXED_CASES:
        by_lsb.setdefault(lsb, []).append(a)
    checked = 0
    for lsb, values in by_lsb.items():
        bits, over = numerics.fixed_to_fp16(np.array(values, dtype=object), lsb, rounding,
                                            saturate=saturate)
        for a, b, o in zip(values, bits, over):
            want = round_to_fp16(Fraction(a) * Fraction(2) ** lsb, rounding, saturate)
            assert (int(b), bool(o)) == want, (a, lsb, hex(int(b)), want)
            checked += 1
    assert checked == len(FIXED_CASES)


def test_fixed_to_fp16_numpy_integers_and_shape():
    a = np.array([[1, -2], [2049, 65520]], np.int64)
    bits, over = numerics.fixed_to_fp16(a, 0)
    assert bits.shape == (2, 2) and bits.dtype == np.uint16
    assert bits.tolist() == [[0x3C00, 0xC000], [0x6800, 0x7BFF]]
    assert over.tolist() == [[False, False], [False, True]]


# --- (b) quantize_fp16, exhaustively ---------------------------------------------------

ALL = np.arange(1 << 16, dtype=np.uint32)
_BITLEN = np.array([int(v).bit_length() for v in range(1024)], np.int64)


def quantize_fp16_model(bits, m, rounding, code=None):
    """Independent integer model of the device quantizer on FP16 blocks ``(..., N)``.

    Each FP16 pattern is decoded from its fields into ``sig * 2^p`` (integers); NaN is 0,
    +-inf is +-65504 = +-2047 * 2^5 (counted). The dynamic exponent is the largest
    ``floor(log2|x|)`` of the block from the exponent field (subnormals by leading-one
    position), -127 for an all-zero block; a static code gives ``e = code - 127``.
    ``q = sign * min(round(sig * 2^(p + m - 2 - e)), 2^(m-1) - 1)``, rounded with integer
    shifts.
    """
    b = np.asarray(bits).astype(np.int64)
    neg = (b >> 15) & 1
    field = (b >> 10) & 31
    frac = b & 1023
    nan = (field == 31) & (frac != 0)
    inf = (field == 31) & (frac == 0)
    sig = np.where(field == 0, frac, frac + 1024)
    p = np.where(field == 0, -24, field - 25)
    sig = np.where(nan, 0, np.where(inf, 2047, sig))
    p = np.where(inf | nan, 5, p)
    flog = np.where(field == 0, _BITLEN[frac] - 1 - 24, field - 15)
    flog = np.where(inf, 15, flog)
    flog = np.where(sig == 0, -1000, flog)
    if code is None:
        e = flog.max(axis=-1)
        e = np.where(e == -1000, -127, e)
        codes = e + 127
    else:
        e = np.full(b.shape[:-1], code - 127)
        codes = np.full(b.shape[:-1], code)
    t = p + m - 2 - e[..., None]
    up_shift = np.clip(t, 0, 40)
    r = np.clip(-t, 1, 13)                      # sig < 2^11, so r >= 12 always gives 0
    floor = sig >> r
    rem = sig & ((1 << r) - 1)
    half = 1 << (r - 1)
    odd = (floor & 1) == 1
    round_up = (rem > half) | ((rem == half) & (odd | (rounding == AWAY)))
    mag = np.where(t >= 0, sig << up_shift, floor + round_up)
    top = (1 << (m - 1)) - 1
    sat = mag > top
    q = np.where(neg == 1, -np.minimum(mag, top), np.minimum(mag, top))
    return codes, q, sat.sum(axis=-1), (nan | inf).sum(axis=-1)


def quantize_fp16_fraction(block_bits, m, rounding, code=None):
    """The same rule with Fraction arithmetic, one block at a time (slow, for checking)."""
    vals = []
    nonfinite = 0
    for bits in block_bits:
        bits = int(bits)
        if (bits >> 10) & 31 == 31:
            nonfinite += 1
            if bits & 1023:
                vals.append(Fraction(0))
            else:
                vals.append(Fraction(-65504 if bits & 0x8000 else 65504))
        else:
            vals.append(fp16_value(bits))
    if code is None:
        amax = max(abs(v) for v in vals)
        if amax == 0:
            e = -127
        else:
            e = 0
            while Fraction(2) ** e > amax:
                e -= 1
            while Fraction(2) ** (e + 1) <= amax:
                e += 1
        code_out = e + 127
    else:
        e, code_out = code - 127, code
    step = Fraction(2) ** (e - (m - 2))
    top = 2 ** (m - 1) - 1
    qs, sat = [], 0
    for v in vals:
        whole, rest = divmod(abs(v) / step, 1)
        whole = int(whole)
        if rest > Fraction(1, 2) or (rest == Fraction(1, 2) and
                                     (rounding == AWAY or whole % 2 == 1)):
            whole += 1
        if whole > top:
            sat += 1
            whole = top
        qs.append(-whole if v < 0 else whole)
    return code_out, qs, sat, nonfinite


def _check_quantize(blocks, m, rounding, code):
    got = numerics.quantize_fp16(blocks.astype(np.uint16), m, rounding, code)
    codes, q, sat, nonfinite = quantize_fp16_model(blocks, m, rounding, code)
    np.testing.assert_array_equal(got.exponent_codes, codes)
    assert got.exponent_codes.dtype == np.uint8
    bad = np.argwhere(got.mantissas != q)
    assert bad.size == 0, (f"m={m} {rounding} code={code}: block "
                           f"{[hex(int(v)) for v in blocks[bad[0][0]]]} lane {bad[0][1]}: "
                           f"got {got.mantissas[tuple(bad[0])]}, want {q[tuple(bad[0])]}")
    np.testing.assert_array_equal(got.saturated, sat)
    np.testing.assert_array_equal(got.nonfinite, nonfinite)
    return got


def _permutations():
    rng = np.random.default_rng(65536)
    perms = {"identity": ALL, "reversed": ALL[::-1].copy()}
    for i in range(3):
        perms[f"random{i}"] = rng.permutation(ALL)
    # Interleave so each block mixes magnitudes: lane j of block b is pattern b + j*8192.
    perms["strided"] = ALL.reshape(8, 8192).T.reshape(-1).copy()
    return perms


PERMS = _permutations()
STATIC_CODES = [None, 0, 100, 127, 142, 254, 255]


@pytest.mark.parametrize("m", [2, 4, 8, 16])
@pytest.mark.parametrize("rounding", [EVEN, AWAY])
def test_quantize_fp16_exhaustive(m, rounding):
    """All 65,536 patterns as lanes of blocks of 8, in several orders, every static code."""
    for name, perm in PERMS.items():
        blocks = perm.reshape(-1, 8)
        for code in STATIC_CODES:
            got = _check_quantize(blocks, m, rounding, code)
        assert got.mantissas.shape == (8192, 8)


@pytest.mark.parametrize("m", [2, 4, 8, 16])
@pytest.mark.parametrize("rounding", [EVEN, AWAY])
def test_integer_model_equals_fraction_model_exhaustively(m, rounding):
    """The fast model above is itself checked, lane by lane, against Fraction arithmetic."""
    blocks = PERMS["strided"].reshape(-1, 8)
    codes, q, sat, nonfinite = quantize_fp16_model(blocks, m, rounding)
    for i, block in enumerate(blocks):
        want = quantize_fp16_fraction(block, m, rounding)
        assert (int(codes[i]), q[i].tolist(), int(sat[i]), int(nonfinite[i])) == want, block


def test_integer_model_equals_fraction_model_static():
    rng = np.random.default_rng(11)
    for code in STATIC_CODES[1:]:
        for m, rounding in [(4, EVEN), (8, AWAY), (16, EVEN), (2, AWAY)]:
            blocks = PERMS["random0"].reshape(-1, 8)[rng.integers(0, 8192, 300)]
            codes, q, sat, nonfinite = quantize_fp16_model(blocks, m, rounding, code)
            for i, block in enumerate(blocks):
                want = quantize_fp16_fraction(block, m, rounding, code)
                assert (int(codes[i]), q[i].tolist(), int(sat[i]), int(nonfinite[i])) == want


def test_quantize_fp16_documented_examples():
    # docs/numerics.md 2.6
    ex = [
        ([0x3E00, 0xB600, 0x0000, 0x4180], 4, EVEN, None, 0x80, [3, -1, 0, 6], 0, 0),
        ([0x3E00, 0xB600, 0x0000, 0x4180], 8, EVEN, None, 0x80, [48, -12, 0, 88], 0, 0),
        ([0x3000, 0x3600, 0xB900, 0x3C00], 4, EVEN, None, 0x7F, [0, 2, -2, 4], 0, 0),
        ([0x3000, 0x3600, 0xB900, 0x3C00], 4, AWAY, None, 0x7F, [1, 2, -3, 4], 0, 0),
        ([0x3FE0, 0x3C00, 0x0000, 0x0000], 4, EVEN, None, 0x7F, [7, 4, 0, 0], 1, 0),
        ([0x0001, 0x0002, 0x0000, 0x0000], 4, EVEN, None, 0x68, [2, 4, 0, 0], 0, 0),
        ([0x7C00, 0x7E00, 0xBC00, 0x0000], 4, EVEN, None, 0x8E, [7, 0, 0, 0], 1, 2),
        ([0x4200, 0x5640, 0xA11F, 0x0000], 4, EVEN, 0x81, 0x81, [3, 7, 0, 0], 1, 0),
        ([0x0000, 0x0000, 0x0000, 0x0000], 4, AWAY, None, 0x00, [0, 0, 0, 0], 0, 0),
    ]
    for bits, m, rounding, code, want_code, want_q, want_sat, want_nf in ex:
        got = numerics.quantize_fp16(np.array([bits], np.uint16), m, rounding, code)
        assert got.exponent_codes.tolist() == [want_code]
        assert got.mantissas.tolist() == [want_q]
        assert got.saturated.tolist() == [want_sat]
        assert got.nonfinite.tolist() == [want_nf]
        assert quantize_fp16_fraction(bits, m, rounding, code) == (
            want_code, want_q, want_sat, want_nf)


def test_quantize_fp16_bad_input():
    with pytest.raises(TypeError, match=r"bits.*uint16.*float16"):
        numerics.quantize_fp16(np.zeros(4, np.float16), 4)
    with pytest.raises(ValueError, match=r"mantissa_bits.*\b1\b"):
        numerics.quantize_fp16(np.zeros(4, np.uint16), 1)
    with pytest.raises(ValueError, match=r"static_exponent_code.*\b256\b"):
        numerics.quantize_fp16(np.zeros(4, np.uint16), 4, EVEN, 256)


# --- (c) mvm ---------------------------------------------------------------------------

def acc_lsb_model(mv, mw):
    return 2 * (-24) - (mv - 2) - (mw - 2)          # docs/numerics.md section 4


def narrow_model(qv, qw, E, L, k):
    """Narrow-accumulator events written from docs/numerics.md section 5 (Python loops)."""
    lo, hi = -(1 << (k - 1)), (1 << (k - 1)) - 1

    def bad(v):
        return v < lo or v > hi

    def tree(lanes):
        """Sum of the lanes by a balanced pairwise tree; returns (sum, events at nodes)."""
        if len(lanes) == 1:
            return lanes[0], 0
        half = len(lanes) // 2
        a, ea = tree(lanes[:half])
        b, eb = tree(lanes[half:])
        return a + b, ea + eb + bad(a + b)

    products = nodes = cross = 0
    rows, C, n = len(qw), len(qv), len(qv[0])
    for i in range(rows):
        acc = 0
        for c in range(C):
            prods = [int(qv[c][j]) * int(qw[i][c][j]) for j in range(n)]
            products += sum(bad(p) for p in prods)
            d, ev = tree(prods)
            nodes += ev
            acc += math.floor(Fraction(d) * Fraction(2) ** (int(E[i][c]) - L))
            if c >= 1 and d != 0:
                cross += bad(math.floor(Fraction(acc) * Fraction(2) ** (L - int(E[i][c]))))
    return products, nodes, cross


def _random_fp16(rng, size, kind):
    if kind == "wide":
        v = rng.standard_normal(size) * np.exp2(rng.integers(-26, 14, size))
    elif kind == "big":
        v = rng.standard_normal(size) * 3000
    else:
        v = rng.standard_normal(size) * 2.0 ** -12
    v[rng.random(size) < 0.15] = 0
    bits = v.astype(np.float16).view(np.uint16).copy()
    if kind == "wide":
        special = rng.random(size)
        bits[special < 0.03] = 0x7C00
        bits[(special >= 0.03) & (special < 0.05)] = 0xFC00
        bits[(special >= 0.05) & (special < 0.07)] = 0x7E01
    return bits


def _mvm_case(rng, kind, low_weight_exponents=False):
    n = int(rng.choice([1, 2, 4, 8]))
    rows = int(rng.integers(1, 6))
    cols = int(rng.integers(1, 4 * n + 2))
    C = -(-cols // n)
    mv, mw = int(rng.integers(2, 17)), int(rng.integers(2, 17))
    x = _random_fp16(rng, cols, kind)
    topw = (1 << (mw - 1)) - 1
    qw = rng.integers(-topw, topw + 1, (rows, C * n))
    qw[:, cols:] = 0
    if kind == "big":
        ew = rng.integers(5, 16, (rows, C))
    else:
        ew = rng.integers(-24, 16, (rows, C))
    if low_weight_exponents:
        ew = rng.integers(-127, -20, (rows, C))
    codes_w = ew + 127
    zero_rows = rng.random((rows, C)) < 0.1
    codes_w[zero_rows] = 0
    qw.reshape(rows, C, n)[zero_rows] = 0
    static = None if rng.random() < 0.7 else int(rng.integers(103, 143))
    rounding = EVEN if rng.random() < 0.5 else AWAY
    return dict(x=x, codes_w=codes_w.astype(np.uint8), qw=qw, n=n, mv=mv, mw=mw,
                static=static, rounding=rounding, cols=cols)


def _mvm_model(case, k):
    """Exact matrix-vector product of the quantized blocks and its counts."""
    n, mv, mw, cols = case["n"], case["mv"], case["mw"], case["cols"]
    C = case["codes_w"].shape[1]
    xp = np.zeros(C * n, np.uint16)
    xp[:cols] = case["x"]
    codes_v, qv, sat, nonfinite = quantize_fp16_model(xp.reshape(C, n), mv, case["rounding"],
                                                      case["static"])
    ev = codes_v.astype(int) - 127
    ew = case["codes_w"].astype(int) - 127
    qw = case["qw"].reshape(-1, C, n)
    L = acc_lsb_model(mv, mw)
    E = [[int(ev[c] + ew[i, c]) - (mv - 2) - (mw - 2) for c in range(C)] for i in range(len(qw))]
    outs, accs, out_sat = [], [], 0
    for i in range(len(qw)):
        # exact value; terms below 2^L are floored one by one (docs section 4)
        A = 0
        for c in range(C):
            d = sum(int(qv[c, j]) * int(qw[i, c, j]) for j in range(n))
            A += math.floor(Fraction(d) * Fraction(2) ** (E[i][c] - L))
        accs.append(A)
        bits, over = round_to_fp16(Fraction(A) * Fraction(2) ** L, EVEN, saturate=True)
        outs.append(bits)
        out_sat += over
    narrow = narrow_model(qv.tolist(), qw.tolist(), E, L, k)
    return dict(out=outs, acc=accs, L=L, E=E, qv=qv, qw=qw, vsat=int(sat.sum()),
                vnf=int(nonfinite.sum()), out_sat=out_sat, narrow=narrow)


def _run_mvm(case, k=64):
    return numerics.mvm(case["x"], case["codes_w"], case["qw"], n=case["n"],
                        mantissa_bits_v=case["mv"], mantissa_bits_w=case["mw"],
                        rounding=case["rounding"], static_exponent_code=case["static"],
                        narrow_width=k)


@pytest.mark.parametrize("kind", ["wide", "big", "small"])
def test_mvm_against_exact_model(kind):
    rng = np.random.default_rng({"wide": 1, "big": 2, "small": 3}[kind])
    saturated_outputs = events = nonzero = 0
    for _ in range(60):
        case = _mvm_case(rng, kind)
        k = int(rng.choice([1, 2, 4, 8, 12, 16, 24, 32, 48, 64]))
        want = _mvm_model(case, k)
        got = _run_mvm(case, k)
        assert got.lsb == want["L"]
        assert list(got.accumulators) == want["acc"]
        assert got.out_bits.tolist() == want["out"], case
        assert got.output_saturated == want["out_sat"]
        assert got.vector_saturated == want["vsat"]
        assert got.vector_nonfinite == want["vnf"]
        assert tuple(got.narrow) == want["narrow"], (case, k)
        assert got.narrow.total == sum(want["narrow"])
        saturated_outputs += want["out_sat"]
        events += sum(want["narrow"])
        nonzero += sum(1 for b in want["out"] if b & 0x7FFF)
    assert events > 50 and nonzero > 50       # the cases are not trivial
    if kind == "big":
        assert saturated_outputs > 0


def test_mvm_weight_exponents_below_exact_range_are_floored():
    rng = np.random.default_rng(4)
    for _ in range(30):
        case = _mvm_case(rng, "wide", low_weight_exponents=True)
        want = _mvm_model(case, 64)
        got = _run_mvm(case)
        assert list(got.accumulators) == want["acc"]
        assert got.out_bits.tolist() == want["out"]


@pytest.mark.parametrize("k", [1, 2, 3, 5, 8, 11, 16, 20, 32, 64])
def test_narrow_overflows_against_model(k):
    rng = np.random.default_rng(100 + k)
    for _ in range(25):
        n = int(rng.choice([1, 2, 4, 8, 16]))
        rows, C = int(rng.integers(1, 4)), int(rng.integers(1, 6))
        mv, mw = int(rng.integers(2, 17)), int(rng.integers(2, 17))
        tv, tw = (1 << (mv - 1)) - 1, (1 << (mw - 1)) - 1
        qv = rng.integers(-tv, tv + 1, (C, n))
        qw = rng.integers(-tw, tw + 1, (rows, C, n))
        qv[rng.random((C, n)) < 0.2] = 0
        qw[:, rng.random(C) < 0.2] = 0              # whole zero tile products
        L = acc_lsb_model(mv, mw)
        ev = rng.integers(-24, 16, C)
        ew = rng.integers(-24, 16, (rows, C))
        if rng.random() < 0.3:                      # static: one exponent for the layer
            ev[:] = ev[0]
            ew[:] = ew[0, 0]
        E = ev[None, :] + ew - (mv - 2) - (mw - 2)
        got = numerics.narrow_overflows(qv, qw, E, L, k)
        want = narrow_model(qv.tolist(), qw.tolist(), E.tolist(), L, k)
        assert tuple(got) == want, (k, qv, qw, E)


def test_narrow_model_on_a_hand_example():
    # N = 2, two tiles, k = 4 (fits -8..7); E = L for tile 0, L + 1 for tile 1.
    qv = [[3, 3], [1, 2]]
    qw = [[[2, 3], [4, 3]]]
    # products 6, 9 (bad), 4, 6; tree roots 15 (bad), 10 (bad)
    # running sum after tile 1: 15 + 10 * 2 = 35 in units of 2^L -> floor(35 / 2) = 17 (bad)
    assert narrow_model(qv, qw, [[0, 1]], 0, 4) == (1, 2, 1)
    got = numerics.narrow_overflows(np.array(qv), np.array(qw), np.array([[0, 1]]), 0, 4)
    assert tuple(got) == (1, 2, 1)


def test_narrow_overflows_bad_arguments():
    with pytest.raises(ValueError, match=r"\bk\b.*\b65\b"):
        numerics.narrow_overflows(np.ones((1, 2)), np.ones((1, 1, 2)), np.zeros((1, 1)), 0, 65)
    with pytest.raises(ValueError, match=r"power of two.*\b3\b"):
        numerics.narrow_overflows(np.ones((1, 3)), np.ones((1, 1, 3)), np.zeros((1, 1)), 0, 8)


def test_mvm_rejects_exponents_above_15():
    case = _mvm_case(np.random.default_rng(5), "wide")
    case["codes_w"] = case["codes_w"].copy()
    case["codes_w"][0, 0] = 127 + 16
    with pytest.raises(ValueError, match=r"weight block exponent 16 exceeds 15"):
        _run_mvm(case)
    case = _mvm_case(np.random.default_rng(5), "wide")
    case["static"] = 127 + 16
    with pytest.raises(ValueError, match=r"vector block exponent 16 exceeds 15"):
        _run_mvm(case)


# --- (d) order independence --------------------------------------------------------------

def test_mvm_output_does_not_depend_on_column_tile_order():
    rng = np.random.default_rng(6)
    checked = 0
    for _ in range(40):
        case = _mvm_case(rng, "wide")
        n, cols = case["n"], case["cols"]
        C = case["codes_w"].shape[1]
        if C < 2:
            continue
        xp = np.zeros(C * n, np.uint16)
        xp[:cols] = case["x"]
        case["x"], case["cols"] = xp, C * n
        base = _run_mvm(case)
        for _ in range(3):
            perm = rng.permutation(C)
            permuted = dict(case)
            permuted["x"] = xp.reshape(C, n)[perm].reshape(-1)
            permuted["codes_w"] = case["codes_w"][:, perm]
            rows = case["qw"].shape[0]
            permuted["qw"] = case["qw"].reshape(rows, C, n)[:, perm].reshape(rows, C * n)
            got = _run_mvm(permuted)
            assert got.out_bits.tolist() == base.out_bits.tolist()
            assert list(got.accumulators) == list(base.accumulators)
            assert got.output_saturated == base.output_saturated
            assert got.vector_saturated == base.vector_saturated
            checked += 1
    assert checked > 30


def test_rounding_enum_accepted():
    bits, _ = numerics.fixed_to_fp16(np.array([2049], dtype=object), 0, Rounding.NEAREST_AWAY)
    assert bits.tolist() == [0x6801]
