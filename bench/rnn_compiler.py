"""The network compiler's recurrent layers on the reference model's cycle prediction:
scheduling, quantize-once and runs per job (``docs/compiler.md`` sections 7 to 9).

Records (every figure is :class:`host.model.core.NpuModel`'s prediction, one job; no
board, no host time):

* ``compiled lstm mvm utilization`` / ``hand-written lstm_sequence mvm utilization`` /
  ``naive-order lstm mvm utilization``: LSTM, input and hidden size 256, 10 steps, every
  step's ``h`` out, on the default build with a 1024-slot MRF (N = 16, T = 2): useful
  MACs ``steps * 8 * 256 * 256`` over ``T * N * N`` MACs a cycle times the predicted
  cycles of the whole job, percent. Compiled: ONNX through ``compile_onnx`` (quantize
  once, naive order, the scheduler); hand-written: ``programs.lstm_sequence``; naive: the
  compiler's chains without the scheduler.
* ``lstm quantize-once cycles, stacked`` / ``..., separate``, and the same for the GRU,
  at 256 and at I = 12, H = 10 (N = 8): the scheduled layer with and without the stacked
  products; ``... vector quantizations a step``: how often a step quantizes a vector.
* ``500-step lstm cycles per step, in runs``: a 500-step LSTM (I = 12, H = 10) on an
  N = 8 build with 1024 words of program memory, run as several runs of a program of
  ``S`` steps; ``... one program``: the same on a build whose program memory holds
  every step. The host's time between runs is not in these figures (on a board it adds
  a round trip a run).
"""

from __future__ import annotations

import numpy as np

SIZE, STEPS = 256, 10
BUILD = "mrf_depth=1024"                       # the default build, an MRF for 8 x 256^2
SMALL = "n=8,tiles=1"


def _onnx(op, steps, x_len, h_len, seed, every=True):
    """An ONNX model of one forward ``op`` layer over ``(steps, B, x_len)``."""
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(seed)
    g = 4 if op == "LSTM" else 3
    inits = [numpy_helper.from_array(a.astype(np.float32), name) for name, a in (
        ("W", rng.normal(0, x_len ** -0.5, (1, g * h_len, x_len))),
        ("R", rng.normal(0, h_len ** -0.5, (1, g * h_len, h_len))),
        ("B", rng.normal(0, 0.2, (1, 2 * g * h_len))))]
    inits.append(numpy_helper.from_array(np.array([1 if every else 0], np.int64), "ax"))
    kw = {"linear_before_reset": 1} if op == "GRU" else {}
    nodes = [helper.make_node(op, ["x", "W", "R", "B"], ["Y", "Yh"], hidden_size=h_len,
                              **kw),
             helper.make_node("Squeeze", ["Y" if every else "Yh", "ax"], ["y"])]
    out = [steps, "B", h_len] if every else ["B", h_len]
    graph = helper.make_graph(nodes, "rnn", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [steps, "B", x_len])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, out)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _cycles(prog):
    from host.model.core import NpuModel
    result, _ = prog.run(NpuModel(prog.config))
    assert result.ok, result
    return result.cycles_predicted


def _layer_cycles(cfg, op, size, fuse, order):
    """Predicted cycles of ``STEPS`` steps of one layer emitted by the builders."""
    from host.compiler import programs as P
    from sim.randprog import lstm_weights
    rng = np.random.default_rng(7)
    bld = P.Builder(cfg)
    zero = np.zeros(size, np.float16)
    if op == "LSTM":
        P.emit_lstm(bld, bld, lstm_weights(rng, size, size), STEPS, size, size, zero, zero,
                    step_writes=["netq"], fuse=fuse, order=order)
    else:
        w = {f"{m}_{k}": rng.normal(0, size ** -0.5, (size, size)) for m in "WU"
             for k in "zrn"} | {f"b_{k}": rng.normal(0, 0.2, size) for k in
                                ("z", "r", "n", "hn")}
        P.emit_gru(bld, bld, w, STEPS, size, size, zero, step_writes=["netq"], fuse=fuse,
                   order=order)
    bld.push(np.zeros((STEPS, size), np.float16))
    return _cycles(bld.finish())


def run():
    """Compiled LSTM 256 utilization against lstm_sequence; quantize-once; 500 steps in runs."""
    from host.compiler import compile_onnx
    from host.compiler import programs as P
    from host.spec.config import parse_config
    from sim.randprog import lstm_weights
    records = []
    cfg = parse_config(BUILD)
    useful = STEPS * 8 * SIZE * SIZE
    net = compile_onnx(_onnx("LSTM", STEPS, SIZE, SIZE, 1), cfg)
    compiled = net.report()["per_job"]["cycles_predicted"]
    rng = np.random.default_rng(2)
    zero = np.zeros(SIZE, np.float16)
    hand = _cycles(P.lstm_sequence(cfg, lstm_weights(rng, SIZE, SIZE),
                                   np.zeros((STEPS, SIZE), np.float16), zero, zero))
    naive = _layer_cycles(cfg, "LSTM", SIZE, True, "naive")
    common = {"model": "host.model.core.NpuModel", "build": BUILD, "n": cfg.n,
              "tiles": cfg.tiles, "input": SIZE, "hidden": SIZE, "steps": STEPS,
              "useful_macs": useful}
    for name, cycles in (("compiled lstm mvm utilization", compiled),
                         ("hand-written lstm_sequence mvm utilization", hand),
                         ("naive-order lstm mvm utilization", naive)):
        records.append({"name": name,
                        "value": round(100 * useful / (cfg.macs_per_cycle * cycles), 1),
                        "unit": "%", "config": common | {"cycles_predicted": cycles}})
    # quantize once: the scheduled layer with and without the stacked products
    for op in ("LSTM", "GRU"):
        for build, size in ((BUILD, SIZE), (SMALL, 10)):
            c = parse_config(build)
            fused = _layer_cycles(c, op, size, True, "scheduled")
            plain = _layer_cycles(c, op, size, False, "scheduled")
            groups = P.LSTM_FUSED if op == "LSTM" else P.GRU_FUSED
            conf = {"build": build, "input": size, "hidden": size, "steps": STEPS,
                    "groups": [list(g) for g in groups]}
            records += [
                {"name": f"{op.lower()} {size} quantize-once cycles, stacked",
                 "value": fused, "unit": "cycles", "config": conf},
                {"name": f"{op.lower()} {size} quantize-once cycles, separate",
                 "value": plain, "unit": "cycles", "config": conf}]
        gates = 4 if op == "LSTM" else 3
        records.append({"name": f"{op.lower()} vector quantizations a step, stacked",
                        "value": sum(len(part) for part in groups), "unit": "quantizations",
                        "config": {"separate": 2 * gates, "groups": [list(g) for g in
                                                                     groups]}})
    # 500 steps in runs, and in one program
    steps = 500
    model = _onnx("LSTM", steps, 12, 10, 3, every=False)
    for name, build in (("500-step lstm cycles per step, in runs",
                         "n=8,tiles=1,program_depth=1024"),
                        ("500-step lstm cycles per step, one program",
                         "n=8,tiles=1,program_depth=65536,netq_depth=4096")):
        net = compile_onnx(model, build)
        lay = net.report()["layers"][0]
        records.append({"name": name, "value": round(
            net.report()["per_job"]["cycles_predicted"] / steps, 1), "unit": "cycles",
            "config": {"build": build, "input": 12, "hidden": 10, "steps": steps,
                       "runs": lay["runs"], "steps_per_run": lay["steps_per_run"],
                       "host_time": "excluded"}})
    return records
