"""Block floating point (BFP) tensors: quantize, dequantize, pack, unpack, tile.

A BFP block is ``block_size`` values that share one exponent ``e``; value ``i`` is the
``m``-bit two's complement integer ``q[i]`` (``m = mantissa_bits``) scaled by
``2**(e - (m - 2))``, and ``|q[i]| <= 2**(m-1) - 1`` (symmetric clamp). The exact rules
are in ``docs/numerics.md``; with ``block_size=32, mantissa_bits=8,
rounding="nearest-away"`` a block is an OCP MXINT8 block.

Everything here is vectorized over whole tensors; no Python loop runs per element or
per block.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from host.numerics import _ckernel
from host.spec.formats import (
    E8M0_BIAS,
    E8M0_NAN,
    EXP_MAX,
    EXP_MIN,
    MANTISSA_BITS_MAX,
    MANTISSA_BITS_MIN,
    ZERO_BLOCK_EXP,
    Rounding,
    block_bits,
    block_bytes,
    check_int,
    mantissa_max,
)

__all__ = [
    "BfpTensor",
    "kernel",
    "merge_matrix",
    "merge_vector",
    "pack",
    "quantize",
    "split_matrix",
    "split_vector",
    "unpack",
]

_FLOAT_DTYPES = (np.float16, np.float32, np.float64)


@dataclass(frozen=True, eq=False)
class BfpTensor:
    """A tensor in BFP form, blocked along its last axis.

    Attributes
    ----------
    exponents : numpy.ndarray of int16, shape ``(..., nblocks)``
        Unbiased shared exponents, each in ``[-127, 127]``.
    mantissas : numpy.ndarray of int16, shape ``(..., nblocks * block_size)``
        Signed mantissas, zero in the padding past the original last axis.
    block_size, mantissa_bits : int
    shape : tuple of int
        Shape of the original (unpadded) tensor.
    saturations : numpy.ndarray of int64, shape ``(..., nblocks)``
        Per block, how many values were clamped to ``+-(2**(m-1) - 1)``.
    nonfinite : numpy.ndarray of int64, shape ``(..., nblocks)``
        Per block, how many inputs were inf or NaN (only with ``nonfinite="saturate"``).
    """
    exponents: np.ndarray
    mantissas: np.ndarray
    block_size: int
    mantissa_bits: int
    shape: tuple
    saturations: np.ndarray = field(repr=False)
    nonfinite: np.ndarray = field(repr=False)

    @property
    def nblocks(self) -> int:
        """Blocks along the last axis."""
        return self.exponents.shape[-1]

    @property
    def exponent_codes(self) -> np.ndarray:
        """Biased E8M0 codes (``uint8``) of the exponents."""
        return (self.exponents + E8M0_BIAS).astype(np.uint8)

    @property
    def saturation_count(self) -> int:
        """Total number of clamped values."""
        return int(self.saturations.sum())

    def dequantize(self) -> np.ndarray:
        """The represented values as ``float32`` in the original shape (exact)."""
        scale = np.repeat(self.exponents.astype(np.int32) - (self.mantissa_bits - 2),
                          self.block_size, axis=-1)
        values = np.ldexp(self.mantissas.astype(np.float32), scale)
        return values[..., :self.shape[-1]] if self.shape else values.reshape(())

    def __eq__(self, other):
        if not isinstance(other, BfpTensor):
            return NotImplemented
        return (self.block_size == other.block_size
                and self.mantissa_bits == other.mantissa_bits
                and tuple(self.shape) == tuple(other.shape)
                and np.array_equal(self.exponents, other.exponents)
                and np.array_equal(self.mantissas, other.mantissas))


def _check_float_array(name, x):
    x = np.asarray(x)
    if x.dtype.type not in _FLOAT_DTYPES:
        raise TypeError(f"{name} must be a float16, float32 or float64 array, not {x.dtype}")
    if x.ndim == 0:
        raise ValueError(f"{name} must have at least one axis, not shape {x.shape}")
    return x


def _round_to_int(v: np.ndarray, rounding: Rounding) -> np.ndarray:
    """Round finite floats to the nearest integer, exactly, in their own dtype."""
    if rounding is Rounding.NEAREST_EVEN:
        return np.rint(v)
    whole = np.trunc(v)
    # v - trunc(v) is exact in binary floating point, so the tie test is exact.
    return whole + np.copysign(np.abs(v - whole) >= 0.5, v)


def _quantize_reference(x, block_size: int, mantissa_bits: int, rounding="nearest-even",
                        exponent=None, *, nonfinite: str = "error") -> BfpTensor:
    """Reference form of :func:`quantize`: the same arguments, results and errors.

    Whole-array NumPy, kept unchanged as the oracle of the fast form (and used by it for
    float64 input and for raising errors).
    """
    x = _check_float_array("x", x)
    n = check_int("block_size", block_size, 1)
    m = check_int("mantissa_bits", mantissa_bits, MANTISSA_BITS_MIN, MANTISSA_BITS_MAX)
    rounding = Rounding.parse(rounding)
    if nonfinite not in ("error", "saturate"):
        raise ValueError(f"nonfinite must be 'error' or 'saturate', not {nonfinite!r}")

    # Half precision is widened (exactly) so that scaling by 2**k cannot overflow early.
    work = x.astype(np.float32) if x.dtype == np.float16 else x
    bad = ~np.isfinite(work)
    if bad.any():
        if nonfinite == "error":
            where = tuple(int(i) for i in np.argwhere(bad)[0])
            raise ValueError(f"x has {int(bad.sum())} non-finite values (first at index "
                             f"{where}: {x[where]!r}); pass nonfinite='saturate' to clamp them")
        # float64 beyond float32's range has no E8M0 scale, so infinities stop there.
        big = np.finfo(np.float32 if x.dtype == np.float64 else x.dtype).max
        work = np.where(np.isnan(work), 0, np.clip(work, -big, big)).astype(work.dtype)

    length = x.shape[-1]
    nblocks = -(-length // n)
    pad = nblocks * n - length
    if pad:
        work = np.concatenate([work, np.zeros(x.shape[:-1] + (pad,), work.dtype)], axis=-1)
    blocks = work.reshape(x.shape[:-1] + (nblocks, n))

    if exponent is None:
        exps = _dynamic_exponents(blocks)
    else:
        exps = np.asarray(exponent)
        if not np.issubdtype(exps.dtype, np.integer):
            raise TypeError(f"exponent must be an integer or integer array, not {exponent!r}")
        if exps.size and (exps.min() < EXP_MIN or exps.max() > EXP_MAX):
            raise ValueError(f"exponent must be from {EXP_MIN} to {EXP_MAX}, not "
                             f"{exps.min() if exps.min() < EXP_MIN else exps.max()}")
        try:
            exps = np.broadcast_to(exps, blocks.shape[:-1]).astype(np.int32)
        except ValueError:
            raise ValueError(f"exponent of shape {np.shape(exponent)} does not broadcast to "
                             f"the block shape {blocks.shape[:-1]}") from None

    # Scaling by a power of two is exact (ldexp), so the rounding below sees exact values;
    # both roundings are symmetric, so signed values are rounded directly.
    top = mantissa_max(m)
    with np.errstate(over="ignore"):        # static exponents may scale far past the top
        scaled = np.ldexp(blocks, (m - 2 - exps)[..., None])
    # Everything beyond 2**m saturates; clipping there keeps inf out of the rounding.
    limit = scaled.dtype.type(2.0 ** m)
    np.clip(scaled, -limit, limit, out=scaled)
    rounded = _round_to_int(scaled, rounding)
    clamped = np.abs(rounded) > top
    q = np.clip(rounded, -top, top).astype(np.int16)
    saturations = (clamped.sum(axis=-1, dtype=np.int64) if clamped.any()
                   else np.zeros(blocks.shape[:-1], np.int64))
    nonfinite = (_count_per_block(bad, n, nblocks) if bad.any()
                 else np.zeros(blocks.shape[:-1], np.int64))
    return BfpTensor(
        exponents=exps.astype(np.int16),
        mantissas=q.reshape(x.shape[:-1] + (nblocks * n,)),
        block_size=n, mantissa_bits=m, shape=tuple(x.shape),
        saturations=saturations, nonfinite=nonfinite,
    )


def _block_max(a: np.ndarray) -> np.ndarray:
    """Maximum over the last axis by pairwise folding (much faster than a short-axis
    reduction for the small block sizes used here)."""
    while a.shape[-1] > 1:
        half = a.shape[-1] // 2
        folded = np.maximum(a[..., :half], a[..., half:2 * half])
        if a.shape[-1] % 2:
            folded[..., 0] = np.maximum(folded[..., 0], a[..., -1])
        a = folded
    return a[..., 0]


def _dynamic_exponents(blocks: np.ndarray) -> np.ndarray:
    """``floor(log2(max |x|))`` per block, clamped below at -127; -127 for all-zero blocks.

    Raises ``ValueError`` when a block maximum is 2**128 or more (float64 input only).
    """
    if blocks.dtype == np.float32:
        # The biased FP32 exponent field is the E8M0 code itself: a normal 2**e has
        # field e + 127, and zeros and subnormals (below 2**-126) have field 0, which is
        # exactly the clamp to -127. The block maximum of the fields is the block's code.
        fields = ((blocks.view(np.uint32) >> 23) & 0xFF).astype(np.uint8)
        return _block_max(fields).astype(np.int32) - E8M0_BIAS
    amax = _block_max(np.abs(blocks))
    # frexp is exact: amax = f * 2**p with f in [0.5, 1), so floor(log2(amax)) = p - 1.
    exps = np.frexp(amax)[1].astype(np.int32) - 1
    exps = np.where(amax == 0, ZERO_BLOCK_EXP, np.maximum(exps, EXP_MIN))
    if (exps > EXP_MAX).any():
        raise ValueError(f"x has values of magnitude >= 2**{EXP_MAX + 1}, beyond the "
                         f"largest E8M0 scale")
    return exps


def _count_per_block(mask: np.ndarray, n: int, nblocks: int) -> np.ndarray:
    pad = nblocks * n - mask.shape[-1]
    if pad:
        mask = np.concatenate([mask, np.zeros(mask.shape[:-1] + (pad,), bool)], axis=-1)
    return mask.reshape(mask.shape[:-1] + (nblocks, n)).sum(axis=-1, dtype=np.int64)


# --- fast host path ----------------------------------------------------------------------
#
# quantize() and pack() give exactly the results of _quantize_reference() and
# _pack_reference() (tests/numerics/test_bfp_fast.py and test_bfp_ckernel.py compare them
# bit for bit) at several times their speed.
#
# For float32/float16 input they run the compiled C kernel (_bfp_kernel.c, built and loaded
# by _ckernel.py; its top comment says why it is exact), unpack() too; kernel() says
# whether it is in use. Without it (no gcc, a failed build, NPU_HOST_KERNEL=numpy) the
# NumPy forms below run, with plain NumPy:
#
# * The tensor is processed in chunks of about _CHUNK elements, so that every temporary
#   stays in the CPU cache and memory is read once and written once.
# * A chunk is transposed to (block_size, blocks): the block maxima are then one
#   reduction along the outer axis and the per-block scale broadcasts along the rows,
#   both long contiguous loops instead of one short loop per block.
# * The block maximum is taken on the FP32 bit patterns with the sign cleared (their order
#   is that of |x|); its exponent field is the E8M0 code, as in the reference.
# * Scaling and rounding are one addition: with k = m - 2 - e, the sum x + 1.5 * 2**(23-k)
#   is rounded by the FPU to a multiple of 2**-k, ties to even, i.e. it is
#   rint(x * 2**k) * 2**-k + 1.5 * 2**(23-k) exactly, as long as |x * 2**k| < 2**22, and
#   the low 16 bits of its bit pattern are rint(x * 2**k) in two's complement (the magic
#   number has zero low bits). Ties away from zero are fixed up afterwards.
# * Blocks in which a value rounds past the largest mantissa (the saturating blocks, found
#   exactly from the block maximum) and blocks whose magic number would not be a finite
#   float32 go through the reference arithmetic, row by row of those blocks only.
# * float64 input, and nonfinite values, take the reference path (the latter only after
#   the inputs are cleaned, as the reference does).

_CHUNK = 1 << 17            # elements per chunk: 512 KiB of float32, temporaries in L2
_MAGIC_K_MIN = -104         # smallest k for which 1.5 * 2**(23 - k) is a finite float32


def quantize(x, block_size: int, mantissa_bits: int, rounding="nearest-even",
             exponent=None, *, nonfinite: str = "error") -> BfpTensor:
    """Quantize a float array to BFP, blocking along the last axis.

    Parameters
    ----------
    x : array of float16, float32 or float64, at least 1-D
        The last axis is split into blocks of ``block_size`` (zero padded at its end).
    block_size : int, >= 1
    mantissa_bits : int, 2..16
    rounding : ``"nearest-even"`` (default) or ``"nearest-away"`` (OCP MX), or a
        :class:`~host.spec.formats.Rounding`.
    exponent : None, int, or int array broadcastable to ``(..., nblocks)``
        ``None`` selects the dynamic exponent ``floor(log2(max |x|))`` per block (an
        all-zero block gets -127). Otherwise the static exponent(s), each in
        ``[-127, 127]``; values out of range saturate and are counted.
    nonfinite : ``"error"`` (default) or ``"saturate"``
        With ``"saturate"``, NaN becomes 0 and +-inf the largest finite value of ``x``'s
        dtype (of float32 for float64 input, since larger values have no E8M0 scale)
        before quantizing (the device rule for FP16), and each is counted.

    Returns
    -------
    BfpTensor

    float32 and float16 input goes through the compiled C kernel when it is available
    (:func:`kernel`), other input and the errors through NumPy; the results are the same.

    Raises
    ------
    TypeError
        ``x`` is not a float array, or a width is not an integer.
    ValueError
        a width, ``rounding``, ``exponent`` or ``nonfinite`` is out of range; ``x`` has
        inf/NaN and ``nonfinite="error"``; a dynamic exponent would exceed 127.
    """
    x = _check_float_array("x", x)
    n = check_int("block_size", block_size, 1)
    m = check_int("mantissa_bits", mantissa_bits, MANTISSA_BITS_MIN, MANTISSA_BITS_MAX)
    rounding = Rounding.parse(rounding)
    if nonfinite not in ("error", "saturate"):
        raise ValueError(f"nonfinite must be 'error' or 'saturate', not {nonfinite!r}")
    if x.dtype == np.float64:
        return _quantize_reference(x, n, m, rounding, exponent, nonfinite=nonfinite)

    lead, length = x.shape[:-1], x.shape[-1]
    nblocks = -(-length // n)
    exps = None
    if exponent is not None:
        exps = np.asarray(exponent)
        valid = (np.issubdtype(exps.dtype, np.integer)
                 and not (exps.size and (exps.min() < EXP_MIN or exps.max() > EXP_MAX)))
        if valid:
            try:
                exps = np.broadcast_to(exps, lead + (nblocks,)).astype(np.int32).reshape(-1)
            except ValueError:
                valid = False
        if not valid:       # the reference raises the right error (inf/NaN come first)
            return _quantize_reference(x, n, m, rounding, exponent, nonfinite=nonfinite)

    blocks, lib = _blocks_kernel()
    result = blocks(x, n, m, rounding, exps, nblocks, lib)
    nonfinite_counts = None
    if result is None:                          # x has inf or NaN
        if nonfinite == "error":
            return _quantize_reference(x, n, m, rounding, exponent, nonfinite=nonfinite)
        # As in the reference: NaN -> 0, +-inf -> the largest finite value of x's dtype.
        work = x.astype(np.float32) if x.dtype == np.float16 else x
        bad = ~np.isfinite(work)
        big = np.finfo(x.dtype).max
        work = np.where(np.isnan(work), 0, np.clip(work, -big, big)).astype(work.dtype)
        result = blocks(work, n, m, rounding, exps, nblocks, lib)
        nonfinite_counts = _count_per_block(bad, n, nblocks)
    exponents, q, saturations = result
    if nonfinite_counts is None:
        nonfinite_counts = np.zeros(lead + (nblocks,), np.int64)
    return BfpTensor(
        exponents=exponents.reshape(lead + (nblocks,)),
        mantissas=q.reshape(lead + (nblocks * n,)),
        block_size=n, mantissa_bits=m, shape=tuple(x.shape),
        saturations=saturations.reshape(lead + (nblocks,)), nonfinite=nonfinite_counts,
    )


def kernel() -> _ckernel.KernelStatus:
    """Which kernel :func:`quantize` (of float32/float16 input), :func:`pack` and
    :func:`unpack` use: ``("c", "compiled kernel <path>")`` or ``("numpy", why not C)``.

    The C kernel (``host/numerics/_bfp_kernel.c``) is compiled with gcc on first use and
    cached (``$NPU_KERNEL_CACHE``, else ``$XDG_CACHE_HOME/bfp-npu`` or
    ``~/.cache/bfp-npu``); ``NPU_HOST_KERNEL=numpy`` forces the NumPy path, and
    ``NPU_HOST_KERNEL=c`` makes a failed build an error. Both give identical results.
    """
    return _ckernel.status()


def _blocks_kernel():
    """``(quantize, library)``: :func:`_quantize_c` and the compiled kernel when it is
    built, else :func:`_quantize_numpy` and None."""
    lib = _ckernel.library()
    return (_quantize_numpy, None) if lib is None else (_quantize_c, lib)


def _numpy_blocks_kernel():
    """:func:`_blocks_kernel` without the compiled kernel: what an exported layer
    bundles in its place (it imports only NumPy, ``host.compiler.export``)."""
    return _quantize_numpy, None


def _quantize_numpy(x, n, m, rounding, exps, nblocks, lib=None):
    """The NumPy fast path: see :func:`_quantize_blocks`."""
    return _quantize_blocks(_padded_blocks(x, n, nblocks), n, m, rounding, exps)


def _quantize_c(x, n, m, rounding, exps, nblocks, lib):
    """The C kernel (``bfp_quantize_f32``) on float32/float16 ``x``: exponents (int16),
    mantissas (int16, blocks x n) and saturation counts (int64); None if ``x`` has an inf
    or NaN. ``exps`` is None (dynamic) or the int32 exponents, one per block, validated."""
    work = np.ascontiguousarray(x, dtype=np.float32)    # a copy only if needed (or float16)
    length = work.shape[-1]
    rows = math.prod(work.shape[:-1])
    count = rows * nblocks
    exponents = np.empty(count, np.int16)
    q = np.empty((count, n), np.int16)
    saturations = np.zeros(count, np.int64)     # the kernel writes only non-zero counts
    if count == 0:
        return exponents, q, saturations
    exps_ptr = None
    if exps is not None:
        exps = np.ascontiguousarray(exps, dtype=np.int32)
        if exps.shape != (count,):
            raise ValueError(f"internal: {exps.shape} static exponents for {count} blocks")
        exps_ptr = exps.ctypes.data
    rc = lib.bfp_quantize_f32(work.ctypes.data, rows, length, n, m,
                              int(rounding is Rounding.NEAREST_AWAY), exps_ptr,
                              exponents.ctypes.data, q.ctypes.data, saturations.ctypes.data)
    if rc == _ckernel.NONFINITE:
        return None
    if rc != _ckernel.OK:
        raise _ckernel.KernelError(f"bfp_quantize_f32 failed: {_ckernel.error_message(rc)} "
                                   f"(shape {x.shape}, block_size={n}, mantissa_bits={m})")
    return exponents, q, saturations


def _padded_blocks(x: np.ndarray, n: int, nblocks: int) -> np.ndarray:
    """``x`` as ``(blocks, n)`` rows, the last axis zero padded to whole blocks."""
    length = x.shape[-1]
    if nblocks * n != length:
        padded = np.zeros(x.shape[:-1] + (nblocks * n,), x.dtype)
        padded[..., :length] = x
        x = padded
    return x.reshape(-1, n)


def _code_tables(m: int):
    """Per E8M0 code c (exponent e = c - 127, k = m - 2 - e): the magic number
    1.5 * 2**(23-k), the bit pattern of the magnitude (top + 1/2) * 2**-k from which a
    value saturates (compared as uint32 with the bits of |x|, so NaN counts as large), the
    clamp top * 2**-k and half a unit 2**-(k+1), all float32 and exact. Codes whose magic
    number is not a finite float32 (k < -104), and 0xFF (inf/NaN), get threshold 0, so
    their blocks always go the slow way."""
    top = mantissa_max(m)
    k = (m - 2 + E8M0_BIAS) - np.arange(256)
    kk = np.maximum(k, _MAGIC_K_MIN)
    unit = np.ldexp(np.float32(1), -kk)                     # 2**-k, 2**-141 .. 2**104
    magic = np.ldexp(np.float32(1.5), 23 - kk)
    threshold = np.where(k < _MAGIC_K_MIN, np.float32(0), unit * np.float32(top + 0.5))
    threshold[E8M0_NAN] = 0
    return (magic.astype(np.float32), threshold.astype(np.float32).view(np.uint32),
            (unit * np.float32(top)).astype(np.float32), (unit * np.float32(0.5)).astype(np.float32),
            k < _MAGIC_K_MIN)


def _quantize_blocks(src: np.ndarray, n: int, m: int, rounding: Rounding, exps):
    """Quantize the float32/float16 rows ``src`` (blocks, n): exponents (int16), mantissas
    (int16, blocks x n) and saturation counts (int64); None if ``src`` has an inf or NaN.
    ``exps`` is None (dynamic) or the int32 exponents, one per block."""
    count = src.shape[0]
    magic_of, threshold_of, clamp_of, half_of, slow_k_of = _code_tables(m)
    top = mantissa_max(m)
    int16_clamp = exps is None and m < 16
    exponents = np.empty(count, np.int16)
    q = np.empty((count, n), np.int16)
    saturations = np.zeros(count, np.int64)
    away = rounding is Rounding.NEAREST_AWAY
    low = 0 if np.little_endian else 1      # the int16 half holding the low bits
    step = max(1, min(count, _CHUNK // n))
    xt_buf = np.empty((n, step), np.float32)
    bits_buf = np.empty((n, step), np.uint32)
    over_buf = np.empty((n, step), np.bool_)
    count_dtype = np.uint8 if n < 256 else np.uint16 if n < 65536 else np.intp
    static_codes = None if exps is None else (exps + E8M0_BIAS).astype(np.intp)
    for b0 in range(0, count, step):
        b1 = min(count, b0 + step)
        chunk = src[b0:b1]
        xt = xt_buf[:, :b1 - b0]                # transposed: row j = value j of each block
        np.copyto(xt, chunk.T)
        bits = np.bitwise_and(xt.view(np.uint32), 0x7FFFFFFF, out=bits_buf[:, :b1 - b0])
        amax_bits = np.maximum.reduce(bits, axis=0)     # the bits of max |x| of each block
        if amax_bits.max() >= 0x7F800000:
            return None
        if static_codes is None:
            codes = (amax_bits >> 23).astype(np.intp)
        else:
            codes = static_codes[b0:b1]
        np.subtract(codes, E8M0_BIAS, out=exponents[b0:b1], casting="unsafe")
        threshold = np.take(threshold_of, codes)
        slow = amax_bits >= threshold
        any_slow = slow.any()
        if any_slow:
            # Saturating blocks: count |x| >= (top + 1/2) * 2**-k, then clamp to
            # +-top * 2**-k before rounding (rounding commutes with clamping to integers).
            # With the dynamic exponent |x| < 2**(e+1), so |x * 2**k| < 2**(m-1): the
            # rounding gives at most top + 1 (an int16 below 16 bits), and the clamp is
            # done on the int16 mantissas instead (half the bytes, in their final layout).
            over = np.greater_equal(bits, threshold, out=over_buf[:, :b1 - b0])
            saturations[b0:b1] = np.add.reduce(over.view(np.uint8), axis=0, dtype=count_dtype)
            if not int16_clamp:
                clamp = np.take(clamp_of, codes)
                np.minimum(xt, clamp, out=xt)
                np.maximum(xt, -clamp, out=xt)
        magic = np.take(magic_of, codes)
        # (Blocks without a finite magic number may overflow here; they are redone below.)
        with np.errstate(over="ignore", invalid="ignore"):
            if away:
                t = xt + magic
                d = xt - (t - magic)            # exact: x minus its even rounding
                # A tie rounded towards zero: d is half a unit with the sign of x, and
                # 2d the missing unit away from zero.
                tie = d == np.copysign(np.take(half_of, codes), xt)
                np.add(t, d + d, out=t, where=tie)
            else:
                t = np.add(xt, magic, out=xt)
        q[b0:b1] = t.view(np.int16)[:, low::2].T
        if any_slow and int16_clamp:
            np.clip(q[b0:b1], -top, top, out=q[b0:b1])
        if any_slow:
            rare = np.flatnonzero(slow & np.take(slow_k_of, codes))
            if rare.size:                       # no finite magic number: the reference
                exact = _quantize_rows(chunk[rare].astype(np.float32),
                                       (m - 2 + E8M0_BIAS) - codes[rare], m, rounding)
                q[b0 + rare], saturations[b0 + rare] = exact
    return exponents, q, saturations


def _quantize_rows(blocks: np.ndarray, k: np.ndarray, m: int, rounding: Rounding):
    """The reference arithmetic for some blocks: mantissas and saturation counts."""
    top = mantissa_max(m)
    with np.errstate(over="ignore"):
        scaled = np.ldexp(blocks, k[:, None])
    limit = scaled.dtype.type(2.0 ** m)
    np.clip(scaled, -limit, limit, out=scaled)
    rounded = _round_to_int(scaled, rounding)
    clamped = np.abs(rounded) > top
    return (np.clip(rounded, -top, top).astype(np.int16),
            clamped.sum(axis=-1, dtype=np.int64))


# --- device byte layout --------------------------------------------------------------

def _pack_fields(codes: np.ndarray, q: np.ndarray, n: int, m: int) -> np.ndarray:
    """Pack ``codes`` (B,) and mantissas (B, n) into (B, block_bytes) little-endian rows."""
    nbytes = block_bytes(n, m)
    mask = (1 << m) - 1
    if m in (2, 4, 8, 16) and (n * m) % 8 == 0:
        # Whole mantissas per byte (or bytes per mantissa): no bit-level shuffling.
        u = (q.astype(np.int32) & mask).astype(np.uint16)
        if m == 16:
            body = u.astype("<u2").view(np.uint8).reshape(len(codes), 2 * n)
        elif m == 8:
            body = u.astype(np.uint8)
        else:
            per = 8 // m
            u = u.astype(np.uint8).reshape(len(codes), n // per, per)
            body = np.zeros(u.shape[:2], np.uint8)
            for j in range(per):            # per <= 4 lanes of one byte, not per element
                body |= u[:, :, j] << (j * m)
        return np.concatenate([codes[:, None], body], axis=1)
    # General widths: expand to bits, then pack again.
    u = (q.astype(np.int32) & mask).astype("<u2").view(np.uint8)
    bits = np.unpackbits(u.reshape(len(codes), n, 2), axis=-1, bitorder="little")[..., :m]
    code_bits = np.unpackbits(codes[:, None], axis=-1, bitorder="little")
    pad = np.zeros((len(codes), nbytes * 8 - block_bits(n, m)), np.uint8)
    allbits = np.concatenate([code_bits, bits.reshape(len(codes), n * m), pad], axis=1)
    return np.packbits(allbits, axis=-1, bitorder="little")


def _unpack_fields(rows: np.ndarray, n: int, m: int) -> tuple[np.ndarray, np.ndarray]:
    """Inverse of :func:`_pack_fields`: (B, block_bytes) -> codes (B,), mantissas (B, n)."""
    codes = rows[:, 0]
    if m in (2, 4, 8, 16) and (n * m) % 8 == 0:
        body = rows[:, 1:]
        if m == 16:
            u = body.reshape(-1).view("<u2").reshape(len(rows), n).astype(np.int32)
        elif m == 8:
            u = body.astype(np.int32)
        else:
            per = 8 // m
            u = np.stack([(body >> (j * m)) & ((1 << m) - 1) for j in range(per)], axis=-1)
            u = u.reshape(len(rows), n).astype(np.int32)
    else:
        allbits = np.unpackbits(rows, axis=-1, bitorder="little")
        bits = allbits[:, 8:8 + n * m].reshape(len(rows), n, m)
        u = (bits.astype(np.int32) << np.arange(m, dtype=np.int32)).sum(axis=-1)
    q = np.where(u >= (1 << (m - 1)), u - (1 << m), u).astype(np.int16)
    return codes, q


def _pack_reference(t: BfpTensor) -> np.ndarray:
    """Reference form of :func:`pack`, field by field at the bit level: the widths the
    fast form does not take go here, and the tests hold the fast form to it."""
    if not isinstance(t, BfpTensor):
        raise TypeError(f"pack expects a BfpTensor, not {type(t).__name__}")
    n, m = t.block_size, t.mantissa_bits
    codes = t.exponent_codes.reshape(-1)
    q = t.mantissas.reshape(-1, n)
    return _pack_fields(codes, q, n, m).reshape(-1)


def pack(t: BfpTensor) -> np.ndarray:
    """Pack a :class:`BfpTensor` into the device byte layout.

    Each block becomes ``block_bytes(block_size, mantissa_bits)`` bytes: the E8M0 code,
    then the mantissas as ``m``-bit two's complement fields, least significant bit first,
    zero padded to a whole byte (the bits of :func:`host.spec.formats.block_layout`). Blocks
    follow one another in C order of ``t.exponents``. Runs the compiled C kernel when it is
    available (:func:`kernel`), else NumPy; the bytes are the same.

    Returns
    -------
    numpy.ndarray of uint8, 1-D
    """
    if not isinstance(t, BfpTensor):
        raise TypeError(f"pack expects a BfpTensor, not {type(t).__name__}")
    n, m = t.block_size, t.mantissa_bits
    lib = _ckernel.library()
    if (lib is not None and t.mantissas.dtype.kind in "iu"
            and t.exponents.dtype.kind in "iu"):
        return _pack_c(t, lib)
    if (m not in (2, 4, 8, 16) or (n * m) % 8 or not np.little_endian
            or t.mantissas.dtype.kind not in "iu"):
        return _pack_reference(t)           # general widths: the bit-level reference
    codes = t.exponent_codes.reshape(-1)
    # The low m bits of each mantissa are its field; a cast to int16 keeps them.
    q = np.ascontiguousarray(t.mantissas.reshape(-1, n)).astype(np.int16, copy=False)
    count, body = len(codes), block_bytes(n, m) - 1
    out = np.empty((count, body + 1), np.uint8)
    out[:, 0] = codes
    # Each block's body as one opaque item: one long copy loop instead of one per block.
    dest = out[:, 1:].view(f"V{body}")[:, 0]
    if m == 16:
        dest[:] = q.view(f"V{body}")[:, 0]
        return out.reshape(-1)
    if m == 8:
        words, mask, shifts = q, 0xFF, ()
    elif m == 4:        # 2 mantissas per uint32 word; their low 4 bits to its low byte
        words, mask, shifts = q.view(np.uint32), 0x000F000F, (12,)
    else:               # 4 mantissas per uint64 word; their low 2 bits to its low byte
        words, mask, shifts = q.view(np.uint64), 0x0003000300030003, (14, 28, 42)
    step = max(1, min(count, _CHUNK // n))
    packed = np.empty((step, body), np.uint8)
    for b0 in range(0, count, step):
        b1 = min(count, b0 + step)
        w = words[b0:b1]
        if shifts:
            w = np.bitwise_and(w, words.dtype.type(mask))
            acc = w.copy()
            for s in shifts:
                acc |= w >> words.dtype.type(s)
            w = acc
        np.copyto(packed[:b1 - b0], w, casting="unsafe")       # the low byte of each word
        dest[b0:b1] = packed[:b1 - b0].view(f"V{body}")[:, 0]
    return out.reshape(-1)


def _pack_c(t: BfpTensor, lib) -> np.ndarray:
    """:func:`pack` by the C kernel (``bfp_pack``), any width and block size."""
    n, m = t.block_size, t.mantissa_bits
    # The E8M0 code is the low 8 bits of e + 127, and a field the low m bits of its
    # mantissa: casts to int16 keep both (as exponent_codes and the reference do).
    exps = np.ascontiguousarray(t.exponents, dtype=np.int16).reshape(-1)
    q = np.ascontiguousarray(t.mantissas, dtype=np.int16).reshape(-1)
    count = exps.size
    if q.size != count * n:
        raise ValueError(f"mantissas of shape {t.mantissas.shape} do not fill {count} blocks "
                         f"of {n}")
    out = np.empty(count * block_bytes(n, m), np.uint8)
    if count:
        rc = lib.bfp_pack(exps.ctypes.data, q.ctypes.data, count, n, m, out.ctypes.data)
        if rc != _ckernel.OK:
            raise _ckernel.KernelError(f"bfp_pack failed: {_ckernel.error_message(rc)} "
                                       f"(block_size={n}, mantissa_bits={m})")
    return out


def unpack(data, shape, block_size: int, mantissa_bits: int) -> BfpTensor:
    """Read a tensor of the given (unpadded) ``shape`` back from :func:`pack`'s bytes.

    Raises
    ------
    TypeError
        ``data`` is not bytes-like or a uint8 array.
    ValueError
        the length does not match ``shape``; an exponent code is 0xFF (reserved); a
        mantissa is ``-2**(m-1)``, which the symmetric clamp never produces; a padding
        bit or a mantissa in the zero padding is not zero.
    """
    n = check_int("block_size", block_size, 1)
    m = check_int("mantissa_bits", mantissa_bits, MANTISSA_BITS_MIN, MANTISSA_BITS_MAX)
    if isinstance(data, (bytes, bytearray, memoryview)):
        buf = np.frombuffer(data, np.uint8)
    elif isinstance(data, np.ndarray) and data.dtype == np.uint8:
        buf = data.reshape(-1)
    else:
        raise TypeError(f"data must be bytes or a uint8 array, not {type(data).__name__}")
    shape = tuple(int(s) for s in np.atleast_1d(shape)) if np.ndim(shape) else (int(shape),)
    if not shape or min(shape) < 0:
        raise ValueError(f"shape must have at least one axis and no negative size, not {shape}")
    nblocks = -(-shape[-1] // n)
    lead = shape[:-1]
    count = int(np.prod(lead, dtype=np.int64)) * nblocks
    nbytes = block_bytes(n, m)
    if buf.size != count * nbytes:
        raise ValueError(f"data has {buf.size} bytes; shape {shape} with block_size={n}, "
                         f"mantissa_bits={m} needs {count * nbytes}")
    lib = _ckernel.library()
    if lib is not None:
        exponents, q, bad = _unpack_c(buf, count, n, m, lib)
        for kind, i in enumerate(bad):
            if i >= 0:
                raise ValueError(_unpack_error(kind, i, m))
    else:
        rows = buf.reshape(count, nbytes)
        codes, q = _unpack_fields(rows, n, m)
        if (codes == E8M0_NAN).any():
            raise ValueError(_unpack_error(0, int(np.argmax(codes == E8M0_NAN)), m))
        lowest = -(1 << (m - 1))
        if (q == lowest).any():
            raise ValueError(_unpack_error(1, int(np.argwhere(q == lowest)[0][0]), m))
        spare = nbytes * 8 - block_bits(n, m)
        if spare and (rows[:, -1] >> (8 - spare)).any():
            # The first such block (argmax of the padding values would give the largest).
            padded = (rows[:, -1] >> (8 - spare)) != 0
            raise ValueError(_unpack_error(2, int(np.argmax(padded)), m))
        exponents = codes.astype(np.int16) - E8M0_BIAS
    mant = q.reshape(lead + (nblocks * n,))
    if (mant[..., shape[-1]:] != 0).any():
        raise ValueError("a mantissa in the zero padding past the last axis is not zero")
    zeros = np.zeros(lead + (nblocks,), np.int64)
    return BfpTensor(
        exponents=exponents.reshape(lead + (nblocks,)),
        mantissas=mant, block_size=n, mantissa_bits=m, shape=shape,
        saturations=zeros, nonfinite=zeros.copy(),
    )


def _unpack_error(kind: int, block: int, m: int) -> str:
    """The message of :func:`unpack`'s check ``kind`` (in the order they are made: 0 the
    reserved code, 1 the mantissa -2**(m-1), 2 padding bits) failing first at ``block``."""
    if kind == 0:
        return f"block {block} has the reserved exponent code 0xFF"
    if kind == 1:
        return (f"block {block} has mantissa {-(1 << (m - 1))}, outside the symmetric range "
                f"+-{mantissa_max(m)}")
    return f"block {block} has non-zero padding bits"


def _unpack_c(buf: np.ndarray, count: int, n: int, m: int, lib):
    """The C kernel's unpack (``bfp_unpack``) of ``count`` blocks: exponents (int16),
    mantissas (int16, count x n) and the first block with each error (see :func:`unpack`)."""
    buf = np.ascontiguousarray(buf)
    exponents = np.empty(count, np.int16)
    q = np.empty((count, n), np.int16)
    bad = np.full(3, -1, np.int64)
    if count:
        rc = lib.bfp_unpack(buf.ctypes.data, count, n, m, exponents.ctypes.data,
                            q.ctypes.data, bad.ctypes.data)
        if rc != _ckernel.OK:
            raise _ckernel.KernelError(f"bfp_unpack failed: {_ckernel.error_message(rc)} "
                                       f"(block_size={n}, mantissa_bits={m})")
    return exponents, q, [int(i) for i in bad]


# --- native tiles ----------------------------------------------------------------------

def _check_native(n):
    return check_int("n", n, 1)


def split_matrix(w, n: int) -> np.ndarray:
    """Split a logical ``(rows, cols)`` matrix into native ``n x n`` tiles.

    Returns an array of shape ``(R, C, n, n)`` with ``R = ceil(rows/n)``,
    ``C = ceil(cols/n)``; tile ``[r, c]`` holds rows ``r*n..`` and columns ``c*n..``,
    zero padded past the logical edges.
    """
    n = _check_native(n)
    w = np.asarray(w)
    if w.ndim != 2:
        raise ValueError(f"w must be 2-D (rows, cols), not shape {w.shape}")
    rows, cols = w.shape
    big_r, big_c = -(-rows // n), -(-cols // n)
    padded = np.zeros((big_r * n, big_c * n), w.dtype)
    padded[:rows, :cols] = w
    return padded.reshape(big_r, n, big_c, n).swapaxes(1, 2)


def merge_matrix(tiles, shape) -> np.ndarray:
    """Inverse of :func:`split_matrix`: tiles ``(R, C, n, n)`` back to ``shape``.

    Raises ``ValueError`` when the tile grid does not fit ``shape``.
    """
    tiles = np.asarray(tiles)
    if tiles.ndim != 4 or tiles.shape[2] != tiles.shape[3]:
        raise ValueError(f"tiles must have shape (R, C, n, n), not {tiles.shape}")
    big_r, big_c, n, _ = tiles.shape
    rows, cols = (int(s) for s in shape)
    if -(-rows // n) != big_r or -(-cols // n) != big_c:
        raise ValueError(f"shape {tuple(shape)} needs {-(-rows // n)} x {-(-cols // n)} tiles "
                         f"of {n} x {n}, not {big_r} x {big_c}")
    return tiles.swapaxes(1, 2).reshape(big_r * n, big_c * n)[:rows, :cols]


def split_vector(x, n: int) -> np.ndarray:
    """Split ``(..., length)`` into native vectors ``(..., ceil(length/n), n)``, zero padded."""
    n = _check_native(n)
    x = np.asarray(x)
    if x.ndim == 0:
        raise ValueError("x must have at least one axis")
    length = x.shape[-1]
    count = -(-length // n)
    padded = np.zeros(x.shape[:-1] + (count * n,), x.dtype)
    padded[..., :length] = x
    return padded.reshape(x.shape[:-1] + (count, n))


def merge_vector(tiles, length: int) -> np.ndarray:
    """Inverse of :func:`split_vector`: ``(..., V, n)`` back to ``(..., length)``."""
    tiles = np.asarray(tiles)
    if tiles.ndim < 2:
        raise ValueError(f"tiles must have shape (..., V, n), not {tiles.shape}")
    count, n = tiles.shape[-2:]
    length = check_int("length", length, 0)
    if -(-length // n) != count:
        raise ValueError(f"length {length} needs {-(-length // n)} native vectors of {n}, "
                         f"not {count}")
    return tiles.reshape(tiles.shape[:-2] + (count * n,))[..., :length]
