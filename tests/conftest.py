"""Shared pytest set-up for the whole suite.

* Puts the repository root on ``sys.path`` so ``host``, ``hw`` and ``sim`` import from
  this checkout (also without the editable install).
* ``--sim {verilator,icarus,all}`` (default ``all``) selects the HDL simulators.
  Any test that takes a ``simulator`` argument is parametrized over the selected
  simulators (ids ``verilator`` / ``icarus``) and marked ``sim``, so ``-m sim`` selects
  exactly the simulator tests and ``-m "not sim"`` the pure-Python ones.
"""

import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

# Kept in step with sim.runner.SIMULATORS; not imported from there so that collecting
# pure-Python tests never depends on the simulation stack.
SIMULATORS = ("verilator", "icarus")


def pytest_addoption(parser):
    parser.addoption(
        "--sim",
        choices=[*SIMULATORS, "all"],
        default="all",
        help="HDL simulator(s) for tests taking a `simulator` argument (default: all)",
    )


def pytest_generate_tests(metafunc):
    if "simulator" not in metafunc.fixturenames:
        return
    choice = metafunc.config.getoption("--sim")
    selected = SIMULATORS if choice == "all" else (choice,)
    # The mark goes on each parameter set: marks added to metafunc.definition here
    # would not reach the generated items reliably.
    metafunc.parametrize(
        "simulator",
        [pytest.param(sim, id=sim, marks=pytest.mark.sim) for sim in selected],
    )
