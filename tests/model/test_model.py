"""The reference core (``host/model/core.py``): host access, chain semantics (products,
windows, iterations, reductions, quantizer registers), counters, illegal programs and
the sticky error, timing-model constants against the gateware's MVM formula."""

import numpy as np
import pytest

from host.numerics import bfp
from host.compiler.asm import assemble
from host.spec.config import NpuConfig
from host.spec.formats import Rounding
from host.spec.isa import ErrorCode, Space, mrf_address
from host.model.core import NpuError, NpuModel, mvm_latency
from host.numerics.fp16 import binary
from host.numerics.mvm import mvm, quantize_fp16
from host.numerics.reduction import reduce
from host.numerics.unary import unary

CFG = NpuConfig(n=8, tiles=2, mrf_depth=32, max_col_tiles=8, ivrf_depth=32, vrf_depth=16,
                netq_depth=16, max_length=4, program_depth=64, counter_bits=8)


def f16(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float16)


def bits(x):
    return np.asarray(x, np.float16).view(np.uint16)


def snapshot(model):
    cfg = model.config
    mem = {s: model.read(s, 0, cfg.ivrf_depth if s is Space.IVRF else cfg.vrf_depth)
           for s in [Space.IVRF] + [Space(v) for v in range(2, 2 + 2 * cfg.mfus)]}
    return (mem, model.read(Space.MRF, 0, cfg.mrf_words), model.counters(),
            model.input_level, model.output_level)


def same(a, b):
    (ma, wa, ca, ia, oa), (mb, wb, cb, ib, ob) = a, b
    return (all(np.array_equal(ma[s], mb[s]) for s in ma) and wa == wb and ca == cb
            and (ia, oa) == (ib, ob))


@pytest.fixture
def model():
    return NpuModel(CFG)


# --- host access ------------------------------------------------------------------------------

def test_vector_write_read(model):
    rng = np.random.default_rng(0)
    data = bits(f16(rng, 3, 8))
    model.write(Space.MULVRF1, 5, data)
    assert np.array_equal(model.read(Space.MULVRF1, 5, 3), data)
    assert np.array_equal(model.read(Space.ASVRF1, 5, 3), np.zeros((3, 8), np.uint16))


@pytest.mark.parametrize("call, code", [
    (lambda m: m.write(Space.IVRF, 31, np.zeros((2, 8), np.uint16)), ErrorCode.ADDRESS_RANGE),
    (lambda m: m.read(Space.ASVRF0, 10, 7), ErrorCode.ADDRESS_RANGE),
    (lambda m: m.read(Space.ASVRF2, 0, 1), ErrorCode.ILLEGAL_FIELD),     # 2 MFUs only
    (lambda m: m.read(Space.NETQ, 0, 1), ErrorCode.ILLEGAL_FIELD),
    (lambda m: m.read(12, 0, 1), ErrorCode.ILLEGAL_FIELD),
    (lambda m: m.write(Space.IVRF, 0, np.zeros((2, 4), np.uint16)), ErrorCode.SIZE_RANGE),
    (lambda m: m.write(Space.IVRF, 0, np.zeros((2, 8), np.float32)), ErrorCode.SIZE_RANGE),
    (lambda m: m.write(Space.MRF, CFG.mrf_words - 1, [0, 0]), ErrorCode.ADDRESS_RANGE),
    (lambda m: m.write(Space.MRF, 0, [1, 143]), ErrorCode.MRF_WORD),       # code 143
    (lambda m: m.write(Space.MRF, 0, [1 << 40]), ErrorCode.MRF_WORD),
    (lambda m: m.write_weights(31, np.zeros((9, 9), np.float16)), ErrorCode.ADDRESS_RANGE),
    (lambda m: m.write_weights(0, np.zeros((8, 72), np.float16)), ErrorCode.SIZE_RANGE),
    (lambda m: m.write_weights(0, np.ones((8, 8), np.float16), static_exponent=143),
     ErrorCode.MRF_WORD),
    (lambda m: m.push_input(np.zeros((17, 8), np.uint16)), ErrorCode.QUEUE_OVERFLOW),
    (lambda m: m.pop_output(1), ErrorCode.QUEUE_UNDERFLOW),
    (lambda m: m.load_program(np.zeros(65, np.uint64)), ErrorCode.PROGRAM_RANGE),
])
def test_host_errors_change_nothing(model, call, code):
    rng = np.random.default_rng(1)
    model.write(Space.IVRF, 0, bits(f16(rng, 32, 8)))
    model.write_weights(0, f16(rng, 12, 20))
    model.push_input(bits(f16(rng, 2, 8)))
    before = snapshot(model)
    with pytest.raises(NpuError) as e:
        call(model)
    assert e.value.code is code
    assert same(before, snapshot(model))
    assert model.error is ErrorCode.NONE


def test_write_weights_matches_host_packer(model):
    """On-chip quantization equals host.numerics.bfp.quantize + pack of every tile row, at the
    place MvmConfig.tile_slot gives; the weight counters count the clamps."""
    rng = np.random.default_rng(2)
    w = f16(rng, 13, 21, scale=4)
    w[0, 0] = np.inf
    assert model.write_weights(3, w, Rounding.NEAREST_AWAY) == (2, 3)
    tiles = bfp.split_matrix(w, 8)          # FP16: inf saturates to 65504 (the device rule)
    for r in range(2):
        for c in range(3):
            engine, slot = CFG.mvm.tile_slot(3, r, c, 3)
            for i in range(8):
                t = bfp.quantize(tiles[r, c, i], 8, CFG.mantissa_bits_w, "nearest-away",
                                 nonfinite="saturate")
                want = int.from_bytes(bfp.pack(t).tobytes(), "little")
                got = model.read(Space.MRF, mrf_address(CFG, engine, i, slot), 1)[0]
                assert got == want, (r, c, i)
    q = quantize_fp16(bfp.split_vector(bits(w), 8), CFG.mantissa_bits_w, "nearest-away")
    counts = model.counters()
    assert counts["weight_saturations"] == min(255, int(q.saturated.sum()))
    assert counts["weight_nonfinite"] == 1


def test_mrf_words_round_trip(model):
    rng = np.random.default_rng(3)
    words = [int(v) for v in rng.integers(0, 1 << 32, 40)]
    words = [(w << 8) | int(c) for w, c in zip(words, rng.integers(0, 143, 40))]
    model.write(Space.MRF, 100, words)
    assert model.read(Space.MRF, 100, 40) == words


def test_queues_and_levels(model):
    v = np.arange(24, dtype=np.uint16).reshape(3, 8)
    model.push_input(v)
    assert (model.input_level, model.output_level) == (3, 0)
    model.load_program(assemble("s_wr rows, 16\nv_rd netq\nv_wr netq\nend_chain\nend"))
    assert model.run().ok
    assert (model.input_level, model.output_level) == (1, 2)
    assert np.array_equal(model.pop_output(2), v[:2])


def test_reset_and_info(model):
    model.write(Space.IVRF, 0, np.ones((1, 8), np.uint16))
    model.push_input(np.ones((1, 8), np.uint16))
    model.load_program(assemble("v_rd netq\nv_wr mrf, 0\nend_chain\nend".replace(
        "mrf, 0", "ivrf, 0")))
    model.reset()
    assert model.read(Space.IVRF, 0, 1).sum() == 0 and model.input_level == 0
    assert model.run().error is ErrorCode.PROGRAM_RANGE       # the program was erased
    info = model.info()
    assert info["n"] == 8 and info["mfus"] == 2 and info["mrf_words"] == CFG.mrf_words
    assert info["unary_ops"] == ["relu", "sigmoid", "tanh", "exp", "recip", "pass"]


# --- chain semantics --------------------------------------------------------------------------

def matrix_blocks(w, n, m):
    rows, cols = w.shape
    c = -(-cols // n)
    padded = np.zeros((-(-rows // n) * n, c * n), np.uint16)
    padded[:rows, :cols] = bits(w)
    q = quantize_fp16(padded.reshape(-1, c, n), m)
    return q.exponent_codes, q.mantissas.reshape(len(padded), c * n)


def test_product_registers_and_counters(model):
    """ROWS/COLS not multiples of N; static exponent, nearest-away and narrow width k
    from the registers reach numerics.mvm; the MVM counters follow."""
    rng = np.random.default_rng(4)
    w, x = f16(rng, 11, 19, scale=3), f16(rng, 19, scale=8)
    model.write_weights(2, w)
    xv = np.zeros((3, 8), np.uint16)
    xv.reshape(-1)[:19] = bits(x)
    xv[2, 3:] = 0x7C00                      # lanes past COLS are not part of the input
    model.write(Space.IVRF, 4, xv)
    model.load_program(assemble("""
        s_wr rows, 11
        s_wr cols, 19
        s_wr rounding, 1
        s_wr q_static, 1
        s_wr q_exponent, 128
        s_wr narrow, 5
        v_rd ivrf, 4
        mv_mul 2
        v_wr asvrf1, 0
        end_chain
        end"""))
    assert model.run().ok
    codes, qw = matrix_blocks(w, 8, CFG.mantissa_bits_w)
    want = mvm(bits(x), codes, qw, n=8, mantissa_bits_v=4, mantissa_bits_w=4,
               rounding=Rounding.NEAREST_AWAY, static_exponent_code=128, narrow_width=5)
    got = model.read(Space.ASVRF1, 0, 2).reshape(-1)
    assert np.array_equal(got, want.out_bits)
    c = model.counters()
    assert c["vector_saturations"] == min(255, want.vector_saturated) > 0
    assert c["narrow_events"] == min(255, want.narrow.total) > 0
    assert c["vector_nonfinite"] == 0


def test_window_iterations_and_inc(model):
    """A 2 x 2 window of 1-vector pixels with pitch 5, iterated 3 times with v_rd_inc,
    mv_mul_inc over 3 matrices, vv_add_inc and v_wr_inc."""
    rng = np.random.default_rng(5)
    img = bits(f16(rng, 20, 8))
    model.write(Space.IVRF, 0, img)
    ws = [f16(rng, 6, 32) for _ in range(3)]
    for k, w in enumerate(ws):
        model.write_weights(4 * k, w)      # 1 x 4 tiles, T = 2: 2 slots; inc 4
    bias = bits(f16(rng, 4, 8))
    model.write(Space.ASVRF0, 0, bias)
    model.load_program(assemble("""
        s_wr rows, 6
        s_wr cols, 5
        s_wr win_w, 2
        s_wr win_h, 2
        s_wr win_pitch, 5
        s_wr iterations, 3
        v_rd_inc ivrf, 1, 2
        mv_mul_inc 0, 4
        vv_add_inc 0, 1
        v_wr_inc mulvrf0, 10, 2
        end_chain
        end"""))
    result = model.run()
    assert result.ok and result.chains == 3
    for i in range(3):
        base = 1 + 2 * i
        patch = img[[base, base + 1, base + 5, base + 6]].copy()
        patch[:, 5:] = 0                    # COLS = 5 valid lanes per pixel
        codes, qw = matrix_blocks(ws[i], 8, 4)
        y = mvm(patch.reshape(-1), codes, qw, n=8, mantissa_bits_v=4, mantissa_bits_w=4)
        want = binary("add", y.out_bits.view(np.float16), bias[i].view(np.float16))
        got = model.read(Space.MULVRF0, 10 + 2 * i, 1)[0]
        assert np.array_equal(got, want.view(np.uint16)), i


def test_reduction_covers_rows_only(model):
    rng = np.random.default_rng(6)
    v = bits(f16(rng, 2, 8))
    v[1, 3:] = 0x7BFF                        # beyond ROWS = 11: ignored by the reduction
    model.write(Space.IVRF, 0, v)
    model.load_program(assemble("""
        s_wr rows, 11
        v_rd ivrf, 0
        v_sum_reduce
        v_exp
        v_wr ivrf, 2
        end_chain
        v_rd ivrf, 0
        v_max_reduce
        v_wr ivrf, 4
        end_chain
        end"""))
    assert model.run().ok
    s = unary("exp", np.float16(reduce("sum", v.reshape(-1)[:11].view(np.float16))))
    assert np.all(model.read(Space.IVRF, 2, 2) == s.view(np.uint16))
    m = reduce("max", v.reshape(-1)[:11].view(np.float16))
    assert np.all(model.read(Space.IVRF, 4, 2) == np.float16(m).view(np.uint16))


def test_in_place_update_and_mfu_counters(model):
    """Writing the range a chain reads is allowed from the same start; the MFU
    counters count per MFU and saturate at counter_bits (8 here)."""
    big = np.full((4, 8), 0x7800, np.uint16)                   # 32768
    model.write(Space.IVRF, 0, big)
    model.write(Space.ASVRF0, 0, big)
    model.write(Space.ASVRF1, 0, np.full((4, 8), 0x7C00, np.uint16))   # +inf
    model.load_program(assemble("""
        s_wr rows, 32
        s_wr iterations, 9
        v_rd ivrf, 0
        vv_add 0
        vv_a_sub_b 0
        v_wr ivrf, 0
        end_chain
        end"""))
    assert model.run().ok
    c = model.counters()
    # Iteration 1: 32768 + 32768 = inf on 32 lanes (MFU0); inf - inf (ASVRF1) = NaN
    # created in MFU1 (32). Later iterations read the NaNs back: propagated, not counted.
    assert c["mfu0_overflow"] == 32 and c["mfu1_nan_created"] == 32
    assert np.all(model.read(Space.IVRF, 0, 4) == 0x7E00)
    model.clear_counters()
    model.write(Space.IVRF, 0, big)
    model.write(Space.ASVRF1, 0, np.full((4, 8), 0x7C00, np.uint16))
    model.load_program(assemble("""
        s_wr rows, 32
        s_wr iterations, 9
        v_rd ivrf, 0
        vv_add 0
        v_wr ivrf, 4
        end_chain
        end"""))
    model.run()
    assert model.counters()["mfu0_overflow"] == 255               # 9 x 32 saturates


# --- illegal programs -------------------------------------------------------------------------

# Each program follows a legal first chain (s_wr rows, 8; IVRF[0] -> exp -> IVRF[31]).
# Lines are encoded one by one, without the assembler's structure check; "word X" is a
# raw instruction word.
VV5 = 4 | (5 << 9) | (3 << 32)                  # vv with BinaryOp code 5 (unassigned)
ILLEGAL = {
    "unassigned opcode": ("word 0x1f", ErrorCode.ILLEGAL_OPCODE),
    "erased word": ("word 0", ErrorCode.ILLEGAL_OPCODE),
    "reserved bits": (f"word {(1 << 14) | 9}", ErrorCode.ILLEGAL_FIELD),
    "vv code 5": (f"v_rd ivrf, 0\nword {VV5}\nv_wr ivrf, 8\nend_chain\nend",
                  ErrorCode.ILLEGAL_OPCODE),
    "unary not built": ("v_rd ivrf, 0\nv_tanh\nv_wr ivrf, 8\nend_chain\nend",
                        ErrorCode.ILLEGAL_OPCODE),
    "space of a missing MFU": ("v_rd ivrf, 0\nv_wr asvrf2, 0\nend_chain\nend",
                               ErrorCode.ILLEGAL_FIELD),
    "v_wr outside a chain": ("v_wr ivrf, 1\nend", ErrorCode.CHAIN_STRUCTURE),
    "chain without v_wr": ("v_rd ivrf, 1\nend_chain\nend", ErrorCode.CHAIN_STRUCTURE),
    "mv_mul after an op": ("v_rd ivrf, 1\nv_relu\nmv_mul 0\nv_wr ivrf, 8\nend_chain\nend",
                           ErrorCode.CHAIN_STRUCTURE),
    "too many ops": ("v_rd ivrf, 0\nv_relu\nv_exp\nv_pass\nv_wr ivrf, 8\nend_chain\nend",
                     ErrorCode.CHAIN_STRUCTURE),
    "no end": ("s_wr rows, 8", ErrorCode.PROGRAM_RANGE),
    "rows too large": ("s_wr rows, 33\nend", ErrorCode.REGISTER_VALUE),
    "narrow 0": ("s_wr narrow, 0\nend", ErrorCode.REGISTER_VALUE),
    "static exponent too large": ("s_wr q_static, 1\ns_wr q_exponent, 143\nv_rd ivrf, 0\n"
                                  "mv_mul 0\nv_wr ivrf, 8\nend_chain\nend",
                                  ErrorCode.REGISTER_VALUE),
    "read out of range": ("s_wr rows, 32\nv_rd ivrf, 29\nv_wr ivrf, 0\nend_chain\nend",
                          ErrorCode.ADDRESS_RANGE),
    "last iteration out of range": ("s_wr iterations, 5\nv_rd_inc ivrf, 0, 8\n"
                                    "v_wr ivrf, 0\nend_chain\nend", ErrorCode.ADDRESS_RANGE),
    "vv operand out of range": ("s_wr rows, 16\nv_rd ivrf, 0\nvv_mul 15\nv_wr ivrf, 8\n"
                                "end_chain\nend", ErrorCode.ADDRESS_RANGE),
    "mrf out of range": ("s_wr rows, 32\ns_wr cols, 64\nv_rd ivrf, 0\nmv_mul 20\n"
                         "v_wr ivrf, 8\nend_chain\nend", ErrorCode.ADDRESS_RANGE),
    "window too wide": ("s_wr cols, 24\ns_wr win_w, 3\nv_rd ivrf, 0\nmv_mul 0\n"
                        "v_wr ivrf, 8\nend_chain\nend", ErrorCode.SIZE_RANGE),
    "input underflow": ("s_wr rows, 24\nv_rd netq\nv_wr ivrf, 8\nend_chain\nend",
                        ErrorCode.QUEUE_UNDERFLOW),
    "output overflow": ("s_wr rows, 32\ns_wr iterations, 3\nv_rd ivrf, 0\nv_wr netq\n"
                        "end_chain\nend", ErrorCode.QUEUE_OVERFLOW),
    "write ahead of read": ("s_wr rows, 16\nv_rd ivrf, 4\nv_wr ivrf, 5\nend_chain\nend",
                            ErrorCode.HAZARD),
    "two writes overlap": ("s_wr rows, 16\nv_rd ivrf, 0\nv_wr ivrf, 8\nv_wr ivrf, 9\n"
                           "end_chain\nend", ErrorCode.HAZARD),
}
FIRST = "s_wr rows, 8\nv_rd ivrf, 0\nv_exp\nv_wr ivrf, 31\nend_chain"


def encode_lines(text):
    """Words of ``text``, line by line, without the structure check of the assembler."""
    from host.compiler.asm import _parse_line
    return [int(line.split()[1], 0) if line.startswith("word ")
            else _parse_line(line, k).encode()
            for k, line in enumerate(text.splitlines(), 1)]


@pytest.mark.parametrize("name", list(ILLEGAL))
def test_illegal_program(name):
    """The run stops with the sticky error; the failing chain changed nothing (the chain
    before it ran); the device refuses to run until the error is cleared."""
    source, code = ILLEGAL[name]
    cfg = NpuConfig(n=8, tiles=2, mrf_depth=32, max_col_tiles=8, ivrf_depth=32,
                    vrf_depth=16, netq_depth=8, max_length=4, program_depth=64,
                    unary_ops=("relu", "exp", "pass"))
    model = NpuModel(cfg)
    rng = np.random.default_rng(7)
    model.write(Space.IVRF, 0, bits(f16(rng, 32, 8)))
    model.write_weights(0, f16(rng, 9, 9))
    model.push_input(bits(f16(rng, 2, 8)))
    model.load_program(np.array(encode_lines(FIRST + "\n" + source), np.uint64))
    before = snapshot(model)
    result = model.run()
    assert result.error is code, result
    assert model.error is code and result.message
    assert result.chains == 1                 # the first chain ran, nothing after it
    after = snapshot(model)
    ivrf = before[0][Space.IVRF].copy()
    ivrf[31] = unary("exp", ivrf[0].view(np.float16)).view(np.uint16)
    assert np.array_equal(after[0][Space.IVRF], ivrf)
    assert all(np.array_equal(after[0][s], before[0][s]) for s in before[0]
               if s is not Space.IVRF)
    assert after[1] == before[1] and after[2:] == before[2:]
    again = model.run()
    assert again.error is code and again.chains == 0
    model.clear_error()
    assert model.error is ErrorCode.NONE and model.run().error is code


# --- timing -------------------------------------------------------------------------------------

@pytest.mark.parametrize("n, tiles", [(8, 1), (8, 2), (16, 2), (4, 3), (16, 4)])
def test_mvm_latency_matches_gateware(n, tiles):
    from hw.mvm.mvm import latency
    cfg = NpuConfig(n=n, tiles=tiles)
    front, back = mvm_latency(cfg)
    assert front + back == latency(cfg.mvm)


def test_cycles_grow_with_work(model):
    model.load_program(assemble("s_wr rows, 8\nv_rd ivrf, 0\nv_wr ivrf, 8\nend_chain\nend"))
    short = model.run().cycles_predicted
    model.load_program(assemble("s_wr rows, 32\ns_wr iterations, 4\nv_rd ivrf, 0\n"
                                "v_wr ivrf, 8\nend_chain\nend"))
    assert model.run().cycles_predicted > short > 0


def predicted(text, config=CFG):
    model = NpuModel(config)
    model.load_program(assemble(text))
    result = model.run()
    assert result.ok, result.message
    return result.cycles_predicted


def test_mfu_pipeline_drains_between_chains():
    """The MFU pipeline takes a chain only after the previous one has left it
    (``docs/mfu.md`` section 6), so a second independent chain of L vectors through one
    activation costs its L outputs plus the whole fill, 15 edges for one ACT op."""
    chain = "v_rd ivrf, {src}\nv_sigm\nv_wr ivrf, {dst}\nend_chain\n"
    one = predicted("s_wr rows, 32\n" + chain.format(src=0, dst=8) + "end")
    two = predicted("s_wr rows, 32\n" + chain.format(src=0, dst=8)
                    + chain.format(src=16, dst=24) + "end")
    assert two - one >= 4 + 15


def test_writer_takes_a_cycle_per_destination():
    """Each result vector is written to every destination of its chain, one per cycle:
    a second ``v_wr`` costs L more cycles, and one to decode it."""
    head = "s_wr rows, 32\nv_rd ivrf, 0\nv_relu\nv_wr ivrf, 8\n"
    one = predicted(head + "end_chain\nend")
    two = predicted(head + "v_wr asvrf0, 0\nend_chain\nend")
    assert two - one == 4 + 1


def test_back_to_back_products():
    """Independent products follow each other every ``max(R*G, C + 1)`` cycles
    (``docs/mvm.md`` section 7) once the scoreboard's window covers the pipeline: R = 8
    row tiles, C = 8 column tiles on T = 1 engine of N = 8."""
    cfg = NpuConfig(n=8, tiles=1, mrf_depth=64, max_col_tiles=8, ivrf_depth=8,
                    vrf_depth=8, netq_depth=8, max_length=8, program_depth=64)

    def run(iterations):
        return predicted(f"s_wr rows, 64\ns_wr cols, 64\ns_wr iterations, {iterations}\n"
                         "v_rd ivrf, 0\nmv_mul 0\nv_wr asvrf0, 0\nend_chain\nend", cfg)
    r = c = 8
    assert run(5) - run(4) == run(6) - run(5) == max(r * c, c + 1)


def test_read_after_write_waits():
    """A chain that reads what the chain before it writes issues only after that write
    (the scoreboard), later than the same chain reading another range."""
    first = "s_wr rows, 32\nv_rd ivrf, 0\nv_tanh\nv_wr ivrf, 8\nend_chain\n"
    dependent = predicted(first + "v_rd ivrf, 8\nv_relu\nv_wr ivrf, 16\nend_chain\nend")
    independent = predicted(first + "v_rd ivrf, 24\nv_relu\nv_wr ivrf, 16\nend_chain\nend")
    assert dependent > independent
