"""``sim.runner``'s reading of cocotb's results file (no simulator needed)."""

from sim.runner import _failed_tests

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
