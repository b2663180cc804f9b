"""FP16 reductions of the multifunction units (max and sum over a logical vector).

The bit-exact reference model of the MFU's REDUCE unit (``hw/arith/fp16_reduce.py``); the
contract is ``docs/numerics.md`` section 6, the design notes ``docs/reductions.md``.

**Definition.** The ``n >= 1`` elements are padded with the operation's identity to
``P``, the smallest power of two with ``P >= n`` and ``P >= 2``, and combined pairwise in
a complete balanced binary tree: level 1 combines ``(x0, x1), (x2, x3), ...``, level 2
combines the level-1 results the same way, and so on up to the root. Every combination
is :func:`host.numerics.fp16.binary_bits` with ``BinaryOp.ADD`` (sum) or ``BinaryOp.MAX`` (max),
IEEE 754 binary16 with round to nearest even and the canonical NaN ``0x7E00``.

The identities are ``-0`` (``0x8000``) for the sum and ``-inf`` (``0xFC00``) for the
max: ``binary_bits`` gives ``x`` back from ``(x, identity)`` and ``(identity, x)`` for
every ``x`` except a non-canonical NaN, which becomes ``0x7E00``. ``P >= 2`` makes every
element pass through at least one combination, so a NaN result is always ``0x7E00``,
and padding to *any* larger power of two gives the same bits. That is why the result
does not depend on the native vector size ``N`` of the device, which reduces each native
vector in a lane tree and then the per-vector results in a tree padded to its largest
logical length.

**Events** (the MFU's counters): every combination whose result is +-inf from two
operands that are not infinities counts one *overflow*; every combination whose result
is a NaN from two operands that are not NaNs counts one *NaN created*
(:func:`host.numerics.fp16.binary_events_bits`). A combination with an identity never counts: its
result is its other operand (or the canonical form of that NaN).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from host.numerics.fp16 import binary_bits, binary_events_bits
from host.spec.formats import check_int
from host.spec.ops import IDENTITY, ReduceOp

__all__ = [
    "ReduceOp", "IDENTITY", "ReduceResult", "ReduceVectorsResult", "tree_size",
    "reduce_bits", "reduce", "reduce_vectors_bits",
]


class ReduceResult(NamedTuple):
    """One reduction: ``value`` (FP16 bits, int) and its event counts (ints)."""
    value: int
    overflow: int
    nan_created: int


class ReduceVectorsResult(NamedTuple):
    """A reduction in the device's form: ``out`` is ``(L, N)`` uint16, every element the
    result; ``overflow`` and ``nan_created`` are event counts (ints)."""
    out: np.ndarray
    overflow: int
    nan_created: int


def tree_size(n: int) -> int:
    """``P``: the smallest power of two with ``P >= n`` and ``P >= 2``.

    Raises ``TypeError`` / ``ValueError`` naming ``n`` unless it is an integer >= 1.
    """
    n = check_int("n", n, 1)
    return max(2, 1 << (n - 1).bit_length())


def _uint16_vector(name, bits, ndim):
    arr = np.asarray(bits)
    if arr.dtype != np.uint16:
        raise TypeError(f"{name} must be a uint16 array of FP16 bit patterns, not an array "
                        f"of {arr.dtype}")
    if arr.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimension{'s' if ndim > 1 else ''}, "
                         f"not shape {arr.shape}")
    return arr


def _tree(op: ReduceOp, bits: np.ndarray, size: int) -> ReduceResult:
    """The tree over ``bits`` padded with the identity to ``size`` (a power of two)."""
    level = np.full(size, op.identity, np.uint16)
    level[:len(bits)] = bits
    binop = op.binary_op
    overflow = nan_created = 0
    while len(level) > 1:
        a, b = level[0::2], level[1::2]
        events = binary_events_bits(binop, a, b)
        overflow += int(events.overflow.sum())
        nan_created += int(events.nan_created.sum())
        level = binary_bits(binop, a, b)
    return ReduceResult(int(level[0]), overflow, nan_created)


def reduce_bits(op, bits, *, pad_to: int | None = None) -> ReduceResult:
    """Reduce a logical vector of FP16 bit patterns to one value, in the tree order.

    Parameters
    ----------
    op : ReduceOp, ``"max"``, ``"sum"`` or the code 0/1
    bits : 1-D uint16 array of ``n >= 1`` FP16 bit patterns
    pad_to : int, optional
        The tree's number of leaves, a power of two ``>= max(n, 2)``; default
        :func:`tree_size`.
        Any such value gives the same result and events (``docs/reductions.md``); the
        parameter exists so that tests can show it.

    Returns
    -------
    ReduceResult
        ``value`` (FP16 bits; every NaN ``0x7E00``), ``overflow``, ``nan_created``.

    Raises
    ------
    ValueError
        unknown ``op``; ``bits`` not 1-D or empty; ``pad_to`` not a power of two
        ``>= max(n, 2)``.
    TypeError
        ``bits`` is not a ``uint16`` array; ``pad_to`` is not an integer.
    """
    op = ReduceOp.parse(op)
    bits = _uint16_vector("bits", bits, 1)
    n = len(bits)
    if n == 0:
        raise ValueError("bits must hold at least one element, not 0")
    if pad_to is None:
        size = tree_size(n)
    else:
        size = check_int("pad_to", pad_to, max(n, 2))
        if size & (size - 1):
            raise ValueError(f"pad_to must be a power of two, not {size}")
    return _tree(op, bits, size)


def reduce(op, x) -> np.float16:
    """Reduce a ``float16`` vector: ``reduce("sum", x)`` or ``reduce("max", x)``.

    The value of :func:`reduce_bits` as ``np.float16``; raises like it, with ``float16``
    in place of ``uint16``.

    >>> import numpy as np
    >>> reduce("sum", np.float16([1, 2, 3]))
    np.float16(6.0)
    """
    op = ReduceOp.parse(op)
    arr = np.asarray(x)
    if arr.dtype != np.float16:
        raise TypeError(f"x must be a float16 array, not an array of {arr.dtype}")
    if arr.ndim != 1:
        raise ValueError(f"x must have 1 dimension, not shape {arr.shape}")
    if arr.size == 0:
        raise ValueError("x must hold at least one element, not 0")
    value = reduce_bits(op, arr.view(np.uint16)).value
    return np.uint16(value).view(np.float16)


def reduce_vectors_bits(op, vectors, lanes_last: int) -> ReduceVectorsResult:
    """The REDUCE unit on one logical vector in native vectors: reduce and broadcast.

    Parameters
    ----------
    op : ReduceOp, ``"max"``, ``"sum"`` or the code 0/1
    vectors : uint16 array ``(L, N)``, ``L >= 1``
        The logical vector as ``L`` native vectors of ``N`` FP16 lanes, element ``k`` in
        ``vectors[k // N, k % N]``.
    lanes_last : int, 1..N
        Valid lanes of the last native vector; the lanes after them are ignored.

    Returns
    -------
    ReduceVectorsResult
        ``out`` ``(L, N)`` uint16, every lane of every vector the reduction of the
        ``n = (L - 1) * N + lanes_last`` elements (:func:`reduce_bits`); the events.

    Raises
    ------
    TypeError
        ``vectors`` is not a ``uint16`` array; ``lanes_last`` is not an integer.
    ValueError
        unknown ``op``; ``vectors`` not 2-D or without rows or lanes; ``lanes_last``
        outside ``1..N``.
    """
    op = ReduceOp.parse(op)
    vectors = _uint16_vector("vectors", vectors, 2)
    count, lanes = vectors.shape
    if count == 0 or lanes == 0:
        raise ValueError(f"vectors must hold at least one vector of at least one lane, "
                         f"not shape {vectors.shape}")
    lanes_last = check_int("lanes_last", lanes_last, 1, lanes)
    n = (count - 1) * lanes + lanes_last
    result = reduce_bits(op, vectors.reshape(-1)[:n])
    out = np.full((count, lanes), result.value, np.uint16)
    return ReduceVectorsResult(out, result.overflow, result.nan_created)
