"""Shared pytest set-up for the whole suite.

* Puts the repository root on ``sys.path`` so ``host``, ``hw`` and ``sim`` import from
  this checkout (also without the editable install).
* ``--sim {verilator,icarus,all}`` (default ``all``) selects the HDL simulators.
  Any test that takes a ``simulator`` argument is parametrized over the selected
  simulators (ids ``verilator`` / ``icarus``) and marked ``sim``, so ``-m sim`` selects
  exactly the simulator tests and ``-m "not sim"`` the pure-Python ones; a test marked
  ``@pytest.mark.simulators("verilator")`` only over those of its names selected.
* Runs the ``sim`` tests first (see ``pytest_collection_modifyitems``).
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
    only = metafunc.definition.get_closest_marker("simulators")
    if only is not None:            # e.g. a test that carries one simulator build only
        selected = tuple(sim for sim in selected if sim in only.args)
    # The mark goes on each parameter set: marks added to metafunc.definition here
    # would not reach the generated items reliably.
    metafunc.parametrize(
        "simulator",
        [pytest.param(sim, id=sim, marks=pytest.mark.sim) for sim in selected],
    )


def pytest_collection_modifyitems(config, items):
    """Put the ``sim`` tests (seconds to minutes each) before the pure-Python ones
    (milliseconds to seconds), keeping the order within each group. With ``make test``'s
    ``--dist worksteal`` an idle worker takes half of the other's queue, so the short tests
    at the end even out the two workers' loads instead of one long simulation finishing
    alone. The order is deterministic, as pytest-xdist requires of every worker."""
    items.sort(key=lambda item: item.get_closest_marker("sim") is None)
