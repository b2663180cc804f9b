"""cocotb bench of the core's cycle counts (``bench/lstm.py``): programs of
:mod:`host.compiler.programs` on :class:`hw.core.npu.NpuCore`, bit-exact against
:class:`host.model.core.NpuModel`, with the RTL cycles beside the model's prediction.

* ``lstm_bench``: an LSTM sequence (:func:`host.compiler.programs.lstm_sequence`) with FP16
  weights, inputs and state drawn from a seeded generator; the output queue is drained
  while the program runs, so the cycle at which each step's last ``h`` vector leaves it
  is recorded (cycles counted from the ``run`` pulse);
* ``timing_programs``: the MLP layer, LSTM step, GRU step, 1x1 and 3x3 convolutions and
  softmax head with the sizes of ``NPU_TIMING``, each run to ``done``.

Both compare every output vector, every vector memory, the counters, the error code and
``pc`` with the model (``sim.test_npu.TB.compare``), without stalls (the cycle counts are
the core's, not the bench's). Environment: ``NPU_CONFIG`` (the build), ``NPU_LSTM``
(JSON: ``input``, ``hidden``, ``steps``, ``seed``), ``NPU_TIMING`` (JSON: ``seed``,
``input``, ``hidden``), ``NPU_BENCH_OUT`` (a JSON file the measurements are written to).
"""

import json
import os

import numpy as np

import cocotb
from cocotb.triggers import ClockCycles, RisingEdge, with_timeout

from host.compiler import programs
from host.spec.isa import ErrorCode
from host.model.core import NpuModel
from sim.randprog import lstm_weights, unit_fp16
from sim.test_npu import CLOCK_NS, RUN_TIMEOUT_CYCLES, TB, fresh, unpack_vector


@cocotb.test()
async def lstm_bench(dut):
    p = json.loads(os.environ["NPU_LSTM"])
    tb = TB(dut, stalls=False, seed=p["seed"])
    await tb.reset()
    cfg = tb.cfg
    rng = np.random.default_rng(p["seed"])
    x_len, h_len, steps = p["input"], p["hidden"], p["steps"]
    prog = programs.lstm_sequence(cfg, lstm_weights(rng, x_len, h_len),
                                  unit_fp16(rng, steps, x_len), unit_fp16(rng, h_len), unit_fp16(rng, h_len))
    model = NpuModel(cfg)
    await tb.load(model, prog)
    result = model.run()
    assert result.ok, f"the model refused the LSTM: {result.message}"
    # The output sink takes every vector as it is pushed: the monitor stamps each h.
    mon = tb.mon["outq"]
    start = mon.cycle
    await tb.pulse("run")
    await with_timeout(RisingEdge(dut.done), RUN_TIMEOUT_CYCLES * CLOCK_NS, "ns")
    await RisingEdge(dut.clk)
    hw = (ErrorCode(int(dut.error.value)), int(dut.pc.value), int(dut.cycles.value))
    got = np.array([unpack_vector(v, cfg.n) for v in await tb.take("outq", prog.outputs)])
    want = model.pop_output(prog.outputs)
    bad = np.argwhere(got != want)
    assert not len(bad), f"LSTM output vector {bad[0][0]} lane {bad[0][1]}: " \
                         f"{got[tuple(bad[0])]:#06x}, model {want[tuple(bad[0])]:#06x}"
    per_h = -(-h_len // cfg.n)
    h_cycles = [c - start for c in mon.cycles[per_h - 1::per_h]]
    assert len(h_cycles) == steps
    tb.log.info("LSTM %d/%d, %d steps: %d cycles (model predicts %d), h at %s", x_len,
                h_len, steps, hw[2], result.cycles_predicted, h_cycles)
    # outq_level counts the last pop one cycle after the monitor has seen it.
    await ClockCycles(dut.clk, 2)
    await tb.compare(model, "lstm", result, hw)
    with open(os.environ["NPU_BENCH_OUT"], "w") as f:
        json.dump({"cycles": hw[2], "predicted": result.cycles_predicted,
                   "h_cycles": h_cycles, "chains": result.chains}, f)


@cocotb.test()
async def timing_programs(dut):
    p = json.loads(os.environ["NPU_TIMING"])
    tb = TB(dut, stalls=False, seed=p["seed"])
    await tb.reset()
    cfg, n = tb.cfg, tb.n
    rng = np.random.default_rng(p["seed"])
    x, h = p["input"], p["hidden"]
    gru_w = ({f"W_{g}": unit_fp16(rng, h, x) for g in "zrn"}
             | {f"U_{g}": unit_fp16(rng, h, h) for g in "zrn"}
             | {f"b_{g}": unit_fp16(rng, h) for g in ("z", "r", "n", "hn")})
    progs = {
        "mlp": programs.mlp_layer(cfg, unit_fp16(rng, h, x), unit_fp16(rng, h), unit_fp16(rng, 4, x)),
        "lstm step": programs.lstm_step(cfg, lstm_weights(rng, x, h), unit_fp16(rng, x),
                                        unit_fp16(rng, h), unit_fp16(rng, h)),
        "gru step": programs.gru_step(cfg, gru_w, unit_fp16(rng, x), unit_fp16(rng, h)),
        "conv1x1": programs.conv1x1(cfg, unit_fp16(rng, n + 2, n - 3), unit_fp16(rng, n + 2),
                                    unit_fp16(rng, 3, 4, n - 3), "tanh"),
        "conv3x3 stride 2": programs.conv2d(cfg, unit_fp16(rng, 5, 3, 3, 3), unit_fp16(rng, 5),
                                            unit_fp16(rng, 7, 7, 3), stride=2),
        "softmax head": programs.softmax_head(cfg, unit_fp16(rng, 2 * n + 1, x),
                                              unit_fp16(rng, 2 * n + 1), unit_fp16(rng, x)),
    }
    out = {}
    for what, prog in progs.items():
        result, hw = await tb.run_program(await fresh(tb), prog, what)
        assert result.ok, f"{what}: the model refused the program: {result.message}"
        out[what] = {"cycles": hw[2], "predicted": result.cycles_predicted,
                     "chains": result.chains}
    tb.log.info("RTL and predicted cycles: %s", out)
    with open(os.environ["NPU_BENCH_OUT"], "w") as f:
        json.dump(out, f)
