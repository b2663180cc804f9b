"""Soak test of the reference core: at least 10,000 random chains (``sim.randprog``),
each program checked three ways:

* its words disassemble and assemble back to the same words;
* it runs on :class:`host.model.core.NpuModel` to ``end`` without error;
* an independent straightforward re-execution written here (decoded words, the
  ``host.numerics.mvm`` / ``host.numerics.fp16`` / ``host.numerics.unary`` / ``host.numerics.reduction`` primitives, the
  matrices quantized from their FP16 values rather than read from the model's MRF)
  gives the same output queue, the same contents of every vector memory and the same
  counters.

The seed of a failing program is in the assertion message; ``random_program(CONFIG,
seed)`` rebuilds it.
"""

import numpy as np
import pytest

from host.compiler.asm import assemble, disassemble
from host.spec.config import NpuConfig
from host.spec.formats import Rounding
from host.numerics.fp16 import binary_bits, binary_events_bits
from host.spec.isa import REG_DEFAULTS, Opcode, Reg, Space, decode_program, vector_spaces
from host.spec.mfu import MfuOp, MfuUnit, allocate
from host.model.core import NpuModel
from host.numerics.mvm import mvm, quantize_fp16
from sim.randprog import RANDOM_BUILDS, random_program
from host.numerics.reduction import reduce_bits
from host.numerics.unary import unary_bits, unary_events

CONFIGS = dict(RANDOM_BUILDS)
#: A build with per-MFU unit sets (issue 36): REDUCE only in the first MFU, an MFU of
#: activations only (no VRFs), the last without REDUCE; soaked by its own test.
CONFIGS["n8t1m3u"] = NpuConfig(n=8, tiles=1, mrf_depth=128, max_col_tiles=8, ivrf_depth=48,
                               vrf_depth=32, netq_depth=128, max_length=4, mfus=3,
                               unit_sets="addsub+mul+reduce/act/addsub+mul+act")
TOTAL_CHAINS = 10_000
UNIT_SET_CHAINS = 1_500


class Reference:
    """A second, straightforward execution of a program's semantics (``docs/isa.md``)."""

    def __init__(self, cfg: NpuConfig, prog):
        self.cfg = cfg
        n = cfg.n
        self.mem = {Space.IVRF: np.zeros((cfg.ivrf_depth, n), np.uint16)}
        for s in vector_spaces(cfg)[1:]:
            self.mem[s] = np.zeros((cfg.vrf_depth, n), np.uint16)
        for space, addr, data in prog.vectors:
            self.mem[space][addr:addr + len(data)] = data
        self.matrices = {}
        self.counters = {"weight_saturations": 0, "weight_nonfinite": 0,
                         "vector_saturations": 0, "vector_nonfinite": 0,
                         "narrow_events": 0, "output_saturations": 0}
        for m in range(cfg.mfus):
            self.counters[f"mfu{m}_overflow"] = self.counters[f"mfu{m}_nan_created"] = 0
        for slot, w in prog.matrices:
            rows, cols = w.shape
            big_r = -(-rows // n)
            padded = np.zeros((big_r * n, cols), np.uint16)
            padded[:rows] = w
            q = quantize_fp16(padded.reshape(big_r * n, cols // n, n), cfg.mantissa_bits_w)
            self.matrices[slot] = (q.exponent_codes, q.mantissas.reshape(big_r * n, cols))
            self.count("weight_saturations", q.saturated.sum())
            self.count("weight_nonfinite", q.nonfinite.sum())
        self.inq = list(prog.inputs) if prog.inputs is not None else []
        self.outq = []
        self.words = prog.words

    def count(self, name, events):
        self.counters[name] = min((1 << self.cfg.counter_bits) - 1,
                                  self.counters[name] + int(events))

    def run(self):
        n = self.cfg.n
        regs = {r: (n if v is None else v) for r, v in REG_DEFAULTS.items()}
        instrs = decode_program(self.words)
        pc = 0
        while instrs[pc].opcode is not Opcode.END:
            ins = instrs[pc]
            if ins.opcode is Opcode.S_WR:
                regs[ins.func] = ins.operand
                pc += 1
                continue
            end = pc
            while instrs[end].opcode is not Opcode.END_CHAIN:
                end += 1
            body = instrs[pc:end]
            pc = end + 1
            read, rest = body[0], body[1:]
            mv = rest[0] if rest and rest[0].opcode is Opcode.MV_MUL else None
            ops = [i for i in rest if i.opcode in (Opcode.VV, Opcode.V_UNARY, Opcode.V_REDUCE)]
            writes = [i for i in rest if i.opcode is Opcode.V_WR]
            for it in range(regs[Reg.ITERATIONS]):
                self.instance(regs, read, mv, ops, writes, it)

    def instance(self, regs, read, mv, ops, writes, it):
        cfg, n = self.cfg, self.cfg.n
        rows = regs[Reg.ROWS]
        length = -(-rows // n)
        # Addresses of the native vectors this iteration reads.
        if mv is not None:
            pix = -(-regs[Reg.COLS] // n)
            offsets = [y * regs[Reg.WIN_PITCH] + x * pix + p
                       for y in range(regs[Reg.WIN_H]) for x in range(regs[Reg.WIN_W])
                       for p in range(pix)]
        else:
            offsets = list(range(length))
        if read.space is Space.NETQ:
            x = np.array([self.inq.pop(0) for _ in offsets], np.uint16)
        else:
            base = read.operand + it * read.inc
            x = self.mem[read.space][[base + o for o in offsets]].copy()
        if mv is not None:
            valid = regs[Reg.COLS] - (pix - 1) * n
            for v in range(pix - 1, len(x), pix):
                x[v, valid:] = 0
            codes, qw = self.matrices[mv.operand + it * mv.inc]
            static = regs[Reg.Q_EXPONENT] if regs[Reg.Q_STATIC] else None
            res = mvm(x.reshape(-1), codes, qw, n=n, mantissa_bits_v=cfg.mantissa_bits_v,
                      mantissa_bits_w=cfg.mantissa_bits_w, rounding=Rounding(regs[Reg.ROUNDING]),
                      static_exponent_code=static, narrow_width=regs[Reg.NARROW])
            self.count("vector_saturations", res.vector_saturated)
            self.count("vector_nonfinite", res.vector_nonfinite)
            self.count("narrow_events", res.narrow.total)
            self.count("output_saturations", res.output_saturated)
            y = res.out_bits.reshape(length, n)
        else:
            y = x
        # MFU ops, one by one, on the MFU the allocation rule gives.
        mfu_ops = [MfuOp.binary(i.func, 0) if i.opcode is Opcode.VV else
                   MfuOp.unary(i.func) if i.opcode is Opcode.V_UNARY else MfuOp.reduce(i.func)
                   for i in ops]
        where = [m for m, placed in enumerate(allocate(mfu_ops, cfg.mfus, cfg.unit_sets))
                 for _ in placed]
        elements = rows
        for ins, op, m in zip(ops, mfu_ops, where):
            if op.unit in (MfuUnit.ADDSUB, MfuUnit.MUL):
                space = Space.asvrf(m) if op.unit is MfuUnit.ADDSUB else Space.mulvrf(m)
                a = ins.operand + it * ins.inc
                b = self.mem[space][a:a + length]
                ev = binary_events_bits(ins.func, y, b)
                y = binary_bits(ins.func, y, b)
                ovf, nanc = ev.overflow.sum(), ev.nan_created.sum()
            elif op.unit is MfuUnit.ACT:
                o, c = unary_events(ins.func, y, ops=cfg.unary_ops)
                y = unary_bits(ins.func, y, ops=cfg.unary_ops)
                ovf, nanc = o.sum(), c.sum()
            else:
                r = reduce_bits(ins.func, y.reshape(-1)[:elements])
                y = np.full(y.shape, r.value, np.uint16)
                ovf, nanc = r.overflow, r.nan_created
            self.count(f"mfu{m}_overflow", ovf)
            self.count(f"mfu{m}_nan_created", nanc)
        for w in writes:
            if w.space is Space.NETQ:
                self.outq.extend(y)
            else:
                a = w.operand + it * w.inc
                self.mem[w.space][a:a + length] = y


def _soak(name, seeds):
    cfg = CONFIGS[name]
    done = 0
    for seed in seeds:
        prog = random_program(cfg, seed)
        words = prog.words
        assert np.array_equal(assemble(disassemble(words)), words), f"{name} seed {seed}"
        model = NpuModel(cfg)
        result, out = prog.run(model)
        assert result.ok, f"{name} seed {seed}: {result}"
        ref = Reference(cfg, prog)
        ref.run()
        assert np.array_equal(out, np.array(ref.outq, np.uint16).reshape(-1, cfg.n)), \
            f"{name} seed {seed}: output queue"
        for space, data in ref.mem.items():
            assert np.array_equal(model.read(space, 0, len(data)), data), \
                f"{name} seed {seed}: {space.name}"
        assert model.counters() == ref.counters, f"{name} seed {seed}: counters"
        done += result.chains
    return done


def test_soak_10000_chains():
    done = 0
    seed = 0
    while done < TOTAL_CHAINS:
        name = "n8t2m3" if seed % 4 else "n4t3m2"
        done += _soak(name, [seed])
        seed += 1
    print(f"soak: {done} chains, seeds 0..{seed - 1}")


def test_soak_unit_sets():
    """Random programs of a build with unit sets: the ops go where the unit sets put them,
    the VRFs they leave out are never touched (the model refuses them)."""
    done = _soak("n8t1m3u", range(UNIT_SET_CHAINS // 50 + 1))
    assert done >= UNIT_SET_CHAINS


@pytest.mark.parametrize("name", list(CONFIGS))
def test_random_program_is_reproducible(name):
    a = random_program(CONFIGS[name], 1234)
    b = random_program(CONFIGS[name], 1234)
    assert np.array_equal(a.words, b.words)
    assert all(np.array_equal(x[2], y[2]) for x, y in zip(a.vectors, b.vectors))
    assert a.refs["chains"] == 50
