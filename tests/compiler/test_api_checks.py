"""The program builder never computes with data it silently reinterpreted.

* FP16 data goes through ``host.numerics.mvm.fp16_bits``: float16/32/64 arrays are values,
  rounded to FP16 to nearest even; uint16 arrays are bit patterns; every other dtype is a
  ``TypeError`` naming the argument and the dtype; finite floats that overflow to inf
  warn, naming the argument and the count.
* Shapes must match: a bias of another length than the matrix's rows, an input of another
  length than its columns, an image of other channels... are a ``ValueError`` naming the
  argument and both shapes, never zero padded or truncated.

Each test here fails on the builder before these checks (which cast floats to uint16,
converted uint16 bits numerically in the layer builders, and padded short vectors).
"""

import contextlib
import re
import warnings

import numpy as np
import pytest

from host.compiler import programs as P
from host.model.core import NpuModel
from host.numerics.mvm import fp16_bits
from host.spec.config import NpuConfig
from host.spec.isa import Space

CFG = NpuConfig(n=8, tiles=1, mrf_depth=512, max_col_tiles=32, ivrf_depth=512,
                vrf_depth=256, netq_depth=256, max_length=8)

#: dtypes that are neither FP16 values to round nor FP16 bits.
BAD_DTYPES = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint32, np.uint64,
              np.bool_, np.complex64, np.complex128, np.longdouble, object]


def rand(rng, *shape):
    return (rng.standard_normal(shape) * 0.5).astype(np.float16)


def bad(dtype, shape):
    return np.zeros(shape, dtype)


@contextlib.contextmanager
def no_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


# --- the conversion ---------------------------------------------------------------------------

def test_native_rounds_floats_instead_of_casting_to_integers():
    got = P.native(np.float32([1.5, 2, 3.7]), 16)
    assert got.shape == (1, 16) and got.dtype == np.uint16
    assert list(got[0, :3]) == [0x3E00, 0x4000, 0x4366]      # 1.5, 2, 3.7 -> 3.69921875
    assert not got[0, 3:].any()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_rounding_is_to_nearest_even(dtype):
    ulp = 2.0 ** -10                                        # of [1, 2)
    values = np.array([1 + ulp / 2,          # tie: to even 1.0
                       1 + 3 * ulp / 2,      # tie: to even 1 + 2 ulp
                       1 + ulp / 2 + 2.0 ** -20,   # above the tie: up
                       -(1 + ulp / 2),       # ties are symmetric
                       2.0 ** -25,           # half the smallest subnormal: to even 0
                       3 * 2.0 ** -25,       # 1.5 subnormal quanta: to even 2
                       65519.0,              # below the overflow threshold: 65504
                       ], dtype)
    want = [0x3C00, 0x3C02, 0x3C01, 0xBC00, 0x0000, 0x0002, 0x7BFF]
    with no_warnings():
        assert list(fp16_bits(values, "v")) == want
        assert list(P.native(values, 8)[0, :7]) == want


def test_uint16_is_taken_as_bit_patterns():
    bits = np.array([0x3C00, 0x7E01, 0xFC00, 0x0001, 0x8000], np.uint16)   # NaN payload kept
    assert np.array_equal(P.native(bits, 8)[0, :5], bits)
    f16 = bits.view(np.float16)
    assert np.array_equal(P.native(f16, 8)[0, :5], bits)


def test_the_conversion_never_returns_a_view_of_the_argument():
    bits = np.array([0x3C00, 0x4000], np.uint16)
    out = fp16_bits(bits, "bits")
    bits[0] = 0
    assert out[0] == 0x3C00


@pytest.mark.parametrize("dtype", BAD_DTYPES, ids=lambda d: np.dtype(d).name)
def test_other_dtypes_are_refused_naming_argument_and_dtype(dtype):
    x = bad(dtype, (5,))
    with pytest.raises(TypeError, match=rf"^values must be .* not an array of "
                                        rf"{np.dtype(dtype).name}$"):
        fp16_bits(x, "values")
    with pytest.raises(TypeError, match=rf"^x must .*{np.dtype(dtype).name}"):
        P.native(x, 8)


def test_python_int_lists_are_refused_and_float_lists_rounded():
    with pytest.raises(TypeError, match="^x must .*int64"):
        P.native([1, 2, 3], 8)
    assert list(P.native([1.0, 0.1], 8)[0, :2]) == [0x3C00, 0x2E66]


def test_overflow_to_inf_warns_with_the_argument_and_the_count():
    x = np.array([1e5, -7e4, 65520.0, 1.0, np.inf, np.nan], np.float64)
    with pytest.warns(RuntimeWarning, match=r"^x: 3 finite values beyond the FP16 range") \
            as rec:
        got = P.native(x, 8)
    assert rec[0].filename == __file__                      # points at the caller
    assert list(got[0, :5]) == [0x7C00, 0xFC00, 0x7C00, 0x3C00, 0x7C00]
    assert got[0, 5] & 0x7FFF > 0x7C00                      # NaN stays NaN
    with pytest.warns(RuntimeWarning, match=r"^w: 1 finite value beyond"):
        P.Builder(CFG).matrix(np.float32([[1e6, 1]]))


def test_infinities_and_nans_given_as_floats_do_not_warn():
    with no_warnings():
        got = P.native(np.float32([np.inf, -np.inf, np.nan, 65504]), 8)
    assert list(got[0, [0, 1, 3]]) == [0x7C00, 0xFC00, 0x7BFF]


def test_a_scalar_is_not_a_vector():
    with pytest.raises(ValueError, match="^values must have at least one axis"):
        P.Builder(CFG).place(Space.IVRF, np.float16(1))


# --- Builder entry points ------------------------------------------------------------------

def test_builder_matrix_place_push_round_floats():
    bld = P.Builder(CFG)
    bld.matrix(np.float32([[1.5, 3.7]]))
    bld.place(Space.IVRF, np.float64([3.7]))
    bld.push(np.float32([3.7]))
    prog = bld.finish()
    assert np.array_equal(prog.matrices[0][1], [[0x3E00, 0x4366]])
    assert prog.vectors[0][2][0, 0] == 0x4366
    assert prog.inputs[0, 0] == 0x4366


@pytest.mark.parametrize("call, name", [
    (lambda b, x: b.matrix(x.reshape(1, -1)), "w"),
    (lambda b, x: b.place(Space.IVRF, x), "values"),
    (lambda b, x: b.push(x), "values"),
])
@pytest.mark.parametrize("dtype", [np.int64, np.int16, np.uint8, np.bool_, object])
def test_builder_refuses_other_dtypes(call, name, dtype):
    bld = P.Builder(CFG)
    with pytest.raises(TypeError, match=rf"^{name} must .*{np.dtype(dtype).name}"):
        call(bld, bad(dtype, (4,)))
    assert not bld.program.vectors and not bld.program.matrices and not bld._inputs


@pytest.mark.parametrize("shape", [(4,), (2, 2, 2), (0, 3), (3, 0)])
def test_builder_matrix_must_be_a_matrix(shape):
    with pytest.raises(ValueError, match=rf"^w must be a matrix .*not {shape}"
                       .replace("(", r"\(").replace(")", r"\)")):
        P.Builder(CFG).matrix(np.zeros(shape, np.float16))


def test_logical_is_the_exact_inverse_of_native():
    x = np.float16([1, 2, 3, 4, 5, 6, 7, 8, 9, 10])
    v = P.native(x, 8)
    assert np.array_equal(P.logical(v, 10), x.view(np.uint16))
    with pytest.raises(ValueError, match="length 3 needs 1 native vectors of 8, not 2"):
        P.logical(v, 3)                   # would drop a whole vector of data
    with pytest.raises(ValueError, match="length 17 needs 3"):
        P.logical(v, 17)                  # would return fewer elements than asked
    with pytest.raises(TypeError, match="^vectors must .*int32"):
        P.logical(v.astype(np.int32), 10)


# --- layer builders: dtypes ----------------------------------------------------------------

def _lstm_weights(rng, h, x):
    return {**{f"W_{g}": rand(rng, h, x) for g in "fioc"},
            **{f"U_{g}": rand(rng, h, h) for g in "fioc"},
            **{f"b_{g}": rand(rng, h) for g in "fioc"}}


def _gru_weights(rng, h, x):
    return {**{f"W_{k}": rand(rng, h, x) for k in "zrn"},
            **{f"U_{k}": rand(rng, h, h) for k in "zrn"},
            **{f"b_{k}": rand(rng, h) for k in ("z", "r", "n", "hn")}}


def layer_args(rng):
    """Each layer builder with valid float16 arguments: ``{name: (fn, kwargs)}``."""
    h, x = 11, 6
    return {
        "mlp": (P.mlp_layer, dict(w=rand(rng, h, x), b=rand(rng, h), xs=rand(rng, 2, x))),
        "lstm_sequence": (P.lstm_sequence, dict(weights=_lstm_weights(rng, h, x),
                                                xs=rand(rng, 2, x), h0=rand(rng, h),
                                                c0=rand(rng, h))),
        "lstm_step": (P.lstm_step, dict(weights=_lstm_weights(rng, h, x), x=rand(rng, x),
                                        h0=rand(rng, h), c0=rand(rng, h))),
        "gru": (P.gru_step, dict(weights=_gru_weights(rng, h, x), x=rand(rng, x),
                                 h0=rand(rng, h))),
        "conv1x1": (P.conv1x1, dict(w=rand(rng, h, x), b=rand(rng, h),
                                    image=rand(rng, 2, 3, x))),
        "conv2d": (P.conv2d, dict(w=rand(rng, 5, 3, 2, 2), b=rand(rng, 5),
                                  image=rand(rng, 3, 4, 3))),
        "softmax": (P.softmax_head, dict(w=rand(rng, h, x), b=rand(rng, h), x=rand(rng, x))),
    }


def _arguments():
    """``(layer, argument path)`` for every FP16 argument of every layer builder."""
    out = []
    for layer, (_, kwargs) in layer_args(np.random.default_rng(0)).items():
        for key, value in kwargs.items():
            if key == "weights":
                out += [(layer, (key, k)) for k in value]
            else:
                out.append((layer, (key,)))
    return out


def _replace(kwargs, path, fn):
    kwargs = {k: (dict(v) if isinstance(v, dict) else v) for k, v in kwargs.items()}
    if len(path) == 1:
        kwargs[path[0]] = fn(kwargs[path[0]])
    else:
        kwargs[path[0]][path[1]] = fn(kwargs[path[0]][path[1]])
    return kwargs


def _label(path):
    return path[0] if len(path) == 1 else f"{path[0]}[{path[1]!r}]"


@pytest.mark.parametrize("layer, path", _arguments(),
                         ids=[f"{a}-{_label(p)}" for a, p in _arguments()])
def test_layer_builders_refuse_integer_data(layer, path):
    fn, kwargs = layer_args(np.random.default_rng(1))[layer]
    kwargs = _replace(kwargs, path, lambda v: np.round(v.astype(np.float64) * 4)
                      .astype(np.int64))
    with pytest.raises(TypeError, match=rf"^{re.escape(_label(path))} must "
                                        rf".*int64"):
        fn(CFG, **kwargs)


@pytest.mark.parametrize("layer", list(layer_args(np.random.default_rng(0))))
def test_layer_builders_take_uint16_as_bits_and_floats_as_values(layer):
    fn, kwargs = layer_args(np.random.default_rng(2))[layer]
    want = fn(CFG, **kwargs)
    for convert in (lambda v: v.view(np.uint16),                     # the same bits
                    lambda v: v.astype(np.float32), lambda v: v.astype(np.float64)):
        args = kwargs
        for path in [p for a, p in _arguments() if a == layer]:
            args = _replace(args, path, convert)
        got = fn(CFG, **args)
        assert np.array_equal(got.words, want.words)
        assert all(np.array_equal(a[2], b[2]) for a, b in zip(got.vectors, want.vectors))
        assert all(np.array_equal(a[1], b[1]) for a, b in zip(got.matrices, want.matrices))
        assert np.array_equal(got.inputs, want.inputs)


def test_mlp_runs_the_same_on_bits_and_on_values():
    rng = np.random.default_rng(3)
    w, b, xs = rand(rng, 9, 13), rand(rng, 9), rand(rng, 2, 13)
    _, want = P.mlp_layer(CFG, w, b, xs).run(NpuModel(CFG))
    _, got = P.mlp_layer(CFG, w.view(np.uint16), b.view(np.uint16),
                         xs.view(np.uint16)).run(NpuModel(CFG))
    assert np.array_equal(got, want)


# --- layer builders: shapes ------------------------------------------------------------------

def _shape_error(fn, kwargs, name, got, want):
    """``fn(CFG, **kwargs)`` raises a ValueError naming ``name``, its shape and ``want``."""
    with pytest.raises(ValueError) as e:
        fn(CFG, **kwargs)
    msg = str(e.value)
    assert msg.startswith(f"{name} has shape {got}"), msg
    assert str(want) in msg, msg


@pytest.mark.parametrize("length", [10, 12, 1])
def test_mlp_bias_of_another_length_than_the_rows_is_refused(length):
    rng = np.random.default_rng(4)
    w, xs = rand(rng, 11, 6), rand(rng, 2, 6)
    _shape_error(P.mlp_layer, dict(w=w, b=rand(rng, length), xs=xs), "b", (length,),
                 "w of shape (11, 6) needs shape (11,)")


@pytest.mark.parametrize("shape", [(5,), (7,), (2, 5), (2, 7), (2, 8), (1, 2, 6), (0, 6)])
def test_mlp_inputs_of_another_length_than_the_columns_are_refused(shape):
    rng = np.random.default_rng(5)
    w, b = rand(rng, 11, 6), rand(rng, 11)
    _shape_error(P.mlp_layer, dict(w=w, b=b, xs=np.zeros(shape, np.float16)), "xs", shape,
                 "w of shape (11, 6) needs inputs of shape (6,) or (batch >= 1, 6)")


def test_mlp_one_input_vector_is_a_batch_of_one():
    rng = np.random.default_rng(6)
    w, b, x = rand(rng, 11, 6), rand(rng, 11), rand(rng, 6)
    assert np.array_equal(P.mlp_layer(CFG, w, b, x).inputs,
                          P.mlp_layer(CFG, w, b, x[None]).inputs)


def test_softmax_head_checks_bias_and_input():
    rng = np.random.default_rng(7)
    w = rand(rng, 11, 6)
    _shape_error(P.softmax_head, dict(w=w, b=rand(rng, 10), x=rand(rng, 6)), "b", (10,),
                 "w of shape (11, 6) needs shape (11,)")
    _shape_error(P.softmax_head, dict(w=w, b=rand(rng, 11), x=rand(rng, 5)), "x", (5,),
                 "w of shape (11, 6) needs shape (6,)")
    _shape_error(P.softmax_head, dict(w=w, b=rand(rng, 11), x=rand(rng, 1, 6)), "x",
                 (1, 6), "w of shape (11, 6) needs shape (6,)")


def test_conv1x1_checks_bias_and_image_channels():
    rng = np.random.default_rng(8)
    w = rand(rng, 11, 6)
    _shape_error(P.conv1x1, dict(w=w, b=rand(rng, 9), image=rand(rng, 2, 3, 6)), "b", (9,),
                 "w of shape (11, 6) needs shape (11,)")
    _shape_error(P.conv1x1, dict(w=w, b=rand(rng, 11), image=rand(rng, 2, 3, 5)), "image",
                 (2, 3, 5), "w of shape (11, 6) needs shape (H >= 1, W >= 1, 6)")
    _shape_error(P.conv1x1, dict(w=w, b=rand(rng, 11), image=rand(rng, 6, 6)), "image",
                 (6, 6), "needs shape (H >= 1, W >= 1, 6)")


def test_conv2d_checks_kernel_bias_image_and_stride():
    rng = np.random.default_rng(9)
    w, b, img = rand(rng, 5, 3, 2, 2), rand(rng, 5), rand(rng, 3, 4, 3)
    _shape_error(P.conv2d, dict(w=w, b=rand(rng, 4), image=img), "b", (4,),
                 "w of shape (5, 3, 2, 2) needs shape (5,)")
    _shape_error(P.conv2d, dict(w=w, b=b, image=rand(rng, 3, 4, 4)), "image", (3, 4, 4),
                 "w of shape (5, 3, 2, 2) needs shape (H >= 1, W >= 1, 3)")
    _shape_error(P.conv2d, dict(w=w, b=b, image=rand(rng, 1, 4, 3)), "image", (1, 4, 3),
                 "needs at least 2 x 2 pixels")
    with pytest.raises(ValueError, match=r"^w must have shape \(C_out, C_in, K, K\).*"
                                         r"not \(5, 3, 2, 3\)"):
        P.conv2d(CFG, rand(rng, 5, 3, 2, 3), b, img)
    with pytest.raises(ValueError, match="^stride must be at least 1, not 0"):
        P.conv2d(CFG, w, b, img, stride=0)
    with pytest.raises(TypeError, match="^w must .*int64"):
        P.conv_matrix(np.zeros((5, 3, 2, 2), np.int64), 8)


def test_lstm_checks_state_and_weight_shapes():
    rng = np.random.default_rng(10)
    h, x = 11, 6
    good = dict(weights=_lstm_weights(rng, h, x), xs=rand(rng, 2, x), h0=rand(rng, h),
                c0=rand(rng, h))
    _shape_error(P.lstm_sequence, {**good, "c0": rand(rng, h - 1)}, "c0", (h - 1,),
                 f"h0 of shape ({h},) needs shape ({h},)")
    sizes = f"h0 of shape ({h},) and xs of shape (2, {x})"
    for key, shape, want in [("b_i", (h - 1,), (h,)), ("W_o", (h, x + 1), (h, x)),
                             ("U_c", (h, h - 2), (h, h)), ("W_f", (h + 1, x), (h, x))]:
        wts = {**good["weights"], key: rand(rng, *shape)}
        _shape_error(P.lstm_sequence, {**good, "weights": wts}, f"weights[{key!r}]", shape,
                     f"{sizes} needs shape {want}")
    wts = dict(good["weights"])
    del wts["b_c"]
    with pytest.raises(ValueError, match="^weights lacks 'b_c'"):
        P.lstm_sequence(CFG, **{**good, "weights": wts})
    with pytest.raises(ValueError, match=r"^xs must have shape .* not \(2, 0\)"):
        P.lstm_sequence(CFG, **{**good, "xs": np.zeros((2, 0), np.float16)})
    with pytest.raises(ValueError, match=r"^x must be a vector .* not \(1, 6\)"):
        P.lstm_step(CFG, good["weights"], rand(rng, 1, x), good["h0"], good["c0"])
    with pytest.raises(ValueError, match=r"^h0 must be a vector .* not \(1, 11\)"):
        P.lstm_sequence(CFG, **{**good, "h0": rand(rng, 1, h)})


def test_gru_checks_state_and_weight_shapes():
    rng = np.random.default_rng(11)
    h, x = 11, 6
    good = dict(weights=_gru_weights(rng, h, x), x=rand(rng, x), h0=rand(rng, h))
    sizes = f"h0 of shape ({h},) and x of shape ({x},)"
    for key, shape, want in [("b_hn", (h - 1,), (h,)), ("W_z", (h, x - 1), (h, x)),
                             ("U_n", (h + 1, h), (h, h))]:
        wts = {**good["weights"], key: rand(rng, *shape)}
        _shape_error(P.gru_step, {**good, "weights": wts}, f"weights[{key!r}]", shape,
                     f"{sizes} needs shape {want}")
    with pytest.raises(ValueError, match=r"^x must be a vector .* not \(2, 6\)"):
        P.gru_step(CFG, good["weights"], rand(rng, 2, x), good["h0"])
