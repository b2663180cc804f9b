"""The program builder's networks on the reference core, against compositions of
``host.numerics.mvm`` primitives written here (bit for bit) and float64 NumPy (loosely).

Two builds (N = 8, T = 1 and N = 16, T = 2); every logical size is not a multiple of N.
"""

import numpy as np
import pytest

from host.compiler import programs as P
from host.spec.config import NpuConfig
from host.model.core import NpuModel
from host.numerics.fp16 import binary
from host.numerics.mvm import mvm, quantize_fp16
from host.numerics.reduction import reduce
from host.numerics.unary import unary

CONFIGS = {
    "n8t1": NpuConfig(n=8, tiles=1, mrf_depth=512, max_col_tiles=32, ivrf_depth=512,
                      vrf_depth=256, netq_depth=256, max_length=8),
    "n16t2": NpuConfig(n=16, tiles=2, mrf_depth=256, max_col_tiles=32, ivrf_depth=512,
                       vrf_depth=256, netq_depth=256, max_length=4),
}


@pytest.fixture(params=list(CONFIGS), ids=list(CONFIGS))
def cfg(request):
    return CONFIGS[request.param]


def rand(rng, *shape, scale=0.5):
    return (rng.standard_normal(shape) * scale).astype(np.float16)


def matvec(cfg, w, x):
    """The MVM on a logical FP16 matrix and vector: rows quantized in blocks of N (what
    the on-chip quantizer stores), then ``host.numerics.mvm.mvm``; returns float16."""
    n = cfg.n
    rows, cols = w.shape
    big_c = -(-cols // n)
    padded = np.zeros((rows, big_c * n), np.float16)
    padded[:, :cols] = w
    q = quantize_fp16(padded.view(np.uint16).reshape(rows, big_c, n), cfg.mantissa_bits_w)
    res = mvm(np.asarray(x, np.float16).view(np.uint16), q.exponent_codes,
              q.mantissas.reshape(rows, big_c * n), n=n, mantissa_bits_v=cfg.mantissa_bits_v,
              mantissa_bits_w=cfg.mantissa_bits_w)
    return res.out_bits.view(np.float16)


def add(a, b):
    return binary("add", a, b)


def mul(a, b):
    return binary("mul", a, b)


def outputs(out, length):
    """Output vectors (k, n) as a list of logical FP16 vectors of ``length``."""
    n = out.shape[1]
    per = -(-length // n)
    return [out[i * per:(i + 1) * per].reshape(-1)[:length].view(np.float16)
            for i in range(len(out) // per)]


def run(cfg, prog):
    model = NpuModel(cfg)
    result, out = prog.run(model)
    assert result.ok, result
    assert len(out) == prog.outputs
    return model, result, out


def loose(got, want, tol):
    got = np.asarray(got, np.float64)
    assert np.all(np.isfinite(got))
    assert np.max(np.abs(got - want)) <= tol * (1 + np.max(np.abs(want))), (got, want)


def sigm(v):
    return 1 / (1 + np.exp(-v))


def test_mlp_layer(cfg):
    rng = np.random.default_rng(1)
    w, b, xs = rand(rng, 21, 37), rand(rng, 21), rand(rng, 3, 37)
    _, _, out = run(cfg, P.mlp_layer(cfg, w, b, xs, "relu"))
    got = outputs(out, 21)
    for x, y in zip(xs, got):
        want = unary("relu", add(matvec(cfg, w, x), b))
        assert np.array_equal(y.view(np.uint16), want.view(np.uint16))
        loose(y, np.maximum(w.astype(np.float64) @ x + b, 0), 0.25)


def lstm_reference(cfg, wts, xs, h, c):
    hs = []
    for x in xs:
        xw = {g: add(matvec(cfg, wts[f"W_{g}"], x), wts[f"b_{g}"]) for g in "fioc"}
        f = unary("sigmoid", add(matvec(cfg, wts["U_f"], h), xw["f"]))
        fc = mul(f, c)
        i = unary("sigmoid", add(matvec(cfg, wts["U_i"], h), xw["i"]))
        c = add(mul(unary("tanh", add(matvec(cfg, wts["U_c"], h), xw["c"])), i), fc)
        o = unary("sigmoid", add(matvec(cfg, wts["U_o"], h), xw["o"]))
        h = mul(unary("tanh", c), o)
        hs.append(h)
    return hs, c


def lstm_float(wts, xs, h, c):
    w = {k: v.astype(np.float64) for k, v in wts.items()}
    h, c = h.astype(np.float64), c.astype(np.float64)
    hs = []
    for x in xs.astype(np.float64):
        g = {k: w[f"W_{k}"] @ x + w[f"U_{k}"] @ h + w[f"b_{k}"] for k in "fioc"}
        c = sigm(g["f"]) * c + sigm(g["i"]) * np.tanh(g["c"])
        h = sigm(g["o"]) * np.tanh(c)
        hs.append(h)
    return hs


def lstm_weights(rng, hidden, inputs):
    return {**{f"W_{g}": rand(rng, hidden, inputs) for g in "fioc"},
            **{f"U_{g}": rand(rng, hidden, hidden) for g in "fioc"},
            **{f"b_{g}": rand(rng, hidden) for g in "fioc"}}


@pytest.mark.parametrize("steps", [1, 4])
def test_lstm(cfg, steps):
    rng = np.random.default_rng(2 + steps)
    hidden, inputs = 19, 13
    wts = lstm_weights(rng, hidden, inputs)
    xs, h0, c0 = rand(rng, steps, inputs), rand(rng, hidden), rand(rng, hidden)
    prog = (P.lstm_step(cfg, wts, xs[0], h0, c0) if steps == 1
            else P.lstm_sequence(cfg, wts, xs, h0, c0))
    model, _, out = run(cfg, prog)
    got = outputs(out, hidden)
    want, c_want = lstm_reference(cfg, wts, xs, h0, c0)
    assert len(got) == steps
    for g, w in zip(got, want):
        assert np.array_equal(g.view(np.uint16), w.view(np.uint16))
    c_ref = prog.refs["c"]
    c_got = model.read(c_ref.space, c_ref.addr, c_ref.length).reshape(-1)[:hidden]
    assert np.array_equal(c_got, c_want.view(np.uint16))
    for g, w in zip(got, lstm_float(wts, xs, h0, c0)):
        loose(g, w, 0.3)


def test_gru_step(cfg):
    rng = np.random.default_rng(3)
    hidden, inputs = 10, 21
    wts = {**{f"W_{k}": rand(rng, hidden, inputs) for k in "zrn"},
           **{f"U_{k}": rand(rng, hidden, hidden) for k in "zrn"},
           **{f"b_{k}": rand(rng, hidden) for k in ("z", "r", "n", "hn")}}
    x, h = rand(rng, inputs), rand(rng, hidden)
    model, _, out = run(cfg, P.gru_step(cfg, wts, x, h))
    xw = {k: add(matvec(cfg, wts[f"W_{k}"], x), wts[f"b_{k}"]) for k in "zrn"}
    z = unary("sigmoid", add(matvec(cfg, wts["U_z"], h), xw["z"]))
    r = unary("sigmoid", add(matvec(cfg, wts["U_r"], h), xw["r"]))
    nn = unary("tanh", add(mul(add(matvec(cfg, wts["U_n"], h), wts["b_hn"]), r), xw["n"]))
    want = add(mul(binary("a_sub_b", h, nn), z), nn)
    got = outputs(out, hidden)[0]
    assert np.array_equal(got.view(np.uint16), want.view(np.uint16))
    w = {k: v.astype(np.float64) for k, v in wts.items()}
    xf, hf = x.astype(np.float64), h.astype(np.float64)
    zf = sigm(w["W_z"] @ xf + w["b_z"] + w["U_z"] @ hf)
    rf = sigm(w["W_r"] @ xf + w["b_r"] + w["U_r"] @ hf)
    nf = np.tanh(w["W_n"] @ xf + w["b_n"] + rf * (w["U_n"] @ hf + w["b_hn"]))
    loose(got, (1 - zf) * nf + zf * hf, 0.3)


def test_conv1x1(cfg):
    rng = np.random.default_rng(4)
    w, b, img = rand(rng, 11, 6), rand(rng, 11), rand(rng, 3, 5, 6)
    _, result, out = run(cfg, P.conv1x1(cfg, w, b, img))
    assert result.chains == 15
    got = outputs(out, 11)
    for p, y in enumerate(got):
        x = img.reshape(15, 6)[p]
        want = unary("relu", add(matvec(cfg, w, x), b))
        assert np.array_equal(y.view(np.uint16), want.view(np.uint16))
        loose(y, np.maximum(w.astype(np.float64) @ x + b, 0), 0.25)


@pytest.mark.parametrize("k, stride", [(3, 1), (3, 2), (2, 2)])
def test_conv2d(cfg, k, stride):
    rng = np.random.default_rng(5 + k + stride)
    c_in, c_out, height, width = 5, 7, 7, 8
    w, b, img = rand(rng, c_out, c_in, k, k), rand(rng, c_out), rand(rng, height, width, c_in)
    _, _, out = run(cfg, P.conv2d(cfg, w, b, img, stride=stride))
    out_h, out_w = (height - k) // stride + 1, (width - k) // stride + 1
    got = outputs(out, c_out)
    assert len(got) == out_h * out_w
    n = cfg.n
    pix = -(-c_in // n)
    # The patch: K x K pixels, each padded to whole native vectors; the matrix in the same
    # order (written here from the definition, not with the builder's conv_matrix).
    mat = np.zeros((c_out, k, k, pix * n), np.float16)
    for ky in range(k):
        for kx in range(k):
            mat[:, ky, kx, :c_in] = w[:, :, ky, kx]
    mat = mat.reshape(c_out, -1)
    for oy in range(out_h):
        for ox in range(out_w):
            patch = np.zeros((k, k, pix * n), np.float16)
            patch[..., :c_in] = img[oy * stride:oy * stride + k, ox * stride:ox * stride + k]
            want = unary("relu", add(matvec(cfg, mat, patch.reshape(-1)), b))
            y = got[oy * out_w + ox]
            assert np.array_equal(y.view(np.uint16), want.view(np.uint16)), (oy, ox)
            ref = np.einsum("oikl,kli->o", w.astype(np.float64),
                            img[oy * stride:oy * stride + k,
                                ox * stride:ox * stride + k].astype(np.float64))
            loose(y, np.maximum(ref + b, 0), 0.3)


def test_softmax_head(cfg):
    rng = np.random.default_rng(6)
    w, b, x = rand(rng, 23, 9, scale=1.0), rand(rng, 23), rand(rng, 9)
    _, _, out = run(cfg, P.softmax_head(cfg, w, b, x))
    z = add(matvec(cfg, w, x), b)
    e = unary("exp", binary("a_sub_b", z, np.full(23, reduce("max", z), np.float16)))
    s = unary("recip", np.float16(reduce("sum", e)))
    want = mul(np.full(23, s, np.float16), e)
    got = outputs(out, 23)[0]
    assert np.array_equal(got.view(np.uint16), want.view(np.uint16))
    zf = w.astype(np.float64) @ x + b
    sf = np.exp(zf - zf.max())
    loose(got, sf / sf.sum(), 0.05)
    assert abs(float(np.sum(got, dtype=np.float64)) - 1) < 0.02


def test_program_text_round_trips(cfg):
    from host.compiler.asm import assemble
    rng = np.random.default_rng(7)
    prog = P.lstm_sequence(cfg, lstm_weights(rng, 9, 5), rand(rng, 2, 5), rand(rng, 9),
                           rand(rng, 9))
    assert np.array_equal(assemble(prog.text), prog.words)


def test_lstm_utilization_prediction():
    """The bench build of issue 5 (N = 16, T = 2), LSTM 256/256, 10 steps: the timing
    model's prediction is within 2% (the issue asks for 10%) of the 10,422 cycles the core
    took for this program (``python -m bench lstm``, Verilator; the cycles do not depend
    on the values or on the memory depths that are not derived from ``max_length``), 100%
    MVM utilization in steady state (``docs/npu.md`` section 4)."""
    cfg = NpuConfig(n=16, tiles=2, mrf_depth=1024, max_col_tiles=16, ivrf_depth=256,
                    vrf_depth=512, netq_depth=512, max_length=16)
    rng = np.random.default_rng(8)
    steps, size = 10, 256
    wts = lstm_weights(rng, size, size)
    wts = {k: (v * np.float16(0.1)).astype(np.float16) for k, v in wts.items()}
    prog = P.lstm_sequence(cfg, wts, rand(rng, steps, size), rand(rng, size), rand(rng, size))
    model, result, out = run(cfg, prog)
    useful = steps * 8 * size * size
    utilization = useful / (cfg.mvm.macs_per_cycle * result.cycles_predicted)
    print(f"predicted {result.cycles_predicted} cycles, {result.cycles_predicted / steps:.0f} "
          f"per step, MVM utilization {100 * utilization:.1f}%")
    assert abs(result.cycles_predicted - 10422) < 0.02 * 10422
