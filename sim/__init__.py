"""cocotb 2.x testbenches for the gateware in ``hw/`` and the one runner that builds them.

``sim.runner.run_cocotb`` converts an Amaranth component to Verilog, builds it with
Verilator (default) or Icarus Verilog and runs a cocotb test module (``sim.test_*``)
against it. The pytest suites in ``tests/`` call it; see ``docs/setup.md``.
"""
