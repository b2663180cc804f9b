"""``NpuModel.push_input`` takes what ``Device.push_input`` takes, with the same checks.

Native vectors ``(k >= 1, n)`` only: uint16 FP16 bit patterns or float16 values (as the
device), and float32 / float64 values rounded to FP16 to nearest even
(``host.numerics.mvm.fp16_bits``). Another shape is a ``ValueError`` as on the device,
another dtype a ``TypeError`` naming the argument and the dtype; a refused push leaves the
queue as it was. The parity tests drive a ``Device`` over ``ModelTransport`` with the same
inputs.
"""

import numpy as np
import pytest

from host.model.core import NpuError, NpuModel
from host.runtime.device import Device
from host.runtime.transport import ModelTransport
from host.spec.config import NpuConfig
from host.spec.isa import ErrorCode

CFG = NpuConfig(n=8, tiles=1, mrf_depth=32, max_col_tiles=8, ivrf_depth=64, vrf_depth=32,
                netq_depth=16, max_length=4)
N = CFG.n


@pytest.fixture
def model():
    m = NpuModel(CFG)
    m.push_input(np.arange(2 * N, dtype=np.uint16).reshape(2, N))     # something queued
    return m


def queue(model):
    """The queued vectors, read without changing the model's state."""
    return model._inq.copy()


def test_uint16_bits_are_queued_as_they_are(model):
    v = np.array([[0x3C00, 0x7E01, 0xFC00, 0x0001, 0x8000, 0, 1, 0xFFFF]], np.uint16)
    model.push_input(v)
    assert model.input_level == 3
    assert np.array_equal(queue(model)[2], v[0])


def test_float16_values_are_queued_as_their_bits(model):
    v = np.float16([[1.5, -2, np.inf, 0.1, 65504, -0.0, 6e-8, 3]])
    model.push_input(v)                  # the device takes float16; the model refused it
    assert np.array_equal(queue(model)[2], v.view(np.uint16)[0])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_wider_floats_are_rounded_to_nearest_even(model, dtype):
    ulp = 2.0 ** -10
    v = np.array([[1.5, 2, 3.7, 1 + ulp / 2, 1 + 3 * ulp / 2, -(1 + ulp / 2), 2.0 ** -25,
                   65519]], dtype)
    model.push_input(v)
    assert list(queue(model)[2]) == [0x3E00, 0x4000, 0x4366, 0x3C00, 0x3C02, 0xBC00, 0, 0x7BFF]


def test_overflow_to_inf_warns_with_the_argument_and_the_count(model):
    v = np.zeros((2, N), np.float32)
    v[0, 0], v[1, 3], v[1, 4] = 7e4, -1e9, np.inf          # the inf was one already
    with pytest.warns(RuntimeWarning, match=r"^vectors: 2 finite values beyond the FP16 "
                                            r"range") as rec:
        model.push_input(v)
    assert rec[0].filename == __file__
    assert list(queue(model)[2:, [0, 3, 4]].reshape(-1)) == [0x7C00, 0, 0, 0, 0xFC00, 0x7C00]


BAD_DTYPES = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint32, np.uint64, np.bool_,
              np.complex64, np.longdouble, object]


@pytest.mark.parametrize("dtype", BAD_DTYPES, ids=lambda d: np.dtype(d).name)
def test_other_dtypes_are_refused_and_nothing_is_queued(model, dtype):
    before = queue(model)
    with pytest.raises(TypeError, match=rf"^vectors must .* not an array of "
                                        rf"{np.dtype(dtype).name}$"):
        model.push_input(np.ones((1, N), dtype))
    assert np.array_equal(queue(model), before)


BAD_SHAPES = [(N,), (1, N - 1), (1, N + 1), (2, 1, N), (0, N), (), (N, 1)]


@pytest.mark.parametrize("shape", BAD_SHAPES, ids=str)
@pytest.mark.parametrize("dtype", [np.uint16, np.float16, np.float32])
def test_other_shapes_are_refused_as_on_the_device_and_nothing_is_queued(model, shape, dtype):
    before = queue(model)
    with pytest.raises(ValueError, match=rf"^vectors must be .*shape \(count >= 1, {N}\).* "
                                         rf"not {np.dtype(dtype).name} "
                                         rf"{re_shape(shape)}$"):
        model.push_input(np.zeros(shape, dtype))
    assert np.array_equal(queue(model), before)


def re_shape(shape):
    return str(shape).replace("(", r"\(").replace(")", r"\)")


def test_a_full_queue_refuses_the_whole_push(model):
    before = queue(model)
    with pytest.raises(NpuError) as e:
        model.push_input(np.zeros((CFG.netq_depth - 1, N), np.float32))
    assert e.value.code is ErrorCode.QUEUE_OVERFLOW
    assert np.array_equal(queue(model), before)
    model.push_input(np.zeros((CFG.netq_depth - 2, N), np.float32))
    assert model.input_level == CFG.netq_depth


def test_the_pushed_array_is_copied(model):
    v = np.ones((1, N), np.uint16)
    model.push_input(v)
    v[:] = 7
    assert np.all(queue(model)[2] == 1)


# --- parity with Device.push_input -------------------------------------------------------------

@pytest.fixture
def both():
    """``(push to the model, push to a Device on another model, the two models)``."""
    direct, behind = NpuModel(CFG), NpuModel(CFG)
    dev = Device(ModelTransport(behind))
    yield direct, dev, behind
    dev.close()


@pytest.mark.parametrize("dtype", [np.uint16, np.float16])
def test_what_the_device_takes_the_model_takes_alike(both, dtype):
    direct, dev, behind = both
    rng = np.random.default_rng(1)
    v = rng.integers(0, 1 << 16, (3, N), dtype=np.uint16).view(dtype)
    direct.push_input(v)
    dev.push_input(v)
    assert np.array_equal(queue(direct), queue(behind))


@pytest.mark.parametrize("shape", BAD_SHAPES, ids=str)
def test_shapes_the_device_refuses_the_model_refuses_alike(both, shape):
    direct, dev, behind = both
    v = np.zeros(shape, np.uint16)
    with pytest.raises(ValueError, match=r"shape \(count >= 1, 8\)"):
        dev.push_input(v)
    with pytest.raises(ValueError, match=r"shape \(count >= 1, 8\)"):
        direct.push_input(v)
    assert direct.input_level == behind.input_level == 0
