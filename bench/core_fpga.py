"""Place and route of the NPU core alone on the ULX3S's ECP5 (LFE5U-85F).

One :class:`hw.core.npu.NpuCore` (MVM, MFU pipeline, decoder, IVRF, network queues,
program memory) for preset ``ulx3s_n4`` (N = 4, T = 1; the board's build until issue 36
made it N = 16, kept so that the runs of the core's timing study compare), measured with
:func:`bench.fpga.place_and_route` (flow defaults, ``docs/fpga-flow.md``, with
``keep_flops`` as for the MVM and the MFU alone: the register copies those units keep
apart on purpose stay apart); the link's ports are the shim's registers.
``python -m bench core_fpga`` (``PNR_SEED`` picks the seed); the build folder is
``build/fpga/core/`` (``nextpnr.log`` has the critical path). ``docs/npu.md`` ("Timing")
has the figures, ``docs/notes/2026-11-28-core-timing-closure.md`` every run.
"""

from bench.fpga import bench_build_dir, bench_seed, place_and_route, pnr_records

__all__ = ["TARGET_MHZ", "TOOL_TIMEOUT_S", "run"]

#: Clock target (``--freq``): the core's PLL clock on the board (``make bitstream
#: CLK_MHZ=100``).
TARGET_MHZ = 100.0

#: Time limit of each tool, seconds (the core is several times the link; on the shared
#: two-core machine placement and routing take 10 to 25 minutes).
TOOL_TIMEOUT_S = 2 * 3600.0


def run():
    """Benchmark records: place and route of the NPU core alone (``ulx3s_n4``, N = 4, T = 1)."""
    from host.spec.config import preset
    from hw.core.npu import NpuCore

    config = preset("ulx3s_n4")
    seed = bench_seed()
    result = place_and_route(NpuCore(config), name="core",
                             build_dir=bench_build_dir("core", seed), seed=seed,
                             target_mhz=TARGET_MHZ, timeout=TOOL_TIMEOUT_S,
                             keep_flops=True)
    return pnr_records("core", result, {"design": "hw.core.npu.NpuCore", "preset": "ulx3s_n4",
                                        "n": config.n, "tiles": config.tiles,
                                        "keep_flops": True})
