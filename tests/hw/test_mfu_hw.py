"""The MFU pipeline under an HDL simulator: random chains, counters, softmax and timing,
bit-exact against :mod:`host.spec.mfu`, with and without stalls (``sim/test_mfu.py``).

Two builds, both with two MFUs and chains of up to 8 native vectors:

* ``n = 16``, every unary op, 32-bit counters (the native vector size of the device);
* ``n = 4``, a subset of unary ops (an unbuilt op gives NaN), a VRF depth that is not a
  power of two and 4-bit counters, so that counters saturate.

The random volumes (``CHAINS``) are per build and simulator: the ``n = 16`` pipeline
simulates at well under a thousand cycles per second on either simulator (the
Verilated model is compiled with ``-O0``, ``sim.runner.VERILATOR_OPT_FLAGS``), so it
runs fewer chains; the ``n = 4`` build, where every random path is as likely, runs more.
"""

import pytest
from amaranth.hdl import Fragment

from host.spec.mfu import MfuConfig
from host.spec.ops import UnaryOp
from hw.mfu.mfu import Mfu, MfuPipeline
from sim.runner import run_cocotb

BUILDS = {
    "n16": dict(n=16, mfus=2, vrf_depth=16, max_length=8, counter_bits=32),
    "n4": dict(n=4, mfus=2, vrf_depth=12, max_length=8, counter_bits=4,
               unary_ops=(UnaryOp.EXP, UnaryOp.RECIP, UnaryOp.RELU, UnaryOp.TANH)),
}
#: Random chains of test_random_chains; test_counters runs half as many, test_softmax a
#: sixth as many softmax vectors (at least 8: every length 1..8 once).
CHAINS = {("n16", "verilator"): 40, ("n16", "icarus"): 16,
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
    chains of one vector, wide vectors."""
    for cfg in (MfuConfig(n=4, mfus=4, vrf_depth=1, max_length=1, counter_bits=1),
                MfuConfig(n=8, mfus=3, vrf_depth=4096, max_length=256,
                          unary_ops=(UnaryOp.PASS,))):
        Fragment.get(MfuPipeline(cfg), None)


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
