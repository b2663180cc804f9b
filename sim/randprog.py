"""Random legal programs for soak tests of the model, the assembler and (later) the core.

:func:`random_program` draws, from a seed, a :class:`~host.compiler.programs.Program` of legal
chains: random reads (input queue, InitialVrf, any MFU VRF of the build), optional products
with random logical shapes, windows and matrices, random element-wise, unary and reduction
ops that the build's MFUs (and unit sets) take, with operands in the VRFs they are
allocated to, one to three writes, iterations with
``*_inc`` addressing, and random quantizer registers. Its memory image fills every vector
memory with random FP16 values (a few zeros, subnormals, maxima, infinities and NaNs
among them), so the outputs include the documented non-finite results.

A chain never writes a range that it also reads (other than the MVM's own input) nor
two overlapping ranges, in any iteration, and never pushes more than the output queue
holds, so every program runs to ``end`` without error on the given build.
"""

from __future__ import annotations

import numpy as np

from host.spec.config import NpuConfig
from host.spec.isa import Instruction, Reg, Space, vector_spaces
from host.spec.mfu import MfuOp, MfuUnit, allocate
from host.compiler.programs import Program

__all__ = ["random_fp16", "random_program", "unit_fp16", "lstm_weights", "RANDOM_BUILDS"]

#: Two small builds with the corners random programs should reach: three MFUs, three tile
#: engines, odd mantissa widths, a partial unary set, narrow counters, small memories.
RANDOM_BUILDS = {
    "n8t2m3": NpuConfig(n=8, tiles=2, mrf_depth=256, max_col_tiles=8, ivrf_depth=64,
                        vrf_depth=64, netq_depth=256, max_length=4, mfus=3),
    "n4t3m2": NpuConfig(n=4, tiles=3, mantissa_bits_v=6, mantissa_bits_w=3, mrf_depth=256,
                        max_col_tiles=8, ivrf_depth=48, vrf_depth=32, netq_depth=128,
                        max_length=4, mfus=2, unary_ops=("relu", "exp", "pass"),
                        counter_bits=12),
}


_SPECIALS = np.array([0x0000, 0x8000, 0x0001, 0x83FF, 0x7BFF, 0xFBFF, 0x7C00, 0xFC00,
                      0x7E00, 0x7D01, 0x3C00, 0xBC00], np.uint16)


def random_fp16(rng, shape, specials: float = 0.02) -> np.ndarray:
    """FP16 bit patterns: normal values of random scale, a fraction ``specials`` of them
    special (zeros, subnormals, +-65504, infinities, NaNs)."""
    scale = 2.0 ** rng.integers(-6, 6, size=shape)
    with np.errstate(over="ignore"):
        bits = (rng.standard_normal(shape) * scale).astype(np.float16).view(np.uint16)
    pick = rng.random(shape) < specials
    return np.where(pick, rng.choice(_SPECIALS, size=shape), bits).astype(np.uint16)


class _Gen:
    def __init__(self, config: NpuConfig, rng, specials):
        self.cfg = config
        self.rng = rng
        self.specials = specials
        self.n = config.n
        self.instrs = []
        self.regs = {}
        self.slot = 0
        self.matrices = []
        self.inputs = []
        self.in_room = config.netq_depth
        self.out_room = config.netq_depth
        self.outputs = 0
        self.spaces = list(vector_spaces(config))    # the VRFs the unit sets build

    def depth(self, space):
        return self.cfg.ivrf_depth if space is Space.IVRF else self.cfg.vrf_depth

    def rint(self, lo, hi):
        """Uniform integer in ``[lo, hi]``."""
        return int(self.rng.integers(lo, hi + 1))

    def set(self, reg, value, force=False):
        if force or self.regs.get(reg) != value:
            self.instrs.append(Instruction.s_wr(reg, value))
            self.regs[reg] = value

    def place(self, space, extent, inc, iters):
        """A random start with ``extent`` vectors in every iteration, or None."""
        top = self.depth(space) - extent - (iters - 1) * inc
        return None if top < 0 else self.rint(0, top)

    def chain(self) -> int:
        cfg, n, rng = self.cfg, self.n, self.rng
        # Quantizer registers, now and then (sometimes rewritten with the same value).
        if rng.random() < 0.2:
            self.set(Reg.ROUNDING, self.rint(0, 1), force=rng.random() < 0.3)
        if rng.random() < 0.2:
            static = self.rint(0, 1)
            self.set(Reg.Q_STATIC, static)
            self.set(Reg.Q_EXPONENT, self.rint(112, 142) if static else self.rint(0, 255))
        if rng.random() < 0.2:
            self.set(Reg.NARROW, self.rint(1, 64))
        iters = 1 if rng.random() < 0.7 else self.rint(2, 4)
        length = self.rint(1, min(cfg.max_length, 4))
        rows = self.rint((length - 1) * n + 1, length * n)
        mv = None
        pieces = [(0, length)]
        c_in = length
        if rng.random() < 0.5:
            pix = self.rint(1, 2)
            win_w, win_h = (self.rint(1, 2), self.rint(1, 2)) if rng.random() < 0.3 else (1, 1)
            cols_t = pix * win_w * win_h
            need = cfg.mvm.slots_needed(length, cols_t) if cols_t <= cfg.max_col_tiles else 0
            copies = iters if iters > 1 and rng.random() < 0.5 else 1
            if 0 < need and self.slot + need * copies <= cfg.mrf_depth:
                pitch = self.rint(0, 3 * pix)
                self.set(Reg.COLS, self.rint((pix - 1) * n + 1, pix * n))
                self.set(Reg.WIN_W, win_w)
                self.set(Reg.WIN_H, win_h)
                self.set(Reg.WIN_PITCH, pitch)
                for k in range(copies):
                    w = random_fp16(rng, (rows, cols_t * n), self.specials / 4)
                    self.matrices.append((self.slot + k * need, w))
                mv = Instruction.mv_mul(self.slot, need if copies > 1 else 0)
                self.slot += need * copies
                pieces = [(y * pitch + x * pix, pix) for y in range(win_h) for x in range(win_w)]
                c_in = cols_t
        self.set(Reg.ITERATIONS, iters)
        self.set(Reg.ROWS, rows)
        extent = max(off + cnt for off, cnt in pieces)
        # The read.
        reads = []                       # (space, start, count, inc), not the MVM input
        read = None
        if rng.random() < 0.25 and self.in_room >= c_in * iters:
            read = Instruction.v_rd(Space.NETQ)
            self.in_room -= c_in * iters
            self.inputs.append(random_fp16(rng, (c_in * iters, n), self.specials))
        else:
            for _ in range(10):
                space = self.spaces[self.rint(0, len(self.spaces) - 1)]
                inc = self.rint(1, 3) if iters > 1 and rng.random() < 0.5 else 0
                start = self.place(space, extent, inc, iters)
                if start is not None:
                    read = Instruction.v_rd(space, start, inc)
                    if mv is None:
                        reads.append((space, start, length, inc))
                    break
            if read is None:
                return 0
        # The ops, legal under the allocation rule.
        kinds = []
        for _ in range(self.rint(0, 5)):
            r = rng.random()
            if r < 0.5:
                kinds.append(MfuOp.binary(("add", "a_sub_b", "b_sub_a", "mul", "max")[
                    self.rint(0, 4)], 0))
            elif r < 0.85:
                ops = cfg.unary_ops
                kinds.append(MfuOp.unary(ops[self.rint(0, len(ops) - 1)]))
            else:
                kinds.append(MfuOp.reduce(("max", "sum")[self.rint(0, 1)]))
            try:
                allocate(kinds, cfg.mfus, cfg.unit_sets)
            except ValueError:
                kinds.pop()
                break
        op_instrs = []
        for m, placed in enumerate(allocate(kinds, cfg.mfus, cfg.unit_sets)):
            for op in placed:
                if op.unit in (MfuUnit.ADDSUB, MfuUnit.MUL):
                    space = Space.asvrf(m) if op.unit is MfuUnit.ADDSUB else Space.mulvrf(m)
                    inc = self.rint(1, 2) if iters > 1 and rng.random() < 0.3 else 0
                    start = self.place(space, length, inc, iters)
                    if start is None:
                        return 0
                    reads.append((space, start, length, inc))
                    op_instrs.append(Instruction.vv(op.op, start, inc))
                elif op.unit is MfuUnit.ACT:
                    op_instrs.append(Instruction.unary(op.op))
                else:
                    op_instrs.append(Instruction.reduce(op.op))
        # One to three writes, clear of the reads and of each other in every iteration.
        writes, ranges = [], []
        if rng.random() < 0.3 and self.out_room >= length * iters:
            writes.append(Instruction.v_wr(Space.NETQ))
            self.out_room -= length * iters
            self.outputs += length * iters
        for _ in range(self.rint(0 if writes else 1, 2)):
            for _ in range(10):
                space = self.spaces[self.rint(0, len(self.spaces) - 1)]
                inc = self.rint(1, 3) if iters > 1 and rng.random() < 0.5 else 0
                start = self.place(space, length, inc, iters)
                if start is None:
                    continue
                cand = (space, start, length, inc)
                if not any(_clash(cand, other, iters) for other in reads + ranges):
                    ranges.append(cand)
                    writes.append(Instruction.v_wr(space, start, inc))
                    break
        if not writes:
            writes.append(Instruction.v_wr(Space.NETQ))   # always room: checked below
            if self.out_room < length * iters:
                return 0
            self.out_room -= length * iters
            self.outputs += length * iters
        self.instrs.append(read)
        if mv is not None:
            self.instrs.append(mv)
        self.instrs += op_instrs + writes + [Instruction.end_chain()]
        return 1


def unit_fp16(rng, *shape) -> np.ndarray:
    """float16 values scaled so that a product over the last axis has unit variance."""
    return (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float16)


def lstm_weights(rng, x_len: int, h_len: int) -> dict:
    """Random weights of ``host.compiler.programs.lstm_sequence`` (:func:`unit_fp16`)."""
    w = {f"W_{g}": unit_fp16(rng, h_len, x_len) for g in "fioc"}
    w |= {f"U_{g}": unit_fp16(rng, h_len, h_len) for g in "fioc"}
    return w | {f"b_{g}": unit_fp16(rng, h_len) for g in "fioc"}


def _clash(a, b, iters) -> bool:
    """Do ranges ``(space, start, count, inc)`` overlap in some iteration?"""
    if a[0] is not b[0]:
        return False
    for i in range(iters):
        a0, b0 = a[1] + i * a[3], b[1] + i * b[3]
        if a0 < b0 + b[2] and b0 < a0 + a[2]:
            return True
    return False


def random_program(config: NpuConfig, seed: int, chains: int = 50,
                   specials: float = 0.02) -> Program:
    """A random legal program of ``chains`` chains for ``config``, reproducible from
    ``seed``, with its memory image, matrices and inputs (``Program.outputs`` vectors
    come out)."""
    rng = np.random.default_rng(seed)
    gen = _Gen(config, rng, specials)
    made = tries = 0
    while made < chains and tries < 4 * chains:
        made += gen.chain()
        tries += 1
    gen.instrs.append(Instruction.end())
    prog = Program(config, gen.instrs)
    for space in gen.spaces:
        prog.vectors.append((space, 0, random_fp16(rng, (gen.depth(space), config.n),
                                                   specials)))
    prog.matrices = gen.matrices
    prog.inputs = (np.concatenate(gen.inputs) if gen.inputs
                   else np.zeros((0, config.n), np.uint16))
    prog.outputs = gen.outputs
    prog.refs["chains"] = made
    return prog
