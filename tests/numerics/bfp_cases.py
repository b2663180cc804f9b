"""Shared by the host BFP tests (``test_bfp_fast``, the NumPy fast path, and
``test_bfp_ckernel``, the compiled kernel): the comparison with the reference forms and
the generators of hard inputs."""

import numpy as np
import pytest

from host.numerics import bfp

F16, F32, F64 = np.float16, np.float32, np.float64
ROUNDINGS = ("nearest-even", "nearest-away")


def same_array(a, b, what):
    assert a.dtype == b.dtype, f"{what}: dtype {a.dtype} != {b.dtype}"
    assert a.shape == b.shape, f"{what}: shape {a.shape} != {b.shape}"
    bad = np.flatnonzero(a.reshape(-1) != b.reshape(-1))
    assert bad.size == 0, (f"{what}: {bad.size} differ, first at flat index {bad[0]}: "
                           f"{a.reshape(-1)[bad[0]]} != {b.reshape(-1)[bad[0]]}")


def assert_same(x, n, m, rounding="nearest-even", exponent=None, nonfinite="error"):
    """:func:`bfp.quantize` and :func:`bfp.pack` (whichever kernel is in use) equal the
    reference forms on ``x``, field by field, or both raise the same error; returns the
    tensor (None after an error)."""
    try:
        ref = bfp._quantize_reference(x, n, m, rounding, exponent, nonfinite=nonfinite)
    except (TypeError, ValueError) as exc:
        with pytest.raises(type(exc)) as got:
            bfp.quantize(x, n, m, rounding, exponent, nonfinite=nonfinite)
        assert str(got.value) == str(exc)
        return None
    got = bfp.quantize(x, n, m, rounding, exponent, nonfinite=nonfinite)
    what = f"n={n} m={m} {rounding} exponent={exponent!r}"
    assert got.shape == ref.shape and got.block_size == n and got.mantissa_bits == m
    same_array(got.exponents, ref.exponents, f"exponents ({what})")
    same_array(got.mantissas, ref.mantissas, f"mantissas ({what})")
    same_array(got.saturations, ref.saturations, f"saturations ({what})")
    same_array(got.nonfinite, ref.nonfinite, f"nonfinite ({what})")
    same_array(bfp.pack(got), bfp._pack_reference(ref), f"packed bytes ({what})")
    return got


def mixed(rng, shape, dtype=F32, spread=40):
    """Normal values over a wide range of scales, with zero blocks, exact zeros, negative
    zeros, subnormals, and values at the top of their binade."""
    x = rng.standard_normal(shape) * np.exp2(rng.integers(-spread, spread, shape))
    flat = x.reshape(-1)
    if flat.size:
        pick = rng.random(flat.size)
        info = np.finfo(dtype)
        flat[pick < 0.05] = 0.0
        flat[(pick >= 0.05) & (pick < 0.07)] = -0.0
        sub = (pick >= 0.07) & (pick < 0.1)
        flat[sub] = rng.integers(-1000, 1000, sub.sum()) * float(info.smallest_subnormal)
        top = (pick >= 0.1) & (pick < 0.13)        # 2**p * (2 - ulp): maximal fractions
        flat[top] = np.ldexp(2.0 - float(info.eps), rng.integers(-20, 20, top.sum()))
        flat[top] *= rng.choice([-1.0, 1.0], top.sum())
        flat[: len(flat) // 5] = 0.0               # some all-zero blocks
    with np.errstate(over="ignore"):
        return x.astype(dtype)


def ties(rng, shape, m, dtype=F32):
    """Block maxima fixed at 1.5 * 2**e, other values exact multiples of half a unit of
    that exponent: every rounding is a tie or exact."""
    units = rng.integers(-(1 << m), 1 << m, shape) / 2.0       # j/2 in units 2**(e-m+2)
    e = rng.integers(-10, 10, shape[:-1] + (1,))
    x = np.ldexp(units, e - (m - 2))
    x[..., ::7] = np.ldexp(1.5, e)[..., 0:1]
    return x.astype(dtype)


def assert_nonfinite_same(dtype, mode):
    """:func:`assert_same` on arrays with infinities and NaNs (in mixed blocks, and a block
    of NaN only), every width and rounding, dynamic and static exponents, with
    ``nonfinite=mode`` (``"error"``: the same error; ``"saturate"``: the same tensor)."""
    rng = np.random.default_rng(7)
    x = mixed(rng, (3, 40), dtype, spread=5)
    x[0, 3] = np.inf
    x[1, 17] = -np.inf
    x[2, 39] = np.nan
    x[2, 0] = np.nan
    for m in (2, 4, 8, 11, 16):
        for rounding in ROUNDINGS:
            assert_same(x, 16, m, rounding, nonfinite=mode)
            assert_same(x, 16, m, rounding, exponent=3, nonfinite=mode)
    assert_same(np.full((2, 5), np.nan, dtype), 4, 8, nonfinite=mode)
