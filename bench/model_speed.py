"""Speed of the bit-exact reference model against plain float32 NumPy.

The LSTM of :mod:`bench.lstm` (input and hidden 256, batch 1, :data:`bench.lstm.STEPS`
steps, :func:`host.compiler.programs.lstm_sequence` on the N = 16, T = 2 build
:func:`bench.lstm.lstm_config`) is run on :class:`host.model.core.NpuModel`, and the same
LSTM is run written in float32 NumPy, in the same process. Record:

* ``model vs float32 numpy, LSTM 256, batch 1``: the best time of ``NpuModel.run`` (the
  image, program and inputs are loaded before the clock starts, for every repeat) over the
  best time of the float32 NumPy LSTM, a ratio (``x``). The config holds both times.
* ``exported layer vs float32 numpy, LSTM 256, batch 256``: the same LSTM exported with
  :func:`host.compiler.export.export_image` (``docs/export.md``), its ``run`` over
  :data:`BATCH` sequences (one job each) against the float32 NumPy LSTM over the same
  batch (matrix products over the batch), best times, a ratio (``x``; the issue's bar is
  at most 5).

The ratios are of wall-clock times. Each record's config also holds the best process CPU
times (``*_cpu_seconds``, all threads) and their ratio (``cpu_ratio``): on a machine
shared with other work the wall clock of the longer side stretches more (a run of tens
of milliseconds is descheduled, one of half a millisecond rarely is), and OpenBLAS
threads wait for busy cores.
"""

from __future__ import annotations

import platform
import time

import numpy as np

from bench import best_time, record
from sim.randprog import lstm_weights, unit_fp16

__all__ = ["numpy_lstm", "numpy_lstm_batch", "model_lstm", "exported_lstm", "run"]

REPEATS = 5
BATCH = 256


def _sigmoid(v):
    return np.float32(1) / (np.float32(1) + np.exp(-v))


def numpy_lstm(w, xs, h0, c0):
    """The LSTM of ``lstm_sequence`` in float32 NumPy (matrices per gate, as the NPU has
    them); ``w`` and the vectors are float32 already. Returns every step's ``h``
    ``(steps, H)``."""
    f32 = w
    h, c = h0, c0
    out = []
    for x in xs:
        f = _sigmoid(f32["W_f"] @ x + f32["b_f"] + f32["U_f"] @ h)
        i = _sigmoid(f32["W_i"] @ x + f32["b_i"] + f32["U_i"] @ h)
        g = np.tanh(f32["W_c"] @ x + f32["b_c"] + f32["U_c"] @ h)
        o = _sigmoid(f32["W_o"] @ x + f32["b_o"] + f32["U_o"] @ h)
        c = f * c + i * g
        h = o * np.tanh(c)
        out.append(h)
    return np.stack(out)


def numpy_lstm_batch(w, xs, h0, c0):
    """:func:`numpy_lstm` over a batch: ``xs`` ``(steps, B, X)``, ``h0``/``c0`` ``(B, H)``
    float32; returns every step's ``h`` ``(steps, B, H)``."""
    h, c = h0, c0
    out = []
    for x in xs:
        f = _sigmoid(x @ w["W_f"].T + w["b_f"] + h @ w["U_f"].T)
        i = _sigmoid(x @ w["W_i"].T + w["b_i"] + h @ w["U_i"].T)
        g = np.tanh(x @ w["W_c"].T + w["b_c"] + h @ w["U_c"].T)
        o = _sigmoid(x @ w["W_o"].T + w["b_o"] + h @ w["U_o"].T)
        c = f * c + i * g
        h = o * np.tanh(c)
        out.append(h)
    return np.stack(out)


def exported_lstm(prog, w, h0, c0, batch: int = BATCH, seed: int = 2, repeats: int = 3):
    """Export the LSTM's image, run it over ``batch`` random sequences and the float32
    NumPy LSTM over the same; returns the record's config (times, ratio, difference)."""
    import importlib.util
    import sys
    import tempfile

    from bench.lstm import HIDDEN, INPUT, STEPS
    from host.compiler.export import export_image
    from host.compiler.image import program_image
    from host.compiler.programs import native

    image = program_image(prog)
    n = prog.config.n
    rng = np.random.default_rng(seed)
    xb = unit_fp16(rng, batch, STEPS, INPUT)
    inputs = np.stack([np.concatenate([native(x, n) for x in seq]) for seq in xb])
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        path, _ = export_image(image, f"{tmp}/lstm_layer.py")
        export_seconds = time.perf_counter() - start
        spec = importlib.util.spec_from_file_location("bench_lstm_layer", path)
        layer = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = layer
        try:
            spec.loader.exec_module(layer)
            layer.run(inputs[:2])                       # warm-up
            best = cpu = float("inf")
            for _ in range(repeats):
                start, start_cpu = time.perf_counter(), time.process_time()
                out, _counters = layer.run(inputs)
                best = min(best, time.perf_counter() - start)
                cpu = min(cpu, time.process_time() - start_cpu)
        finally:
            del sys.modules[spec.name]
    w32 = {k: v.astype(np.float32) for k, v in w.items()}
    xs32 = xb.astype(np.float32).transpose(1, 0, 2)
    h32 = np.repeat(h0.astype(np.float32)[None], batch, axis=0)
    c32 = np.repeat(c0.astype(np.float32)[None], batch, axis=0)
    ref = numpy_lstm_batch(w32, xs32, h32, c32)
    got = out.view(np.float16).astype(np.float32).reshape(batch, STEPS, -1)[..., :HIDDEN]
    err = float(np.max(np.abs(got - ref.transpose(1, 0, 2))))
    if not err < 0.05:
        raise RuntimeError(f"the exported LSTM differs from float32 by {err}")
    np_best = best_time(lambda: numpy_lstm_batch(w32, xs32, h32, c32), repeats=10, warmup=1)
    np_cpu = best_time(lambda: numpy_lstm_batch(w32, xs32, h32, c32), 10, 0, time.process_time)
    return {"exported_seconds": round(best, 4), "numpy_seconds": round(np_best, 5),
            "exported_cpu_seconds": round(cpu, 4), "numpy_cpu_seconds": round(np_cpu, 5),
            "cpu_ratio": round(cpu / np_cpu, 1),
            "export_seconds": round(export_seconds, 3), "batch": batch,
            "max_abs_h_difference": round(err, 4), "ratio": best / np_best}


def model_lstm(seed: int = 1):
    """``(prepare, w, xs, h0, c0)``: ``prepare()`` returns an ``NpuModel`` with the LSTM
    program loaded, ready to ``run``."""
    from bench.lstm import HIDDEN, INPUT, STEPS, lstm_config
    from host.compiler.programs import lstm_sequence
    from host.model.core import NpuModel

    cfg = lstm_config()
    rng = np.random.default_rng(seed)
    w = lstm_weights(rng, INPUT, HIDDEN)
    xs, h0, c0 = unit_fp16(rng, STEPS, INPUT), unit_fp16(rng, HIDDEN), unit_fp16(rng, HIDDEN)
    prog = lstm_sequence(cfg, w, xs, h0, c0)

    def prepare():
        model = NpuModel(cfg)
        prog.load(model)
        return model

    return prepare, prog, w, xs, h0, c0


def run():
    """NpuModel.run of the LSTM 256/256 over the same LSTM in float32 NumPy (time ratio)."""
    from bench.lstm import HIDDEN, INPUT, N, STEPS, TILES

    prepare, prog, w, xs, h0, c0 = model_lstm()
    model_best = model_cpu = float("inf")
    for k in range(REPEATS + 1):            # the first run is a warm-up
        model = prepare()
        start, start_cpu = time.perf_counter(), time.process_time()
        result = model.run()
        elapsed = time.perf_counter() - start
        elapsed_cpu = time.process_time() - start_cpu
        if not result.ok:
            raise RuntimeError(f"the model refused the LSTM: {result.message}")
        if k:
            model_best = min(model_best, elapsed)
            model_cpu = min(model_cpu, elapsed_cpu)
    # The model's h against float32 (a sanity check that both compute the same LSTM).
    h_model = model.pop_output(model.output_level).view(np.float16).astype(np.float32)
    w32 = {k: v.astype(np.float32) for k, v in w.items()}
    xs32, h32, c32 = (v.astype(np.float32) for v in (xs, h0, c0))
    h_ref = numpy_lstm(w32, xs32, h32, c32)
    err = float(np.max(np.abs(h_model.reshape(-1)[-HIDDEN:] - h_ref[-1])))
    if not err < 0.05:
        raise RuntimeError(f"the model's LSTM differs from float32 by {err}")
    np_best = best_time(lambda: numpy_lstm(w32, xs32, h32, c32), repeats=20, warmup=2)
    # CPU time of one LSTM (0.5 ms) is read over ten at a time (the clock's resolution).
    np_cpu = best_time(lambda: [numpy_lstm(w32, xs32, h32, c32) for _ in range(10)], 10, 0,
                       time.process_time) / 10
    config = {"model": "host.model.core.NpuModel", "program": "lstm_sequence",
              "n": N, "tiles": TILES, "input": INPUT, "hidden": HIDDEN, "steps": STEPS,
              "batch": 1, "model_seconds": round(model_best, 5),
              "numpy_seconds": round(np_best, 6), "model_cpu_seconds": round(model_cpu, 5),
              "numpy_cpu_seconds": round(np_cpu, 6), "cpu_ratio": round(model_cpu / np_cpu, 1),
              "max_abs_h_difference": round(err, 4),
              "repeats": REPEATS, "numpy": np.__version__,
              "python": platform.python_version(), "machine": platform.machine()}
    exported = exported_lstm(prog, w, h0, c0)
    ratio = exported.pop("ratio")
    config_x = {k: v for k, v in config.items()
                if k not in ("model", "model_seconds", "numpy_seconds", "batch",
                             "max_abs_h_difference", "repeats", "model_cpu_seconds",
                             "numpy_cpu_seconds", "cpu_ratio")}
    return [record("model vs float32 numpy, LSTM 256, batch 1",
                   round(model_best / np_best, 1), "x", **config),
            record(f"exported layer vs float32 numpy, LSTM 256, batch {BATCH}",
                   round(ratio, 1), "x", module="host.compiler.export.export_image",
                   **config_x, **exported)]
