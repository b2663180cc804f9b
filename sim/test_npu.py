"""cocotb system bench for :class:`hw.core.npu.NpuCore`: programs bit-exact with
:class:`host.model.core.NpuModel`.

The bench drives the core only through its host-side ports (``vec_w``, ``w_rows``,
``mrf_w``, ``prog_w``, ``inq``, ``run``, ``outq``, ``vec_r_req``, ``mrf_r_req``, the
counters, ``error``), exactly as a host would; the same memory image, program and inputs
go into an ``NpuModel``. After every run it compares the error code and ``pc``, every
output vector, every word of every vector memory and every counter.

* ``test_hand_programs``: small assembled programs (copy, MLP layer, reductions and
  softmax, iterations with ``*_inc`` and windows);
* ``test_programs``: every program of :mod:`host.compiler.programs` with logical sizes that are
  not multiples of N; the MRF image read back once against the model's;
* ``test_illegal``: illegal programs (each error code), the flag, ``pc``, and memories and
  queues as the model leaves them (a legal chain before the illegal one did run);
* ``test_host_errors``: refused host requests: the code, and nothing changed;
* ``test_random``: ``NPU_CHAINS`` chains of :func:`sim.randprog.random_program`;
* ``test_unit_sets`` (a build with the unit sets of :data:`UNIT_SETS`): chains whose ops
  move past the MFUs without their unit, a chain that cannot be placed, and the VRF the
  unit sets leave out refused to chains and to the host.

Parameters come from the environment (``tests/hw/test_npu_hw.py``): ``NPU_CONFIG`` (JSON of
``NpuConfig`` fields), ``NPU_CHAINS``, ``NPU_SEED`` (the random seed; logged). Idle cycles
on every host source and back-pressure on ``outq`` and the read responses are on where a
test says ``stalls``. With ``NPU_DIGEST`` set (a file path), every comparison appends a
line of JSON to that file: what was compared, a digest of the core's outputs, memories,
counters, error and ``pc`` (not its cycles), the same digest of the model's, and the
cycles taken and predicted (beside the digests, for the timing model): the lanes test
(``tests/hw/test_npu_hw.py::test_lanes_identical``) compares two builds with them.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
from types import SimpleNamespace

import numpy as np

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, ReadOnly, RisingEdge, SimTimeoutError, with_timeout

from host.numerics import bfp
from host.compiler.asm import _parse_line, assemble
from host.spec.config import NpuConfig
from host.spec.formats import Rounding
from host.spec.isa import ErrorCode, Space, decode_program, mrf_location, vector_spaces
from host.spec.counters import MVM_COUNTERS
from host.model.core import NpuError, NpuModel
from host.compiler.programs import Program
from sim.randprog import random_fp16, random_program
from hw.mvm.mvm import mrf_address_layout, mrf_word_layout, weight_row_layout
from hw.core.npu import (
    PROGRAM_ADDR_BITS, program_write_layout, vector_read_layout, vector_write_layout,
)
from sim.stream import StreamMonitor, StreamSink, StreamSource, stream_signals

CLOCK_NS = 10
IDLE_PROB = 0.3
BACKPRESSURE_PROB = 0.3
#: Cycles a run may take per instruction-chain before the bench gives up.
RUN_TIMEOUT_CYCLES = 400_000


def _digest(items) -> str:
    """SHA-256 of ``items`` (arrays of FP16 bit patterns, and tuples of ints and names),
    independent of the build: arrays by their dtype, shape and bytes."""
    h = hashlib.sha256()
    for item in items:
        if isinstance(item, np.ndarray):
            a = np.ascontiguousarray(item, dtype=np.uint16)
            h.update(repr(a.shape).encode() + a.tobytes())
        else:
            h.update(repr(item).encode())
        h.update(b"\0")
    return h.hexdigest()


def config_from_env() -> NpuConfig:
    return NpuConfig.from_json(os.environ.get("NPU_CONFIG", "{}"))


def pack_vector(v) -> int:
    return int.from_bytes(np.ascontiguousarray(v, dtype="<u2").tobytes(), "little")


def unpack_vector(word: int, n: int) -> np.ndarray:
    return np.frombuffer(word.to_bytes(2 * n, "little"), dtype="<u2").astype(np.uint16)


def pack(layout, **fields) -> int:
    """An int with each field (an int, already packed) at its offset in ``layout``."""
    word = 0
    for name, value in fields.items():
        f = layout[name]
        word |= (int(value) & ((1 << f.width) - 1)) << f.offset
    return word


class TB:
    """The core's host-side ports as bus models, and the checks against the model."""

    def __init__(self, dut, *, stalls: bool, seed: int):
        self.dut = dut
        self.cfg = cfg = config_from_env()
        self.n = cfg.n
        self.log = dut._log
        self.seed = seed
        self.rng = np.random.default_rng(seed)
        self.log.info("seed %d, stalls=%s, %s", seed, stalls, cfg)
        idle = IDLE_PROB if stalls else 0.0
        bp = BACKPRESSURE_PROB if stalls else 0.0
        Clock(dut.clk, CLOCK_NS, unit="ns").start()
        clk = dut.clk
        self.src = {name: StreamSource(clk, *stream_signals(dut, name), idle, seed + k)
                    for k, name in enumerate(("vec_w", "vec_r_req", "mrf_w", "w_rows",
                                              "mrf_r_req", "prog_w", "inq"))}
        self.sinks = {name: StreamSink(clk, getattr(dut, f"{name}__ready"), bp, seed + 10 + k)
                      for k, name in enumerate(("vec_r_resp", "mrf_r_resp", "outq"))}
        self.mon = {name: StreamMonitor(clk, *stream_signals(dut, name), name)
                    for name in ("vec_r_resp", "mrf_r_resp", "outq")}
        self.taken = {name: 0 for name in self.mon}
        mvm = cfg.mvm
        self.l_vec_w = vector_write_layout(cfg)
        self.l_vec_r = vector_read_layout(cfg)
        self.l_prog = program_write_layout(cfg)
        self.l_mrf_w = mrf_word_layout(mvm)
        self.l_rows = weight_row_layout(mvm)
        self.l_mrf_r = mrf_address_layout(mvm)
        self.spaces = list(vector_spaces(cfg))      # the VRFs its unit sets build

    async def reset(self):
        dut = self.dut
        for name in self.src:
            getattr(dut, f"{name}__valid").value = 0
        for name in ("run", "error_clear", "counters_clear", "soft_reset"):
            getattr(dut, name).value = 0
        dut.rst.value = 1
        await ClockCycles(dut.clk, 3)
        dut.rst.value = 0
        await RisingEdge(dut.clk)
        assert not dut.busy.value, "busy after reset"

    async def pulse(self, name):
        getattr(self.dut, name).value = 1
        await RisingEdge(self.dut.clk)
        getattr(self.dut, name).value = 0

    async def drain(self, *names):
        for name in names:
            src = self.src[name]
            while not src.idle:
                await RisingEdge(self.dut.clk)
        await ClockCycles(self.dut.clk, 2)

    async def take(self, name, count):
        """The next ``count`` transfers of output stream ``name``."""
        mon = self.mon[name]
        await mon.wait_for(self.taken[name] + count, CLOCK_NS)
        items = mon.items[self.taken[name]:self.taken[name] + count]
        self.taken[name] += count
        return items

    # --- host operations (each mirrored on the model by the caller) ---------------------

    def write_vectors(self, space, addr, vectors):
        self.src["vec_w"].send(
            pack(self.l_vec_w, space=Space(space).value, addr=addr + k, values=pack_vector(v))
            for k, v in enumerate(vectors))

    def write_weights(self, slot, matrix, rounding=Rounding.NEAREST_EVEN, static=None):
        """FP16 tile rows through ``w_rows``, placed as ``NpuModel.write_weights``."""
        cfg = self.cfg
        w = np.asarray(matrix)
        w = w.view(np.uint16) if w.dtype == np.float16 else w.astype(np.uint16)
        tiles = bfp.split_matrix(w, cfg.n)
        big_r, big_c = tiles.shape[:2]
        items = []
        for r in range(big_r):
            for c in range(big_c):
                engine, s = cfg.mvm.tile_slot(slot, r, c, big_c)
                for i in range(cfg.n):
                    items.append(pack(self.l_rows, engine=engine, row=i, slot=s,
                                      values=pack_vector(tiles[r, c, i]),
                                      rounding=int(Rounding(rounding).value),
                                      static=static is not None,
                                      static_exponent=static or 0))
        self.src["w_rows"].send(items)

    def write_mrf(self, addr, words):
        items = []
        for k, word in enumerate(words):
            engine, row, slot = mrf_location(self.cfg, addr + k)
            items.append(pack(self.l_mrf_w, engine=engine, row=row, slot=slot, block=word))
        self.src["mrf_w"].send(items)

    def load_program(self, words):
        self.src["prog_w"].send(pack(self.l_prog, addr=k, word=int(wd))
                                for k, wd in enumerate(words))

    def push(self, vectors):
        self.src["inq"].send(pack_vector(v) for v in vectors)

    async def load(self, model, prog):
        """The memory image, program and inputs of ``prog`` into the core and ``model``."""
        for space, addr, vectors in prog.vectors:
            self.write_vectors(space, addr, vectors)
            model.write(space, addr, vectors)
        for slot, matrix in prog.matrices:
            self.write_weights(slot, matrix)
            model.write_weights(slot, matrix)
        self.load_program(prog.words)
        model.load_program(prog.words)
        if prog.inputs is not None and len(prog.inputs):
            self.push(prog.inputs)
            model.push_input(prog.inputs)
        await self.drain("vec_w", "w_rows", "prog_w", "inq")

    async def run(self):
        """Run to ``done``; returns ``(error, pc, cycles)``. Outputs are not popped while
        the program runs (the model's queue checks see the queue as the run left it)."""
        dut = self.dut
        self.sinks["outq"].hold(True)
        await self.pulse("run")
        # The core takes `run` on the edge that ended the pulse and clears a `done` left
        # high by an earlier run with it; read `done` after that edge's updates, or a run
        # that follows another without a soft reset looks finished at once.
        await ReadOnly()
        if not dut.done.value:
            try:
                await with_timeout(RisingEdge(dut.done), RUN_TIMEOUT_CYCLES * CLOCK_NS, "ns")
            except SimTimeoutError:
                raise AssertionError(f"seed {self.seed}: run did not finish") from None
        await RisingEdge(dut.clk)
        self.sinks["outq"].hold(False)
        return (ErrorCode(int(dut.error.value)), int(dut.pc.value), int(dut.cycles.value))

    async def read_vectors(self, space, addr, count):
        self.src["vec_r_req"].send(pack(self.l_vec_r, space=Space(space).value, addr=addr + k)
                                   for k in range(count))
        items = await self.take("vec_r_resp", count)
        return np.array([unpack_vector(w, self.n) for w in items], np.uint16).reshape(
            count, self.n)

    async def read_mrf(self, addr, count):
        items = []
        for k in range(count):
            engine, row, slot = mrf_location(self.cfg, addr + k)
            items.append(pack(self.l_mrf_r, engine=engine, row=row, slot=slot))
        self.src["mrf_r_req"].send(items)
        return await self.take("mrf_r_resp", count)

    def counters(self) -> dict:
        dut, cfg = self.dut, self.cfg
        out = {name: int(getattr(dut, name).value) for name in MVM_COUNTERS}
        cb = cfg.counter_bits
        for kind in ("overflow", "nan_created"):
            word = getattr(dut, f"mfu_{kind}").value.to_unsigned()
            for m in range(cfg.mfus):
                out[f"mfu{m}_{kind}"] = (word >> (m * cb)) & ((1 << cb) - 1)
        return out

    # --- checks -----------------------------------------------------------------------------

    async def compare(self, model, what, result=None, hw=None, memories=True):
        """Outputs, memories, counters and the error state of core and model agree."""
        tag = f"{what} (seed {self.seed})"
        dut = self.dut
        # What each side showed, in the order compared: the digests' input.
        seen = {"core": [], "model": []}

        def record(core, model_value):
            seen["core"].append(core)
            seen["model"].append(model_value)

        if result is not None:
            error, pc, cycles = hw
            assert error is result.error, f"{tag}: error {error.name}, model " \
                                          f"{result.error.name} ({result.message})"
            assert pc == result.pc, f"{tag}: pc {pc}, model {result.pc}"
            record((error.name, pc), (result.error.name, result.pc))
        level = model.output_level
        assert int(dut.outq_level.value) == level, \
            f"{tag}: {int(dut.outq_level.value)} output vectors, model {level}"
        assert int(dut.inq_level.value) == model.input_level, \
            f"{tag}: {int(dut.inq_level.value)} input vectors left, model {model.input_level}"
        record((level, int(dut.inq_level.value)), (level, model.input_level))
        if level:
            got = np.array([unpack_vector(w, self.n) for w in await self.take("outq", level)])
            want = model.pop_output(level)
            bad = np.argwhere(got != want)
            assert not len(bad), f"{tag}: output vector {bad[0][0]} lane {bad[0][1]}: " \
                                 f"{got[tuple(bad[0])]:#06x}, model {want[tuple(bad[0])]:#06x}"
            record(got, want)
        if memories:
            for space in self.spaces:
                depth = self.cfg.ivrf_depth if space is Space.IVRF else self.cfg.vrf_depth
                got = await self.read_vectors(space, 0, depth)
                want = model.read(space, 0, depth)
                bad = np.argwhere(got != want)
                assert not len(bad), f"{tag}: {space.name}[{bad[0][0]}] lane {bad[0][1]}: " \
                                     f"{got[tuple(bad[0])]:#06x}, model " \
                                     f"{want[tuple(bad[0])]:#06x}"
                record(got, want)
        await ClockCycles(dut.clk, 8)        # counters settle after the last event
        got, want = self.counters(), model.counters()
        assert got == want, f"{tag}: counters {got}, model {want}"
        assert ErrorCode(int(dut.error.value)) is model.error, f"{tag}: sticky error"
        record((sorted(got.items()), ErrorCode(int(dut.error.value)).name),
               (sorted(want.items()), model.error.name))
        self._write_digest(what, seen, hw, result)

    def _write_digest(self, what, seen, hw, result):
        """One line of ``NPU_DIGEST`` (module docstring), when it is set."""
        path = os.environ.get("NPU_DIGEST")
        if not path:
            return
        line = {"what": what,
                **{side: _digest(items) for side, items in seen.items()},
                "cycles": None if hw is None else hw[2],
                "predicted": None if result is None else result.cycles_predicted}
        with open(path, "a") as f:
            f.write(json.dumps(line) + "\n")

    async def run_program(self, model, prog, what, memories=True):
        await self.load(model, prog)
        result = model.run()
        hw = await self.run()
        await self.compare(model, what, result, hw, memories)
        return result, hw


async def setup(dut, stalls=False):
    seed = int(os.environ.get("NPU_SEED", "0")) or random.getrandbits(31)
    tb = TB(dut, stalls=stalls, seed=seed)
    await tb.reset()
    return tb


async def fresh(tb, verified=None):
    """Soft reset of the core and a new model (memories: the bench rewrites what it uses).

    Memories survive a soft reset, so both sides are made equal again: every vector
    zeroed on both, or, with ``verified`` (a model whose memories ``TB.compare`` has just
    found equal to the core's), the new model takes that model's vectors and the core
    keeps its own. ``test_illegal`` runs many small cases: writing every vector before
    each was most of its simulation."""
    await tb.pulse("soft_reset")
    await RisingEdge(tb.dut.clk)
    model = NpuModel(tb.cfg)
    for space in tb.spaces:
        depth = tb.cfg.ivrf_depth if space is Space.IVRF else tb.cfg.vrf_depth
        if verified is None:
            tb.write_vectors(space, 0, np.zeros((depth, tb.n), np.uint16))
        else:
            model.write(space, 0, verified.read(space, 0, depth))
    await tb.drain("vec_w")
    return model


class Image:
    """Random memory images and programs from assembler text for the hand-written tests."""

    def __init__(self, tb):
        self.tb = tb
        self.cfg = tb.cfg
        self.n = tb.n

    def program(self, text, vectors=(), matrices=(), inputs=None, checked=True):
        """``checked=False`` skips the assembler's structure check (line by line), for
        programs that are illegal on purpose."""
        if checked:
            instrs = decode_program(assemble(text))
        else:
            instrs = [i for k, line in enumerate(text.splitlines())
                      if (i := _parse_line(line, k + 1)) is not None]
        prog = Program(self.cfg, instrs)
        rng = self.tb.rng
        prog.vectors = [(space, 0, random_fp16(rng, (self.depth(space), self.n)))
                        for space in self.tb.spaces]
        prog.vectors += list(vectors)
        prog.matrices = list(matrices)
        prog.inputs = inputs
        return prog

    def depth(self, space):
        return self.cfg.ivrf_depth if space is Space.IVRF else self.cfg.vrf_depth

    def matrix(self, rows, cols):
        return random_fp16(self.tb.rng, (rows, cols), 0.0)


@cocotb.test()
@cocotb.parametrize(stalls=[False, True])
async def test_hand_programs(dut, stalls):
    tb = await setup(dut, stalls)
    n = tb.n
    img = Image(tb)
    rng = tb.rng
    r1, c1 = 2 * n + 3, n + 5
    cases = {
        "copy": (f"s_wr rows, {2 * n}\nv_rd ivrf, 3\nv_wr ivrf, 9\nv_wr netq\nend_chain\n"
                 "end\n", [], None),
        "netq copy": (f"s_wr rows, {n + 1}\nv_rd netq\nv_wr asvrf1, 2\nend_chain\nend\n", [],
                      random_fp16(rng, (2, n))),
        "mlp": (f"s_wr rows, {r1}\ns_wr cols, {c1}\nv_rd netq\nmv_mul 0\nvv_add 1\nv_relu\n"
                "v_wr netq\nv_wr mulvrf0, 0\nend_chain\nend\n", [(0, img.matrix(r1, c1))],
                random_fp16(rng, (2, n))),
        "softmax": (f"s_wr rows, {2 * n - 3}\nv_rd ivrf, 0\nv_max_reduce\nvv_b_sub_a 4\nv_exp\n"
                    "v_wr ivrf, 10\nv_wr mulvrf0, 0\nend_chain\n"
                    "v_rd ivrf, 10\nv_sum_reduce\nv_recip\nvv_mul 0\nv_wr netq\nend_chain\n"
                    "end\n", [], None),
        "iterations": (f"s_wr rows, {n - 1}\ns_wr cols, {2 * n}\ns_wr iterations, 3\n"
                       "v_rd_inc ivrf, 0, 2\nmv_mul 0\nvv_mul_inc 0, 1\nv_tanh\n"
                       "v_wr_inc ivrf, 20, 1\nend_chain\n"
                       "s_wr q_static, 1\ns_wr q_exponent, 130\ns_wr narrow, 9\n"
                       "s_wr rounding, 1\ns_wr win_w, 2\ns_wr win_h, 2\ns_wr win_pitch, 5\n"
                       f"s_wr cols, {n - 2}\ns_wr iterations, 2\n"
                       "v_rd_inc ivrf, 1, 3\nmv_mul 2\nv_wr_inc asvrf0, 0, 1\nv_wr netq\n"
                       "end_chain\nend\n",
                       [(0, img.matrix(n - 1, 2 * n)), (2, img.matrix(n - 1, 4 * n))], None),
    }
    for what, (text, mats, inputs) in cases.items():
        model = await fresh(tb)
        prog = img.program(text, matrices=mats, inputs=inputs)
        result, _ = await tb.run_program(model, prog, what)
        assert result.ok, f"{what}: the model refused the program: {result.message}"


@cocotb.test()
@cocotb.parametrize(stalls=[False, True])
async def test_programs(dut, stalls):
    from host.compiler import programs as P
    tb = await setup(dut, stalls)
    cfg, n = tb.cfg, tb.n
    rng = tb.rng

    def f16(*shape, scale=0.5):
        return (rng.standard_normal(shape) * scale).astype(np.float16)

    h, x = n + 3, 2 * n - 5
    lstm_w = {f"W_{g}": f16(h, x) for g in "fioc"} | {f"U_{g}": f16(h, h) for g in "fioc"} \
        | {f"b_{g}": f16(h) for g in "fioc"}
    gru_w = {f"W_{g}": f16(h, x) for g in "zrn"} | {f"U_{g}": f16(h, h) for g in "zrn"} \
        | {f"b_{g}": f16(h) for g in ("z", "r", "n", "hn")}
    progs = {
        "mlp": P.mlp_layer(cfg, f16(h, x), f16(h), f16(3, x), "relu"),
        "lstm step": P.lstm_step(cfg, lstm_w, f16(x), f16(h), f16(h)),
        "lstm sequence": P.lstm_sequence(cfg, lstm_w, f16(3, x), f16(h), f16(h)),
        "gru step": P.gru_step(cfg, gru_w, f16(x), f16(h)),
        "conv1x1": P.conv1x1(cfg, f16(n + 2, n - 3), f16(n + 2), f16(2, 3, n - 3), "tanh"),
        "conv3x3 stride 2": P.conv2d(cfg, f16(5, 3, 3, 3), f16(5), f16(5, 6, 3), stride=2),
        "softmax head": P.softmax_head(cfg, f16(2 * n + 1, x), f16(2 * n + 1), f16(x)),
    }
    for what, prog in progs.items():
        model = await fresh(tb)
        result, (_, _, cycles) = await tb.run_program(model, prog, what)
        assert result.ok, f"{what}: the model refused the program: {result.message}"
        tb.log.info("%s: %d chains, %d cycles (model predicts %d)", what, result.chains,
                    cycles, result.cycles_predicted)
    # The on-chip quantizer put the last program's matrices where the model has them. Only
    # the slots they fill: the rest still hold earlier programs' weights (a soft reset
    # keeps the MRF), which the fresh model does not have.
    slots = max(slot + cfg.mvm.slots_needed(-(-w.shape[0] // n), -(-w.shape[1] // n))
                for slot, w in prog.matrices)
    words = slots * cfg.tiles * n
    assert words >= 2 * cfg.tiles * n, "the last program should fill more than one slot"
    got = await tb.read_mrf(0, words)
    assert got == model.read(Space.MRF, 0, words), "MRF read-back differs from the model"


#: Illegal programs: (name, assembler text or raw words, the error code expected, and
#: optionally how many input vectors wait in the input queue; the model must agree).
#: ``{n}`` is N, ``{big}`` a ROWS of two native vectors.
ILLEGAL = [
    ("erased word", [0], ErrorCode.ILLEGAL_OPCODE),
    ("unassigned opcode", [31], ErrorCode.ILLEGAL_OPCODE),
    ("reserved bits", [(1 << 14) | 9], ErrorCode.ILLEGAL_FIELD),
    ("unassigned space", [(12 << 5) | 1], ErrorCode.ILLEGAL_FIELD),
    ("unassigned binary op", [(6 << 9) | 4], ErrorCode.ILLEGAL_OPCODE),
    ("end with operand", [(1 << 32) | 9], ErrorCode.ILLEGAL_FIELD),
    ("v_rd mrf", [(15 << 5) | 1], ErrorCode.ILLEGAL_FIELD),
    ("v_wr netq with address", [(5 << 32) | 2], ErrorCode.ILLEGAL_FIELD),
    ("rows 0", "s_wr rows, 0\nend", ErrorCode.REGISTER_VALUE),
    ("iterations too many", "s_wr iterations, 65537\nend", ErrorCode.REGISTER_VALUE),
    ("narrow 65", "s_wr narrow, 65\nend", ErrorCode.REGISTER_VALUE),
    ("op outside a chain", "v_relu\nend", ErrorCode.CHAIN_STRUCTURE),
    ("chain without v_wr", "v_rd ivrf, 0\nv_relu\nend_chain\nend", ErrorCode.CHAIN_STRUCTURE),
    ("mv_mul after an op", "v_rd ivrf, 0\nv_relu\nmv_mul 0\nv_wr ivrf, 4\nend_chain\nend",
     ErrorCode.CHAIN_STRUCTURE),
    ("op after v_wr", "v_rd ivrf, 0\nv_wr ivrf, 4\nv_relu\nend_chain\nend",
     ErrorCode.CHAIN_STRUCTURE),
    ("end inside a chain", "v_rd ivrf, 0\nv_wr ivrf, 4\nend", ErrorCode.CHAIN_STRUCTURE),
    ("five v_wr", "v_rd ivrf, 0\n" + "".join(f"v_wr ivrf, {4 * k}\n" for k in range(1, 6))
     + "end_chain\nend", ErrorCode.CHAIN_STRUCTURE),
    ("no end", "v_rd ivrf, 0\nv_wr ivrf, 4\nend_chain", ErrorCode.PROGRAM_RANGE),
    ("ops do not fit", "v_rd ivrf, 0\nv_relu\nv_tanh\nv_exp\nv_wr ivrf, 4\nend_chain\nend",
     ErrorCode.CHAIN_STRUCTURE),
    ("vrf of a missing mfu", "v_rd ivrf, 0\nv_wr mulvrf3, 0\nend_chain\nend",
     ErrorCode.ILLEGAL_FIELD),
    ("window too wide", "s_wr cols, {maxcols}\ns_wr win_w, 2\nv_rd ivrf, 0\nmv_mul 0\n"
     "v_wr ivrf, 4\nend_chain\nend", ErrorCode.SIZE_RANGE),
    ("static exponent 143", "s_wr q_static, 1\ns_wr q_exponent, 143\nv_rd ivrf, 0\nmv_mul 0\n"
     "v_wr ivrf, 4\nend_chain\nend", ErrorCode.REGISTER_VALUE),
    ("mrf slots", "v_rd ivrf, 0\nmv_mul {mrf}\nv_wr ivrf, 4\nend_chain\nend",
     ErrorCode.ADDRESS_RANGE),
    ("input underflow", "v_rd netq\nv_wr ivrf, 4\nend_chain\nend", ErrorCode.QUEUE_UNDERFLOW),
    # One vector waits; the product takes two (its column tiles), where the chain's rows
    # alone would take one: the check must see the mv_mul's C, which has_mv selects
    # three instructions before the check (the shortest chain with a product).
    ("input underflow of a product", "s_wr rows, {n}\ns_wr cols, {big}\nv_rd netq\n"
     "mv_mul 0\nv_wr ivrf, 4\nend_chain\nend", ErrorCode.QUEUE_UNDERFLOW, 1),
    ("output overflow", "s_wr iterations, {netq}\ns_wr rows, {big}\nv_rd ivrf, 0\n"
     "v_wr netq\nend_chain\nend", ErrorCode.QUEUE_OVERFLOW),
    ("read beyond ivrf", "v_rd ivrf, {ivrf}\nv_wr ivrf, 0\nend_chain\nend",
     ErrorCode.ADDRESS_RANGE),
    ("write beyond a vrf in iteration 2", "s_wr iterations, 3\nv_rd ivrf, 0\n"
     "v_wr_inc asvrf0, {vrf_m2}, 1\nend_chain\nend", ErrorCode.ADDRESS_RANGE),
    ("vv operand beyond its vrf", "s_wr rows, {big}\nv_rd ivrf, 0\nvv_add {vrf_m1}\n"
     "v_wr ivrf, 4\nend_chain\nend", ErrorCode.ADDRESS_RANGE),
    ("write ahead of the read", "s_wr rows, {big}\nv_rd ivrf, 0\nv_wr ivrf, 1\nend_chain\nend",
     ErrorCode.HAZARD),
    ("two writes overlap", "s_wr rows, {big}\nv_rd ivrf, 0\nv_wr asvrf0, 3\nv_wr asvrf0, 4\n"
     "end_chain\nend", ErrorCode.HAZARD),
    ("write ahead of a vv read in iteration 3", "s_wr rows, {big}\ns_wr iterations, 4\n"
     "v_rd ivrf, 0\nvv_mul_inc 0, 4\nv_wr_inc mulvrf0, 7, 2\nend_chain\nend",
     ErrorCode.HAZARD),
    ("legal chain, then an illegal one", "s_wr rows, {big}\nv_rd ivrf, 0\nv_exp\n"
     "v_wr ivrf, 5\nv_wr netq\nend_chain\nv_rd ivrf, 0\nv_wr ivrf, 1\nend_chain\nend",
     ErrorCode.HAZARD),
]


@cocotb.test()
async def test_illegal(dut):
    tb = await setup(dut, stalls=False)
    cfg, n = tb.cfg, tb.n
    img = Image(tb)
    fmt = dict(n=n, big=2 * n, maxcols=cfg.max_col_tiles * n, mrf=cfg.mrf_depth,
               netq=cfg.netq_depth, ivrf=cfg.ivrf_depth, vrf_m2=cfg.vrf_depth - 2,
               vrf_m1=cfg.vrf_depth - 1)
    model = None
    for what, text, code, *waiting in ILLEGAL:
        model = await fresh(tb, verified=model)
        if isinstance(text, str):
            inputs = random_fp16(tb.rng, (waiting[0], n)) if waiting else None
            prog = img.program(text.format(**fmt), inputs=inputs, checked=False)
        else:
            prog = SimpleNamespace(vectors=img.program("end").vectors, matrices=[],
                                   inputs=None, words=np.array(text, np.uint64))
        result, hw = await tb.run_program(model, prog, what)
        assert result.error is code, f"{what}: the model says {result.error.name} " \
                                     f"({result.message}), the bench expected {code.name}"
        # The flag is sticky: a second run does not start.
        hw2 = await tb.run()
        assert hw2[0] is code and hw2[2] == 0, f"{what}: a run started with the error set"
        await tb.pulse("error_clear")
        await RisingEdge(dut.clk)
        assert ErrorCode(int(dut.error.value)) is ErrorCode.NONE, f"{what}: not cleared"
    # No program: a soft reset forgets the length (the words of the last program stay in
    # program memory, and must not run): PROGRAM_RANGE at pc 0, as the model says.
    model = await fresh(tb, verified=model)
    result = model.run()
    hw = await tb.run()
    await tb.compare(model, "no program", result, hw)
    assert result.error is ErrorCode.PROGRAM_RANGE and hw[1] == 0, \
        f"no program: {result.error.name} at {hw[1]}"
    await tb.pulse("error_clear")
    await RisingEdge(dut.clk)


async def _refused(tb, dut, what, hw_op, model_op) -> ErrorCode:
    """A host request the model refuses (``model_op`` raises NpuError; AssertionError if
    it accepts it), sent to the core by ``hw_op``: its ``access_error`` must be the
    model's code, which is returned."""
    try:
        model_op()
    except NpuError as e:
        code = e.code
    else:
        raise AssertionError(f"{what}: the model accepted it")
    hw_op()
    await tb.drain(*tb.src)
    got = ErrorCode(int(dut.access_error.value))
    assert got is code, f"{what}: access_error {got.name}, model {code.name}"
    return code


@cocotb.test()
async def test_host_errors(dut):
    tb = await setup(dut, stalls=False)
    cfg, n = tb.cfg, tb.n
    model = await fresh(tb)
    img = Image(tb)
    for space, addr, vectors in img.program("end").vectors:
        tb.write_vectors(space, addr, vectors)
        model.write(space, addr, vectors)
    await tb.drain("vec_w")
    vec = np.ones((1, n), np.uint16)
    bad_space = Space.asvrf(cfg.mfus) if cfg.mfus < 4 else Space.NETQ
    # An MRF address beyond the MRF, if the port's fields can express one (a power-of-two
    # T and mrf_depth fill their fields exactly).
    if cfg.tiles < 1 << tb.l_mrf_w["engine"].width:
        bad_mrf = pack(tb.l_mrf_w, engine=cfg.tiles, row=0, slot=0, block=0)
    else:
        assert cfg.mrf_depth < 1 << tb.l_mrf_w["slot"].width, "no out-of-range MRF address"
        bad_mrf = pack(tb.l_mrf_w, engine=0, row=0, slot=cfg.mrf_depth, block=0)
    cases = [
        ("vector into netq", lambda: tb.write_vectors(Space.NETQ, 0, vec),
         lambda: model.write(Space.NETQ, 0, vec)),
        ("vector into a missing vrf", lambda: tb.write_vectors(bad_space, 0, vec),
         lambda: model.write(bad_space, 0, vec)),
        ("vector beyond the ivrf", lambda: tb.write_vectors(Space.IVRF, cfg.ivrf_depth, vec),
         lambda: model.write(Space.IVRF, cfg.ivrf_depth, vec)),
        ("vector beyond a vrf", lambda: tb.write_vectors(Space.MULVRF0, cfg.vrf_depth, vec),
         lambda: model.write(Space.MULVRF0, cfg.vrf_depth, vec)),
        ("mrf word beyond the mrf", lambda: tb.src["mrf_w"].send([bad_mrf]),
         lambda: model.write(Space.MRF, cfg.mrf_words, [0])),
        ("mrf word with exponent 143", lambda: tb.write_mrf(5, [143]),
         lambda: model.write(Space.MRF, 5, [143])),
        ("weights with a static exponent 143",
         lambda: tb.write_weights(0, np.ones((n, n), np.float16), static=143),
         lambda: model.write_weights(0, np.ones((n, n), np.float16), static_exponent=143)),
        ("program word beyond program memory",
         lambda: tb.src["prog_w"].send([pack(tb.l_prog, addr=cfg.program_depth, word=9)])
         if cfg.program_depth < (1 << PROGRAM_ADDR_BITS) else None,
         lambda: model.load_program(np.zeros(cfg.program_depth + 1, np.uint64))),
    ]
    for what, hw_op, model_op in cases:
        await _refused(tb, dut, what, hw_op, model_op)
        assert ErrorCode(int(dut.error.value)) is ErrorCode.NONE, f"{what}: run error set"
        await tb.pulse("error_clear")
        await RisingEdge(dut.clk)
    # A full input queue refuses the next push.
    tb.push(np.zeros((cfg.netq_depth + 1, n), np.uint16))
    await tb.drain("inq")
    assert int(dut.inq_level.value) == cfg.netq_depth
    assert ErrorCode(int(dut.access_error.value)) is ErrorCode.QUEUE_OVERFLOW
    model.push_input(np.zeros((cfg.netq_depth, n), np.uint16))
    try:
        model.push_input(np.zeros((1, n), np.uint16))
    except NpuError as e:
        assert e.code is ErrorCode.QUEUE_OVERFLOW
    # Nothing refused changed anything (memories, MRF, counters, queues).
    await tb.compare(model, "after refused requests")
    words = min(cfg.mrf_words, 2 * n)
    assert await tb.read_mrf(0, words) == model.read(Space.MRF, 0, words)


@cocotb.test()
@cocotb.parametrize(stalls=[False, True])
async def test_random(dut, stalls):
    tb = await setup(dut, stalls)
    total = int(os.environ.get("NPU_CHAINS", "200")) // 2
    per_program = 30        # about 300 words: within the test builds' program memory
    done = 0
    k = 0
    # One model for the whole run: each program starts from the memories, counters and
    # (empty) queues the previous one left, which the comparison after it has checked
    # equal; this also runs programs on non-zero memory contents, and saves rewriting
    # every memory before each program.
    model = await fresh(tb)
    while done < total:
        seed = tb.seed * 1000 + k + (500 if stalls else 0)
        k += 1
        prog = random_program(tb.cfg, seed, chains=min(per_program, total - done))
        result, _ = await tb.run_program(model, prog, f"random program {seed}")
        assert result.ok, f"random program {seed}: {result.message}"
        done += prog.refs["chains"]
        if k % 20 == 0:                 # a long soak (NPU_CHAINS) shows how far it got
            tb.log.info("%d of %d random chains, no mismatch", done, total)
    tb.log.info("%d random chains in %d programs, no mismatch", done, k)


#: The unit sets ``test_unit_sets`` is written for (``tests/hw/test_npu_hw.py`` builds
#: them): REDUCE only in MFU 0, ACT only in MFU 1, no ADDSUB (so no AddSubVrf) in MFU 1.
UNIT_SETS = "addsub+mul+reduce/mul+act"
#: The unary functions of that build: every one but sigmoid.
UNIT_SET_UNARY = ("relu", "tanh", "exp", "recip", "pass")

#: (what, program, the error the model and the core must give).
UNIT_SET_PROGRAMS = [
    ("relu moves to MFU 1, the multiply follows it there",
     ("s_wr rows, {big}\nv_rd ivrf, 0\nv_relu\nvv_mul 2\nv_wr netq\nv_wr mulvrf1, 6\n"
      "end_chain\nend"), ErrorCode.NONE),
    ("add and reduce in MFU 0, exp and multiply in MFU 1",
     ("s_wr rows, {odd}\nv_rd ivrf, 3\nvv_add 1\nv_max_reduce\nv_exp\nvv_mul 0\n"
      "v_wr ivrf, 20\nv_wr mulvrf0, 9\nend_chain\n"
      "v_rd mulvrf1, 1\nvv_b_sub_a 4\nv_sum_reduce\nv_recip\nv_wr netq\nend_chain\nend"),
     ErrorCode.NONE),
    ("an add after relu: no later MFU has ADDSUB",
     "v_rd ivrf, 0\nv_relu\nvv_add 0\nv_wr ivrf, 4\nend_chain\nend",
     ErrorCode.CHAIN_STRUCTURE),
    ("a reduction after tanh",
     "v_rd ivrf, 0\nv_tanh\nv_sum_reduce\nv_wr ivrf, 4\nend_chain\nend",
     ErrorCode.CHAIN_STRUCTURE),
    ("v_wr of the AddSubVrf MFU 1 lacks",
     "v_rd ivrf, 0\nv_relu\nv_wr ivrf, 4\nv_wr asvrf1, 0\nend_chain\nend",
     ErrorCode.ILLEGAL_FIELD),
    ("v_rd of the AddSubVrf MFU 1 lacks",
     "v_rd asvrf1, 0\nv_wr ivrf, 4\nend_chain\nend", ErrorCode.ILLEGAL_FIELD),
    ("sigmoid, which the build does not have",
     "v_rd ivrf, 0\nv_sigm\nv_wr ivrf, 4\nend_chain\nend", ErrorCode.ILLEGAL_OPCODE),
    ("the relu chain again after the errors",
     "v_rd ivrf, 5\nv_relu\nvv_mul 2\nv_wr netq\nend_chain\nend", ErrorCode.NONE),
]


@cocotb.test()
async def test_unit_sets(dut):
    """A build with per-MFU unit sets: placement, refusals and the VRF left out."""
    from host.spec.mfu import parse_unit_sets
    tb = await setup(dut, stalls=False)
    cfg, n = tb.cfg, tb.n
    assert cfg.unit_sets == parse_unit_sets(UNIT_SETS, cfg.mfus), \
        f"test_unit_sets is written for unit sets {UNIT_SETS}, the build has {cfg.unit_sets}"
    assert cfg.unary_ops == NpuConfig(n=cfg.n, unary_ops=UNIT_SET_UNARY).unary_ops, \
        f"test_unit_sets is written for unary ops {UNIT_SET_UNARY}, the build has " \
        f"{cfg.unary_ops}"
    assert Space.ASVRF1 not in tb.spaces
    img = Image(tb)
    fmt = {"big": 2 * n, "odd": 2 * n - 3}
    for what, text, code in UNIT_SET_PROGRAMS:
        model = await fresh(tb)
        prog = img.program(text.format(**fmt), checked=False)
        result, _ = await tb.run_program(model, prog, what)
        assert result.error is code, f"{what}: the model says {result.error.name} " \
                                     f"({result.message}), the bench expected {code.name}"
        if code is not ErrorCode.NONE:
            await tb.pulse("error_clear")
            await RisingEdge(dut.clk)
    # The host's writes and reads of the VRF the unit sets leave out: ILLEGAL_FIELD, as
    # for an MFU the build does not have; a refused read answers zeros.
    model = await fresh(tb)
    vec = np.full((1, n), 0x3C00, np.uint16)
    for what, hw_op, model_op in [
            ("write", lambda: tb.write_vectors(Space.ASVRF1, 0, vec),
             lambda: model.write(Space.ASVRF1, 0, vec)),
            ("read", lambda: tb.src["vec_r_req"].send(
                [pack(tb.l_vec_r, space=Space.ASVRF1.value, addr=0)]),
             lambda: model.read(Space.ASVRF1, 0, 1))]:
        code = await _refused(tb, dut, what, hw_op, model_op)
        assert code is ErrorCode.ILLEGAL_FIELD, f"{what}: {code.name}, not ILLEGAL_FIELD"
        if what == "read":
            (word,) = await tb.take("vec_r_resp", 1)
            assert word == 0, f"refused read answered {word:#x}"
        await tb.pulse("error_clear")
        await RisingEdge(dut.clk)
    await tb.compare(model, "after the refused requests")
