"""Place and route of the host link alone on the ULX3S's ECP5 (LFE5U-85F).

One :class:`hw.link.link.NpuLink` (IMP, OMP, CRC units, receive buffer, program staging,
template ROM) for preset ``ulx3s_n4`` (N = 4, T = 1; the board's build until issue 36 made
it N = 16, kept so that the runs of the link's timing study compare),
with the truncation timer of a 100 MHz clock, measured with
:func:`bench.fpga.place_and_route` (flow defaults, ``docs/fpga-flow.md``); the core's
ports are the shim's registers. ``python -m bench link_fpga`` (``PNR_SEED`` picks the
seed); the build folder is ``build/fpga/link/`` (``nextpnr.log`` has the critical path).
``docs/link-hw.md`` section 5 has the figures.
"""

from bench.fpga import bench_build_dir, bench_seed, place_and_route, pnr_records

__all__ = ["CLK_HZ", "TARGET_MHZ", "run"]

#: Clock target (``--freq``): the core's PLL clock on the board (``make bitstream
#: CLK_MHZ=100``).
TARGET_MHZ = 100.0
#: The clock the truncation timer is sized for (``truncate_cycles_for``).
CLK_HZ = 100_000_000


def run():
    """Benchmark records: place and route of the host link alone (``ulx3s_n4``, N = 4, T = 1)."""
    from host.spec.config import preset
    from hw.board.board import truncate_cycles_for
    from hw.link.link import NpuLink

    config = preset("ulx3s_n4")
    seed = bench_seed()
    truncate = truncate_cycles_for(CLK_HZ)
    result = place_and_route(NpuLink(config, truncate_cycles=truncate), name="link",
                             build_dir=bench_build_dir("link", seed), seed=seed,
                             target_mhz=TARGET_MHZ)
    return pnr_records("link", result, {"design": "hw.link.link.NpuLink", "preset": "ulx3s_n4",
                                        "n": config.n, "tiles": config.tiles,
                                        "truncate_cycles": truncate})
