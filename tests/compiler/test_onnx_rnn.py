"""ONNX LSTM and GRU (forward) compiled onto the NPU and checked against onnxruntime.

Models are built with ``onnx.helper`` in the forms ``torch.onnx.export`` writes (seq-first
``X``, ``Y`` squeezed, transposed, the last step taken by ``Gather`` / ``Slice`` or from
``Y_h``, a ``Gemm`` head with ``Softmax``), I = 12, H = 10, 3 to 5 steps, batches of 4:
none a multiple of N = 8. The NPU's output must lie within :func:`rnn_bound` of
onnxruntime's float32 output, element by element: the worst-case bound of
``docs/compiler.md`` section 6, propagated step by step through the builder's exact
sequence of FP16 operations (BFP products with ``2^-(m-1)`` of each block's largest
magnitude per operand, ``2^-11`` relative per FP16 rounding, the ACT unit within
``2^-8``). A swapped gate order breaks the comparison (a test shows it).
"""

from __future__ import annotations

import numpy as np
import pytest

import onnx
from onnx import TensorProto, helper
from onnx_checks import block_max, check_classes, check_within, init, ort_run

from host.cli import main
from host.compiler import compile_onnx, onnx_import
from host.compiler.lower import CompileError
from host.compiler.network import config_text
from host.compiler.onnx_import import OnnxImportError, import_onnx
from host.spec.config import parse_config

BUILD = "n=8,tiles=1,mantissa_bits_v=8,mantissa_bits_w=8"
N = 8
I, H = 12, 10
GATES = {"LSTM": 4, "GRU": 3}


# --- model construction -----------------------------------------------------------------

def rnn_model(op, steps, rng, *, out="last", head=False, lbr=1, batch="B", scale=0.4,
              initial=False, seq_lens=False, batch_first=False, last_by="Y_h", attrs=None,
              peephole=False):
    """An ``op`` ("LSTM" / "GRU") model over ``(steps, batch, I)`` inputs (``batch_first``:
    ``(batch, steps, I)`` and a Transpose, as torch writes ``batch_first=True``).

    ``out``: "last" (the last ``h``: ``last_by`` "Y_h" (Squeeze), "gather" (Gather -1 of
    the squeezed ``Y``), "slice" (Slice [-1:] then Squeeze) or "reshape" (Y_h reshaped to
    (-1, H))) or "every" (``Y`` squeezed: ``(steps, batch, H)``, or ``(batch, steps, H)``
    with ``batch_first``). ``head``: a Gemm of 7 classes and a Softmax on the last ``h``.
    Returns the model and the weights as float64 (ONNX layout, direction axis dropped)."""
    g = GATES[op]
    wts = {"W": rng.normal(0, scale, (g * H, I)), "R": rng.normal(0, 0.6 * scale, (g * H, H)),
           "B": rng.normal(0, 0.3, 2 * g * H)}
    wts = {k: v.astype(np.float32).astype(np.float64) for k, v in wts.items()}
    inits = [init("W", wts["W"][None]), init("R", wts["R"][None]), init("B", wts["B"][None])]
    inputs = ["xs" if batch_first else "x", "W", "R", "B"]
    nb = 4 if isinstance(batch, str) else batch
    if seq_lens or initial:
        inputs.append("lens" if seq_lens else "")
        if seq_lens:
            inits.append(init("lens", np.full(nb, steps), np.int32))
    if initial:
        h0 = rng.normal(0, 0.5, H).astype(np.float32)
        wts["h0"] = h0.astype(np.float64)
        inits.append(init("h0", np.broadcast_to(h0, (1, nb, H))))
        inputs.append("h0")
        if op == "LSTM":
            c0 = rng.normal(0, 0.5, H).astype(np.float32)
            wts["c0"] = c0.astype(np.float64)
            inits.append(init("c0", np.broadcast_to(c0, (1, nb, H))))
            inputs.append("c0")
    if peephole:
        inputs += [""] * (7 - len(inputs)) + ["P"]
        inits.append(init("P", rng.normal(size=(1, 3 * H))))
    kw = dict(hidden_size=H, **(attrs or {}))
    if op == "GRU":
        kw["linear_before_reset"] = lbr
    nodes = []
    if batch_first:
        nodes.append(helper.make_node("Transpose", ["x"], ["xs"], name="to_seq",
                                      perm=[1, 0, 2]))
    nodes.append(helper.make_node(op, inputs, ["Y", "Y_h"] + (["Y_c"] if op == "LSTM" else []),
                                  name="rnn", **kw))
    inits.append(init("ax0", [0], np.int64))
    inits.append(init("ax1", [1], np.int64))
    inits.append(init("last", -1, np.int64))
    inits.append(init("m1", [-1], np.int64))
    inits.append(init("big", [1 << 62], np.int64))
    inits.append(init("hshape", [-1, H], np.int64))
    nodes.append(helper.make_node("Squeeze", ["Y", "ax1"], ["ys"], name="squeeze_y"))
    cur = "ys"
    if batch_first:
        nodes.append(helper.make_node("Transpose", ["ys"], ["yb"], name="to_batch",
                                      perm=[1, 0, 2]))
        cur = "yb"
    step_axis = 1 if batch_first else 0
    shape = [nb if isinstance(batch, int) else batch] * 3
    if out == "every":
        shape = ([batch, steps, H] if batch_first else [steps, batch, H])
    elif last_by == "Y_h":
        nodes = [n for n in nodes if n.name != "squeeze_y" and n.name != "to_batch"]
        nodes.append(helper.make_node("Squeeze", ["Y_h", "ax0"], ["hl"], name="squeeze_h"))
        cur = "hl"
    elif last_by == "reshape":
        nodes = [n for n in nodes if n.name != "squeeze_y" and n.name != "to_batch"]
        nodes.append(helper.make_node("Reshape", ["Y_h", "hshape"], ["hl"], name="view_h"))
        cur = "hl"
    elif last_by == "gather":
        nodes.append(helper.make_node("Gather", [cur, "last"], ["hl"], name="take_last",
                                      axis=step_axis))
        cur = "hl"
    else:
        axis = "ax1" if step_axis else "ax0"
        nodes.append(helper.make_node("Slice", [cur, "m1", "big", axis], ["hs"],
                                      name="slice_last"))
        nodes.append(helper.make_node("Squeeze", ["hs", "ax1" if step_axis else "ax0"],
                                      ["hl"], name="squeeze_last"))
        cur = "hl"
    if out == "last":
        shape = [batch, H]
    if head:
        wd = rng.normal(0, 0.5, (7, H)).astype(np.float32)
        bd = rng.normal(0, 0.2, 7).astype(np.float32)
        wts["Wd"], wts["bd"] = wd.astype(np.float64), bd.astype(np.float64)
        inits += [init("Wd", wd), init("bd", bd)]
        nodes += [helper.make_node("Gemm", [cur, "Wd", "bd"], ["z"], name="fc", transB=1),
                  helper.make_node("Softmax", ["z"], ["y"], name="softmax", axis=-1)]
        cur, shape = "y", [batch, 7]
    x_shape = [batch, steps, I] if batch_first else [steps, batch, I]
    graph = helper.make_graph(
        nodes, "rnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info(cur, TensorProto.FLOAT, shape)],
        inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model, wts


# --- the error bound ----------------------------------------------------------------------

DV = DW = 2.0 ** -7             # 2^-(m-1), m = 8 bits of mantissa
U, ROM, TINY = 2.0 ** -11, 2.0 ** -8, 2.0 ** -20


class V:
    """A float64 value and a bound on the NPU's distance from it, element by element;
    the FP16 operations of the builders, each with its rounding."""

    def __init__(self, v, e):
        self.v, self.e = np.asarray(v, np.float64), np.asarray(e, np.float64)

    @staticmethod
    def fp16(v):
        v = np.asarray(v, np.float64)
        return V(v, np.abs(v - v.astype(np.float16).astype(np.float64)))

    def mvm(self, w):
        a, aw = np.abs(self.v) + self.e, np.abs(w)
        bx, bw = block_max(a, N), block_max(aw, N)
        y = self.v @ w.T
        e = self.e @ aw.T + DV * bx @ aw.T + DW * a @ bw.T + DV * DW * bx @ bw.T \
            + U * a @ aw.T
        return V(y, e + U * (np.abs(y) + e) + TINY)

    def __add__(self, o):
        o = o if isinstance(o, V) else V.fp16(o)
        y, e = self.v + o.v, self.e + o.e
        return V(y, e + U * (np.abs(y) + e) + TINY)

    def __sub__(self, o):
        return self + V(-o.v, o.e)

    def __mul__(self, o):
        y = self.v * o.v
        e = np.abs(self.v) * o.e + np.abs(o.v) * self.e + self.e * o.e
        return V(y, e + U * (np.abs(y) + e) + TINY)

    @staticmethod
    def gru_update(h, n, z):
        """``(h - n) * z + n`` (three FP16 operations), n's error entering once, times
        ``1 - z`` (the worst case of each operation on its own would count it twice)."""
        d = h.v - n.v
        m = d * z.v
        y = m + n.v
        ed = h.e + n.e
        e = np.abs(1 - z.v) * n.e + np.abs(z.v) * h.e + np.abs(d) * z.e + ed * z.e
        e += U * (np.abs(d) + ed) * (np.abs(z.v) + z.e) + U * (np.abs(m) + e) \
            + U * (np.abs(y) + e) + 3 * TINY
        return V(y, e + U * e)

    def _near_zero(self):
        """The point of [v - e, v + e] nearest 0, where sigmoid' and tanh' are largest."""
        return np.clip(0, self.v - self.e, self.v + self.e)

    def sigmoid(self):
        y = 1 / (1 + np.exp(-self.v))
        s = 1 / (1 + np.exp(-self._near_zero()))
        e = np.minimum(s * (1 - s) * self.e, 1.0)            # the slope on the interval
        return V(y, e + ROM * np.abs(y) + TINY)

    def tanh(self):
        y = np.tanh(self.v)
        e = np.minimum((1 - np.tanh(self._near_zero()) ** 2) * self.e, 2.0)
        return V(y, e + ROM * np.abs(y) + TINY)

    def softmax(self):
        z = self.v - self.v.max(-1, keepdims=True)
        p = np.exp(z) / np.exp(z).sum(-1, keepdims=True)
        ez = np.minimum(self.e.max(-1, keepdims=True), 20.0)
        return V(p, np.minimum(p * (np.exp(2 * ez) - 1), 1.0) + 4 * ROM * p + TINY)


def rnn_bound(op, wts, x, *, lbr=1, out="last", head=False):
    """float64 reference and bound of a model of :func:`rnn_model` on ``x``
    (``(steps, batch, I)``): the builder's operations in its order (``emit_lstm``,
    ``emit_gru``), ONNX's gates mapped to them."""
    steps, batch = x.shape[:2]
    blk = lambda a, k: a[k * H:(k + 1) * H]
    g = GATES[op]
    wb, rb = wts["B"][:g * H], wts["B"][g * H:]
    h = V.fp16(np.broadcast_to(wts.get("h0", np.zeros(H)), (batch, H)))
    c = V.fp16(np.broadcast_to(wts.get("c0", np.zeros(H)), (batch, H)))
    ys = []
    for t in range(steps):
        xt = V.fp16(x[t])
        if op == "LSTM":                      # ONNX i, o, f, c
            k = {"i": 0, "o": 1, "f": 2, "c": 3}
            pre = {q: h.mvm(blk(wts["R"], k[q])) + (xt.mvm(blk(wts["W"], k[q]))
                                                     + (blk(wb, k[q]) + blk(rb, k[q])))
                   for q in "fioc"}
            f, i, o = pre["f"].sigmoid(), pre["i"].sigmoid(), pre["o"].sigmoid()
            c = pre["c"].tanh() * i + f * c
            h = c.tanh() * o
        else:                                 # ONNX z, r, h
            xw = {q: xt.mvm(blk(wts["W"], k)) + (blk(wb, k) + (blk(rb, k) if q != "n" or not
                                                               lbr else 0))
                  for q, k in (("z", 0), ("r", 1), ("n", 2))}
            z = (h.mvm(blk(wts["R"], 0)) + xw["z"]).sigmoid()
            r = (h.mvm(blk(wts["R"], 1)) + xw["r"]).sigmoid()
            if lbr:
                n = ((h.mvm(blk(wts["R"], 2)) + blk(rb, 2)) * r + xw["n"]).tanh()
            else:
                n = ((h * r).mvm(blk(wts["R"], 2)) + xw["n"]).tanh()
            h = V.gru_update(h, n, z)
        ys.append(h)
    if out == "every":
        return np.stack([y.v for y in ys]), np.stack([y.e for y in ys])
    if head:
        h = (h.mvm(wts["Wd"]) + wts["bd"]).softmax()
    return h.v, h.e


def run_and_check(op, rng, steps, *, batch=4, lbr=1, out="last", head=False, **kw):
    model, wts = rnn_model(op, steps, rng, out=out, head=head, lbr=lbr, **kw)
    net = compile_onnx(model, BUILD)
    x = rng.normal(size=(steps, batch, I)).astype(np.float32)
    x_in = x.transpose(1, 0, 2).copy() if kw.get("batch_first") else x
    y, ref = net.run(x_in), ort_run(model, x_in)
    assert y.dtype == np.float32 and y.shape == ref.shape
    if kw.get("batch_first") and out == "every":
        y, ref = y.transpose(1, 0, 2), ref.transpose(1, 0, 2)
    want, bound = rnn_bound(op, wts, x, lbr=lbr, out=out, head=head)
    # the float64 recomputation is the model: it agrees with onnxruntime's float32
    assert np.abs(want - ref).max() < 1e-4
    what = f"{op} lbr={lbr} {out} head={head} {kw}"
    check_within(y, ref, bound, what)
    if head:
        check_classes(y, ref, bound, what)
    return net, model, y, ref, bound


# --- compile and run against onnxruntime --------------------------------------------------

@pytest.mark.parametrize("out,head,steps", [("last", False, 3), ("every", False, 4),
                                            ("last", True, 5)])
def test_lstm_matches_onnxruntime(out, head, steps):
    rng = np.random.default_rng(steps)
    net, _, y, ref, bound = run_and_check("LSTM", rng, steps, out=out, head=head)
    assert net.signature["input_shape"] == [steps, None, I]
    assert net.signature["input_rows"] == steps
    assert net.image.inputs == steps * 2                 # 12 features: 2 vectors a step
    # observed error far inside the worst case: under 2^-6 (docs/compiler.md section 6)
    assert np.abs(y - ref).max() < 2.0 ** -6
    assert not np.array_equal(y, ref)


@pytest.mark.parametrize("lbr,out,head,steps", [(1, "last", False, 3), (1, "every", False, 5),
                                                (0, "last", True, 4), (0, "every", False, 3),
                                                (1, "last", True, 4)])
def test_gru_matches_onnxruntime(lbr, out, head, steps):
    rng = np.random.default_rng(10 + steps + lbr)
    net, _, y, ref, _ = run_and_check("GRU", rng, steps, lbr=lbr, out=out, head=head)
    assert np.abs(y - ref).max() < 2.0 ** -5
    ops = [lay["op"] for lay in net.report()["layers"]]
    assert ops[0] == "GRU"


def test_every_step_output_shape_and_order():
    """Every step's h comes back as ONNX's (steps, batch, H), step by step."""
    rng = np.random.default_rng(20)
    net, model, y, ref, _ = run_and_check("LSTM", rng, 4, out="every")
    assert y.shape == (4, 4, H) and net.signature["output_shape"] == [4, None, H]
    assert net.signature["output_rows"] == 4
    # the last step of the every-step output is the last-step network's output
    model_last, _ = rnn_model("LSTM", 4, np.random.default_rng(20), out="last")
    x = np.random.default_rng(21).normal(size=(4, 4, I)).astype(np.float32)
    assert np.array_equal(compile_onnx(model, BUILD).run(x)[-1],
                          compile_onnx(model_last, BUILD).run(x))


@pytest.mark.parametrize("last_by", ["gather", "slice", "reshape"])
def test_exporter_patterns(last_by):
    """torch's batch_first export (Transpose in and out), the last step by Gather, Slice
    or a Reshape of Y_h, a Gemm + Softmax head, initial state and sequence_lens."""
    rng = np.random.default_rng(30)
    net, model, y, ref, _ = run_and_check("LSTM", rng, 5, head=True, batch_first=True,
                                          last_by=last_by, initial=True, seq_lens=True)
    assert net.signature["input_shape"] == [None, 5, I]
    ops = [n.op for n in import_onnx(model).nodes]
    assert ops.count("LSTM") == 1 and "LastStep" in ops and ops[-2:] == ["Dense", "Softmax"]


def test_batch_first_every_step_and_gru_initial_state():
    rng = np.random.default_rng(31)
    net, *_ = run_and_check("GRU", rng, 3, out="every", batch_first=True, initial=True,
                            lbr=1)
    assert net.signature["input_shape"] == [None, 3, I]
    assert net.signature["output_shape"] == [None, 3, H]


def test_fixed_batch_is_axis_one_of_x():
    """With every axis fixed (batch 4), the batch is axis 1 of the LSTM's X."""
    rng = np.random.default_rng(32)
    model, _ = rnn_model("LSTM", 3, rng, batch=4)
    net = compile_onnx(model, BUILD)
    assert net.signature["input_shape"] == [3, None, I]
    x = rng.normal(size=(3, 6, I)).astype(np.float32)         # any number of sequences
    assert net.run(x).shape == (6, H)


def test_layout_one():
    """ONNX layout = 1 (batch, seq, input): the same network as layout 0."""
    rng = np.random.default_rng(33)
    model0, _ = rnn_model("LSTM", 4, rng, out="last")
    model1 = onnx.ModelProto()
    model1.CopyFrom(model0)
    g = model1.graph
    g.node[0].attribute.append(helper.make_attribute("layout", 1))
    g.node[1].input[1] = "ax1"                              # Y_h is (batch, 1, H)
    g.input[0].type.tensor_type.shape.dim[0].dim_param = "B"
    g.input[0].type.tensor_type.shape.dim[1].dim_value = 4
    net0, net1 = compile_onnx(model0, BUILD), compile_onnx(model1, BUILD)
    assert net1.signature["input_shape"] == [None, 4, I]
    x = rng.normal(size=(4, 3, I)).astype(np.float32)
    assert np.array_equal(net1.run(x.transpose(1, 0, 2)), net0.run(x))


def test_swapped_gate_order_breaks_the_comparison(monkeypatch):
    """The comparison can fail: the LSTM's f and i gates (or the GRU's z and r) swapped
    in the import put the output outside the bound."""
    rng = np.random.default_rng(40)
    monkeypatch.setattr(onnx_import, "LSTM_GATES", {"f": 0, "i": 2, "o": 1, "c": 3})
    with pytest.raises(AssertionError, match="beyond the bound"):
        run_and_check("LSTM", rng, 4, out="every")
    monkeypatch.setattr(onnx_import, "LSTM_GATES", {"f": 2, "i": 0, "o": 3, "c": 1})
    with pytest.raises(AssertionError, match="beyond the bound"):
        run_and_check("LSTM", rng, 4, out="every")
    monkeypatch.undo()
    monkeypatch.setattr(onnx_import, "GRU_GATES", {"z": 1, "r": 0, "n": 2})
    with pytest.raises(AssertionError, match="beyond the bound"):
        run_and_check("GRU", rng, 4, out="every")
    monkeypatch.undo()
    run_and_check("GRU", rng, 4, out="every")               # and the right order passes


def test_wrong_reset_variant_breaks_the_comparison(monkeypatch):
    """linear_before_reset = 0 and 1 differ enough to be told apart: lowering one as the
    other fails the comparison."""
    rng = np.random.default_rng(41)
    model, wts = rnn_model("GRU", 4, rng, out="every", lbr=0, scale=0.8)
    graph = import_onnx(model)
    node = graph.nodes[0]
    node.attrs["linear_before_reset"] = 1                   # b_hn stays zero: same biases
    from host.compiler.network import compile_graph
    x = rng.normal(size=(4, 4, I)).astype(np.float32)
    _, bound = rnn_bound("GRU", wts, x, lbr=0, out="every")
    with pytest.raises(AssertionError, match="beyond the bound"):
        check_within(compile_graph(graph, BUILD).run(x), ort_run(model, x), bound, "lbr")
    check_within(compile_onnx(model, BUILD).run(x), ort_run(model, x), bound, "lbr")


# --- npu compile / npu run, report ----------------------------------------------------------

def test_cli_bit_identical(tmp_path):
    rng = np.random.default_rng(50)
    model, _ = rnn_model("LSTM", 4, rng, head=True)
    path = tmp_path / "lstm.onnx"
    onnx.save(model, str(path))
    assert main(["compile", str(path), "-o", str(tmp_path / "net.npz"), "--config",
                 BUILD]) == 0
    x = rng.normal(size=(4, 9, I)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    device = f"model:{config_text(parse_config(BUILD))}"
    assert main(["--device", device, "run", str(tmp_path / "net.npz"), str(tmp_path / "x.npy"),
                 "-o", str(tmp_path / "y.npy"), "--no-progress"]) == 0
    y_cli = np.load(tmp_path / "y.npy")
    y_api = compile_onnx(model, BUILD).run(x)
    assert y_cli.shape == (9, 7) and np.array_equal(y_cli, y_api)
    # the state is reset before every job: one sequence alone gives the same row
    assert np.array_equal(compile_onnx(model, BUILD).run(x[:, 3:4]), y_api[3:4])
    # inputs in the batch-first shape are refused (naming the batch axis)
    with pytest.raises(ValueError, match=r"\(4, batch, 12\).*batch axis 1"):
        compile_onnx(model, BUILD).run(x.transpose(1, 0, 2))


def test_report_of_a_recurrent_layer():
    rng = np.random.default_rng(51)
    model, _ = rnn_model("LSTM", 3, rng, head=True)
    rep = compile_onnx(model, BUILD).report()
    lstm = rep["layers"][0]
    assert lstm["op"] == "LSTM" and lstm["macs"] == 3 * 4 * H * (I + H)
    # 8 matrices (W and U of 4 gates) of 2 row x 2 column tiles
    assert lstm["mrf_slots"] == [0, 8 * parse_config(BUILD).mvm.slots_needed(2, 2)]
    assert rep["totals"]["input_vectors"] == 6 and rep["totals"]["output_vectors"] == 1


# --- refusals ---------------------------------------------------------------------------

@pytest.mark.parametrize("op,kw,words", [
    ("LSTM", {"attrs": {"direction": "bidirectional"}}, ["'rnn' (LSTM)", "direction",
                                                          "bidirectional"]),
    ("GRU", {"attrs": {"direction": "reverse"}}, ["'rnn' (GRU)", "direction", "reverse"]),
    ("LSTM", {"peephole": True}, ["'rnn' (LSTM)", "P (peepholes)"]),
    ("LSTM", {"attrs": {"clip": 3.0}}, ["'rnn' (LSTM)", "clip"]),
    ("GRU", {"attrs": {"clip": 3.0}}, ["'rnn' (GRU)", "clip"]),
    ("LSTM", {"attrs": {"input_forget": 1}}, ["'rnn' (LSTM)", "input_forget"]),
    ("LSTM", {"attrs": {"activations": ["Sigmoid", "Relu", "Tanh"]}},
     ["'rnn' (LSTM)", "activations", "Relu"]),
])
def test_refusals_name_node_and_attribute(op, kw, words):
    rng = np.random.default_rng(60)
    model, _ = rnn_model(op, 3, rng, **kw)
    with pytest.raises(OnnxImportError) as info:
        compile_onnx(model, BUILD)
    for w in words:
        assert w in str(info.value), (w, str(info.value))


def test_more_refusals():
    rng = np.random.default_rng(61)
    # sequence_lens shorter than the sequence
    model, _ = rnn_model("LSTM", 3, rng, seq_lens=True)
    lens = next(t for t in model.graph.initializer if t.name == "lens")
    lens.CopyFrom(init("lens", [3, 2, 3, 3], np.int32))
    with pytest.raises(OnnxImportError, match=r"'rnn' \(LSTM\).*sequence_lens"):
        compile_onnx(model, BUILD)
    # Y_c used
    model, _ = rnn_model("LSTM", 3, rng)
    model.graph.node[-1].input[0] = "Y_c"
    with pytest.raises(OnnxImportError, match=r"'rnn' \(LSTM\).*Y_c"):
        compile_onnx(model, BUILD)
    # a middle step
    model, _ = rnn_model("LSTM", 3, rng, last_by="gather")
    model.graph.initializer.append(init("one", 1, np.int64))
    next(n for n in model.graph.node if n.name == "take_last").input[1] = "one"
    with pytest.raises(OnnxImportError, match=r"'take_last' \(Gather\).*step 1"):
        compile_onnx(model, BUILD)
    # a Dense on every step
    model, _ = rnn_model("LSTM", 3, rng, out="every")
    g = model.graph
    g.initializer.append(init("Wm", rng.normal(size=(H, 5))))
    g.node.append(helper.make_node("MatMul", ["ys", "Wm"], ["z"], name="per_step"))
    g.output[0].CopyFrom(helper.make_tensor_value_info("z", TensorProto.FLOAT, [3, "B", 5]))
    with pytest.raises((OnnxImportError, CompileError), match="'per_step'"):
        compile_onnx(model, BUILD)


def test_sequence_longer_than_program_memory_runs_in_chunks():
    """A sequence whose unrolled program exceeds program_depth is no longer refused: the
    job runs a program of fewer steps several times (docs/compiler.md section 7), with
    the same bits as one program of every step; only a build that cannot hold one step
    is refused, naming the layer and program memory."""
    rng = np.random.default_rng(62)
    model, _ = rnn_model("LSTM", 5, rng, head=True)
    chunked = compile_onnx(model, BUILD + ",program_depth=200")
    whole = compile_onnx(model, BUILD)
    assert chunked.image.runs == 5 and whole.image.runs == 1
    lay = chunked.report()["layers"][0]
    assert (lay["steps_per_run"], lay["runs"]) == (1, 5)
    x = rng.normal(size=(5, 3, I)).astype(np.float32)
    assert np.array_equal(chunked.run(x), whole.run(x))
    with pytest.raises(CompileError) as info:
        compile_onnx(model, BUILD + ",program_depth=40")
    msg = str(info.value)
    assert "'rnn' (LSTM)" in msg and "program memory" in msg and "program_depth 40" in msg \
        and "one step" in msg, msg
    with pytest.raises(CompileError, match=r"'rnn' \(LSTM\).*MRF.*mrf_depth 10"):
        compile_onnx(model, BUILD + ",mrf_depth=10")


# --- stacked layers (torch's num_layers=2) --------------------------------------------------

def test_stacked_layers_compose_bit_for_bit():
    """Two LSTMs, and a GRU on an LSTM, as torch exports num_layers=2 (one node per layer,
    the direction axis squeezed between): one recurrent stage, the layers interleaved
    step by step, equal bit for bit to running the first layer alone (every step out) and
    feeding its output to the second alone (with the head); close to onnxruntime."""
    from onnx import numpy_helper
    from rnn_onnx import rnn_onnx
    steps = 4
    for ops in (("LSTM", "LSTM"), ("LSTM", "GRU")):
        rng = np.random.default_rng(63)
        whole = rnn_onnx(ops[0], steps, I, H, rng, ops=ops, head=7)
        net = compile_onnx(whole, BUILD)
        layers = [lay for lay in net.report()["layers"] if "quantize_once" in lay]
        assert [lay["op"] for lay in layers] == list(ops)
        assert all(lay["quantize_once"]["on"] and lay["runs"] == 1 for lay in layers)
        x = rng.normal(size=(steps, 3, I)).astype(np.float32)
        y = net.run(x)
        ref = ort_run(whole, x)
        assert y.shape == ref.shape == (3, 7)
        assert np.abs(y - ref).max() < 2.0 ** -5, np.abs(y - ref).max()
        # the layers one at a time, with the same weights
        inits = {t.name: numpy_helper.to_array(t) for t in whole.graph.initializer}
        first = rnn_onnx(ops[0], steps, I, H, rng, every=True)
        second = rnn_onnx(ops[1], steps, H, H, rng, head=7)
        for model, names in ((first, {"W0": "W0", "R0": "R0", "B0": "B0"}),
                             (second, {"W0": "W1", "R0": "R1", "B0": "B1", "Wd": "Wd",
                                       "bd": "bd"})):
            for t in model.graph.initializer:
                if t.name in names:
                    t.CopyFrom(numpy_helper.from_array(inits[names[t.name]], t.name))
        h1 = compile_onnx(first, BUILD).run(x)
        assert np.array_equal(y, compile_onnx(second, BUILD).run(h1)), ops


def test_stacked_every_step_output_and_refusals():
    """The top layer's every step as the output; a Dense reading a lower layer's every
    step is still refused."""
    from rnn_onnx import rnn_onnx
    rng = np.random.default_rng(64)
    model = rnn_onnx("GRU", 3, I, H, rng, layers=2, every=True)
    net = compile_onnx(model, BUILD)
    x = rng.normal(size=(3, 2, I)).astype(np.float32)
    y, ref = net.run(x), ort_run(model, x)
    assert y.shape == ref.shape == (3, 2, H) and np.abs(y - ref).max() < 2.0 ** -5
    model, _ = rnn_model("LSTM", 3, rng, out="every")
    g = model.graph
    g.initializer.append(init("Wm", rng.normal(size=(H, 5))))
    g.node.append(helper.make_node("MatMul", ["ys", "Wm"], ["z"], name="per_step"))
    g.output[0].CopyFrom(helper.make_tensor_value_info("z", TensorProto.FLOAT, [3, "B", 5]))
    with pytest.raises((OnnxImportError, CompileError), match="'per_step'"):
        compile_onnx(model, BUILD)


# --- the builder functions ------------------------------------------------------------------

def test_emitters_reproduce_the_builders():
    """emit_lstm with the Builder as memory is lstm_sequence; gru_sequence of one step
    is gru_step; gru_sequence runs on the model like repeated gru_step."""
    from host.compiler.programs import (Builder, _weights, emit_lstm, gru_sequence, gru_step,
                                        lstm_sequence, logical)
    from host.model.core import NpuModel
    from host.numerics.mvm import fp16_bits
    cfg = parse_config("n=8,tiles=1")
    rng = np.random.default_rng(70)
    w = {f"{m}_{g}": rng.normal(size=(H, I if m == "W" else H)) for m in "WU" for g in "fioc"}
    w |= {f"b_{g}": rng.normal(size=H) for g in "fioc"}
    xs, h0, c0 = rng.normal(size=(3, I)), rng.normal(size=H), rng.normal(size=H)
    ref = lstm_sequence(cfg, w, xs, h0, c0)
    bld = Builder(cfg)
    wts = _weights(w, [f"{m}_{g}" for m in "WU" for g in "fioc"],
                   [f"b_{g}" for g in "fioc"], H, I, "")
    emit_lstm(bld, bld, wts, 3, I, H, fp16_bits(h0, "h0"), fp16_bits(c0, "c0"),
              step_writes=["netq"])
    bld.push(xs)
    got = bld.finish()
    assert got.text == ref.text and got.outputs == ref.outputs
    assert [(s, a, d.tolist()) for s, a, d in got.vectors] == \
        [(s, a, d.tolist()) for s, a, d in ref.vectors]
    g = {f"{m}_{k}": rng.normal(size=(H, I if m == "W" else H)) for m in "WU" for k in "zrn"}
    g |= {f"b_{k}": rng.normal(size=H) for k in ("z", "r", "n", "hn")}
    x = rng.normal(size=I)
    assert gru_sequence(cfg, g, x, h0).text == gru_step(cfg, g, x, h0).text
    # two steps of gru_sequence = gru_step twice
    _, out = gru_sequence(cfg, g, xs[:2], h0).run(NpuModel(cfg))
    _, o1 = gru_step(cfg, g, xs[0], h0).run(NpuModel(cfg))
    _, o2 = gru_step(cfg, g, xs[1], logical(o1, H)).run(NpuModel(cfg))
    assert np.array_equal(out, np.concatenate([o1, o2]))
