"""Tests of ``host.quant.calibrate`` (``docs/calibration.md``).

The searches are checked against brute force written here independently (one block or
one candidate at a time, errors computed directly from ``bfp.quantize(exponent=...)``),
on hand-made blocks whose errors are worked out in the comments, and, for the range
scaling loop, on synthetic monotone event functions.
"""

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from host.numerics import bfp
from host.quant import (
    ActivationCalibration,
    activation_exponent,
    activation_offset,
    calibrated_weights,
    fold_offset,
    scale_until,
    weight_exponents,
)

SETTINGS = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow]}
ROUNDINGS = ("nearest-even", "nearest-away")


# --- brute force ---------------------------------------------------------------------------

def floor_log2(v: float) -> int:
    return math.frexp(v)[1] - 1             # exact: v = f * 2**p with f in [0.5, 1)


def sq_error(x, m, e, n, rounding) -> float:
    """Total squared error of ``x`` (blocked by ``n``) quantized with static exponent(s)."""
    deq = bfp.quantize(x, n, m, rounding, exponent=e).dequantize().astype(np.float64)
    return float(((np.asarray(x, np.float64) - deq) ** 2).sum())


def brute_block_exponent(block, n, m, rounding, hi=1, lo=-3, top=15) -> int:
    amax = float(np.abs(block).max())
    if amax == 0:
        return -127
    e0 = max(floor_log2(amax), -127)
    best = None
    for e in range(e0 + hi, e0 + lo - 1, -1):
        e = min(max(e, -127), top)
        err = sq_error(block, m, e, n, rounding)
        if best is None or err < best[1]:       # first (larger) exponent wins ties
            best = (e, err)
    return best[0]


def brute_weight_exponents(w, n, m, rounding, hi=1, lo=-3):
    w = np.asarray(w)
    nblocks = -(-w.shape[-1] // n)
    out = np.zeros(w.shape[:-1] + (nblocks,), np.int64)
    for idx in np.ndindex(w.shape[:-1]):
        for b in range(nblocks):
            out[idx + (b,)] = brute_block_exponent(w[idx][b * n:(b + 1) * n], n, m,
                                                   rounding, hi, lo)
    return out


# --- weights -------------------------------------------------------------------------------

@pytest.mark.parametrize("n, m, rounding, shape, search", [
    (16, 4, "nearest-even", (12, 40), (1, -3)),      # 40 = 2.5 blocks: padding
    (8, 4, "nearest-away", (3, 5, 16), (1, -3)),
    (4, 2, "nearest-even", (10, 9), (1, -3)),
    (16, 8, "nearest-even", (6, 32), (1, -3)),
    (16, 4, "nearest-even", (8, 33), (2, -5)),
    (1, 3, "nearest-even", (7, 6), (1, -3)),
])
def test_weight_exponents_are_the_brute_force_argmin(n, m, rounding, shape, search):
    rng = np.random.default_rng(n * 100 + m)
    w = rng.standard_normal(shape) * np.exp2(rng.integers(-6, 4, shape[:-1] + (1,)))
    w[..., 0] *= 4                                  # an outlier in every row
    w.reshape(-1, shape[-1])[0] = 0                 # an all-zero row
    w.reshape(-1, shape[-1])[1, ::2] = np.round(w.reshape(-1, shape[-1])[1, ::2])  # ties
    w = w.astype(np.float32)
    got = weight_exponents(w, n, m, rounding, search)
    want = brute_weight_exponents(w, n, m, rounding, *search)
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)


def test_weight_exponents_of_fp16_weights_match_brute_force():
    rng = np.random.default_rng(7)
    w = (rng.standard_normal((20, 48)) * 0.05).astype(np.float16)
    np.testing.assert_array_equal(weight_exponents(w, 16, 4),
                                  brute_weight_exponents(w, 16, 4, "nearest-even"))


def test_search_lowers_the_total_error_on_random_weights():
    rng = np.random.default_rng(1)
    w = rng.standard_normal((64, 64)).astype(np.float32)
    e = weight_exponents(w, 16, 4)
    dyn = bfp.quantize(w, 16, 4).exponents
    assert (e != dyn).any()                         # the search does change exponents
    assert sq_error(w, 4, e, 16, "nearest-even") < sq_error(w, 4, dyn, 16, "nearest-even")


@settings(max_examples=150, **SETTINGS)
@given(data=st.data(), n=st.integers(1, 16), m=st.integers(2, 8),
       rounding=st.sampled_from(ROUNDINGS))
def test_calibrated_block_error_never_above_max_based(data, n, m, rounding):
    shape = data.draw(st.tuples(st.integers(1, 4), st.integers(1, 40)))
    w = data.draw(hnp.arrays(np.float32, shape, elements=st.floats(
        -60000, 60000, width=32, allow_subnormal=False)))
    e = weight_exponents(w, n, m, rounding)
    dyn = bfp.quantize(w, n, m, rounding).exponents
    nblocks = e.shape[-1]
    for b in range(nblocks):
        cols = slice(b * n, (b + 1) * n)
        for r in range(shape[0]):
            block = w[r, cols]
            cal = sq_error(block, m, int(e[r, b]), n, rounding)
            mx = sq_error(block, m, int(dyn[r, b]), n, rounding)
            assert cal <= mx, (block, e[r, b], dyn[r, b], cal, mx)


def test_clipping_lowers_the_error_of_a_constructed_block():
    # m = 4 (top code 7), N = 16: fifteen values 1.25 and one 2.25.
    # Max-based e = 1 (step 0.5): 1.25 -> 2.5 -> 2 (tie to even) = 1.0, error 0.0625 each;
    # 2.25 -> 4.5 -> 4 = 2.0, error 0.0625: total 16 * 0.0625 = 1.0.
    # e = 0 (step 0.25): 1.25 exact; 2.25 -> 9 -> clamped to 7 = 1.75, error 0.25: total 0.25.
    # e = 2 (step 1): 1.25 -> 1, 2.25 -> 2, total 1.0 (ties with e = 1); e = -1: 1.25 ->
    # 10 -> 7 = 0.875, error 0.140625 each, far worse.
    block = np.array([1.25] * 15 + [2.25], np.float32)
    assert bfp.quantize(block, 16, 4).exponents[0] == 1
    assert sq_error(block, 4, 1, 16, "nearest-even") == 1.0
    assert sq_error(block, 4, 0, 16, "nearest-even") == 0.25
    assert sq_error(block, 4, 2, 16, "nearest-even") == 1.0
    assert weight_exponents(block, 16, 4).tolist() == [0]
    t = calibrated_weights(block, 16, 4)
    assert t.exponents.tolist() == [0]
    assert t.saturation_count == 1                  # the clipped 2.25
    assert t.dequantize().tolist() == [1.25] * 15 + [1.75]


def test_a_hundredfold_outlier_does_not_pick_a_lower_exponent_at_4_bits():
    # DECISIONS: the example is wrong. 15 ones and 100 at m = 4: e = 6 (step 16)
    # gives 15 * 1 + (100 - 96)**2 = 31; e = 5 clips 100 to 56 (error 1936); e = 7 (step 32)
    # also gives 31, a tie, so the larger exponent 7 is kept.
    block = np.array([1.0] * 15 + [100.0], np.float32)
    assert sq_error(block, 4, 6, 16, "nearest-even") == 31.0
    assert sq_error(block, 4, 7, 16, "nearest-even") == 31.0
    assert weight_exponents(block, 16, 4).tolist() == [7]


def test_one_above_max_based_wins_when_the_maximum_rounds_past_the_top_code():
    # m = 4: 1.96875 at e = 0 is 7.875 -> clamped 7 = 1.75 (error 0.21875**2); at e = 1
    # it is 3.9375 -> 4 = 2.0 (error 0.03125**2).
    block = np.array([1.96875, 0, 0, 0], np.float32)
    assert weight_exponents(block, 4, 4).tolist() == [1]
    assert weight_exponents(block, 4, 4, search=(0, -3)).tolist() == [0]


def test_ties_go_to_the_larger_exponent_and_zero_blocks_keep_minus_127():
    # [1, 0, 0, 0] is exact at e = 0 (q = 4) and at e = 1 (q = 2): a tie.
    w = np.array([[1, 0, 0, 0], [0, 0, 0, 0]], np.float32)
    assert weight_exponents(w, 4, 4).tolist() == [[1], [-127]]


def test_exponents_are_clipped_to_what_the_mvm_accepts():
    w = np.array([65504, 1, 0, 0], np.float16)     # max-based 15; 16 would be rejected
    assert weight_exponents(w, 4, 4).max() <= 15
    assert weight_exponents(w, 4, 4, max_exponent=127).tolist() == [16]
    # 65504 at e = 15, m = 4: step 2**13, 65504 / 8192 = 7.996 -> 8 -> clamped 7;
    # at e = 16 it is 3.998 -> 4, exact 65536: the larger exponent wins when allowed.


def test_calibrated_weights_are_mrf_ready_blocks():
    rng = np.random.default_rng(3)
    w = (rng.standard_normal((16, 40)) * 0.1).astype(np.float16)
    e = weight_exponents(w, 16, 4)
    t = calibrated_weights(w, 16, 4)
    assert t == bfp.quantize(w, 16, 4, exponent=e)
    assert np.array_equal(t.exponents, e)
    # The packed bytes round-trip through the device layout's checks.
    assert bfp.unpack(bfp.pack(t), t.shape, 16, 4) == t


@pytest.mark.parametrize("kwargs, error", [
    ({"search": (-3, 1)}, ValueError),
    ({"search": (1,)}, ValueError),
    ({"search": (1.0, -3)}, TypeError),
    ({"max_exponent": 128}, ValueError),
    ({"rounding": "up"}, ValueError),
])
def test_weight_arguments_are_checked(kwargs, error):
    with pytest.raises(error):
        weight_exponents(np.ones(4, np.float32), 4, 4, **kwargs)


def test_nonfinite_weights_are_refused():
    with pytest.raises(ValueError, match="non-finite"):
        weight_exponents(np.array([1, np.inf, 0, 0], np.float32), 4, 4)
    with pytest.raises(TypeError):
        weight_exponents(np.ones(4, np.int32), 4, 4)


# --- activations ---------------------------------------------------------------------------

def brute_activation(samples, n, m, rounding):
    x = np.asarray(samples)
    per_sample = [floor_log2(float(np.abs(s).max())) for s in x if np.abs(s).max() > 0]
    hi, lo = max(per_sample) + 1, min(per_sample) - 3
    errors = {e: sq_error(x, m, e, n, rounding) for e in range(min(hi, 15), lo - 1, -1)}
    best = min(errors.values())
    exponent = max(e for e, v in errors.items() if v == best)
    deq = bfp.quantize(x, n, m, rounding).dequantize().astype(np.float64)
    dynamic = float(((x.astype(np.float64) - deq) ** 2).sum())
    return exponent, best / x.size, dynamic / x.size


@pytest.mark.parametrize("n, m, rounding, seed", [
    (16, 4, "nearest-even", 0), (16, 8, "nearest-even", 1), (8, 4, "nearest-away", 2),
    (4, 3, "nearest-even", 3),
])
def test_activation_exponent_is_the_brute_force_argmin(n, m, rounding, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((50, 37)) * np.exp2(rng.integers(-2, 3, (50, 1)))
    x = np.maximum(x, 0).astype(np.float16)        # ReLU outputs in FP16
    x[3] = 0                                       # an all-zero sample is left out
    got = activation_exponent(x, n, m, rounding)
    exponent, mse_static, mse_dynamic = brute_activation(x, n, m, rounding)
    assert got.exponent == exponent
    assert got.mse_static == pytest.approx(mse_static, rel=1e-12)
    assert got.mse_dynamic == pytest.approx(mse_dynamic, rel=1e-12)
    assert got.choice == ("static" if got.mse_static < got.mse_dynamic else "dynamic")


def test_static_is_chosen_when_it_beats_dynamic():
    # Every native vector is the constructed block: dynamic e = 1 costs 1.0 per block,
    # static e = 0 costs 0.25 (see the weight test above).
    block = np.array([1.25] * 15 + [2.25], np.float32)
    x = np.tile(block, (10, 3)) * np.where(np.arange(48) % 3 == 0, -1, 1)
    got = activation_exponent(x.astype(np.float16), 16, 4)
    assert got == ActivationCalibration(0, 0.25 / 16, 1.0 / 16, "static")
    assert got.exponent_code == 127


def test_one_above_the_largest_sample_exponent_is_searched():
    # m = 4: every sample's maximum 1.96875 rounds past the top code at its dynamic e = 0
    # (error 0.21875**2 per sample); static e = 1 holds it as 2.0 (error 0.03125**2).
    x = np.array([[1.96875, 0.5, 0, 0], [-1.96875, 0, 0.5, 0]], np.float32)
    got = activation_exponent(x, 4, 4)
    assert got == ActivationCalibration(1, 2 * 0.03125 ** 2 / 8, 2 * 0.21875 ** 2 / 8,
                                        "static")


def test_dynamic_is_chosen_when_samples_span_many_scales():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((40, 32)) * np.exp2(np.arange(40) % 10)[:, None]
    got = activation_exponent(x.astype(np.float16), 16, 4)
    assert got.choice == "dynamic"
    assert got.mse_dynamic < got.mse_static


def test_explicit_candidates_restrict_the_search():
    block = np.array([1.25] * 15 + [2.25], np.float32)
    x = np.tile(block, (4, 1))
    assert activation_exponent(x, 16, 4, candidates=[1, 2]).exponent == 2   # tie: larger
    assert activation_exponent(x, 16, 4, candidates=[-1, 1]).exponent == 1
    with pytest.raises(ValueError):
        activation_exponent(x, 16, 4, candidates=[])
    with pytest.raises(ValueError):
        activation_exponent(x, 16, 4, candidates=[16])


@pytest.mark.parametrize("samples", [
    np.zeros((3, 8), np.float32), np.ones(8, np.float32),
    np.array([[1, np.nan]], np.float32), np.zeros((0, 8), np.float32),
])
def test_activation_samples_are_checked(samples):
    with pytest.raises(ValueError):
        activation_exponent(samples, 4, 4)


def test_activation_offset_on_a_hand_example():
    x = np.array([[1.0, -2.0, 3.0], [0.5, 4.0, 2.0], [-1.0, 0.0, 7.0]])
    # minima -2, 0.5, -1: mean -2.5 / 3
    assert activation_offset(x) == pytest.approx(-2.5 / 3)
    # a sample is everything under the first axis: (S, T, F) takes the minimum over T, F
    seq = np.array([[[1.0, 2.0], [0.0, 5.0]], [[3.0, 4.0], [6.0, 2.0]]])
    assert activation_offset(seq) == 1.0


def test_folding_the_offset_into_the_bias_keeps_the_layer():
    rng = np.random.default_rng(9)
    w, b = rng.standard_normal((5, 7)), rng.standard_normal(5)
    x = rng.standard_normal((7, 11))
    for m in (activation_offset(x.T), rng.standard_normal(7)):
        mcol = np.broadcast_to(m, (7,))[:, None]
        got = w @ (x - mcol) + fold_offset(w, b, m)[:, None]
        np.testing.assert_allclose(got, w @ x + b[:, None], rtol=1e-12, atol=1e-12)
    assert np.array_equal(fold_offset(np.array([[1.0, 2.0]]), None, 3.0), [9.0])


# --- range scaling -------------------------------------------------------------------------

def halving(start_events, first=0):
    """Events that halve with every step of the offset above ``first``."""
    return lambda o: start_events >> max(o - first, 0)


@pytest.mark.parametrize("events0, threshold, start", [
    (1000, 10, 0), (1000, 0, 0), (37, 5, -2), (1 << 20, 100, 3),
])
def test_scaling_raises_until_within_threshold_and_is_tight(events0, threshold, start):
    events_at = halving(events0, start)
    res = scale_until(events_at, start, threshold, max_exponent=start + 40)
    assert events_at(res.offset) <= threshold
    assert events_at(res.offset - 1) > threshold            # one step tighter is above T
    assert res.raised
    assert res.log[0] == (start, events0)
    assert res.log[-1] == (res.offset, events_at(res.offset))
    assert [o for o, _ in res.log] == list(range(start, res.offset + 1))   # unit steps
    assert len(res.log) <= 22                               # a few iterations


def test_scaling_with_larger_steps_steps_back_to_the_tight_offset():
    events_at = halving(1000)                               # <= 10 from offset 7 on
    res = scale_until(events_at, 0, 10, 20, step=3)
    assert res.offset == 7
    assert [o for o, _ in res.log] == [0, 3, 6, 9, 8, 7]    # raise by 3, then reverse
    res = scale_until(events_at, 0, 10, 20, step=4)         # 0, 4, 8, reverse to 7, 6 > T
    assert res.offset == 7 and [o for o, _ in res.log] == [0, 4, 8, 7, 6]


@pytest.mark.parametrize("events_at", [lambda o: 0, lambda o: 3, halving(5, -10)])
def test_a_layer_within_threshold_keeps_its_start(events_at):
    # Even where lower offsets would also be within the threshold, never below start.
    res = scale_until(events_at, 2, 3, 10)
    assert res.offset == 2 and not res.raised
    assert res.log == ((2, events_at(2)),)


def counted(events, limit=100):
    """``events`` that fails the test (instead of hanging) after ``limit`` calls."""
    calls = []

    def events_at(o):
        calls.append(o)
        assert len(calls) <= limit, f"scale_until keeps calling: {calls[:20]}..."
        return events(o)
    return events_at


def test_running_out_of_exponent_range_is_refused():
    with pytest.raises(ValueError, match="ran out of exponent range.*offset 5"):
        scale_until(counted(lambda o: 100), 0, 10, 5)
    with pytest.raises(ValueError, match="ran out"):
        scale_until(counted(lambda o: 1), 4, 0, 4)          # no room at all
    # the same events with one more step of range succeed
    assert scale_until(halving(1000), 0, 10, 7).offset == 7
    with pytest.raises(ValueError, match="ran out"):
        scale_until(halving(1000), 0, 10, 6)


@pytest.mark.parametrize("args, error", [
    ((lambda o: -1, 0, 0, 5), ValueError),
    ((lambda o: 1.5, 0, 0, 5), ValueError),
    ((lambda o: None, 0, 0, 5), ValueError),
    ((lambda o: 0, 0, -1, 5), ValueError),
    ((lambda o: 0, 6, 0, 5), ValueError),
    ((lambda o: 0, 0.0, 0, 5), TypeError),
])
def test_scaling_arguments_are_checked(args, error):
    with pytest.raises(error):
        scale_until(*args)
