"""A build without the narrow-accumulator check (``narrow_check=False``, issue 36 item 3)
on the reference model, the NumPy export and a device over the protocol: the same
outputs, memories and other counters as the build with the check, ``narrow_events`` 0,
and INFO saying so.

The random programs (``sim.randprog``) write the NARROW register with random widths
from 1 to 64, so the build with the check counts narrow events on them; the register
is taken by both builds (the rule: "the register exists, the check does not, the
counter stays 0").
"""

from __future__ import annotations

import dataclasses
import importlib.util
import sys

import numpy as np
import pytest

from host.compiler.export import export_image
from host.compiler.image import program_image
from host.model.core import NpuModel
from host.runtime.device import Device
from host.runtime.transport import ModelTransport
from host.spec.isa import Space
from sim.randprog import RANDOM_BUILDS, random_program

SEEDS = range(4)


def _spaces(cfg):
    return [Space.IVRF] + [s for m in range(cfg.mfus) for s in (Space.asvrf(m),
                                                               Space.mulvrf(m))]


def _run(cfg, prog):
    model = NpuModel(cfg)
    result, out = prog.run(model)
    assert result.ok, result
    memories = {s: model.read(s, 0, cfg.ivrf_depth if s is Space.IVRF else cfg.vrf_depth)
                for s in _spaces(cfg)}
    return out, memories, model.counters()


@pytest.mark.parametrize("name", list(RANDOM_BUILDS))
def test_model_without_the_check(name):
    cfg = RANDOM_BUILDS[name]
    off = dataclasses.replace(cfg, narrow_check=False)
    assert cfg.narrow_check and not off.narrow_check
    counted = 0
    for seed in SEEDS:
        prog = random_program(cfg, seed, chains=20)
        out_on, mem_on, cnt_on = _run(cfg, prog)
        out_off, mem_off, cnt_off = _run(off, prog)
        assert np.array_equal(out_on, out_off), f"seed {seed}: outputs differ"
        for space in mem_on:
            assert np.array_equal(mem_on[space], mem_off[space]), f"seed {seed}: {space}"
        assert cnt_off["narrow_events"] == 0, f"seed {seed}"
        counted += cnt_on.pop("narrow_events")
        cnt_off.pop("narrow_events")
        assert cnt_on == cnt_off, f"seed {seed}: other counters differ"
    # The programs make narrow events with the check: its absence is what left them 0.
    assert counted > 0


def test_export_without_the_check(tmp_path):
    """The exported module of a build without the check counts no narrow events (the
    model's kernel call it traces has no width) and gives the model's outputs."""
    cfg = RANDOM_BUILDS["n8t2m3"]
    off = dataclasses.replace(cfg, narrow_check=False)
    prog = random_program(cfg, 1, chains=8)
    k = program_image(prog).inputs or 0
    x = np.random.default_rng(3).integers(0, 0x3C00, (2, k, cfg.n), dtype=np.uint16)
    counts = {}
    for label, build in (("on", cfg), ("off", off)):
        image = program_image(prog)
        image.config = build.to_dict()
        py, _ = export_image(image, tmp_path / f"layer_{label}.py", config=build)
        spec = importlib.util.spec_from_file_location(f"layer_{label}", py)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module          # its dataclasses look themselves up
        try:
            spec.loader.exec_module(module)
        finally:
            del sys.modules[spec.name]
        outputs, counters = module.run(x)
        model_out = []
        for j in range(2):
            model = NpuModel(build)
            for space, addr, data in image.memories:
                model.write(space, addr, data)
            for space, addr, data in image.job_memories:
                model.write(space, addr, data)
            model.load_program(image.program)
            if k:
                model.push_input(x[j])
            assert model.run().ok
            model_out.append(model.pop_output(image.outputs))
        assert np.array_equal(outputs, np.array(model_out)), label
        counts[label] = counters
    assert counts["off"]["narrow_events"] == 0 < counts["on"]["narrow_events"]
    assert {k: v for k, v in counts["on"].items() if k != "narrow_events"} == \
        {k: v for k, v in counts["off"].items() if k != "narrow_events"}


def test_info_over_the_protocol_says_the_check_is_absent():
    """INFO carries ``narrow_check`` 0 for such a build, 1 otherwise; the host rebuilds
    the configuration from it (the refusal of range scaling reads this entry)."""
    cfg = RANDOM_BUILDS["n4t3m2"]
    off = dataclasses.replace(cfg, narrow_check=False)
    for build, flag in ((cfg, 1), (off, 0)):
        dev = Device(ModelTransport(config=build))
        assert dev.info()["narrow_check"] == flag
        assert dev.config == build
        assert "narrow_events" in dev.counters()
    assert NpuModel(off).info()["narrow_check"] is False
