"""The compiled host BFP kernel (``host/numerics/_bfp_kernel.c``) against the reference.

``bfp.quantize`` and ``bfp.pack`` run the C kernel for float32/float16 input when it
builds; ``bfp._quantize_reference`` and ``bfp._pack_reference`` (whole-array NumPy) are
the oracles. Every field must be identical: exponents, mantissas, saturation and nonfinite
counts, and the packed bytes.

gcc is part of every machine of this project, so the kernel must build here: the tests
force it (``NPU_HOST_KERNEL=c``), and a failed build fails them with the compiler's
message instead of skipping.
"""

import numpy as np
import pytest
from bfp_cases import F16, F32, ROUNDINGS, assert_nonfinite_same, assert_same, mixed, same_array

from host.numerics import _ckernel, bfp
from host.numerics.bfp import BfpTensor
from host.spec.formats import mantissa_max

WIDTHS = range(2, 17)
BLOCKS = bfp._quantize_blocks       # the NumPy fast path (the fixture below replaces it)


@pytest.fixture(autouse=True)
def c_kernel(monkeypatch):
    """Force the C kernel, and fail if the NumPy fast path is used instead."""
    monkeypatch.setenv(_ckernel.ENV_KERNEL, "c")

    def numpy_path(*args, **kwargs):
        raise AssertionError("the NumPy fast path ran instead of the C kernel")

    monkeypatch.setattr(bfp, "_quantize_blocks", numpy_path)
    status = bfp.kernel()
    assert status.name == "c", f"the C kernel did not build: {status.reason}"


# --- the kernel in use --------------------------------------------------------------------

def test_kernel_is_c():
    status = bfp.kernel()
    assert status == ("c", status.reason) and status.reason.startswith("compiled kernel ")
    assert _ckernel.library() is not None


def test_numpy_kernel_forced(monkeypatch):
    rng = np.random.default_rng(1)
    x = mixed(rng, (3, 70))
    expected = {(m, r): assert_same(x, 16, m, r) for m in (3, 4, 8) for r in ROUNDINGS}
    monkeypatch.setenv(_ckernel.ENV_KERNEL, "numpy")
    assert bfp.kernel() == ("numpy", "NPU_HOST_KERNEL=numpy")
    assert _ckernel.library() is None
    calls = []

    def numpy_path(*args):
        calls.append(args)
        return BLOCKS(*args)

    monkeypatch.setattr(bfp, "_quantize_blocks", numpy_path)
    for (m, r), c_result in expected.items():
        got = bfp.quantize(x, 16, m, r)
        assert got == c_result
        same_array(got.saturations, c_result.saturations, "saturations")
        same_array(bfp.pack(got), bfp.pack(c_result), "packed bytes")
    assert len(calls) == len(expected)
    # The NumPy path (the fallback) against the reference over the widths, too.
    for m in WIDTHS:
        for n in (1, 3, 16, 33):
            assert_same(mixed(rng, (2, 3 * n + 1), spread=4), n, m, ROUNDINGS[m % 2])
    assert len(calls) > len(expected)


# --- quantize: random data --------------------------------------------------------------

@pytest.mark.parametrize("shape", [(1,), (37,), (3, 50), (2, 3, 41), (2, 2, 64), (0, 5),
                                   (4, 0)])
@pytest.mark.parametrize("n", [1, 3, 16, 32])
def test_random_shapes(shape, n):
    rng = np.random.default_rng(sum(shape) * 100 + n)
    x = mixed(rng, shape)
    for m in WIDTHS:
        assert_same(x, n, m, ROUNDINGS[m % 2])
    for rounding in ROUNDINGS:
        assert_same(x, n, 4, rounding)
        assert_same(x, n, 8, rounding)


@pytest.mark.parametrize("m", WIDTHS)
@pytest.mark.parametrize("rounding", ROUNDINGS)
def test_widths_and_block_sizes(m, rounding):
    rng = np.random.default_rng(m)
    for n in (1, 2, 3, 8, 16, 32, 33):
        assert_same(mixed(rng, (3, 5 * n + 2)), n, m, rounding)
        assert_same(mixed(rng, (2, 40), spread=3), n, m, rounding)       # a narrow range: ties


def test_large_array_with_padding():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((7, 20001)).astype(F32)
    for n, m, rounding in [(16, 4, "nearest-even"), (32, 8, "nearest-away"), (3, 11, "nearest-even")]:
        assert_same(x, n, m, rounding)


def test_non_contiguous_input():
    rng = np.random.default_rng(3)
    x = mixed(rng, (40, 30))
    assert_same(x.T, 16, 8)
    assert_same(x[::2, 1::3], 3, 5, "nearest-away")
    assert_same(x[:, ::-1], 32, 4)


def test_float16_input():
    rng = np.random.default_rng(16)
    x = mixed(rng, (4, 61), F16, spread=8)
    # Every finite FP16 pattern, in blocks of 16 (both signs, subnormals, 65504).
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    every = bits[(bits & 0x7C00) != 0x7C00].view(F16)
    for m in WIDTHS:
        for rounding in ROUNDINGS:
            assert_same(x, 16, m, rounding)
            assert_same(x, 3, m, rounding, exponent=rng.integers(-30, 20, (4, 21)))
        assert_same(every, 16, m, ROUNDINGS[m % 2])


# --- quantize: directed cases -------------------------------------------------------------

def test_zeros_and_negative_zeros():
    for x in (np.zeros((3, 40), F32), np.full((2, 17), -0.0, F32),
              np.array([0.0, -0.0, 0.0, 1.0, -0.0, 0.0, 0.0, 0.0], F32)):
        for m in WIDTHS:
            for rounding in ROUNDINGS:
                assert_same(x, 4, m, rounding)
                assert_same(x, 4, m, rounding, exponent=-127)
                assert_same(x, 4, m, rounding, exponent=127)


def test_subnormals_and_extremes():
    tiny = float(np.finfo(F32).smallest_subnormal)
    big = float(np.finfo(F32).max)
    x = np.array([
        [tiny, -tiny, 3 * tiny, 0.0],                       # subnormal only: e = -127
        [2.0 ** -126, -(2.0 ** -127), 2.0 ** -149, 0.0],    # smallest normal
        [big, -big, 1.0, 0.0],                              # e = 127, exact (double) path
        [2.0 ** 127, 2.0 ** 106, -(2.0 ** 105), 2.0 ** 104],
        [2.0 ** 103, -(2.0 ** 102), 1.0, 2.0 ** -100],
        [np.nextafter(F32(2.0 ** 127), F32(0)), 1.5, -1.5, 0.0],
    ], F32)
    for m in WIDTHS:
        for rounding in ROUNDINGS:
            for n in (1, 2, 4):
                assert_same(x, n, m, rounding)


def test_ties_at_every_position():
    """Blocks of exponent e whose values are all ties, (r + 1/2) units with r = 0..top
    (r = top: the tie top + 1/2 that saturates), but for one 2**e, at every position."""
    rng = np.random.default_rng(11)
    for m in WIDTHS:
        top = mantissa_max(m)
        for n in (1, 3, 16, 32):
            blocks = []
            for e in (-127, -126, -100, -3, 0, 5, 100, 104, 105, 120, 127):
                unit = 2.0 ** (e - (m - 2))
                r = rng.integers(0, top + 1, (n, n))
                r[:, 0] = top                          # the saturating tie in every block
                r[:, 1 % n] = 0                        # and the smallest one
                vals = (r + 0.5) * unit * rng.choice([-1.0, 1.0], (n, n))
                for p in range(n):                      # 2**e at position p
                    vals[p, p] = 2.0 ** e * rng.choice([-1.0, 1.0])
                blocks.append(vals)
            x = np.concatenate(blocks).astype(F32)
            assert np.isfinite(x).all()
            for rounding in ROUNDINGS:
                assert_same(x, n, m, rounding)


def test_saturation_boundary():
    """Values just below, at and just above (top + 1/2) * 2**-k, with static exponents
    over the whole range (the threshold as a float32 for every exponent) and dynamic ones."""
    for m in WIDTHS:
        top = mantissa_max(m)
        rows = []
        for e in range(-127, 128):
            t = F32((top + 0.5) * 2.0 ** (e - (m - 2)))
            if not np.isfinite(t):
                continue
            lo, hi = np.nextafter(t, F32(0)), np.nextafter(t, F32(np.inf))
            rows.append((e, np.array([t, lo, hi, -t, -lo, -hi, top * 2.0 ** (e - (m - 2)), 0],
                                     F32)))
        x = np.stack([r for _, r in rows])
        static = np.array([e for e, _ in rows])[:, None]
        for rounding in ROUNDINGS:
            got = assert_same(x, 8, m, rounding, exponent=static)
            assert (got.saturations[:, 0] == 4).all()           # t, hi, -t, -hi
            assert_same(x, 8, m, rounding)
            assert_same(x, 3, m, rounding, exponent=np.repeat(static, 3, axis=1))


@pytest.mark.parametrize("m", [2, 4, 5, 8, 16])
def test_static_exponents(m):
    rng = np.random.default_rng(m)
    x = mixed(rng, (4, 48), spread=20)
    x[1] *= 1e30                                        # huge values: deep saturation
    for rounding in ROUNDINGS:
        for e in (-127, -126, -100, -20, -3, 0, 1, 5, 20, 100, 103, 104, 105, 110, 127):
            assert_same(x, 16, m, rounding, exponent=e)
        assert_same(x, 16, m, rounding, exponent=rng.integers(-127, 128, (4, 3)))
        assert_same(x, 5, m, rounding, exponent=rng.integers(-127, 128, (4, 10)).astype(np.int8))
        assert_same(x, 16, m, rounding, exponent=np.uint8(3))
        assert_same(x, 16, m, rounding, exponent=rng.integers(-5, 5, (3,)))


def test_static_exponent_errors():
    x = np.ones((4, 48), F32)
    for exponent in (128, -128, 1.5, np.zeros((5,), int), np.array([True])):
        assert_same(x, 16, 4, exponent=exponent)


@pytest.mark.parametrize("dtype", [F16, F32])
@pytest.mark.parametrize("mode", ["error", "saturate"])
def test_nonfinite(dtype, mode):
    assert_nonfinite_same(dtype, mode)
    assert_same(np.array([np.inf] + [0.0] * 31, dtype), 32, 8, "nearest-away", nonfinite=mode)


# --- pack ----------------------------------------------------------------------------------

@pytest.mark.parametrize("m", WIDTHS)
def test_pack_any_mantissas(m):
    rng = np.random.default_rng(m)
    top = mantissa_max(m)
    for n in (1, 2, 3, 4, 7, 8, 16, 32, 33):
        for dtype in (np.int16, np.int32, np.int64):
            q = rng.integers(-top - 1, top + 1, (3, 5, 2 * n)).astype(dtype)
            exps = rng.integers(-127, 128, (3, 5, 2)).astype(dtype)
            zeros = np.zeros(exps.shape, np.int64)
            t = BfpTensor(exps, q, n, m, (3, 5, 2 * n), zeros, zeros)
            same_array(bfp.pack(t), bfp._pack_reference(t), f"packed bytes (n={n}, {dtype})")
        edges = np.array([[top, -top, -top - 1, 0, 1, -1] * n], np.int16)[:, :2 * n]
        t = BfpTensor(np.array([[-127, 127]], np.int16), edges, n, m, edges.shape,
                      np.zeros((1, 2), np.int64), np.zeros((1, 2), np.int64))
        same_array(bfp.pack(t), bfp._pack_reference(t), f"packed bytes (edges, n={n})")


def test_pack_empty_and_non_contiguous():
    n, m = 16, 4
    empty = BfpTensor(np.zeros((0, 2), np.int16), np.zeros((0, 2 * n), np.int16), n, m,
                      (0, 2 * n), np.zeros((0, 2), np.int64), np.zeros((0, 2), np.int64))
    same_array(bfp.pack(empty), bfp._pack_reference(empty), "packed bytes (empty)")
    rng = np.random.default_rng(2)
    q = rng.integers(-7, 8, (2 * n, 6)).astype(np.int16).T       # (6, 32), not contiguous
    e = rng.integers(-20, 20, (2, 6)).astype(np.int16).T
    t = BfpTensor(e, q, n, m, q.shape, np.zeros(e.shape, np.int64), np.zeros(e.shape, np.int64))
    same_array(bfp.pack(t), bfp._pack_reference(t), "packed bytes (transposed)")


# --- unpack --------------------------------------------------------------------------------

def _unpack_outcome(monkeypatch, kernel, *args):
    """unpack with the given kernel: the tensor, or the error's type and message."""
    with monkeypatch.context() as mp:
        mp.setenv(_ckernel.ENV_KERNEL, kernel)
        try:
            return bfp.unpack(*args)
        except (TypeError, ValueError) as exc:
            return type(exc), str(exc)


@pytest.mark.parametrize("m", WIDTHS)
def test_unpack(m, monkeypatch):
    """Round trips, and corrupted bytes (a code 0xFF, a mantissa -2**(m-1), padding bits,
    mantissas in the logical padding, often several at once): the C unpack gives the
    NumPy unpack's tensor, or its error with the same first block."""
    rng = np.random.default_rng(100 + m)
    for n in (1, 3, 4, 16, 32, 33):
        shape = (2, 3, 2 * n + 1)
        t = bfp.quantize(mixed(rng, shape), n, m)
        data = bfp.pack(t)
        for kernel in ("c", "numpy"):
            got = _unpack_outcome(monkeypatch, kernel, data, shape, n, m)
            assert isinstance(got, BfpTensor) and got == t
            same_array(got.exponents, t.exponents, f"exponents ({kernel})")
        nbytes = len(data) // t.exponents.size
        for trial in range(12):
            bad = data.copy()
            for _ in range(rng.integers(1, 4)):
                i = rng.integers(0, len(bad))
                bad[i] = rng.choice([0xFF, 0x80, 0x01, rng.integers(0, 256)])
            if trial % 3 == 0:                          # the last byte of a block
                bad[nbytes * rng.integers(1, t.exponents.size + 1) - 1] |= 0x80
            c = _unpack_outcome(monkeypatch, "c", bad, shape, n, m)
            ref = _unpack_outcome(monkeypatch, "numpy", bad, shape, n, m)
            if isinstance(ref, BfpTensor):
                assert isinstance(c, BfpTensor) and c == ref, (n, trial)
                same_array(c.exponents, ref.exponents, "exponents")
            else:
                assert c == ref, (n, trial)


# --- C error codes become exceptions ---------------------------------------------------------

def test_kernel_errors_are_raised():
    lib = _ckernel.library()
    x = np.ones((2, 32), F32)
    with pytest.raises(_ckernel.KernelError, match="static exponent is outside"):
        bfp._quantize_c(x, 16, 4, bfp.Rounding.NEAREST_EVEN, np.array([0, 1, 200, 0]), 2, lib)
    with pytest.raises(_ckernel.KernelError, match="size or width is out of range"):
        bfp._quantize_c(x, 16, 17, bfp.Rounding.NEAREST_EVEN, None, 2, lib)
    bad = BfpTensor(np.zeros(2, np.int16), np.zeros(32, np.int16), 16, 1, (32,),
                    np.zeros(2, np.int64), np.zeros(2, np.int64))
    with pytest.raises(_ckernel.KernelError, match="bfp_pack failed: a size or width"):
        bfp._pack_c(bad, lib)


# --- the loader ------------------------------------------------------------------------------

def test_build_into_cache(monkeypatch, tmp_path):
    monkeypatch.setenv(_ckernel.ENV_CACHE, str(tmp_path / "cache"))
    monkeypatch.setattr(_ckernel, "_built", None)
    status = _ckernel.status()
    assert status.name == "c", status.reason
    built = sorted(p.name for p in (tmp_path / "cache").iterdir())
    assert len(built) == 1 and built[0].startswith("bfp_kernel-") and built[0].endswith(".so")
    assert str(tmp_path / "cache" / built[0]) in status.reason
    assert_same(np.linspace(-3, 3, 50, dtype=F32), 16, 4)


def test_failed_build_falls_back(monkeypatch, tmp_path):
    broken = tmp_path / "_bfp_kernel.c"
    broken.write_text("int bfp_kernel_version(void) { return 1 }\n")
    monkeypatch.setattr(_ckernel, "SOURCE", broken)
    monkeypatch.setenv(_ckernel.ENV_CACHE, str(tmp_path / "cache"))
    monkeypatch.setattr(_ckernel, "_built", None)
    monkeypatch.setattr(bfp, "_quantize_blocks", BLOCKS)
    with pytest.raises(_ckernel.KernelError, match="NPU_HOST_KERNEL=c but the C kernel"):
        bfp.quantize(np.ones(4, F32), 4, 4)
    monkeypatch.delenv(_ckernel.ENV_KERNEL)
    status = bfp.kernel()
    assert status.name == "numpy" and "failed" in status.reason and "error" in status.reason
    assert list((tmp_path / "cache").iterdir()) == []          # no half-written file left
    x = np.linspace(-3, 3, 50, dtype=F32)
    assert bfp.quantize(x, 16, 4) == bfp._quantize_reference(x, 16, 4)


def test_cache_dir(monkeypatch, tmp_path):
    env = {"HOME": str(tmp_path)}
    assert _ckernel.cache_dir(env) == tmp_path / ".cache" / "bfp-npu"
    env["XDG_CACHE_HOME"] = str(tmp_path / "xdg")
    assert _ckernel.cache_dir(env) == tmp_path / "xdg" / "bfp-npu"
    env[_ckernel.ENV_CACHE] = str(tmp_path / "mine")
    assert _ckernel.cache_dir(env) == tmp_path / "mine"
