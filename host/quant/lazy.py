"""BFP weights with a lazy (delayed) update, seed 003: no high-precision copy of the weights.

A parameter tensor is held as two BFP tensors blocked alike along its last axis, in
exact integers (``docs/training.md`` section 3 has the rules and why):

* the **weight**: ``m_w``-bit mantissas ``q`` (``|q| <= 2**(m_w-1) - 1``) with one
  exponent ``e`` per block; value ``q * s``, weight step ``s = 2**(e - (m_w - 2))``
  (``docs/numerics.md``'s BFP block, so the forward pass uses it as the device does);
* the **accumulator**: ``m_a``-bit mantissas ``a`` (``|a| <= 2**(m_a-1) - 1``) on a grid
  tied to the weight's: one accumulator unit is ``s / 2**f`` with
  ``f = m_a - 1 - headroom``, so ``a`` spans ``+-2**headroom`` weight steps.

:meth:`LazyBfp.update` adds an optimizer step (any float array), all in exact integer
arithmetic except the rounding of the step to the accumulator grid and of an exponent
raise:

1. overflow policy: a block whose step exceeds the accumulator's range (``2**headroom``
   weight steps) first gets its exponent raised until the step fits (an all-zero block
   such as a zero-initialised bias starts at the smallest exponent and grows this way);
   only at the largest exponent is a step clamped, counted in :attr:`LazyBfp.step_clamps`;
2. the step is rounded to accumulator units (nearest, ties to even) and added to the
   accumulator (exactly, in int64);
3. transfer: ``t = round(total / 2**f)`` (ties away from zero: "reaches half a weight
   step") whole weight steps move into the weight and ``total - t * 2**f`` stays, so
   ``|a| <= 2**(f-1)``: at most half a weight step;
4. renormalise the weight blocks: a block with a mantissa beyond the top code gets its
   exponent raised by one (``q`` halved towards zero; the remainder, a whole old weight
   step, goes to the accumulator, whose units double: that halving rounds to even and
   loses at most half an accumulator unit), and a block whose mantissas doubled still fit
   gets its exponent lowered (``q`` and ``a`` doubled: exact), so the weight keeps its
   full precision as it shrinks.

Weight plus accumulator therefore equals the sum of the initial value and the rounded
steps to within half an accumulator unit per exponent raise; without raises exactly.
"""

from __future__ import annotations

import numpy as np

from host.spec.formats import (
    EXP_MAX,
    EXP_MIN,
    MANTISSA_BITS_MAX,
    MANTISSA_BITS_MIN,
    check_int,
    mantissa_max,
)

__all__ = ["LazyBfp"]


def _round_half_away(num: np.ndarray, shift: int) -> np.ndarray:
    """``round(num / 2**shift)`` with ties away from zero, on int64."""
    half = np.int64(1) << (shift - 1) if shift > 0 else np.int64(0)
    mag = (np.abs(num) + half) >> shift
    return np.where(num < 0, -mag, mag)


class LazyBfp:
    """One parameter tensor as BFP weight + BFP accumulator (seed 003's delayed update).

    Parameters
    ----------
    values : float array, at least 1-D
        The initial weights; blocked along the last axis in ``block_size`` values (the
        last block zero padded). The weight gets the max-based exponent per block; the
        accumulator starts with the quantization residual (so nothing of ``values``
        below half an accumulator unit is lost).
    block_size : int >= 1
    weight_bits : int, 2..16 (``m_w``, 8 in the seed)
    accumulator_bits : int, 2..32 (``m_a``, 16 in the seed); ``> headroom + 1``
    headroom : int >= 0
        ``log2`` of the weight steps the accumulator spans (default 3: +-8 steps).

    Raises
    ------
    TypeError, ValueError
        naming the parameter: non-float or non-finite ``values``, widths out of range.
    """

    def __init__(self, values, block_size: int, weight_bits: int = 8,
                 accumulator_bits: int = 16, headroom: int = 3):
        values = np.asarray(values)
        if values.dtype.kind != "f":
            raise TypeError(f"values must be a float array, not {values.dtype}")
        if values.ndim == 0 or values.size == 0:
            raise ValueError(f"values must be a non-empty array with an axis, not shape "
                             f"{values.shape}")
        if not np.isfinite(values).all():
            raise ValueError("values has inf or NaN")
        self.block_size = check_int("block_size", block_size, 1)
        self.weight_bits = check_int("weight_bits", weight_bits, MANTISSA_BITS_MIN,
                                     MANTISSA_BITS_MAX)
        self.headroom = check_int("headroom", headroom, 0, 16)
        self.accumulator_bits = check_int("accumulator_bits", accumulator_bits,
                                          self.headroom + 2, 32)
        self.shape = values.shape
        self.frac_bits = self.accumulator_bits - 1 - self.headroom
        n, length = self.block_size, values.shape[-1]
        self.nblocks = -(-length // n)
        padded = np.zeros(values.shape[:-1] + (self.nblocks * n,), np.float64)
        padded[..., :length] = values
        blocks = padded.reshape(values.shape[:-1] + (self.nblocks, n))
        amax = np.abs(blocks).max(axis=-1)
        exps = np.frexp(amax)[1].astype(np.int64) - 1
        self.exponents = np.where(amax == 0, EXP_MIN, np.clip(exps, EXP_MIN, EXP_MAX))
        step = np.ldexp(1.0, (self.exponents - (self.weight_bits - 2))[..., None])
        q = np.rint(blocks / step).astype(np.int64)
        self.mantissas = q                          # (..., nblocks, n), may exceed top
        self.accumulator = np.zeros_like(q)
        self.step_clamps = 0
        self.exponent_raises = 0
        self._add_units(np.rint(np.ldexp((blocks - q * step) / step, self.frac_bits))
                        .astype(np.int64))

    # --- the state ---------------------------------------------------------------------
    @property
    def weight_step(self) -> np.ndarray:
        """Per block, the value of one weight mantissa unit (float64 ``(..., nblocks)``)."""
        return np.ldexp(1.0, self.exponents - (self.weight_bits - 2))

    def _flat(self, blocks: np.ndarray) -> np.ndarray:
        flat = blocks.reshape(self.shape[:-1] + (-1,))
        return flat[..., :self.shape[-1]]

    def weight(self) -> np.ndarray:
        """The weights as the forward pass (and the device) uses them, float64, exact."""
        return self._flat(np.ldexp(self.mantissas.astype(np.float64),
                                   (self.exponents - (self.weight_bits - 2))[..., None]))

    def accumulated(self) -> np.ndarray:
        """The accumulator's value, float64, exact."""
        return self._flat(np.ldexp(self.accumulator.astype(np.float64),
                                   (self.exponents - (self.weight_bits - 2)
                                    - self.frac_bits)[..., None]))

    def total(self) -> np.ndarray:
        """Weight plus accumulator: the value the update conserves."""
        return self.weight() + self.accumulated()

    def memory_bits(self) -> int:
        """Bits of state: both mantissa arrays and both exponents per block (8 bits)."""
        elements = int(np.prod(self.shape[:-1], dtype=np.int64)) * self.nblocks * \
            self.block_size
        blocks = int(np.prod(self.shape[:-1], dtype=np.int64)) * self.nblocks
        return elements * (self.weight_bits + self.accumulator_bits) + blocks * 8

    # --- the update --------------------------------------------------------------------
    def update(self, step) -> None:
        """Add ``step`` (float, the parameter's shape: the optimizer's ``-lr * ...``) to
        the parameter lazily (the module docstring's moves).

        Raises
        ------
        ValueError
            ``step`` has another shape or inf/NaN.
        OverflowError
            a block would need an exponent above the largest E8M0 exponent.
        Either way the state is left as it was.
        """
        step = np.asarray(step, np.float64)
        if step.shape != tuple(self.shape):
            raise ValueError(f"step has shape {step.shape}, the parameter {self.shape}")
        if not np.isfinite(step).all():
            raise ValueError("step has inf or NaN; the parameter is left unchanged")
        saved = (self.mantissas.copy(), self.accumulator.copy(), self.exponents.copy(),
                 self.step_clamps, self.exponent_raises)
        try:
            self._update(step)
        except OverflowError:
            (self.mantissas, self.accumulator, self.exponents, self.step_clamps,
             self.exponent_raises) = saved
            raise

    def _update(self, step: np.ndarray) -> None:
        n = self.block_size
        padded = np.zeros(self.shape[:-1] + (self.nblocks * n,), np.float64)
        padded[..., :self.shape[-1]] = step
        blocks = padded.reshape(self.mantissas.shape)
        top = float(mantissa_max(self.accumulator_bits))
        for _ in range(EXP_MAX - EXP_MIN + 1):
            units = np.rint(np.ldexp(blocks, -self._unit_exponents()[..., None]))
            over = (np.abs(units) > top).any(axis=-1)
            # Overflow policy: a step beyond the accumulator's range raises the block's
            # exponent (both grids double) until it fits; at the largest exponent it is
            # clamped and counted.
            over &= self.exponents < EXP_MAX
            if not over.any():
                break
            self._raise(over)
        clamped = np.abs(units) > top
        self.step_clamps += int(clamped.sum())
        self._add_units(np.clip(units, -top, top).astype(np.int64))

    def _unit_exponents(self) -> np.ndarray:
        return self.exponents - (self.weight_bits - 2) - self.frac_bits

    def _transfer(self) -> None:
        """Move whole weight steps out of the accumulator (ties away from zero)."""
        moved = _round_half_away(self.accumulator, self.frac_bits)
        self.mantissas = self.mantissas + moved
        self.accumulator = self.accumulator - (moved << self.frac_bits)

    def _add_units(self, units: np.ndarray) -> None:
        self.accumulator = self.accumulator + units
        self._transfer()
        self._renormalise()

    def _raise(self, mask: np.ndarray) -> None:
        """Raise the exponent of the blocks ``mask`` by one: ``q = 2 q' + r`` (``q'``
        rounded towards zero, ``r`` in -1..1 old weight steps, i.e. ``r * 2**f`` old
        accumulator units) and the accumulator halved with ties to even, the one
        rounding (half a new unit at most)."""
        q = self.mantissas[mask]
        half_q = np.where(q < 0, -((-q) >> 1), q >> 1)
        acc = self.accumulator[mask] + ((q - 2 * half_q) << self.frac_bits)
        self.mantissas[mask] = half_q
        self.accumulator[mask] = _round_half_even_half(acc)
        self.exponents = np.where(mask, self.exponents + 1, self.exponents)
        self.exponent_raises += int(mask.sum())
        self._transfer()

    def _renormalise(self) -> None:
        top = mantissa_max(self.weight_bits)
        for _ in range(EXP_MAX - EXP_MIN + 1):
            over = (np.abs(self.mantissas) > top).any(axis=-1) & (self.exponents < EXP_MAX)
            if not over.any():
                break
            self._raise(over)
        if (np.abs(self.mantissas) > top).any():
            raise OverflowError(f"a weight block reached the largest exponent {EXP_MAX} "
                                f"and still overflows {self.weight_bits}-bit mantissas")
        # Lower the exponent of blocks whose mantissas, doubled, still fit with room for
        # one more step (and are not all zero): exact, both grids halve together.
        for _ in range(EXP_MAX - EXP_MIN + 1):
            amax = np.abs(self.mantissas).max(axis=-1)
            low = (amax > 0) & (2 * amax + 1 <= top) & (self.exponents > EXP_MIN)
            if not low.any():
                break
            self.mantissas[low] *= 2
            self.accumulator[low] *= 2
            self.exponents = np.where(low, self.exponents - 1, self.exponents)
            self._transfer()


def _round_half_even_half(x: np.ndarray) -> np.ndarray:
    """``round(x / 2)`` with ties to even, on int64."""
    q = x >> 1                                      # floor
    tie = (x & 1) == 1
    return np.where(tie & ((q & 1) == 1), q + 1, q)
