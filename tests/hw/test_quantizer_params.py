"""VectorQuantizer construction: parameter validation and elaboration (no simulator)."""

import pytest
from amaranth.back import verilog

from host.spec.formats import Rounding, block_layout
from hw.mvm.quantizer import LATENCY, VectorQuantizer

# Components built here only to look at them are never elaborated, on purpose.
pytestmark = pytest.mark.filterwarnings("ignore::amaranth.hdl.UnusedElaboratable")


@pytest.mark.parametrize("kwargs, error, message", [
    ({"n": 0, "mantissa_bits": 8}, ValueError, "n must be from 1 to 64, not 0"),
    ({"n": 65, "mantissa_bits": 8}, ValueError, "n must be from 1 to 64, not 65"),
    ({"n": 8, "mantissa_bits": 1}, ValueError, "mantissa_bits must be from 2 to 16, not 1"),
    ({"n": 8, "mantissa_bits": 17}, ValueError, "mantissa_bits must be from 2 to 16, not 17"),
    ({"n": 8.0, "mantissa_bits": 8}, TypeError, "n must be an integer, not 8.0"),
    ({"n": 8, "mantissa_bits": "8"}, TypeError, "mantissa_bits must be an integer, not '8'"),
    ({"n": True, "mantissa_bits": 8}, TypeError, "n must be an integer, not True"),
    ({"n": 8, "mantissa_bits": 8, "counter_bits": 0}, ValueError,
     "counter_bits must be from 1 to 64, not 0"),
    ({"n": 8, "mantissa_bits": 8, "counter_bits": 65}, ValueError,
     "counter_bits must be from 1 to 64, not 65"),
    ({"n": 8, "mantissa_bits": 8, "sources": 0}, ValueError,
     "sources must be from 1 to 2, not 0"),
    ({"n": 8, "mantissa_bits": 8, "sources": 3}, ValueError,
     "sources must be from 1 to 2, not 3"),
])
def test_rejects_bad_parameters(kwargs, error, message):
    with pytest.raises(error, match=f"^{message}$"):
        VectorQuantizer(**kwargs)


def test_parameters_are_keyword_only():
    with pytest.raises(TypeError):
        VectorQuantizer(8, 8)


def test_properties_and_signature():
    q = VectorQuantizer(n=16, mantissa_bits=4, counter_bits=20)
    assert (q.n, q.mantissa_bits, q.counter_bits) == (16, 4, 20)
    with pytest.raises(AttributeError):
        q.n = 3
    assert q.o_stream.payload.shape() == block_layout(16, 4)
    assert len(q.i_stream.payload.as_value()) == 16 * 16
    assert q.rounding.shape() == Rounding
    assert len(q.saturations) == len(q.nonfinite) == 20
    assert LATENCY >= 1
    assert q.sources == 1 and not hasattr(q, "source") and not hasattr(q, "o_source")


def test_two_sources_signature():
    q = VectorQuantizer(n=8, mantissa_bits=4, counter_bits=12, sources=2)
    assert q.sources == 2
    assert len(q.source) == len(q.o_source) == 1
    assert len(q.saturations.as_value()) == len(q.nonfinite.as_value()) == 2 * 12
    assert len(q.saturations[1]) == 12


@pytest.mark.parametrize("n, m", [(1, 2), (8, 8), (16, 4), (32, 8), (64, 16), (5, 3)])
def test_converts_to_verilog(n, m):
    text = verilog.convert(VectorQuantizer(n=n, mantissa_bits=m), name="vq")
    for port in ("i_stream__payload", "i_stream__valid", "i_stream__ready",
                 "o_stream__payload", "o_stream__valid", "o_stream__ready",
                 "rounding", "static_exponent", "saturations", "nonfinite", "clear"):
        assert port in text
