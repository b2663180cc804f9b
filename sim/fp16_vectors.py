"""Test vectors for the FP16 element-wise arithmetic (``host.numerics.fp16``, ``hw.arith.fp16_arith``).

Shared by the model tests (``tests/numerics/test_fp16_model.py``) and the cocotb bench
(``sim/test_fp16_arith.py``), so that both read TestFloat the same way and draw from the
same stimulus:

* :func:`find_testfloat` / :func:`read_testfloat`: Berkeley TestFloat 3 vectors from the
  conformance folder (``$NPU_CONFORMANCE_DIR``, else ``<repo>/tests/data/conformance``).
* :func:`conformance_cases`: which cases of a file a simulator runs (Icarus a seeded
  random share, :data:`ICARUS_TESTFLOAT_CASES`; every case on Verilator and in a soak).
* :func:`max_from_compare`: the expected IEEE 754-2019 ``maximum`` derived from TestFloat's
  ``f16_lt`` / ``f16_le`` results.
* :data:`SPECIALS` and :func:`random_pairs`: directed and random operand pairs.

Nothing here imports ``hw`` or cocotb.
"""

from __future__ import annotations

import gzip
import os
from pathlib import Path
from typing import NamedTuple

import numpy as np

__all__ = [
    "conformance_dir", "find_testfloat", "TestFloatVectors", "read_testfloat",
    "conformance_cases", "take_sample", "ICARUS_TESTFLOAT_CASES", "max_from_compare",
    "FLAG_OVERFLOW", "FLAG_INVALID", "SPECIALS", "random_pairs", "is_nan",
]

REPO_ROOT = Path(__file__).resolve().parent.parent

#: TestFloat exception flags (the last field of a line).
FLAG_OVERFLOW = 0x04
FLAG_INVALID = 0x10


#: The TestFloat vectors kept in the repository (a copy of the project's shared
#: conformance folder; ``tests/data/conformance/README.md`` says where they come from), so
#: that a fresh clone tests against them wherever it is checked out.
CONFORMANCE_DIR = REPO_ROOT / "tests" / "data" / "conformance"


def conformance_dir() -> Path:
    """``$NPU_CONFORMANCE_DIR`` if set, else :data:`CONFORMANCE_DIR`."""
    env = os.environ.get("NPU_CONFORMANCE_DIR")
    return Path(env) if env else CONFORMANCE_DIR


def find_testfloat(name: str) -> Path:
    """Path of TestFloat file ``name`` (in the conformance folder or its ``testfloat/``).

    Raises
    ------
    FileNotFoundError
        naming the file and the folder searched; tests turn it into a failure (the
        conformance tests never skip).
    """
    root = conformance_dir()
    for path in (root / "testfloat" / name, root / name):
        if path.is_file():
            return path
    raise FileNotFoundError(
        f"TestFloat vectors {name} not found under {root} "
        f"(set NPU_CONFORMANCE_DIR to the conformance folder)")


class TestFloatVectors(NamedTuple):
    """The columns of a two-operand TestFloat file, as arrays (uint16, flags uint8)."""
    a: np.ndarray
    b: np.ndarray
    result: np.ndarray
    flags: np.ndarray


# pytest would otherwise try to collect the NamedTuple as a test class.
TestFloatVectors.__test__ = False

#: TestFloat cases per file under Icarus in ``make test`` (of 46,464): Icarus runs the
#: binary unit about 15 times slower than Verilator, which runs every case, and the
#: full files under Icarus were two of the regression's longest tests.
ICARUS_TESTFLOAT_CASES = 12_000


def conformance_cases(simulator: str) -> int:
    """TestFloat cases per file the HDL benches run under ``simulator``: 0 (every case)
    on Verilator and with ``NPU_SOAK=1`` (``make soak``), else
    :data:`ICARUS_TESTFLOAT_CASES`, for ``take_sample``."""
    if simulator == "verilator" or os.environ.get("NPU_SOAK") == "1":
        return 0
    return ICARUS_TESTFLOAT_CASES


def take_sample(v: TestFloatVectors, cases: int, seed: int) -> TestFloatVectors:
    """``cases`` of the file's cases, drawn at random with ``seed`` and kept in file order
    (0: all of them). A random draw, not a stride: a file lists the products of a set of
    operands row by row, and a stride that divides the row length would keep only some
    second operands.

    Raises
    ------
    ValueError
        ``cases`` negative or above the file's count.
    """
    n = len(v.a)
    if not 0 <= cases <= n:
        raise ValueError(f"cases must be 0 (all) to {n}, not {cases}")
    if cases in (0, n):
        return v
    keep = np.sort(np.random.default_rng(seed).choice(n, cases, replace=False))
    return TestFloatVectors(*(column[keep] for column in v))


def read_testfloat(path) -> TestFloatVectors:
    """Read ``f16_<op>`` vectors: lines ``A B result flags`` in hexadecimal.

    For the comparisons (``f16_lt``, ``f16_le``, ``f16_eq``) the result is 0 or 1.
    """
    rows = []
    with gzip.open(path, "rt") as f:
        for line in f:
            fields = line.split()
            if fields:
                if len(fields) != 4:
                    raise ValueError(f"{path}: not a two-operand line: {line!r}")
                rows.append([int(x, 16) for x in fields])
    if not rows:
        raise ValueError(f"{path}: no vectors")
    arr = np.array(rows, dtype=np.int64)
    return TestFloatVectors(arr[:, 0].astype(np.uint16), arr[:, 1].astype(np.uint16),
                            arr[:, 2].astype(np.uint16), arr[:, 3].astype(np.uint8))


def is_nan(bits) -> np.ndarray:
    """True where the FP16 bit patterns are NaNs (any sign, payload or quietness)."""
    return (np.asarray(bits, dtype=np.uint16) & 0x7FFF) > 0x7C00


def max_from_compare(a, b, a_before_b) -> np.ndarray:
    """Expected ``maximum(a, b)`` from TestFloat's ordered comparison of the pair.

    ``a_before_b`` is TestFloat's ``lt(a, b)`` or ``le(a, b)`` (0/1). For ordered,
    distinct values both say "``b`` is the larger": ``max = b if a_before_b else a``.
    The comparison is silent about the two cases IEEE 754-2019 ``maximum`` adds, so the
    documented rules (``docs/numerics.md`` section 6) are applied there:

    * a NaN operand: every comparison is false, but ``maximum`` is a NaN, canonical
      ``0x7E00``;
    * two zeros: ``+0 == -0``, so ``lt`` is false and ``le`` true whatever the signs, but
      ``maximum`` orders ``-0 < +0``: the result is ``+0`` unless both are ``-0`` (the
      sign bits AND together).

    With equal non-zero values ``a`` and ``b`` have the same bits, so the choice between
    them does not matter.
    """
    a = np.asarray(a, dtype=np.uint16)
    b = np.asarray(b, dtype=np.uint16)
    r = np.where(np.asarray(a_before_b) != 0, b, a)
    zeros = ((a & 0x7FFF) == 0) & ((b & 0x7FFF) == 0)
    r = np.where(zeros, a & b, r)
    return np.where(is_nan(a) | is_nan(b), 0x7E00, r).astype(np.uint16)


# --- stimulus ----------------------------------------------------------------------------

#: Operands that exercise every special case: signed zeros, the smallest and largest
#: subnormals, the smallest normal, one and its neighbours, halves, the largest finite,
#: infinities, quiet and signalling NaNs with payloads and signs.
SPECIALS = np.array(sorted({
    s | m
    for s in (0x0000, 0x8000)
    for m in (0x0000, 0x0001, 0x0002, 0x0003, 0x01FF, 0x0200, 0x03FF, 0x0400, 0x0401,
              0x07FF, 0x0800, 0x1400, 0x3800, 0x3BFF, 0x3C00, 0x3C01, 0x3E00, 0x4000,
              0x5BFF, 0x7800, 0x7BFE, 0x7BFF, 0x7C00, 0x7C01, 0x7D00, 0x7E00, 0x7FFF)
}), dtype=np.uint16)


def _fields(rng, n, exp):
    """Bit patterns with exponent fields ``exp`` (clipped to 0..30), random rest."""
    exp = np.clip(exp, 0, 30).astype(np.uint16)
    sign = rng.integers(0, 2, n, dtype=np.uint16) << 15
    frac = rng.integers(0, 1024, n, dtype=np.uint16)
    # Sparse fractions make exact ties and exact cancellations likely.
    sparse = rng.random(n) < 0.3
    frac = np.where(sparse, frac & rng.choice(np.array([0x200, 0x300, 0x3FF, 0x001, 0x201],
                                                       dtype=np.uint16), n), frac)
    return (sign | (exp << 10) | frac).astype(np.uint16)


def random_pairs(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` operand pairs (uint16 arrays) mixing uniform bits and hard cases.

    * uniform random bit patterns (about 3% infinities and NaNs);
    * exponents within 0..3 of each other: cancellation, carries, ties, subnormal sums;
    * exponent sums near the underflow threshold of a product (results subnormal or
      rounding to zero) and near its overflow threshold;
    * one operand, or both, from :data:`SPECIALS`.
    """
    kind = rng.integers(0, 6, n)
    a = rng.integers(0, 1 << 16, n, dtype=np.uint16)
    b = rng.integers(0, 1 << 16, n, dtype=np.uint16)
    ea = rng.integers(0, 31, n)
    close = _fields(rng, n, ea), _fields(rng, n, ea + rng.integers(-3, 4, n))
    # Product exponent field: ea + eb - 15 (plus a carry); subnormal below 1, overflow
    # from 31. Aim around both edges.
    tiny_sum = rng.integers(-12, 17, n) + 15
    tiny_a = rng.integers(0, 31, n)
    tiny = _fields(rng, n, tiny_a), _fields(rng, n, tiny_sum - tiny_a)
    huge_sum = rng.integers(43, 48, n)
    huge_a = rng.integers(13, 31, n)
    huge = _fields(rng, n, huge_a), _fields(rng, n, huge_sum - huge_a)
    spec_a = rng.choice(SPECIALS, n)
    spec_b = rng.choice(SPECIALS, n)
    a = np.select([kind == 1, kind == 2, kind == 3, kind == 4, kind == 5],
                  [close[0], tiny[0], huge[0], spec_a, spec_a], a)
    b = np.select([kind == 1, kind == 2, kind == 3, kind == 4, kind == 5],
                  [close[1], tiny[1], huge[1], b, spec_b], b)
    swap = rng.random(n) < 0.5
    return (np.where(swap, b, a).astype(np.uint16), np.where(swap, a, b).astype(np.uint16))
