"""The bit-exact model of one MFU chain: its vector register files (:class:`MfuVrfs`),
its outputs and counter events (:func:`run_chain`) and the saturating counters
(:class:`MfuCounters`). The contract it follows (units, ops, allocation, the chain
encoding) is :mod:`host.spec.mfu`; ``docs/mfu.md`` is the design note.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from host.numerics.fp16 import binary_counts_bits
from host.numerics.reduction import reduce_vectors_bits
from host.numerics.unary import unary_counts
from host.spec.formats import check_int
from host.spec.mfu import (
    MfuConfig, MfuUnit, VrfBank, _check_addrs, _check_cfg, allocate,
)

__all__ = ["MfuVrfs", "ChainResult", "run_chain", "run_steps", "MfuCounters"]


class MfuVrfs:
    """The contents of every MFU's AddSubVrf and MulVrf, as the model sees them.

    Attributes
    ----------
    addsub, mul : list of ``mfus`` uint16 arrays of shape ``(vrf_depth, n)``
        Entry ``[m][a]`` is the native vector at address ``a`` of MFU ``m``'s VRF. The
        arrays of VRFs the build leaves out (``MfuConfig.has_vrf``) stay zero: no op reads
        them and :meth:`bank` refuses them.
    """

    def __init__(self, cfg: MfuConfig):
        self.cfg = _check_cfg(cfg)
        shape = (cfg.vrf_depth, cfg.n)
        self.addsub = [np.zeros(shape, np.uint16) for _ in range(cfg.mfus)]
        self.mul = [np.zeros(shape, np.uint16) for _ in range(cfg.mfus)]

    def bank(self, mfu: int, bank) -> np.ndarray:
        """The array of VRF ``bank`` (a :class:`VrfBank` or its code) of MFU ``mfu``.

        Raises
        ------
        ValueError
            ``mfu`` out of range, or a VRF the build leaves out (the MFU does not build
            the unit that reads it, ``MfuConfig.unit_sets``).
        """
        mfu = check_int("mfu", mfu, 0, self.cfg.mfus - 1)
        bank = VrfBank(bank)
        if not self.cfg.has_vrf(mfu, bank):
            units = "+".join(u.name.lower() for u in self.cfg.units(mfu))
            raise ValueError(f"MFU {mfu} has no {bank.name} VRF: it does not build unit "
                             f"{bank.unit.name} (its units: {units})")
        return (self.addsub if bank is VrfBank.ADDSUB else self.mul)[mfu]

    def write(self, mfu: int, bank, addr: int, vectors) -> None:
        """Write native vectors ``(k, n)`` (uint16) at ``addr .. addr + k - 1``.

        Raises
        ------
        ValueError
            an index out of range, the wrong shape, or ``addr + k > vrf_depth``.
        TypeError
            ``vectors`` is not a uint16 array.
        """
        target = self.bank(mfu, bank)
        vectors = _vectors("vectors", vectors, self.cfg.n)
        addr = check_int("addr", addr, 0, self.cfg.vrf_depth - 1)
        if addr + len(vectors) > self.cfg.vrf_depth:
            raise ValueError(f"addr + {len(vectors)} vectors must be at most vrf_depth "
                             f"{self.cfg.vrf_depth}, not {addr + len(vectors)}")
        target[addr:addr + len(vectors)] = vectors

    def copy(self) -> "MfuVrfs":
        new = MfuVrfs(self.cfg)
        new.addsub = [a.copy() for a in self.addsub]
        new.mul = [a.copy() for a in self.mul]
        return new


def _vectors(name, bits, n, max_rows=None):
    arr = np.asarray(bits)
    if arr.dtype != np.uint16:
        raise TypeError(f"{name} must be a uint16 array of FP16 bit patterns, not an array "
                        f"of {arr.dtype}")
    if arr.ndim != 2 or arr.shape[1] != n or arr.shape[0] < 1 or (
            max_rows is not None and arr.shape[0] > max_rows):
        rows = "1 to " + str(max_rows) if max_rows is not None else "at least 1"
        raise ValueError(f"{name} must have shape (L, {n}) with L {rows}, not {arr.shape}")
    return arr


class ChainResult(NamedTuple):
    """What one chain produces.

    out : uint16 array ``(L, n)``
        The chain's output vectors (FP16 bits).
    overflow, nan_created : tuple of ``mfus`` ints
        Events of this chain per MFU (not saturated; :class:`MfuCounters` adds them up).
    """
    out: np.ndarray
    overflow: tuple
    nan_created: tuple


def run_chain(cfg: MfuConfig, ops, x_bits, lanes_last: int, vrfs: MfuVrfs) -> ChainResult:
    """The bit-exact model of one chain through the MFU pipeline.

    Parameters
    ----------
    cfg : MfuConfig
    ops : sequence of MfuOp
        The chain's ops in order (must satisfy :func:`allocate` with the build's unit
        sets).
    x_bits : uint16 array ``(L, n)``, ``1 <= L <= cfg.max_length``
        The chain's input vectors.
    lanes_last : int, 1..n
        Valid lanes of the last vector; only reductions look at it (the other lanes of the
        last vector are ignored by them and computed like any lane by everything else).
    vrfs : MfuVrfs
        Operands: an op on MFU ``m`` reads ``vrfs.addsub[m]`` or ``vrfs.mul[m]`` at
        ``addr + j`` for native vector ``j``.

    Returns
    -------
    ChainResult

    Raises
    ------
    ValueError
        an illegal op list (see :func:`allocate`), ``addr + L > vrf_depth``, ``x_bits``
        of the wrong shape, ``lanes_last`` out of range.
    TypeError
        wrong argument types.
    """
    _check_cfg(cfg)
    placed = allocate(ops, cfg.mfus, cfg.unit_sets)
    x = _vectors("x_bits", x_bits, cfg.n, cfg.max_length)
    length = len(x)
    lanes_last = check_int("lanes_last", lanes_last, 1, cfg.n)
    if not isinstance(vrfs, MfuVrfs) or vrfs.cfg != cfg:
        raise TypeError(f"vrfs must be the MfuVrfs of this cfg, not {vrfs!r}")
    _check_addrs(cfg, placed, length)
    steps = [(m, op, op.addr) for m, mfu_ops in enumerate(placed) for op in mfu_ops]
    x, overflow, nan_created = run_steps(steps, x, lanes_last, vrfs, cfg.unary_ops, cfg.mfus)
    return ChainResult(x, tuple(overflow), tuple(nan_created))


def run_steps(steps, x, lanes_last: int, vrfs: MfuVrfs, unary_ops, mfus: int):
    """The ops of a checked chain (what :func:`run_chain` does after its checks; the model
    calls it with the plan it checked): ``steps`` is ``(mfu, op, addr)`` in chain order
    (``addr`` the VRF address of a vv op, else unused), ``x`` uint16 ``(L, n)``.
    Returns ``(out, overflow, nan_created)``, the last two lists of ``mfus`` ints.

    The units' outputs and events come from :func:`host.numerics.fp16.binary_counts_bits`
    and :func:`host.numerics.unary.unary_counts`, the fast forms of ``binary_bits`` /
    ``binary_events_bits`` and ``unary_bits`` / ``unary_events`` (tested equal to them).
    """
    length = len(x)
    overflow = [0] * mfus
    nan_created = [0] * mfus
    for m, op, addr in steps:
        unit = op.unit
        if unit is MfuUnit.ADDSUB or unit is MfuUnit.MUL:
            bank = (vrfs.addsub if unit is MfuUnit.ADDSUB else vrfs.mul)[m]
            x, o, c = binary_counts_bits(op.op, x, bank[addr:addr + length])
        elif unit is MfuUnit.ACT:
            x, o, c = unary_counts(op.op, x, ops=unary_ops)
        else:
            x, o, c = reduce_vectors_bits(op.op, x, lanes_last)
        overflow[m] += o
        nan_created[m] += c
    return x, overflow, nan_created


class MfuCounters:
    """The model of the per-MFU saturating counters ``overflow`` and ``nan_created``.

    :meth:`add` a :class:`ChainResult` after each chain; :meth:`clear` like the ``clear``
    input. Each counter stops at ``2**counter_bits - 1``.
    """

    def __init__(self, cfg: MfuConfig):
        self.cfg = _check_cfg(cfg)
        self.clear()

    def clear(self) -> None:
        self.overflow = (0,) * self.cfg.mfus
        self.nan_created = (0,) * self.cfg.mfus

    def add(self, result: ChainResult) -> None:
        top = self.cfg.counter_max
        self.overflow = tuple(min(top, c + e) for c, e in zip(self.overflow, result.overflow))
        self.nan_created = tuple(min(top, c + e)
                                 for c, e in zip(self.nan_created, result.nan_created))


