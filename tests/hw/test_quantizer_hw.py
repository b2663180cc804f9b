"""The vector quantizer under an HDL simulator, bit-exact against the reference model.

The cocotb bench is ``sim/test_quantizer.py``; its parameters travel as environment
variables. ``VQ_VECTORS`` (random vectors per mode and stall setting, default 30000)
sets the volume from the environment: lower for a quick run, higher for a soak.
"""

import os

import pytest

from hw.mvm.quantizer import VectorQuantizer
from sim.runner import run_cocotb

VECTORS = int(os.environ.get("VQ_VECTORS", "30000"))
#: Icarus runs the same bench about ten times slower per cycle; Verilator carries the
#: 30,000-vector volume per mode and configuration, Icarus a smaller random sample
#: (plus every directed case) so that `make test` stays within the CI budget.
ICARUS_VECTORS = int(os.environ.get("VQ_ICARUS_VECTORS", "5000"))


def _vectors(simulator):
    return VECTORS if simulator == "verilator" else min(VECTORS, ICARUS_VECTORS)


@pytest.mark.parametrize("n,m", [(8, 8), (16, 4), (32, 8)])
def test_vector_quantizer(simulator, n, m):
    run_cocotb(
        name=f"vector_quantizer_n{n}_m{m}",
        component=VectorQuantizer(n=n, mantissa_bits=m),
        test_module="sim.test_quantizer",
        simulator=simulator,
        extra_env={"VQ_N": str(n), "VQ_M": str(m), "VQ_COUNTER_BITS": "32",
                   "VQ_VECTORS": str(_vectors(simulator))},
    )


@pytest.mark.parametrize("n,m,counter_bits", [(5, 13, 4), (3, 2, 64)])
def test_vector_quantizer_edges(simulator, n, m, counter_bits):
    """Widths the main configurations miss: mantissas that are not byte aligned, the
    narrowest (2) and a wide one (13, fine enough to tell inf's 65504 from 65472), and
    4-bit counters that must saturate rather than wrap, and 64-bit ones. Fewer vectors:
    the configurations above carry the volume."""
    run_cocotb(
        name=f"vector_quantizer_n{n}_m{m}_c{counter_bits}",
        component=VectorQuantizer(n=n, mantissa_bits=m, counter_bits=counter_bits),
        test_module="sim.test_quantizer",
        simulator=simulator,
        extra_env={"VQ_N": str(n), "VQ_M": str(m), "VQ_COUNTER_BITS": str(counter_bits),
                   "VQ_VECTORS": str(min(VECTORS, 5000))},
    )


@pytest.mark.parametrize("n,m,counter_bits", [(16, 4, 32), (4, 6, 5)])
def test_vector_quantizer_two_sources(simulator, n, m, counter_bits):
    """``sources = 2`` (the MVM's shared quantizer): every vector from a random source,
    each block's ``o_source`` and each source's counters checked (5-bit counters that
    saturate at different times for the two sources, and 32-bit ones)."""
    run_cocotb(
        name=f"vector_quantizer_n{n}_m{m}_c{counter_bits}_s2",
        component=VectorQuantizer(n=n, mantissa_bits=m, counter_bits=counter_bits,
                                  sources=2),
        test_module="sim.test_quantizer",
        simulator=simulator,
        extra_env={"VQ_N": str(n), "VQ_M": str(m), "VQ_COUNTER_BITS": str(counter_bits),
                   "VQ_SOURCES": "2", "VQ_VECTORS": str(min(VECTORS, 5000))},
    )
