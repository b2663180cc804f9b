"""Amaranth's ECP5 build run in stages, with progress: what ``make bitstream``
(``python -m hw.board``) runs.

``platform.build()`` writes a build plan and runs its shell script, which calls Yosys,
nextpnr and ecppack quietly: the board build was half an hour without a line of output.
:func:`run_stages` does the same work itself, a stage at a time:

1. **elaborate**: ``platform.prepare()`` (Amaranth elaborates the top and writes the RTLIL,
   the pin constraints and the plan), extracted into the build folder;
2. **synthesis**, 3. **place and route**, 4. **pack**: the plan's three commands
   (``build_<name>.json``, the same commands as its script), each tool taken from the
   environment variable Amaranth's script reads (``YOSYS``, ``NEXTPNR_ECP5``,
   ``ECPPACK``; the tool's own name if unset).

Each stage prints a line when it starts and one with its time when it ends; a long tool
prints a line every ``heartbeat`` seconds with its log's progress (:func:`log_progress`:
nextpnr's router as the arcs left to route, anything else as the log's last line). At
the end the
summary of nextpnr's report (``report.json``, which :func:`hw.board.board.build_overrides`
asks nextpnr for): LUT4 sites, flip-flops, DSPs and block RAMs used of the device, and
each clock's Fmax. ``build.json`` in the build folder records the stage times and what
the caller adds (the build's configuration), for ``bench/board.py``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from hw.board.report import ReportError, parse_report, summary_lines

__all__ = ["STAGES", "BuildError", "duration", "run_stages", "say", "tool_env_var"]

#: The stages, in order; the plan's tools map to the last three.
STAGES = ("elaborate", "synthesis", "place and route", "pack")
_TOOL_STAGES = {"yosys": "synthesis", "nextpnr-ecp5": "place and route", "ecppack": "pack"}
#: What each tool stage runs, for its first line.
_WHAT = {"synthesis": "synth_ecp5", "place and route": "nextpnr", "pack": "ecppack"}


class BuildError(RuntimeError):
    """A stage failed; the message names it, the tool's exit status and log."""


def tool_env_var(tool: str) -> str:
    """The environment variable Amaranth's build script takes a tool from:
    ``nextpnr-ecp5`` -> ``NEXTPNR_ECP5``."""
    return tool.upper().replace("-", "_")


def duration(seconds: float) -> str:
    """``12.3 s``, ``5 min 31 s`` or ``1 h 02 min``."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def _last_line(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 4096))
            lines = [line for line in f.read().decode(errors="replace").splitlines()
                     if line.strip()]
    except OSError:
        return ""
    return lines[-1].strip()[:160] if lines else ""


#: nextpnr's router: the arcs it routes, and a row of its progress table (iterations,
#: the arcs re-routed with and without rip-up, their deltas, the arcs left, the time).
_ROUTING = re.compile(r"Info: Routing (\d+) arcs\.")
_ROUTER_ROW = re.compile(r"^Info:\s+(\d+)\s*\|[^|]*\|[^|]*\|\s*(\d+)\s*\|[^|]*\|$")


def log_progress(path: Path) -> str:
    """What a tool's log says of its progress: for nextpnr's router, ``router: R of T
    arcs left (P %) after I iterations``, else the log's last line (up to 160
    characters; "" for a missing or empty log)."""
    last = _last_line(path)
    row = _ROUTER_ROW.match(last)
    if row is None:
        return last
    try:
        total = _ROUTING.findall(Path(path).read_text(errors="replace"))
    except OSError:
        return last
    iterations, left = int(row[1]), int(row[2])
    if not total:
        return f"router: {left:,} arcs left after {iterations:,} iterations"
    arcs = int(total[-1])
    return (f"router: {left:,} of {arcs:,} arcs left ({100 * left / max(arcs, 1):.0f} %) "
            f"after {iterations:,} iterations")


def _tool_log(argv, build_dir):
    """The log file a tool's command line names (``-l`` for Yosys, ``--log`` for
    nextpnr), or None."""
    for flag in ("-l", "--log"):
        if flag in argv[:-1]:
            return build_dir / argv[argv.index(flag) + 1]
    return None


def _executable(tool):
    """The program for ``tool``: its environment variable's value or its own name, found
    on ``PATH`` or beside the running interpreter (the venv's ``bin``, where the YoWASP
    tools' console scripts are); None if neither has it."""
    exe = os.environ.get(tool_env_var(tool)) or tool
    found = shutil.which(exe)
    if found is None and os.sep not in exe:
        found = shutil.which(exe, path=str(Path(sys.executable).parent))
    return found


def _run_tool(stage, argv, build_dir, out, heartbeat, started):
    exe = _executable(argv[0])
    if exe is None:
        raise BuildError(f"{stage}: no program for {argv[0]} (set "
                         f"{tool_env_var(argv[0])}, e.g. to yowasp-{argv[0]})")
    command = [exe, *argv[1:]]
    output = build_dir / f"{argv[0]}.out"
    log = _tool_log(argv, build_dir) or output
    with open(output, "w") as f:
        proc = subprocess.Popen(command, cwd=build_dir, stdout=f, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
        t0 = time.monotonic()
        next_beat = t0 + heartbeat
        try:
            while True:
                try:
                    status = proc.wait(
                        timeout=min(1.0, max(0.01, next_beat - time.monotonic())))
                    break
                except subprocess.TimeoutExpired:
                    now = time.monotonic()
                    if now >= next_beat:
                        out(f"      {stage}: {duration(now - t0)} so far (total "
                            f"{duration(now - started)}); {log.name}: {log_progress(log)}")
                        next_beat = now + heartbeat
        except BaseException:
            # Interrupted (Ctrl-C) or failing here: the tool must not run on for an hour.
            proc.kill()
            proc.wait()
            raise
    if status != 0:
        tail = _last_line(log) if log != output else ""
        raise BuildError(f"{stage} failed: {argv[0]} exited with status {status}; log "
                         f"{log}, output {output}" + (f"; last log line: {tail}" if tail
                                                      else ""))


def say(line: str) -> None:
    """Print a progress line at once (also when the output is a file or a pipe)."""
    print(line, flush=True)


def run_stages(platform, top, *, build_dir, name="npu", overrides=None, info=None,
               out=say, heartbeat=180.0, netlist_pass=None) -> dict:
    """Build ``top`` for ``platform`` (an Amaranth ``TemplatedPlatform`` of the ECP5
    family) in the stages of :data:`STAGES`, printing progress with ``out``.

    Parameters
    ----------
    platform : amaranth.build.TemplatedPlatform
    top : Elaboratable
    build_dir : str or Path
        Where the plan and every product go (created).
    name : str
        The design's name (file stem of ``<name>.bit``).
    overrides : dict or None
        Keyword overrides of the plan (``synth_opts``, ``nextpnr_opts``, ...).
    info : dict or None
        Added to ``build.json`` (for example the build's configuration).
    out : callable
        Takes each progress line (:func:`say` by default: printed and flushed).
    heartbeat : float
        Seconds between the progress lines of a running tool.
    netlist_pass : callable or None
        Run on synthesis's netlist (``<name>.json``, a ``Path``) before place and route;
        it changes the file in place and returns a count of what it changed, which the
        synthesis stage's last line reports (the board: :func:`hw.ecp5.reset_logic_off_global`).

    Returns
    -------
    dict
        ``build.json``'s contents: ``stages`` (seconds per stage), ``total_seconds``,
        ``report`` (the report's path, or None), ``bitstream``, plus ``info``.

    Raises
    ------
    BuildError
        a tool is missing or failed (naming the stage, the status and the log).
    """
    build_dir = Path(build_dir)
    # The tools first: a missing one should not cost the elaboration.
    for tool in platform.required_tools:
        stage = _TOOL_STAGES.get(tool)
        if stage is not None and _executable(tool) is None:
            raise BuildError(f"{stage}: no program for {tool} (set {tool_env_var(tool)}, "
                             f"e.g. to yowasp-{tool})")
    started = time.monotonic()
    times = {}

    def stage_line(i, stage, text):
        out(f"[{i}/{len(STAGES)}] {stage}{text}")

    stage_line(1, STAGES[0], ": Amaranth elaborates the design and writes the RTLIL, pin "
               "constraints and build plan ...")
    plan = platform.prepare(top, name, **(overrides or {}))
    plan.extract(build_dir)
    times[STAGES[0]] = time.monotonic() - started
    stage_line(1, STAGES[0], f" done in {duration(times[STAGES[0]])}")

    commands = json.loads((build_dir / f"build_{name}.json").read_text())["commands"]
    for argv in commands:
        stage = _TOOL_STAGES.get(argv[0], argv[0])
        i = STAGES.index(stage) + 1 if stage in STAGES else len(STAGES)
        log = _tool_log(argv, build_dir)
        stage_line(i, stage, f" ({_WHAT.get(stage, argv[0])}"
                   + (f", log {log}" if log else "") + ") ...")
        t0 = time.monotonic()
        _run_tool(stage, argv, build_dir, out, heartbeat, started)
        passed = ""
        if stage == "synthesis" and netlist_pass is not None:
            changed = netlist_pass(build_dir / f"{name}.json")
            passed = f", {getattr(netlist_pass, '__name__', 'netlist pass')}: {changed}"
        times[stage] = time.monotonic() - t0
        stage_line(i, stage, f" done in {duration(times[stage])} (total "
                   f"{duration(time.monotonic() - started)}{passed})")

    total = time.monotonic() - started
    bitstream = build_dir / f"{name}.bit"
    out(f"built {bitstream} in {duration(total)} ("
        + ", ".join(f"{s} {duration(t)}" for s, t in times.items()) + ")")
    report = build_dir / "report.json"
    if report.is_file():
        try:
            for line in summary_lines(parse_report(report)):
                out("  " + line)
        except ReportError as exc:
            out(f"  (no summary: {exc})")
    else:
        out(f"  (no summary: nextpnr wrote no {report.name}; give it --report)")
        report = None
    record = {"name": name, "stages": {s: round(t, 1) for s, t in times.items()},
              "total_seconds": round(total, 1),
              "report": None if report is None else str(report.resolve()),
              "bitstream": str(bitstream), "finished": time.strftime("%Y-%m-%d %H:%M:%S"),
              **(info or {})}
    (build_dir / "build.json").write_text(json.dumps(record, indent=2) + "\n")
    return record
