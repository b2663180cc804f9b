"""Place and route of the matrix-vector multiplier on the ULX3S's ECP5 (LFE5U-85F).

The issue-3 build: ``hw.mvm.mvm.Mvm`` at N = 16, T = 2, m_v = m_w = 4 (:data:`CONFIG`),
measured with :func:`bench.fpga.place_and_route` (flow defaults, ``docs/fpga-flow.md``).
``python -m bench mvm`` (``make bench ARGS=mvm``, ``PNR_SEED=k`` for another seed); the
build folder is ``build/fpga/mvm/`` (``nextpnr.log`` has the critical path).
``docs/mvm.md`` section 11 has the figures.
"""

from host.spec.config import MvmConfig

from bench.fpga import bench_build_dir, bench_seed, place_and_route, pnr_records

__all__ = ["CONFIG", "DSP_LANES", "TARGET_MHZ", "run"]

#: The measured build. ``mrf_depth = 512``: an MRF word (one tile row) is
#: ``8 + 16*4 = 72`` bits, and 512 x 72 bits fill exactly two DP16KD in their widest
#: (512 x 36) mode, so each of the ``T*N = 32`` row memories costs two block RAMs and the
#: MRF 64 of the device's 208 (31 %): 1024 tiles of 16 x 16, 262,144 weights, leaving
#: block RAM for the vector register files, queues and tables of the rest of the NPU.
#: Doubling the depth would take 128 (62 %). ``max_col_tiles = 64`` (logical vectors of
#: up to 1024 elements) and 32-bit counters are the ``MvmConfig`` defaults.
CONFIG = MvmConfig(n=16, tiles=2, mantissa_bits_v=4, mantissa_bits_w=4, mrf_depth=512,
                   max_col_tiles=64, counter_bits=32)

#: Products of each dot-product engine on MULT18X18D blocks (``Mvm(dsp_lanes=)``,
#: ``docs/dsp.md``): ``T*N*2 = 64`` of the LFE5U-85F's 156 (the command check's ``R*G``
#: takes one more). 4 lanes (128 DSPs) take about 2,000 more LUT4 sites off the fabric,
#: but every lane's operands and product then cross to the DSP rows: router1 routed the
#: 2-lane build in 37 minutes and had not finished the 4-lane one in an hour
#: (docs/mvm.md section 11).
DSP_LANES = 2

#: Clock target of the issue (``--freq``; it only draws nextpnr's pass/fail line).
TARGET_MHZ = 100.0

#: Time limit of each tool, seconds. At 94 % of the LUT4 sites nextpnr's placer alone ran
#: past the flow's default hour on the shared two-core machine (docs/mvm.md section 11).
TOOL_TIMEOUT_S = 4 * 3600.0


def run():
    """Benchmark records: place and route of the MVM (N = 16, T = 2, m = 4/4), MACs/cycle, GOP/s."""
    from hw.mvm.mvm import Mvm

    c = CONFIG
    seed = bench_seed()
    # keep_flops: the register copies the design keeps apart on purpose (each DPE's
    # vector block and fit thermometer, the accumulator's per-row control bits) stay
    # apart in synthesis.
    # global_reset: the reset of 32,000 flip-flops goes on a global line, not on the
    # general routing that the T = 2 build needs all of (docs/mvm.md section 11).
    result = place_and_route(Mvm(c, dsp_lanes=DSP_LANES), name="mvm",
                             build_dir=bench_build_dir("mvm", seed), seed=seed,
                             target_mhz=TARGET_MHZ, timeout=TOOL_TIMEOUT_S,
                             keep_flops=True, global_reset=True)
    config = {"design": "hw.mvm.mvm.Mvm", "n": c.n, "tiles": c.tiles, "keep_flops": True,
              "global_reset": True,
              "mantissa_bits_v": c.mantissa_bits_v, "mantissa_bits_w": c.mantissa_bits_w,
              "mrf_depth": c.mrf_depth, "max_col_tiles": c.max_col_tiles,
              "counter_bits": c.counter_bits, "dsp_lanes": DSP_LANES}
    records = pnr_records("mvm", result, config)
    # Steady state: every tile engine finishes one N x N tile product per cycle.
    macs = c.tiles * c.n * c.n
    fmax = result["fmax_mhz"]
    records += [
        {"name": "mvm MACs per cycle", "value": macs, "unit": "MAC/cycle", "config": config},
        {"name": "mvm GOP/s", "value": round(2 * macs * fmax / 1000, 1), "unit": "GOP/s",
         "config": {**config, "fmax_mhz": round(fmax, 1), "ops_per_mac": 2}},
    ]
    return records
