"""Calibration of BFP exponents: the exponent searches of seeds 002 and 000.

Pure functions on NumPy arrays; nothing here touches a device or an image. The rules,
search ranges and tie breaks are in ``docs/calibration.md``; in short:

* :func:`weight_exponents` (seed 002, weights): per block, the shared exponent that
  minimises the block's squared quantization error (with the device's rounding and
  saturating clamp), searched from one above the max-based exponent
  ``floor(log2(max |w|))`` down to three below; ties go to the larger exponent.
  :func:`calibrated_weights` quantizes with those exponents (raw MRF-ready blocks).
* :func:`activation_exponent` (seed 002, activations): the one static exponent of a
  layer input that minimises the total squared error over a calibration set, compared
  with the dynamic (max-based) quantizer's error. :func:`activation_offset` is the seed's
  offset (mean of the per-sample minima), :func:`fold_offset` its bias folding.
* :func:`scale_until` (seed 000): the overflow-driven range-scaling loop, device-agnostic:
  raise an exponent offset while a device's event count exceeds a threshold.

Errors are computed in float64 from the exact dequantized values (``q * 2**(e - (m-2))``),
so a candidate's error is exact up to the float64 rounding of the sum.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from host.numerics import bfp
from host.spec.formats import (
    E8M0_BIAS,
    EXP_MAX,
    EXP_MIN,
    MVM_EXP_MAX,
    ZERO_BLOCK_EXP,
    Rounding,
    check_int,
)

__all__ = [
    "ACTIVATION_ABOVE",
    "ACTIVATION_BELOW",
    "WEIGHT_SEARCH",
    "ActivationCalibration",
    "ScaleResult",
    "activation_centre",
    "activation_exponent",
    "activation_offset",
    "calibrated_weights",
    "fold_offset",
    "scale_until",
    "weight_exponents",
]

#: Weight search: shifts of the max-based exponent, from +1 (rounding past the top code)
#: down to -3 (clipping the largest values), ``docs/calibration.md`` section 2.
WEIGHT_SEARCH = (+1, -3)
#: Activation search: from ``ACTIVATION_ABOVE`` above the largest per-sample dynamic
#: exponent down to ``ACTIVATION_BELOW`` below the smallest one.
ACTIVATION_ABOVE = 1
ACTIVATION_BELOW = 3


# --- shared helpers ------------------------------------------------------------------------

def _as_floats(name: str, x) -> np.ndarray:
    x = np.asarray(x)
    if x.dtype.type not in (np.float16, np.float32, np.float64):
        raise TypeError(f"{name} must be a float16, float32 or float64 array, not {x.dtype}")
    if x.ndim == 0:
        raise ValueError(f"{name} must have at least one axis, not shape {x.shape}")
    return x


def _padded_blocks(x: np.ndarray, n: int) -> np.ndarray:
    """``x`` as float64 blocks ``(..., nblocks, n)``, zero padded like ``bfp.quantize``."""
    length = x.shape[-1]
    nblocks = -(-length // n)
    out = np.zeros(x.shape[:-1] + (nblocks * n,), np.float64)
    out[..., :length] = x
    return out.reshape(x.shape[:-1] + (nblocks, n))


def _block_sq_error(blocks: np.ndarray, t: bfp.BfpTensor) -> np.ndarray:
    """Squared error per block ``(..., nblocks)`` of ``t`` against the float64 ``blocks``.

    The padding contributes nothing (zero input, zero mantissa)."""
    m = t.mantissa_bits
    q = t.mantissas.reshape(blocks.shape).astype(np.float64)
    values = np.ldexp(q, (t.exponents.astype(np.int32) - (m - 2))[..., None])
    d = blocks - values
    return (d * d).sum(axis=-1)


def _int(name: str, value) -> int:
    """``value`` as an int (any sign); ``TypeError`` for anything else, bool included."""
    return check_int(name, value, -(1 << 63))


def _check_max_exponent(max_exponent) -> int:
    return check_int("max_exponent", max_exponent, EXP_MIN, EXP_MAX)


# --- weights (seed 002) ----------------------------------------------------------------------

def _check_search(search) -> tuple[int, int]:
    try:
        hi, lo = search
    except (TypeError, ValueError):
        raise ValueError(f"search must be a pair (highest shift, lowest shift), "
                         f"not {search!r}") from None
    hi, lo = _int("search[0]", hi), _int("search[1]", lo)
    if hi < lo:
        raise ValueError(f"search must go down: (highest, lowest) shift, not {search!r}")
    return hi, lo


def _weight_search(w, block_size, mantissa_bits, rounding, search, max_exponent):
    """The search itself: (chosen exponents, their errors, the max-based errors)."""
    w = _as_floats("w", w)
    n = check_int("block_size", block_size, 1)
    m = check_int("mantissa_bits", mantissa_bits, 2, 16)
    rounding = Rounding.parse(rounding)
    hi, lo = _check_search(search)
    top = _check_max_exponent(max_exponent)
    dynamic = bfp.quantize(w, n, m, rounding)           # raises on inf/NaN, as it should
    base = dynamic.exponents.astype(np.int32)           # floor(log2(max |block|))
    blocks = _padded_blocks(w, n)
    best_e = best_err = None
    for shift in range(hi, lo - 1, -1):                 # largest exponent first
        e = np.clip(base + shift, EXP_MIN, top)
        err = _block_sq_error(blocks, bfp.quantize(w, n, m, rounding, exponent=e))
        if best_e is None:
            best_e, best_err = e, err
        else:
            better = err < best_err                     # ties keep the larger exponent
            best_e = np.where(better, e, best_e)
            best_err = np.where(better, err, best_err)
    zero = ~(blocks != 0).any(axis=-1)
    best_e = np.where(zero, ZERO_BLOCK_EXP, best_e)     # all-zero blocks: as the device
    max_based_err = _block_sq_error(blocks, dynamic)
    return best_e.astype(np.int16), best_err, max_based_err


def weight_exponents(w, block_size: int, mantissa_bits: int, rounding="nearest-even",
                     search=WEIGHT_SEARCH, *, max_exponent: int = MVM_EXP_MAX) -> np.ndarray:
    """Per block, the shared exponent with the least squared quantization error.

    Parameters
    ----------
    w : float16/float32/float64 array, at least 1-D
        Blocked along the last axis exactly as :func:`host.numerics.bfp.quantize` blocks
        it (``block_size`` values per block, the last block zero padded). For MRF words
        pass the FP16 weights the device would quantize, one logical matrix
        ``(rows, cols)`` with ``block_size = N``: a block is then one tile row.
    block_size : int >= 1
    mantissa_bits : int 2..16
    rounding : ``"nearest-even"`` or ``"nearest-away"`` (or a ``Rounding``)
    search : (highest, lowest) shift, default ``(+1, -3)``
        Candidates are ``e0 + s`` for ``s = highest, highest - 1, ..., lowest`` with ``e0``
        the max-based (dynamic) exponent ``floor(log2(max |block|))``.
    max_exponent : int, default 15 (``MVM_EXP_MAX``)
        Candidates are clipped to ``[-127, max_exponent]``: the MVM rejects weight blocks
        with exponents above 15.

    Returns
    -------
    int16 array ``(..., nblocks)``
        The exponent of least squared error per block (quantizing with the device's
        rounding and saturating clamp, ``docs/numerics.md`` 2.3-2.4). Ties go to the
        larger exponent. All-zero blocks get -127, as in dynamic mode.

    Raises
    ------
    TypeError, ValueError
        a bad argument, or non-finite weights (as ``bfp.quantize`` raises them).
    """
    return _weight_search(w, block_size, mantissa_bits, rounding, search, max_exponent)[0]


def calibrated_weights(w, block_size: int, mantissa_bits: int, rounding="nearest-even",
                       search=WEIGHT_SEARCH, *, max_exponent: int = MVM_EXP_MAX
                       ) -> bfp.BfpTensor:
    """``w`` quantized with the exponents of :func:`weight_exponents`.

    The raw BFP blocks (exponent codes and mantissas) to write as MRF words instead of
    quantizing the weights on chip: ``bfp.pack`` of a block is the MRF word's bit layout
    (``docs/numerics.md`` 2.8). ``saturations`` counts the values the chosen exponents
    clip. Arguments as :func:`weight_exponents`.
    """
    e = weight_exponents(w, block_size, mantissa_bits, rounding, search,
                         max_exponent=max_exponent)
    return bfp.quantize(w, block_size, mantissa_bits, rounding, exponent=e)


# --- activations (seed 002) ------------------------------------------------------------------

class ActivationCalibration(NamedTuple):
    """The result of :func:`activation_exponent`.

    exponent : int
        The best static exponent (unbiased; the device's ``Q_EXPONENT`` register takes
        :attr:`exponent_code`).
    mse_static : float
        Mean squared error per element over the calibration set with that exponent.
    mse_dynamic : float
        The same with the dynamic (max-based, per native vector) exponent.
    choice : ``"static"`` or ``"dynamic"``
        ``"static"`` only when ``mse_static < mse_dynamic`` (a tie keeps the dynamic
        quantizer, which cannot saturate on inputs larger than the calibration set's).
    """
    exponent: int
    mse_static: float
    mse_dynamic: float
    choice: str

    @property
    def exponent_code(self) -> int:
        """The E8M0 code of :attr:`exponent`, the value for ``s_wr Q_EXPONENT``."""
        return self.exponent + E8M0_BIAS


def _as_samples(samples) -> np.ndarray:
    x = _as_floats("samples", samples)
    if x.ndim < 2:
        raise ValueError(f"samples must be (samples, ..., features), at least 2-D, not "
                         f"shape {x.shape}")
    if x.shape[0] == 0 or x.shape[-1] == 0:
        raise ValueError(f"samples of shape {x.shape} hold no values")
    if not np.isfinite(x).all():
        raise ValueError("samples hold inf or NaN values; calibrate on finite data")
    return x


def activation_exponent(samples, block_size: int, mantissa_bits: int,
                        rounding="nearest-even", candidates=None, *,
                        max_exponent: int = MVM_EXP_MAX) -> ActivationCalibration:
    """The static input exponent of one layer with the least error over a calibration set.

    Parameters
    ----------
    samples : float array ``(S, ..., features)``
        What the layer's input quantizer sees, one calibration sample per index of the
        first axis (FP16 values for the device); every row along the last axis is one
        logical input vector, quantized per native vector of ``block_size`` (zero padded).
        Middle axes (time steps of a sequence, say) are more vectors of the same sample.
    block_size : int, the native size N
    mantissa_bits : int, ``m_v``
    rounding : as :func:`weight_exponents`
    candidates : None or iterable of int
        The exponents to try. ``None``: every exponent from one above the largest
        per-sample dynamic exponent (a sample's dynamic exponent is
        ``floor(log2(max |sample|))``) down to three below the smallest one, all-zero
        samples left out, clipped to ``[-127, max_exponent]``.
    max_exponent : int, default 15 (the largest static exponent the MVM accepts)

    Returns
    -------
    ActivationCalibration
        The exponent of least total squared error (ties: the larger exponent), the mean
        squared errors of it and of dynamic quantization, and which of the two is lower.

    Raises
    ------
    ValueError
        no samples, non-finite samples, every sample zero (nothing to calibrate), an
        empty or out-of-range ``candidates``.
    """
    x = _as_samples(samples)
    n = check_int("block_size", block_size, 1)
    m = check_int("mantissa_bits", mantissa_bits, 2, 16)
    rounding = Rounding.parse(rounding)
    top = _check_max_exponent(max_exponent)
    blocks = _padded_blocks(x, n)
    dynamic = bfp.quantize(x, n, m, rounding)
    err_dynamic = float(_block_sq_error(blocks, dynamic).sum())

    if candidates is None:
        nonzero = (x != 0).reshape(x.shape[0], -1).any(axis=1)
        if not nonzero.any():
            raise ValueError("every calibration sample is zero: there is no range to "
                             "calibrate")
        per_sample = dynamic.exponents.reshape(x.shape[0], -1).max(axis=1)[nonzero]
        hi = min(int(per_sample.max()) + ACTIVATION_ABOVE, top)
        lo = min(max(int(per_sample.min()) - ACTIVATION_BELOW, EXP_MIN), hi)
        cands = list(range(hi, lo - 1, -1))
    else:
        cands = sorted({check_int("candidate exponent", c, EXP_MIN, top)
                        for c in candidates}, reverse=True)
        if not cands:
            raise ValueError("candidates is empty")

    best_e, best_err = None, None
    for e in cands:                                     # largest first: ties keep it
        err = float(_block_sq_error(blocks, bfp.quantize(x, n, m, rounding,
                                                         exponent=e)).sum())
        if best_err is None or err < best_err:
            best_e, best_err = e, err
    count = x.size
    return ActivationCalibration(
        exponent=int(best_e), mse_static=best_err / count, mse_dynamic=err_dynamic / count,
        choice="static" if best_err < err_dynamic else "dynamic")


def activation_offset(samples) -> float:
    """Seed 002's activation offset: the mean over samples of each sample's minimum.

    ``samples`` is ``(S, ...)``: sample ``s`` is ``samples[s]``, its minimum is taken over
    all its values. The layer then computes ``W (x - m) + (W m + b)``
    (:func:`fold_offset` gives the new bias), which equals ``W x + b``.
    """
    x = _as_samples(samples)
    return float(x.reshape(x.shape[0], -1).astype(np.float64).min(axis=1).mean())


def activation_centre(samples) -> float:
    """Seed 002's activation range ``[m, m + beta]`` moved onto the device's symmetric
    quantizer: the mean over samples of the middle of each sample's range,
    ``(min + max) / 2``. The seed quantizes ``x - m`` with an unsigned quantizer of
    ``2**k - 1`` levels; the device's BFP quantizer is signed and symmetric
    (``+-(2**(k-1) - 1)``), so a range that starts at its minimum (``x - m >= 0``, the
    seed's offset) uses half of the device's levels, and one centred on zero all of them.
    ``samples`` as :func:`activation_offset` takes them.
    """
    x = _as_samples(samples)
    flat = x.reshape(x.shape[0], -1).astype(np.float64)
    return float(((flat.min(axis=1) + flat.max(axis=1)) / 2).mean())


def fold_offset(w, b, offset) -> np.ndarray:
    """The bias ``b + W m`` of a layer ``y = W x + b`` whose input becomes ``x - m``.

    ``w`` is ``(outputs, inputs)``, ``b`` ``(outputs,)`` or None (zero), ``offset`` a
    scalar or one value per input. Then ``W (x - m) + fold_offset(W, b, m) == W x + b``
    (exactly in real arithmetic; float64 here).
    """
    w = np.asarray(w, np.float64)
    if w.ndim != 2:
        raise ValueError(f"w must be (outputs, inputs), not shape {w.shape}")
    mvec = np.broadcast_to(np.asarray(offset, np.float64), (w.shape[1],))
    bias = np.zeros(w.shape[0]) if b is None else np.asarray(b, np.float64)
    if bias.shape != (w.shape[0],):
        raise ValueError(f"b must have shape ({w.shape[0]},), not {bias.shape}")
    return bias + w @ mvec


# --- range scaling (seed 000) ----------------------------------------------------------------

class ScaleResult(NamedTuple):
    """The result of :func:`scale_until`.

    offset : int
        The exponent offset reached (``>= start``).
    log : tuple of (offset, events)
        Every evaluation of ``events_at``, in order.
    """
    offset: int
    log: tuple

    @property
    def raised(self) -> bool:
        """Whether the loop moved above its start."""
        return bool(self.log) and self.offset > self.log[0][0]


def _events(events_at, offset: int) -> int:
    v = events_at(offset)
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
        raise ValueError(f"events_at({offset}) must return a non-negative int, not {v!r}")
    return int(v)


def scale_until(events_at: Callable[[int], int], start: int, threshold: int,
                max_exponent: int, *, step: int = 1) -> ScaleResult:
    """Seed 000's range scaling with power-of-two steps: raise an exponent offset while
    the event count exceeds ``threshold``.

    Parameters
    ----------
    events_at : callable ``offset -> int``
        Runs the layer (on a device, the model or anything else) with its exponents raised
        by ``offset`` and returns its events: narrow-accumulator events plus saturations,
        read from the device's counters. Assumed non-increasing in ``offset``.
    start : int
        The first offset, normally 0 (the calibrated exponents).
    threshold : int >= 0
        ``T``: at most this many events are accepted.
    max_exponent : int >= start
        The largest offset ``events_at`` may be called with: the layer's exponent range
        runs out above it (for example ``15 - max(calibrated exponents)``).
    step : int >= 1, keyword
        How far one raise goes (default 1).

    The loop raises the offset by ``step`` (never past ``max_exponent``) while events
    exceed ``threshold``; the reverse step then lowers it one at a time while one step
    lower is within the threshold, never below ``start``. With ``step = 1`` the reverse
    step has nothing to do: the offset below was already seen above the threshold. So a
    layer within the threshold at ``start`` keeps ``start``, and a raised offset ``o`` has
    ``events(o) <= T < events(o - 1)``.

    Returns
    -------
    ScaleResult
        ``(offset, log)``; ``log`` holds every ``(offset, events)`` evaluated.

    Raises
    ------
    ValueError
        when events still exceed the threshold at ``max_exponent`` (the message has the
        log), a bad argument, or ``events_at`` returning anything but a count.
    """
    start = _int("start", start)
    threshold = check_int("threshold", threshold, 0)
    top = _int("max_exponent", max_exponent)
    step = check_int("step", step, 1)
    if top < start:
        raise ValueError(f"max_exponent {top} is below start {start}")
    log, seen = [], {}

    def run(offset):
        seen[offset] = _events(events_at, offset)
        log.append((offset, seen[offset]))
        return seen[offset]

    offset = start
    events = run(offset)
    while events > threshold:
        if offset >= top:
            raise ValueError(
                f"range scaling ran out of exponent range: {events} events (threshold "
                f"{threshold}) at offset {offset}, the largest allowed (max_exponent "
                f"{top}); evaluated (offset, events): {log}")
        offset = min(offset + step, top)
        events = run(offset)
    while offset > start:                               # the reverse step
        below = offset - 1
        if (seen[below] if below in seen else run(below)) > threshold:
            break
        offset = below
    return ScaleResult(offset, tuple(log))
