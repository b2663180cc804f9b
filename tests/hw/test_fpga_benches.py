"""The place-and-route benchmarks of the core and the link are found by ``python -m bench``
and measure what their docstrings say, without running the tools (``place_and_route`` is
replaced by a stub that records its call)."""

import pytest

import bench
from bench import core_fpga
from bench.fpga import BUILD_ROOT

#: What the stub returns: the keys ``pnr_records`` reads.
_RESULT = {"fmax_mhz": 101.23, "lut4": 1000, "carry": 10, "comb": 1020, "shim_lut4": 5,
           "ff": 2000, "shim_ff": 7, "dsp": 3, "bram": 4, "target_mhz": 100.0,
           "seconds": 1.5, "options": {"router": "router1"}}


def _stub(calls):
    def place_and_route(component, **kwargs):
        # The real flow elaborates it; the stub does not, so it silences Amaranth's
        # unused-elaboratable warning, which a later test of the board build would see.
        component._MustUse__silence = True
        calls.append((component, kwargs))
        return dict(_RESULT)
    return place_and_route


def test_registered():
    names = bench.available()
    assert names["core_fpga"].startswith("Benchmark records: place and route of the NPU core")
    assert names["link_fpga"].startswith("Benchmark records: place and route of the host link")
    assert bench.load("core_fpga") is core_fpga.run


@pytest.mark.parametrize("seed, folder", [(None, "core"), ("3", "core_seed3")])
def test_core_fpga_places_the_ulx3s_core(monkeypatch, seed, folder):
    from host.spec.config import preset
    from hw.core.npu import NpuCore

    calls = []
    monkeypatch.setattr(core_fpga, "place_and_route", _stub(calls))
    if seed is None:
        monkeypatch.delenv("PNR_SEED", raising=False)
    else:
        monkeypatch.setenv("PNR_SEED", seed)
    records = core_fpga.run()
    (component, kwargs), = calls
    assert isinstance(component, NpuCore) and component.config == preset("ulx3s_n4")
    assert kwargs == {"name": "core", "build_dir": BUILD_ROOT / folder,
                      "seed": 1 if seed is None else int(seed), "target_mhz": 100.0,
                      "timeout": core_fpga.TOOL_TIMEOUT_S, "keep_flops": True}
    by_name = {r["name"]: r for r in records}
    assert list(by_name) == ["core fmax", "core LUT4", "core flip-flops", "core DSP",
                             "core block RAM"]
    assert by_name["core fmax"]["value"] == 101.2
    assert by_name["core LUT4"]["value"] == 1000
    assert by_name["core block RAM"]["value"] == 4
    config = by_name["core fmax"]["config"]
    assert (config["design"], config["preset"], config["n"], config["tiles"]) == \
        ("hw.core.npu.NpuCore", "ulx3s_n4", 4, 1)
    assert config["target_mhz"] == 100.0 and config["keep_flops"] is True
