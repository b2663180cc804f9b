"""``fp16.round_to_bits`` (float32/float64 values to FP16 patterns, rounded once) against
NumPy's cast, ``values.astype(np.float16).view(np.uint16)``, which rounds once to nearest
even with subnormals and overflow (and which the Berkeley TestFloat tests of the MFU
model rest on).

Every float32 pattern whose exponent reaches FP16's range or its edges is checked in
``make test`` where the cases differ (ties, one place either side of a tie, the ends of
each binade, whole binades at the subnormal boundary and at overflow); the sweep over all
2**32 patterns takes about six minutes and runs with ``NPU_SOAK=1`` (``make soak``;
make test sweeps one block of 2**26).
"""

import os

import numpy as np
import pytest

from host.numerics import fp16 as F

SOAK = os.environ.get("NPU_SOAK") == "1"
ROUND_MIN = F._ROUND_MIN                  # before the fixture sets it to 0


@pytest.fixture(autouse=True)
def _piecewise_always(monkeypatch):
    """Small arrays go through the pieces too (``round_to_bits`` casts them otherwise)."""
    monkeypatch.setattr(F, "_ROUND_MIN", 0)


def _cast(v):
    with np.errstate(over="ignore"):
        return v.astype(np.float16).view(np.uint16)


def _check(v):
    got, want = F.round_to_bits(v), _cast(v)
    assert got.dtype == np.uint16 and got.shape == v.shape
    bad = np.flatnonzero(got.reshape(-1) != want.reshape(-1))
    assert bad.size == 0, (f"{bad.size} of {v.size} differ, first "
                           f"{v.reshape(-1)[bad[0]]!r}: {got.reshape(-1)[bad[0]]:#06x} "
                           f"against the cast's {want.reshape(-1)[bad[0]]:#06x}")


def _float32(patterns):
    return np.asarray(patterns, np.uint64).astype(np.uint32).view(np.float32)


@pytest.mark.parametrize("exponent", [-27, -26, -25, -24, -16, -15, -14, -13, 0, 14, 15, 16])
def test_whole_binades(exponent):
    """Every pattern of a binade, both signs: FP16's subnormal grid and its bottom (where
    values round to zero or to the smallest subnormal), the normal boundary, and the
    top binades where 65504 rounds to infinity from 65520 up."""
    field = (exponent + 127) << 23
    mags = np.arange(field, field + (1 << 23), dtype=np.uint64)
    _check(_float32(mags))
    _check(_float32(mags | (1 << 31)))


def test_near_ties_every_exponent():
    """For every float32 exponent (subnormals, zero and infinity included) and every
    top-ten-bit fraction: the low 13 bits at a tie, one place either side of it, and at
    both ends, both signs."""
    exps = np.arange(256, dtype=np.uint64) << 23
    tops = np.arange(1 << 10, dtype=np.uint64) << 13
    lows = np.array([0, 1, 0xFFF, 0x1000, 0x1001, 0x1FFE, 0x1FFF], np.uint64)
    mags = (exps[:, None, None] | tops[None, :, None] | lows[None, None, :]).reshape(-1)
    mags = mags[mags < 0x7F800001]                        # no NaN patterns
    _check(_float32(mags))
    _check(_float32(mags | (1 << 31)))


def test_specials_and_edges():
    v = np.array([0.0, -0.0, np.inf, -np.inf, 65504, 65519.996, 65520, -65520, 65536,
                  2.0 ** 32, -2.0 ** 100, 2.0 ** -24, 2.0 ** -25, 2.0 ** -25 * 1.0000001,
                  -2.0 ** -25, 2.0 ** -14, 2.0 ** -14 * (1 - 2.0 ** -11), 1e-45, -1e-45,
                  np.finfo(np.float32).max], np.float32)
    _check(v)
    _check(v.astype(np.float64))
    assert F.round_to_bits(np.float32([-0.0, -1e-30]))[0] == 0x8000
    assert F.round_to_bits(np.float32([-0.0, -1e-30]))[1] == 0x8000


def test_float64_near_ties_and_random():
    """float64: the fraction's low 42 bits (those below FP16's ten) at and around a tie
    for every exponent from -40 to 20, and random values over FP16's range."""
    rng = np.random.default_rng(7)
    exps = (np.arange(-40, 21, dtype=np.int64) + 1023).astype(np.uint64) << 52
    tops = rng.integers(0, 1 << 10, 64).astype(np.uint64) << 42
    half = np.uint64(1 << 41)
    lows = np.array([0, 1, half - 1, half, half + 1, (1 << 42) - 1], np.uint64)
    mags = (exps[:, None, None] | tops[None, :, None] | lows[None, None, :]).reshape(-1)
    for signed in (mags, mags | np.uint64(1 << 63)):
        _check(signed.view(np.float64))
    v = rng.standard_normal(200_000) * np.exp2(rng.uniform(-30, 18, 200_000))
    _check(v)


def test_shapes_pieces_and_layouts():
    """Sizes across the piece boundary, a non-contiguous view, 0-d and empty arrays;
    the input is not modified."""
    rng = np.random.default_rng(3)
    n = F._ROUND_CHUNK
    for size in (0, 1, ROUND_MIN - 1, ROUND_MIN, n - 1, n, n + 1, 3 * n + 5):
        v = (rng.standard_normal(size) * 100).astype(np.float32)
        keep = v.copy()
        _check(v)
        assert np.array_equal(v, keep)
    m = (rng.standard_normal((300, 70)) * 9).astype(np.float32)
    _check(m[::3, 1::2])
    _check(np.float32(1.0009765))
    assert F.round_to_bits(np.float32(3.0)).shape == ()


def test_other_dtypes_refused():
    for bad in (np.float16([1]), np.int32([1]), np.uint16([1])):
        with pytest.raises(TypeError, match="float32 or float64"):
            F.round_to_bits(bad)


def test_float32_patterns_sweep():
    """Consecutive float32 patterns, 2**26 at a time: one block (the one holding 1.0)
    in make test, all 64 blocks, every pattern, with ``NPU_SOAK=1``."""
    step = 1 << 26
    starts = range(0, 1 << 32, step) if SOAK else [0x3F800000 & -step]
    for lo in starts:
        v = _float32(np.arange(lo, lo + step, dtype=np.uint64))
        _check(v[~np.isnan(v)])
