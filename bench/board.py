"""The board build's figures, measured from nextpnr's report of ``make bitstream``.

``python -m bench board`` (``make bench ARGS=board``) reads ``build/ulx3s/report.json``,
which the board build (``python -m hw.board``, :func:`hw.board.board.main`) has nextpnr
write, and ``build/ulx3s/build.json``, where the build records its configuration and
stage times. With no report there it runs the build first (about 80 minutes; its stages
print as they go), unless long builds are off (``python -m bench --no-build``, or
``BENCH_NO_BUILD=1``): then it skips itself with the reason, and the records of an
earlier run stay in ``bench/results.json``. An existing build is used as it is, whatever
configuration it was made with; its records carry that configuration and the report's
date, so a stale build shows as one (``make bitstream`` rebuilds it).

Records: "board fmax" per clock (MHz), "board LUT4" (TRELLIS_COMB sites), "board
flip-flops" (TRELLIS_FF), "board DSP" (MULT18X18D), "board block RAM" (DP16KD), each with
the device's count and the percentage used, and from the build's configuration "board
MACs per cycle" and "board GOP/s" (``2 * MACs/cycle * f``, f the clock the build runs at,
``build.json``'s ``clk_hz``, or the slowest clock's Fmax if that is lower or the build
records no clock).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from bench import Skipped, no_build
from hw.board.board import REPORT
from hw.board.report import RESOURCES, clock_name, parse_report

__all__ = ["BUILD_DIR", "board_records", "run"]

#: Where ``make bitstream`` builds (``python -m hw.board``'s default ``--build-dir``).
BUILD_DIR = Path(__file__).resolve().parent.parent / "build" / "ulx3s"

#: Record names and units of :data:`hw.board.report.RESOURCES`.
_RECORDS = {"lut4": ("board LUT4", "LUT4"), "ff": ("board flip-flops", "FF"),
            "dsp": ("board DSP", "MULT18X18D"), "bram": ("board block RAM", "DP16KD")}


def board_records(build_dir=BUILD_DIR) -> list[dict]:
    """The records of the board build in ``build_dir`` (see the module docstring).

    Raises
    ------
    FileNotFoundError
        ``build_dir`` has no nextpnr report.
    hw.board.report.ReportError
        the report cannot be read.
    """
    build_dir = Path(build_dir)
    path = build_dir / REPORT
    report = parse_report(path)
    try:
        info = json.loads((build_dir / "build.json").read_text())
    except (OSError, ValueError):
        info = {}                     # a build made before build.json existed
    base = {"design": "hw.board.board.ULX3STop", "device": "LFE5U-85F",
            "report": str(path),
            "report_date": time.strftime("%Y-%m-%d %H:%M",
                                         time.localtime(path.stat().st_mtime))}
    config = info.get("config") or {}
    for key in ("n", "tiles", "lanes", "mantissa_bits_v", "mantissa_bits_w", "narrow_check",
                "unit_sets"):
        if key in config:
            base[key] = config[key]
    if "total_seconds" in info:
        base["build_seconds"] = info["total_seconds"]
    # make bitstream ARGS="--seed K --router R --placer-density D": nextpnr's options
    # other than its defaults.
    for key, record in (("seed", "nextpnr_seed"), ("router", "nextpnr_router"),
                        ("placer_density", "nextpnr_placer_density")):
        if info.get(key) is not None:
            base[record] = info[key]
    records = []
    for net, (achieved, constraint) in sorted(report["fmax"].items()):
        records.append({"name": "board fmax", "value": round(achieved, 2), "unit": "MHz",
                        "config": {**base, "clock": clock_name(net),
                                   "constraint_mhz": constraint}})
    util = report["utilization"]
    for key, (bel, _) in RESOURCES.items():
        used, available = util.get(bel, (0, 0))
        name, unit = _RECORDS[key]
        records.append({"name": name, "value": used, "unit": unit,
                        "config": {**base, "bel": bel, "available": available,
                                   "percent": round(100 * used / available, 1)
                                   if available else None}})
    macs = info.get("macs_per_cycle")
    if macs:
        records.append({"name": "board MACs per cycle", "value": macs, "unit": "MAC/cycle",
                        "config": base})
        if report["fmax"]:
            # At the clock the bitstream runs (build.json's clk_hz) when it meets it: the
            # figure a user gets; at Fmax for a build that records no clock.
            fmax = min(achieved for achieved, _ in report["fmax"].values())
            clk = info.get("clk_hz")
            mhz = fmax if clk is None else min(fmax, clk / 1e6)
            extra = {} if clk is None else {"clk_mhz": clk / 1e6, "timing_met": fmax >= clk / 1e6}
            records.append({"name": "board GOP/s", "value": round(2 * macs * mhz / 1000, 2),
                            "unit": "GOP/s",
                            "config": {**base, "fmax_mhz": round(fmax, 2), **extra,
                                       "ops_per_mac": 2}})
    return records


def run():
    """Board build (make bitstream): Fmax, LUT4, FF, DSP, block RAM from nextpnr's report."""
    if not (BUILD_DIR / REPORT).is_file():
        if no_build():
            raise Skipped(f"no board build in {BUILD_DIR} (no {REPORT}) and long builds are "
                          f"off (--no-build); `make bitstream` makes one in about 80 minutes")
        print(f"bench board: no {REPORT} in {BUILD_DIR}: running the board build "
              f"(make bitstream, about 80 minutes) ...", flush=True)
        from hw.board.board import main
        main(["--build-dir", str(BUILD_DIR)])
    return board_records(BUILD_DIR)
