"""The fast FP16 vector quantizer against its definition, bit for bit.

``host.numerics.mvm.quantize_fp16`` takes ``_quantize_fp16_f64`` (float64 scaling and
rounding, block maxima read from the bit patterns) for finite inputs and
``_quantize_fp16_bfp`` (through ``host.numerics.bfp.quantize``, the definition kept as
the oracle) for the rest. Every field must be identical, over every finite FP16 pattern,
every mantissa width, both roundings and dynamic and static exponents; the dequantized
values the MVM's float path uses must be the mantissas scaled by the block exponent.
The block helpers (``_block_max``, ``_block_any``, ``_block_count``) must equal the NumPy
reductions they replace.
"""

import numpy as np
import pytest

from host.numerics import mvm as M
from host.spec.formats import E8M0_BIAS, Rounding

ROUNDINGS = [Rounding.NEAREST_EVEN, Rounding.NEAREST_AWAY]
#: Every finite FP16 pattern (both signs), in blocks of 16.
FINITE = np.array([b for b in range(1 << 16) if (b & 0x7C00) != 0x7C00], np.uint16)


def _blocks(bits, n=16):
    pad = (-len(bits)) % n
    return np.concatenate([bits, np.zeros(pad, np.uint16)]).reshape(-1, n)


def _same(fast, ref, what):
    for name in ("exponent_codes", "mantissas", "saturated", "nonfinite"):
        a, b = getattr(fast, name), getattr(ref, name)
        assert a.dtype == b.dtype, (what, name, a.dtype, b.dtype)
        assert a.shape == b.shape, (what, name, a.shape, b.shape)
        bad = np.flatnonzero(a.reshape(-1) != b.reshape(-1))
        assert bad.size == 0, (what, name, bad[:5])


def _check(bits, m, rounding, static):
    got = M._quantize_fp16_f64(bits, m, rounding, static)
    assert got is not None
    fast, (values, grid, nzb) = got
    ref = M._quantize_fp16_bfp(bits, m, rounding, static)
    _same(fast, ref, (m, rounding, static))
    # The float path's operands: q * 2**grid exactly, grid from the codes (e = 127 stands
    # for the code 0xFF, as the rounding used), and which blocks are non-zero.
    e = np.minimum(fast.exponent_codes.astype(np.int64) - E8M0_BIAS, 127)
    assert np.array_equal(grid, e - (m - 2))
    want = np.ldexp(fast.mantissas.astype(np.float64), grid[..., None])
    assert values.dtype == np.float32
    assert np.array_equal(values.astype(np.float64), want)
    assert np.array_equal(nzb, (fast.mantissas != 0).any(-1))


@pytest.mark.parametrize("rounding", ROUNDINGS)
@pytest.mark.parametrize("m", [2, 3, 4, 5, 8, 11, 16])
def test_every_finite_pattern_dynamic(m, rounding):
    rng = np.random.default_rng(m)
    # In order (neighbours share blocks), shuffled (mixed binades), and sparse blocks.
    for bits in (FINITE, rng.permutation(FINITE)):
        _check(_blocks(bits), m, rounding, None)
    sparse = rng.permutation(FINITE)[:4096].copy()
    sparse[rng.random(sparse.size) < 0.7] = 0
    _check(_blocks(sparse), m, rounding, None)


@pytest.mark.parametrize("rounding", ROUNDINGS)
@pytest.mark.parametrize("m", [2, 4, 8, 16])
@pytest.mark.parametrize("code", [0, 1, 90, 100, 110, 120, 127, 135, 142, 200, 254, 255])
def test_every_finite_pattern_static(m, rounding, code):
    _check(_blocks(np.random.default_rng(code).permutation(FINITE)), m, rounding, code)


def test_public_quantizer_takes_both_paths():
    rng = np.random.default_rng(3)
    bits = rng.choice(FINITE, (5, 3, 8))
    for rounding in ROUNDINGS:
        for static in (None, 120):
            got = M.quantize_fp16(bits, 4, rounding, static)
            _same(got, M._quantize_fp16_bfp(bits, 4, rounding, static), "finite")
    # inf and NaN take the definition (saturated to 65504 / zero and counted).
    bits[1, 2, 3], bits[4, 0, 0] = 0x7C00, 0x7E01
    assert M._quantize_fp16_f64(bits, 4, Rounding.NEAREST_EVEN, None) is None
    got = M.quantize_fp16(bits, 4)
    assert got.nonfinite[1, 2] == 1 and got.nonfinite[4, 0] == 1
    _same(got, M._quantize_fp16_bfp(bits, 4, Rounding.NEAREST_EVEN, None), "nonfinite")
    with pytest.raises(ValueError, match="static_exponent_code"):
        M.quantize_fp16(bits, 4, static_exponent_code=256)
    with pytest.raises(TypeError):
        M.quantize_fp16(bits.astype(np.int32), 4)


@pytest.mark.parametrize("shape", [(3, 16), (700, 16), (9, 8), (4, 5, 32), (2, 3), (5, 24)])
def test_block_helpers(shape):
    rng = np.random.default_rng(sum(shape))
    q = rng.integers(-3, 4, shape).astype(np.int16)
    q[rng.random(shape[:-1]) < 0.3] = 0
    assert np.array_equal(M._block_any(q), q.any(-1))
    assert np.array_equal(M._block_any(q.astype(np.int64)), q.any(-1))
    assert np.array_equal(M._block_any(q[..., ::2]), q[..., ::2].any(-1))
    u = rng.integers(0, 1 << 16, shape).astype(np.uint16)
    assert np.array_equal(M._block_max(u), u.max(-1))
    mask = rng.random(shape) < 0.4
    mask[..., :] |= rng.random(shape[:-1])[..., None] < 0.1        # whole blocks set
    got = M._block_count(mask)
    assert got.dtype == np.int64 and np.array_equal(got, mask.sum(-1))


# --- the float32 form (dynamic exponent, large inputs) --------------------------------------


def test_finite_fp16_to_f32_every_pattern():
    got = M._finite_fp16_to_f32(FINITE)
    want = FINITE.view(np.float16).astype(np.float32)
    assert got.dtype == np.float32 and got.shape == FINITE.shape
    # Bit for bit: signed zeros and subnormals included.
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    two_d = _blocks(FINITE[::7])
    assert np.array_equal(M._finite_fp16_to_f32(two_d).view(np.uint32),
                          two_d.view(np.float16).astype(np.float32).view(np.uint32))


def test_fp16_log2_table():
    mags = np.arange(1, 0x7C00, dtype=np.uint16)
    want = np.floor(np.log2(mags.view(np.float16).astype(np.float64))).astype(np.int64)
    assert M._FP16_LOG2[0] == -127
    assert np.array_equal(M._FP16_LOG2[1:], want)


def _check_f32(bits, m, rounding):
    got = M._quantize_fp16_f32(bits, m, rounding)
    ref = M._quantize_fp16_f64(bits, m, rounding, None)
    assert got is not None and ref is not None
    _same(got[0], ref[0], (m, rounding, "f32"))
    _same(got[0], M._quantize_fp16_bfp(bits, m, rounding, None), (m, rounding, "bfp"))
    values, grid, nzb = got[1]
    r_values, r_grid, r_nzb = ref[1]
    assert values.dtype == np.float32 and values.shape == r_values.shape
    assert np.array_equal(values.view(np.uint32), r_values.view(np.uint32))   # -0 too
    assert np.array_equal(grid, r_grid) and np.array_equal(nzb, r_nzb)


@pytest.mark.parametrize("rounding", ROUNDINGS)
@pytest.mark.parametrize("m", list(range(2, 17)))
def test_f32_form_every_finite_pattern(m, rounding):
    rng = np.random.default_rng(100 + m)
    for bits in (FINITE, rng.permutation(FINITE)):
        _check_f32(_blocks(bits), m, rounding)
    sparse = rng.permutation(FINITE)[:8192].copy()
    sparse[rng.random(sparse.size) < 0.7] = 0
    _check_f32(_blocks(sparse).reshape(32, -1, 16), m, rounding)
    # Blocks whose largest value rounds up past the top code (saturation), batch shape.
    big = rng.integers(0x3C00, 0x3FFF, (64, 4, 16)).astype(np.uint16)
    big[..., 0] = 0x3FFF
    big[rng.random(big.shape) < 0.5] |= 0x8000
    _check_f32(big, m, rounding)


def test_f32_form_is_taken_and_refuses_nonfinite():
    rng = np.random.default_rng(7)
    bits = rng.choice(FINITE, (128, 16))
    assert bits.size >= M._QUANTIZE_F32_MIN
    qb, _ = M._quantize_values(bits, 6, Rounding.NEAREST_EVEN, None)
    _same(qb, M._quantize_fp16_bfp(bits, 6, Rounding.NEAREST_EVEN, None), "public")
    bits[5, 3] = 0x7C00
    assert M._quantize_fp16_f32(bits, 6, Rounding.NEAREST_EVEN) is None
    got = M.quantize_fp16(bits, 6)
    assert got.nonfinite[5] == 1
    _same(got, M._quantize_fp16_bfp(bits, 6, Rounding.NEAREST_EVEN, None), "nonfinite")
