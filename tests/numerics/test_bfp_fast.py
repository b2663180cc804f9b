"""The fast host BFP path against its reference, bit for bit.

With the NumPy path forced (``NPU_HOST_KERNEL=numpy``), ``bfp.quantize`` and
``bfp.pack`` are the chunked, transposed, magic-number forms of
``bfp._quantize_reference`` and ``bfp._pack_reference`` (the earlier whole-array NumPy
implementation, kept unchanged as the oracle). Every result field must be identical:
exponents, mantissas, saturation and nonfinite counts, and the packed bytes; errors must
be the same exception with the same message.
"""

import numpy as np
import pytest
from bfp_cases import (
    F16,
    F32,
    F64,
    ROUNDINGS,
    assert_nonfinite_same,
    assert_same,
    mixed,
    same_array,
    ties,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from host.numerics import _ckernel, bfp
from host.numerics.bfp import BfpTensor


@pytest.fixture(autouse=True)
def numpy_kernel(monkeypatch):
    """The NumPy fast path (the compiled kernel, the default where it builds, has
    ``test_bfp_ckernel``)."""
    monkeypatch.setenv(_ckernel.ENV_KERNEL, "numpy")
    assert bfp.kernel().name == "numpy"


@pytest.fixture(params=[None, 64], ids=["chunk-default", "chunk-64"])
def chunk(request, monkeypatch):
    """Also run with tiny chunks, so small arrays cross many chunk boundaries."""
    if request.param:
        monkeypatch.setattr(bfp, "_CHUNK", request.param)
    return request.param


@pytest.mark.parametrize("shape", [(1,), (7,), (3, 37), (2, 3, 64), (5, 0), (0, 4), (2, 1000)])
@pytest.mark.parametrize("n", [1, 3, 5, 16, 32, 33])
@pytest.mark.parametrize("dtype", [F16, F32, F64])
def test_shapes_block_sizes_dtypes(shape, n, dtype, chunk):
    rng = np.random.default_rng(sum(shape) * 1000 + n)
    x = mixed(rng, shape, dtype)
    for m in (2, 4, 8, 16):
        for rounding in ROUNDINGS:
            assert_same(x, n, m, rounding)


@pytest.mark.parametrize("m", range(2, 17))
@pytest.mark.parametrize("n", [1, 2, 3, 8, 16, 32, 33])
@pytest.mark.parametrize("rounding", ROUNDINGS)
def test_mantissa_widths(m, n, rounding, chunk):
    rng = np.random.default_rng(m * 100 + n)
    assert_same(mixed(rng, (3, 4 * n + 1)), n, m, rounding)
    assert_same(mixed(rng, (2, 3 * n), F16, spread=8), n, m, rounding)
    assert_same(ties(rng, (4, 8 * n), m), n, m, rounding)


@pytest.mark.parametrize("m", [2, 3, 4, 8, 12, 16])
@pytest.mark.parametrize("rounding", ROUNDINGS)
def test_large_array_many_chunks(m, rounding):
    # Several default chunks plus a partial one, and a padded last axis.
    rng = np.random.default_rng(m)
    x = rng.standard_normal((5, 70001)).astype(F32)
    for n in (16, 32, 7):
        assert_same(x, n, m, rounding)


@pytest.mark.parametrize("m", [2, 4, 5, 8, 16])
@pytest.mark.parametrize("rounding", ROUNDINGS)
def test_static_exponents(m, rounding, chunk):
    rng = np.random.default_rng(m)
    x = mixed(rng, (4, 48), spread=20)
    nblocks = 3
    # Scalars across the whole range (deep saturation, overflow to inf while scaling,
    # k below the magic-number range, all-zero results), and per-block arrays.
    for e in (-127, -126, -100, -20, -3, 0, 1, 5, 20, 100, 103, 104, 110, 127):
        assert_same(x, 16, m, rounding, exponent=e)
    assert_same(x, 16, m, rounding, exponent=rng.integers(-127, 128, (4, nblocks)))
    assert_same(x, 16, m, rounding, exponent=rng.integers(-5, 5, (nblocks,)).astype(np.int8))
    assert_same(x, 16, m, rounding, exponent=np.uint8(3))
    assert_same(np.clip(x, -6e4, 6e4).astype(F16), 16, m, rounding,
                exponent=rng.integers(-30, 30, (4, 1)))


@pytest.mark.parametrize("exponent", [128, -128, 1.5, np.zeros((5,), int), np.array([True])])
def test_static_exponent_errors(exponent):
    x = np.ones((4, 48), F32)
    assert_same(x, 16, 4, exponent=exponent)
    x[1, 3] = np.inf                        # the nonfinite error comes first
    assert_same(x, 16, 4, exponent=exponent)


def test_extreme_magnitudes(chunk):
    big = np.finfo(F32).max
    x = np.array([[big, -big, 1.0, 0.0], [2.0 ** 127, 2.0 ** 103, 2.0 ** 102, 1.0],
                  [2.0 ** -126, 2.0 ** -149, -(2.0 ** -149), 0.0],
                  [1e-45, 0.0, 0.0, 0.0]], F32)
    for m in range(2, 17):
        for rounding in ROUNDINGS:
            for n in (1, 2, 4):
                assert_same(x, n, m, rounding)


@pytest.mark.parametrize("dtype", [F16, F32, F64])
@pytest.mark.parametrize("mode", ["error", "saturate"])
def test_nonfinite(dtype, mode, chunk):
    assert_nonfinite_same(dtype, mode)


def test_argument_errors():
    x = np.ones(8, F32)
    for args in [(0, 4), (4, 1), (4, 17), (4.0, 4)]:
        assert_same(x, *args)
    assert_same(x, 4, 4, "nearest-odd")
    assert_same(x, 4, 4, nonfinite="clip")
    for bad in (np.ones(4, np.int32), np.float32(1.0)):
        with pytest.raises((TypeError, ValueError)) as ref:
            bfp._quantize_reference(bad, 4, 4)
        with pytest.raises(type(ref.value), match="x must"):
            bfp.quantize(bad, 4, 4)


def test_non_contiguous_input():
    rng = np.random.default_rng(3)
    x = mixed(rng, (40, 30))
    assert_same(x.T, 16, 8)
    assert_same(x[::2, 1::3], 3, 5, "nearest-away")


# --- pack on hand-made tensors --------------------------------------------------------

@pytest.mark.parametrize("m", range(2, 17))
@pytest.mark.parametrize("n", [1, 2, 3, 4, 8, 16, 32, 33])
def test_pack_any_mantissas(m, n, chunk):
    rng = np.random.default_rng(m * 64 + n)
    top = (1 << (m - 1)) - 1
    for dtype in (np.int16, np.int32, np.int64):
        q = rng.integers(-top - 1, top + 1, (3, 5, 2 * n)).astype(dtype)
        exps = rng.integers(-127, 127, (3, 5, 2)).astype(np.int16)
        zeros = np.zeros(exps.shape, np.int64)
        t = BfpTensor(exps, q, n, m, (3, 5, 2 * n), zeros, zeros)
        same_array(bfp.pack(t), bfp._pack_reference(t), f"packed bytes ({dtype.__name__})")
    empty = BfpTensor(np.zeros((0, 2), np.int16), np.zeros((0, 2 * n), np.int16), n, m,
                      (0, 2 * n), np.zeros((0, 2), np.int64), np.zeros((0, 2), np.int64))
    same_array(bfp.pack(empty), bfp._pack_reference(empty), "packed bytes (empty)")


def test_pack_type_error():
    with pytest.raises(TypeError, match="pack expects a BfpTensor"):
        bfp.pack(np.zeros(4))


# --- property ------------------------------------------------------------------------

@st.composite
def float_inputs(draw):
    dtype = draw(st.sampled_from([F16, F32]))
    shape = draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=0, max_side=40))
    x = draw(hnp.arrays(dtype, shape, elements=st.floats(
        width=np.finfo(dtype).bits, allow_nan=True, allow_infinity=True)))
    return x


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(x=float_inputs(), n=st.integers(1, 40), m=st.integers(2, 16),
       rounding=st.sampled_from(ROUNDINGS), mode=st.sampled_from(["error", "saturate"]),
       static=st.none() | st.integers(-130, 130))
def test_property_fast_equals_reference(x, n, m, rounding, mode, static):
    assert_same(x, n, m, rounding, exponent=static, nonfinite=mode)
