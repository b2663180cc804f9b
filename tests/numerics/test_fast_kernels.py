"""The fast MVM kernels of ``host.numerics.mvm`` against their exact definitions.

``mvm``, ``accumulate``, ``fixed_to_fp16`` and ``narrow_overflows`` must equal
``mvm_exact``, ``accumulate_exact``, ``fixed_to_fp16_exact`` and
``narrow_overflows_exact`` bit for bit: every output, every accumulator and every count,
on seeded random cases, directed edge cases and a hypothesis property.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from host.numerics import mvm as M
from host.spec.formats import E8M0_BIAS, Rounding

ROUNDINGS = [Rounding.NEAREST_EVEN, Rounding.NEAREST_AWAY]
KS = [1, 2, 3, 7, 12, 16, 24, 31, 32, 33, 40, 48, 62, 63, 64]


# --- helpers ------------------------------------------------------------------------------

def _fp16(rng, size, scale_exp=(-26, 17), special=0.0):
    """FP16 bit patterns with magnitudes 2**[lo, hi) (subnormals and overflow included),
    zeros, and with probability ``special`` inf, NaN and -0."""
    lo, hi = scale_exp
    mag = np.exp2(rng.uniform(lo, hi, size)) * rng.choice([-1.0, 1.0], size)
    with np.errstate(over="ignore"):
        x = mag.astype(np.float16).view(np.uint16).copy()
    x[rng.random(size) < 0.1] = 0
    if special:
        pick = rng.random(size) < special
        x[pick] = rng.choice(np.array([0x7C00, 0xFC00, 0x7E00, 0x8000], np.uint16),
                             int(pick.sum()))
    return x


def _weights(rng, rows, c, n, mw, wide=False):
    """MRF contents: codes ``(rows, C)`` and mantissas ``(rows, C*n)`` (int16), with
    all-zero blocks (code 0, the dynamic exponent of a zero block)."""
    top = (1 << (mw - 1)) - 1
    lo, hi = (-24, 16) if wide else (-6, 3)
    codes = rng.integers(E8M0_BIAS + lo, E8M0_BIAS + hi, (rows, c)).astype(np.uint8)
    qw = rng.integers(-top, top + 1, (rows, c, n)).astype(np.int16)
    if rng.random() < 0.5:                          # some values at the clamp
        qw[rng.random(qw.shape) < 0.2] = top
    zero = rng.random((rows, c)) < 0.15
    qw[zero] = 0
    codes[zero] = 0
    return codes, qw.reshape(rows, c * n)


def _assert_same(got, want, where=""):
    assert got.lsb == want.lsb, where
    assert got.out_bits.dtype == np.uint16
    assert got.out_bits.tolist() == want.out_bits.tolist(), where
    assert [int(v) for v in got.accumulators] == [int(v) for v in want.accumulators], where
    assert tuple(int(v) for v in got.narrow) == tuple(want.narrow), where
    assert got.output_saturated == want.output_saturated, where
    assert got.vector_saturated == want.vector_saturated, where
    assert got.vector_nonfinite == want.vector_nonfinite, where


def _both(x, codes, qw, **kw):
    return M.mvm(x, codes, qw, **kw), M.mvm_exact(x, codes, qw, **kw)


# --- mvm on seeded random cases -----------------------------------------------------------

@pytest.mark.parametrize("n", [4, 8, 16, 32])
@pytest.mark.parametrize("rounding", ROUNDINGS)
def test_mvm_matches_exact_random(n, rounding):
    rng = np.random.default_rng(1000 * n + int(rounding is Rounding.NEAREST_AWAY))
    seen = {"events": 0, "slow_rows": 0, "sat": 0, "nonzero": 0, "static": 0}
    for case in range(40):
        c = int(rng.choice([1, 2, 3, 5, 8]))
        rows = int(rng.integers(1, 9))
        mv, mw = (int(v) for v in rng.choice([2, 4, 8, 16], 2))
        wide = case % 2 == 0
        codes, qw = _weights(rng, rows, c, n, mw, wide=wide)
        cols = int(rng.integers(1, c * n + 1))
        x = _fp16(rng, cols, (-26, 17) if wide else (-3, 3), special=0.02)
        if case % 5 == 1 and c >= 2:                # a spread beyond the int64 bound
            codes[:, :2] = [E8M0_BIAS + 15, E8M0_BIAS - 24]
            qw.reshape(rows, c, n)[:, :2, 0] = 1
            x = np.pad(x, (0, c * n - cols))
            x[:n] = 0x7A00                          # 49152
            x[n:2 * n] = 0x0003
            cols = c * n
        static = None
        if case % 3 == 0:
            static = int(rng.integers(E8M0_BIAS - 30, E8M0_BIAS + 16))
            seen["static"] += 1
        for k in ([64] + [int(v) for v in rng.choice(KS, 3)]):
            kw = dict(n=n, mantissa_bits_v=mv, mantissa_bits_w=mw, rounding=rounding,
                      static_exponent_code=static, narrow_width=k)
            got, want = _both(x, codes, qw, **kw)
            _assert_same(got, want, (case, k))
            seen["events"] += want.narrow.total
            seen["sat"] += want.output_saturated
        seen["nonzero"] += sum(1 for b in want.out_bits.tolist() if b & 0x7FFF)
        qb = M.quantize_fp16(np.pad(x, (0, c * n - cols)).reshape(c, n), mv, rounding, static)
        d = M.tile_products(qb.mantissas, np.asarray(qw, np.int64).reshape(rows, c, n))
        exps = M.term_exponents(qb.exponent_codes, codes, mv, mw)
        seen["slow_rows"] += int((~M._fast_rows(d, exps - want.lsb)[3]).sum())
    # the cases are not trivial: events, saturations, results and both paths occur
    assert seen["events"] > 20 and seen["sat"] > 0 and seen["nonzero"] > 40
    assert seen["slow_rows"] > 0 and seen["static"] > 5


@pytest.mark.parametrize("k", list(range(1, 65)))
def test_mvm_every_k(k):
    rng = np.random.default_rng(k)
    events = 0
    for case in range(6):
        n = [4, 8, 16, 32][case % 4]
        c, rows = int(rng.integers(2, 6)), 3
        mv, mw = (int(v) for v in rng.choice([2, 4, 8, 16], 2))
        codes, qw = _weights(rng, rows, c, n, mw, wide=case % 2 == 0)
        x = _fp16(rng, c * n)
        static = None if case % 3 else int(rng.integers(E8M0_BIAS - 20, E8M0_BIAS + 16))
        got, want = _both(x, codes, qw, n=n, mantissa_bits_v=mv, mantissa_bits_w=mw,
                          static_exponent_code=static, narrow_width=k)
        _assert_same(got, want, (k, case))
        events += want.narrow.total
    if k <= 16:
        assert events > 0


def test_mvm_batch_matches_exact_per_vector():
    rng = np.random.default_rng(7)
    for case in range(8):
        n, c, rows = 8, 4, 5
        codes, qw = _weights(rng, rows, c, n, 8, wide=True)
        batch = (2, 3) if case % 2 else (5,)
        x = _fp16(rng, batch + (c * n - 3,), special=0.02)
        if case == 0:                               # a wide-spread row in the batch
            x[0, :4] = 0x7B53                       # 60000
            x[0, 4:] = 0
            x[0, 8] = 0x0001
        k = [64, 16, 40, 5][case % 4]
        kw = dict(n=n, mantissa_bits_v=8, mantissa_bits_w=8, narrow_width=k)
        got = M.mvm(x, codes, qw, **kw)
        assert got.out_bits.shape == batch + (rows,)
        assert got.accumulators.shape == batch + (rows,)
        for idx in np.ndindex(*batch):
            want = M.mvm_exact(x[idx], codes, qw, **kw)
            assert got.out_bits[idx].tolist() == want.out_bits.tolist()
            assert [int(v) for v in got.accumulators[idx]] == [int(v) for v in
                                                              want.accumulators]
            assert tuple(int(v[idx]) for v in got.narrow) == tuple(want.narrow)
            assert int(got.output_saturated[idx]) == want.output_saturated
            assert int(got.vector_saturated[idx]) == want.vector_saturated
            assert int(got.vector_nonfinite[idx]) == want.vector_nonfinite


def test_mvm_without_accumulators_gives_the_same_outputs_and_counts():
    rng = np.random.default_rng(8)
    n, c, rows = 8, 4, 5
    codes, qw = _weights(rng, rows, c, n, 8, wide=True)
    x = _fp16(rng, (6, c * n), special=0.02)
    x[0, :4], x[0, 4:], x[0, 8] = 0x7B53, 0, 0x0001       # a row on the exact path
    for k in (64, 12):
        kw = dict(n=n, mantissa_bits_v=8, mantissa_bits_w=8, narrow_width=k)
        full, lean = M.mvm(x, codes, qw, **kw), M.mvm(x, codes, qw, accumulators=False, **kw)
        assert lean.accumulators is None and full.accumulators is not None
        assert lean.out_bits.tolist() == full.out_bits.tolist()
        for a, b in ((lean.narrow, full.narrow), (lean.output_saturated,
                                                  full.output_saturated),
                     (lean.vector_saturated, full.vector_saturated)):
            assert np.array_equal(np.asarray(a), np.asarray(b))


# --- directed edge cases ------------------------------------------------------------------

def _quantized_matrix(w, n, m):
    from host.numerics import bfp
    w = np.asarray(w, np.float16)
    q = bfp.quantize(w, n, m)
    rows, cols = w.shape
    c = -(-cols // n)
    return q.exponent_codes.reshape(rows, c), q.mantissas.reshape(rows, c * n)


@pytest.mark.parametrize("m", [2, 4, 8, 16])
@pytest.mark.parametrize("n", [4, 8])
def test_wide_exponent_spread_row(m, n):
    # x = w = [60000 x4 | 2**-24]: block exponents 15 and -24 in one row; the running sum
    # in units of the small tile's exponent overflows 64 bits: one cross-tile event at
    # k = 64, found by the exact path behind the spread test.
    v = np.zeros(2 * n, np.float16)
    v[:4] = 60000
    v[n] = 2.0 ** -24
    codes, qw = _quantized_matrix(v[None], n, m)
    kw = dict(n=n, mantissa_bits_v=m, mantissa_bits_w=m)
    got, want = _both(v.view(np.uint16), codes, qw, **kw)
    _assert_same(got, want)
    assert tuple(got.narrow) == (0, 0, 1)
    assert got.out_bits.tolist() == [0x7BFF] and got.output_saturated == 1


def test_floored_terms_take_the_exact_path():
    # a static vector exponent far below -24 with weights at -24: E < L, floored terms
    rng = np.random.default_rng(11)
    for _ in range(20):
        codes, qw = _weights(rng, 4, 3, 8, 8, wide=True)
        codes[:, 0] = E8M0_BIAS - 24
        x = _fp16(rng, 24, (-30, -10))
        for k in (64, 20):
            got, want = _both(x, codes, qw, n=8, mantissa_bits_v=8, mantissa_bits_w=8,
                              static_exponent_code=E8M0_BIAS - 40, narrow_width=k)
            _assert_same(got, want)


def test_subnormal_inputs_and_outputs():
    n = 8
    rng = np.random.default_rng(12)
    x = rng.integers(1, 0x400, 2 * n).astype(np.uint16)           # subnormal inputs
    x[::3] |= 0x8000
    w = np.full((6, 2 * n), 2.0 ** -14, np.float16)
    w[1] = -w[1]
    w[2, n:] = 2.0 ** -24
    w[3] = 1.0
    w[4, :] = 0
    w[5, ::2] = 3.0 ** -9
    w[5, 1::2] = 0.0625
    subnormal = 0
    for m in (2, 4, 8, 16):
        codes, qw = _quantized_matrix(w, n, m)
        got, want = _both(x, codes, qw, n=n, mantissa_bits_v=m, mantissa_bits_w=m)
        _assert_same(got, want)
        outs = want.out_bits & 0x7FFF
        subnormal += int(((outs > 0) & (outs < 0x400)).sum())
    assert subnormal > 0                                    # subnormal results occur


def test_all_zero_blocks_and_negative_zero():
    n, c = 4, 3
    codes = np.array([[0, 0, 0], [127, 0, 127]], np.uint8)
    qw = np.zeros((2, c * n), np.int16)
    qw[1, :n] = 3
    qw[1, 2 * n:] = -5
    for x in (np.zeros(c * n, np.uint16), np.full(c * n, 0x8000, np.uint16)):
        for k in (1, 64):
            got, want = _both(x, codes, qw, n=n, mantissa_bits_v=4, mantissa_bits_w=4,
                              narrow_width=k)
            _assert_same(got, want)
            assert got.out_bits.tolist() == [0, 0]              # exact zeros are +0
    # a negative result that rounds to zero is -0
    bits, _ = M.fixed_to_fp16(np.array([-1, 1, 0, -3]), -26)
    assert bits.tolist() == [0x8000, 0x0000, 0x0000, 0x8001]
    assert bits.tolist() == M.fixed_to_fp16_exact(np.array([-1, 1, 0, -3]), -26)[0].tolist()


def test_saturation_to_65504():
    n = 4
    w = np.full((3, 2 * n), 60000, np.float16)
    w[1] = -w[1]
    w[2] = 255.9
    x = np.full(2 * n, 60000, np.float16).view(np.uint16)
    for m in (2, 4, 8, 16):
        codes, qw = _quantized_matrix(w, n, m)
        got, want = _both(x, codes, qw, n=n, mantissa_bits_v=m, mantissa_bits_w=m)
        _assert_same(got, want)
        assert got.out_bits.tolist()[:2] == [0x7BFF, 0xFBFF]
        assert got.output_saturated == 3
    # the boundary: 65519 rounds to 65504, 65520 saturates
    a = np.array([65504, 65519, 65520, -65520, 1 << 40])
    for sat in (True, False):
        got = M.fixed_to_fp16(a, 0, saturate=sat)
        want = M.fixed_to_fp16_exact(a, 0, saturate=sat)
        assert got[0].tolist() == want[0].tolist() and got[1].tolist() == want[1].tolist()
    assert M.fixed_to_fp16(a, 0)[1].tolist() == [False, False, True, True, True]


@pytest.mark.parametrize("rounding", ROUNDINGS)
def test_rounding_into_a_new_binade(rounding):
    a, lsbs = [], []
    for top in range(11, 63):
        for lsb in (-60, -40, -35, -30, -24, -20, 0, 5):
            a += [(1 << (top + 1)) - 1, (1 << (top + 1)) - (1 << (top - 11)),
                  (1 << (top + 1)) - (1 << (top - 11)) - 1]
            lsbs += [lsb] * 3
    a = np.array(a, np.int64)
    for lsb in sorted(set(lsbs)):
        pick = np.array(lsbs) == lsb
        for v in (a[pick], -a[pick]):
            got = M.fixed_to_fp16(v, lsb, rounding)
            want = M.fixed_to_fp16_exact(v, lsb, rounding)
            assert got[0].tolist() == want[0].tolist(), lsb
            assert got[1].tolist() == want[1].tolist(), lsb
    # subnormal to the smallest normal: 1023.5 ulps of 2**-24 -> 0x0400
    assert M.fixed_to_fp16(np.array([2047]), -25, rounding)[0].tolist() == [0x0400]


# --- fixed_to_fp16 ------------------------------------------------------------------------

@pytest.mark.parametrize("rounding", ROUNDINGS)
@pytest.mark.parametrize("saturate", [True, False])
def test_fixed_to_fp16_matches_exact(rounding, saturate):
    rng = np.random.default_rng(21 + 2 * int(saturate) + int(rounding is Rounding.NEAREST_AWAY))
    for lsb in list(range(-90, 30, 7)) + [-1022, -1023, 970, 971, 2000, -2000]:
        bits = rng.integers(0, 64, 400)
        a = rng.integers(0, 1 << 62, 400, dtype=np.int64) >> (62 - bits)
        # ties: a pattern ending in 1 followed by zeros, at every width
        ties = (rng.integers(0, 1 << 40, 100) | 1) << rng.integers(0, 22, 100)
        a = np.concatenate([a, ties, [0, 1, 2, 3, (1 << 63) - 1, -(1 << 63),
                                      (1 << 53) - 1, 1 << 53, (1 << 53) + 1]])
        a[rng.random(a.size) < 0.5] *= -1
        got = M.fixed_to_fp16(a, lsb, rounding, saturate)
        want = M.fixed_to_fp16_exact(a, lsb, rounding, saturate)
        assert got[0].tolist() == want[0].tolist(), lsb
        assert got[1].tolist() == want[1].tolist(), lsb


def test_fixed_to_fp16_object_beyond_int64_and_other_dtypes():
    vals = [0, -1, 5, (1 << 63) - 1, -(1 << 63), 1 << 63, -(1 << 63) - 1, 1 << 100,
            -(3 << 90) - 12345, (1 << 70) + (1 << 59)]
    a = np.array(vals, dtype=object).reshape(2, 5)
    for lsb in (-100, -52, 0):
        for rounding in ROUNDINGS:
            got = M.fixed_to_fp16(a, lsb, rounding, saturate=False)
            want = M.fixed_to_fp16_exact(a, lsb, rounding, saturate=False)
            assert got[0].shape == (2, 5)
            assert got[0].tolist() == want[0].tolist()
            assert got[1].tolist() == want[1].tolist()
    u = np.array([0, 1, (1 << 64) - 1, 1 << 63, 12345], np.uint64)
    for dtype_vals in (u, np.array([-7, 100], np.int8), np.array([40000, 3], np.uint16),
                       np.array([True, False])):
        got = M.fixed_to_fp16(dtype_vals, -3)
        want = M.fixed_to_fp16_exact(dtype_vals, -3)
        assert got[0].tolist() == want[0].tolist()
    # |int64 min| = 2**63 at lsb -88 is 2**-25, exactly half the smallest subnormal: a
    # right shift by 64 in the int64 converter; nearest-away rounds it up
    for rounding, want in ((Rounding.NEAREST_AWAY, 0x8001), (Rounding.NEAREST_EVEN, 0x8000)):
        got = M.fixed_to_fp16(np.array([-(1 << 63), (1 << 63) - 1]), -88, rounding)[0]
        assert got.tolist() == [want, 0x0000]          # 2**63 - 1 is below the tie
        assert got.tolist() == M.fixed_to_fp16_exact(
            np.array([-(1 << 63), (1 << 63) - 1]), -88, rounding)[0].tolist()
    scalar = M.fixed_to_fp16(np.int64(-2049), 0)
    assert scalar[0].shape == () and int(scalar[0]) == 0xE800


# --- accumulate and narrow_overflows --------------------------------------------------------

def test_accumulate_matches_exact():
    rng = np.random.default_rng(31)
    slow = 0
    for case in range(60):
        rows, c = int(rng.integers(1, 6)), int(rng.integers(1, 9))
        d = rng.integers(-(1 << 20), 1 << 20, (rows, c))
        d[rng.random((rows, c)) < 0.2] = 0
        spread = [2, 20, 45, 80][case % 4]
        lsb = -60
        exps = lsb + rng.integers(-5 if case % 5 == 0 else 0, spread, (rows, c))
        exps[d == 0] = -200
        want = M.accumulate_exact(d, exps, lsb)
        assert [int(v) for v in M.accumulate(d, exps, lsb)] == [int(v) for v in want]
        assert [int(v) for v in M.accumulate(d.T, exps.T, lsb, axis=0)] == \
            [int(v) for v in want]
        slow += int((~M._fast_rows(d, exps - lsb)[3]).sum())
    assert slow > 10
    # Python integers beyond int64 in the products, an empty axis
    big = np.array([[1 << 70, -3]], dtype=object)
    assert list(M.accumulate(big, np.array([[0, 5]]), 0)) == [(1 << 70) - 96]
    assert M.accumulate(np.zeros((3, 0), np.int64), np.zeros((3, 0)), 0).tolist() == [0] * 3


@pytest.mark.parametrize("k", KS + [4, 8, 20])
def test_narrow_overflows_matches_exact(k):
    rng = np.random.default_rng(300 + k)
    total = 0
    for _ in range(25):
        n = int(rng.choice([1, 2, 4, 8, 16, 32]))
        rows, c = int(rng.integers(1, 5)), int(rng.integers(1, 7))
        mv, mw = int(rng.integers(2, 17)), int(rng.integers(2, 17))
        tv, tw = (1 << (mv - 1)) - 1, (1 << (mw - 1)) - 1
        qv = rng.integers(-tv, tv + 1, (c, n))
        qw = rng.integers(-tw, tw + 1, (rows, c, n))
        qw[:, rng.random(c) < 0.2] = 0
        lsb = M.acc_lsb(mv, mw)
        ev = rng.integers(-24, 16, c)
        ew = rng.integers(-24, 16, (rows, c))
        exps = ev[None, :] + ew - (mv - 2) - (mw - 2)
        got = M.narrow_overflows(qv, qw, exps, lsb, k)
        want = M.narrow_overflows_exact(qv, qw, exps, lsb, k)
        assert tuple(got) == tuple(want)
        total += want.total
    if k <= 32:
        assert total > 0


def test_k64_costs_nothing_on_fast_rows(monkeypatch):
    # At k = 64 with every row on the int64 path no value can fail to fit (the bounds in
    # host.numerics.mvm): neither the fit test nor any exact path may run.
    rng = np.random.default_rng(41)
    codes, qw = _weights(rng, 64, 16, 16, 4)
    x = _fp16(rng, 256, (-3, 3))
    want = M.mvm_exact(x, codes, qw, n=16, mantissa_bits_v=4, mantissa_bits_w=4)

    def forbidden(*args, **kwargs):
        raise AssertionError("called on the fast path")
    for name in ("_not_fit", "_shift_floor", "accumulate_exact", "fixed_to_fp16_exact",
                 "narrow_overflows_exact", "_cross_exact_rows"):
        monkeypatch.setattr(M, name, forbidden)
    got = M.mvm(x, codes, qw, n=16, mantissa_bits_v=4, mantissa_bits_w=4)
    _assert_same(got, want)


# --- hypothesis ---------------------------------------------------------------------------

@st.composite
def _mvm_cases(draw):
    n = draw(st.sampled_from([1, 2, 4, 8, 16, 32]))
    c = draw(st.integers(1, 4))
    rows = draw(st.integers(1, 3))
    mv = draw(st.sampled_from([2, 3, 4, 8, 11, 16]))
    mw = draw(st.sampled_from([2, 4, 5, 8, 16]))
    tw = (1 << (mw - 1)) - 1
    cols = draw(st.integers(1, c * n))
    x = draw(st.lists(st.integers(0, 0xFFFF), min_size=cols, max_size=cols))
    codes = draw(st.lists(st.sampled_from([0, 100, 103, 110, 120, 127, 130, 137, 142]),
                          min_size=rows * c, max_size=rows * c))
    qw = draw(st.lists(st.integers(-tw, tw), min_size=rows * c * n, max_size=rows * c * n))
    static = draw(st.one_of(st.none(), st.integers(0, 142)))
    rounding = draw(st.sampled_from(ROUNDINGS))
    k = draw(st.integers(1, 64))
    return dict(x=np.array(x, np.uint16), codes=np.array(codes, np.uint8).reshape(rows, c),
                qw=np.array(qw, np.int16).reshape(rows, c * n),
                kw=dict(n=n, mantissa_bits_v=mv, mantissa_bits_w=mw, rounding=rounding,
                        static_exponent_code=static, narrow_width=k))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_mvm_cases())
def test_mvm_property_fast_equals_exact(case):
    got, want = _both(case["x"], case["codes"], case["qw"], **case["kw"])
    _assert_same(got, want, case)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(-(1 << 80), 1 << 80) | st.integers(-(1 << 63), (1 << 63) - 1),
                min_size=1, max_size=8),
       st.integers(-120, 40), st.sampled_from(ROUNDINGS), st.booleans())
def test_fixed_to_fp16_property(values, lsb, rounding, saturate):
    a = np.array(values, dtype=object)
    got = M.fixed_to_fp16(a, lsb, rounding, saturate)
    want = M.fixed_to_fp16_exact(a, lsb, rounding, saturate)
    assert got[0].tolist() == want[0].tolist()
    assert got[1].tolist() == want[1].tolist()
