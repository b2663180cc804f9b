"""Place-and-route benchmarks on the ULX3S's ECP5 (LFE5U-85F, CABGA381, speed 6).

:func:`run` is the entry point the bench registry calls. :func:`option_study` repeats
the synthesis-option measurements of ``docs/fpga-flow.md``
(``python -m bench.fpga_smoke --study``). Build folders go under ``build/fpga/``.
"""

import argparse
import json
import math

from amaranth.hdl import Module, Signal, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from bench.fpga import BUILD_ROOT, place_and_route, pnr_records

__all__ = ["MacArray", "option_study", "run"]

#: Clock target (``--freq``) of the benchmarks. It sets nextpnr's pass/fail line only:
#: 100 and 200 MHz gave identical results on both study designs (docs/fpga-flow.md).
TARGET_MHZ = 100.0


class MacArray(wiring.Component):
    """Dot-product engines over one shared input vector, a small MVM-like test design.

    Each of ``engines`` engines multiplies the ``width``-lane input vector by its own row of
    weights (``a_bits`` x ``w_bits`` signed products) and sums the products with a
    registered adder tree. One vector per cycle; every stage advances when the output is
    empty or being read (``i_stream.ready`` is that condition).

    Parameters
    ----------
    engines, width, a_bits, w_bits : int
        Number of engines, lanes per engine, input and weight widths.
    """

    def __init__(self, *, engines=4, width=16, a_bits=4, w_bits=4):
        for arg, value in (("engines", engines), ("width", width), ("a_bits", a_bits),
                           ("w_bits", w_bits)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{arg} must be a positive integer, not {value!r}")
        self._engines, self._width = engines, width
        self._sum_bits = a_bits + w_bits + math.ceil(math.log2(width))
        super().__init__({
            "i_stream": In(stream.Signature(data.ArrayLayout(signed(a_bits), width))),
            "weights": In(data.ArrayLayout(data.ArrayLayout(signed(w_bits), width), engines)),
            "o_stream": Out(stream.Signature(data.ArrayLayout(signed(self._sum_bits),
                                                              engines))),
        })

    @property
    def latency(self):
        """Cycles from an accepted vector to its sums on ``o_stream``."""
        return 2 + math.ceil(math.log2(self._width))

    def elaborate(self, platform):
        m = Module()
        advance = Signal()
        m.d.comb += [
            advance.eq(~self.o_stream.valid | self.o_stream.ready),
            self.i_stream.ready.eq(advance),
        ]
        valid = self.i_stream.valid
        for e in range(self._engines):
            row = self.weights[e]
            level = []
            for i in range(self._width):
                p = Signal(signed(len(row[i]) + len(self.i_stream.payload[i])),
                           name=f"prod{e}_{i}")
                with m.If(advance):
                    m.d.sync += p.eq(self.i_stream.payload[i] * row[i])
                level.append(p)
            depth = 0
            while len(level) > 1:
                depth += 1
                nxt = []
                for i in range(0, len(level) - 1, 2):
                    s = Signal(signed(len(level[i]) + 1), name=f"sum{e}_{depth}_{i // 2}")
                    with m.If(advance):
                        m.d.sync += s.eq(level[i] + level[i + 1])
                    nxt.append(s)
                if len(level) % 2:
                    s = Signal(signed(len(level[-1]) + 1), name=f"sum{e}_{depth}_last")
                    with m.If(advance):
                        m.d.sync += s.eq(level[-1])
                    nxt.append(s)
                level = nxt
            with m.If(advance):
                m.d.sync += self.o_stream.payload[e].eq(level[0])
        for _ in range(self.latency):
            v = Signal()
            with m.If(advance):
                m.d.sync += v.eq(valid)
            valid = v
        m.d.comb += self.o_stream.valid.eq(valid)
        return m


def run():
    """Benchmark records: place and route of the vector quantizer (N = 16, m = 4)."""
    from hw.mvm.quantizer import VectorQuantizer

    result = place_and_route(VectorQuantizer(n=16, mantissa_bits=4),
                             name="vector_quantizer", build_dir=BUILD_ROOT / "vector_quantizer",
                             target_mhz=TARGET_MHZ)
    return pnr_records("vector quantizer", result,
                    {"design": "hw.mvm.quantizer.VectorQuantizer", "n": 16, "mantissa_bits": 4})


#: Option sets compared by :func:`option_study`: (label, yosys_args, booth_max_width).
OPTION_SETS = (
    ("yosys default", (), 0),
    ("-nowidelut", ("-nowidelut",), 0),
    ("-dff", ("-dff",), 0),
    ("-nowidelut -dff", ("-nowidelut", "-dff"), 0),
    ("-nowidelut, booth <= 8", ("-nowidelut",), 8),
    ("default, booth <= 8", (), 8),
)


def option_study(designs=None, option_sets=OPTION_SETS, target_mhz=TARGET_MHZ, seeds=(1,)):
    """Place and route each design with each option set; returns one row per run."""
    if designs is None:
        from hw.mvm.quantizer import VectorQuantizer
        designs = {
            "vector_quantizer": lambda: VectorQuantizer(n=16, mantissa_bits=4),
            "mac_array": lambda: MacArray(engines=4, width=16, a_bits=4, w_bits=4),
        }
    rows = []
    for design, make in designs.items():
        for i, (label, args, booth) in enumerate(option_sets):
            for seed in seeds:
                r = place_and_route(make(), name=design, seed=seed, target_mhz=target_mhz,
                                    build_dir=BUILD_ROOT / "study" / f"{design}_{i}_s{seed}",
                                    yosys_args=args, booth_max_width=booth)
                row = {"design": design, "options": label, "seed": seed,
                       **{k: r[k] for k in ("lut4", "carry", "comb", "ff", "dsp", "bram",
                                            "pfumx", "l6mux", "fmax_mhz", "seconds")}}
                print(json.dumps(row), flush=True)
                rows.append(row)
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--study", action="store_true", help="run the option study")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1])
    args = parser.parse_args()
    if args.study:
        option_study(seeds=tuple(args.seeds))
    else:
        for record in run():
            print(json.dumps(record))
