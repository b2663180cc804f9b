"""The bit-exact reference model of the NPU core: the executable specification.

:class:`NpuModel` holds every memory of a core (program, InitialVrf, the MFU VRFs, the
MRF, the network queues), its scalar registers, counters and sticky error flag, and
executes binary programs (:mod:`host.spec.isa`) chain by chain with the bit-exact kernels of
:mod:`host.numerics.mvm` and :mod:`host.spec.mfu`. It also predicts the cycle count of a run from
the build parameters (:class:`Timing`, ``docs/isa.md`` section "Timing model").

The host link (``host.runtime.device``) and the tests drive exactly this API; the gateware and
the model agree bit for bit on every output, memory word and counter.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from host.spec.counters import counter_names
from host.spec.protocol import build_info

from host.numerics import bfp
from host.spec.config import NpuConfig
from host.spec.formats import MAX_EXPONENT_CODE, Rounding, block_bytes, check_int
from host.spec.isa import (
    REG_DEFAULTS, Chain, ErrorCode, Instruction, IsaError, Opcode, Reg, Space, decode,
    chain_mfu_ops, operand_vrf, parse_chain, register_limits, vector_spaces,
)
from host.spec.mfu import MfuUnit, allocate, format_unit_sets
from host.model.mfu import MfuVrfs, run_steps
from host.numerics.mvm import fp16_bits, mvm, prepare_weights, quantize_fp16

__all__ = ["NpuError", "RunResult", "NpuModel", "Timing", "mvm_latency"]

class NpuError(Exception):
    """A refused host request or a device error: ``code`` (ErrorCode) and ``message``."""

    def __init__(self, code: ErrorCode, message: str):
        super().__init__(f"{ErrorCode(code).name}: {message}")
        self.code = ErrorCode(code)
        self.message = message


@dataclass(frozen=True)
class RunResult:
    """What :meth:`NpuModel.run` reports.

    cycles_predicted : predicted cycles from start to ``end`` (or to the error)
    chains : chain instances executed (a chain with ITERATIONS = k counts k)
    instructions : instructions executed (each instruction of a chain once)
    error : ErrorCode of the run (NONE when it reached ``end``)
    pc : index of the ``end`` reached, or of the instruction that failed
    message : what went wrong ('' without error)
    """
    cycles_predicted: int
    chains: int
    instructions: int
    error: ErrorCode
    pc: int
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.error is ErrorCode.NONE


# --- timing model -----------------------------------------------------------------------------

def mvm_latency(config) -> tuple[int, int]:
    """``(front, back)`` of the MVM's cycle formula (``docs/mvm.md`` section 7).

    ``front = 4 + 1 + 8 + 2``: command check, the vector's input register, vector
    quantizer, block FIFO and block write; the sequencer starts ``C + front`` edges
    after the command. ``back =
    compute_latency + 2``: from the last MRF read to the last output vector.
    ``C + R*G + front + back`` is ``hw.mvm.mvm.latency`` plus ``C + R*G``, which
    ``tests/model/test_model.py`` checks.
    """
    return 4 + 1 + 8 + 2, _compute_latency(config) + 2


def _compute_latency(config) -> int:
    """``hw.mvm.mvm.compute_latency``: a group's MRF read to its row block in the output
    FIFO."""
    stages = -(-(config.n.bit_length() - 1) // 2)          # adder tree, 2 levels each
    prefix = (config.tiles - 1).bit_length()               # ceil(log2 T)
    return (3 + 2 + stages) + (3 + prefix) + 4


def output_fifo_depth(config) -> int:
    """``hw.mvm.mvm.output_fifo_depth``: row blocks the MVM's output FIFO holds (its
    credits)."""
    return 1 << (_compute_latency(config) + 4 - 1).bit_length()


@dataclass(frozen=True)
class Timing:
    """Constants of the timing model (cycles); ``docs/npu.md`` section 4 explains each.

    The unit latencies are those of the gateware (``hw.arith.fp16_arith.LATENCY``,
    ``hw.arith.fp16_unary.LATENCY``, ``hw.arith.fp16_reduce.NODE_LATENCY``, ``hw.mfu.mfu.INPUT_STAGES``);
    ``host`` does not import ``hw``, so they are repeated here and a change there must be
    made here too.
    """
    fetch_latency: int = 1           #: ``run`` to the first instruction decoded
    decode_per_instruction: int = 1
    chain_overhead: int = 5          #: per chain: check, hand-off, taken by the issuer
    decode_queue: int = 2            #: decoded chains waiting ahead of the one issuing
    in_flight: int = 4               #: instances issued and not yet written (scoreboard)
    read_latency: int = 4            #: issue to the first source vector at the MFU input
    load_offset: int = -1            #: the MVM's loader, relative to ``read_latency``
    mfu_setup: int = 6               #: issue to the chain taken by the MFU pipeline
    unit_input_stages: int = 2       #: an MFU unit's input registers, per op
    binary_latency: int = 6          #: an ADDSUB or MUL unit
    unary_latency: int = 15          #: the ACT unit
    reduce_node_latency: int = 6     #: one adder level of the REDUCE unit
    mfu_accept: int = 2              #: last output taken to the next chain taken
    retire_latency: int = 1          #: last write to the scoreboard entry freed
    end_latency: int = 1             #: last retirement (or ``end`` decoded) to ``done``
    #: ``lanes < n`` only: the core's N -> l adapter from the MVM's output FIFO to the MFU
    #: (0 combinational, 1 registered). 0, the gateware's (the adapter is a multiplexer,
    #: ``hw.core.npu``): on ``n8t1`` at lanes 4 the model's error is the one at lanes 8 on
    #: 10 of the 12 bench programs, one cycle more on two; with 1, on 3 (docs/npu.md
    #: section 4)
    beat_adapter: int = 0
    #: A chain without a product: its first beat reaches the MFU input this many cycles
    #: after ``read_latency`` (through the reader's direct buffer), fitted as the other
    #: front-end constants were (docs/npu.md section 4)
    direct_latency: int = 4
    #: The register slice after the reader's direct buffer (``hw.core.reader``, issue 36,
    #: timing): a chain without a product reaches the MFU this many cycles later again,
    #: and the slice holds twice as many beats beyond the buffer's depth (its output and
    #: skid registers). 1, the gateware's
    direct_slice: int = 1
    #: The registers before the reader's write into its direct buffer (the read data,
    #: ``hw.core.reader``, issue 36, the board's timing): a chain without a product
    #: reaches the MFU this many cycles later again; the buffer's room counts the beat in
    #: flight, so it holds no more. 1, the gateware's
    direct_write_register: int = 1
    #: The register on the MVM's and the MFU pipeline's ``busy`` before the run's end
    #: (``hw.core.npu``, issue 36, timing): a run whose last instance retires ends this
    #: many cycles later again (the units' tails end with the last retirement); a run
    #: whose end is its decode does not. 1, the gateware's
    busy_register: int = 1


class _Clock:
    """The timing model run alongside the execution: one call per chain instance.

    It follows the core's resources (``docs/npu.md`` section 4): in-order issue with a
    write scoreboard of ``in_flight`` instances (RAW only), one reader, the MVM's loader
    and sequencer (``docs/mvm.md`` section 7), and one MFU pipeline that takes a chain
    only when the previous one has left it, feeding a writer that takes one cycle per
    vector and destination.

    With ``lanes`` l < n (``B = n / l`` beats a native vector, the lanes plan note,
    section 3) the MFU pipeline, the writer and the reader's direct path count beats:
    one beat per cycle into the MFU, one cycle per beat and destination in the writer, a
    reduction waits for the last beat, the direct buffer holds ``direct_depth * B``
    beats, and a product's row block leaves the MVM's output FIFO with its last beat
    (the FIFO's credits can then hold the sequencer). At ``lanes == n`` every formula is
    the native-vector one, cycle for cycle.
    """

    def __init__(self, config: NpuConfig, timing: Timing):
        self.cfg = config
        self.t = timing
        self.front, self.back = mvm_latency(config)
        self.beats = config.n // config.lanes
        self.fifo_depth = output_fifo_depth(config)
        levels = (config.n - 1).bit_length() + (config.max_length - 1).bit_length()
        self.reduce_latency = (timing.reduce_node_latency + 1) * levels + 2
        self.decode = timing.fetch_latency   # cycle at which the decoder has decoded so far
        self.issued = []         # issue cycles of chains (for the decode queue)
        self.issue_free = 0      # the issuer takes one instance per cycle
        self.rd_free = 0         # the reader is free
        self.load_free = 0
        self.seq_free = 0
        self.seq_ends = []       # last sequencer cycle of each product
        self.mfu_free = 0        # the MFU pipeline can take the next chain
        self.direct = []         # MFU arrivals of the last direct beats (reader's buffer)
        self.departs = []        # row blocks' last beats taken from the MVM's FIFO (B > 1)
        self.retired = []        # retire cycles of the instances, in issue order
        self.done = 0
        self.flight = []         # (retire, writes) of instances maybe in flight

    def instructions(self, count: int):
        """Instructions decoded outside chains (s_wr, end)."""
        self.decode += count * self.t.decode_per_instruction

    def chain(self, n_instr: int):
        """A chain's instructions are decoded once, before its first instance issues."""
        q = self.t.decode_queue
        if len(self.issued) >= q:
            self.decode = max(self.decode, self.issued[-q])
        self.decode += n_instr * self.t.decode_per_instruction + self.t.chain_overhead

    def _fill(self, ops, length: int) -> tuple[int, int]:
        """``(fill, pipe)`` of an MFU chain: edges from acceptance to the first output
        with the input offered at once (``docs/mfu.md`` section 6), and from an input
        vector to its output."""
        t = self.t
        lat = {MfuUnit.ADDSUB: t.binary_latency, MfuUnit.MUL: t.binary_latency,
               MfuUnit.ACT: t.unary_latency,
               MfuUnit.REDUCE: length * self.beats - 1 + self.reduce_latency}
        pipe = 1 + sum(t.unit_input_stages + lat[op.unit] for op in ops)
        vrf_first = bool(ops) and ops[0].unit in (MfuUnit.ADDSUB, MfuUnit.MUL)
        return pipe + vrf_first, pipe - 1

    def instance(self, c_in, length, mvm_cols, ops, reads, writes, dests, fill=None):
        """One chain instance: advances the resources.

        ``c_in`` native vectors read; ``length`` (L) vectors out; ``mvm_cols`` C of the
        product or None; ``ops`` the chain's ``MfuOp`` list; ``reads``/``writes``: lists of
        ``(space, start, stop)`` of vector memories (not NETQ); ``dests`` the number of
        ``v_wr`` (NETQ included); ``fill``: ``_fill(ops, length)`` when the caller has it.
        """
        t = self.t
        # Issue: decoded, one per cycle, a free scoreboard entry, and no read of a range
        # an instance in flight still writes (later writes cannot overtake earlier reads
        # or writes: everything after the issuer is in order).
        start = max(self.decode, self.issue_free)
        if len(self.retired) >= t.in_flight:
            start = max(start, self.retired[-t.in_flight])
        for retire, wr in self.flight:
            if retire > start and _overlaps(wr, reads):
                start = max(start, retire)
        self.issued.append(start)
        self.issue_free = start + 1
        # The MFU pipeline takes the chain once the previous one has left it.
        accept = max(self.mfu_free, start + t.mfu_setup)
        fill, pipe = self._fill(ops, length) if fill is None else fill
        read = max(start + t.read_latency, self.rd_free)
        beats = self.beats
        if mvm_cols is not None:
            groups = -(-mvm_cols // self.cfg.tiles)
            # The loader takes the command and its C vectors once a buffer half is free:
            # the half of the product before the previous one has been sequenced.
            before_previous = self.seq_ends[-2] if len(self.seq_ends) > 1 else 0
            load = max(read + t.load_offset, self.load_free, before_previous)
            self.load_free = load + mvm_cols + 1
            self.rd_free = load + c_in + 1
            seq = max(load + mvm_cols + self.front, self.seq_free)
            if beats == 1:
                self.seq_free = seq + length * groups
                arrive = [seq + (k + 1) * groups + self.back - 1 for k in range(length)]
            else:
                arrive = self._beats_out(seq, groups, length, accept)
            self.seq_ends.append(self.seq_free)
        else:
            # Direct vectors wait in the reader's direct buffer and its register slice
            # for the MFU. The reader writes a vector only while fewer than depth - 1
            # wait in the buffer (earlier chains' included), so it is held until the
            # vector depth - 1 places back has gone on into the slice.
            first = read + t.direct_latency + t.direct_write_register + t.direct_slice
            arrive = [max(first + k, accept + 1 + k) for k in range(length * beats)]
            depth = self.cfg.direct_depth * beats + 2 * t.direct_slice
            held = self.direct[1 - depth:] + arrive
            room = held[-depth] if len(held) >= depth else 0
            self.rd_free = max(read + c_in * beats, room) + 1
            self.direct = held
        # Outputs: one per cycle at best, one per destination while the writer writes.
        out = max(accept + fill, arrive[0] + pipe)
        reduces = sum(op.unit is MfuUnit.REDUCE for op in ops) if ops else 0
        if reduces:                            # a reduction waits for the last vector
            out = max(out, arrive[-1] + pipe - reduces * (length * beats - 1))
        for a in arrive[1:]:
            out = max(out + dests, a + pipe)
        last = out + dests - 1                 # the writer's last write
        self.mfu_free = last + t.mfu_accept
        retire = last + t.retire_latency
        self.retired.append(retire)
        self.flight = [f for f in self.flight if f[0] > start] + [(retire, writes)]
        self.done = max(self.done, retire)

    def _beats_out(self, seq, groups, length, accept) -> list[int]:
        """``B > 1``: the MFU arrivals of a product's ``length * B`` beats (sets
        ``seq_free``). Row block ``k``'s last group is read at ``seq + (k+1)*groups - 1``
        at the earliest, and not before the row block ``D`` places back (this product's
        or an earlier one's) has left the output FIFO: room is reserved for a row block
        before its last group is read, and a taken row block frees its place one edge
        late. The block is at the FIFO's head ``back`` edges after that read; its beats go
        to the MFU one per cycle, from ``beat_adapter`` edges later, once the MFU pipeline
        has taken the chain; the FIFO pops with the last beat."""
        depth, beats = self.fifo_depth, self.beats
        departs = list(self.departs)
        arrive = []
        read_last = seq - 1
        prev = -1
        for k in range(length):
            read_last = max(read_last + groups, seq + (k + 1) * groups - 1)
            if len(departs) >= depth:
                read_last = max(read_last, departs[-depth] + 1)
            y = read_last + self.back
            for b in range(beats):
                prev = max(y + b + self.t.beat_adapter, prev + 1,
                           accept + 1 + len(arrive))
                arrive.append(prev)
            departs.append(prev)
        self.seq_free = read_last + 1
        self.departs = departs[-depth:]
        return arrive

    def total(self) -> int:
        return max(self.done + self.t.busy_register, self.decode) + self.t.end_latency


def _space(space) -> Space:
    try:
        return Space(space)
    except ValueError:
        raise NpuError(ErrorCode.ILLEGAL_FIELD, f"no memory space {space!r}") from None


def _build_spaces(config) -> str:
    """The vector memories of a build, for messages."""
    sets = ("" if config.unit_sets is None
            else f", unit sets {format_unit_sets(config.unit_sets, config.mfus)}")
    return (f"{config.mfus} MFUs{sets}; vector memories "
            f"{', '.join(s.name for s in vector_spaces(config))}")


def _overlaps(a, b) -> bool:
    return any(sa is sb and x0 < y1 and y0 < x1 for sa, x0, x1 in a for sb, y0, y1 in b)


# --- the model --------------------------------------------------------------------------------

#: What the model derives from a loaded program alone, shared by the models that load the
#: same words on the same build and timing constants: ``(decoded, parsed, plans)``,
#: instruction by index, chain by start, and the checked plan of a chain by ``(start,
#: register values)``. Each entry is a pure function of its key, the words, the build and
#: the timing (a plan's queue checks, the only part that depends on the state, run every
#: time), so sharing changes nothing.
_PROGRAMS = OrderedDict()
_PROGRAMS_KEPT = 8


def _program_caches(config, timing, words: np.ndarray):
    key = (config, timing, words.tobytes())
    entry = _PROGRAMS.get(key)
    if entry is None:
        entry = _PROGRAMS[key] = ({}, {}, {})
        while len(_PROGRAMS) > _PROGRAMS_KEPT:
            _PROGRAMS.popitem(last=False)
    else:
        _PROGRAMS.move_to_end(key)
    return entry


class NpuModel:
    """The reference NPU core.

    Parameters
    ----------
    config : NpuConfig
    timing : Timing, optional
        Constants of the cycle prediction.

    Vector memories (IVRF, the MFUs' ASVRF/MULVRF) hold native vectors: ``read`` and
    ``write`` take and return uint16 arrays of shape ``(count, n)`` (FP16 bits). The MRF
    holds packed weight words (``host.spec.formats.block_layout(n, m_w)`` as an int, i.e.
    ``host.numerics.bfp.pack`` of one tile row read little-endian) at the flat addresses of
    :func:`host.spec.isa.mrf_address`. Host requests that are out of range raise
    :class:`NpuError` and change nothing; they never set the sticky error, which only
    :meth:`run` sets.
    """

    def __init__(self, config: NpuConfig, timing: Timing | None = None):
        if not isinstance(config, NpuConfig):
            raise TypeError(f"config must be an NpuConfig, not {config!r}")
        self.config = config
        self.timing = timing if timing is not None else Timing()
        self._mvm_cfg = config.mvm
        self._mfu_cfg = config.mfu
        self.reset()

    # --- state ---------------------------------------------------------------------------

    def reset(self) -> None:
        """Everything to its power-on state: memories and program zero, queues empty,
        registers at their defaults, counters zero, no error."""
        cfg = self.config
        self._ivrf = np.zeros((cfg.ivrf_depth, cfg.n), np.uint16)
        self._vrfs = MfuVrfs(self._mfu_cfg)
        self._mrf_codes = np.zeros((cfg.tiles, cfg.n, cfg.mrf_depth), np.uint8)
        self._mrf_mant = np.zeros((cfg.tiles, cfg.n, cfg.mrf_depth, cfg.n), np.int16)
        # Weights gathered for a product, by (base slot, rows, cols, groups); an MRF write
        # drops the entries whose slots it touches (_forget_slots), and write_weights
        # gathers the matrix it wrote at once (the work a product would do first).
        self._gathered = {}
        # The vector memories by space (the arrays never change identity).
        # Only the VRFs the build has (host.spec.isa.vector_spaces).
        self._memories = {Space.IVRF: self._ivrf}
        for space in vector_spaces(cfg)[1:]:
            self._memories[space] = (self._vrfs.addsub if space.value % 2 == 0
                                     else self._vrfs.mul)[space.mfu]
        self._program = np.zeros(cfg.program_depth, np.uint64)
        self._program_length = 0
        self._decoded = {}                  # pc -> Instruction, for the loaded program
        self._parsed = {}                   # pc -> Chain starting there
        self._plans = {}                    # (pc, registers) -> plan (see _plan)
        self._inq = np.zeros((0, cfg.n), np.uint16)
        self._outq = np.zeros((0, cfg.n), np.uint16)
        self._regs = self._default_registers()
        self.clear_counters()
        self._error = ErrorCode.NONE
        self._error_message = ""

    def _default_registers(self) -> dict:
        return {r: (self.config.n if v is None else v) for r, v in REG_DEFAULTS.items()}

    @property
    def error(self) -> ErrorCode:
        """The sticky error flag (the first error since the last :meth:`clear_error`)."""
        return self._error

    @property
    def error_message(self) -> str:
        return self._error_message

    def clear_error(self) -> None:
        self._error = ErrorCode.NONE
        self._error_message = ""

    @property
    def registers(self) -> dict:
        """The scalar registers as the last run left them (``Reg: int``), a copy."""
        return dict(self._regs)

    def info(self) -> dict:
        """Build parameters (``NpuConfig`` fields, unary ops by name) and derived sizes."""
        return build_info(self.config)

    # --- counters ------------------------------------------------------------------------

    def clear_counters(self) -> None:
        self._counters = {name: 0 for name in counter_names(self.config)}

    def counters(self) -> dict[str, int]:
        """Every counter: the MVM's (:data:`MVM_COUNTERS`) and ``mfu<m>_overflow``,
        ``mfu<m>_nan_created``; each saturates at ``2**counter_bits - 1``."""
        return dict(self._counters)

    def _count(self, name: str, events: int) -> None:
        top = (1 << self.config.counter_bits) - 1
        self._counters[name] = min(top, self._counters[name] + int(events))

    # --- host access -----------------------------------------------------------------------

    def _vector_memory(self, space) -> np.ndarray:
        space = space if type(space) is Space else _space(space)
        mem = self._memories.get(space)
        if mem is None:
            raise NpuError(ErrorCode.ILLEGAL_FIELD,
                           f"{space.name} is not a vector memory of this build "
                           f"({_build_spaces(self.config)}; use push_input/pop_output "
                           f"for NETQ)")
        return mem

    def _range(self, what, addr, count, depth):
        try:
            addr = check_int("addr", addr, 0)
            count = check_int("count", count, 0)
        except (TypeError, ValueError) as e:
            raise NpuError(ErrorCode.ADDRESS_RANGE, f"{what}: {e}") from None
        if addr + count > depth:
            raise NpuError(ErrorCode.ADDRESS_RANGE, f"{what}: addr {addr} + count {count} "
                                                    f"is beyond its depth {depth}")
        return addr, count

    def write(self, space, addr: int, data) -> None:
        """Write native vectors (uint16 ``(count, n)``) or MRF words (ints) at ``addr``.

        Raises
        ------
        NpuError
            ILLEGAL_FIELD (no such space, NETQ), ADDRESS_RANGE, SIZE_RANGE (wrong shape
            or dtype), MRF_WORD (a word wider than the MRF word, or with an exponent code
            above 142); nothing is written then.
        """
        if _space(space) is Space.MRF:
            return self._write_mrf(addr, data)
        mem = self._vector_memory(space)
        arr = np.asarray(data)
        if arr.dtype != np.uint16 or arr.ndim != 2 or arr.shape[1] != self.config.n:
            raise NpuError(ErrorCode.SIZE_RANGE, f"data must be a uint16 array of shape "
                                                 f"(count, {self.config.n}), not "
                                                 f"{arr.dtype} {arr.shape}")
        addr, count = self._range(Space(space).name, addr, len(arr), len(mem))
        mem[addr:addr + count] = arr

    def read(self, space, addr: int, count: int):
        """Read ``count`` native vectors (uint16 ``(count, n)``) or MRF words (a list of
        ints) from ``addr``.

        Raises
        ------
        NpuError
            ILLEGAL_FIELD (no such space, NETQ), ADDRESS_RANGE.
        """
        if _space(space) is Space.MRF:
            return self._read_mrf(addr, count)
        mem = self._vector_memory(space)
        addr, count = self._range(Space(space).name, addr, count, len(mem))
        return mem[addr:addr + count].copy()

    def _mrf_index(self, addr, count):
        cfg = self.config
        addr, count = self._range("MRF", addr, count, cfg.mrf_words)
        flat = np.arange(addr, addr + count)
        row = flat % cfg.n
        rest = flat // cfg.n
        return rest % cfg.tiles, row, rest // cfg.tiles

    def _write_mrf(self, addr, words) -> None:
        cfg = self.config
        words = [words] if isinstance(words, int) else list(words)
        engine, row, slot = self._mrf_index(addr, len(words))
        nbytes = block_bytes(cfg.n, cfg.mantissa_bits_w)
        bits = self._mvm_cfg.weight_block_bits
        raw = np.zeros((len(words), nbytes), np.uint8)
        for i, w in enumerate(words):
            if isinstance(w, bool) or not isinstance(w, (int, np.integer)) \
                    or not 0 <= w < (1 << bits):
                raise NpuError(ErrorCode.MRF_WORD, f"MRF word {i} must be an int of "
                                                   f"{bits} bits, not {w!r}")
            raw[i] = np.frombuffer(int(w).to_bytes(nbytes, "little"), np.uint8)
        # The word's fields are those of host.numerics.bfp's packed block (the same bit layout).
        codes, q = bfp._unpack_fields(raw, cfg.n, cfg.mantissa_bits_w)
        if len(codes) and codes.max() > MAX_EXPONENT_CODE:
            i = int(np.argmax(codes > MAX_EXPONENT_CODE))
            raise NpuError(ErrorCode.MRF_WORD, f"MRF word {i} has exponent code "
                                               f"{int(codes[i])}, above {MAX_EXPONENT_CODE}")
        self._mrf_codes[engine, row, slot] = codes
        self._mrf_mant[engine, row, slot] = q
        if len(slot):
            self._forget_slots(int(slot.min()), int(slot.max()) + 1)

    def _read_mrf(self, addr, count) -> list[int]:
        cfg = self.config
        engine, row, slot = self._mrf_index(addr, count)
        rows = bfp._pack_fields(self._mrf_codes[engine, row, slot],
                                self._mrf_mant[engine, row, slot], cfg.n,
                                cfg.mantissa_bits_w)
        return [int.from_bytes(r.tobytes(), "little") for r in rows]

    def write_weights(self, base_slot: int, matrix_fp16, rounding=Rounding.NEAREST_EVEN,
                      static_exponent: int | None = None) -> tuple[int, int]:
        """Quantize a logical matrix on chip and place it from tile slot ``base_slot``.

        The matrix (FP16: a ``float16`` array or uint16 bits, shape ``(rows, cols)``) is
        zero padded to whole tiles; tile ``(r, c)`` goes where
        ``MvmConfig.tile_slot(base_slot, r, c, C)`` says, each tile row quantized to one
        MRF word with ``m_w``-bit mantissas, ``rounding``, and the dynamic exponent or the
        static one (``static_exponent``: an E8M0 code, at most 142). The weight counters
        count the quantizer's events. Returns ``(R, C)``, the tiles of the matrix.

        Raises
        ------
        NpuError
            SIZE_RANGE (not 2-D, C > max_col_tiles, not FP16), ADDRESS_RANGE (slots
            beyond mrf_depth), MRF_WORD (static exponent above 142); nothing is
            written or counted then.
        """
        cfg = self.config
        w = np.asarray(matrix_fp16)
        if w.dtype == np.float16:
            w = w.view(np.uint16)
        if w.dtype != np.uint16 or w.ndim != 2 or 0 in w.shape:
            raise NpuError(ErrorCode.SIZE_RANGE, f"matrix must be a 2-D float16 or uint16 "
                                                 f"array, not {w.dtype} {w.shape}")
        rounding = Rounding.parse(rounding)
        tiles = bfp.split_matrix(w, cfg.n)                       # (R, C, n, n)
        big_r, big_c = tiles.shape[:2]
        if big_c > cfg.max_col_tiles:
            raise NpuError(ErrorCode.SIZE_RANGE, f"matrix has {big_c} column tiles, more "
                                                 f"than max_col_tiles {cfg.max_col_tiles}")
        base_slot = self._range("MRF slot", base_slot, 0, cfg.mrf_depth)[0]
        need = self._mvm_cfg.slots_needed(big_r, big_c)
        if base_slot + need > cfg.mrf_depth:
            raise NpuError(ErrorCode.ADDRESS_RANGE, f"matrix of {big_r} x {big_c} tiles at "
                                                    f"slot {base_slot} needs slots up to "
                                                    f"{base_slot + need - 1}, beyond "
                                                    f"mrf_depth {cfg.mrf_depth}")
        if static_exponent is not None:
            try:
                static_exponent = check_int("static_exponent", static_exponent, 0,
                                            MAX_EXPONENT_CODE)
            except (TypeError, ValueError) as e:
                raise NpuError(ErrorCode.MRF_WORD, str(e)) from None
        q = quantize_fp16(tiles, cfg.mantissa_bits_w, rounding, static_exponent)
        groups = -(-big_c // cfg.tiles)
        c = np.arange(big_c)
        slots = base_slot + np.arange(big_r)[:, None] * groups + c[None, :] // cfg.tiles
        engines = np.broadcast_to(c % cfg.tiles, slots.shape)
        # q.exponent_codes is (R, C, n rows); the MRF is indexed [engine, row, slot].
        self._mrf_codes[engines[..., None], np.arange(cfg.n), slots[..., None]] = \
            q.exponent_codes
        self._mrf_mant[engines[..., None], np.arange(cfg.n), slots[..., None]] = q.mantissas
        self._forget_slots(base_slot, base_slot + need)
        self._weights(base_slot, big_r, big_c, groups)
        self._count("weight_saturations", q.saturated.sum())
        self._count("weight_nonfinite", q.nonfinite.sum())
        return big_r, big_c

    # --- queues and program ----------------------------------------------------------------

    @property
    def input_level(self) -> int:
        """Native vectors waiting in the input queue."""
        return len(self._inq)

    @property
    def output_level(self) -> int:
        """Native vectors waiting in the output queue."""
        return len(self._outq)

    def push_input(self, vectors) -> None:
        """Append native vectors ``(k, n)``, ``k >= 1``, to the input queue.

        Takes what ``host.runtime.device.Device.push_input`` takes, native vectors only
        (a logical vector is split with ``host.compiler.programs.native`` first): uint16
        FP16 bit patterns or ``float16`` values; also ``float32`` / ``float64`` values,
        rounded to FP16 to nearest even (:func:`host.numerics.mvm.fp16_bits`). A refused
        push changes nothing.

        Raises
        ------
        TypeError
            ``vectors`` has another dtype (integers other than uint16, bool, object...).
        ValueError
            ``vectors`` is not of shape ``(k >= 1, n)`` (the message as the device's).
        NpuError
            QUEUE_OVERFLOW (beyond netq_depth).

        Warns
        -----
        RuntimeWarning
            finite float values that overflow to inf in the rounding.
        """
        n = self.config.n
        arr = np.asarray(vectors)
        if arr.ndim != 2 or arr.shape[1] != n or not len(arr):
            raise ValueError(f"vectors must be native vectors, an array of shape "
                             f"(count >= 1, {n}) (uint16 FP16 bits or float values), not "
                             f"{arr.dtype} {arr.shape}")
        arr = fp16_bits(arr, "vectors")
        if len(self._inq) + len(arr) > self.config.netq_depth:
            raise NpuError(ErrorCode.QUEUE_OVERFLOW,
                           f"{len(arr)} vectors do not fit the input queue ({len(self._inq)} "
                           f"of {self.config.netq_depth} used)")
        self._inq = np.concatenate([self._inq, arr])

    def pop_output(self, count: int) -> np.ndarray:
        """Take ``count`` native vectors (uint16 ``(count, n)``) from the output queue.

        Raises
        ------
        NpuError
            QUEUE_UNDERFLOW (fewer queued; nothing taken then).
        """
        count = check_int("count", count, 0)
        if count > len(self._outq):
            raise NpuError(ErrorCode.QUEUE_UNDERFLOW, f"{count} vectors asked, "
                                                      f"{len(self._outq)} queued")
        out, self._outq = self._outq[:count].copy(), self._outq[count:]
        return out

    def load_program(self, words) -> None:
        """Load a program (``uint64`` words) at address 0; the rest of program memory is
        erased (zero words are illegal). Words are decoded when executed.

        Raises
        ------
        NpuError
            PROGRAM_RANGE (more than program_depth words, or none), SIZE_RANGE (not a
            1-D array of 64-bit words); the loaded program is unchanged then.
        """
        try:
            arr = np.asarray(words, dtype=np.uint64)
        except (OverflowError, ValueError, TypeError) as e:
            raise NpuError(ErrorCode.SIZE_RANGE, f"words must be 64-bit words: {e}") from None
        if arr.ndim != 1:
            raise NpuError(ErrorCode.SIZE_RANGE, f"words must be 1-D, not {arr.shape}")
        if not 1 <= len(arr) <= self.config.program_depth:
            raise NpuError(ErrorCode.PROGRAM_RANGE, f"program of {len(arr)} words; program "
                                                    f"memory holds 1 to "
                                                    f"{self.config.program_depth}")
        self._program[:] = 0
        self._program[:len(arr)] = arr
        self._program_length = len(arr)
        # Decoding depends on the words alone: kept across runs of the same program (and
        # shared with other models that load it, _program_caches).
        self._decoded, self._parsed, self._plans = _program_caches(self.config, self.timing,
                                                                     arr)

    # --- execution -------------------------------------------------------------------------

    def run(self) -> RunResult:
        """Execute the loaded program from instruction 0 to ``end``.

        The scalar registers start at their power-on values. An illegal instruction or a
        run-time range error stops the run before the failing chain changes anything and
        sets the sticky :attr:`error`. A device whose error flag is set does not start
        (the result repeats the flag) until :meth:`clear_error`.
        """
        if self._error is not ErrorCode.NONE:
            return RunResult(0, 0, 0, self._error, 0, "error flag set; clear_error first")
        self._regs = self._default_registers()
        clock = _Clock(self.config, self.timing)
        chains = instructions = pc = 0
        cache = self._decoded

        def fetch(i):
            if i >= self._program_length:
                raise IsaError(ErrorCode.PROGRAM_RANGE,
                               f"instruction {i} is past the program's end "
                               f"({self._program_length} words) without end", i)
            if i not in cache:
                cache[i] = decode(int(self._program[i]), i)
            return cache[i]

        try:
            while True:
                ins = fetch(pc)
                if ins.opcode is Opcode.END:
                    clock.instructions(1)
                    instructions += 1
                    break
                if ins.opcode is Opcode.S_WR:
                    self._set_register(ins, pc)
                    clock.instructions(1)
                    instructions += 1
                    pc += 1
                elif ins.opcode is Opcode.V_RD:
                    chain = self._parsed.get(pc)
                    if chain is None:
                        chain = self._parsed[pc] = parse_chain(fetch, pc)
                    chains += self._execute(chain, clock)
                    instructions += chain.stop - chain.start
                    pc = chain.stop
                else:
                    raise IsaError(ErrorCode.CHAIN_STRUCTURE,
                                   f"instruction {pc}: {ins} outside a chain", pc)
        except IsaError as e:
            self._error = e.code
            self._error_message = e.message
            where = e.index if e.index is not None else pc
            return RunResult(clock.total(), chains, instructions, e.code, where, e.message)
        return RunResult(clock.total(), chains, instructions, ErrorCode.NONE, pc)

    def _set_register(self, ins: Instruction, pc: int) -> None:
        reg, v = ins.func, ins.operand
        lo, hi = register_limits(self.config)[reg]
        if not lo <= v <= hi:
            raise IsaError(ErrorCode.REGISTER_VALUE, f"instruction {pc}: s_wr "
                                                     f"{reg.name.lower()}, {v}: the value "
                                                     f"must be from {lo} to {hi}", pc)
        self._regs[reg] = v

    def _plan(self, chain: Chain):
        """Check a chain against the registers and memories; return its plan.

        Raises IsaError for anything that would fail in any of its iterations. A plan
        depends on the chain, the registers and the build only, except for the queue
        checks (:meth:`_check_queues`): it is kept by ``(start, registers)`` once every
        check has passed, and a kept plan repeats only the queue checks. Those come after
        every other check that can fail first, so the error raised is the same. Plans
        are read only.
        """
        key = (chain.start, *self._regs.values())
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = self._plan_checked(chain)
        else:
            self._check_queues(chain, plan)
        return plan

    def _check_queues(self, chain: Chain, plan) -> None:
        """The plan's input pops and output pushes against the queues' levels."""
        rd, iters, cols = chain.read, plan["iters"], plan["c_in"]
        if rd.space is Space.NETQ and iters * cols > len(self._inq):
            raise IsaError(ErrorCode.QUEUE_UNDERFLOW,
                           f"instruction {chain.start}: {rd}: {iters} x {cols} vectors "
                           f"needed, {len(self._inq)} queued", chain.start)
        pushes = plan["pushes"]
        if len(self._outq) + pushes > self.config.netq_depth:
            raise IsaError(ErrorCode.QUEUE_OVERFLOW,
                           f"instruction {chain.start}: the chain pushes {pushes} vectors; "
                           f"the output queue has "
                           f"{self.config.netq_depth - len(self._outq)} free", chain.start)

    def _plan_checked(self, chain: Chain):
        """:meth:`_plan` without the cache: every check, in order."""
        cfg, regs = self.config, self._regs
        at = chain.start

        def fail(code, what, index=at):
            raise IsaError(code, f"instruction {index}: {what}", index)

        n = cfg.n
        rows = regs[Reg.ROWS]
        length = -(-rows // n)
        iters = regs[Reg.ITERATIONS]
        # The MFU ops, their allocation and the VRF each vv operand lives in.
        for k, ins in enumerate(chain.ops):
            if ins.opcode is Opcode.V_UNARY and ins.func not in cfg.unary_ops:
                fail(ErrorCode.ILLEGAL_OPCODE, f"{ins}: {ins.func.name.lower()} is not "
                                               f"built", at + (2 if chain.mv_mul else 1) + k)
        mfu_ops = chain_mfu_ops(chain)
        try:
            placed = allocate(mfu_ops, cfg.mfus, cfg.unit_sets)
        except ValueError as e:
            fail(ErrorCode.CHAIN_STRUCTURE, f"the chain's ops do not fit the MFUs: {e}")
        # The VRF of every vv op, in chain order.
        where = [operand_vrf(op.unit, m) for m, ops in enumerate(placed) for op in ops
                 if op.unit in (MfuUnit.ADDSUB, MfuUnit.MUL)]
        vv = [ins for ins in chain.ops if ins.opcode is Opcode.VV]

        for ins, idx in [(chain.read, at)] + [(w, chain.stop - 1 - len(chain.writes) + k)
                                              for k, w in enumerate(chain.writes)]:
            s = ins.space
            if s is not Space.NETQ and s not in self._memories:
                fail(ErrorCode.ILLEGAL_FIELD, f"{ins}: {s.name} does not exist in this "
                                              f"build ({_build_spaces(cfg)})", idx)
        mv = chain.mv_mul
        if length > cfg.max_length:
            fail(ErrorCode.SIZE_RANGE, f"ROWS {rows} needs {length} native vectors, more "
                                       f"than max_length {cfg.max_length}")
        plan = {"length": length, "lanes_last": rows - (length - 1) * n, "iters": iters,
                "ops": mfu_ops, "vv_spaces": where}
        # Read ranges of iteration 0 as (start, count) relative to the operand.
        if mv is not None:
            pix = -(-regs[Reg.COLS] // n)
            win_w, win_h, pitch = regs[Reg.WIN_W], regs[Reg.WIN_H], regs[Reg.WIN_PITCH]
            cols = pix * win_w * win_h
            if cols > cfg.max_col_tiles:
                fail(ErrorCode.SIZE_RANGE, f"COLS {regs[Reg.COLS]} in a {win_w} x {win_h} "
                                           f"window needs {cols} column tiles, more than "
                                           f"max_col_tiles {cfg.max_col_tiles}")
            if regs[Reg.Q_STATIC] and regs[Reg.Q_EXPONENT] > MAX_EXPONENT_CODE:
                fail(ErrorCode.REGISTER_VALUE, f"static exponent code "
                                               f"{regs[Reg.Q_EXPONENT]} is above "
                                               f"{MAX_EXPONENT_CODE}", at + 1)
            pieces = [(y * pitch + x * pix, pix) for y in range(win_h) for x in range(win_w)]
            groups = -(-cols // cfg.tiles)
            last_slot = mv.operand + (iters - 1) * mv.inc + length * groups
            if last_slot > cfg.mrf_depth:
                fail(ErrorCode.ADDRESS_RANGE, f"{mv}: {length} x {cols} tiles in iteration "
                                              f"{iters - 1} need slots up to "
                                              f"{last_slot - 1}, beyond mrf_depth "
                                              f"{cfg.mrf_depth}", at + 1)
            plan.update(pix=pix, cols=cols, groups=groups,
                        lanes_cols=regs[Reg.COLS] - (pix - 1) * n)
        else:
            pieces = [(0, length)]
            cols = length
        plan["pieces"] = pieces
        plan["c_in"] = cols
        # Queues: every iteration pops c_in vectors / pushes length per netq write.
        rd = chain.read
        plan["pushes"] = sum(length for w in chain.writes if w.space is Space.NETQ) * iters
        self._check_queues(chain, plan)
        # Ranges: (space, start, count, inc, index) of every memory access.
        reads, writes = [], []
        if rd.space is not Space.NETQ:
            for off, cnt in pieces:
                reads.append((rd.space, rd.operand + off, cnt, rd.inc, at, mv is not None))
        for ins, space in zip(vv, where):
            reads.append((space, ins.operand, length, ins.inc, at, False))
        for w in chain.writes:
            if w.space is not Space.NETQ:
                writes.append((w.space, w.operand, length, w.inc, at))
        for space, start, cnt, inc, _, *rest in reads + writes:
            depth = len(self._ivrf) if space is Space.IVRF else cfg.vrf_depth
            top = max(start, start + (iters - 1) * inc) + cnt
            if top > depth:
                fail(ErrorCode.ADDRESS_RANGE, f"{space.name} vectors up to {top - 1} "
                                              f"(iteration {iters - 1}), beyond depth {depth}")
        self._check_hazards(reads, writes, iters, fail)
        plan["reads"], plan["writes"] = reads, writes
        plan["run"] = self._compile(chain, plan, placed, vv)
        return plan

    def _compile(self, chain: Chain, plan, placed, vv):
        """What :meth:`_execute` needs per iteration, worked out once per plan."""
        cfg, regs = self.config, self._regs
        mv, rd = chain.mv_mul, chain.read
        k = 0
        steps = []                      # (mfu, op, vv operand, vv inc)
        for m, ops in enumerate(placed):
            for op in ops:
                if op.addr is not None:
                    steps.append((m, op, vv[k].operand, vv[k].inc))
                    k += 1
                else:
                    steps.append((m, op, 0, 0))
        product = None
        if mv is not None:
            n = cfg.n
            last = np.arange(plan["pix"] - 1, plan["cols"], plan["pix"])
            product = {
                "base": mv.operand, "inc": mv.inc,
                "mask": (last[:, None], np.arange(plan["lanes_cols"], n)[None, :])
                if plan["lanes_cols"] < n else None,
                "kw": {"n": n, "mantissa_bits_v": cfg.mantissa_bits_v,
                       "mantissa_bits_w": cfg.mantissa_bits_w,
                       "rounding": Rounding(regs[Reg.ROUNDING]),
                       "static_exponent_code": (regs[Reg.Q_EXPONENT] if regs[Reg.Q_STATIC]
                                                else None),
                       # A build without the check (MvmConfig.narrow_check) still takes
                       # NARROW (the register is checked as on every build) but counts
                       # nothing.
                       "narrow_width": regs[Reg.NARROW] if cfg.narrow_check else None,
                       "accumulators": False}}
        return {
            "netq_read": rd.space is Space.NETQ, "read_space": rd.space,
            "read_base": rd.operand, "read_inc": rd.inc, "pieces": plan["pieces"],
            "product": product, "steps": steps,
            "steps0": [(m, op, a) for m, op, a, _ in steps],
            "ranges0": ([(s, a, a + c) for s, a, c, *_ in plan["reads"]],
                        [(s, a, a + c) for s, a, c, *_ in plan["writes"]]),
            "timing": self.timing,
            "fill": _Clock(cfg, self.timing)._fill(plan["ops"], plan["length"]),
            "writes": [(w.space is Space.NETQ, w.space, w.operand, w.inc)
                       for w in chain.writes],
            "clock": (plan["c_in"], plan["length"], plan["cols"] if mv is not None else None,
                      plan["ops"], len(chain.writes))}

    @staticmethod
    def _check_hazards(reads, writes, iters, fail):
        """In one iteration, no write may land ahead of a read of the same memory still to
        come (write start > read start with overlap), and no two writes may overlap. The
        MVM's own input is complete before its first result, so it is exempt."""
        for i in range(iters):
            wr = [(s, a + i * inc, a + i * inc + c) for s, a, c, inc, _ in writes]
            for k, (s, a, b) in enumerate(wr):
                for s2, a2, b2 in wr[:k]:
                    if s is s2 and a < b2 and a2 < b:
                        fail(ErrorCode.HAZARD, f"two v_wr of iteration {i} overlap in "
                                               f"{s.name} ({a2}..{b2 - 1} and {a}..{b - 1})")
                for s2, a2, c2, inc2, _, mvm_input in reads:
                    a2 += i * inc2
                    if not mvm_input and s is s2 and a < a2 + c2 and a2 < b and a > a2:
                        fail(ErrorCode.HAZARD, f"iteration {i} writes {s.name} {a}..{b - 1} "
                                               f"ahead of its read of {a2}..{a2 + c2 - 1}")

    def _execute(self, chain: Chain, clock: _Clock) -> int:
        """Run every iteration of a checked chain; returns the instances run."""
        plan = self._plan(chain)
        run = plan["run"]
        length = plan["length"]
        product, steps, pieces = run["product"], run["steps"], run["pieces"]
        clock.chain(chain.stop - chain.start)
        c_in, _, mvm_cols, ops, dests = run["clock"]
        # (The timing constants are part of the program cache's key; a model whose
        # ``timing`` was replaced since it loaded the program works its fill out anew.)
        fill = run["fill"] if (run["timing"] is self.timing
                               or run["timing"] == self.timing) else None
        for i in range(plan["iters"]):
            # Read the chain's input.
            if run["netq_read"]:
                x, self._inq = self._inq[:c_in].copy(), self._inq[c_in:]
            else:
                mem = self._vector_memory(run["read_space"])
                base = run["read_base"] + i * run["read_inc"]
                if len(pieces) == 1:
                    off, cnt = pieces[0]
                    x = mem[base + off:base + off + cnt].copy()
                else:
                    x = np.concatenate([mem[base + off:base + off + cnt]
                                        for off, cnt in pieces])
            y = x if product is None else self._product(
                x, product["base"] + i * product["inc"], plan)
            # The MFU ops, with this iteration's operand addresses.
            if steps:
                y, overflow, nan_created = run_steps(
                    [(m, op, a + i * inc) for m, op, a, inc in steps] if i else run["steps0"],
                    y, plan["lanes_last"], self._vrfs, self.config.unary_ops,
                    self.config.mfus)
                for m, (o, c) in enumerate(zip(overflow, nan_created)):
                    if o:
                        self._count(f"mfu{m}_overflow", o)
                    if c:
                        self._count(f"mfu{m}_nan_created", c)
            for netq, space, operand, inc in run["writes"]:
                if netq:
                    self._outq = np.concatenate([self._outq, y])
                else:
                    a = operand + i * inc
                    self._vector_memory(space)[a:a + length] = y
            if i:
                reads = [(s, a + i * inc, a + i * inc + c)
                         for s, a, c, inc, *_ in plan["reads"]]
                writes = [(s, a + i * inc, a + i * inc + c)
                          for s, a, c, inc, _ in plan["writes"]]
            else:
                reads, writes = run["ranges0"]
            clock.instance(c_in, length, mvm_cols, ops, reads, writes, dests, fill)
        return plan["iters"]

    def _forget_slots(self, start: int, stop: int) -> None:
        """Drop the gathered weights that read any tile slot in ``start .. stop - 1``
        (a product from ``base`` reads slots below ``base + rows * groups``)."""
        for key in [k for k in self._gathered
                    if k[0] < stop and start < k[0] + k[1] * k[3]]:
            del self._gathered[key]

    def _weights(self, base: int, rows: int, cols: int, groups: int):
        """The product's weight codes ``(rows * n, cols)``, mantissas
        ``(rows * n, cols * n)`` gathered from the MRF tile slots from ``base``, and their
        :func:`host.numerics.mvm.prepare_weights` (kept until an MRF write touches those
        slots, :meth:`_forget_slots`)."""
        key = (base, rows, cols, groups)
        if key not in self._gathered:
            n, t = self.config.n, self.config.tiles
            c = np.arange(cols)
            slots = base + np.arange(rows)[:, None] * groups + c[None, :] // t    # (R, C)
            engines = np.broadcast_to(c % t, slots.shape)
            # Gathered in the kernel's order, the tile row's MRF row between R and C:
            # (R, n, C) codes and (R, n, C, n) mantissas, reshaped without a copy.
            index = (engines[:, None, :], np.arange(n)[None, :, None], slots[:, None, :])
            codes = self._mrf_codes[index].reshape(rows * n, cols)
            mant = self._mrf_mant[index].reshape(rows * n, cols * n)
            self._gathered[key] = (codes, mant, prepare_weights(
                codes, mant, n=n, mantissa_bits_w=self.config.mantissa_bits_w))
        return self._gathered[key]

    def _product(self, x, base: int, plan) -> np.ndarray:
        """The MVM: ``x`` (C, n) gathered input vectors (the caller's copy), the matrix at
        tile slot ``base``."""
        product = plan["run"]["product"]
        n = self.config.n
        # Lanes past COLS in each pixel's last native vector do not enter the quantizer.
        if product["mask"] is not None:
            x[product["mask"]] = 0
        codes_w, qw, prepared = self._weights(base, plan["length"], plan["cols"],
                                              plan["groups"])
        res = mvm(x.reshape(-1), codes_w, qw, prepared=prepared, **product["kw"])
        for name, events in (("vector_saturations", res.vector_saturated),
                             ("vector_nonfinite", res.vector_nonfinite),
                             ("narrow_events", res.narrow.total),
                             ("output_saturations", res.output_saturated)):
            if events:
                self._count(name, events)
        return res.out_bits.reshape(plan["length"], n)
