"""The MVM's matrix-product path (float64 / float32 BLAS where the bound makes it exact)
against the definition ``mvm_exact``, bit for bit.

``host.numerics.mvm.mvm`` computes a product as one float64 matrix product (float32 for
batches and single vectors within 24 bits) when every partial sum is provably exact and
no term is floored, and sends the vectors with any row beyond that bound to the int64 /
Python-integer path. These tests hold every output, accumulator and count to
``mvm_exact`` on both sides of each bound, and check that each path is really taken.
"""

import numpy as np
import pytest

from host.numerics import mvm as M
from host.spec.formats import E8M0_BIAS, Rounding


def _fp16(rng, size, lo=-26, hi=17, zeros=0.1):
    mag = np.exp2(rng.uniform(lo, hi, size)) * rng.choice([-1.0, 1.0], size)
    with np.errstate(over="ignore"):
        x = mag.astype(np.float16).view(np.uint16).copy()
    x[rng.random(size) < zeros] = 0
    return x


def _weights(rng, rows, c, n, mw, lo=-6, hi=3, zero_rows=0):
    top = (1 << (mw - 1)) - 1
    codes = rng.integers(E8M0_BIAS + lo, E8M0_BIAS + hi, (rows, c)).astype(np.uint8)
    qw = rng.integers(-top, top + 1, (rows, c, n)).astype(np.int16)
    zero = rng.random((rows, c)) < 0.15
    qw[zero] = 0
    codes[zero] = 0
    qw[:zero_rows] = 0
    return codes, qw.reshape(rows, c * n)


def _same_as_exact(x, codes, qw, accumulators=True, **kw):
    """mvm (with and without prepared weights) against mvm_exact per vector."""
    got = M.mvm(x, codes, qw, accumulators=accumulators, **kw)
    prep = M.prepare_weights(codes, qw, n=kw["n"], mantissa_bits_w=kw["mantissa_bits_w"])
    again = M.mvm(x, codes, qw, accumulators=False, prepared=prep, **kw)
    assert np.array_equal(got.out_bits, again.out_bits)
    x2 = x.reshape(-1, x.shape[-1])
    out = got.out_bits.reshape(len(x2), -1)
    for b, xb in enumerate(x2):
        want = M.mvm_exact(xb, codes, qw, **kw)
        assert out[b].tolist() == want.out_bits.tolist(), (b, kw)
        if accumulators:
            accs = got.accumulators.reshape(len(x2), -1)[b]
            assert [int(v) for v in accs] == [int(v) for v in want.accumulators], b
        for name in ("vector_saturated", "vector_nonfinite", "output_saturated"):
            assert int(np.reshape(getattr(got, name), -1)[b]) == getattr(want, name), name
            assert int(np.reshape(getattr(again, name), -1)[b]) == getattr(want, name)
        assert tuple(int(np.reshape(v, -1)[b]) for v in got.narrow) == tuple(want.narrow)
    return got


@pytest.mark.parametrize("batch", [(), (3,), (16,), (2, 9)])
@pytest.mark.parametrize("mv, mw", [(4, 4), (8, 8), (4, 16), (16, 11)])
def test_random_batches_equal_the_definition(batch, mv, mw):
    rng = np.random.default_rng(sum(batch) + 100 * mv + mw)
    n, c, rows = 8, 6, 7
    for case in range(6):
        codes, qw = _weights(rng, rows, c, n, mw, *((-24, 16) if case % 2 else (-6, 3)),
                             zero_rows=case % 3)
        lo, hi = [(-3, 3), (-26, 17), (-14, 0)][case % 3]
        x = _fp16(rng, batch + (c * n - case,), lo, hi)
        k = [64, None, 55, 54, 64, 60][case]
        rounding = [Rounding.NEAREST_EVEN, Rounding.NEAREST_AWAY][case % 2]
        static = None if case < 4 else [None, 122][case - 4]
        _same_as_exact(x, codes, qw, n=n, mantissa_bits_v=mv, mantissa_bits_w=mw,
                       narrow_width=k, rounding=rounding, static_exponent_code=static)


def test_edge_values():
    n, c, rows = 4, 4, 5
    rng = np.random.default_rng(5)
    codes, qw = _weights(rng, rows, c, n, 8)
    cases = [
        np.zeros(c * n, np.uint16),                           # all zero
        np.full(c * n, 0x8000, np.uint16),                    # -0 everywhere
        np.full(c * n, 0x7BFF, np.uint16),                    # 65504
        np.full(c * n, 0x0001, np.uint16),                    # the smallest subnormal
        np.tile(np.array([0x7BFF, 0x0001, 0, 0x8001], np.uint16), c),
    ]
    kw = {"n": n, "mantissa_bits_v": 8, "mantissa_bits_w": 8}
    for x in cases:
        _same_as_exact(x, codes, qw, **kw)
        _same_as_exact(np.stack([x] * 9), codes, qw, **kw)
    # Results of +-0 (cancellation, zero rows), saturation to 65504 and subnormals.
    big = np.full((rows, c), E8M0_BIAS + 15, np.uint8)
    qw_big = np.full((rows, c * n), 127, np.int16)
    qw_big[1] = -127
    qw_big[2, ::2], qw_big[2, 1::2] = 127, -127
    qw_big[3] = 0
    out = _same_as_exact(np.full(c * n, 0x7BFF, np.uint16), big, qw_big, **kw).out_bits
    assert out[0] == 0x7BFF and out[1] == 0xFBFF and out[2] == 0 and out[3] == 0
    tiny = np.full((rows, c), E8M0_BIAS - 24, np.uint8)
    _same_as_exact(np.full(c * n, 0x0001, np.uint16), tiny, qw_big, **kw)


@pytest.mark.parametrize("gap", list(range(30, 52)))
def test_both_sides_of_the_float64_bound(gap, monkeypatch):
    # x = [1.5 x n | 1.5 * 2**-24 x n] against weights whose second block is 2**-(gap-24)
    # smaller: around 53 - ceil(log2 K) the float64 path stops being provably exact and
    # the int path takes over; both must be exact.
    n, c, rows = 4, 2, 3
    x = np.zeros(c * n, np.float64)
    x[:n] = 1.5
    x[n:] = 1.5 * 2.0 ** -min(gap, 24)
    x = x.astype(np.float16).view(np.uint16)
    codes = np.full((rows, c), E8M0_BIAS, np.uint8)
    codes[:, 1] = E8M0_BIAS - (gap - min(gap, 24))
    qw = np.full((rows, c * n), 7, np.int16)
    qw[1, n:] = -5
    kw = {"n": n, "mantissa_bits_v": 4, "mantissa_bits_w": 4}
    seen = []
    real = M._mvm_int

    def spy(*args, **kwargs):
        seen.append(1)
        return real(*args, **kwargs)
    monkeypatch.setattr(M, "_mvm_int", spy)
    _same_as_exact(x, codes, qw, **kw)
    _same_as_exact(np.stack([x] * 9), codes, qw, **kw)
    # 1.5 * 2**-24 rounds to 2**-23 in FP16: x spans grid exponents -25 .. 1 (26), the
    # weights -(gap - 24) - 2 .. 1 (gap - 21); the sum against 53 - ceil(log2 8). From gap
    # 50 the smallest product exponent is also below the accumulator's LSB.
    assert bool(seen) == (gap + 5 > 50)


def test_the_float_path_is_taken_within_the_bound(monkeypatch):
    rng = np.random.default_rng(11)
    codes, qw = _weights(rng, 64, 16, 16, 4)
    x = _fp16(rng, (12, 256), -3, 3)
    want = [M.mvm_exact(v, codes, qw, n=16, mantissa_bits_v=4, mantissa_bits_w=4)
            for v in x]

    def forbidden(*args, **kwargs):
        raise AssertionError("the int path ran within the float bound")
    monkeypatch.setattr(M, "_mvm_int", forbidden)
    # A batch within 24 bits: one float32 product, no float64 one.
    wt = M.prepare_weights(codes, qw, n=16, mantissa_bits_w=4)
    calls = []
    real = np.matmul

    def matmul(a, b):
        calls.append((a.dtype, b.dtype))
        return real(a, b)
    monkeypatch.setattr(M.np, "matmul", matmul)
    got = M.mvm(x, codes, qw, n=16, mantissa_bits_v=4, mantissa_bits_w=4,
                accumulators=False, prepared=wt)
    assert calls == [(np.float32, np.float32)]
    got1 = M.mvm(x[0], codes, qw, n=16, mantissa_bits_v=4, mantissa_bits_w=4,
                 accumulators=False, prepared=wt)
    assert calls[-1] == (np.float32, np.float32)
    monkeypatch.setattr(M.np, "matmul", real)
    assert [r.tolist() for r in got.out_bits] == [w.out_bits.tolist() for w in want]
    assert got1.out_bits.tolist() == want[0].out_bits.tolist()


def test_only_the_vectors_beyond_the_bound_take_the_int_path(monkeypatch):
    rng = np.random.default_rng(12)
    n, c, rows = 8, 4, 6
    codes, qw = _weights(rng, rows, c, n, 8)
    x = _fp16(rng, (10, c * n), -3, 3)
    x[3, :n] = 0x7B53                                   # 60000 next to 2**-24
    x[3, n:] = 0
    x[3, n] = 0x0001
    seen = []
    real = M._mvm_int

    def spy(qb, *args, **kwargs):
        seen.append(len(qb.mantissas))
        return real(qb, *args, **kwargs)
    monkeypatch.setattr(M, "_mvm_int", spy)
    _same_as_exact(x, codes, qw, n=n, mantissa_bits_v=8, mantissa_bits_w=8)
    assert seen and set(seen) == {1}
    # k below 55: the int path for everything (the cross-tile check needs it).
    seen.clear()
    _same_as_exact(x, codes, qw, n=n, mantissa_bits_v=8, mantissa_bits_w=8, narrow_width=40)
    assert seen and set(seen) == {10}


def test_prepared_weights_beyond_the_float_path():
    rng = np.random.default_rng(13)
    codes = rng.integers(120, 130, (3, 2)).astype(np.uint8)
    qw = rng.integers(-(1 << 40), 1 << 40, (3, 8))           # not an MRF's mantissas
    prep = M.prepare_weights(codes, qw, n=4, mantissa_bits_w=8)
    assert not prep.usable
    x = _fp16(rng, (4, 8), -3, 3)
    for k in (64, None):
        got = M.mvm(x, codes, qw, n=4, mantissa_bits_v=8, mantissa_bits_w=8,
                    narrow_width=k, prepared=prep)
        for b in range(4):
            want = M.mvm_exact(x[b], codes, qw, n=4, mantissa_bits_v=8, mantissa_bits_w=8,
                               narrow_width=k)
            assert got.out_bits[b].tolist() == want.out_bits.tolist()


def test_exponent_errors_are_those_of_the_definition():
    codes = np.full((2, 1), E8M0_BIAS + 16, np.uint8)
    qw = np.ones((2, 4), np.int16)
    x = np.full(4, 0x3C00, np.uint16)
    for fn in (M.mvm, M.mvm_exact):
        with pytest.raises(ValueError, match="weight block exponent 16"):
            fn(x, codes, qw, n=4, mantissa_bits_v=4, mantissa_bits_w=4)
        with pytest.raises(ValueError, match="vector block exponent 128"):
            fn(x, codes - 1, qw, n=4, mantissa_bits_v=4, mantissa_bits_w=4,
               static_exponent_code=255)


def test_one_vector_path(monkeypatch):
    # The model's case (one vector, prepared weights, no accumulators) runs _mvm_one; it
    # must equal the definition and hand everything it does not cover to mvm in full.
    rng = np.random.default_rng(14)
    taken = []
    real = M._mvm_one

    def spy(*args):
        got = real(*args)
        taken.append(got is not None)
        return got
    monkeypatch.setattr(M, "_mvm_one", spy)
    for case in range(40):
        n, c, rows = [(16, 16, 32), (8, 3, 5), (4, 2, 3)][case % 3]
        mv, mw = [(4, 4), (8, 8), (16, 5), (3, 11)][case % 4]
        codes, qw = _weights(rng, rows, c, n, mw, *((-24, 16) if case % 5 == 0 else (-6, 3)))
        lo, hi = [(-3, 3), (-26, 17), (-14, 0), (14, 17)][case % 4]
        x = _fp16(rng, (c * n - case % 3,), lo, hi, zeros=[0.1, 0.9][case % 2])
        if case % 7 == 3:
            x[0] = 0x7C00                              # inf: the full path
        prep = M.prepare_weights(codes, qw, n=n, mantissa_bits_w=mw)
        for k in (64, None, 55):
            got = M.mvm(x, codes, qw, n=n, mantissa_bits_v=mv, mantissa_bits_w=mw,
                        narrow_width=k, accumulators=False, prepared=prep)
            want = M.mvm_exact(x, codes, qw, n=n, mantissa_bits_v=mv, mantissa_bits_w=mw,
                               narrow_width=k)
            assert got.out_bits.tolist() == want.out_bits.tolist(), case
            assert got.output_saturated == want.output_saturated
            assert got.vector_saturated == want.vector_saturated
            assert got.vector_nonfinite == want.vector_nonfinite
            assert tuple(got.narrow) == tuple(want.narrow)
    assert any(taken) and not all(taken)


# --- several matrices on one input (mvm_group) and the quantized-input cache ----------------


def _same_results(got, want, what):
    for name in ("out_bits", "vector_saturated", "vector_nonfinite", "output_saturated"):
        a, b = np.asarray(getattr(got, name)), np.asarray(getattr(want, name))
        assert a.shape == b.shape and np.array_equal(a, b), (what, name)
    for a, b in zip(got.narrow, want.narrow):
        assert np.array_equal(np.asarray(a), np.asarray(b)), (what, "narrow")
    assert got.accumulators is None and got.lsb == want.lsb


def _group_case(rng, batch, mv, mw, members=3, n=8, c=5, cols=37, lo=-6, hi=3, **xkw):
    weights = [_weights(rng, int(rng.integers(3, 12)), c, n, mw, lo, hi) for _ in range(members)]
    x = _fp16(rng, (batch, cols), **xkw)
    return weights, x


@pytest.mark.parametrize("batch", [1, 7, 8, 40])
@pytest.mark.parametrize("mv, mw", [(4, 4), (8, 8), (8, 16), (16, 11)])
@pytest.mark.parametrize("narrow", [64, 55, 40, None])
def test_mvm_group_equals_separate_products(batch, mv, mw, narrow):
    rng = np.random.default_rng(batch * 1000 + mv * 10 + mw + (narrow or 0))
    kw = {"n": 8, "mantissa_bits_v": mv, "mantissa_bits_w": mw, "narrow_width": narrow}
    for spread in ((-3, 3), (-26, 17)):        # within the float32 bound, and beyond it
        weights, x = _group_case(rng, batch, mv, mw)
        x = _fp16(rng, x.shape, lo=spread[0], hi=spread[1])
        x[0, 3] = 0x3C00
        group = M.prepare_group(weights, n=8, mantissa_bits_w=mw)
        cache = {}
        got = M.mvm_group(x, group, quantized_cache=cache, **kw)
        assert len(got) == len(weights)
        for (codes, qw), g in zip(weights, got):
            want = M.mvm(x, codes, qw, accumulators=False, **kw)
            _same_results(g, want, (spread, codes.shape))
            _same_as_exact(x, codes, qw, accumulators=False, **kw)
        # The cache holds this input's quantization: a second call gives the same.
        again = M.mvm_group(x, group, quantized_cache=cache, **kw)
        for a, b in zip(again, got):
            _same_results(a, b, "cached")


def test_mvm_group_takes_one_product_within_the_bound(monkeypatch):
    rng = np.random.default_rng(5)
    weights, _ = _group_case(rng, 16, 8, 8, lo=0, hi=1)
    x = _fp16(rng, (16, 37), lo=0, hi=1, zeros=0)
    group = M.prepare_group(weights, n=8, mantissa_bits_w=8)
    calls = []
    real = np.matmul
    monkeypatch.setattr(M.np, "matmul", lambda a, b: (calls.append(b.shape), real(a, b))[1])
    got = M.mvm_group(x, group, n=8, mantissa_bits_v=8, mantissa_bits_w=8)
    monkeypatch.setattr(M.np, "matmul", real)
    assert calls == [group.wt32.shape]             # one product for all the members
    for (codes, qw), g in zip(weights, got):
        _same_results(g, M.mvm(x, codes, qw, n=8, mantissa_bits_v=8, mantissa_bits_w=8,
                               accumulators=False), "one product")


def test_mvm_group_falls_back_for_inf_nan_and_errors():
    rng = np.random.default_rng(9)
    weights, x = _group_case(rng, 12, 4, 4)
    x[2, 5], x[7, 0] = 0x7C00, 0xFE00                 # inf and NaN: the definition's path
    group = M.prepare_group(weights, n=8, mantissa_bits_w=4)
    for static in (None, 120):
        kw = {"n": 8, "mantissa_bits_v": 4, "mantissa_bits_w": 4, "static_exponent_code": static}
        got = M.mvm_group(x, group, **kw)
        for (codes, qw), g in zip(weights, got):
            _same_results(g, M.mvm(x, codes, qw, accumulators=False, **kw), static)
    # A vector block exponent beyond the MVM's range raises as mvm does.
    big = np.full((8, 37), 0x7800, np.uint16)         # 32768 = 2**15 ... exponent 15
    big[:, 0] = 0x7BFF
    try:
        M.mvm(big, *weights[0], n=8, mantissa_bits_v=4, mantissa_bits_w=4)
    except ValueError as e:
        with pytest.raises(ValueError, match=str(e).split()[0]):
            M.mvm_group(big, group, n=8, mantissa_bits_v=4, mantissa_bits_w=4)


def test_quantized_cache_is_keyed_by_input_and_parameters():
    rng = np.random.default_rng(11)
    codes, qw = _weights(rng, 6, 4, 8, 8)
    cache = {}
    x = _fp16(rng, (10, 32))
    for mv, rounding, static in [(8, Rounding.NEAREST_EVEN, None), (8, Rounding.NEAREST_AWAY, None),
                                 (4, Rounding.NEAREST_EVEN, None), (8, Rounding.NEAREST_EVEN, 125)]:
        kw = {"n": 8, "mantissa_bits_v": mv, "mantissa_bits_w": 8, "rounding": rounding,
                  "static_exponent_code": static, "accumulators": False}
        for xx in (x, x, x[::-1].copy(), x):
            _same_results(M.mvm(xx, codes, qw, quantized_cache=cache, **kw),
                          M.mvm(xx, codes, qw, **kw), (mv, rounding, static))
    assert all(not a.flags.writeable for a in cache["q"][0] if isinstance(a, np.ndarray))
