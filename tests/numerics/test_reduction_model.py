"""The reduction model (:mod:`host.numerics.reduction`) against an independent reference.

The reference below is written from the definition in ``docs/reductions.md`` without
calling ``host.numerics.fp16`` or ``host.numerics.reduction``: a recursive tree over Python floats. Each
step adds two FP16 values exactly in float64 (two binary16 values sum to at most 41
significant bits) and rounds once with NumPy's float64-to-float16 cast (nearest even);
the maximum is IEEE 754-2019 ``maximum`` written out by hand. Events are counted per
node from the operands and the result.

Also shown here: padding to any larger power of two gives the same bits and events (the
property that makes the device's two-level tree equal to the definition for every
native size ``N``), directed special values with results worked out by hand, the
broadcast form, and argument validation.
"""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from host.spec.ops import IDENTITY, ReduceOp
from host.numerics.reduction import reduce, reduce_bits, reduce_vectors_bits, tree_size

NAN = 0x7E00
PINF, NINF = 0x7C00, 0xFC00
PZERO, NZERO = 0x0000, 0x8000
MAX_BITS = 0x7BFF                      # 65504
ONE = 0x3C00


# --- independent reference -----------------------------------------------------------------

def _value(bits: int) -> float:
    return float(np.array(bits, np.uint16).view(np.float16))


def _bits(value: float) -> int:
    if math.isnan(value):
        return NAN
    with np.errstate(over="ignore"):
        return int(np.array(value, np.float64).astype(np.float16).view(np.uint16))


def ref_combine(op: str, a: int, b: int):
    """``(bits, overflow, nan_created)`` of one tree node, from the IEEE definitions."""
    x, y = _value(a), _value(b)
    if op == "sum":
        r = _bits(x + y)                        # exact in float64, then one rounding
    elif math.isnan(x) or math.isnan(y):
        r = NAN
    elif x == 0 and y == 0:
        r = PZERO if (a == PZERO or b == PZERO) else NZERO
    else:
        r = a if x > y else b
    v = _value(r)
    overflow = math.isinf(v) and not math.isinf(x) and not math.isinf(y)
    created = math.isnan(v) and not math.isnan(x) and not math.isnan(y)
    return r, int(overflow), int(created)


def ref_tree(op: str, leaves: list[int]):
    """Balanced pairwise tree over ``leaves`` (a power of two of them)."""
    if len(leaves) == 1:
        return leaves[0], 0, 0
    half = len(leaves) // 2
    a, oa, na = ref_tree(op, leaves[:half])
    b, ob, nb = ref_tree(op, leaves[half:])
    r, o, c = ref_combine(op, a, b)
    return r, oa + ob + o, na + nb + c


def reference(op: str, bits, size: int | None = None):
    """The definition: pad with the identity to ``size`` leaves (default the smallest
    power of two that is at least ``max(n, 2)``), then the tree."""
    bits = [int(b) for b in bits]
    if size is None:
        size = 2
        while size < len(bits):
            size *= 2
    identity = NINF if op == "max" else NZERO
    return ref_tree(op, bits + [identity] * (size - len(bits)))


# --- stimulus ---------------------------------------------------------------------------------

SPECIALS = np.array([PZERO, NZERO, PINF, NINF, NAN, 0x7C01, 0xFE00, 0xFFFF, MAX_BITS,
                     0xFBFF, 0x0001, 0x8001, 0x03FF, 0x83FF, 0x0400, ONE, 0xBC00, 0x7800,
                     0xF800, 0x6800], np.uint16)


def random_vector(rng: np.random.Generator, n: int) -> np.ndarray:
    """One logical vector in one of several styles, so that long sums stay finite often
    enough to be interesting and specials, overflows and cancellations all occur."""
    style = rng.integers(5)
    if style == 0:                      # any bit pattern
        x = rng.integers(0, 1 << 16, n)
    elif style == 1:                    # finite values of mixed sign near one scale
        exp = rng.integers(1, 31)
        x = (rng.integers(0, 2, n) << 15) | (np.clip(exp + rng.integers(-3, 2, n), 0, 30)
                                            << 10) | rng.integers(0, 1024, n)
    elif style == 2:                    # large positive values: overflowing sums
        x = (rng.integers(27, 31, n) << 10) | rng.integers(0, 1024, n)
    elif style == 3:                    # subnormals and zeros of both signs
        x = (rng.integers(0, 2, n) << 15) | rng.integers(0, 1024, n) * rng.integers(0, 2, n)
    else:                               # finite values with a few specials mixed in
        x = (rng.integers(0, 2, n) << 15) | (rng.integers(0, 31, n) << 10) \
            | rng.integers(0, 1024, n)
        hit = rng.random(n) < 0.05
        x[hit] = rng.choice(SPECIALS, hit.sum())
    return x.astype(np.uint16)


def fp16(*values) -> np.ndarray:
    return np.array(values, np.float16).view(np.uint16)


# --- the model against the reference --------------------------------------------------------

@pytest.mark.parametrize("op", ["max", "sum"])
def test_random_against_reference(op):
    rng = np.random.default_rng(4 + (op == "sum"))
    for case in range(400):
        n = int(rng.choice([1, 2, 3, 5, 16, 17, 31, 64, 100, 128, 129, 255, 256, 512]))
        x = random_vector(rng, n)
        got = reduce_bits(op, x)
        assert tuple(got) == reference(op, x), (case, n, x.tolist())


def test_events_occur_in_random_cases():
    """The random stimulus reaches both event kinds (else the comparison proves little)."""
    rng = np.random.default_rng(1)
    totals = np.zeros(2, int)
    for _ in range(200):
        x = random_vector(rng, int(rng.integers(1, 200)))
        r = reduce_bits("sum", x)
        totals += (r.overflow, r.nan_created)
    assert totals.min() > 0, totals


@pytest.mark.parametrize("op", list(ReduceOp))
def test_every_pair_of_specials(op):
    name = op.name.lower()
    for a in SPECIALS:
        for b in SPECIALS:
            x = np.array([a, b], np.uint16)
            assert tuple(reduce_bits(op, x)) == reference(name, x), (hex(a), hex(b))


# --- padding and N-independence ---------------------------------------------------------------

bit_lists = st.lists(st.integers(0, 0xFFFF), min_size=1, max_size=40)
finite_lists = st.lists(st.one_of(st.integers(0, 0x7BFF), st.integers(0x8000, 0xFBFF),
                                  st.sampled_from(SPECIALS.tolist())),
                        min_size=1, max_size=40)


@settings(max_examples=300, deadline=None)
@given(op=st.sampled_from(["max", "sum"]), bits=st.one_of(bit_lists, finite_lists),
       extra=st.integers(1, 4))
def test_padding_to_a_larger_power_of_two_changes_nothing(op, bits, extra):
    base = reference(op, bits)
    size = tree_size(len(bits))
    assert reference(op, bits, size << extra) == base
    assert tuple(reduce_bits(op, np.array(bits, np.uint16), pad_to=size << extra)) == base


def two_level(op: str, bits, lanes: int, max_length: int):
    """The device's order: a lane tree over each native vector (the last one padded with
    the identity), then a tree over the per-vector results padded to ``max_length``."""
    identity = NINF if op == "max" else NZERO
    bits = [int(b) for b in bits]
    count = -(-len(bits) // lanes)
    bits += [identity] * (count * lanes - len(bits))
    per_vector, overflow, created = [], 0, 0
    for k in range(count):
        r, o, c = ref_tree(op, bits[k * lanes:(k + 1) * lanes])
        per_vector.append(r)
        overflow, created = overflow + o, created + c
    r, o, c = ref_tree(op, per_vector + [identity] * (max_length - count))
    return r, overflow + o, created + c


@settings(max_examples=300, deadline=None)
@given(op=st.sampled_from(["max", "sum"]), bits=st.one_of(bit_lists, finite_lists),
       log_lanes=st.integers(0, 6), extra=st.integers(0, 2))
def test_lane_tree_then_vector_tree_equals_the_definition(op, bits, log_lanes, extra):
    """For every N, and a vector tree padded to any max_length >= L (N * max_length >= 2,
    as in every device build), the two-level order gives the model's bits and events."""
    lanes = 1 << log_lanes
    count = -(-len(bits) // lanes)
    max_length = max(1 << (count - 1).bit_length(), 2 if lanes == 1 else 1) << extra
    expected = tuple(reduce_bits(op, np.array(bits, np.uint16)))
    assert two_level(op, bits, lanes, max_length) == expected


def beat_form(op: str, bits, n: int, lanes: int, max_length: int):
    """An MFU of ``lanes`` lanes (``l``, dividing ``n``): each native vector of ``n``
    lanes passes as ``B = n / l`` beats, the last one's trailing beats too (padded with
    the identity); a lane tree over each beat, then one tree over the ``L * B`` beat
    results padded to ``max_length * B`` (``Fp16Reduce(lanes=l, max_length=M * B)``)."""
    identity = NINF if op == "max" else NZERO
    bits = [int(b) for b in bits]
    count = -(-len(bits) // n)
    bits += [identity] * (count * n - len(bits))
    per_beat, overflow, created = [], 0, 0
    for k in range(count * n // lanes):
        r, o, c = ref_tree(op, bits[k * lanes:(k + 1) * lanes])
        per_beat.append(r)
        overflow, created = overflow + o, created + c
    beats = n // lanes
    r, o, c = ref_tree(op, per_beat + [identity] * ((max_length - count) * beats))
    return r, overflow + o, created + c


@settings(max_examples=400, deadline=None)
@given(op=st.sampled_from(["max", "sum"]), bits=st.one_of(bit_lists, finite_lists),
       log_n=st.integers(2, 6), data=st.data())
def test_beats_give_the_n_lane_bits_and_events(op, bits, log_n, data):
    """For every N from 4 to 64, every l dividing it and every max_length M >= L, the
    reduction in beats (docs/reductions.md section 2) gives the bits and events of the
    model, which are those of the N-lane device's two-level order."""
    n = 1 << log_n
    lanes = 1 << data.draw(st.integers(0, log_n), label="log_lanes")
    count = -(-len(bits) // n)
    max_length = (1 << (count - 1).bit_length()) << data.draw(st.integers(0, 2),
                                                              label="extra")
    expected = tuple(reduce_bits(op, np.array(bits, np.uint16)))
    assert beat_form(op, bits, n, lanes, max_length) == expected
    assert two_level(op, bits, n, max_length) == expected


def test_beats_keep_the_tie_that_a_running_sum_would_lose():
    """[2048, 1, 1, 1] in beats of one or two lanes: (2048 + 1) + (1 + 1) = 2050, as the
    N-lane tree gives; a beat order that paired anything else would give 2048."""
    x = fp16(2048, 1, 1, 1)
    for lanes in (1, 2, 4):
        assert beat_form("sum", x, 4, lanes, 1)[0] == int(fp16(2050)[0])
        assert beat_form("sum", x, 4, lanes, 4) == (int(fp16(2050)[0]), 0, 0)


def test_identity_combinations_create_no_events():
    """x combined with the identity (either side) is x, canonical, and never an event."""
    every = np.arange(1 << 16, dtype=np.uint16)
    for op in ReduceOp:
        name = op.name.lower()
        for x in every[::7].tolist() + SPECIALS.tolist():
            canonical = NAN if (x & 0x7FFF) > PINF else x
            assert ref_combine(name, x, IDENTITY[op]) == (canonical, 0, 0), hex(x)
            assert ref_combine(name, IDENTITY[op], x) == (canonical, 0, 0), hex(x)


# --- directed cases, results worked out by hand ------------------------------------------------

@pytest.mark.parametrize("op, bits, expected", [
    ("sum", fp16(1.0), (ONE, 0, 0)),
    ("max", fp16(-3.0), (int(fp16(-3.0)[0]), 0, 0)),
    # A lone non-canonical NaN still passes through one combination (P >= 2).
    ("sum", [0x7C01], (NAN, 0, 0)),
    ("max", [0xFFFF], (NAN, 0, 0)),
    ("sum", [NAN] * 5, (NAN, 0, 0)),
    ("max", [NAN] * 5, (NAN, 0, 0)),
    # inf + -inf: one NaN created; it propagates without further events.
    ("sum", [PINF, NINF, ONE], (NAN, 0, 1)),
    ("sum", [PINF, ONE, NINF, ONE], (NAN, 0, 1)),
    ("max", [PINF, NINF], (PINF, 0, 0)),
    # 65504 + 65504 overflows in both level-1 nodes; inf + inf at the root does not count.
    ("sum", [MAX_BITS] * 4, (PINF, 2, 0)),
    ("sum", [MAX_BITS, MAX_BITS, 0xFBFF, 0xFBFF], (NAN, 2, 1)),
    # 65504 + 16 is a tie between 65504 and 65536 (inf): even is 65536, an overflow.
    ("sum", fp16(65504, 16), (PINF, 1, 0)),
    ("sum", fp16(65504, 8), (MAX_BITS, 0, 0)),
    # Signed zeros: all -0 sums to -0 (the identity is -0 too); +0 wins in both ops.
    ("sum", [NZERO] * 7, (NZERO, 0, 0)),
    ("sum", [NZERO, NZERO, PZERO], (PZERO, 0, 0)),
    ("max", [NZERO] * 3, (NZERO, 0, 0)),
    ("max", [NZERO, PZERO, NZERO], (PZERO, 0, 0)),
    ("max", [NINF] * 3, (NINF, 0, 0)),
    # x + (-x) = +0 in a node.
    ("sum", fp16(2.5, -2.5, -0.0), (PZERO, 0, 0)),
    # Subnormals: 5 * 2**-24 exactly; the largest subnormal twice is normal.
    ("sum", [0x0001] * 5, (0x0005, 0, 0)),
    ("sum", [0x03FF, 0x03FF], (0x07FE, 0, 0)),
    ("max", [0x8001, 0x0001, 0x03FF], (0x03FF, 0, 0)),
    # The tree order decides ties: (2048 + 1) + (1 + 1) = 2048 + 2 = 2050, whereas a
    # running sum would give 2048 (each +1 is a tie to even).
    ("sum", fp16(2048, 1, 1, 1), (int(fp16(2050)[0]), 0, 0)),
    ("sum", fp16(1, 2048, 1, 1), (int(fp16(2050)[0]), 0, 0)),
    ("sum", fp16(2048, 1, 1), (int(fp16(2048)[0]), 0, 0)),
])
def test_directed(op, bits, expected):
    x = np.array(bits, np.uint16)
    assert tuple(reduce_bits(op, x)) == expected
    assert reference(op, x) == expected


# --- float API, broadcast form, validation ---------------------------------------------------

def test_float_api():
    x = np.float16([0.5, -2.0, 7.0, 1.25, 3.0])
    assert reduce("sum", x) == np.float16(9.75)
    assert reduce(ReduceOp.MAX, x) == np.float16(7.0)
    assert isinstance(reduce("max", x), np.float16)
    r = reduce("sum", np.float16([np.inf, -np.inf]))
    assert np.isnan(r) and np.array(r).view(np.uint16) == NAN


@pytest.mark.parametrize("lanes", [1, 4, 16])
def test_vectors_broadcast(lanes):
    rng = np.random.default_rng(lanes)
    for _ in range(50):
        count = int(rng.integers(1, 9))
        lanes_last = int(rng.integers(1, lanes + 1))
        vectors = random_vector(rng, count * lanes).reshape(count, lanes)
        n = (count - 1) * lanes + lanes_last
        for op in ("max", "sum"):
            out, overflow, created = reduce_vectors_bits(op, vectors, lanes_last)
            value, o, c = reference(op, vectors.reshape(-1)[:n])
            assert out.shape == (count, lanes) and out.dtype == np.uint16
            assert (out == value).all() and (overflow, created) == (o, c)


def test_vectors_ignore_lanes_after_the_last_valid_one():
    vectors = np.array([[ONE, ONE, ONE, ONE], [ONE, NAN, PINF, 0x7800]], np.uint16)
    out, overflow, created = reduce_vectors_bits("sum", vectors, 1)
    assert (out == int(fp16(5.0)[0])).all() and (overflow, created) == (0, 0)


def test_tree_size():
    assert [tree_size(n) for n in (1, 2, 3, 4, 5, 8, 9, 256, 257)] == \
        [2, 2, 4, 4, 8, 8, 16, 256, 512]


def test_op_codes_and_identities():
    assert [(op.name, op.value) for op in ReduceOp] == [("MAX", 0), ("SUM", 1)]
    assert ReduceOp.parse("sum") is ReduceOp.SUM and ReduceOp.parse(0) is ReduceOp.MAX
    assert ReduceOp.MAX.identity == 0xFC00 and ReduceOp.SUM.identity == 0x8000
    assert ReduceOp.SUM.binary_op.name == "ADD" and ReduceOp.MAX.binary_op.name == "MAX"


@pytest.mark.parametrize("call, error, message", [
    (lambda: reduce_bits("mean", np.zeros(2, np.uint16)), ValueError,
     "op must be a ReduceOp or one of 'max', 'sum', not 'mean'"),
    (lambda: reduce_bits(2, np.zeros(2, np.uint16)), ValueError,
     "op must be a ReduceOp or one of 'max', 'sum', not 2"),
    (lambda: reduce_bits(True, np.zeros(2, np.uint16)), ValueError,
     "op must be a ReduceOp or one of 'max', 'sum', not True"),
    (lambda: reduce_bits("sum", np.zeros(2, np.int32)), TypeError,
     "bits must be a uint16 array of FP16 bit patterns, not an array of int32"),
    (lambda: reduce_bits("sum", np.zeros((2, 2), np.uint16)), ValueError,
     r"bits must have 1 dimension, not shape \(2, 2\)"),
    (lambda: reduce_bits("sum", np.zeros(0, np.uint16)), ValueError,
     "bits must hold at least one element, not 0"),
    (lambda: reduce_bits("sum", np.zeros(3, np.uint16), pad_to=2), ValueError,
     "pad_to must be at least 3, not 2"),
    (lambda: reduce_bits("sum", np.zeros(3, np.uint16), pad_to=6), ValueError,
     "pad_to must be a power of two, not 6"),
    (lambda: reduce_bits("sum", np.zeros(1, np.uint16), pad_to=1), ValueError,
     "pad_to must be at least 2, not 1"),
    (lambda: reduce("sum", np.zeros(2, np.float32)), TypeError,
     "x must be a float16 array, not an array of float32"),
    (lambda: reduce("sum", np.zeros(0, np.float16)), ValueError,
     "x must hold at least one element, not 0"),
    (lambda: reduce("sum", np.float16(1)), ValueError,
     r"x must have 1 dimension, not shape \(\)"),
    (lambda: reduce_vectors_bits("sum", np.zeros((2, 4), np.uint16), 0), ValueError,
     "lanes_last must be from 1 to 4, not 0"),
    (lambda: reduce_vectors_bits("sum", np.zeros((2, 4), np.uint16), 5), ValueError,
     "lanes_last must be from 1 to 4, not 5"),
    (lambda: reduce_vectors_bits("sum", np.zeros((2, 4), np.uint16), 2.0), TypeError,
     "lanes_last must be an integer, not 2.0"),
    (lambda: reduce_vectors_bits("sum", np.zeros(4, np.uint16), 1), ValueError,
     r"vectors must have 2 dimensions, not shape \(4,\)"),
    (lambda: reduce_vectors_bits("sum", np.zeros((0, 4), np.uint16), 1), ValueError,
     r"vectors must hold at least one vector of at least one lane, not shape \(0, 4\)"),
    (lambda: tree_size(0), ValueError, "n must be at least 1, not 0"),
])
def test_errors(call, error, message):
    with pytest.raises(error, match=message):
        call()
