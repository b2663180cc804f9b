"""The MFU kernels' one-pass forms against the definitions, bit for bit.

``unary_counts`` looks results and events up in a table that ``unary._evaluate`` (the
definition behind ``unary_bits`` and ``unary_events``) computed once; it must agree with
them on every FP16 pattern, for every op and several builds. ``binary_counts_bits``
skips the event and NaN work when no result is an infinity or NaN; it must agree with
``binary_bits`` and ``binary_events_bits`` everywhere, specials included.
"""

import numpy as np
import pytest

from host.numerics import fp16 as F
from host.numerics import unary as U
from host.spec.ops import BinaryOp, UnaryOp

ALL = np.arange(1 << 16, dtype=np.uint16)
BUILDS = [None, (UnaryOp.SIGMOID, UnaryOp.TANH), (UnaryOp.RELU, UnaryOp.EXP, UnaryOp.RECIP)]


@pytest.mark.parametrize("ops", BUILDS)
@pytest.mark.parametrize("op", list(UnaryOp))
def test_unary_counts_every_pattern(op, ops):
    rng = np.random.default_rng(op.value)
    for x in (ALL, rng.permutation(ALL).reshape(256, 16, 16), ALL[:0]):
        out, overflow, nan_created = U.unary_counts(op, x, ops=ops)
        want = U.unary_bits(op, x, ops=ops)
        ovf, nanc = U.unary_events(op, x, ops=ops)
        assert out.dtype == np.uint16 and out.shape == x.shape
        assert np.array_equal(out, want)
        assert overflow == int(ovf.sum()) and nan_created == int(nanc.sum())
        assert isinstance(overflow, int) and isinstance(nan_created, int)


def test_unary_counts_other_inputs():
    x = np.array([0, 0x3C00, 0xFC00, 0x7E00, 1], np.int64)     # integers: the definition
    for op in ("exp", UnaryOp.RECIP, 2):
        out, overflow, nan_created = U.unary_counts(op, x)
        assert np.array_equal(out, U.unary_bits(op, x))
        assert overflow == int(U.unary_events(op, x)[0].sum())
        assert nan_created == int(U.unary_events(op, x)[1].sum())
    with pytest.raises(ValueError):
        U.unary_counts("softplus", x)
    with pytest.raises(ValueError):
        U.unary_counts("exp", np.array([-1, 1 << 16]))


def _pairs(rng, size):
    a = rng.integers(0, 1 << 16, size).astype(np.uint16)
    b = rng.integers(0, 1 << 16, size).astype(np.uint16)
    specials = np.array([0, 0x8000, 0x7C00, 0xFC00, 0x7E00, 0x7D01, 0x7BFF, 0xFBFF, 1,
                         0x8001, 0x0400, 0x3C00], np.uint16)
    pick = rng.random(size) < 0.2
    a[pick] = rng.choice(specials, int(pick.sum()))
    pick = rng.random(size) < 0.2
    b[pick] = rng.choice(specials, int(pick.sum()))
    return a, b


@pytest.mark.parametrize("op", list(BinaryOp))
def test_binary_counts_equal_bits_and_events(op):
    rng = np.random.default_rng(op.value + 50)
    a, b = _pairs(rng, (64, 16, 16))
    big_a, big_b = _pairs(rng, 3 * F._CHUNK + 5)              # pieces, the last short
    cases = [(a, b), (a[:, :1], b[0]), (a[0], b), (big_a, big_b),
             (big_a & 0x3FFF, big_b & 0x3FFF), (a[::2], b[1::2])]
    # Finite operands only, some of them overflowing (the skip and the full path).
    fa = a & 0x7BFF
    fb = b & 0x7BFF
    cases += [(fa, fb), (fa & 0x3FFF, fb & 0x3FFF), (np.full(4, 0x7BFF, np.uint16),
                                                    np.full(4, 0x7BFF, np.uint16))]
    for x, y in cases:
        out, overflow, nan_created = F.binary_counts_bits(op, x, y)
        want = F.binary_bits(op, x, y)
        ev = F.binary_events_bits(op, x, y)
        assert out.dtype == np.uint16 and out.shape == want.shape
        assert np.array_equal(out, want)
        assert overflow == int(ev.overflow.sum())
        assert nan_created == int(ev.nan_created.sum())


def test_binary_counts_arguments():
    a = np.array([0x3C00, 0x4000], np.uint16)
    assert F.binary_counts_bits("add", a, a)[0].tolist() == [0x4000, 0x4400]
    assert F.binary_counts_bits(BinaryOp.MUL, a, np.uint16(0x7BFF))[1] == 1
    with pytest.raises(TypeError):
        F.binary_counts_bits("add", a.view(np.float16), a)
    with pytest.raises(ValueError):
        F.binary_counts_bits("add", a, np.zeros(3, np.uint16))
    with pytest.raises(ValueError):
        F.binary_counts_bits("div", a, a)


# --- the float32 form of the element-wise ops -----------------------------------------------

FINITE = ALL[(ALL & 0x7C00) != 0x7C00]


def test_finite_to_float32_every_pattern():
    got = F.finite_to_float32(FINITE)
    want = FINITE.view(np.float16).astype(np.float32)
    assert got.dtype == np.float32
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))      # -0 included
    # inf and NaN patterns come out at 2**16 or more in magnitude (how they are found).
    special = ALL[(ALL & 0x7C00) == 0x7C00]
    assert (np.abs(F.finite_to_float32(special)) >= 65536).all()


def _others():
    """FP16 patterns that meet every pattern in the test below: every exponent field
    with the fractions 0, 1, the middle, all ones and two more, both signs."""
    fracs = np.array([0, 1, 0x200, 0x3FF, 0x155, 0x2AA], np.uint16)
    mags = ((np.arange(31, dtype=np.uint16)[:, None] << 10) | fracs).reshape(-1)
    return np.concatenate([mags, mags | 0x8000])


@pytest.mark.parametrize("op", [BinaryOp.ADD, BinaryOp.A_SUB_B, BinaryOp.B_SUB_A,
                                BinaryOp.MUL])
def test_float32_form_every_finite_pattern(op):
    """Every finite pattern against 372 others (every exponent distance, carries, ties
    at every binade, subnormal and overflowing results) and 2**20 random finite pairs,
    bit for bit against the float64 definition, and the counts through the public
    function."""
    rng = np.random.default_rng(op.value + 70)
    for b in _others():
        bb = np.full(FINITE.shape, b, np.uint16)
        for x, y in ((FINITE, bb), (bb, FINITE)):
            got = F._float32_bits(op, x, y)
            want = F._evaluate(op, x, y)[0]
            bad = np.flatnonzero(got != want)
            assert bad.size == 0, (op, hex(int(b)), [hex(int(x[i])) for i in bad[:3]])
    x, y = rng.choice(FINITE, 1 << 20), rng.choice(FINITE, 1 << 20)
    assert np.array_equal(F._float32_bits(op, x, y), F._evaluate(op, x, y)[0])
    out, overflow, nan_created = F.binary_counts_bits(op, x, y)
    want, ovf, nanc = F._evaluate(op, x, y)
    assert np.array_equal(out, want)
    assert overflow == int(ovf.sum()) and nan_created == int(nanc.sum())


def test_float32_form_refuses_inf_and_nan():
    rng = np.random.default_rng(3)
    x, y = rng.choice(FINITE, 8192), rng.choice(FINITE, 8192)
    for special in (0x7C00, 0xFC00, 0x7E00, 0xFD01):
        for a, b in ((x.copy(), y), (x, y.copy())):
            (a if a is not x else b)[77] = special
            assert F._float32_bits(BinaryOp.ADD, a, b) is None
            out, overflow, nan_created = F.binary_counts_bits(BinaryOp.MUL, a, b)
            want, ovf, nanc = F._evaluate(BinaryOp.MUL, a, b)
            assert np.array_equal(out, want) and overflow == int(ovf.sum())
            assert nan_created == int(nanc.sum())
