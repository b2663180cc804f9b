"""cocotb bench for :class:`hw.mvm.mvm.Mvm`, bit-exact against :func:`host.numerics.mvm.mvm`.

Weights are quantized on the host (``host.numerics.bfp.quantize`` of the zero-padded FP16 matrix,
blocks of N along the rows) and written with ``mrf_w`` as ``host.numerics.bfp.pack`` words, or sent
as FP16 tile rows on ``w_stream`` through the on-chip matrix quantizer. Every output
vector and every counter is compared with the model; the error flag, the MRF contents
(read back) and the cycle counts of ``docs/mvm.md`` are checked as well.

The per-cycle Python work is kept small: payloads are packed into one integer per item,
and all model work is done with NumPy per product.

Parameters come from the environment (set by ``tests/hw/test_mvm_hw.py``): ``MVM_N``,
``MVM_TILES``, ``MVM_MV``, ``MVM_MW``, ``MVM_DEPTH``, ``MVM_MAX_COL_TILES``,
``MVM_COUNTER_BITS``, ``MVM_NARROW_CHECK`` (1 or 0; the build), ``MVM_PRODUCTS``
(random products per stall setting, default 60), ``MVM_RESULTS`` (where
``test_tile_independence`` writes its outputs and counters, to be compared across builds;
the test skips itself without it), ``MVM_MATRICES`` (its number of matrices, 3
products each, default 12) and ``MVM_CYCLE_SHAPES`` (how many of ``test_cycles``'s
shapes it times, from the first, besides the full-depth one; 0, the default, all).
"""

from __future__ import annotations

import json
import os
import random
import time
from dataclasses import dataclass

import numpy as np

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, RisingEdge

from host.numerics import bfp
from host.spec.config import MvmConfig
from host.spec.formats import E8M0_BIAS, Rounding, block_bytes
from host.numerics.mvm import mvm as model_mvm
from host.spec.formats import MAX_EXPONENT_CODE
from hw.mvm.mvm import (
    command_layout, latency, mrf_address_layout, mrf_word_layout, weight_row_layout,
)
from sim.stream import StreamMonitor, StreamSink, StreamSource, stream_signals

CLOCK_NS = 10
IDLE_PROB = 0.3
BACKPRESSURE_PROB = 0.4
STALLS = (False, True)
COUNTERS = ("vector_saturations", "vector_nonfinite", "weight_saturations",
            "weight_nonfinite", "narrow_events", "output_saturations")


def config_env(config: MvmConfig) -> dict[str, str]:
    """The environment variables that :func:`build_config` reads back as ``config``."""
    return {
        "MVM_N": str(config.n),
        "MVM_TILES": str(config.tiles),
        "MVM_MV": str(config.mantissa_bits_v),
        "MVM_MW": str(config.mantissa_bits_w),
        "MVM_DEPTH": str(config.mrf_depth),
        "MVM_MAX_COL_TILES": str(config.max_col_tiles),
        "MVM_COUNTER_BITS": str(config.counter_bits),
        "MVM_NARROW_CHECK": str(int(config.narrow_check)),
    }


def build_config() -> MvmConfig:
    env = os.environ
    return MvmConfig(
        n=int(env.get("MVM_N", "8")),
        tiles=int(env.get("MVM_TILES", "2")),
        mantissa_bits_v=int(env.get("MVM_MV", "4")),
        mantissa_bits_w=int(env.get("MVM_MW", "4")),
        mrf_depth=int(env.get("MVM_DEPTH", "32")),
        max_col_tiles=int(env.get("MVM_MAX_COL_TILES", "8")),
        counter_bits=int(env.get("MVM_COUNTER_BITS", "32")),
        narrow_check=env.get("MVM_NARROW_CHECK", "1") == "1",
    )


# --- payload packing -------------------------------------------------------------------

def pack_struct(layout, **fields) -> int:
    """One integer for a ``data.StructLayout`` payload; fields given as integers."""
    word = 0
    for name, field in layout:
        value = int(fields.get(name, 0))
        word |= (value & ((1 << field.width) - 1)) << field.offset
    return word


def pack_lanes(bits) -> int:
    """FP16 patterns ``(n,)`` -> one integer, lane i at bits [16i, 16i+16)."""
    return int.from_bytes(np.ascontiguousarray(bits, dtype="<u2").tobytes(), "little")


def unpack_lanes(word: int, n: int) -> np.ndarray:
    return np.frombuffer(word.to_bytes(2 * n, "little"), "<u2").astype(np.uint16)


def block_words(t: bfp.BfpTensor) -> np.ndarray:
    """``host.numerics.bfp.pack`` of a tensor, as one integer per block (``object`` array shaped
    like ``t.exponents``): the bits an MRF word holds."""
    nbytes = block_bytes(t.block_size, t.mantissa_bits)
    raw = bfp.pack(t).reshape(-1, nbytes)
    words = np.array([int.from_bytes(r.tobytes(), "little") for r in raw], dtype=object)
    return words.reshape(t.exponents.shape)


# --- stimulus --------------------------------------------------------------------------

class Stimulus:
    """Random FP16 matrices and vectors from a mix of distributions."""

    def __init__(self, rng: np.random.Generator):
        self.rng = rng

    @staticmethod
    def fp16(x):
        with np.errstate(over="ignore"):
            return np.asarray(x, np.float64).astype(np.float16)

    def values(self, shape, kind=None, finite=True):
        """FP16 values (``float16`` array) of one of several kinds."""
        rng = self.rng
        kinds = ["normal", "scaled_rows", "wide", "subnormal", "sparse", "uniform_bits",
                 "extreme"]
        if kind is None:
            kind = rng.choice(kinds, p=[0.25, 0.2, 0.2, 0.08, 0.1, 0.1, 0.07])
        if kind == "normal":
            x = rng.standard_normal(shape) * 2.0 ** rng.integers(-8, 8)
        elif kind == "scaled_rows":
            # Each row (and so each block) has its own scale: exponents vary per tile row.
            k = rng.integers(-26, 16, shape[:-1] + (1,))
            x = rng.standard_normal(shape) * np.exp2(k)
        elif kind == "wide":
            # Log-uniform over the whole FP16 range, subnormals included, inside a block.
            e = rng.uniform(-25, 16, shape)
            x = np.exp2(e) * rng.choice([-1.0, 1.0], shape)
        elif kind == "subnormal":
            x = rng.integers(-1023, 1024, shape) * 2.0 ** -24
        elif kind == "sparse":
            x = rng.standard_normal(shape) * (rng.random(shape) < 0.2)
        elif kind == "uniform_bits":
            bits = rng.integers(0, 1 << 16, shape, dtype=np.uint16)
            if finite:
                bits = np.where((bits & 0x7C00) == 0x7C00, bits & 0x83FF, bits)
            return bits.view(np.float16)
        else:  # extreme: +-65504 and the smallest values, side by side
            choice = rng.choice([65504.0, -65504.0, 2.0 ** -24, -(2.0 ** -24), 0.0], shape)
            x = choice
        x = np.clip(x, -65504, 65504)
        return self.fp16(x)

    def vector(self, length):
        x = self.values((length,))
        if self.rng.random() < 0.1:     # non-finite inputs: counted, then NaN=0, inf=max
            bits = x.view(np.uint16).copy()
            where = self.rng.integers(0, length, self.rng.integers(1, 3))
            bits[where] = self.rng.choice([0x7C00, 0xFC00, 0x7E00, 0xFD01], where.size)
            x = bits.view(np.float16)
        return x


# --- products ----------------------------------------------------------------------------

@dataclass
class Matrix:
    """A logical matrix quantized for the MRF and placed at ``base``."""
    base: int
    rows: int
    cols: int
    big_r: int
    big_c: int
    codes: np.ndarray          # (R*N, C) uint8
    mantissas: np.ndarray      # (R*N, C*N) int
    words: np.ndarray          # (R*N, C) object: packed MRF words
    weight_saturated: int = 0
    weight_nonfinite: int = 0


@dataclass
class Product:
    matrix: Matrix
    x_bits: np.ndarray         # (cols,) uint16
    rounding: Rounding
    static_code: int | None
    k: int
    expect: np.ndarray = None  # (R*N,) uint16
    counts: dict = None


class TB:
    """Clock, reset, bus models and model bookkeeping around one Mvm."""

    def __init__(self, dut, *, stalls: bool, seed: int | None = None):
        self.dut = dut
        self.cfg = build_config()
        self.log = dut._log
        self.seed = random.getrandbits(32) if seed is None else seed
        self.rng = np.random.default_rng(self.seed)
        self.stim = Stimulus(self.rng)
        self.stalls = stalls
        c = self.cfg
        self.cmd_layout = command_layout(c)
        self.word_layout = mrf_word_layout(c)
        self.row_layout = weight_row_layout(c)
        self.addr_layout = mrf_address_layout(c)
        self.latency = latency(c)
        Clock(dut.clk, CLOCK_NS, unit="ns").start()
        idle = IDLE_PROB if stalls else 0.0
        s = self.seed
        sources = []
        for k, name in enumerate(("cmd", "x_stream", "w_stream", "mrf_w", "mrf_r_req"), 1):
            getattr(dut, f"{name}__valid").value = 0      # the sources drive it from send()
            sources.append(StreamSource(dut.clk, *stream_signals(dut, name), idle, s + k))
        self.cmd, self.x, self.w, self.mrf_w, self.rreq = sources
        self.y_sink = StreamSink(dut.clk, dut.y_stream__ready,
                                 BACKPRESSURE_PROB if stalls else 0.0, s + 6)
        self.r_sink = StreamSink(dut.clk, dut.mrf_r_resp__ready,
                                 BACKPRESSURE_PROB if stalls else 0.0, s + 7)
        # Monitors made together count cycles from the same edge: the command monitor's
        # transfer cycles compare with the outputs' (test_cycles).
        self.cmd_in = StreamMonitor(dut.clk, *stream_signals(dut, "cmd"), "cmd")
        self.y = StreamMonitor(dut.clk, *stream_signals(dut, "y_stream"), "y_stream")
        self.resp = StreamMonitor(dut.clk, *stream_signals(dut, "mrf_r_resp"), "mrf_r_resp")
        self.products: list[Product] = []
        self.checked = 0
        # Model counter totals since the last clear.
        self.expect_counts = dict.fromkeys(COUNTERS, 0)
        self.mirror: dict[tuple[int, int, int], int] = {}    # (engine, row, slot) -> word
        self.next_base = 0

    async def reset(self):
        dut = self.dut
        dut.rst.value = 1
        dut.clear.value = 0
        dut.error_clear.value = 0
        for _ in range(3):
            await RisingEdge(dut.clk)
        dut.rst.value = 0
        await RisingEdge(dut.clk)
        assert not dut.busy.value and not dut.error.value
        self.check_counters()

    # --- matrices ------------------------------------------------------------------------

    def quantize_matrix(self, w16, rounding=Rounding.NEAREST_EVEN, exponent=None):
        """Quantize the padded FP16 matrix along its rows in blocks of N."""
        n = self.cfg.n
        rows, cols = w16.shape
        big_r, big_c = -(-rows // n), -(-cols // n)
        padded = np.zeros((big_r * n, big_c * n), np.float16)
        padded[:rows, :cols] = w16
        t = bfp.quantize(padded, n, self.cfg.mantissa_bits_w, rounding, exponent,
                         nonfinite="saturate")
        return t, big_r, big_c

    def place(self, rows, cols, t, big_r, big_c, base=None):
        if base is None:
            base = self.next_base
        need = self.cfg.slots_needed(big_r, big_c)
        assert base + need <= self.cfg.mrf_depth
        # No wrap-around: a batch's matrices must not overlap while its products run.
        self.next_base = base + need
        return Matrix(base=base, rows=rows, cols=cols, big_r=big_r, big_c=big_c,
                      codes=t.exponent_codes.reshape(big_r * self.cfg.n, big_c),
                      mantissas=t.mantissas.astype(np.int64), words=block_words(t),
                      weight_saturated=int(t.saturations.sum()),
                      weight_nonfinite=int(t.nonfinite.sum()))

    def fits(self, big_r, big_c):
        return self.next_base + self.cfg.slots_needed(big_r, big_c) <= self.cfg.mrf_depth

    def word_addresses(self, mat: Matrix):
        """``(engine, row, slot, r*N+i, c)`` of every MRF word of a matrix."""
        n = self.cfg.n
        out = []
        for r in range(mat.big_r):
            for c in range(mat.big_c):
                engine, slot = self.cfg.tile_slot(mat.base, r, c, mat.big_c)
                for i in range(n):
                    out.append((engine, i, slot, r * n + i, c))
        return out

    def load_packed(self, mat: Matrix):
        """Queue the matrix's words on ``mrf_w``, in random order."""
        items = []
        for engine, i, slot, row, c in self.word_addresses(mat):
            word = int(mat.words[row, c])
            items.append(pack_struct(self.word_layout, engine=engine, row=i, slot=slot,
                                     block=word))
            self.mirror[engine, i, slot] = word
        self.rng.shuffle(items)
        self.mrf_w.send(items)

    def load_fp16(self, mat: Matrix, w_padded16, rounding, code):
        """Queue the matrix's FP16 tile rows on ``w_stream`` (on-chip quantizer)."""
        n = self.cfg.n
        items = []
        for engine, i, slot, row, c in self.word_addresses(mat):
            values = w_padded16[row, c * n:(c + 1) * n]
            items.append(pack_struct(
                self.row_layout, engine=engine, row=i, slot=slot,
                values=pack_lanes(values.view(np.uint16)), rounding=rounding.value,
                static=code is not None, static_exponent=code or 0))
            self.mirror[engine, i, slot] = int(mat.words[row, c])
        self.rng.shuffle(items)
        self.w.send(items)
        self.expect_counts["weight_saturations"] += mat.weight_saturated
        self.expect_counts["weight_nonfinite"] += mat.weight_nonfinite

    def random_matrix(self, big_r=None, big_c=None, exponent_mode=None):
        """A random logical matrix (shape not a multiple of N in general), quantized."""
        c, n = self.cfg, self.cfg.n
        rng = self.rng
        if big_c is None:
            big_c = int(rng.integers(1, c.max_col_tiles + 1))
        g = -(-big_c // c.tiles)
        if big_r is None:
            big_r = int(rng.integers(1, max(1, min(4, c.mrf_depth // g)) + 1))
        rows = int(rng.integers((big_r - 1) * n + 1, big_r * n + 1))
        cols = int(rng.integers((big_c - 1) * n + 1, big_c * n + 1))
        w16 = self.stim.values((rows, cols))
        rounding = Rounding(int(rng.integers(0, 2)))
        mode = exponent_mode or rng.choice(["dynamic", "dynamic", "static", "tiny"])
        exponent = None
        if mode == "static":
            # A static exponent per block near the block's own, within what the MVM takes.
            dyn, *_ = self.quantize_matrix(w16, rounding)
            e = dyn.exponents.astype(np.int64) + rng.integers(-2, 3, dyn.exponents.shape)
            exponent = np.clip(e, -127, 15)
        elif mode == "tiny":
            # Exponents below -24: tile products shift right (floor) on the accumulator.
            exponent = rng.integers(-127, 16, (big_r * n, big_c))
        t, br, bc = self.quantize_matrix(w16, rounding, exponent)
        return w16, t, br, bc, rows, cols

    # --- products -----------------------------------------------------------------------

    def product(self, mat: Matrix, *, x_bits=None, rounding=None, static_code="random",
                k=None) -> Product:
        rng = self.rng
        if x_bits is None:
            x_bits = self.stim.vector(mat.cols).view(np.uint16)
        if rounding is None:
            rounding = Rounding(int(rng.integers(0, 2)))
        if static_code == "random":
            if rng.random() < 0.4:
                dyn = bfp.quantize(bfp.split_vector(x_bits.view(np.float16), self.cfg.n)
                                   .astype(np.float32), self.cfg.n, 4,
                                   nonfinite="saturate").exponents.max()
                static_code = int(np.clip(dyn + E8M0_BIAS + rng.integers(-6, 3), 0,
                                          MAX_EXPONENT_CODE))
                if rng.random() < 0.2:
                    static_code = int(rng.integers(0, MAX_EXPONENT_CODE + 1))
            else:
                static_code = None
        if k is None:
            k = int(rng.integers(1, 65)) if rng.random() < 0.3 else int(rng.integers(1, 20))
        p = Product(mat, np.asarray(x_bits, np.uint16), rounding, static_code, k)
        self.model(p)
        return p

    def model(self, p: Product):
        c, mat = self.cfg, p.matrix
        r = model_mvm(p.x_bits, mat.codes[:mat.rows], mat.mantissas[:mat.rows], n=c.n,
                      mantissa_bits_v=c.mantissa_bits_v, mantissa_bits_w=c.mantissa_bits_w,
                      rounding=p.rounding, static_exponent_code=p.static_code,
                      # A build without the check counts no narrow events (None).
                      narrow_width=p.k if c.narrow_check else None)
        expect = np.zeros(mat.big_r * c.n, np.uint16)
        expect[:mat.rows] = r.out_bits
        p.expect = expect
        p.counts = {
            "vector_saturations": r.vector_saturated,
            "vector_nonfinite": r.vector_nonfinite,
            "narrow_events": r.narrow.total,
            "output_saturations": r.output_saturated,
        }

    def command_word(self, base, big_r, big_c, rounding=Rounding.NEAREST_EVEN,
                     static_code=None, k=64):
        return pack_struct(self.cmd_layout, base=base, row_tiles=big_r, col_tiles=big_c,
                           rounding=rounding.value, static=static_code is not None,
                           static_exponent=static_code or 0, narrow_width=k)

    def send_products(self, products):
        """Queue commands and their vectors (the vectors as one independent stream)."""
        n = self.cfg.n
        cmds, xs = [], []
        for p in products:
            mat = p.matrix
            cmds.append(self.command_word(mat.base, mat.big_r, mat.big_c, p.rounding,
                                          p.static_code, p.k))
            padded = np.zeros(mat.big_c * n, np.uint16)
            padded[:mat.cols] = p.x_bits
            xs += [pack_lanes(v) for v in padded.reshape(mat.big_c, n)]
            self.products.append(p)
            for name, v in p.counts.items():
                self.expect_counts[name] += v
        self.cmd.send(cmds)
        self.x.send(xs)

    async def check_products(self):
        """Wait for every queued product's outputs, compare them with the model."""
        n = self.cfg.n
        total = sum(p.matrix.big_r for p in self.products)
        await self.y.wait_for(total, CLOCK_NS,
                              timeout_cycles=60 * sum(p.matrix.big_r * p.matrix.big_c
                                                      for p in self.products[self.checked:])
                              + 5000)
        await self.wait_idle()
        assert len(self.y.items) == total, f"{len(self.y.items)} outputs for {total}"
        index = sum(p.matrix.big_r for p in self.products[:self.checked])
        for j, p in enumerate(self.products[self.checked:], self.checked):
            got = np.concatenate([unpack_lanes(w, n) for w in
                                  self.y.items[index:index + p.matrix.big_r]])
            index += p.matrix.big_r
            bad = np.flatnonzero(got != p.expect)
            if bad.size:
                mat = p.matrix
                self.log.error(
                    "product %d: %dx%d (R=%d C=%d base=%d) rounding=%s static=%s k=%d: "
                    "rows %s got %s expected %s", j, mat.rows, mat.cols, mat.big_r,
                    mat.big_c, mat.base, p.rounding.name, p.static_code, p.k,
                    bad[:8].tolist(), [hex(v) for v in got[bad[:8]]],
                    [hex(v) for v in p.expect[bad[:8]]])
                self.dump_failure(p, got)
            assert not bad.size, f"product {j}: {bad.size} output lanes differ"
        self.checked = len(self.products)
        self.check_counters()

    def dump_failure(self, p: Product, got):
        path = os.path.join(os.getcwd(), f"failure_{len(self.products)}.npz")
        mat = p.matrix
        np.savez(path, x_bits=p.x_bits, codes=mat.codes, mantissas=mat.mantissas,
                 rows=mat.rows, cols=mat.cols, rounding=p.rounding.value,
                 static_code=-1 if p.static_code is None else p.static_code, k=p.k,
                 got=got, expect=p.expect)
        self.log.error("inputs written to %s", path)

    def counters(self):
        return {name: getattr(self.dut, name).value.to_unsigned() for name in COUNTERS}

    def check_counters(self):
        cmax = (1 << self.cfg.counter_bits) - 1
        want = {k: min(v, cmax) for k, v in self.expect_counts.items()}
        got = self.counters()
        assert got == want, f"counters {got}, model {want}"

    async def clear_counters(self):
        self.dut.clear.value = 1
        await RisingEdge(self.dut.clk)
        self.dut.clear.value = 0
        await RisingEdge(self.dut.clk)
        self.expect_counts = dict.fromkeys(COUNTERS, 0)
        self.check_counters()

    async def wait_idle(self, limit=100000, *, vectors=True):
        """Wait until every source is empty (``x_stream`` too unless ``vectors`` is
        false) and the MVM is no longer busy."""
        edge = RisingEdge(self.dut.clk)
        for _ in range(limit):
            if (self.cmd.idle and (self.x.idle or not vectors) and self.w.idle
                    and self.mrf_w.idle and self.rreq.idle and not self.dut.busy.value):
                await edge
                if not self.dut.busy.value:
                    return
            await edge
        raise AssertionError("MVM still busy")

    async def read_mrf(self, addresses):
        """Read MRF words back; returns their integers."""
        start = len(self.resp.items)
        self.rreq.send([pack_struct(self.addr_layout, engine=e, row=r, slot=s)
                        for e, r, s in addresses])
        await self.resp.wait_for(start + len(addresses), CLOCK_NS,
                                 timeout_cycles=40 * len(addresses) + 3000)
        return self.resp.items[start:]

    async def check_mrf(self, addresses=None):
        """Read back words (default: all the bench wrote) and compare with the mirror."""
        if addresses is None:
            addresses = sorted(self.mirror)
        got = await self.read_mrf(addresses)
        for a, g in zip(addresses, got):
            assert g == self.mirror[a], (f"MRF word {a}: read {g:#x}, "
                                         f"expected {self.mirror[a]:#x}")


# --- tests ----------------------------------------------------------------------------------

async def _random_batches(tb: TB, products_total: int):
    """Batches: load a few matrices (packed words, random order), then run several
    products on them back to back (ping-pong), settings changing from one to the next."""
    done = 0
    while done < products_total:
        mats = []
        tb.next_base = int(tb.rng.integers(0, tb.cfg.mrf_depth // 2))
        for _ in range(int(tb.rng.integers(1, 4))):
            w16, t, br, bc, rows, cols = tb.random_matrix()
            if not tb.fits(br, bc):
                if mats:
                    break
                tb.next_base = 0
            mats.append(tb.place(rows, cols, t, br, bc))
        for mat in mats:
            tb.load_packed(mat)
        await tb.mrf_w.drained()
        batch = [tb.product(mats[int(tb.rng.integers(0, len(mats)))])
                 for _ in range(int(tb.rng.integers(1, 6)))]
        tb.send_products(batch)
        await tb.check_products()
        done += len(batch)
    return done


@cocotb.test()
@cocotb.parametrize(stalls=STALLS)
async def test_random_products(dut, stalls):
    """Random shapes (not multiples of N), values, exponents, rounding and k."""
    tb = TB(dut, stalls=stalls)
    await tb.reset()
    start = time.perf_counter()
    count = await _random_batches(tb, int(os.environ.get("MVM_PRODUCTS", "60")))
    tb.log.info("%d random products in %.1f s", count, time.perf_counter() - start)
    await tb.check_mrf()
    await tb.clear_counters()


@cocotb.test()
@cocotb.parametrize(stalls=STALLS)
async def test_corner_products(dut, stalls):
    """1x1 tiles, the largest product the MRF holds, all zero, +-65504 everywhere
    (saturating outputs), subnormals only, both rounding modes, k = 1 and 64."""
    tb = TB(dut, stalls=stalls)
    await tb.reset()
    c, n = tb.cfg, tb.cfg.n
    stim = tb.stim

    def mat_from(w16, exponent=None, base=0, rounding=Rounding.NEAREST_EVEN):
        tb.next_base = base
        t, br, bc = tb.quantize_matrix(w16, rounding, exponent)
        return tb.place(w16.shape[0], w16.shape[1], t, br, bc)

    # 1 x 1 logical matrix (one tile, one lane).
    one = mat_from(stim.fp16([[1.5]]))
    tb.load_packed(one)
    await tb.mrf_w.drained()
    tb.send_products([tb.product(one, x_bits=stim.fp16([2.0]).view(np.uint16), k=k)
                      for k in (1, 3, 64)])
    tb.send_products([tb.product(one, x_bits=stim.fp16([-0.375]).view(np.uint16),
                                 rounding=r, static_code=s)
                      for r in Rounding for s in (None, 0, 100, 127, 142)])
    await tb.check_products()

    # The largest product the MRF holds: C = max_col_tiles, R*G = mrf_depth.
    g = c.col_groups_max
    big_r = c.mrf_depth // g
    rows, cols = big_r * n, c.max_col_tiles * n
    for kind in ("wide", "scaled_rows", "extreme"):
        big = mat_from(stim.values((rows, cols), kind))
        tb.load_packed(big)
        await tb.mrf_w.drained()
        tb.send_products([tb.product(big, x_bits=stim.values((cols,), kind2)
                                     .view(np.uint16), k=k)
                          for kind2, k in (("wide", 64), ("normal", 12), ("extreme", 1))])
        await tb.check_products()

    # All zero: matrix and vector; zero vector on a non-zero matrix.
    zero = mat_from(np.zeros((2 * n - 1, 3 * n - 2), np.float16))
    tb.load_packed(zero)
    await tb.mrf_w.drained()
    tb.send_products([
        tb.product(zero, x_bits=np.zeros(3 * n - 2, np.uint16), k=1),
        tb.product(zero, x_bits=stim.values((3 * n - 2,), "wide").view(np.uint16), k=1),
        tb.product(zero, x_bits=np.zeros(3 * n - 2, np.uint16), static_code=0, k=1),
    ])
    nz = mat_from(stim.values((2 * n - 1, 3 * n - 2), "normal"), base=10)
    tb.load_packed(nz)
    await tb.mrf_w.drained()
    tb.send_products([tb.product(nz, x_bits=np.zeros(3 * n - 2, np.uint16), k=1)])
    await tb.check_products()

    # +-65504 everywhere: saturating outputs, and the largest narrow values.
    cols = c.max_col_tiles * n
    for signs in ("same", "mixed"):
        w = np.full((2 * n, cols), 65504.0)
        x = np.full(cols, 65504.0)
        if signs == "mixed":
            w *= tb.rng.choice([-1.0, 1.0], w.shape)
        hot = mat_from(stim.fp16(w))
        tb.load_packed(hot)
        await tb.mrf_w.drained()
        tb.send_products([tb.product(hot, x_bits=stim.fp16(s * x).view(np.uint16), k=k,
                                     static_code=None)
                          for s, k in ((1, 64), (-1, 40), (1, 8))])
        await tb.check_products()
    assert tb.expect_counts["output_saturations"] > 0

    # Subnormal weights and vectors: exponents -24 .. -15, exact accumulation at the LSB.
    sub = mat_from(stim.values((n + 3, 2 * n + 1), "subnormal"))
    tb.load_packed(sub)
    await tb.mrf_w.drained()
    tb.send_products([tb.product(sub, x_bits=stim.values((2 * n + 1,), "subnormal")
                                 .view(np.uint16), rounding=r)
                      for r in Rounding])
    await tb.check_products()

    # Non-finite vector inputs.
    tb.send_products([tb.product(sub, x_bits=np.array(
        [0x7C00, 0xFC00, 0x7E00, 0x3C00] + [0x0001] * (2 * n - 3), np.uint16))])
    await tb.check_products()
    assert tb.expect_counts["vector_nonfinite"] > 0
    await tb.check_mrf()


@cocotb.test()
@cocotb.parametrize(stalls=STALLS)
async def test_matrix_quantizer(dut, stalls):
    """FP16 weights through ``w_stream``: the MRF then holds exactly ``host.numerics.bfp.pack``
    of ``host.numerics.bfp.quantize`` (read back byte for byte); products on them are exact;
    the matrix-quantizer counters follow the model."""
    tb = TB(dut, stalls=stalls)
    await tb.reset()
    c, n = tb.cfg, tb.cfg.n
    for trial in range(4):
        w16, _, br, bc, rows, cols = tb.random_matrix()
        rounding = Rounding(trial % 2)
        code = None
        if trial >= 2:
            code = int(tb.rng.integers(E8M0_BIAS - 10, MAX_EXPONENT_CODE + 1))
        if trial == 3:
            # +-65504 needs block exponent 15; any code below that saturates it. Put one
            # in, so that a small random shape cannot leave the counter at zero.
            code = min(code, MAX_EXPONENT_CODE - 1)
            w16 = tb.stim.values((rows, cols), "extreme")
            w16[0, 0] = -65504.0
        padded = np.zeros((br * n, bc * n), np.float16)
        padded[:rows, :cols] = w16
        if trial == 1:
            # Non-finite weights: counted; inf becomes +-65504, NaN 0 (numerics 2.5).
            # A 1 x 1 logical matrix has one element, so the NaN then goes to (0, 1), a
            # padding element: the quantizer sees and counts all of `padded`.
            padded[0, 0] = np.inf
            padded[(rows - 1, cols - 1) if rows * cols > 1 else (0, 1)] = np.nan
        exponent = None if code is None else code - E8M0_BIAS
        t = bfp.quantize(padded, n, c.mantissa_bits_w, rounding, exponent,
                         nonfinite="saturate")
        tb.next_base = 0 if not tb.fits(br, bc) else tb.next_base
        mat = tb.place(rows, cols, t, br, bc)
        tb.load_fp16(mat, padded, rounding, code)
        await tb.w.drained()
        await tb.wait_idle()
        addresses = [(e, i, s) for e, i, s, _, _ in tb.word_addresses(mat)]
        got = await tb.read_mrf(addresses)
        want = [int(mat.words[row, cc]) for _, _, _, row, cc in tb.word_addresses(mat)]
        assert got == want, f"trial {trial}: MRF words differ from host.numerics.bfp.pack"
        tb.check_counters()
        tb.send_products([tb.product(mat) for _ in range(2)])
        await tb.check_products()
    assert tb.expect_counts["weight_nonfinite"] == 2
    assert tb.expect_counts["weight_saturations"] > 0
    await tb.clear_counters()


async def _timed_product(tb: TB, mat: Matrix):
    """Run one product alone with everything available; return cycles from the command
    transfer to the last output transfer."""
    p = tb.product(mat, k=64)
    c0, y0 = len(tb.cmd_in.cycles), len(tb.y.cycles)
    tb.send_products([p])
    await tb.check_products()
    return tb.y.cycles[y0 + mat.big_r - 1] - tb.cmd_in.cycles[c0]


@cocotb.test()
async def test_cycles(dut):
    """``cycles = C + R*G + LATENCY`` for one product, and back-to-back products at
    ``max(R*G, C + 1)`` cycles each (``docs/mvm.md``)."""
    tb = TB(dut, stalls=False)
    await tb.reset()
    c, n = tb.cfg, tb.cfg.n
    shapes = [(1, 1), (1, c.max_col_tiles), (3, 1), (2, 3), (4, c.max_col_tiles), (1, 2),
              (2, 1), (4, 1), (5, 1), (6, 1), (8, 1), (2, 2), (3, 2), (4, 2), (5, 2),
              (2, 4), (3, 4), (4, 4), (6, 4), (2, 6), (4, 6), (6, 6), (8, 6)]
    shapes = [(r, cc) for r, cc in shapes if c.slots_needed(r, cc) <= c.mrf_depth]
    shapes = shapes[:int(os.environ.get("MVM_CYCLE_SHAPES", "0")) or len(shapes)]
    shapes.append((c.mrf_depth // c.col_groups_max, c.max_col_tiles))
    for big_r, big_c in shapes:
        tb.next_base = 0
        w16 = tb.stim.values((big_r * n, big_c * n), "normal")
        t, br, bc = tb.quantize_matrix(w16)
        mat = tb.place(big_r * n, big_c * n, t, br, bc)
        tb.load_packed(mat)
        await tb.mrf_w.drained()
        await tb.wait_idle()
        g = -(-big_c // c.tiles)
        cycles = await _timed_product(tb, mat)
        want = big_c + big_r * g + tb.latency
        tb.log.info("R=%d C=%d G=%d: %d cycles (formula %d)", big_r, big_c, g, cycles, want)
        if not os.environ.get("MVM_CYCLES_REPORT"):
            assert cycles == want, f"R={big_r} C={big_c}: {cycles} cycles, formula {want}"

        # Back to back: the steady-state period between the last outputs of consecutive
        # products.
        count = 6
        y0 = len(tb.y.cycles)
        tb.send_products([tb.product(mat, k=64) for _ in range(count)])
        await tb.check_products()
        ends = [tb.y.cycles[y0 + (j + 1) * big_r - 1] for j in range(count)]
        periods = np.diff(ends)[2:]
        period = max(big_r * g, big_c + 1)
        tb.log.info("R=%d C=%d: back-to-back periods %s (formula %d)", big_r, big_c,
                    np.diff(ends).tolist(), period)
        if not os.environ.get("MVM_CYCLES_REPORT"):
            assert (periods == period).all(), f"periods {periods}, formula {period}"


@cocotb.test()
async def test_errors(dut):
    """Bad commands and bad MRF words set ``error``, consume nothing, produce nothing
    and leave the MRF as it was; ``error_clear`` clears the flag."""
    tb = TB(dut, stalls=False)
    await tb.reset()
    c, n = tb.cfg, tb.cfg.n
    w16, t, br, bc, rows, cols = tb.random_matrix(big_r=2, big_c=min(3, c.max_col_tiles))
    tb.next_base = 1
    mat = tb.place(rows, cols, t, br, bc)
    tb.load_packed(mat)
    await tb.mrf_w.drained()
    await tb.wait_idle()

    async def expect_error(what):
        await tb.wait_idle(vectors=False)
        assert dut.error.value == 1, f"{what}: error not set"
        dut.error_clear.value = 1
        await RisingEdge(dut.clk)
        dut.error_clear.value = 0
        await RisingEdge(dut.clk)
        assert dut.error.value == 0, f"{what}: error_clear did not clear"

    cmd_fields = command_layout(c)
    c_max_field = (1 << dict(cmd_fields)["col_tiles"].width) - 1
    g = -(-mat.big_c // c.tiles)
    bad_commands = [
        ("C = 0", tb.command_word(0, 1, 0)),
        ("R = 0", tb.command_word(0, 0, 1)),
        ("k = 0", tb.command_word(0, 1, 1, k=0)),
        ("k = 65", tb.command_word(0, 1, 1, k=65)),
        ("static code 143", tb.command_word(0, 1, 1, static_code=143)),
        ("static code 255", tb.command_word(0, 1, 1, static_code=255)),
        ("slots past the end", tb.command_word(c.mrf_depth - 1, 1, c.max_col_tiles)
         if c.col_groups_max > 1 else tb.command_word(c.mrf_depth - 1, 2, 1)),
        ("slots past the end (R)", tb.command_word(0, c.mrf_depth // g + 1, mat.big_c)),
    ]
    if c_max_field > c.max_col_tiles:
        bad_commands.append(("C > max_col_tiles", tb.command_word(0, 1, c.max_col_tiles + 1)))
    # A vector waits on x_stream the whole time: a dropped command must not take it.
    x_word = pack_lanes(np.full(n, 0x3C00, np.uint16))
    tb.x.send([x_word])
    for what, word in bad_commands:
        tb.cmd.send([word])
        await tb.cmd.drained()
        await ClockCycles(dut.clk, 20)
        assert tb.x.sent == 0, f"{what}: a vector was consumed"
        assert not tb.y.items, f"{what}: an output appeared"
        await expect_error(what)
    # Bad MRF words: exponent code above 142, or 0xFF, through mrf_w; a static code above
    # 142 through the matrix quantizer; an engine or slot that does not exist.
    engine, i, slot, row, cc = tb.word_addresses(mat)[0]
    good = int(mat.words[row, cc])
    bad_words = [("code 143", (good & ~0xFF) | 143), ("code 0xFF", good | 0xFF)]
    for what, word in bad_words:
        tb.mrf_w.send([pack_struct(tb.word_layout, engine=engine, row=i, slot=slot,
                                   block=word)])
        await tb.mrf_w.drained()
        await expect_error(f"mrf_w {what}")
    if (1 << dict(tb.word_layout)["engine"].width) > c.tiles:
        tb.mrf_w.send([pack_struct(tb.word_layout, engine=c.tiles, row=0, slot=0,
                                   block=good)])
        await tb.mrf_w.drained()
        await expect_error("mrf_w engine out of range")
    if (1 << dict(tb.word_layout)["slot"].width) > c.mrf_depth:
        tb.mrf_w.send([pack_struct(tb.word_layout, engine=0, row=0, slot=c.mrf_depth,
                                   block=good)])
        await tb.mrf_w.drained()
        await expect_error("mrf_w slot out of range")
    # A read-back of an engine or slot that does not exist answers, and sets error.
    if (1 << dict(tb.addr_layout)["engine"].width) > c.tiles:
        assert await tb.read_mrf([(c.tiles, 0, 0)]) == [0]
        await expect_error("mrf_r_req engine out of range")
    if (1 << dict(tb.addr_layout)["slot"].width) > c.mrf_depth:
        assert await tb.read_mrf([(0, 0, c.mrf_depth)]) == [0]
        await expect_error("mrf_r_req slot out of range")
    tb.w.send([pack_struct(tb.row_layout, engine=engine, row=i, slot=slot,
                           values=pack_lanes(np.full(n, 0x3C00, np.uint16)),
                           rounding=0, static=1, static_exponent=143)])
    await tb.w.drained()
    await expect_error("w_stream static code 143")
    # Nothing changed: the MRF reads back as written, and a good command then runs,
    # taking the waiting vector first.
    await tb.check_mrf()
    assert dut.error.value == 0
    x_bits = tb.stim.vector(cols).view(np.uint16).copy()
    x_bits[:n] = 0x3C00                          # the vector already waiting
    p = tb.product(mat, x_bits=x_bits)
    tb.products.append(p)
    for name, v in p.counts.items():
        tb.expect_counts[name] += v
    tb.cmd.send([tb.command_word(mat.base, mat.big_r, mat.big_c, p.rounding,
                                 p.static_code, p.k)])
    rest = np.zeros((mat.big_c - 1) * n, np.uint16)
    rest[:cols - n] = x_bits[n:]
    tb.x.send([pack_lanes(v) for v in rest.reshape(-1, n)])
    await tb.check_products()
    assert dut.error.value == 0


@cocotb.test()
async def test_clear(dut):
    """``clear`` zeroes every counter, also in the middle of a product."""
    tb = TB(dut, stalls=False)
    await tb.reset()
    # +-65504 everywhere (one +inf): every quantizer value rounds past the top code,
    # every output saturates, k = 1 makes narrow events; one inf counts as non-finite.
    n = tb.cfg.n
    padded = np.full((2 * n, 2 * n), 65504.0, np.float16)
    padded[0, 0] = np.inf
    t, br, bc = tb.quantize_matrix(padded)
    mat = tb.place(2 * n, 2 * n, t, br, bc, base=0)
    tb.load_fp16(mat, padded, Rounding.NEAREST_EVEN, None)
    await tb.w.drained()
    x_bits = np.full(2 * n, 0x7BFF, np.uint16)
    x_bits[0] = 0x7C00
    p = tb.product(mat, x_bits=x_bits, static_code=None, k=1)
    tb.send_products([p])
    await tb.check_products()
    counted = tb.counters()
    if not tb.cfg.narrow_check:
        # No check built: the product that makes narrow events with one (the model's
        # count at k = 1) leaves the counter at 0, and check_products compared that.
        with_check = model_mvm(x_bits, mat.codes[:mat.rows], mat.mantissas[:mat.rows],
                               n=n, mantissa_bits_v=tb.cfg.mantissa_bits_v,
                               mantissa_bits_w=tb.cfg.mantissa_bits_w, narrow_width=1)
        assert with_check.narrow.total > 0 and counted.pop("narrow_events") == 0
    assert all(counted.values()), f"every counter should count: {tb.counters()}"
    await tb.clear_counters()
    assert not any(tb.counters().values())


@cocotb.test(skip=not os.environ.get("MVM_RESULTS"))
async def test_tile_independence(dut):
    """A fixed set of products, the same on every build whatever its T (every shape has
    R*C <= mrf_depth, so it fits even with T = 1); outputs and counter totals go to
    ``MVM_RESULTS`` so that builds with different T can be compared bit for bit."""
    tb = TB(dut, stalls=True, seed=20260101)
    await tb.reset()
    c, n = tb.cfg, tb.cfg.n
    rng = np.random.default_rng(20260101)       # independent of the build
    stim = Stimulus(rng)
    for _ in range(int(os.environ.get("MVM_MATRICES", "12"))):
        big_c = int(rng.integers(1, c.max_col_tiles + 1))
        big_r = int(rng.integers(1, max(1, c.mrf_depth // big_c) + 1))
        rows = int(rng.integers((big_r - 1) * n + 1, big_r * n + 1))
        cols = int(rng.integers((big_c - 1) * n + 1, big_c * n + 1))
        w16 = stim.values((rows, cols))
        exponent = None
        if rng.random() < 0.3:
            exponent = rng.integers(-127, 16, (big_r * n, big_c))
        t, br, bc = tb.quantize_matrix(w16, Rounding(int(rng.integers(0, 2))), exponent)
        mat = tb.place(rows, cols, t, br, bc, base=0)
        tb.load_packed(mat)
        await tb.mrf_w.drained()
        products = []
        for _ in range(3):
            static = None
            if rng.random() < 0.4:
                static = int(rng.integers(E8M0_BIAS - 20, MAX_EXPONENT_CODE + 1))
            products.append(tb.product(mat, x_bits=stim.vector(cols).view(np.uint16),
                                       rounding=Rounding(int(rng.integers(0, 2))),
                                       static_code=static, k=int(rng.integers(1, 65))))
        tb.send_products(products)
        await tb.check_products()
    results = {
        "outputs": [f"{w:x}" for w in tb.y.items],
        "counters": tb.counters(),
        "products": len(tb.products),
    }
    path = os.environ.get("MVM_RESULTS")
    if path:
        with open(path, "w") as f:
            json.dump(results, f)
