"""Lowering of the recurrent stages (``LSTM`` / ``GRU``, stacked or not) of a network.

The main lowering (:func:`host.compiler.lower.lower`) groups the nodes into stages and
calls :func:`emit_recurrent` for each recurrent one (``docs/compiler.md`` section 7). A
recurrent stage is one layer, or several stacked layers each reading the previous one's
every-step output. For it this module

* splits the ONNX weights by gate and places them through the lowering's allocators
  (:class:`_RnnMemory`: MRF slots, VRFs, IVRF; the state ``h0``, ``c0`` goes to the
  per-job vectors);
* chooses quantize-once (``docs/compiler.md``, "Quantize once"): the stacked products of
  :data:`host.compiler.programs.LSTM_FUSED` / ``GRU_FUSED`` where they fit ``max_length``,
  unless the reference model predicts them slower than separate products by more than
  :data:`FUSE_TOLERANCE` (a trial of a few steps of both on a scratch build); a node's
  ``attrs["quantize_once"] = False`` turns it off;
* chooses the steps per run (``docs/compiler.md``, "Runs per job"): the whole sequence
  in one program when it fits program memory and the queues, else the largest divisor
  ``S`` of the sequence length that does; the job then runs the program ``T / S`` times,
  the state staying in the VRFs between runs;
* emits each step of each layer in its naive order, layers interleaved step by step, and
  reorders the stage's chains with :func:`host.compiler.schedule.emit_scheduled`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools

import numpy as np

from host.compiler.layers import CompileError, LayerInfo
from host.compiler.programs import (
    GRU_FUSED,
    GRU_UNFUSED,
    LSTM_FUSED,
    LSTM_UNFUSED,
    Builder,
    Ref,
    gru_layer,
    lstm_layer,
)
from host.spec.formats import MAX_EXPONENT_CODE
from host.spec.isa import Space, vector_spaces
from host.spec.mfu import format_unit_sets

__all__ = ["FUSE_TOLERANCE", "TRIAL_STEPS", "emit_recurrent", "runs_per_job"]

#: Quantize once unless the model predicts the stacked products this much slower (a
#: fraction of the separate products' cycles): they also take fewer instructions a step.
FUSE_TOLERANCE = 0.01
#: Steps of the trial that compares stacked and separate products.
TRIAL_STEPS = 6


def _error(message: str) -> Exception:
    """A :class:`host.compiler.layers.CompileError`."""
    return CompileError(message)


class _RnnMemory:
    """The memory callbacks of :func:`host.compiler.programs.lstm_layer` / ``gru_layer``
    over the lowering's allocators: MRF slots checked against ``mrf_depth``, VRF vectors
    against ``vrf_depth``, IVRF by the first-fit allocator; the state goes to the per-job
    vectors. Errors name the layer, the memory and both sizes."""

    def __init__(self, node, bld, config, ivrf, vrf, account, slot_next, job_vectors):
        self.node, self.bld, self.config = node, bld, config
        self.ivrf, self.vrf, self.account = ivrf, vrf, account
        self.slot_next, self.job_vectors = slot_next, job_vectors
        self.first_slot = slot_next
        self.ivrf_refs = []

    def matrix(self, w, name, exponents=None):
        n = self.config.n
        rows, cols = w.shape
        need = self.config.mvm.slots_needed(-(-rows // n), -(-cols // n))
        if self.slot_next + need > self.config.mrf_depth:
            raise _error(
                f"{self.node.where()}: the MRF needs {self.slot_next + need} tile slots "
                f"({self.slot_next - self.first_slot + need} so far for this layer's "
                f"matrices, {need} for its {rows} x {cols} {name}; {self.first_slot} for "
                f"the layers before it), the build has mrf_depth {self.config.mrf_depth}")
        slot = self.bld.matrix(w, f"{self.node.where()} {name}", exponents)
        assert slot == self.slot_next
        self.slot_next += need
        return slot

    def alloc(self, space, length, what="scratch"):
        where = self.node.where()
        if space is Space.IVRF:
            ref = self.ivrf.alloc(length, where)
            self.ivrf_refs.append(ref)
        else:
            if space not in self.vrf_spaces():
                raise _error(f"{where} needs {space.name}, which the build lacks (mfus "
                             f"{self.config.mfus}, unit sets "
                             f"{format_unit_sets(self.config.unit_sets, self.config.mfus)})")
            ref = Ref(space, self.vrf(space, length, where, what), length)
        self.account(self.node, space, length)
        return ref

    def vrf_spaces(self):
        return set(vector_spaces(self.config)[1:])

    def place(self, space, values, name="values"):
        data = _native(values, self.config.n)
        ref = self.alloc(space, len(data), name)
        self.bld.program.vectors.append((space, ref.addr, data))
        return ref

    def state(self, space, values, name="state"):
        data = _native(values, self.config.n)
        ref = self.alloc(space, len(data), name)
        self.job_vectors.append((space, ref.addr, data))
        return ref


@functools.cache
def _recurrent_info_type():
    """:class:`host.compiler.layers.LayerInfo` with what a recurrent layer adds to the
    report: its quantize-once groups (or why not), steps per run and runs per job."""

    @dataclasses.dataclass
    class RecurrentInfo(LayerInfo):
        quantize_once: dict = dataclasses.field(default_factory=dict)
        steps_per_run: int = 0
        runs: int = 1

        def to_json(self) -> dict:
            return super().to_json() | {"quantize_once": self.quantize_once,
                                         "steps_per_run": self.steps_per_run,
                                         "runs": self.runs}
    return RecurrentInfo


def runs_per_job(lowered) -> int:
    """The runs of the program one job takes (1 unless a recurrent stage was split into
    runs of fewer steps than its sequence): read from the recurrent layers' report
    entries of a :class:`host.compiler.lower.Lowered`."""
    return max((getattr(info, "runs", 1) for info in lowered.layers), default=1)


def _layers(st) -> list[dict]:
    """The stage's layers: ``{"node", "w_arrays", "rows" (H), "cols" (X)}`` each."""
    if "layers" in st:
        return st["layers"]
    return [{"node": st["nodes"][0], "w_arrays": st["w_arrays"], "rows": st["rows"],
             "cols": st["cols"]}]


def _weights(layer) -> tuple[dict, object, object]:
    """The gate dict of ``layer`` (``W_g``, ``U_g``, ``b_g``, GRU's ``b_hn``), ``h0`` and
    ``c0`` (None for a GRU)."""
    node, graph_w, hidden = layer["node"], layer["w_arrays"], layer["rows"]
    w, r, b, h0 = graph_w[:4]
    gates = "fioc" if node.op == "LSTM" else "zrn"
    wts = {}
    for k, g in enumerate(gates):
        wts[f"W_{g}"] = w[k * hidden:(k + 1) * hidden]
        wts[f"U_{g}"] = r[k * hidden:(k + 1) * hidden]
        wts[f"b_{g}"] = b[k * hidden:(k + 1) * hidden]
    if node.op == "GRU" and _lbr(node):
        wts["b_hn"] = b[3 * hidden:]
    return wts, h0, (graph_w[4] if node.op == "LSTM" else None)


def _lbr(node) -> bool:
    return bool(node.attrs.get("linear_before_reset", 0))


def _groups(layer, config, fuse: bool) -> tuple[tuple, str]:
    """The product groups of ``layer`` and, when they are the unfused ones although
    fusing was asked for, why."""
    node, hidden = layer["node"], layer["rows"]
    fused, unfused = (LSTM_FUSED, LSTM_UNFUSED) if node.op == "LSTM" else \
        (GRU_FUSED, GRU_UNFUSED)
    if not fuse:
        return unfused, ""
    if node.attrs.get("quantize_once", True) is False:
        return unfused, "turned off (attrs['quantize_once'] = False)"
    tiles = -(-hidden // config.n)
    widest = max(len(g) for part in fused for g in part)
    if widest * tiles > config.max_length:
        return unfused, (f"the stacked product of {widest} gates needs {widest * tiles} "
                         f"native vectors of result, the build's max_length is "
                         f"{config.max_length}")
    return fused, ""


#: A recurrent node's ``attrs["quant"]`` fields (``host.quant``) and the layer
#: builder's ``quant`` keys they become: static input exponents (E8M0 codes) of the
#: products on x and on h, block exponents of W and R (IR row order, gate by gate).
QUANT_FIELDS = {"input_exponent": "x", "state_exponent": "h", "weight_exponents": "W",
                "recurrence_exponents": "U"}


def _quant(layer, config) -> dict | None:
    """The layer builder's ``quant`` from the node's calibrated settings, or None;
    a CompileError naming the layer for a malformed one."""
    node, hidden = layer["node"], layer["rows"]
    settings = node.attrs.get("quant")
    if not settings:
        return None
    gates = "fioc" if node.op == "LSTM" else "zrn"
    out = {}
    for field, key in QUANT_FIELDS.items():
        value = settings.get(field)
        if value is None:
            continue
        if key in ("x", "h"):
            if not (isinstance(value, (int, np.integer)) and 0 <= value <= MAX_EXPONENT_CODE):
                raise _error(f"{node.where()}: its {field} is {value!r}, not an E8M0 code "
                             f"0..{MAX_EXPONENT_CODE} or None")
            out[key] = int(value)
            continue
        cols = layer["cols"] if key == "W" else hidden
        e = np.asarray(value)
        want = (len(gates) * hidden, -(-cols // config.n))
        if e.shape != want or e.dtype.kind not in "iu":
            raise _error(f"{node.where()}: its calibrated {field} are {e.dtype} {e.shape}, "
                         f"the layer needs integers of shape {want} (one per gate row and "
                         f"native vector of columns)")
        out[key] = {g: e[k * hidden:(k + 1) * hidden] for k, g in enumerate(gates)}
    return out


def _make(layer, bld, mem, groups, source, config):
    wts, h0, c0 = _weights(layer)
    quant = _quant(layer, config)
    if layer.get("x_shift") is not None:       # an input offset (lower._input_shift)
        quant = dict(quant or {}, x_shift=layer["x_shift"])
    if layer["node"].op == "LSTM":
        return lstm_layer(bld, mem, wts, layer["cols"], layer["rows"], h0, c0,
                          groups=groups, source=source, quant=quant)
    return gru_layer(bld, mem, wts, layer["cols"], layer["rows"], h0,
                     linear_before_reset=_lbr(layer["node"]), groups=groups, source=source,
                     quant=quant)


@contextlib.contextmanager
def _placed(layers, config):
    """A chain of the recurrent layers that the build's unit sets place elsewhere than
    their layout (``host.compiler.programs.lstm_layer`` / ``gru_layer`` put each operand
    in the VRF of the MFU its op takes on a build with every unit in every MFU): a
    CompileError naming the layer and the unit sets, instead of the builder's
    ValueError."""
    try:
        yield
    except ValueError as exc:
        if config.unit_sets is None:
            raise
        raise _error(f"{layers[0]['node'].where()}: its chains are laid out for MFUs that "
                     f"build every unit, and this build's unit sets "
                     f"({format_unit_sets(config.unit_sets, config.mfus)}) place them "
                     f"otherwise: {exc}") from None


def _emit_steps(bld, made, steps: int, top_writes, final_writes) -> None:
    """Every layer's step ``t`` (layer 0 first), for ``t < steps``, in their naive order,
    scheduled (:func:`host.compiler.schedule.emit_scheduled`); the top layer's ``h``
    also to ``top_writes``, and in the last step to ``final_writes``."""
    from host.compiler.schedule import emit_scheduled

    def step(t):
        for k, layer in enumerate(made):
            writes = []
            if k == len(made) - 1:
                writes = [*top_writes, *(final_writes if t == steps - 1 else ())]
            layer.step(t, writes)
    emit_scheduled(bld, steps, step)


def _trial(layers, config, groups, steps: int, every: bool) -> tuple[int, int]:
    """``(cycles, instructions)`` the model predicts for ``steps`` scheduled steps of the
    stack with ``groups`` (one per layer), on a scratch build with room for everything."""
    from host.model.core import NpuModel
    big = dataclasses.replace(config, mrf_depth=65536, ivrf_depth=1 << 16, vrf_depth=4096,
                              netq_depth=1 << 16, program_depth=1 << 20)
    bld = Builder(big)
    made, source = [], "netq"
    for layer, g in zip(layers, groups):
        made.append(_make(layer, bld, bld, g, source, config))
        source = made[-1].refs["h"]
    _emit_steps(bld, made, steps, ["netq"] if every else [], [] if every else ["netq"])
    prog = bld.finish()
    model = NpuModel(big)
    for slot, matrix in prog.matrices:
        model.write_weights(slot, matrix)
    model.load_program(prog.words)
    model.push_input(np.zeros((steps * -(-layers[0]["cols"] // config.n), config.n),
                              np.uint16))
    result = model.run()
    if not result.ok:                                  # pragma: no cover (a compiler bug)
        raise RuntimeError(f"the quantize-once trial failed on the model: {result.message}")
    return result.cycles_predicted, len(prog.instructions) - 1


def _steps_per_run(steps: int, per_step: float, fixed: int, budget: int, in_tiles: int,
                   out_per_step: int, out_fixed: int, netq: int) -> int:
    """The largest divisor ``S`` of ``steps`` whose program (``fixed + S * per_step``
    instructions) fits ``budget`` and whose run pops (``S * in_tiles``) and pushes
    (``S * out_per_step + out_fixed``) fit the queues; 0 when not even one step does."""
    for s in sorted((d for d in range(1, steps + 1) if steps % d == 0), reverse=True):
        if fixed + s * per_step <= budget and s * in_tiles <= netq \
                and s * out_per_step + out_fixed <= netq:
            return s
    return 0


def emit_recurrent(st, bld, config, ivrf, vrf, account, infos, slot_next, job_vectors, *,
                   source="netq", last, check_width, reserve: int = 1, fuse: bool = True):
    """Emit the recurrent stage ``st`` into the builder ``bld``.

    ``st`` is the lowering's stage dict: ``nodes`` (the LSTM / GRU nodes, then a
    ``LastStep`` if any), ``every`` (every step's ``h`` is the stage's output, else the
    last one), ``steps`` (T) and ``layers`` (``{"node", "w_arrays" (the IR node's
    constant inputs), "rows" (H), "cols" (X)}``, the first reading ``source``, each next
    one the previous one's every-step ``h``); a stage without ``layers`` is one layer
    described by ``nodes[0]``, ``w_arrays``, ``rows`` and ``cols``.

    ``source`` is where the sequence comes from: ``"netq"`` (the job's ``T`` input
    vectors of X elements, popped from the input queue) or a :class:`Ref` in the IVRF
    that holds each step's input when the step runs. ``ivrf``, ``vrf``, ``account``,
    ``infos``, ``job_vectors`` are the lowering's allocators and records, ``slot_next``
    the next free MRF slot, ``last`` whether this stage is the network's last,
    ``check_width(node, elements, what)`` the lowering's ``max_length`` check,
    ``reserve`` the instructions to leave for the layers after this stage (and ``end``),
    ``fuse`` whether quantize-once may stack products (see the module docstring).

    Returns ``(result, next MRF slot, output rows per job)``: ``result`` is ``"netq"``
    or the Ref (IVRF) of the final ``h``. Sets ``st["instructions"]`` (the stage's
    instructions), ``st["steps_per_run"]`` and ``st["runs"]`` (runs of the program per
    job; more than 1 when the sequence does not fit one program), and replaces each
    layer's report entry in ``infos`` by one that also records ``quantize_once``,
    ``steps_per_run`` and ``runs``.

    Raises
    ------
    CompileError
        the input or state wider than ``max_col_tiles`` or ``max_length``; the MRF, a VRF
        or the IVRF too small; not even one step fitting program memory or the queues
        (the message names the layer, the memory and both sizes).
    """
    layers = _layers(st)
    steps, every = st["steps"], st["every"]
    n = config.n
    for layer in layers:
        node = layer["node"]
        check_width(node, layer["rows"], "state")
        for what, cols in (("input", layer["cols"]), ("state", layer["rows"])):
            if -(-cols // n) > config.max_col_tiles:
                raise _error(f"{node.where()}: its {what} of {cols} elements needs "
                             f"{-(-cols // n)} native vectors, the build's max_col_tiles "
                             f"is {config.max_col_tiles} (N = {n})")
    # Quantize once, where the stacks fit and the model does not predict them slower.
    chosen = [_groups(layer, config, fuse) for layer in layers]
    groups = [g for g, _ in chosen]
    reasons = [why for _, why in chosen]
    unfused = [LSTM_UNFUSED if la["node"].op == "LSTM" else GRU_UNFUSED for la in layers]
    trial_steps = min(steps, TRIAL_STEPS)
    if groups != unfused:
        with _placed(layers, config):
            fused_cycles, fused_instr = _trial(layers, config, groups, trial_steps, every)
            plain_cycles, plain_instr = _trial(layers, config, unfused, trial_steps, every)
        if fused_cycles > plain_cycles * (1 + FUSE_TOLERANCE):
            why = (f"the stacked products are predicted at {fused_cycles} cycles for "
                   f"{trial_steps} steps against {plain_cycles} for separate ones (more "
                   f"than {FUSE_TOLERANCE:.0%} slower: too few independent products "
                   f"left to hide the recurrence's waits)")
            reasons = [r or why if g != u else r for g, u, r in zip(groups, unfused, reasons)]
            groups = unfused
            per_step = plain_instr / trial_steps
        else:
            per_step = fused_instr / trial_steps
    else:
        per_step = _trial(layers, config, groups, trial_steps, every)[1] / trial_steps
    # Steps per run: everything in one program when it fits, else chunks of S steps.
    x_tiles = -(-layers[0]["cols"] // n) if source == "netq" else 0
    h_tiles = -(-layers[-1]["rows"] // n)
    budget = config.program_depth - len(bld.instructions) - reserve
    per_step = int(np.ceil(per_step * 1.05)) + 1        # the schedule's restores, rounding
    s = _steps_per_run(steps, per_step, 8, budget, x_tiles, h_tiles if every else 0,
                       0 if every or not last else h_tiles, config.netq_depth)
    if s == 0:
        node = layers[0]["node"]
        raise _error(f"{node.where()}: program memory needs about {per_step + 8} "
                     f"instructions for one step of this layer (with {len(bld.instructions)}"
                     f" for the layers before it and {reserve} for those after), the build "
                     f"has program_depth {config.program_depth}")
    runs = steps // s
    st["steps_per_run"], st["runs"] = s, runs
    # The real emission: the lowering's memories, S steps, then the schedule.
    start = len(bld.instructions)
    mems, made, src = [], [], source
    for layer, g in zip(layers, groups):
        mem = _RnnMemory(layer["node"], bld, config, ivrf, vrf, account, slot_next,
                         job_vectors)
        try:
            made.append(_make(layer, bld, mem, g, src, config))
        except ValueError as exc:          # the layer builders' own refusals (e.g. groups)
            raise _error(f"{layer['node'].where()}: {exc}") from None
        slot_next = mem.slot_next
        mems.append(mem)
        src = made[-1].refs["h"]
    final = ["netq"] if last and not every else []
    with _placed(layers, config):
        _emit_steps(bld, made, s, ["netq"] if every else [], final)
    st["instructions"] = len(bld.instructions) - start
    chains = sum(1 for i in bld.instructions[start:] if i.opcode.name == "END_CHAIN")
    info_type = _recurrent_info_type()
    for k, (layer, mem, g, why) in enumerate(zip(layers, mems, groups, reasons)):
        node = layer["node"]
        old = infos[id(node)]
        gates = 4 if node.op == "LSTM" else 3
        info = info_type(**{f.name: getattr(old, f.name)
                            for f in dataclasses.fields(old)})
        info.macs = steps * gates * layer["rows"] * (layer["cols"] + layer["rows"])
        info.mrf_slots = [mem.first_slot, mem.slot_next - mem.first_slot]
        info.chains = chains if len(layers) == 1 else chains // len(layers)
        info.quantize_once = {"x": list(g[0]), "h": list(g[1]),
                              "on": g != unfused[k], **({"why_not": why} if why else {})}
        info.steps_per_run, info.runs = s, runs
        infos[id(node)] = info
    keep = None if last else made[-1].refs["h"]
    for mem in mems:
        for ref in mem.ivrf_refs:
            if ref != keep:
                ivrf.free(ref)
    return (keep if keep is not None else "netq"), slot_next, (steps if every else 1)


def _native(values, n: int) -> np.ndarray:
    """Native vectors of FP16 data: uint16 arrays are bit patterns (the stacked biases),
    anything else values (the graph's float initializers)."""
    from host.compiler.programs import native
    values = np.asarray(values)
    return native(values if values.dtype == np.uint16 else values.astype(np.float32), n,
                  "bias")
