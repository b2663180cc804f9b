"""``sim.runner``'s reading of cocotb's results file (no simulator needed)."""

from sim.runner import _failed_tests, build_failure, design_text

RESULTS = """<?xml version='1.0' encoding='utf-8'?>
<testsuites name="cocotb tests"><testsuite name="sim.test_x" tests="3">
<testcase classname="sim.test_x" name="test_ok" time="1.0"><properties>
  <property name="random_seed" value="11" /></properties></testcase>
<testcase classname="sim.test_x" name="test_bad/stalls=False" time="2.0">
  <failure message="random program 42: output vector 3 lane 1: 0x3c00, model 0x3c01"
           type="AssertionError">Traceback ...</failure>
  <properties><property name="random_seed" value="1795303495" /></properties></testcase>
<testcase classname="sim.test_x" name="test_skipped" time="0.0"><skipped /></testcase>
</testsuite></testsuites>
"""


def test_failed_tests_names_seed_and_message(tmp_path):
    xml = tmp_path / "results.xml"
    xml.write_text(RESULTS)
    ran, failed = _failed_tests(xml)
    assert ran == 2
    assert failed == ["sim.test_x.test_bad/stalls=False [random_seed 1795303495] (random "
                      "program 42: output vector 3 lane 1: 0x3c00, model 0x3c01)"]


def test_failed_tests_long_message_is_cut(tmp_path):
    xml = tmp_path / "results.xml"
    xml.write_text(RESULTS.replace("random program 42", "x" * 2000))
    _, (entry,) = _failed_tests(xml)
    assert entry.endswith("x" * 600 + ")") and "x" * 601 not in entry


def test_design_text_ignores_source_locations():
    from amaranth.back import verilog

    from tests.sim.test_smoke_sim import SmokeAdder

    text = verilog.convert(SmokeAdder(8), name="smoke")
    assert '(* src = "' in text
    moved = text.replace("test_smoke_sim.py:", "test_smoke_sim.py:1")  # other line numbers
    assert moved != text and design_text(moved) == design_text(text)
    assert "src =" not in design_text(text) and "module smoke" in design_text(text)
    # A real change of the design still changes the text that keys the build.
    assert design_text(verilog.convert(SmokeAdder(9), name="smoke")) != design_text(text)


def test_conversion_is_cached_per_design(tmp_path, monkeypatch):
    """``run_cocotb`` converts a design once; a changed signature, source file or
    ``SIM_RECONVERT=1`` converts it again."""
    from amaranth.back import verilog

    import sim.runner
    from tests.sim.test_smoke_sim import SmokeAdder

    monkeypatch.setattr(sim.runner, "BUILD_ROOT", tmp_path)
    extra = tmp_path / "extra_source.py"
    extra.write_text("WIDTH = 8\n")
    sources = sim.runner._design_sources
    monkeypatch.setattr(sim.runner, "_design_sources", lambda c: [*sources(c), extra])
    calls = []
    real = verilog.convert

    def counting(*args, **kwargs):
        calls.append(kwargs["name"])
        return real(*args, **kwargs)

    monkeypatch.setattr(verilog, "convert", counting)
    first = sim.runner._convert(SmokeAdder(8), name="smoke_cache", platform=None)
    assert calls == ["smoke_cache"] and "module smoke_cache" in first
    assert sim.runner._convert(SmokeAdder(8), name="smoke_cache", platform=None) == first
    assert len(calls) == 1
    wider = sim.runner._convert(SmokeAdder(9), name="smoke_cache", platform=None)
    assert len(calls) == 2 and design_text(wider) != design_text(first)
    extra.write_text("WIDTH = 9\n")
    sim.runner._convert(SmokeAdder(9), name="smoke_cache", platform=None)
    assert len(calls) == 3
    monkeypatch.setenv("SIM_RECONVERT", "1")
    sim.runner._convert(SmokeAdder(9), name="smoke_cache", platform=None)
    assert len(calls) == 4


def test_build_failure_names_a_full_disk(tmp_path, monkeypatch):
    """A failed build names the free space of its disk when it is low, and only then."""
    import shutil

    import sim.runner

    usage = shutil.disk_usage(tmp_path)
    low = usage._replace(free=300 * 2**20)
    monkeypatch.setattr(sim.runner.shutil, "disk_usage", lambda path: low)
    text = build_failure("verilator", "npu_x", tmp_path, "Command failed with return code: 2")
    assert text.startswith("verilator build of npu_x failed: Command failed with return "
                           "code: 2 (only 300 MiB free on the disk of ")
    assert text.endswith("a full disk fails the build)")
    monkeypatch.setattr(sim.runner.shutil, "disk_usage",
                        lambda path: usage._replace(free=sim.runner.LOW_DISK_BYTES))
    assert build_failure("icarus", "npu_x", tmp_path, "boom") == \
        "icarus build of npu_x failed: boom"
