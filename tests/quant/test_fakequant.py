"""host.quant.fakequant: PyTorch fake quantization equals the device's quantizer.

The oracle is host.numerics.bfp.quantize (itself checked against the exact reference and
the gateware) and host.numerics.mvm.mvm for the dense layer; the values must agree bit
for bit, the gradients must be straight-through (identity inside the range, zero where a
static exponent clamps).
"""

import numpy as np
import pytest
import torch  # the torch extra, which make venv installs

from host.numerics import bfp as np_bfp
from host.numerics.mvm import mvm
from host.quant import fakequant as fq


def _oracle(x, n, m, rounding="nearest-even", exponent=None):
    return np_bfp.quantize(x, n, m, rounding, exponent).dequantize().astype(np.float64)


def _edge_values(rng, size):
    """FP16-representable values with ties at every mantissa width, subnormals, zeros,
    block maxima that round past the top code, and negatives."""
    specials = np.array([0.0, -0.0, 6e-8, -6e-8, 1.0, 1.96875, -1.96875, 2.25, 1.25,
                         0.5 + 2 ** -5, 65504.0, -65504.0, 3.0, -3.0, 0.75, -0.375],
                        np.float32)
    x = rng.choice(specials, size=size) * np.ldexp(1.0, rng.integers(-6, 6, size))
    return np.clip(x, -65504, 65504).astype(np.float16).astype(np.float32)


@pytest.mark.parametrize("m", [2, 3, 4, 5, 8, 11, 16])
@pytest.mark.parametrize("rounding", ["nearest-even", "nearest-away"])
@pytest.mark.parametrize("n", [4, 16, 5])
def test_bfp_equals_device_quantizer(m, rounding, n):
    rng = np.random.default_rng(m * 100 + n)
    for x in (rng.standard_normal((7, 3 * n + 2)).astype(np.float32) *
              np.ldexp(1.0, rng.integers(-20, 12, (7, 1))).astype(np.float32),
              _edge_values(rng, (9, 2 * n + 1)),
              np.zeros((2, n), np.float32)):
        got = fq.bfp(torch.from_numpy(x), n, m, rounding).numpy().astype(np.float64)
        want = _oracle(x, n, m, rounding)
        np.testing.assert_array_equal(got, want, err_msg=f"m={m} {rounding} n={n}")


@pytest.mark.parametrize("rounding", ["nearest-even", "nearest-away"])
def test_static_exponents_saturate_as_the_device(rounding):
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((5, 32)) * 8).astype(np.float32)
    for exponent in (-3, 0, 2, np.array([[1], [0], [-1], [3], [-127]])):
        got = fq.bfp(torch.from_numpy(x), 8, 4, rounding, exponent).numpy()
        np.testing.assert_array_equal(got.astype(np.float64),
                                      _oracle(x, 8, 4, rounding, exponent))


def test_fp16_rounds_float64_once():
    # 1 + 2**-11 + 2**-30 lies just above the tie between 1 and 1 + 2**-10: a conversion
    # through float32 drops the 2**-30 and rounds the tie to even (1.0).
    x = torch.tensor([1 + 2 ** -11 + 2 ** -30, 1 + 2 ** -11, 70000.0, -1e-9],
                     dtype=torch.float64)
    got = fq.fp16(x).numpy()
    with np.errstate(over="ignore"):
        want = x.numpy().astype(np.float16).astype(np.float64)
    np.testing.assert_array_equal(got, want)
    assert got[0] == 1 + 2 ** -10 and np.isinf(got[2])


def test_gradients_are_straight_through():
    x = torch.tensor([[0.1, -0.7, 3.0, 0.2]], requires_grad=True)
    fq.bfp(x, 4, 4).sum().backward()
    assert x.grad.tolist() == [[1.0, 1.0, 1.0, 1.0]]
    # A static exponent of -1 (step 1/8 at m = 4): top 7/8; 3.0 and -0.7 clamp (|x| >=
    # 7.5/8 is 3.0 only; -0.7 is -5.6 steps, inside).
    x.grad = None
    y = fq.bfp(x, 4, 4, exponent=-1)
    assert y.tolist()[0][2] == pytest.approx(0.875)
    y.sum().backward()
    assert x.grad.tolist() == [[1.0, 1.0, 0.0, 1.0]]
    x.grad = None
    fq.fp16(x * 3).sum().backward()
    assert x.grad.tolist() == [[3.0, 3.0, 3.0, 3.0]]


def test_bfp_linear_equals_the_device_mvm():
    """A dense layer with FP16 weights and inputs: the MVM's output bits (exact
    accumulation, one rounding to FP16), then the FP16 bias add."""
    rng = np.random.default_rng(3)
    n, m_v, m_w, rows, cols = 8, 5, 4, 13, 20
    layer = fq.BfpLinear(cols, rows, block_size=n, mantissa_bits_v=m_v, mantissa_bits_w=m_w)
    w = rng.standard_normal((rows, cols)).astype(np.float16)
    b = rng.standard_normal(rows).astype(np.float16)
    with torch.no_grad():
        layer.weight.copy_(torch.from_numpy(w.astype(np.float32)))
        layer.bias.copy_(torch.from_numpy(b.astype(np.float32)))
    x = (rng.standard_normal((6, cols)) * 4).astype(np.float16)
    got = layer(torch.from_numpy(x.astype(np.float32))).detach().numpy()
    qw = np_bfp.quantize(w.astype(np.float32), n, m_w)
    out = mvm(x.view(np.uint16), qw.exponent_codes, qw.mantissas, n=n,
              mantissa_bits_v=m_v, mantissa_bits_w=m_w, accumulators=False).out_bits
    want = (out.view(np.float16) + b).astype(np.float16).astype(np.float32)
    np.testing.assert_array_equal(got, want)


def test_bad_arguments_are_named():
    x = torch.zeros(4)
    with pytest.raises(TypeError, match="floating-point"):
        fq.bfp(torch.zeros(4, dtype=torch.int32), 4, 4)
    with pytest.raises(ValueError, match="mantissa_bits"):
        fq.bfp(x, 4, 1)
    with pytest.raises(ValueError, match="exponent must lie"):
        fq.bfp(x, 4, 4, exponent=200)
    with pytest.raises(TypeError, match="exponent must be integers"):
        fq.bfp(x, 4, 4, exponent=1.5)
    with pytest.raises(ValueError, match="inf or NaN"):
        fq.bfp(torch.tensor([1.0, float("nan")]), 4, 4)
    with pytest.raises(ValueError, match="rounding"):
        fq.BfpQuantizer(4, 4, "down")
