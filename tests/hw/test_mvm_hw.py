"""The matrix-vector multiplier under an HDL simulator, bit-exact against the model.

The cocotb bench is ``sim/test_mvm.py``; the build parameters travel as environment
variables. Builds are small (N = 8, 32 slots, 8 column tiles) so that both simulators run
the whole suite in minutes; ``MVM_PRODUCTS`` (random products per stall setting, default
20 under Verilator, 6 under Icarus) can be raised from the environment for a soak. Icarus
times six of ``test_cycles``'s shapes (``CYCLE_SHAPES``).

``test_tile_count_independence`` runs the same fixed products on the 1-, 2- and 4-engine
builds and requires identical output bits and counters.
"""

import json
import os

import pytest

from host.spec.config import MvmConfig
from hw.mvm.mvm import Mvm
from sim.runner import BUILD_ROOT, run_cocotb
from sim.test_mvm import config_env

#: Random products per stall setting, and matrices of the tile-independence run, per
#: simulator: Icarus runs this design about 10x slower, so Verilator carries the volume.
PRODUCTS = {"verilator": "20", "icarus": "6"}
MATRICES = {"verilator": "6", "icarus": "2"}
#: ``test_cycles``'s shapes per simulator (``sim/test_mvm.py``'s ``MVM_CYCLE_SHAPES``; 0
#: all of them). The cycle counts are the design's, the same under both simulators;
#: Icarus times the first five (one row tile, the widest, several row and column tiles)
#: and the full MRF, Verilator all of them.
CYCLE_SHAPES = {"verilator": "0", "icarus": "5"}

#: name -> build. The first three differ only in the number of tile engines. "odd" has
#: a non-power-of-two T and depth, other mantissa widths, 10-bit counters that
#: saturate, and no narrow-accumulator check (``narrow_check=False``: the option is a
#: parameter of this existing build rather than a build of its own, to hold the test
#: time; the check's logic at these widths and T = 3 is covered by the units' tests,
#: ``test_dot_product_engine.py`` and ``test_mvm_accumulator.py``).
BUILDS = {
    "t1": MvmConfig(n=8, tiles=1, mrf_depth=32, max_col_tiles=8),
    "t2": MvmConfig(n=8, tiles=2, mrf_depth=32, max_col_tiles=8),
    "t4": MvmConfig(n=8, tiles=4, mrf_depth=32, max_col_tiles=8),
    "odd": MvmConfig(n=4, tiles=3, mantissa_bits_v=6, mantissa_bits_w=3, mrf_depth=20,
                     max_col_tiles=7, counter_bits=10, narrow_check=False),
}



def _build_name(key):
    c = BUILDS[key]
    return (f"mvm_n{c.n}_t{c.tiles}_v{c.mantissa_bits_v}_w{c.mantissa_bits_w}"
            f"_d{c.mrf_depth}_c{c.max_col_tiles}_b{c.counter_bits}"
            + ("" if c.narrow_check else "_nocheck"))


def _env(config, simulator, **extra):
    return {
        **config_env(config),
        "MVM_PRODUCTS": os.environ.get("MVM_PRODUCTS", PRODUCTS[simulator]),
        "MVM_MATRICES": MATRICES[simulator],
        "MVM_CYCLE_SHAPES": CYCLE_SHAPES[simulator],
        **extra,
    }


@pytest.mark.parametrize("build", list(BUILDS))
def test_mvm(simulator, build):
    config = BUILDS[build]
    run_cocotb(
        name=_build_name(build),
        component=Mvm(config),
        test_module="sim.test_mvm",
        simulator=simulator,
        # Every cocotb test; test_tile_independence skips itself without MVM_RESULTS.
        extra_env=_env(config, simulator),
    )


def test_tile_count_independence(simulator):
    """The same products on T = 1, 2 and 4 give the same output bits and counters."""
    results = {}
    out_dir = BUILD_ROOT / "mvm_tile_independence" / simulator
    out_dir.mkdir(parents=True, exist_ok=True)
    for build in ("t1", "t2", "t4"):
        config = BUILDS[build]
        path = out_dir / f"{build}.json"
        path.unlink(missing_ok=True)
        run_cocotb(
            name=_build_name(build),
            component=Mvm(config),
            test_module="sim.test_mvm",
            simulator=simulator,
            extra_env=_env(config, simulator, MVM_RESULTS=str(path)),
            testcase="test_tile_independence",
        )
        results[build] = json.loads(path.read_text())
    reference = results["t1"]
    assert reference["products"] > 0 and reference["outputs"]
    for build in ("t2", "t4"):
        got = results[build]
        assert got["outputs"] == reference["outputs"], f"{build}: outputs differ from T=1"
        assert got["counters"] == reference["counters"], (
            f"{build}: counters {got['counters']} differ from T=1 {reference['counters']}")
