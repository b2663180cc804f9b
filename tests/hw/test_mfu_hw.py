"""The MFU pipeline under an HDL simulator: random chains, counters, softmax and timing,
bit-exact against :mod:`host.spec.mfu`, with and without stalls (``sim/test_mfu.py``).

Two builds, both with two MFUs and chains of up to 8 native vectors:

* ``n = 16`` at ``lanes = 4`` (issue 36: four beats per native vector, so REDUCE's first
  two vector-tree levels pair beats), every unary op, 32-bit counters (the native vector
  size of the device);
* ``n = 4`` at ``lanes = n``, a subset of unary ops (an unbuilt op gives NaN), a VRF depth
  that is not a power of two and 4-bit counters, so that counters saturate.

The random volumes (``CHAINS``) are per build and simulator: the ``n = 16`` pipeline
(the Verilated model is compiled with ``-O0``, ``sim.runner.VERILATOR_OPT_FLAGS``) takes
four cycles per native vector at ``lanes = 4``, so it runs fewer chains; the ``n = 4``
build, where every random path is as likely, runs more.
"""

import pytest
from amaranth.hdl import Fragment, Shape
from amaranth.lib.memory import Memory

from host.spec.mfu import MfuConfig
from host.spec.ops import UnaryOp
from hw.mfu.mfu import Mfu, MfuPipeline
from sim.runner import run_cocotb

BUILDS = {
    "n16": dict(n=16, lanes=4, mfus=2, vrf_depth=16, max_length=8, counter_bits=32),
    "n4": dict(n=4, mfus=2, vrf_depth=12, max_length=8, counter_bits=4,
               unary_ops=(UnaryOp.EXP, UnaryOp.RECIP, UnaryOp.RELU, UnaryOp.TANH)),
}
#: Random chains of test_random_chains; test_counters runs half as many, test_softmax a
#: sixth as many softmax vectors (at least 8: every length 1..8 once).
CHAINS = {("n16", "verilator"): 60, ("n16", "icarus"): 32,
          ("n4", "verilator"): 80, ("n4", "icarus"): 40}


@pytest.mark.parametrize("build", BUILDS)
def test_mfu_pipeline(simulator, build):
    params = BUILDS[build]
    cfg = MfuConfig(**params)
    env = {f"MFU_{k.upper()}": str(v) for k, v in params.items() if k != "unary_ops"}
    if "unary_ops" in params:
        env["MFU_OPS"] = ",".join(op.name.lower() for op in params["unary_ops"])
    env["MFU_CHAINS"] = str(CHAINS[build, simulator])
    run_cocotb(name=f"mfu_pipeline_{build}", component=MfuPipeline(cfg),
               test_module="sim.test_mfu", simulator=simulator, extra_env=env)


def test_constructor_errors():
    with pytest.raises(TypeError, match="cfg must be an MfuConfig, not 16"):
        MfuPipeline(16)
    with pytest.raises(TypeError, match="cfg must be an MfuConfig, not None"):
        Mfu(None)


def test_elaborates_other_builds():
    """Builds the benches do not simulate still elaborate: four MFUs, one VRF entry,
    chains of one vector, wide vectors, the fewest lanes with the most beats, beats with
    unit sets."""
    for cfg in (MfuConfig(n=4, mfus=4, vrf_depth=1, max_length=1, counter_bits=1),
                MfuConfig(n=8, mfus=3, vrf_depth=4096, max_length=256,
                          unary_ops=(UnaryOp.PASS,)),
                MfuConfig(n=64, lanes=2, mfus=2, vrf_depth=3, max_length=256,
                          unary_ops=(UnaryOp.RELU,)),
                MfuConfig(n=4, lanes=2, mfus=2, vrf_depth=1, max_length=1, counter_bits=1,
                          unit_sets="addsub+mul+reduce/act")):
        Fragment.get(MfuPipeline(cfg), None)


def test_beats_size_the_units_vrfs_and_ring():
    """At l lanes every unit, VRF word and ring entry is l lanes wide, the VRFs hold
    ``vrf_depth * n / l`` beats, the output ring ``max_length * n / l``, and REDUCE is
    built for ``max_length * n / l`` items; at l = n all of it is as it was."""
    def memories(fragment, path=()):
        """Every lib.memory.Memory under ``fragment``: its path, depth and width."""
        found = {}
        for sub, name, _ in fragment.subfragments:
            origin = (sub.origins or (None,))[0]
            if isinstance(origin, Memory):
                found["/".join((*path, name))] = (origin.depth, Shape.cast(origin.shape).width)
            else:
                found.update(memories(sub, (*path, name)))
        return found

    for n, lanes in ((16, 4), (8, 2), (4, 4)):
        cfg = MfuConfig(n=n, lanes=lanes, mfus=2, vrf_depth=12, max_length=8)
        beats = n // lanes
        pipe = MfuPipeline(cfg)
        assert len(pipe.i_stream.payload.as_value()) == 16 * lanes
        assert len(pipe.o_stream.payload.as_value()) == 16 * lanes + 1
        assert len(pipe.vrf_w.payload.addr) == 4 + (beats.bit_length() - 1)
        mems = memories(Fragment.get(pipe, None))
        assert mems["mfu0/addsub_vrf"] == mems["mfu1/mul_vrf"] == (12 * beats, 16 * lanes)
        assert mems["out_queue_mem"] == (8 * beats, 16 * lanes)
        mfu = Mfu(cfg, 0)
        units = {name: sub.origins[0] for sub, name, _ in Fragment.get(mfu, None).subfragments}
        assert units["reduce"].lanes == lanes and units["reduce"].max_length == 8 * beats
        assert units["addsub"].lanes == units["act"].lanes == lanes


def test_an_mfu_builds_only_its_unit_set():
    """``Mfu(cfg, index)`` instantiates the units of ``cfg.units(index)`` and the VRFs of
    ADDSUB and MUL only where it has them; the full build has all four and both."""
    cfg = MfuConfig(n=4, mfus=3, vrf_depth=4, max_length=2,
                    unit_sets="addsub+mul+reduce/mul+act/act")

    def parts(mfu):
        return {name for _, name, _ in Fragment.get(mfu, None).subfragments}

    units = {"addsub", "mul", "act", "reduce"}
    assert parts(Mfu(cfg, 0)) >= {"addsub", "mul", "reduce", "addsub_vrf", "mul_vrf"}
    assert not parts(Mfu(cfg, 0)) & {"act"}
    assert parts(Mfu(cfg, 1)) & (units | {"addsub_vrf", "mul_vrf"}) == {"mul", "act",
                                                                        "mul_vrf"}
    assert parts(Mfu(cfg, 2)) & (units | {"addsub_vrf", "mul_vrf"}) == {"act"}
    assert parts(Mfu(MfuConfig(n=4), 1)) >= units | {"addsub_vrf", "mul_vrf"}
    mfu = Mfu(cfg, 1)
    assert mfu.units == cfg.units(1)
    Fragment.get(mfu, None)
    Fragment.get(MfuPipeline(cfg), None)
    with pytest.raises(ValueError, match="index must be"):
        Mfu(cfg, 3)
    with pytest.raises(TypeError, match="index must be an integer"):
        Mfu(cfg, "1")
