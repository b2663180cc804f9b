"""Softmax on the MFU pipeline: three chains, the bit-exact model and a proven error bound.

A logical vector ``x`` of ``K`` FP16 values (``L`` native vectors of ``N`` lanes, the last
one with ``lanes_last`` valid lanes) is processed by three chains (``docs/mfu.md``
section 8), all on MFU 0:

0. *store*: no ops; the result (``x``) is written to AddSubVrf at ``x_addr``;
1. *A*: REDUCE max -> ADDSUB ``b_sub_a`` (``x - max``, ``x`` from AddSubVrf) -> ACT exp;
   the result ``e`` is written to MulVrf at ``e_addr`` and is the input of chain B;
2. *B*: REDUCE sum -> ACT recip -> MUL (``(1/sum) * e``, ``e`` from MulVrf).

:func:`run_softmax` runs them on the MFU model (:func:`host.model.mfu.run_chain`), updating the
VRFs as the ``v_wr`` of each chain would; :func:`softmax_bits` is the same on a plain
logical vector. :func:`softmax_bound` is the per-element bound on ``|p_hat - p|``
against the exact softmax ``p`` (derived in ``docs/mfu.md``); :func:`softmax_reference` is
that softmax in float64.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from host.spec.formats import check_int
from host.model.mfu import ChainResult, MfuVrfs, run_chain
from host.spec.mfu import MfuConfig, MfuOp, VrfBank
from host.spec.ops import ReduceOp
from host.numerics.reduction import tree_size
from host.spec.ops import UnaryOp
from host.numerics.unary import reference_values, unary_bits

__all__ = [
    "softmax_ops", "SoftmaxRun", "run_softmax", "softmax_bits", "softmax_reference",
    "function_error", "SoftmaxConstants", "softmax_constants", "softmax_bound",
]

#: Unit roundoff of FP16 round to nearest: ``2**-11``.
U = 2.0 ** -11
#: Half the smallest subnormal: the largest rounding error of a result below ``2**-14``.
HALF_TINY = 2.0 ** -25


def softmax_ops(x_addr: int = 0, e_addr: int = 0):
    """``(store, a, b)``: the op lists of the three chains (see the module docstring)."""
    store = ()
    a = (MfuOp.reduce(ReduceOp.MAX), MfuOp.binary("b_sub_a", x_addr), MfuOp.unary("exp"))
    b = (MfuOp.reduce(ReduceOp.SUM), MfuOp.unary("recip"), MfuOp.binary("mul", e_addr))
    return store, a, b


class SoftmaxRun(NamedTuple):
    """The three chains of one softmax: ``out`` ``(L, n)`` uint16 and each chain's
    :class:`host.model.mfu.ChainResult` (``store``, ``a``, ``b``; ``a.out`` is ``e``)."""
    out: np.ndarray
    store: ChainResult
    a: ChainResult
    b: ChainResult


def run_softmax(cfg: MfuConfig, x_bits, lanes_last: int, vrfs: MfuVrfs, *,
                x_addr: int = 0, e_addr: int = 0) -> SoftmaxRun:
    """Softmax of ``x_bits`` ``(L, n)`` through the three chains on the MFU model.

    Writes ``x`` to MFU 0's AddSubVrf at ``x_addr`` and ``e`` to its MulVrf at
    ``e_addr`` (``vrfs`` is updated). Lanes from ``lanes_last`` on in the last vector are
    not part of the logical vector: the reductions ignore them, every other op computes
    them like any lane.

    Raises
    ------
    ValueError, TypeError
        as :func:`host.model.mfu.run_chain` (``x_addr + L`` or ``e_addr + L`` beyond
        ``vrf_depth``, shapes, ``lanes_last``); ``cfg`` without exp or recip.
    """
    for op in (UnaryOp.EXP, UnaryOp.RECIP):
        if op not in cfg.unary_ops:
            raise ValueError(f"cfg.unary_ops must include {op.name} for softmax, not "
                             f"{cfg.unary_ops}")
    store_ops, a_ops, b_ops = softmax_ops(x_addr, e_addr)
    store = run_chain(cfg, store_ops, x_bits, lanes_last, vrfs)
    vrfs.write(0, VrfBank.ADDSUB, x_addr, store.out)
    a = run_chain(cfg, a_ops, x_bits, lanes_last, vrfs)
    vrfs.write(0, VrfBank.MUL, e_addr, a.out)
    b = run_chain(cfg, b_ops, a.out, lanes_last, vrfs)
    return SoftmaxRun(b.out, store, a, b)


def _native(cfg, x_bits):
    x = np.asarray(x_bits)
    if x.dtype != np.uint16 or x.ndim != 1:
        raise TypeError(f"x_bits must be a 1-D uint16 array of FP16 bit patterns, not "
                        f"{x.dtype} of shape {x.shape}")
    count = check_int("len(x_bits)", len(x), 1, cfg.n * cfg.max_length)
    length = -(-count // cfg.n)
    padded = np.zeros(length * cfg.n, np.uint16)
    padded[:count] = x
    return padded.reshape(length, cfg.n), count - (length - 1) * cfg.n


def softmax_bits(cfg: MfuConfig, x_bits) -> np.ndarray:
    """The device's softmax of a logical vector (1-D uint16, 1 to ``n * max_length``
    elements), padded with ``+0`` to whole native vectors; returns the ``K`` results."""
    native, lanes_last = _native(cfg, x_bits)
    run = run_softmax(cfg, native, lanes_last, MfuVrfs(cfg))
    return run.out.reshape(-1)[:len(x_bits)]


def softmax_reference(x_bits) -> np.ndarray:
    """The exact softmax of finite FP16 inputs in float64 (``exp(x - max) / sum``)."""
    x = np.asarray(x_bits, np.uint16).view(np.float16).astype(np.float64)
    e = np.exp(x - x.max())
    return e / e.sum()


def function_error(op, lo: float, hi: float) -> float:
    """Worst error of the device's unary ``op`` over the FP16 inputs in ``[lo, hi]``,
    in units of the FP16 spacing at the exact value: ``max |f_hat(x) - f(x)| / sp(f(x))``
    with ``sp(v) = 2**(max(floor(log2 |v|), -14) - 10)`` (``2**-24`` for ``v = 0``).

    Exhaustive over the 65,536 patterns; inputs with an infinite exact value are refused.
    """
    x = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    v = x.view(np.float16).astype(np.float64)
    x = x[(v >= lo) & (v <= hi)]
    exact = reference_values(op, x)
    if not np.isfinite(exact).all():
        raise ValueError(f"{op} has infinite values on [{lo}, {hi}]")
    got = unary_bits(op, x).view(np.float16).astype(np.float64)
    mag = np.abs(exact)
    with np.errstate(divide="ignore"):
        binade = np.where(mag > 0, np.floor(np.log2(np.where(mag > 0, mag, 1.0))), -14.0)
    spacing = np.exp2(np.maximum(binade, -14) - 10)
    return float((np.abs(got - exact) / spacing).max())


class SoftmaxConstants(NamedTuple):
    """Constants of :func:`softmax_bound` (see ``docs/mfu.md`` section 8).

    exp_err : worst error of EXP on ``[-65504, 0]`` in spacings (:func:`function_error`).
    recip_err : worst error of RECIP on ``[1, 256]``, the same way.
    """
    exp_err: float
    recip_err: float


_CONSTANTS: SoftmaxConstants | None = None


def softmax_constants() -> SoftmaxConstants:
    """The measured unit errors the bound rests on (computed once, exhaustively)."""
    global _CONSTANTS
    if _CONSTANTS is None:
        _CONSTANTS = SoftmaxConstants(function_error(UnaryOp.EXP, -65504.0, 0.0),
                                      function_error(UnaryOp.RECIP, 1.0, 256.0))
    return _CONSTANTS


def softmax_bound(x_bits) -> np.ndarray:
    """Per-element bound on ``|p_hat_i - p_i|``: device softmax against the exact one.

    ``x_bits`` is the logical vector (1-D uint16, finite values, at most 2**15 elements).
    With ``u = 2**-11``, ``t_i = x_i - max`` (exact), ``E_i = exp(t_i)``, ``S = sum E``,
    ``p_i = E_i / S``, ``D = log2(tree_size(K))`` additions per element in the sum tree,
    ``a_e = exp_err * 2**-10``, ``b_e = exp_err * 2**-24``, ``a_r = recip_err * 2**-10``:

    * subtraction: ``RN(t_i) = t_i (1 + d)``, ``|d| <= u``, so ``exp(RN(t_i))`` is
      ``E_i (1 + f_i)`` with ``|f_i| <= exp(u |t_i|) - 1`` (a difference beyond the FP16
      range becomes ``-inf`` and its ``exp`` exactly 0, an error below ``E_i < 2**-60000``);
    * exp: ``e_i = E_i (1 + A_i) + b``, ``|A_i| <= (1 + f_i)(1 + a_e) - 1``, ``|b| <= b_e``;
    * sum: each element passes ``D`` rounded additions (results in ``[1, 256]``, no
      overflow, subnormal sums exact), ``|S_hat - sum e| <= g sum e`` with
      ``g = (1 + u)**D - 1``; with ``Q = sum_j E_j A_j + K b_e``,
      ``|S_hat - S| <= g (S + Q) + Q = Delta S``;
    * recip: ``S_hat >= 1`` (it contains ``exp(0) = 1``), ``r = (1 + c) / S_hat``,
      ``|c| <= a_r``;
    * product: ``|p_hat_i - e_i r| <= u e_i r + 2**-25``.

    Together, with ``T_i = p_i ((1 + A_i)(1 + a_r) / (1 - Delta) - 1)
    + b_e (1 + a_r) / (S (1 - Delta))``: ``|p_hat_i - p_i| <= (1 + u) T_i + u p_i + 2**-25``.
    The float64 evaluation is made safe by a factor ``1 + 1e-9``.

    Raises
    ------
    ValueError
        a non-finite input; too many elements.
    """
    x = np.asarray(x_bits, np.uint16).view(np.float16).astype(np.float64)
    if not np.isfinite(x).all():
        raise ValueError("softmax_bound needs finite inputs")
    count = check_int("len(x_bits)", len(x), 1, 1 << 15)
    c = softmax_constants()
    a_e, b_e = c.exp_err * 2.0 ** -10, c.exp_err * 2.0 ** -24
    a_r = c.recip_err * 2.0 ** -10
    depth = tree_size(count).bit_length() - 1
    g = (1 + U) ** depth - 1
    t = x - x.max()                            # exact: a difference of two FP16 values
    big = -t > 65519.0                         # RN(t) = -inf: e_i = 0 exactly
    e_exact = np.exp(t)
    f = np.where(big, 0.0, np.expm1(U * -t))
    a_i = (1 + f) * (1 + a_e) - 1
    s = e_exact.sum()
    q = float((e_exact * a_i).sum()) + count * b_e
    delta = (g * (s + q) + q) / s
    if delta >= 1:
        raise ValueError(f"the bound does not hold for this vector (Delta = {delta})")
    p = e_exact / s
    t_i = p * ((1 + a_i) * (1 + a_r) / (1 - delta) - 1) + b_e * (1 + a_r) / (s * (1 - delta))
    return ((1 + U) * t_i + U * p + HALF_TINY) * (1 + 1e-9)
