"""Unit tests of ``host.numerics.bfp``: quantize, dequantize, pack, unpack and tiling.

Expected values are written by hand from the definitions in ``docs/numerics.md`` (section
2 for quantizing, 2.8 for the byte layout, 3 for tiling) or computed by the small
independent helpers below (a per-element bit packer); never taken from ``host.numerics.bfp``.
"""

import numpy as np
import pytest

from host.numerics import bfp
from host.numerics.bfp import BfpTensor

F16, F32, F64 = np.float16, np.float32, np.float64


def _tensor(codes, mantissas, block_size, mantissa_bits, shape=None):
    """A BfpTensor built by hand from E8M0 codes and mantissas (no quantizer involved)."""
    codes = np.asarray(codes, np.int64)
    mantissas = np.asarray(mantissas, np.int16)
    shape = tuple(mantissas.shape) if shape is None else tuple(shape)
    zeros = np.zeros(codes.shape, np.int64)
    return BfpTensor(exponents=(codes - 127).astype(np.int16), mantissas=mantissas,
                     block_size=block_size, mantissa_bits=mantissa_bits, shape=shape,
                     saturations=zeros, nonfinite=zeros.copy())


def pack_reference(codes, mantissas, block_size, mantissa_bits):
    """Independent packer: one Python integer per block, built field by field.

    Layout (``host.spec.formats.block_layout``): bits 0..7 the E8M0 code, then mantissa ``i``
    as an m-bit two's complement field at bit ``8 + i*m``; the bit string is written
    least significant bit first and zero padded to whole bytes.
    """
    m = mantissa_bits
    nbytes = -(-(8 + block_size * m) // 8)
    out = bytearray()
    for code, row in zip(np.ravel(codes), np.reshape(mantissas, (-1, block_size))):
        word = int(code)
        for i, q in enumerate(row):
            word |= (int(q) % (1 << m)) << (8 + i * m)
        out += word.to_bytes(nbytes, "little")
    return bytes(out)


# --- quantize: shapes, dtypes, padding ---------------------------------------------------

@pytest.mark.parametrize("shape", [(5,), (3, 7), (2, 3, 16), (1, 1), (2, 0, 4)])
@pytest.mark.parametrize("block_size", [1, 3, 4, 16])
@pytest.mark.parametrize("mantissa_bits", [2, 4, 8, 16])
def test_quantize_shapes_and_dtypes(shape, block_size, mantissa_bits):
    rng = np.random.default_rng(sum(shape) * 100 + block_size * 10 + mantissa_bits)
    x = rng.standard_normal(shape).astype(F32)
    t = bfp.quantize(x, block_size, mantissa_bits)
    nblocks = -(-shape[-1] // block_size)
    assert t.shape == shape
    assert t.block_size == block_size and t.mantissa_bits == mantissa_bits
    assert t.nblocks == nblocks
    assert t.exponents.shape == shape[:-1] + (nblocks,)
    assert t.exponents.dtype == np.int16
    assert t.mantissas.shape == shape[:-1] + (nblocks * block_size,)
    assert t.mantissas.dtype == np.int16
    assert t.saturations.shape == shape[:-1] + (nblocks,)
    assert t.saturations.dtype == np.int64
    assert t.nonfinite.shape == shape[:-1] + (nblocks,)
    assert t.exponent_codes.dtype == np.uint8
    np.testing.assert_array_equal(t.exponent_codes.astype(int), t.exponents.astype(int) + 127)
    y = t.dequantize()
    assert y.dtype == np.float32 and y.shape == shape
    top = (1 << (mantissa_bits - 1)) - 1
    assert np.abs(t.mantissas.astype(int)).max(initial=0) <= top


def test_zero_padding_of_last_axis():
    # Negative values: a wrong padding value or a padding that took part in max|x| shows.
    x = np.array([[-1.0, -2.0, -3.0, -4.0, -0.75, -0.5],
                  [8.0, 0.0, 0.0, 0.0, 0.25, 0.0]], F32)
    t = bfp.quantize(x, 4, 4)
    padded = np.concatenate([x, np.zeros((2, 2), F32)], axis=1)
    tp = bfp.quantize(padded, 4, 4)
    np.testing.assert_array_equal(t.exponents, tp.exponents)
    np.testing.assert_array_equal(t.mantissas, tp.mantissas)
    assert t.mantissas.shape == (2, 8)
    np.testing.assert_array_equal(t.mantissas[:, 6:], 0)
    # last block of row 0: max |x| = 0.75 -> e = -1, step 2^(e-2) = 1/8
    assert t.exponents[0, 1] == -1
    np.testing.assert_array_equal(t.mantissas[0, 4:6], [-6, -4])
    # last block of row 1: max 0.25 -> e = -2, step 1/16
    assert t.exponents[1, 1] == -2
    np.testing.assert_array_equal(t.mantissas[1, 4:6], [4, 0])
    assert t.dequantize().shape == (2, 6)


# --- quantize: values (worked examples of docs/numerics.md 2.6, computed by hand) ---------

@pytest.mark.parametrize("dtype", [F16, F32, F64])
@pytest.mark.parametrize("values, m, rounding, code, mantissas, saturated", [
    # e = 1 (max 2.75), step 2^(1-2) = 0.5; 2.75/0.5 = 5.5 is a tie -> 6 (even)
    ([1.5, -0.375, 0, 2.75], 4, "nearest-even", 0x80, [3, -1, 0, 6], 0),
    # same block, away: 5.5 -> 6, -0.75 -> -1
    ([1.5, -0.375, 0, 2.75], 4, "nearest-away", 0x80, [3, -1, 0, 6], 0),
    # m = 8: step 2^(1-6) = 1/32
    ([1.5, -0.375, 0, 2.75], 8, "nearest-even", 0x80, [48, -12, 0, 88], 0),
    # e = 0, step 0.25: 0.5, 1.5, -2.5, 4 -> ties
    ([0.125, 0.375, -0.625, 1], 4, "nearest-even", 0x7F, [0, 2, -2, 4], 0),
    ([0.125, 0.375, -0.625, 1], 4, "nearest-away", 0x7F, [1, 2, -3, 4], 0),
    # negative ties to a zero: -0.5 -> 0 (even, no negative zero) / -1 (away)
    ([-0.125, 1, -0.875, 0], 4, "nearest-even", 0x7F, [0, 4, -4, 0], 0),
    ([-0.125, 1, -0.875, 0], 4, "nearest-away", 0x7F, [-1, 4, -4, 0], 0),
    # 1.96875 * 4 = 7.875 -> 8 > 7: clamped, counted
    ([1.96875, 1, 0, 0], 4, "nearest-even", 0x7F, [7, 4, 0, 0], 1),
    ([-1.96875, 1, 0, 0], 4, "nearest-away", 0x7F, [-7, 4, 0, 0], 1),
    # m = 2: step 2^e; 1.5 * 1 -> tie 1.5 -> 2 (both modes) > 1: clamped
    ([1.5, -1, 0.5, 0.25], 2, "nearest-even", 0x7F, [1, -1, 0, 0], 1),
    ([1.5, -1, 0.5, 0.25], 2, "nearest-away", 0x7F, [1, -1, 1, 0], 1),
    # m = 16: step 2^(e-14); 3 = 1.5 * 2^1, e = 1: 3 * 2^13 = 24576
    ([3, -0.0001220703125, 1, 0], 16, "nearest-even", 0x80, [24576, -1, 8192, 0], 0),
])
def test_quantize_known_values(dtype, values, m, rounding, code, mantissas, saturated):
    t = bfp.quantize(np.array(values, dtype), 4, m, rounding)
    assert t.exponent_codes.tolist() == [code]
    assert t.mantissas.tolist() == mantissas
    assert t.saturations.tolist() == [saturated]
    assert t.saturation_count == saturated
    assert t.nonfinite.tolist() == [0]


def test_rounding_ties_every_residue():
    # e = 3 (max 15), m = 6: step 2^(3-4) = 0.5; x = k/4 gives scaled k/2, ties for odd k.
    k = np.arange(-60, 61)
    x = np.concatenate([[15.0], k / 4.0]).astype(F32)
    for rounding in ("nearest-even", "nearest-away"):
        t = bfp.quantize(x, x.size, 6, rounding)
        assert t.exponents.tolist() == [3]
        q = t.mantissas[1:].tolist()
        for kk, got in zip(k.tolist(), q):
            lo, odd = divmod(abs(kk), 2)        # |k|/2 = lo + odd/2
            if not odd:
                want = lo
            elif rounding == "nearest-even":
                want = lo + (lo % 2)
            else:
                want = lo + 1
            assert got == (-want if kk < 0 else want), (rounding, kk, got)


def test_all_zero_block_gets_exponent_minus_127():
    x = np.array([[0.0, -0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0],
                  [0.0] * 8], F32)
    for exponent_rounding in ("nearest-even", "nearest-away"):
        t = bfp.quantize(x, 4, 8, exponent_rounding)
        assert t.exponents.tolist() == [[-127, 0], [-127, -127]]
        assert t.exponent_codes.tolist() == [[0, 127], [0, 0]]
        np.testing.assert_array_equal(t.mantissas[1], 0)
        np.testing.assert_array_equal(t.mantissas[0, :4], 0)


def test_subnormal_inputs():
    # FP16: 2^-24 (0x0001) and 2^-23: e = -23, step 2^(-23-2) -> 2, 4
    x = np.array([0x0001, 0x0002, 0, 0], np.uint16).view(F16)
    t = bfp.quantize(x, 4, 4)
    assert t.exponent_codes.tolist() == [0x68]
    assert t.mantissas.tolist() == [2, 4, 0, 0]
    # FP16 subnormal 0x03FF = 1023 * 2^-24: leading one at bit 9 -> e = -15
    t = bfp.quantize(np.array([0x03FF], np.uint16).view(F16), 1, 12)
    assert t.exponents.tolist() == [-15]
    # 1023 * 2^-24 * 2^(12-2+15) = 1023 * 2 = 2046 -> fits 2^11 - 1 = 2047
    assert t.mantissas.tolist() == [2046]
    # FP32 subnormal 1.5 * 2^-130: floor(log2) = -130, clamped to -127; scaled by
    # 2^(8-2+127): 1.5 * 2^3 = 12
    v = np.ldexp(F32(1.5), -130)
    assert v < np.finfo(F32).tiny
    t = bfp.quantize(np.array([v, -v / 4], F32), 2, 8)
    assert t.exponents.tolist() == [-127]
    assert t.mantissas.tolist() == [12, -3]
    assert t.dequantize().tolist() == [v, -v / 4]
    # The smallest FP32 subnormal 2^-149 with m = 16: 2^-149 * 2^(14+127) = 2^-8 -> 0
    t = bfp.quantize(np.array([np.ldexp(F32(1), -149)], F32), 1, 16)
    assert t.exponents.tolist() == [-127] and t.mantissas.tolist() == [0]
    # FP64 below every E8M0 scale: 2^-200 -> e clamped to -127, rounds to 0
    t = bfp.quantize(np.array([2.0 ** -200, 2.0 ** -126], F64), 2, 8)
    assert t.exponents.tolist() == [-126]
    assert t.mantissas.tolist() == [0, 64]


@pytest.mark.parametrize("dtype", [F16, F32, F64])
def test_float_dtypes_agree_on_common_values(dtype):
    # Values exact in every dtype give identical blocks.
    x = np.array([[0.5, -0.375, 3.0, 0.0078125, -96.0, 1.25, 0.0, 7.0]])
    ref = bfp.quantize(x.astype(F16), 4, 6)
    t = bfp.quantize(x.astype(dtype), 4, 6)
    assert t == ref
    assert t.exponents.tolist() == [[1, 6]]
    # e = 1: step 2^(1-4) = 1/8; e = 6: step 2^(6-4) = 4
    assert t.mantissas.tolist() == [[4, -3, 24, 0, -24, 0, 0, 2]]
    assert t.dequantize().dtype == np.float32


def test_dequantize_is_exact():
    # q * 2^(e - (m-2)) exactly, as float32
    t = _tensor([[127 + 3, 127 - 100]], [[5, -7, 0, 1, -1, 2, 3, 7]], 4, 4)
    y = t.dequantize()
    want = [5 * 2.0 ** 1, -7 * 2.0, 0, 2.0, -(2.0 ** -102), 2 * 2.0 ** -102,
            3 * 2.0 ** -102, 7 * 2.0 ** -102]
    assert y.dtype == np.float32
    assert y.tolist() == [want]


# --- static exponent -----------------------------------------------------------------------

def test_static_exponent_scalar_saturates_and_counts():
    # docs 2.6: 3, 100, -0.01, 0 with e = 2, m = 4: step 1 -> 3, 7 (100 clamped), 0, 0
    x = np.array([3, 100, -0.01, 0], F16)
    t = bfp.quantize(x, 4, 4, exponent=2)
    assert t.exponent_codes.tolist() == [0x81]
    assert t.mantissas.tolist() == [3, 7, 0, 0]
    assert t.saturations.tolist() == [1]
    # Static mode keeps the exponent for an all-zero block.
    t = bfp.quantize(np.zeros(4, F32), 4, 4, exponent=-5)
    assert t.exponents.tolist() == [-5]
    # The saturation threshold is (2^(m-1) - 0.5) * step, a tie that rounds up in both modes.
    step = 2.0 ** (0 - 2)
    for rounding in ("nearest-even", "nearest-away"):
        x = np.array([6.5 * step, 7.5 * step, -7.5 * step, 7.25 * step], F32)
        t = bfp.quantize(x, 4, 4, rounding, exponent=0)
        assert t.mantissas.tolist() == [6 if rounding == "nearest-even" else 7, 7, -7, 7]
        assert t.saturations.tolist() == [2]


def test_static_exponent_per_block_array():
    x = np.ones((2, 8), F32)
    exps = np.array([[0, 1], [2, -3]])
    t = bfp.quantize(x, 4, 4, exponent=exps)
    assert t.exponents.tolist() == exps.tolist()
    # step 2^(e-2): 1/4 -> 4, 1/2 -> 2, 1 -> 1, 1/32 -> 32 clamped to 7
    assert t.mantissas.tolist() == [[4] * 4 + [2] * 4, [1] * 4 + [7] * 4]
    assert t.saturations.tolist() == [[0, 0], [0, 4]]
    # One exponent per block column, broadcast over the leading axis.
    t = bfp.quantize(x, 4, 4, exponent=np.array([1, -1]))
    assert t.exponents.tolist() == [[1, -1], [1, -1]]
    assert t.mantissas.tolist() == [[2] * 4 + [7] * 4] * 2
    assert t.saturations.tolist() == [[0, 4], [0, 4]]
    # Extreme static exponents.
    t = bfp.quantize(np.array([1e38, 1.0], F32), 2, 8, exponent=-127)
    assert t.mantissas.tolist() == [127, 127] and t.saturations.tolist() == [2]
    t = bfp.quantize(np.array([3e38, 1.0], F32), 2, 8, exponent=127)
    assert t.exponents.tolist() == [127]
    # 3e38 * 2^(6-127) = 3e38 / 2^121 ~ 112.8 -> 113
    assert t.mantissas.tolist() == [113, 0]


def test_saturation_counts_per_block():
    x = np.array([[1.96875, 1.9375, -1.96875, 1, 0.5, 0.5, 0.5, 0.5, 1.875, 0, 0, 0]], F32)
    t = bfp.quantize(x, 4, 4)
    # block 0: 7.875, 7.75, -7.875 clamp; block 1: no clamp; block 2: 7.5 -> 8 clamp
    assert t.saturations.tolist() == [[3, 0, 1]]
    assert t.saturation_count == 4
    assert t.mantissas.tolist() == [[7, 7, -7, 4, 4, 4, 4, 4, 7, 0, 0, 0]]


# --- non-finite inputs --------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [F16, F32, F64])
@pytest.mark.parametrize("bad, text", [(np.inf, "inf"), (-np.inf, "-inf"), (np.nan, "nan")])
def test_nonfinite_error_names_the_problem(dtype, bad, text):
    x = np.array([[1.0, 2.0, 3.0], [4.0, bad, 5.0]], dtype)
    with pytest.raises(ValueError, match=rf"non-finite.*\(1, 1\).*{text}.*nonfinite="):
        bfp.quantize(x, 2, 8)


@pytest.mark.parametrize("dtype", [F16, F32])
def test_nonfinite_saturate(dtype):
    # floor(log2) of the largest finite value: 65504 -> 15, (2 - 2^-23) * 2^127 -> 127
    e = {F16: 15, F32: 127}[dtype]
    x = np.array([np.nan, np.inf, -np.inf, 1.0, -np.nan, 0.5, 0.25, 0.0], dtype)
    t = bfp.quantize(x, 4, 8, nonfinite="saturate")
    assert t.exponents.tolist() == [e, -1]
    # max finite scaled by 2^(6-e) is in (127.5, 128): rounds to 128, clamped to 127
    assert t.mantissas.tolist() == [0, 127, -127, round(2.0 ** (6 - e)),
                                    0, 64, 32, 0]
    assert t.nonfinite.tolist() == [3, 1]
    assert t.saturations.tolist() == [2, 0]
    y = t.dequantize()
    assert np.isfinite(y).all()


def test_nonfinite_saturate_float64_static():
    x = np.array([np.inf, -np.inf, np.nan, 3.0], F64)
    t = bfp.quantize(x, 4, 4, exponent=1, nonfinite="saturate")
    assert t.mantissas.tolist() == [7, -7, 0, 6]
    assert t.nonfinite.tolist() == [1 + 1 + 1]
    assert t.saturations.tolist() == [2]


# --- bad input -----------------------------------------------------------------------------

@pytest.mark.parametrize("x, exc, pattern", [
    (np.arange(4), TypeError, r"\bx\b.*int64"),
    (np.arange(4, dtype=np.int8), TypeError, r"\bx\b.*int8"),
    (np.array([1.0, "a"], object), TypeError, r"\bx\b.*object"),
    (np.array([True, False]), TypeError, r"\bx\b.*bool"),
    (np.array(1.5, F32), ValueError, r"\bx\b.*at least one axis.*\(\)"),
])
def test_bad_x(x, exc, pattern):
    with pytest.raises(exc, match=pattern):
        bfp.quantize(x, 4, 8)


@pytest.mark.parametrize("kwargs, exc, pattern", [
    (dict(block_size=0), ValueError, r"block_size.*\b0\b"),
    (dict(block_size=-3), ValueError, r"block_size.*-3"),
    (dict(block_size=2.0), TypeError, r"block_size.*2\.0"),
    (dict(mantissa_bits=1), ValueError, r"mantissa_bits.*2 to 16.*\b1\b"),
    (dict(mantissa_bits=17), ValueError, r"mantissa_bits.*2 to 16.*\b17\b"),
    (dict(mantissa_bits=8.0), TypeError, r"mantissa_bits.*8\.0"),
    (dict(mantissa_bits="8"), TypeError, r"mantissa_bits.*'8'"),
    (dict(mantissa_bits=True), TypeError, r"mantissa_bits.*True"),
    (dict(rounding="nearest"), ValueError, r"rounding.*'nearest'"),
    (dict(rounding="NEAREST-EVEN"), ValueError, r"rounding.*'NEAREST-EVEN'"),
    (dict(rounding=None), ValueError, r"rounding.*None"),
    (dict(exponent=128), ValueError, r"exponent.*-127 to 127.*\b128\b"),
    (dict(exponent=-128), ValueError, r"exponent.*-127 to 127.*-128"),
    (dict(exponent=np.array([0, 200])), ValueError, r"exponent.*-127 to 127.*\b200\b"),
    (dict(exponent=np.array([-1000, 5])), ValueError, r"exponent.*-1000"),
    (dict(exponent=1.5), TypeError, r"exponent.*1\.5"),
    (dict(exponent=np.array([1, 2, 3])), ValueError, r"exponent.*\(3,\).*\(2, 2\)"),
    (dict(exponent=np.zeros((3, 2), int)), ValueError, r"exponent.*\(3, 2\).*\(2, 2\)"),
    (dict(nonfinite="clip"), ValueError, r"nonfinite.*'clip'"),
])
def test_bad_arguments_name_argument_and_value(kwargs, exc, pattern):
    args = dict(block_size=4, mantissa_bits=8)
    args.update(kwargs)
    x = np.ones((2, 7), F32)              # 2 blocks of 4 per row -> block shape (2, 2)
    with pytest.raises(exc, match=pattern):
        bfp.quantize(x, **args)


def test_dynamic_exponent_beyond_e8m0_is_rejected():
    with pytest.raises(ValueError, match=r"2\*\*128"):
        bfp.quantize(np.array([2.0 ** 128, 1.0]), 2, 8)
    # 2^128 - tiny still has floor(log2) = 127: accepted
    t = bfp.quantize(np.array([np.finfo(F32).max], F32), 1, 8)
    assert t.exponents.tolist() == [127]


# --- pack / unpack ---------------------------------------------------------------------

@pytest.mark.parametrize("n, m, code, mantissas, expected", [
    # docs 2.8: 0x80 | 3 << 8 | 0xF << 12 | 0 << 16 | 6 << 20 -> 80 F3 60
    (4, 4, 0x80, [3, -1, 0, 6], "80 f3 60"),
    # m = 3: 001 at bits 8..10, 110 at 11..13, 011 at 14..16 -> 0x0F17F; pad bits 17..23
    (3, 3, 0x7F, [1, -2, 3], "7f f1 00"),
    (3, 3, 0x7F, [1, -2, -1], "7f f1 01"),
    # m = 2: fields 01, 11, 00, 01 -> 0b01_00_11_01 = 0x4D
    (4, 2, 0x7F, [1, -1, 0, 1], "7f 4d"),
    # m = 5: -15 -> 10001, 9 -> 01001: 0x10 | 17 << 8 | 9 << 13 = 0x13110; 18 bits
    (2, 5, 0x10, [-15, 9], "10 31 01"),
    # m = 8: one byte each
    (2, 8, 0x00, [-127, 5], "00 81 05"),
    # m = 16: little-endian 16-bit fields
    (2, 16, 0x85, [-2, 300], "85 fe ff 2c 01"),
    # m = 13: 1 at bits 8..20, -1 at 21..33 -> bytes 0..4, 34 bits -> 5 bytes
    (2, 13, 0xFE, [1, -1], "fe 01 e0 ff 03"),
])
def test_pack_known_layout(n, m, code, mantissas, expected):
    t = _tensor([code], mantissas, n, m)
    got = bfp.pack(t)
    assert got.dtype == np.uint8 and got.ndim == 1
    assert got.tobytes() == bytes.fromhex(expected)
    assert pack_reference([code], mantissas, n, m) == bytes.fromhex(expected)
    back = bfp.unpack(bytes.fromhex(expected), (n,), n, m)
    assert back == t
    assert back.exponent_codes.tolist() == [code]


@pytest.mark.parametrize("m", [2, 3, 4, 5, 8, 13, 16])
@pytest.mark.parametrize("n, shape", [(1, (3,)), (3, (2, 7)), (4, (2, 8)), (8, (3, 2, 13)),
                                      (16, (2, 16)), (5, (10,))])
def test_pack_matches_reference_packer(m, n, shape):
    """Fast paths (m = 2, 4, 8, 16 with whole bytes) and the bit path against a reference."""
    rng = np.random.default_rng(m * 1000 + n)
    x = rng.standard_normal(shape) * np.exp2(rng.integers(-20, 20, shape))
    t = bfp.quantize(x.astype(F32), n, m)
    top = (1 << (m - 1)) - 1
    # Use every mantissa value, including both ends: overwrite the real part by random codes.
    mant = t.mantissas.copy()
    logical = mant[..., :shape[-1]]
    logical[...] = rng.integers(-top, top + 1, logical.shape)
    codes = rng.integers(0, 255, t.exponents.shape)     # 0..254, never 0xFF
    t = _tensor(codes, mant, n, m, shape)
    got = bfp.pack(t)
    want = pack_reference(codes, mant, n, m)
    assert got.tobytes() == want
    assert got.size == t.exponents.size * (-(-(8 + n * m) // 8))
    back = bfp.unpack(want, shape, n, m)
    assert back == t
    np.testing.assert_array_equal(back.exponent_codes, codes)
    # bytes, bytearray, memoryview and uint8 arrays are all accepted
    for data in (bytearray(want), memoryview(want), np.frombuffer(want, np.uint8)):
        assert bfp.unpack(data, shape, n, m) == t


def test_pack_blocks_follow_in_c_order():
    codes = np.array([[1, 2], [3, 4]])
    mant = np.array([[1, 2, 3, 4], [5, 6, 7, -7]])
    t = _tensor(codes, mant, 2, 4)
    assert bfp.pack(t).tobytes() == bytes.fromhex("01 21 02 43 03 65 04 97")


def test_pack_rejects_non_tensor():
    with pytest.raises(TypeError, match="BfpTensor.*ndarray"):
        bfp.pack(np.zeros(4, np.uint8))


def _good_block():
    # n = 3, m = 3, shape (2,): mantissas 1, -2 and a zero in the logical padding
    return bytes.fromhex("7f 31 00"), (2,), 3, 3


@pytest.mark.parametrize("mutate, exc, pattern", [
    (lambda b: b + b"\x00", ValueError, r"4 bytes.*needs 3"),
    (lambda b: b[:-1], ValueError, r"2 bytes.*needs 3"),
    (lambda b: b"\xff" + b[1:], ValueError, r"0xFF"),
    # mantissa 0 = 100 (binary) = -4 = -2^(m-1)
    (lambda b: bytes([b[0], (b[1] & ~0x07) | 0x04, b[2]]), ValueError, r"-4"),
    # a pad bit (bit 17..23 of the block, i.e. bits 1..7 of byte 2)
    (lambda b: bytes([b[0], b[1], b[2] | 0x80]), ValueError, r"padding bits"),
    (lambda b: bytes([b[0], b[1], b[2] | 0x02]), ValueError, r"padding bits"),
    # mantissa 2 (bits 14..16) is in the logical padding past shape (2,): must be zero
    (lambda b: bytes([b[0], b[1] | 0xC0, b[2]]), ValueError, r"zero padding"),
    (lambda b: bytes([b[0], b[1] | 0x40, b[2] | 0x01]), ValueError, r"zero padding"),
])
@pytest.mark.parametrize("container", ["bytes", "bytearray", "ndarray"])
def test_unpack_rejects_and_leaves_buffer_unchanged(mutate, exc, pattern, container):
    good, shape, n, m = _good_block()
    assert bfp.unpack(good, shape, n, m).mantissas.tolist() == [1, -2, 0]
    bad = mutate(good)
    data = {"bytes": bytes, "bytearray": bytearray,
            "ndarray": lambda b: np.frombuffer(b, np.uint8).copy()}[container](bad)
    before = bytes(data)
    with pytest.raises(exc, match=pattern):
        bfp.unpack(data, shape, n, m)
    assert bytes(data) == before


@pytest.mark.parametrize("m", [4, 8, 16])
def test_unpack_rejects_most_negative_mantissa_fast_paths(m):
    t = _tensor([127], [1, 2, 3, 4], 4, m)
    raw = bytearray(bfp.pack(t).tobytes())
    # set mantissa 2 to -2^(m-1) with the reference packer
    bad = bytearray(pack_reference([127], [1, 2, 0, 4], 4, m))
    word = int.from_bytes(bad, "little") | (1 << (8 + 2 * m + m - 1))
    bad = bytearray(word.to_bytes(len(bad), "little"))
    before = bytes(bad)
    with pytest.raises(ValueError, match=rf"mantissa -{1 << (m - 1)}\b"):
        bfp.unpack(bad, (4,), 4, m)
    assert bytes(bad) == before
    assert bfp.unpack(raw, (4,), 4, m) == t


def test_unpack_rejects_0xff_in_a_later_block_and_names_it():
    t = _tensor([1, 2, 3], np.zeros(6, int), 2, 8, (6,))
    raw = bfp.pack(t).copy()
    raw[2 * 3] = 0xFF                 # block 2's code
    before = raw.copy()
    with pytest.raises(ValueError, match=r"block 2 .*0xFF"):
        bfp.unpack(raw, (6,), 2, 8)
    np.testing.assert_array_equal(raw, before)


@pytest.mark.parametrize("data", [[0x7F, 0x31, 0x00], "7f3100", np.array([0x7F, 0x31, 0], np.int16),
                                  None, 3])
def test_unpack_rejects_non_bytes(data):
    with pytest.raises(TypeError, match=r"data must be bytes"):
        bfp.unpack(data, (2,), 3, 3)


def test_unpack_bad_widths_and_shape():
    good, shape, n, m = _good_block()
    with pytest.raises(ValueError, match=r"block_size.*\b0\b"):
        bfp.unpack(good, shape, 0, m)
    with pytest.raises(ValueError, match=r"mantissa_bits.*\b17\b"):
        bfp.unpack(good, shape, n, 17)
    with pytest.raises(ValueError, match=r"shape"):
        bfp.unpack(good, (), n, m)
    with pytest.raises(ValueError, match=r"shape"):
        bfp.unpack(good, (-1, 2), n, m)


def test_unpack_returns_zero_counters_and_shape():
    good, shape, n, m = _good_block()
    t = bfp.unpack(good, 2, n, m)
    assert t.shape == (2,)
    assert t.saturations.tolist() == [0] and t.nonfinite.tolist() == [0]
    # code 0x7F (e = 0), m = 3: step 2^(0-1) = 0.5
    assert t.dequantize().tolist() == [0.5, -1.0]


# --- tiling --------------------------------------------------------------------------------

def test_split_matrix_known_case():
    w = np.arange(1, 16).reshape(3, 5)
    tiles = bfp.split_matrix(w, 2)
    assert tiles.shape == (2, 3, 2, 2)
    assert tiles[0, 0].tolist() == [[1, 2], [6, 7]]
    assert tiles[0, 2].tolist() == [[5, 0], [10, 0]]
    assert tiles[1, 1].tolist() == [[13, 14], [0, 0]]
    assert tiles[1, 2].tolist() == [[15, 0], [0, 0]]
    assert tiles.dtype == w.dtype
    np.testing.assert_array_equal(bfp.merge_matrix(tiles, (3, 5)), w)
    # exact fit: no padding
    w = np.arange(16.0).reshape(4, 4)
    tiles = bfp.split_matrix(w, 4)
    assert tiles.shape == (1, 1, 4, 4)
    np.testing.assert_array_equal(tiles[0, 0], w)
    np.testing.assert_array_equal(bfp.merge_matrix(tiles, w.shape), w)


def test_split_vector_known_case():
    x = np.array([1, 2, 3, 4, 5])
    assert bfp.split_vector(x, 2).tolist() == [[1, 2], [3, 4], [5, 0]]
    assert bfp.merge_vector(bfp.split_vector(x, 2), 5).tolist() == [1, 2, 3, 4, 5]
    xb = np.arange(1, 7).reshape(2, 3)
    tiles = bfp.split_vector(xb, 2)
    assert tiles.tolist() == [[[1, 2], [3, 0]], [[4, 5], [6, 0]]]
    assert bfp.merge_vector(tiles, 3).tolist() == xb.tolist()
    assert bfp.split_vector(np.zeros(0), 4).shape == (0, 4)
    assert bfp.merge_vector(np.zeros((0, 4)), 0).shape == (0,)


@pytest.mark.parametrize("call, exc, pattern", [
    (lambda: bfp.split_matrix(np.ones((2, 2)), 0), ValueError, r"\bn\b.*\b0\b"),
    (lambda: bfp.split_matrix(np.ones((2, 2)), 2.0), TypeError, r"\bn\b.*2\.0"),
    (lambda: bfp.split_matrix(np.ones(4), 2), ValueError, r"\bw\b.*2-D.*\(4,\)"),
    (lambda: bfp.split_matrix(np.ones((2, 2, 2)), 2), ValueError, r"\bw\b.*\(2, 2, 2\)"),
    (lambda: bfp.merge_matrix(np.ones((2, 3, 2, 2)), (3, 7)), ValueError,
     r"\(3, 7\).*2 x 4.*2 x 3"),
    (lambda: bfp.merge_matrix(np.ones((2, 3, 2, 2)), (5, 6)), ValueError, r"\(5, 6\)"),
    (lambda: bfp.merge_matrix(np.ones((2, 3, 2)), (3, 5)), ValueError, r"tiles.*\(2, 3, 2\)"),
    (lambda: bfp.merge_matrix(np.ones((1, 1, 2, 3)), (2, 3)), ValueError,
     r"tiles.*\(1, 1, 2, 3\)"),
    (lambda: bfp.split_vector(np.float32(1), 2), ValueError, r"\bx\b.*axis"),
    (lambda: bfp.split_vector(np.ones(3), 0), ValueError, r"\bn\b.*\b0\b"),
    (lambda: bfp.merge_vector(np.ones((3, 2)), 7), ValueError, r"length 7.*4.*\b3\b"),
    (lambda: bfp.merge_vector(np.ones((3, 2)), 4), ValueError, r"length 4.*2.*\b3\b"),
    (lambda: bfp.merge_vector(np.ones((3, 2)), -1), ValueError, r"length.*-1"),
    (lambda: bfp.merge_vector(np.ones(3), 3), ValueError, r"tiles.*\(3,\)"),
])
def test_tiling_errors(call, exc, pattern):
    with pytest.raises(exc, match=pattern):
        call()
