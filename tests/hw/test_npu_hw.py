"""The NPU core under an HDL simulator, bit-exact against :class:`host.model.core.NpuModel`.

The cocotb bench is ``sim/test_npu.py``; the build travels as JSON in ``NPU_CONFIG``.
The regression runs the ``n8t1`` build (N = 8, T = 1, small memories, ``lanes`` 4: the
MFU side in two beats a vector) and ``n8t1u`` (the same with per-MFU unit sets,
``sim.test_npu.UNIT_SETS``, and ``lanes`` 2, four beats: its directed unit-set cases and
the random chains) on both simulators. ``test_lanes_identical`` runs the hand-written
and compiled programs on ``n8t1`` at ``lanes`` = n = 8 too (Verilator only) and checks
that the two builds give the same results, and the model's. ``EXTRA_BUILDS`` holds the
second build (N = 16, T = 2): its Verilog is about 21 MB and its Verilator build takes
about 25 minutes at -O0, so it is not part of ``make test``; select it by hand with
``NPU_BUILDS=n16t2`` (``docs/npu.md`` section 5 says how far it has been run). The
random programs run ``CHAINS`` chains per build from the fixed ``SEED`` (Verilator
carries the volume; Icarus is about ten times slower here, and leaves the programs under
stalls to Verilator: ``ICARUS_LEAVES``).
"""

import json
import os

import pytest

from host.spec.config import NpuConfig
from hw.core.npu import NpuCore
from sim.runner import run_cocotb
from sim.test_npu import UNIT_SET_UNARY, UNIT_SETS

_N8T1 = {"n": 8, "tiles": 1, "mrf_depth": 128, "max_col_tiles": 16, "ivrf_depth": 64,
         "vrf_depth": 32, "netq_depth": 64, "program_depth": 512, "max_length": 4}
ALL_BUILDS = {
    "n8t1": NpuConfig(**_N8T1, lanes=4),
    # REDUCE only in MFU 0, ACT only in MFU 1, no ADDSUB (nor AddSubVrf) in MFU 1; no
    # sigmoid (sim.test_npu.UNIT_SET_PROGRAMS runs it: ILLEGAL_OPCODE).
    "n8t1u": NpuConfig(**_N8T1, unit_sets=UNIT_SETS, lanes=2, unary_ops=UNIT_SET_UNARY),
    # n8t1 at lanes = n: the core without beats, for test_lanes_identical.
    "n8t1l8": NpuConfig(**_N8T1),
    "n16t2": NpuConfig(n=16, tiles=2, mrf_depth=48, max_col_tiles=16, ivrf_depth=64,
                       vrf_depth=32, netq_depth=64, program_depth=512, max_length=4),
}
#: Builds not in the default regression (see the module docstring).
EXTRA_BUILDS = ("n16t2", "n8t1l8")
BUILDS = {name: cfg for name, cfg in ALL_BUILDS.items()
          if name in os.environ.get("NPU_BUILDS", "").split(",")
          or (not os.environ.get("NPU_BUILDS") and name not in EXTRA_BUILDS)}
#: Random chains of test_random per build (half with stalls), per simulator; the
#: environment's NPU_CHAINS overrides it for a long soak. The core simulates at a few
#: hundred cycles per second on a loaded machine, hence these small defaults.
CHAINS = {"verilator": 80, "icarus": 20}
#: Seed of the regression's random programs (``NPU_SEED`` overrides it; ``NPU_SEED=0``
#: draws a new one and logs it). Fixed so that every ``make test`` runs the same,
#: reproducible programs; this seed's first program (without stalls) hung on Icarus
#: until ``sim.runner`` compiled with ``-g2005`` (``docs/npu.md`` section 5).
SEED = 438688902
#: The cocotb tests (``sim/test_npu.py``; ``/stalls=...`` are its parametrized forms), in
#: three simulations per build and simulator: each start loads the simulator (and, before
#: ``sim.runner`` kept converted designs, converted the core again, about 30 s for
#: ``n8t1``), so one start per cocotb test cost as much as the tests themselves.
#: ``test_host_errors`` compares the MRF with a fresh model, so it needs memories no
#: earlier test wrote: a simulation of its own.
GROUPS = {
    "programs": ("test_hand_programs/stalls=False", "test_hand_programs/stalls=True",
                 "test_programs/stalls=False", "test_programs/stalls=True", "test_illegal"),
    "host_errors": ("test_host_errors",),
    "random": ("test_random/stalls=False", "test_random/stalls=True"),
    "unit_sets": ("test_unit_sets", "test_random/stalls=False", "test_random/stalls=True"),
}
#: The groups of each build (the others: the first three). The unit-set build runs its
#: own cases and the random chains in one simulation: the hand-written programs and
#: ``host.compiler.programs`` place their operands for every unit in every MFU.
BUILD_GROUPS = {"n8t1u": ("unit_sets",)}
#: What Icarus leaves to Verilator: the hand-written and compiled programs under stalls
#: (the same programs, the stalls only move cycles). Icarus's stalls are in its random
#: chains (half of them, ``test_random/stalls=True``).
ICARUS_LEAVES = ("test_hand_programs/stalls=True", "test_programs/stalls=True")
RUNS = [(build, group) for build in BUILDS
        for group in BUILD_GROUPS.get(build, ("programs", "host_errors", "random"))]


def _env(build, simulator):
    return {"NPU_CONFIG": BUILDS[build].to_json(),
            "NPU_CHAINS": os.environ.get("NPU_CHAINS", str(CHAINS[simulator])),
            "NPU_SEED": os.environ.get("NPU_SEED", str(SEED))}


@pytest.mark.parametrize("build, group", RUNS, ids=[f"{b}-{g}" for b, g in RUNS])
def test_npu(simulator, build, group):
    run_cocotb(name=f"npu_{build}", component=NpuCore(BUILDS[build]),
               test_module="sim.test_npu", simulator=simulator,
               testcase=",".join(t for t in GROUPS[group]
                                 if simulator == "verilator" or t not in ICARUS_LEAVES),
               extra_env=_env(build, simulator))


#: The cocotb tests of test_lanes_identical: every hand-written and compiled program,
#: without stalls (with stalls they give the same results: the stalls only move cycles).
IDENTICAL_TESTS = ("test_hand_programs/stalls=False", "test_programs/stalls=False")


def _digests(build, simulator, path):
    """The ``NPU_DIGEST`` lines (``sim/test_npu.py``) of ``IDENTICAL_TESTS`` on ``build``."""
    path.unlink(missing_ok=True)
    run_cocotb(name=f"npu_{build}", component=NpuCore(ALL_BUILDS[build]),
               test_module="sim.test_npu", simulator=simulator,
               testcase=",".join(IDENTICAL_TESTS),
               extra_env={"NPU_CONFIG": ALL_BUILDS[build].to_json(), "NPU_SEED": str(SEED),
                          "NPU_DIGEST": str(path)})
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.simulators("verilator")
def test_lanes_identical(simulator, tmp_path):
    """Results do not depend on ``lanes``: the same programs on ``n8t1`` at ``lanes`` 4
    and at ``lanes`` = n = 8 give the same outputs, memories, counters, error and ``pc``
    as each other and as the model (digests, ``sim/test_npu.py``; cycles may differ).
    Verilator only: it carries the extra build of ``n8t1l8``."""
    if "n8t1" not in BUILDS:
        pytest.skip("NPU_BUILDS leaves n8t1 out")
    wide = ALL_BUILDS["n8t1l8"]
    assert wide.lanes == wide.n and ALL_BUILDS["n8t1"] == NpuConfig(**_N8T1, lanes=4)
    beats = _digests("n8t1", simulator, tmp_path / "lanes4.jsonl")
    native = _digests("n8t1l8", simulator, tmp_path / "lanes8.jsonl")
    assert [d["what"] for d in beats] == [d["what"] for d in native] and len(beats) >= 10
    for b, w in zip(beats, native):
        assert b["core"] == w["core"], f"{b['what']}: lanes 4 and lanes 8 differ"
        assert b["core"] == b["model"] and w["core"] == w["model"], \
            f"{b['what']}: a core differs from the model"
        print(f"{b['what']}: {b['cycles']} cycles at lanes 4 (model {b['predicted']}), "
              f"{w['cycles']} at lanes 8 (model {w['predicted']})")


def test_constructor_errors():
    with pytest.raises(TypeError, match="config must be an NpuConfig, not 16"):
        NpuCore(16)


def test_model_timing_uses_the_gateware_latencies():
    """``host.model.core.Timing`` repeats the units' latencies (``host`` does not import
    ``hw``); a change in the gateware must reach the model's cycle prediction."""
    from host.model.core import Timing
    from hw.arith import fp16_arith, fp16_reduce, fp16_unary
    from hw.mfu import mfu
    timing = Timing()
    assert timing.unit_input_stages == mfu.INPUT_STAGES
    assert timing.binary_latency == fp16_arith.LATENCY
    assert timing.unary_latency == fp16_unary.LATENCY
    assert timing.reduce_node_latency == fp16_reduce.NODE_LATENCY


def test_reset_on_a_global_line_for_the_ecp5():
    """Elaborated for the ECP5, the core's reset (the sync reset or ``soft_reset``) goes
    through one DCCA onto a global line (``hw.ecp5``); for the simulators, through none."""
    from amaranth.back import rtlil

    from hw.arith.dsp import ECP5_TARGET
    cfg = NpuConfig(n=4, tiles=1, mrf_depth=32, max_col_tiles=4, ivrf_depth=16, vrf_depth=16,
                    netq_depth=16, program_depth=64, max_length=4)
    ecp5 = rtlil.convert(NpuCore(cfg), name="npu", platform=ECP5_TARGET, emit_src=False)
    plain = rtlil.convert(NpuCore(cfg), name="npu", emit_src=False)
    assert ecp5.count("cell \\DCCA ") == 1
    assert "DCCA" not in plain


def test_host_requests_wait_in_the_cycle_of_run():
    """No program write (nor any other host request but the queues') is taken in the
    cycle of ``run``: the front end picks the run's first read address without a term of
    a write in that cycle (``hw.core.npu``). Offered in the cycle before, it is taken."""
    from amaranth.sim import Simulator
    cfg = NpuConfig(n=4, tiles=1, mrf_depth=32, max_col_tiles=4, ivrf_depth=16, vrf_depth=16,
                    netq_depth=16, program_depth=64, max_length=4)
    dut = NpuCore(cfg)
    seen = []

    async def bench(ctx):
        await ctx.tick().repeat(2)
        ctx.set(dut.prog_w.valid, 1)
        ctx.set(dut.prog_w.payload.addr, 1)
        seen.append(("idle", ctx.get(dut.prog_w.ready), ctx.get(dut.vec_w.ready)))
        ctx.set(dut.run, 1)
        seen.append(("run", ctx.get(dut.prog_w.ready), ctx.get(dut.vec_w.ready)))
        await ctx.tick()
        ctx.set(dut.run, 0)
        seen.append(("running", ctx.get(dut.prog_w.ready), ctx.get(dut.vec_w.ready)))

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    assert seen == [("idle", 1, 1), ("run", 0, 0), ("running", 0, 0)], seen
