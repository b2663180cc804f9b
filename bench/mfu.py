"""Place and route of one multifunction unit on the ULX3S's ECP5 (LFE5U-85F).

One :class:`hw.mfu.mfu.Mfu` (four units, crossbar, AddSubVrf and MulVrf, counters) at
N = 16 with every unary function (:data:`CONFIG`), measured with
:func:`bench.fpga.place_and_route` (flow defaults, ``docs/fpga-flow.md``).
``python -m bench mfu``; the build folder is ``build/fpga/mfu/`` (``nextpnr.log`` has
the critical path). ``docs/mfu.md`` section 10 has the figures.
"""

from host.spec.mfu import MfuConfig

from bench.fpga import bench_build_dir, bench_seed, place_and_route, pnr_records

__all__ = ["CONFIG", "TARGET_MHZ", "run"]

#: The measured build. ``vrf_depth = 512``: a VRF word is one native vector,
#: 16 x 16 = 256 bits, and 512 of them fill eight DP16KD in their widest (512 x 36)
#: mode, so each VRF costs 8 block RAMs (two per MFU: 16) and holds logical vectors of
#: up to 512 x 16 elements in any mix. ``max_length = 8``: logical vectors of up to 128
#: elements per chain (the reduction tree's depth follows it).
CONFIG = MfuConfig(n=16, mfus=2, vrf_depth=512, max_length=8, counter_bits=32)

#: Clock target of the issue (``--freq``; it only draws nextpnr's pass/fail line).
TARGET_MHZ = 100.0


def run():
    """Benchmark records: place and route of one MFU (N = 16, all unary ops, VRFs 512 deep)."""
    from hw.mfu.mfu import Mfu

    c = CONFIG
    seed = bench_seed()
    # About 37k LUT4: placement and routing take most of an hour on a busy machine.
    result = place_and_route(Mfu(c), name="mfu", build_dir=bench_build_dir("mfu", seed),
                             seed=seed, target_mhz=TARGET_MHZ, timeout=3 * 3600.0,
                             # the units' per-lane register copies (docs/mfu.md, 10)
                             keep_flops=True)
    config = {"design": "hw.mfu.mfu.Mfu", "n": c.n, "vrf_depth": c.vrf_depth,
              "max_length": c.max_length, "unary_ops": [op.name.lower() for op in c.unary_ops],
              "counter_bits": c.counter_bits}
    return pnr_records("mfu", result, config)
