"""Weight mantissas chosen by a layer's output error on calibration data (not by rounding
each weight to nearest), and bias correction: ``docs/calibration.md`` section 7.

The MRF takes raw words, so a BFP block's mantissas need not be each weight rounded to
nearest: any ``|q| <= 2^(m-1) - 1`` with the block's exponent is a valid word. For a layer
``y = W x + b`` whose inputs, as the device quantizes them, are the rows of ``X``
(``(samples, cols)``), what matters is the output error on those inputs,

    E(Q, b') = || X (W - Q)^T + 1 (b - b')^T ||^2        (summed over samples and outputs)

and not the weights' own error. Rows of ``W`` (output features) do not interact in ``E``,
so each row is chosen alone:

1. **Exponents first**: one per block of ``N`` consecutive columns of a row (the MRF's
   block), given (the caller's search, :func:`host.quant.calibrate.weight_exponents`).
2. **Mantissas** (:func:`gptq_round`): the columns are quantized one at a time, in order of
   decreasing input energy ``H_jj`` ("act-order"), each rounded to nearest on its block's
   grid (clamped to the top code) and its error spread over the columns not yet
   quantized, weighted by the inverse Hessian ``H = X^T X`` (with a column of ones for
   the bias, and a damping ``lambda = damp * mean(diag H)`` on the diagonal): the
   optimal-brain-surgeon update of GPTQ (Frantar et al., 2022), here inside the BFP grid
   of each block. The bias column is never quantized, so it absorbs the mean of the
   error.
3. **Bias correction** (:func:`correct_bias`): given the mantissas, the bias that minimises
   ``E`` is ``b' = b + mean over samples of (W - Q) x``.
4. **Never worse than nearest** (:func:`round_layer`): per row, the result of 2 + 3 is kept
   only where its ``E`` is below that of round-to-nearest with the same exponents and its
   own bias correction; otherwise the row rounds to nearest (with its bias correction).
   So the layer's calibration-set output error is never above nearest rounding's (with
   bias correction), which is itself never above nearest rounding without it.

Everything is float64 NumPy; a layer of ``cols`` columns costs one ``cols x cols``
inverse and Cholesky factor and ``cols`` rank-one updates of ``rows x cols``.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from host.spec.formats import ZERO_BLOCK_EXP, check_int, mantissa_max

__all__ = [
    "DAMP",
    "RoundedLayer",
    "block_steps",
    "correct_bias",
    "gptq_round",
    "layer_error",
    "nearest_round",
    "round_layer",
]

#: Damping of the Hessian, a fraction of its mean diagonal (as GPTQ): it keeps the inverse
#: well conditioned where inputs are always zero or collinear (a few hundred calibration
#: samples for 64 inputs), at the price of a little less compensation.
DAMP = 0.01


def block_steps(exponents, cols: int, block_size: int, mantissa_bits: int) -> np.ndarray:
    """The quantization step ``2^(e - (m - 2))`` of every weight, ``(rows, cols)``, from
    one exponent per block ``(rows, ceil(cols / block_size))``."""
    e = np.asarray(exponents, np.int32)
    e = np.repeat(e, block_size, axis=-1)[..., :cols]
    return np.ldexp(1.0, e - (mantissa_bits - 2))


def _on_grid(w, steps, qmax):
    q = np.clip(np.rint(w / steps), -qmax, qmax)          # rint: ties to even
    return q


def _check(w, exponents, block_size, mantissa_bits):
    w = np.asarray(w, np.float64)
    if w.ndim != 2:
        raise ValueError(f"w must be a matrix (rows, cols), not shape {w.shape}")
    if not np.isfinite(w).all():
        raise ValueError("w holds inf or NaN values")
    n = check_int("block_size", block_size, 1)
    m = check_int("mantissa_bits", mantissa_bits, 2, 16)
    e = np.asarray(exponents)
    want = (w.shape[0], -(-w.shape[1] // n))
    if e.shape != want or not np.issubdtype(e.dtype, np.integer):
        raise ValueError(f"exponents must be integers of shape {want}, one per block, not "
                         f"{e.dtype} {e.shape}")
    return w, e.astype(np.int32), n, m


def nearest_round(w, exponents, block_size: int, mantissa_bits: int) -> np.ndarray:
    """Integer mantissas ``(rows, cols)`` of ``w`` rounded to nearest (ties to even) on the
    blocks' grids and clamped to ``+-(2^(m-1) - 1)``: what the device's quantizer makes of
    ``w`` with these exponents (``bfp.quantize(w, N, m, exponent=...)``)."""
    w, e, n, m = _check(w, exponents, block_size, mantissa_bits)
    return _on_grid(w, block_steps(e, w.shape[1], n, m), mantissa_max(m)).astype(np.int64)


def _hessian(x, bias: bool) -> np.ndarray:
    x = np.asarray(x, np.float64)
    h = x.T @ x
    if bias:
        s = x.sum(axis=0)
        h = np.block([[h, s[:, None]], [s[None, :], np.array([[float(len(x))]])]])
    return h


def gptq_round(w, x, exponents, block_size: int, mantissa_bits: int, *,
               bias: bool = True, damp: float = DAMP, act_order: bool = True,
               frozen=None) -> np.ndarray:
    """Integer mantissas ``(rows, cols)`` of ``w`` chosen column by column with error
    compensation (module docstring, step 2).

    Parameters
    ----------
    w : float matrix ``(rows, cols)``, the layer's weights (the target)
    x : float ``(samples, cols)``, the layer's inputs as the device quantizes them
    exponents : int ``(rows, ceil(cols / block_size))``, the blocks' exponents
    block_size, mantissa_bits : N and m of the weights
    bias : whether a bias (never quantized) absorbs the mean error: adds a column of ones
        to ``x``
    damp : damping, a fraction of the mean diagonal of ``X^T X``
    act_order : quantize columns in order of decreasing ``H_jj`` (else left to right)
    frozen : None or bool ``(rows, blocks)``: blocks that keep nearest rounding of ``w``
        (their error is still compensated by the columns after them). Blocks with
        exponent -127 (all-zero blocks) are always frozen: they stay zero.

    Returns
    -------
    int64 ``(rows, cols)``, every ``|q| <= 2^(m-1) - 1``.
    """
    w, e, n, m = _check(w, exponents, block_size, mantissa_bits)
    x = np.asarray(x, np.float64)
    rows, cols = w.shape
    if x.ndim != 2 or x.shape[1] != cols:
        raise ValueError(f"x must be (samples, {cols}), not shape {x.shape}")
    qmax = mantissa_max(m)
    steps = block_steps(e, cols, n, m)
    fixed = _frozen(e, frozen, n, cols)
    near = _on_grid(w, steps, qmax)
    h = _hessian(x, bias)
    total = len(h)
    diag = np.diag(h).copy()
    lam = damp * float(diag.mean()) if diag.mean() > 0 else 1.0
    order = np.argsort(-diag[:cols], kind="stable") if act_order else np.arange(cols)
    perm = np.concatenate([order, np.arange(cols, total)])
    h = h[np.ix_(perm, perm)]
    # Upper Cholesky factor of H^-1: row j holds the OBS update of the columns after j.
    # A numerically singular H (more inputs than independent samples) gets more damping.
    for _ in range(6):
        try:
            u = np.linalg.cholesky(np.linalg.inv(h + lam * np.eye(total))).T
            break
        except np.linalg.LinAlgError:
            lam = lam * 10 if lam > 0 else 1.0
    else:                                                   # pragma: no cover
        return near.astype(np.int64)
    work = np.zeros((rows, total))
    work[:, :cols] = w[:, order]
    st, fx, nr = steps[:, order], fixed[:, order], near[:, order]
    q = np.zeros((rows, cols), np.int64)
    for j in range(cols):
        col = work[:, j]
        qj = np.where(fx[:, j], nr[:, j], _on_grid(col, st[:, j], qmax))
        q[:, j] = qj
        err = (col - qj * st[:, j]) / u[j, j]
        work[:, j + 1:] -= np.outer(err, u[j, j + 1:])
    out = np.empty_like(q)
    out[:, order] = q
    return out


def _frozen(e, frozen, n, cols) -> np.ndarray:
    """Per weight, whether its block is frozen (given, or exponent -127)."""
    blocks = e == ZERO_BLOCK_EXP
    if frozen is not None:
        f = np.asarray(frozen, bool)
        if f.shape != e.shape:
            raise ValueError(f"frozen must have the exponents' shape {e.shape}, not "
                             f"{f.shape}")
        blocks = blocks | f
    return np.repeat(blocks, n, axis=-1)[:, :cols]


def correct_bias(w, q_values, x, b=None) -> np.ndarray:
    """The bias minimising the output error given the weights ``q_values`` (float
    ``(rows, cols)``): ``b + mean over samples of (W - Q) x`` (``b`` None: zeros)."""
    w, qv, x = (np.asarray(a, np.float64) for a in (w, q_values, x))
    b = np.zeros(w.shape[0]) if b is None else np.asarray(b, np.float64)
    return b + (w - qv) @ x.mean(axis=0)


def layer_error(w, q_values, x, b=None, b_new=None) -> np.ndarray:
    """Per row (output feature), the output error over the samples
    ``sum_s ((W - Q) x_s + b - b')^2``; float64 ``(rows,)``."""
    w, qv, x = (np.asarray(a, np.float64) for a in (w, q_values, x))
    d = x @ (w - qv).T
    if b is not None or b_new is not None:
        b = 0.0 if b is None else np.asarray(b, np.float64)
        b_new = 0.0 if b_new is None else np.asarray(b_new, np.float64)
        d = d + (b - b_new)
    return (d * d).sum(axis=0)


class RoundedLayer(NamedTuple):
    """The result of :func:`round_layer`.

    mantissas : int64 ``(rows, cols)``
    values : float64 ``(rows, cols)``, the mantissas times their steps (exact)
    bias : float64 ``(rows,)``, the corrected bias
    rows_gptq : rows whose mantissas are :func:`gptq_round`'s (the others: nearest)
    error : the layer's output error on ``x`` (sum over rows of :func:`layer_error`)
    error_nearest : the same with nearest rounding, bias uncorrected
    error_nearest_corrected : nearest rounding with its bias correction
    """
    mantissas: np.ndarray
    values: np.ndarray
    bias: np.ndarray
    rows_gptq: int
    error: float
    error_nearest: float
    error_nearest_corrected: float


def round_layer(w, x, exponents, block_size: int, mantissa_bits: int, b=None, *,
                damp: float = DAMP, act_order: bool = True, frozen=None,
                gptq: bool = True) -> RoundedLayer:
    """A layer's mantissas and bias from its calibration inputs (module docstring, steps
    2 to 4): per row the better of error-compensated rounding and nearest rounding, each
    with its bias correction, by the output error on ``x``.

    Parameters as :func:`gptq_round`; ``b`` the layer's bias (None: no bias, one is made);
    ``gptq=False`` gives nearest rounding with bias correction only.
    """
    w, e, n, m = _check(w, exponents, block_size, mantissa_bits)
    x = np.asarray(x, np.float64)
    steps = block_steps(e, w.shape[1], n, m)
    b0 = np.zeros(w.shape[0]) if b is None else np.asarray(b, np.float64)
    q_near = nearest_round(w, e, n, m)
    v_near = q_near * steps
    b_near = correct_bias(w, v_near, x, b0)
    err_near = layer_error(w, v_near, x, b0, b_near)
    err_plain = float(layer_error(w, v_near, x).sum())
    if not gptq:
        return RoundedLayer(q_near, v_near, b_near, 0, float(err_near.sum()), err_plain,
                            float(err_near.sum()))
    q_g = gptq_round(w, x, e, n, m, bias=True, damp=damp, act_order=act_order,
                     frozen=frozen)
    v_g = q_g * steps
    b_g = correct_bias(w, v_g, x, b0)
    err_g = layer_error(w, v_g, x, b0, b_g)
    take = err_g < err_near
    q = np.where(take[:, None], q_g, q_near)
    v = q * steps
    bias = np.where(take, b_g, b_near)
    err = np.where(take, err_g, err_near)
    return RoundedLayer(q, v, bias, int(take.sum()), float(err.sum()), err_plain,
                        float(err_near.sum()))

