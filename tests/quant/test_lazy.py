"""host.quant.lazy: seed 003's lazy BFP update, in exact integers."""

import numpy as np
import pytest

from host.numerics import bfp
from host.quant.lazy import LazyBfp


def _param(values, **kw):
    return LazyBfp(np.asarray(values, np.float64), block_size=4, **kw)


def test_initial_weight_is_the_device_quantization_and_nothing_is_lost():
    rng = np.random.default_rng(1)
    w = rng.standard_normal((3, 10))
    p = LazyBfp(w, block_size=4)
    want = bfp.quantize(w.astype(np.float32), 4, 8).dequantize()
    np.testing.assert_array_equal(p.weight(), want)
    # The accumulator keeps the residual to within half an accumulator unit.
    unit = np.repeat(p.weight_step / 2 ** p.frac_bits, 4, axis=-1)[..., :10]
    assert (np.abs(p.total() - w) <= unit / 2).all()


def test_a_thousand_hundredth_steps_move_the_weight_ten_steps():
    p = _param([1.0, 0.5, 0.25, -1.0])            # exponent 0, weight step 2**-6
    s = p.weight_step[0]
    before = p.weight().copy()
    for _ in range(1000):
        p.update(np.full(4, 0.01 * s))
    moved = (p.weight() - before) / s
    np.testing.assert_array_equal(moved, [10, 10, 10, 10])
    # A naive 8-bit update (weight + step rounded back to 8 bits) never moves.
    naive = before.copy()
    for _ in range(1000):
        naive = bfp.quantize((naive + 0.01 * s).astype(np.float32), 4, 8).dequantize()
    np.testing.assert_array_equal(naive, before)


def test_conservation_and_half_step_bound_over_random_updates():
    rng = np.random.default_rng(2)
    w = rng.standard_normal((5, 12))
    p = LazyBfp(w, block_size=4)
    expected = p.total().copy()
    for _ in range(300):
        units_before = p.weight_step.copy()
        step = rng.standard_normal(w.shape) * 0.003
        raises = p.exponent_raises
        p.update(step)
        # What the update adds: the step rounded to the accumulator grid it found.
        unit = np.repeat(units_before / 2 ** p.frac_bits, 4, axis=-1)[..., :12]
        expected = expected + np.rint(step / unit) * unit
        tol = 0 if p.exponent_raises == raises else np.max(unit) * (p.exponent_raises - raises)
        assert np.max(np.abs(p.total() - expected)) <= tol
        expected = p.total().copy() if tol else expected
        assert (np.abs(p.accumulator) <= 1 << (p.frac_bits - 1)).all()
        assert (np.abs(p.mantissas) <= 127).all()


def test_overflow_raises_the_exponent_and_conserves_the_sum():
    p = _param([1.0, 1.0, 1.0, 1.0])              # q = 64, step 2**-6
    p.update(np.full(4, 1.5))                       # 96 weight steps: beyond the 8 of headroom
    assert p.exponent_raises >= 1 and p.step_clamps == 0
    np.testing.assert_allclose(p.total(), 2.5, atol=p.weight_step[0] / 2 ** p.frac_bits)
    np.testing.assert_array_equal(p.weight(), [2.5] * 4)
    # A zero block (a zero bias) grows from the smallest exponent on its first step.
    z = _param([0.0, 0.0, 0.0, 0.0])
    z.update(np.array([0.1, -0.2, 0.0, 0.05]))
    np.testing.assert_allclose(z.total(), [0.1, -0.2, 0.0, 0.05], rtol=2 ** -12)
    assert z.step_clamps == 0


def test_a_shrinking_block_lowers_its_exponent_exactly():
    p = _param([1.0, -1.0, 0.5, 0.0])
    p.update(np.array([-0.875, 0.875, -0.4375, 0.0]))    # to 1/8, -1/8, 1/16, 0
    np.testing.assert_array_equal(p.weight(), [0.125, -0.125, 0.0625, 0.0])
    assert p.exponents[0] == -3                     # max-based for 0.125
    assert np.abs(p.mantissas).max() == 64


def test_steps_clamp_only_at_the_largest_exponent():
    p = _param([2.0 ** 127] * 4)                    # exponent 127, q = 64, step 2**121
    p.update(np.full(4, 2.0 ** 127))                # 64 steps: beyond the 8 of headroom
    assert p.step_clamps == 4 and p.exponent_raises == 0
    # Clamped to 32767 units (f = 12): 8 steps minus one unit; transferred, 8 steps move.
    np.testing.assert_array_equal(p.mantissas[0, 0], [72] * 4)
    for _ in range(6):
        p.update(np.full(4, 2.0 ** 124))            # 8 steps each: 72 + 48 = 120
    before = (p.mantissas.copy(), p.accumulator.copy(), p.step_clamps)
    with pytest.raises(OverflowError, match="largest exponent 127"):
        p.update(np.full(4, 2.0 ** 124))            # 128 > 127 at the largest exponent
    np.testing.assert_array_equal(p.mantissas, before[0])
    np.testing.assert_array_equal(p.accumulator, before[1])
    assert p.step_clamps == before[2]


def test_bad_arguments_leave_the_state_unchanged():
    p = _param([1.0, 2.0, 3.0])
    before = (p.mantissas.copy(), p.accumulator.copy(), p.exponents.copy())
    with pytest.raises(ValueError, match="shape"):
        p.update(np.zeros(4))
    with pytest.raises(ValueError, match="inf or NaN"):
        p.update(np.array([0.0, np.nan, 0.0]))
    for a, b in zip(before, (p.mantissas, p.accumulator, p.exponents)):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(TypeError, match="float"):
        LazyBfp(np.arange(4), 4)
    with pytest.raises(ValueError, match="accumulator_bits"):
        LazyBfp(np.ones(4), 4, accumulator_bits=4, headroom=3)
    assert p.memory_bits() == 4 * (8 + 16) + 8
