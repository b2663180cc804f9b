"""nextpnr-ecp5's JSON report (``--report FILE``), read once for every consumer: the
board build's summary (:mod:`hw.board.flow`, ``make bitstream``), the board benchmark
(``bench/board.py``) and the place-and-route benchmarks (``bench.fpga``).

The report (nextpnr 0.11, ``report.json``) is a JSON object with

* ``"utilization"``: per bel type (``"TRELLIS_COMB"``, ``"TRELLIS_FF"``,
  ``"MULT18X18D"``, ``"DP16KD"``, ...) ``{"used": int, "available": int}``;
* ``"fmax"``: per clock net (``"$glbnet$clk$TRELLIS_IO_IN"`` once promoted to a global
  line) ``{"achieved": MHz, "constraint": MHz}``;
* ``"critical_paths"`` (and with ``--detailed-timing-report`` ``"detailed_net_timings"``),
  which nothing here reads.
"""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["RESOURCES", "ReportError", "clock_name", "parse_report", "resource_use",
           "summary_lines"]

#: The resources the summaries and records report: key -> (bel type, what it is).
#: ``TRELLIS_COMB`` is a LUT4 site (logic, carry half or LUT-RAM half: nextpnr counts
#: the sites a design occupies).
RESOURCES = {
    "lut4": ("TRELLIS_COMB", "LUT4 sites"),
    "ff": ("TRELLIS_FF", "flip-flops"),
    "dsp": ("MULT18X18D", "DSP multipliers"),
    "bram": ("DP16KD", "block RAMs"),
}


class ReportError(ValueError):
    """The file is not a nextpnr report this module can read (the message names it)."""


def parse_report(path) -> dict:
    """Read nextpnr's report at ``path``.

    Returns
    -------
    dict
        ``{"utilization": {bel: (used, available)}, "fmax": {clock: (achieved_mhz,
        constraint_mhz or None)}}``.

    Raises
    ------
    OSError
        the file cannot be read.
    ReportError
        it is not JSON, or lacks ``"utilization"`` or an entry's ``used``/``available``
        or a clock's ``achieved`` (naming the file and the key).
    """
    path = Path(path)
    try:
        rep = json.loads(path.read_text())
    except ValueError as exc:
        raise ReportError(f"{path} is not JSON: {exc}") from None
    if not isinstance(rep, dict) or not isinstance(rep.get("utilization"), dict):
        raise ReportError(f"{path} has no \"utilization\" object: not a nextpnr report")
    try:
        util = {bel: (int(v["used"]), int(v["available"]))
                for bel, v in rep["utilization"].items()}
        fmax = {clock: (float(v["achieved"]),
                        None if v.get("constraint") is None else float(v["constraint"]))
                for clock, v in rep.get("fmax", {}).items()}
    except (KeyError, TypeError, ValueError) as exc:
        raise ReportError(f"{path}: malformed entry ({type(exc).__name__}: {exc})") from None
    return {"utilization": util, "fmax": fmax}


def resource_use(report: dict) -> dict:
    """``{key: (used, available)}`` of :data:`RESOURCES` in a :func:`parse_report`
    result (``(0, 0)`` for a bel type the report does not list)."""
    util = report["utilization"]
    return {key: util.get(bel, (0, 0)) for key, (bel, _) in RESOURCES.items()}


def clock_name(net: str) -> str:
    """A clock net as nextpnr names it, without its decorations: ``$glbnet$clk$TRELLIS_IO_IN``
    -> ``clk``."""
    name = net.removeprefix("$glbnet$")
    return name.split("$", 1)[0] or net


def _percent(used, available):
    return f"{100 * used / available:.1f} %" if available else "-"


def summary_lines(report: dict) -> list[str]:
    """Plain-text lines for a person: the use of :data:`RESOURCES` of the device (count,
    bel type, percentage) and each clock's Fmax against its constraint."""
    lines = []
    use = resource_use(report)
    width = max(len(what) for _, what in RESOURCES.values())
    for key, (bel, what) in RESOURCES.items():
        used, available = use[key]
        lines.append(f"{what:<{width}}  {used:>7,} of {available:>7,} "
                     f"({_percent(used, available)}, {bel})")
    for net, (achieved, constraint) in sorted(report["fmax"].items()):
        verdict = ""
        if constraint:
            verdict = (f", constraint {constraint:.2f} MHz, "
                       + ("met" if achieved >= constraint else "FAILED"))
        lines.append(f"{'Fmax ' + clock_name(net):<{width}}  {achieved:.2f} MHz{verdict}")
    if not report["fmax"]:
        lines.append("Fmax: the report has none (no constrained clock)")
    return lines
