"""ONNX recurrent models of any size for the quantize-once, scheduling and long-sequence
tests: one LSTM / GRU or a stack of them, as ``torch.onnx.export`` writes ``num_layers=2``
(one node per layer, the direction axis squeezed between them), seq-first, batch axis
symbolic; the last step (``Y_h``) or every step as output, a ``Gemm`` head optionally."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper
from onnx_checks import init

GATES = {"LSTM": 4, "GRU": 3}


def rnn_onnx(op, steps, x_len, h_len, rng, *, layers=1, every=False, head=0, lbr=1,
             scale=None, ops=None):
    """A model over ``(steps, B, x_len)``; ``layers`` recurrent nodes of ``h_len`` (the
    first reading ``x``, each next one the previous one's squeezed ``Y``), of ``op`` or,
    per layer, ``ops[k]``; the top layer's every-step output ``(steps, B, h_len)`` or its
    last step ``(B, h_len)``, then a Gemm of ``head`` outputs if ``head``. Weights are
    normal with standard deviation ``scale`` (default ``1 / sqrt(fan in)``)."""
    ops = list(ops) if ops is not None else [op] * layers
    nodes, inits = [], [init("ax0", [0], np.int64), init("ax1", [1], np.int64)]
    cur, size = "x", x_len
    for k, kind in enumerate(ops):
        g = GATES[kind]
        sw = scale if scale is not None else 1 / np.sqrt(size)
        su = scale if scale is not None else 1 / np.sqrt(h_len)
        inits += [init(f"W{k}", rng.normal(0, sw, (1, g * h_len, size))),
                  init(f"R{k}", rng.normal(0, su, (1, g * h_len, h_len))),
                  init(f"B{k}", rng.normal(0, 0.2, (1, 2 * g * h_len)))]
        kw = {"hidden_size": h_len}
        if kind == "GRU":
            kw["linear_before_reset"] = lbr
        outs = [f"Y{k}", f"Yh{k}"] + ([f"Yc{k}"] if kind == "LSTM" else [])
        nodes.append(helper.make_node(kind, [cur, f"W{k}", f"R{k}", f"B{k}"], outs,
                                      name=f"rnn{k}", **kw))
        top = k == len(ops) - 1
        if top and not every:
            nodes.append(helper.make_node("Squeeze", [f"Yh{k}", "ax0"], ["hl"],
                                          name="squeeze_h"))
            cur = "hl"
        else:
            nodes.append(helper.make_node("Squeeze", [f"Y{k}", "ax1"], [f"ys{k}"],
                                          name=f"squeeze{k}"))
            cur = f"ys{k}"
        size = h_len
    shape = [steps, "B", h_len] if every else ["B", h_len]
    if head:
        inits += [init("Wd", rng.normal(0, 1 / np.sqrt(h_len), (head, h_len))),
                  init("bd", rng.normal(0, 0.2, head))]
        nodes.append(helper.make_node("Gemm", [cur, "Wd", "bd"], ["z"], name="fc",
                                      transB=1))
        cur, shape = "z", ["B", head]
    graph = helper.make_graph(
        nodes, "rnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                     [steps, "B", x_len])],
        [helper.make_tensor_value_info(cur, TensorProto.FLOAT, shape)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model
