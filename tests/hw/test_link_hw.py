"""The host link in gateware (``hw.board.board.SimBoard``: link and core) under an HDL
simulator, reply for reply against ``host.runtime.server.ProtocolServer`` over the model.

The cocotb bench is ``sim/test_link.py``. One small build (``sim.board.SMALL_CONFIG``:
N = 8, T = 1, the core bench's ``n8t1`` memories), made by ``sim.board.run_board``: the
same component, name and configuration as the simulated-board transport of
``tests/runtime/test_device.py``, so the regression compiles the board once per simulator
(Verilator at ``-O1``, see ``sim.board.FAST_BUILD_FLAGS``).

What runs where (``RUN``): the Verilated model itself sets the speed (~1,300 cycles/s
at ``-O1`` on the loaded development machine, Icarus ~20 times fewer), so Verilator runs
``test_opcodes``, ``test_reset_mid_request``, ``test_errors`` and a short fuzz
(``FUZZ``), Icarus ``test_opcodes``,
each simulator's tests in one simulation. Icarus reads every memory once, before
``test_opcodes``' final RESET, not again after it (``LINK_DIGEST_AFTER_RESET``): the two
reads were most of its run, and Verilator reads the state after a RESET in both
``test_opcodes`` and ``test_reset_mid_request``. ``test_opcodes_stalls`` and the long fuzz
(``LINK_FUZZ=10000 LINK_SEED=7``) are run by hand; ``docs/link-hw.md`` section 7 has the
commands, run times and results.
"""

import os

import pytest

from sim.board import SIM_TRUNCATE_CYCLES, SMALL_CONFIG as CONFIG, run_board

#: Frames and seed of the regression's ``test_fuzz`` (``LINK_FUZZ`` and ``LINK_SEED``
#: override them): seed 2 reaches every status the bench asserts within 300 frames.
FUZZ, SEED = 300, 2
#: The bench's tests the regression runs, per simulator (see the module docstring;
#: ``test_opcodes_stalls`` by hand: ``test_errors`` and ``test_fuzz`` stall both streams).
RUN = {"verilator": ("test_opcodes", "test_reset_mid_request", "test_errors", "test_fuzz"),
       "icarus": ("test_opcodes",)}


def _env(simulator):
    return {"LINK_CONFIG": CONFIG.to_json(), "LINK_TRUNCATE": str(SIM_TRUNCATE_CYCLES),
            "LINK_FUZZ": os.environ.get("LINK_FUZZ", str(FUZZ)),
            "LINK_SEED": os.environ.get("LINK_SEED", str(SEED)),
            "LINK_DIGEST_AFTER_RESET": "1" if simulator == "verilator" else "0"}


@pytest.mark.sim
def test_link(simulator):
    """``RUN[simulator]`` in one simulation: one Verilog conversion and one start (each
    cocotb test begins with a RESET request, so they do not depend on their order)."""
    run_board(CONFIG, test_module="sim.test_link", simulator=simulator,
              testcase=",".join(RUN[simulator]), extra_env=_env(simulator))


def test_cached_board_build_warns_only_about_the_board():
    """``sim.runner`` converts a design once and reuses its text, marking the component
    used without elaborating it; the link that ``SimBoard`` builds (to check its
    parameters) must then not warn as unused, while a board nobody used still does."""
    import gc
    import warnings

    from amaranth.hdl import Fragment, Module, UnusedElaboratable

    from hw.board.board import SimBoard

    # Amaranth holds these warnings back until something has been elaborated.
    Fragment.get(Module(), None)

    def unused_warnings(mark_used):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            board = SimBoard(CONFIG, truncate_cycles=SIM_TRUNCATE_CYCLES)
            if mark_used:
                board._MustUse__used = True      # what sim.runner does for a cached build
            del board
            gc.collect()
        return [str(w.message) for w in caught if issubclass(w.category, UnusedElaboratable)]

    assert unused_warnings(mark_used=True) == []
    left = unused_warnings(mark_used=False)
    assert len(left) == 1 and "SimBoard" in left[0], left
