"""The host link in gateware (``hw.board.SimBoard``: link and core) under an HDL
simulator, reply for reply against ``host.server.ProtocolServer`` over the model.

The cocotb bench is ``sim/test_link.py``. One small build (N = 8, T = 1, the core
bench's ``n8t1`` memories); the fuzz sends ``FUZZ[simulator]`` frames (Icarus is about
ten times slower on this design, so it runs fewer; Verilator carries the 10,000).
"""

import dataclasses
import json
import os

import pytest

from host.config import NpuConfig
from hw.board import SimBoard
from sim.runner import run_cocotb

CONFIG = NpuConfig(n=8, tiles=1, mrf_depth=128, max_col_tiles=16, ivrf_depth=64,
                   vrf_depth=32, netq_depth=64, program_depth=512, max_length=4)
#: Truncation timeout of the bench build, in cycles: longer than any idle gap the bench
#: makes inside a frame, short enough that idle tests stay quick.
TRUNCATE = 1000
FUZZ = {"verilator": int(os.environ.get("LINK_FUZZ", "10000")), "icarus": 300}


def _env(simulator):
    fields = dataclasses.asdict(CONFIG)
    fields["unary_ops"] = [op.name.lower() for op in CONFIG.unary_ops]
    return {"LINK_CONFIG": json.dumps(fields), "LINK_TRUNCATE": str(TRUNCATE),
            "LINK_FUZZ": str(FUZZ[simulator])}


@pytest.mark.parametrize("test", ["test_opcodes", "test_opcodes_stalls", "test_errors",
                                  "test_fuzz"])
def test_link(simulator, test):
    run_cocotb(name="link_n8t1", component=SimBoard(CONFIG, truncate_cycles=TRUNCATE),
               test_module="sim.test_link", simulator=simulator, testcase=test,
               extra_env=_env(simulator))
