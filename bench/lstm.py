"""LSTM utilization of the NPU core: RTL cycles per step under Verilator (issue 5).

An LSTM with input and hidden size 256, batch 1, :data:`STEPS` steps
(:func:`host.compiler.programs.lstm_sequence`) on an N = 16, T = 2 build of
:class:`hw.core.npu.NpuCore` whose memories are the smallest that hold the program
(:func:`lstm_config`). The cocotb bench ``sim/test_npu_lstm.py`` loads the image through
the core's host write ports, runs it, checks every output bit for bit against
:class:`host.model.core.NpuModel` and stamps the cycle each step's ``h`` leaves the output
queue. Records (``docs/npu.md`` section 4):

* ``lstm cycles per step``: steady state, ``(h[steps-2] - h[0]) / (steps - 2)`` cycles
  with ``h[k]`` the cycle step ``k``'s last ``h`` vector leaves the output queue (the
  last step, without the next step's input products, is left out);
* ``lstm utilization``: the useful MACs of a step, ``4 * (H*X + H*H)`` (the logical
  products of the eight gate matrices, no padding), over ``T*N*N`` MACs per cycle times
  the cycles per step, percent;
* ``lstm cycles``: RTL cycles of the whole run (``run`` to ``done``, the core's counter);
* ``lstm predicted cycles``: :class:`host.model.core.NpuModel`'s prediction of the same run;
* ``lstm prediction error``: ``(predicted - cycles) / cycles``, percent;
* ``npu n8t1 <program> prediction error``: the same for the other programs of
  :mod:`host.compiler.programs` on the ``n8t1`` build of ``tests/hw/test_npu_hw.py``
  (:func:`timing_programs`).

Run time: the Verilator build of the N = 16 core takes about 25 minutes at ``-O0`` on a
loaded 2-core machine (3 to convert, 6 to verilate, 16 to compile), the run about 25
(45,000 cycles, most of them the 32,768 weight rows written through ``w_rows``).
"""

from __future__ import annotations

import json
import os
import tempfile
import time

from host.spec.config import NpuConfig

__all__ = ["INPUT", "HIDDEN", "STEPS", "N", "TILES", "lstm_config", "run"]

INPUT = HIDDEN = 256
STEPS = 10               #: at least 3 (the steady state leaves out the last step)
N, TILES = 16, 2
SEED = 1


def lstm_config(n: int = N, tiles: int = TILES, x_len: int = INPUT, h_len: int = HIDDEN,
                steps: int = STEPS, lanes: int | None = None) -> NpuConfig:
    """The smallest core build that runs :func:`host.compiler.programs.lstm_sequence`,
    its MFU side ``lanes`` wide (None: ``n``; ``docs/mfu.md`` section 3).

    Sizes are in elements (``x_len``, ``h_len``) and time steps; every depth is derived
    from the placement ``lstm_sequence`` makes: the MRF holds the four ``W`` (``H x X``)
    and four ``U`` (``H x H``) matrices; the InitialVrf two ``x`` buffers and ``h``;
    AddSubVrf 0 the four biases and two sets of four ``xw`` buffers (the largest VRF);
    the input queue every step's ``x`` (the bench pushes them all before ``run``);
    the program memory the program's words. Only sigmoid and tanh are built.

    Raises
    ------
    TypeError, ValueError
        from :class:`host.spec.config.NpuConfig` when a size is out of range.
    """
    from host.compiler.programs import lstm_sequence
    import numpy as np

    xt, ht = -(-x_len // n), -(-h_len // n)
    max_length = 1 << (max(xt, ht) - 1).bit_length()          # a power of two >= both
    base = dict(n=n, tiles=tiles, lanes=lanes, max_col_tiles=max(xt, ht),
                max_length=max_length,
                unary_ops=("sigmoid", "tanh"), ivrf_depth=2 * xt + ht,
                vrf_depth=4 * ht + 2 * 4 * ht, netq_depth=max(steps * xt, steps * ht))
    probe = NpuConfig(**base, program_depth=1 << 20)
    base["mrf_depth"] = (4 * probe.mvm.slots_needed(ht, xt)
                         + 4 * probe.mvm.slots_needed(ht, ht))
    probe = NpuConfig(**base, program_depth=1 << 20)
    zeros = np.zeros
    w = {f"{m}_{g}": zeros((h_len, x_len if m == "W" else h_len), np.float16)
         for m in "WU" for g in "fioc"} | {f"b_{g}": zeros(h_len, np.float16) for g in "fioc"}
    words = lstm_sequence(probe, w, zeros((steps, x_len), np.float16),
                          zeros(h_len, np.float16), zeros(h_len, np.float16)).words
    return NpuConfig(**base, program_depth=len(words))


def config_json(cfg: NpuConfig) -> str:
    """``cfg`` as the JSON ``sim/test_npu.py`` reads from ``NPU_CONFIG``."""
    return cfg.to_json()


def simulate(cfg: NpuConfig, *, x_len: int, h_len: int, steps: int, seed: int = SEED,
             name: str = "npu_lstm") -> dict:
    """Run the LSTM bench on ``cfg`` under Verilator (at ``sim.runner``'s ``-O0``).

    Returns the bench's measurements: ``cycles`` (RTL run), ``predicted`` (model),
    ``h_cycles`` (cycle of each step's last ``h`` vector after ``run``), ``chains`` and
    ``run_seconds`` (wall clock of the whole call, the Verilator build included when it
    was not cached).

    Raises
    ------
    AssertionError
        when the RTL differs from the model (the cocotb test fails).
    """
    from hw.core.npu import NpuCore
    from sim.runner import run_cocotb

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "lstm.json")
        env = {"NPU_CONFIG": config_json(cfg), "NPU_BENCH_OUT": out,
               "NPU_LSTM": json.dumps({"input": x_len, "hidden": h_len, "steps": steps,
                                       "seed": seed})}
        start = time.monotonic()
        run_cocotb(name=name, component=NpuCore(cfg), test_module="sim.test_npu_lstm",
                   testcase="lstm_bench", simulator="verilator", extra_env=env)
        with open(out) as f:
            m = json.load(f)
    m["run_seconds"] = time.monotonic() - start
    return m


def _test_build(name: str) -> NpuConfig:
    """Build ``name`` of ``tests/hw/test_npu_hw.py``, so that the bench shares its cached
    Verilator model (same name, same design)."""
    import importlib.util
    from sim.runner import REPO_ROOT
    spec = importlib.util.spec_from_file_location(
        "_test_npu_hw", REPO_ROOT / "tests" / "hw" / "test_npu_hw.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.ALL_BUILDS[name]


def timing_programs(build: str = "n8t1", *, x_len: int = 21, h_len: int = 13,
                    seed: int = SEED) -> dict:
    """RTL and predicted cycles of the other :mod:`host.compiler.programs` programs (MLP, LSTM step,
    GRU step, convolutions, softmax head) on build ``build`` of ``tests/hw/test_npu_hw.py``,
    bit-exact against the model (``sim/test_npu_lstm.py:timing_programs``).

    Returns ``{program: {"cycles", "predicted", "chains"}}``.
    """
    from hw.core.npu import NpuCore
    from sim.runner import run_cocotb

    cfg = _test_build(build)
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "timing.json")
        env = {"NPU_CONFIG": config_json(cfg), "NPU_BENCH_OUT": out,
               "NPU_TIMING": json.dumps({"input": x_len, "hidden": h_len, "seed": seed})}
        run_cocotb(name=f"npu_{build}", component=NpuCore(cfg),
                   test_module="sim.test_npu_lstm", testcase="timing_programs",
                   simulator="verilator", extra_env=env)
        with open(out) as f:
            return json.load(f)


def run():
    """LSTM 256/256 on the N=16, T=2 core (Verilator): cycles per step, utilization, prediction.

    ``BENCH_LSTM_LANES`` (e.g. ``4``) builds the core's MFU side that many lanes wide,
    ``BENCH_LSTM_TILES`` (e.g. ``1``) the MVM with that many tile engines; the records'
    names then say so. ``BENCH_LSTM_BUILD=board`` runs on the board's build instead
    (preset ``ulx3s``, what ``make bitstream`` builds: N = 16, T = 1, 2 lanes), records
    named "..., board build"."""
    board = os.environ.get("BENCH_LSTM_BUILD") == "board"
    if board:
        from host.spec.config import preset
        cfg = preset("ulx3s")
        tiles, at = cfg.tiles, ", board build"
    else:
        lanes = int(os.environ["BENCH_LSTM_LANES"]) if os.environ.get("BENCH_LSTM_LANES") \
            else None
        tiles = int(os.environ.get("BENCH_LSTM_TILES") or TILES)
        cfg = lstm_config(tiles=tiles, lanes=lanes)
        at = ("" if cfg.lanes == cfg.n else f", lanes {cfg.lanes}") + \
            ("" if tiles == TILES else f", tiles {tiles}")
    m = simulate(cfg, x_len=INPUT, h_len=HIDDEN, steps=STEPS,
                 name="npu_lstm" + at.replace(", ", "_").replace(" ", ""))
    # Steady state: the last step has no next-step input products, so it is left out.
    h = m["h_cycles"]
    per_step = (h[-2] - h[0]) / (len(h) - 2)
    macs = 4 * (HIDDEN * INPUT + HIDDEN * HIDDEN)
    config = {"design": "hw.core.npu.NpuCore", "n": cfg.n, "tiles": cfg.tiles,
              "lanes": cfg.lanes, "mrf_depth": cfg.mrf_depth, "build": cfg.to_dict(),
              "input": INPUT, "hidden": HIDDEN,
              "steps": STEPS, "batch": 1, "simulator": "verilator", "opt_fast": "-O0",
              "useful_macs_per_step": macs}
    error = 100 * (m["predicted"] - m["cycles"]) / m["cycles"]
    records = [
        {"name": f"lstm cycles per step{at}", "value": round(per_step, 1), "unit": "cycles",
         "config": config},
        {"name": f"lstm utilization{at}",
         "value": round(100 * macs / (cfg.macs_per_cycle * per_step), 1), "unit": "%",
         "config": config},
        {"name": f"lstm cycles{at}", "value": m["cycles"], "unit": "cycles", "config": config},
        {"name": f"lstm predicted cycles{at}", "value": m["predicted"], "unit": "cycles",
         "config": config},
        {"name": f"lstm prediction error{at}", "value": round(error, 1), "unit": "%",
         "config": config},
    ]
    if board:
        return records            # the n8t1 programs do not depend on the LSTM's build
    return records + [
        {"name": f"npu n8t1 {what} prediction error",
         "value": round(100 * (t["predicted"] - t["cycles"]) / t["cycles"], 1), "unit": "%",
         "config": {"design": "hw.core.npu.NpuCore", "build": "n8t1", "simulator": "verilator",
                    "cycles": t["cycles"], "predicted": t["predicted"],
                    "instances": t["chains"]}}
        for what, t in timing_programs().items()
    ]
