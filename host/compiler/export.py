"""Export a network image as one stand-alone Python module that needs only NumPy.

:func:`export_image` (and ``npu export IMAGE.npz -o layer.py``) writes ``layer.py`` and
``layer.npz`` next to it. The module defines ``run(inputs) -> (outputs, counters)``: the
device's outputs, bit for bit, for a batch of jobs, each starting from the image's state
(``memories`` written once, ``job_memories`` rewritten before every job, as
``Device.stream`` does), and the device's counters (totals over the batch, saturating).

How it is made (``docs/export.md``):

* **Trace.** The program has no data-dependent control flow, so it is run once on a
  tracing subclass of :class:`host.model.core.NpuModel` (the image loaded, one job of zero
  inputs pushed). Per chain it records the plan, the registers and the queue positions,
  and the exact weight operands (exponent codes and mantissas) the model hands to
  :func:`host.numerics.mvm.mvm` for every ``mv_mul`` iteration; these go to the ``.npz``.
* **Kernels.** The bit-exact kernels are not rewritten: :class:`_Bundler` copies the one
  implementation in :mod:`host.numerics` (``inspect`` + ``ast``) with every module-level
  function, class and constant they reach, each renamed ``<module>_<name>``; the
  Amaranth enums become standard-library enums with the same members and methods; the
  unary ROM fields (computed tables) are stored in the ``.npz``.
* **Chains.** One function per chain, named after what it computes, over state arrays with
  a leading batch axis; jobs run as one batch unless a job can read memory an earlier
  job wrote (a memory of ``image.memories`` the program writes and later reads before
  writing it again), in which case they run in order.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import io
import os
import sys
import types
from datetime import datetime, timezone

import numpy as np

from host.model import core as _core
from host.model.core import NpuModel
from host.numerics import fp16 as _fp16
from host.numerics import mvm as _mvm
from host.numerics import reduction as _reduction
from host.numerics import unary as _unary
from host.spec.config import NpuConfig
from host.spec.counters import counter_names
from host.spec.image import NetworkImage
from host.spec.isa import Opcode, Reg, Space, vector_spaces
from host.spec.mfu import MfuUnit, allocate

__all__ = ["KERNEL_ROOTS", "ExportError", "bundle_source", "export_image"]


class ExportError(ValueError):
    """An image that cannot be exported (its program fails, or its jobs are not
    self-contained in the queues); the message says why."""


#: The kernels the exported chains call, as ``(module, name)``.
KERNEL_ROOTS = (
    (_mvm, "mvm"),
    (_mvm, "prepare_weights"),
    (_mvm, "mvm_group"),
    (_mvm, "prepare_group"),
    (_fp16, "binary_counts_bits"),
    (_unary, "unary_counts"),
    (_reduction, "reduce_vectors_bits"),
)

# --- the bundler -------------------------------------------------------------------------------

#: Modules outside the standard library that a bundled kernel may refer to, with the name
#: the generated module gives them (Amaranth's enum module becomes the standard one).
_MODULE_NAMES = {"numpy": "np", "amaranth.lib.enum": "enum"}
_MODULE_IMPORTS = {"numpy": "import numpy as np", "amaranth.lib.enum": "import enum"}


def _is_stdlib(modname: str) -> bool:
    return modname.split(".")[0] in sys.stdlib_module_names


def _short(modname: str) -> str:
    return modname.rsplit(".", 1)[-1]


def _fields_override():
    """``host.numerics.unary._fields`` (the computed ROM fields of a region) read from
    the exported ``.npz`` instead of computed again."""
    data = {}
    for name in _unary.REGIONS:
        c0, c1 = _unary._fields(name)
        data[f"rom/{name}/c0"] = np.asarray(c0)
        data[f"rom/{name}/c1"] = np.asarray(c1)
    src = (
        "def unary__fields(name):\n"
        "    \"\"\"``(c0, c1)`` of ROM region ``name``: the arrays\n"
        "    ``host.numerics.unary._fields(name)`` computed at export time, read from the\n"
        "    .npz (the ROM is a computed table, not code).\"\"\"\n"
        "    return _DATA[f'rom/{name}/c0'], _DATA[f'rom/{name}/c1']\n")
    return src, data


#: ``(module name, global name) -> () -> (source, npz arrays)``.
_OVERRIDES = {("host.numerics.unary", "_fields"): _fields_override}

#: ``(module name, global name) -> (module name, function name)``: a definition bundled
#: in place of the first (under its name), because the first reaches outside NumPy (the
#: compiled BFP kernel, loaded with ctypes).
_SUBSTITUTES = {("host.numerics.bfp", "_blocks_kernel"):
                ("host.numerics.bfp", "_numpy_blocks_kernel")}


class _Item:
    __slots__ = ("eager", "key", "lazy", "name", "source")

    def __init__(self, key, name):
        self.key, self.name = key, name
        self.source, self.eager, self.lazy = "", [], []


class _Rewriter(ast.NodeTransformer):
    """Renames a definition's references to project globals and records them.

    Scopes follow Python's rules closely enough for the kernels: a name is local to a
    function when it is a parameter or bound anywhere in it (comprehension variables
    included); class bodies are not visible from their methods. References made while
    no function scope is open are *eager* (needed when the module is imported), the
    others *lazy* (needed when called).
    """

    def __init__(self, bundler, module, defined_name):
        self.b, self.module, self.defined = bundler, module, defined_name
        self.scopes = []             # (kind, names): kind "function" or "class"
        self.eager, self.lazy = [], []

    # scope helpers
    def _local(self, name) -> bool:
        for i, (kind, names) in enumerate(reversed(self.scopes)):
            if kind == "class" and i > 0:
                continue             # a class scope is only visible to its own body
            if name in names:
                return True
        return False

    def _in_function(self) -> bool:
        return any(kind == "function" for kind, _ in self.scopes)

    def _record(self, key):
        (self.lazy if self._in_function() else self.eager).append(key)

    @staticmethod
    def _bound(body_nodes, args=None):
        names = set()
        if args is not None:
            for a in args.posonlyargs + args.args + args.kwonlyargs:
                names.add(a.arg)
            for a in (args.vararg, args.kwarg):
                if a is not None:
                    names.add(a.arg)
        stack = list(body_nodes)
        while stack:
            node = stack.pop()
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
                continue
            if isinstance(node, ast.Lambda):
                continue
            if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
                names.add(node.id)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                for alias in node.names:
                    names.add((alias.asname or alias.name).split(".")[0])
            elif isinstance(node, ast.ExceptHandler) and node.name:
                names.add(node.name)
            elif isinstance(node, (ast.Global, ast.Nonlocal)):
                raise ExportError("cannot bundle a function with 'global' or 'nonlocal'")
            stack.extend(ast.iter_child_nodes(node))
        return names

    # definitions
    def _function(self, node):
        node.decorator_list = [self.visit(d) for d in node.decorator_list]
        node.args.defaults = [self.visit(d) for d in node.args.defaults]
        node.args.kw_defaults = [d if d is None else self.visit(d)
                                 for d in node.args.kw_defaults]
        for a in node.args.posonlyargs + node.args.args + node.args.kwonlyargs + [
                node.args.vararg, node.args.kwarg]:
            if a is not None:
                a.annotation = None          # annotations are documentation only
        if not self.scopes and node.name == self.defined[1]:
            node.name = self.b.name_of(self.defined)
        if hasattr(node, "returns"):
            node.returns = None
        self.scopes.append(("function", self._bound(node.body, node.args)))
        node.body = [self.visit(s) for s in node.body]
        self.scopes.pop()
        return node

    visit_FunctionDef = visit_AsyncFunctionDef = _function

    def visit_Lambda(self, node):
        node.args.defaults = [self.visit(d) for d in node.args.defaults]
        self.scopes.append(("function", self._bound([node.body], node.args)))
        node.body = self.visit(node.body)
        self.scopes.pop()
        return node

    def visit_ClassDef(self, node):
        node.decorator_list = [self.visit(d) for d in node.decorator_list]
        node.bases = [self.visit(b) for b in node.bases]
        # Amaranth's enums take ``shape=``; the standard library's take no keywords.
        node.keywords = [k for k in node.keywords if k.arg != "shape"]
        node.keywords = [self.visit(k) for k in node.keywords]
        if not self.scopes and node.name == self.defined[1]:
            node.name = self.b.name_of(self.defined)
        self.scopes.append(("class", self._bound(node.body)))
        node.body = [self.visit(s) for s in node.body]
        self.scopes.pop()
        return node

    def visit_AnnAssign(self, node):
        # The annotation stays as written (never evaluated under the __future__ import).
        node.target = self.visit(node.target)
        if node.value is not None:
            node.value = self.visit(node.value)
        return node

    def visit_ImportFrom(self, node):
        if node.module and node.module.split(".")[0] not in sys.stdlib_module_names \
                and node.module != "numpy":
            raise ExportError(f"{self.module.__name__}.{self.defined[1]} imports "
                              f"{node.module} inside a function: not bundle-able")
        return node

    # references
    def visit_Name(self, node):
        if isinstance(node.ctx, ast.Load) and not self._local(node.id):
            new = self.b.resolve(self.module, node.id, self._record)
            if new is not None:
                return ast.copy_location(ast.Name(new, node.ctx), node)
        elif isinstance(node.ctx, ast.Store) and not self.scopes \
                and node.id == self.defined[1]:
            return ast.copy_location(ast.Name(self.b.name_of(self.defined), node.ctx), node)
        return node

    def visit_Attribute(self, node):
        base = node.value
        if isinstance(base, ast.Name) and isinstance(base.ctx, ast.Load) \
                and not self._local(base.id):
            obj = self.module.__dict__.get(base.id)
            if isinstance(obj, types.ModuleType) and obj.__name__.startswith("host."):
                key = self.b.origin(obj, node.attr)
                self._record(key)
                return ast.copy_location(ast.Name(self.b.name_of(key), node.ctx), node)
        node.value = self.visit(node.value)
        return node


class _Bundler:
    """Collects module-level definitions of ``host`` modules reachable from some roots and
    emits them as one module's source, dependencies first (see :func:`bundle_source`)."""

    def __init__(self):
        self.items = {}
        self.imports = {}               # line -> None (ordered set)
        self.data = {}                  # npz arrays of overridden tables
        self._trees = {}

    # names and origins
    def name_of(self, key) -> str:
        return f"{_short(key[0])}_{key[1]}"

    def _tree(self, module):
        if module.__name__ not in self._trees:
            self._trees[module.__name__] = ast.parse(inspect.getsource(module))
        return self._trees[module.__name__]

    def origin(self, module, name):
        """``(module name, name)`` of the definition that ``name`` in ``module`` is,
        following ``from host.x import name`` imports to the defining module."""
        obj = module.__dict__.get(name)
        if isinstance(obj, (types.FunctionType, type)) and \
                getattr(obj, "__module__", "").startswith("host.") and \
                getattr(obj, "__name__", None) == name:
            return (obj.__module__, name)
        for node in self._tree(module).body:
            if isinstance(node, ast.ImportFrom) and node.module and \
                    node.module.startswith("host."):
                for alias in node.names:
                    if (alias.asname or alias.name) == name:
                        return self.origin(sys.modules[node.module], alias.name)
        return (module.__name__, name)

    # resolution of a global name
    def _imported(self, module, name):
        """The ``from X import ...`` alias node binding ``name`` in ``module`` and X."""
        for node in self._tree(module).body:
            if isinstance(node, ast.ImportFrom) and node.module:
                for alias in node.names:
                    if (alias.asname or alias.name) == name:
                        return node.module, alias
        return None, None

    def resolve(self, module, name, record):
        """The new name of global ``name`` of ``module`` (recording the dependency), or
        None to keep it (builtins, locals the scope analysis missed, stdlib imports)."""
        if name not in module.__dict__:
            return None                 # a builtin (or a name this module never binds)
        obj = module.__dict__[name]
        if isinstance(obj, types.ModuleType):
            modname = obj.__name__
            if modname in _MODULE_NAMES:
                alias = _MODULE_NAMES[modname]
                if alias != name:
                    raise ExportError(f"{module.__name__} names {modname} {name!r}; the "
                                      f"bundler expects {alias!r}")
                self.imports[_MODULE_IMPORTS[modname]] = None
                return None
            if _is_stdlib(modname):
                line = f"import {modname}" + ("" if name == modname else f" as {name}")
                self.imports[line] = None
                return None
            raise ExportError(f"{module.__name__} refers to module {modname} as {name!r}, "
                              f"which the exported module cannot import")
        source, alias = self._imported(module, name)
        if source is not None and not source.startswith("host."):
            if _is_stdlib(source) or source == "numpy":
                self.imports[f"from {source} import {alias.name}"
                             + (f" as {alias.asname}" if alias.asname else "")] = None
                return None
            raise ExportError(f"{module.__name__}.{name} comes from {source}, which the "
                              f"exported module cannot import")
        key = self.origin(module, name)
        record(key)
        return self.name_of(key)

    def _assignment(self, module, name):
        """The module-level statement that assigns ``name`` in ``module``, or None."""
        for node in self._tree(module).body:
            targets = node.targets if isinstance(node, ast.Assign) else (
                [node.target] if isinstance(node, ast.AnnAssign) and node.value else [])
            for t in targets:
                if isinstance(t, ast.Name) and t.id == name:
                    return node
        return None

    # collection
    def add(self, key):
        """Collect ``key`` and everything it needs (depth first)."""
        if key in self.items:
            return
        item = self.items[key] = _Item(key, self.name_of(key))
        module = sys.modules[key[0]]
        if key in _OVERRIDES:
            item.source, data = _OVERRIDES[key]()
            self.data.update(data)
            return
        obj = module.__dict__[key[1]]
        if key in _SUBSTITUTES:
            node = self._definition(sys.modules[_SUBSTITUTES[key][0]], _SUBSTITUTES[key][1])
            node.name = key[1]
        elif isinstance(obj, (types.FunctionType, type)):
            node = self._definition(module, key[1])
        elif _literal(obj):
            item.source = f"{item.name} = {obj!r}\n"
            return
        else:
            node = self._assignment(module, key[1])
            if node is None:
                raise ExportError(f"cannot bundle {key[0]}.{key[1]}: not a function, "
                                  f"class, literal or module-level assignment")
            node = ast.parse(ast.unparse(node)).body[0]         # a fresh copy
        rw = _Rewriter(self, module, key)
        node = rw.visit(node)
        ast.fix_missing_locations(node)
        item.source = ast.unparse(node) + "\n"
        item.eager, item.lazy = list(dict.fromkeys(rw.eager)), list(dict.fromkeys(rw.lazy))
        for dep in item.eager + item.lazy:
            self.add(dep)

    def _definition(self, module, name):
        for node in self._tree(module).body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == name:
                return ast.parse(ast.unparse(node)).body[0]     # a fresh copy
        raise ExportError(f"no definition of {module.__name__}.{name} in its source")

    def emit(self, roots) -> str:
        """The definitions, each after the ones it needs at import time."""
        order, state = [], {}

        def visit(key):
            if state.get(key):
                return
            state[key] = "active"
            for dep in self.items[key].eager:
                if state.get(dep) == "active":
                    raise ExportError(f"import-time cycle through {key} and {dep}")
                visit(dep)
            order.append(key)
            state[key] = "done"
            for dep in self.items[key].lazy:
                visit(dep)

        for key in roots:
            visit(key)
        return "\n\n".join(self.items[k].source for k in order)


def _literal(value) -> bool:
    if value is None or type(value) in (bool, int, float, str, bytes):
        return True
    if type(value) in (tuple, frozenset):
        return all(_literal(v) for v in value)
    return False


def bundle_source(roots=KERNEL_ROOTS) -> tuple[str, dict, dict]:
    """``(source, data, names)``: the kernels ``roots`` (``(module, name)`` pairs) and
    everything they reach in ``host``, as module source (imports first); ``data`` the
    ``.npz`` arrays the source reads from ``_DATA``; ``names`` maps each root to its name
    in the source. (Cached per process: the sources do not change while it runs.)"""
    source, data, names = _bundle(tuple(roots))
    return source, {k: v.copy() for k, v in data.items()}, dict(names)


@functools.lru_cache(maxsize=4)
def _bundle(roots):
    b = _Bundler()
    keys = [b.origin(m, n) for m, n in roots]
    for key in keys:
        b.add(key)
    body = b.emit(keys)
    imports = "\n".join(sorted(b.imports))
    return imports + "\n\n\n" + body, b.data, {k: b.name_of(k) for k in keys}


# --- the trace ---------------------------------------------------------------------------------

class _Tracer(NpuModel):
    """An NpuModel that records, for every chain it executes, what the export needs."""

    def __init__(self, config, inputs_total):
        super().__init__(config)
        self.records = []
        self._inputs_total = inputs_total
        self._mvm_calls = None

    def _execute(self, chain, clock):
        plan = self._plan(chain)
        rec = {"chain": chain, "plan": plan, "regs": dict(self._regs),
               "in_pos": self._inputs_total - self.input_level,
               "out_pos": self.output_level, "mvm": []}
        self._mvm_calls = rec["mvm"]
        try:
            count = super()._execute(chain, clock)
        finally:
            self._mvm_calls = None
        if chain.mv_mul is not None and len(rec["mvm"]) != plan["iters"]:
            raise ExportError(f"chain at instruction {chain.start}: {len(rec['mvm'])} "
                              f"products traced for {plan['iters']} iterations")
        self.records.append(rec)
        return count


def _traced_mvm(tracer_ref):
    real = _core.mvm

    def mvm(x_bits, codes_w, qw, **kw):
        tracer = tracer_ref[0]
        if tracer is not None and tracer._mvm_calls is not None:
            tracer._mvm_calls.append((np.array(codes_w, np.uint8), np.array(qw), dict(kw)))
        return real(x_bits, codes_w, qw, **kw)
    return mvm, real


def _trace(image: NetworkImage, config: NpuConfig):
    """Run the image's program once on a :class:`_Tracer`; returns it and the number of
    input vectors per job."""
    k = image.inputs
    if k is None:                      # a version 1 image: as many as one job pops
        k = _count_inputs(image, config)
    tracer = _Tracer(config, k)
    for space, addr, data in list(image.memories) + list(image.job_memories):
        tracer.write(space, addr, data)
    tracer.load_program(image.program)
    if k:
        tracer.push_input(np.zeros((k, config.n), np.uint16))
    ref = [tracer]
    patched, real = _traced_mvm(ref)
    _core.mvm = patched
    try:
        result = tracer.run()
    finally:
        _core.mvm = real
    if not result.ok:
        raise ExportError(f"the image's program fails on {_build_text(config)}: "
                          f"{result.error.name} at instruction {result.pc}: {result.message}")
    if tracer.input_level:
        raise ExportError(f"a job pops {k - tracer.input_level} of its {k} input vectors; "
                          f"the rest would be read by the next job")
    if tracer.output_level != image.outputs:
        raise ExportError(f"a job pushes {tracer.output_level} output vectors; the image "
                          f"says {image.outputs}")
    return tracer, k


def _count_inputs(image, config) -> int:
    probe = NpuModel(config)
    for space, addr, data in list(image.memories) + list(image.job_memories):
        probe.write(space, addr, data)
    probe.load_program(image.program)
    probe.push_input(np.zeros((config.netq_depth, config.n), np.uint16))
    probe.run()
    return config.netq_depth - probe.input_level


def _iteration_ranges(rec, i):
    reads = [(s, a + i * inc, a + i * inc + c) for s, a, c, inc, *_ in rec["plan"]["reads"]]
    writes = [(s, a + i * inc, a + i * inc + c) for s, a, c, inc, _ in rec["plan"]["writes"]]
    return reads, writes


def _jobs_dependent(records, image) -> str:
    """Why a job can read what an earlier job wrote ('' when it cannot): a location the
    program writes that ``job_memories`` does not rewrite, read by the program before it
    writes that location in the same job."""
    fresh = set()
    for space, addr, data in image.job_memories:
        if Space(space) is not Space.MRF:
            fresh.update((Space(space), a) for a in range(addr, addr + len(data)))
    carried = set()
    for rec in records:
        for i in range(rec["plan"]["iters"]):
            for s, a, b in _iteration_ranges(rec, i)[1]:
                carried.update((s, x) for x in range(a, b) if (s, x) not in fresh)
    own = set()
    for rec in records:
        for i in range(rec["plan"]["iters"]):
            reads, writes = _iteration_ranges(rec, i)
            for s, a, b in reads:
                for x in range(a, b):
                    if (s, x) in carried and (s, x) not in own:
                        return (f"the chain at instruction {rec['chain'].start} reads "
                                f"{s.name} {x}, which an earlier job writes and "
                                f"job_memories do not rewrite")
            for s, a, b in writes:
                own.update((s, x) for x in range(a, b))
    return ""


# --- code generation ---------------------------------------------------------------------------

_UNARY_SHORT = {"relu": "relu", "sigmoid": "sigm", "tanh": "tanh", "exp": "exp",
                "recip": "recip", "pass": "pass"}


def _space_name(space: Space) -> str:
    return space.name.lower()


def _chain_name(index: int, rec) -> str:
    chain = rec["chain"]
    parts = []
    if chain.mv_mul is not None:
        parts.append(f"mv_mul_slot{chain.mv_mul.operand}")
    else:
        parts.append(f"from_{_space_name(chain.read.space)}")
    for ins in chain.ops:
        if ins.opcode is Opcode.VV:
            parts.append(ins.func.name.lower())
        elif ins.opcode is Opcode.V_UNARY:
            parts.append(_UNARY_SHORT.get(ins.func.name.lower(), ins.func.name.lower()))
        else:
            parts.append(f"{ins.func.name.lower()}_reduce")
    parts.append("to_" + "_and_".join(_space_name(w.space) for w in chain.writes))
    return f"chain_{index:02d}_" + "_".join(parts)


def _addr(base: int, inc: int) -> str:
    """``base + i * inc`` as short source text (``i`` is the iteration)."""
    if not inc:
        return f"{base}"
    step = "i" if inc == 1 else f"i * {inc}"
    return step if base == 0 else f"{base} + {step}"


def _product_groups(records, chain_keys) -> dict:
    """``{record index: keys}``: runs of chains of one iteration each whose products
    (consecutive ones: chains without a product in between are passed over) read the same
    vectors (the same memory, address and pieces) with the same parameters and distinct
    matrices, each chain of a run mapped to the run's keys. (A hint only: at run time a
    kept result is used only for an input equal to the one it was computed from, so a
    chain in between that rewrites those vectors costs a product, never a wrong
    result.)"""
    def signature(index, rec):
        chain, plan = rec["chain"], rec["plan"]
        if chain.mv_mul is None or plan["iters"] != 1 or chain.read.space is Space.NETQ:
            return None
        kw = rec["mvm"][0][2]
        return (chain.read.space, chain.read.operand, tuple(map(tuple, plan["pieces"])),
                plan["pix"], plan["lanes_cols"], int(kw["rounding"].value),
                kw["static_exponent_code"], kw["narrow_width"])

    groups, run, last = {}, [], None

    def close():
        keys = tuple(chain_keys[i][0] for i in run)
        if len(run) > 1 and len(set(keys)) == len(keys):
            groups.update(dict.fromkeys(run, keys))

    for index, rec in enumerate(records):
        if rec["chain"].mv_mul is None:
            continue            # chains without a product do not end a run
        sig = signature(index, rec)
        if sig is not None and sig == last:
            run.append(index)
            continue
        close()
        run, last = ([index], sig) if sig is not None else ([], None)
    close()
    return groups


def _chain_source(index, rec, weights, cfg, groups=None) -> tuple[str, str]:
    """The function of one traced chain and its name (``groups``: see
    :func:`_product_groups`)."""
    groups = groups or {}
    chain, plan, regs = rec["chain"], rec["plan"], rec["regs"]
    name = _chain_name(index, rec)
    length, iters = plan["length"], plan["iters"]
    text = "; ".join(str(ins) for ins in
                     [chain.read] + ([chain.mv_mul] if chain.mv_mul else []) + list(chain.ops)
                     + list(chain.writes))
    lines = [f"def {name}(state, inputs, outputs, counts):",
             f'    """Instructions {chain.start}..{chain.stop - 1}: {text}; end_chain.',
             f"    ITERATIONS {iters}, ROWS {regs[Reg.ROWS]} ({length} native vectors)"
             + (f", COLS {regs[Reg.COLS]}, window {regs[Reg.WIN_W]} x {regs[Reg.WIN_H]} "
                f"(pitch {regs[Reg.WIN_PITCH]})" if chain.mv_mul else "") + '."""']
    loop = iters > 1
    ind = "        " if loop else "    "
    if loop:
        lines.append(f"    for i in range({iters}):")
    else:
        lines.append("    i = 0")
    rd = chain.read
    if rd.space is Space.NETQ:
        c_in = plan["c_in"]
        start = rec["in_pos"]
        lines.append(f"{ind}p = {_addr(start, c_in if loop else 0)}")
        lines.append(f"{ind}x = inputs[:, p:p + {c_in}].copy()")
    else:
        mem = f"state[{_space_name(rd.space)!r}]"
        lines.append(f"{ind}a = {_addr(rd.operand, rd.inc)}")
        pieces = plan["pieces"]
        if len(pieces) == 1:
            off, cnt = pieces[0]
            lines.append(f"{ind}x = {mem}[:, a + {off}:a + {off + cnt}].copy()")
        else:
            parts = ", ".join(f"{mem}[:, a + {off}:a + {off + cnt}]" for off, cnt in pieces)
            lines.append(f"{ind}x = np.concatenate([{parts}], axis=1)")
    if chain.mv_mul is not None:
        mv = chain.mv_mul
        keys = weights[index]
        if len(set(keys)) == 1:
            wexpr = repr(keys[0])
        else:
            lines.insert(3, f"    slots = {keys!r}")
            wexpr = "slots[i]"
        kw = rec["mvm"][0][2]
        lines.append(f"{ind}# the matrix from tile slot {_addr(mv.operand, mv.inc)}")
        grp = groups.get(index)
        lines.append(f"{ind}y = _product(x, {wexpr}, pix={plan['pix']}, "
                     f"lanes_cols={plan['lanes_cols']}, rounding={int(kw['rounding'].value)}, "
                     f"static_exponent_code={kw['static_exponent_code']!r}, "
                     f"narrow_width={kw['narrow_width']}, counts=counts"
                     + (f", group={grp!r})" if grp else ")"))
    else:
        lines.append(f"{ind}y = x")
    if plan["ops"]:
        placed = allocate(plan["ops"], cfg.mfus, cfg.unit_sets)
        vv = [ins for ins in chain.ops if ins.opcode is Opcode.VV]
        k = 0
        for m, ops in enumerate(placed):
            for op in ops:
                if op.unit in (MfuUnit.ADDSUB, MfuUnit.MUL):
                    ins = vv[k]
                    space = plan["vv_spaces"][k]
                    k += 1
                    b = (f"state[{_space_name(space)!r}][:, {_addr(ins.operand, ins.inc)}:"
                         f"{_addr(ins.operand, ins.inc)} + {length}]")
                    lines.append(f"{ind}y = _binary({op.op.name.lower()!r}, y, {b}, "
                                 f"mfu={m}, counts=counts)")
                elif op.unit is MfuUnit.ACT:
                    lines.append(f"{ind}y = _unary({op.op.name.lower()!r}, y, mfu={m}, "
                                 f"counts=counts)")
                else:
                    lines.append(f"{ind}y = _reduce({op.op.name.lower()!r}, y, "
                                 f"lanes_last={plan['lanes_last']}, mfu={m}, counts=counts)")
    nq = 0
    netq = sum(w.space is Space.NETQ for w in chain.writes)
    for w in chain.writes:
        if w.space is Space.NETQ:
            o0 = rec["out_pos"] + nq * length
            step = netq * length
            lines.append(f"{ind}o = {_addr(o0, step if loop else 0)}")
            lines.append(f"{ind}outputs[:, o:o + {length}] = y")
            nq += 1
        else:
            a = _addr(w.operand, w.inc)
            lines.append(f"{ind}state[{_space_name(w.space)!r}][:, {a}:{a} + {length}] = y")
    return "\n".join(lines) + "\n", name


_HELPERS = '''
#: ``prepare_weights`` of each WEIGHTS entry, made on first use.
_PREPARED = {{}}
#: What one ``run`` call keeps between its products, per thread (so that runs in two
#: threads do not see each other's): ``"quantized"``, the last quantized input of a
#: product (``mvm``'s ``quantized_cache``: products of one input, an LSTM's gates,
#: quantize it once); ``"grouped"``, results of a group's product for the members not yet
#: run: key -> (parameters, input, MvmResult).
_RUN = threading.local()


def _run_cache(name):
    return _RUN.__dict__.setdefault(name, {{}})


def _prepared(key):
    if key not in _PREPARED:
        codes_w, qw = WEIGHTS[key]
        _PREPARED[key] = {prepare_weights}(codes_w, qw, n=N, mantissa_bits_w=MANTISSA_BITS_W)
    return _PREPARED[key]


def _product(x, key, *, pix, lanes_cols, rounding, static_exponent_code, narrow_width,
             counts, group=None):
    """The MVM of one iteration for every job: ``x`` (B, C, N) gathered input vectors (a
    copy); ``WEIGHTS[key]`` the (codes, mantissas) the MRF slots hold, gathered in the
    kernel's order at export time. Lanes past COLS in each pixel's last native vector do
    not enter the quantizer. Counts as the model does.

    ``group``: the keys of the products of consecutive chains that read the same vectors
    (found at export time). The first of them runs them all (``mvm_group``: one matrix
    product where it is exact) and keeps the others' results, which a later member takes
    only when its input is equal to the one they were computed from (else it runs its
    own product); counts are added when a result is taken."""
    if lanes_cols < N:
        x[:, pix - 1::pix, lanes_cols:] = 0
    xb = x.reshape(len(x), -1)
    kw = dict(n=N, mantissa_bits_v=MANTISSA_BITS_V, mantissa_bits_w=MANTISSA_BITS_W,
              rounding={rounding}(rounding), static_exponent_code=static_exponent_code,
              narrow_width=narrow_width, quantized_cache=_run_cache("quantized"))
    params = (rounding, static_exponent_code, narrow_width)
    grouped = _run_cache("grouped")
    kept = grouped.pop(key, None)
    if kept is not None and kept[0] == params and np.array_equal(kept[1], xb):
        res = kept[2]
    elif group is not None and key in group:
        if group not in _PREPARED:
            _PREPARED[group] = {prepare_group}(
                [WEIGHTS[k] + (_prepared(k),) for k in group], n=N,
                mantissa_bits_w=MANTISSA_BITS_W)
        results = {mvm_group}(xb, _PREPARED[group], **kw)
        grouped.clear()
        xc = xb.copy()
        for k, r in zip(group, results):
            if k != key:
                grouped[k] = (params, xc, r)
        res = results[group.index(key)]
    else:
        codes_w, qw = WEIGHTS[key]
        res = {mvm}(xb, codes_w, qw, accumulators=False, prepared=_prepared(key), **kw)
    counts["vector_saturations"] += int(np.sum(res.vector_saturated))
    counts["vector_nonfinite"] += int(np.sum(res.vector_nonfinite))
    counts["narrow_events"] += int(np.sum(res.narrow.total))
    counts["output_saturations"] += int(np.sum(res.output_saturated))
    return res.out_bits.reshape(len(x), -1, N)


def _binary(op, y, b, *, mfu, counts):
    """An ADDSUB or MUL unit of MFU ``mfu``: ``op(y, b)`` and its events."""
    out, overflow, nan_created = {binary_counts_bits}(op, y, b)
    counts[f"mfu{{mfu}}_overflow"] += overflow
    counts[f"mfu{{mfu}}_nan_created"] += nan_created
    return out


def _unary(op, y, *, mfu, counts):
    """The ACT unit of MFU ``mfu`` (the build's unary ops) and its events."""
    out, overflow, nan_created = {unary_counts}(op, y, ops=UNARY_OPS)
    counts[f"mfu{{mfu}}_overflow"] += overflow
    counts[f"mfu{{mfu}}_nan_created"] += nan_created
    return out


def _reduce(op, y, *, lanes_last, mfu, counts):
    """The REDUCE unit of MFU ``mfu``, one job at a time (the kernel takes one logical
    vector)."""
    out = np.empty_like(y)
    for j in range(len(y)):
        out[j], overflow, nan_created = {reduce_vectors_bits}(op, y[j], lanes_last)
        counts[f"mfu{{mfu}}_overflow"] += overflow
        counts[f"mfu{{mfu}}_nan_created"] += nan_created
    return out
'''

_RUN = '''
def _initial_state(jobs, writable):
    """Every vector memory as the image leaves it before a job (``memories``, then
    ``job_memories``), with a leading axis of ``jobs``; memories the program never writes
    are shared read-only views."""
    state = {{}}
    for space in SPACES:
        mem = _DATA[f"state/{{space}}"].copy()
        for k, (where, addr) in enumerate(JOB_MEMORIES):
            if where == space:
                data = _DATA[f"job/{{k}}"]
                mem[addr:addr + len(data)] = data
        if space in writable:
            state[space] = np.repeat(mem[None], jobs, axis=0)
        else:
            state[space] = np.broadcast_to(mem, (jobs,) + mem.shape)
    return state


def _job_memories(state):
    """Rewrite ``job_memories`` into ``state`` (what the host does before every job;
    memories the program never writes still hold them)."""
    for k, (space, addr) in enumerate(JOB_MEMORIES):
        if space in WRITTEN:
            data = _DATA[f"job/{{k}}"]
            state[space][:, addr:addr + len(data)] = data


def _program(state, inputs, outputs, counts):
    """The whole program on a batch of jobs: every chain, in program order."""
{calls}


def run(inputs):
    """Run a batch of jobs: ``inputs`` (jobs, {k}, {n}) FP16 bit patterns (uint16) or
    float16 values. Returns ``(outputs, counters)``: uint16 (jobs, {outputs}, {n}), what
    the device pushes for each job, and the device's counters: totals over the batch,
    saturating at 2**{counter_bits} - 1.

    Every job starts from the image's state (``memories`` written once,
    ``job_memories`` rewritten before it) and the program's registers at their
    power-on values. {mode}
    """
    x = np.asarray(inputs)
    if x.dtype == np.float16:
        x = x.view(np.uint16)
    if x.dtype != np.uint16:
        raise TypeError(f"inputs must be uint16 FP16 bit patterns or float16, not {{x.dtype}}")
    if x.ndim != 3 or x.shape[1:] != ({k}, {n}):
        raise ValueError(f"inputs must have shape (jobs, {k}, {n}), not {{x.shape}}")
    jobs = len(x)
    outputs = np.zeros((jobs, {outputs}, {n}), np.uint16)
    counts = dict.fromkeys(COUNTERS, 0)
    if SEQUENTIAL:
        state = _initial_state(1, WRITTEN)
        for j in range(jobs):
            if j:
                _job_memories(state)
            _program(state, x[j:j + 1], outputs[j:j + 1], counts)
    elif jobs:
        _program(_initial_state(jobs, WRITTEN), x, outputs, counts)
    _run_cache("quantized").clear()    # no batch's inputs kept past the call
    _run_cache("grouped").clear()
    top = (1 << COUNTER_BITS) - 1
    return outputs, {{name: min(top, counts[name]) for name in COUNTERS}}
'''


def _build_text(config) -> str:
    return ", ".join(f"{f.name}={_config_value(getattr(config, f.name))}"
                     for f in dataclasses.fields(config))


def _config_value(v):
    if isinstance(v, tuple):            # unary_ops (names), unit_sets (one tuple per MFU)
        return "(" + ", ".join(_config_value(op) if isinstance(op, tuple)
                               else op.name.lower() for op in v) + ")"
    return repr(v)


def _config_of(image: NetworkImage, config):
    if config is not None:
        return config
    return image.build()


def export_image(image, path, *, config: NpuConfig | None = None,
                 source: str | None = None) -> tuple[str, str]:
    """Write ``path`` (a ``.py`` module) and the ``.npz`` of the same stem next to it.

    Parameters
    ----------
    image : NetworkImage, or the path of an image file
    path : str or path-like
        The module to write (``.py`` is added when missing).
    config : NpuConfig, optional
        The build; default the image's own (``image.config``), else the default build.
    source : str, optional
        Where the image came from, for the module's header (default: the image's path,
        or "a NetworkImage in memory").

    Returns ``(py_path, npz_path)``.

    Raises
    ------
    ExportError
        the program fails on the build, or a job would leave input vectors to the next
        one or push another number of outputs than the image says; the image runs its
        program more than once per job (``image.runs``).
    OSError
        when the files cannot be written.
    """
    if not isinstance(image, NetworkImage):
        source = source or str(image)
        image = NetworkImage.load(image)
    source = source or "a NetworkImage in memory"
    if image.runs > 1:
        # The exported layer runs the program once per job; a job of several runs (the
        # state kept on the device between them) is not modelled there.
        raise ExportError(f"the image runs its program {image.runs} times per job (a "
                          f"sequence in chunks of steps, the state kept between runs); the "
                          f"exported NumPy layer runs a job as one run: compile the model "
                          f"for a build whose program_depth and netq_depth hold the whole "
                          f"sequence to export it")
    cfg = _config_of(image, config)
    image.check_config(cfg)
    path = os.fspath(path)
    if not path.endswith(".py"):
        path += ".py"
    stem = os.path.splitext(os.path.basename(path))[0]
    npz_path = os.path.splitext(path)[0] + ".npz"

    tracer, k = _trace(image, cfg)
    records = tracer.records
    why = _jobs_dependent(records, image)

    kernels, data, names = bundle_source()
    arrays = dict(data)
    # The state before a job: memories written once (job memories separately).
    scratch = NpuModel(cfg)
    for space, addr, mem in image.memories:
        scratch.write(space, addr, mem)
    spaces = vector_spaces(cfg)                 # the VRFs the build has (unit sets)
    for space in spaces:
        depth = cfg.ivrf_depth if space is Space.IVRF else cfg.vrf_depth
        arrays[f"state/{_space_name(space)}"] = scratch.read(space, 0, depth)
    job_memories = []
    for space, addr, mem in image.job_memories:
        if Space(space) is Space.MRF:
            continue                 # the MRF is read at export time (WEIGHTS)
        arrays[f"job/{len(job_memories)}"] = np.asarray(mem, np.uint16)
        job_memories.append((_space_name(Space(space)), int(addr)))
    # Weights: one entry per distinct (base slot, rows, columns) of the products.
    weights, chain_keys = {}, {}
    for index, rec in enumerate(records):
        if rec["chain"].mv_mul is None:
            continue
        keys = []
        mv = rec["chain"].mv_mul
        for i, (codes_w, qw, _kw) in enumerate(rec["mvm"]):
            key = f"slot{mv.operand + i * mv.inc}_{codes_w.shape[0]}x{codes_w.shape[1]}"
            if key in weights:
                if not (np.array_equal(weights[key][0], codes_w)
                        and np.array_equal(weights[key][1], qw)):
                    raise ExportError(f"the weights at {key} differ between two products")
            else:
                weights[key] = (codes_w, qw)
            keys.append(key)
        chain_keys[index] = keys
    for key, (codes_w, qw) in weights.items():
        arrays[f"weights/{key}/codes"] = codes_w
        arrays[f"weights/{key}/mantissas"] = qw
    written = sorted({_space_name(s) for rec in records for s, *_ in rec["plan"]["writes"]})

    chain_sources, calls = [], []
    groups = _product_groups(records, chain_keys)
    for index, rec in enumerate(records):
        src, name = _chain_source(index, rec, chain_keys, cfg, groups)
        chain_sources.append(src)
        calls.append(f"    {name}(state, inputs, outputs, counts)")

    helpers = _HELPERS.format(
        mvm=names[(_mvm.__name__, "mvm")],
        prepare_weights=names[(_mvm.__name__, "prepare_weights")],
        mvm_group=names[(_mvm.__name__, "mvm_group")],
        prepare_group=names[(_mvm.__name__, "prepare_group")],
        rounding="formats_Rounding",
        binary_counts_bits=names[(_fp16.__name__, "binary_counts_bits")],
        unary_counts=names[(_unary.__name__, "unary_counts")],
        reduce_vectors_bits=names[(_reduction.__name__, "reduce_vectors_bits")])
    if "formats_Rounding" not in kernels:
        raise ExportError("the bundled kernels lack formats_Rounding")
    mode = (f"Jobs run one after another: {why}." if why else
            "No job reads state another job wrote, so the jobs run as one batch "
            "(every state array has a leading job axis).")
    run_src = _RUN.format(calls="\n".join(calls) if calls else "    pass", k=k, n=cfg.n,
                          outputs=image.outputs, counter_bits=cfg.counter_bits, mode=mode)
    config_lines = "\n".join(f"    {f.name} = {_config_value(getattr(cfg, f.name))}"
                             for f in dataclasses.fields(cfg))
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    header = f'''"""A network image exported as plain NumPy: ``run(inputs) -> (outputs, counters)``.

Exported by ``host.compiler.export.export_image`` (``npu export``) on {stamp} from
{source}
({len(records)} chains, {len(image.program)} instruction words; {k} input
vector{'s' if k != 1 else ''} and {image.outputs} output vector{'s' if image.outputs != 1 else ''} per job).

It reproduces, bit for bit, the device of this build configuration (NpuConfig):

{config_lines}

Outputs equal what that device pushes for each job when the job starts from the image's
state; counters equal the device's counters (totals over the batch, saturating at
2**counter_bits - 1), named as ``host.spec.counters.counter_names``.
{mode}

Contents: the kernels (generated from ``host.numerics``, each renamed
``<module>_<name>``), one function per chain of the program (named after what it
computes), and ``run``. Weights (as the MRF holds them, gathered per product), the
memory images and the unary ROM fields are read from ``{stem}.npz`` next to this file.
The module needs only NumPy and the standard library; see ``docs/export.md``.
"""

from __future__ import annotations

import os as _os

'''
    prelude = f'''

_DATA = dict(_np_load(_os.path.join(_os.path.dirname(_os.path.abspath(__file__)), {stem + ".npz"!r})))

N = {cfg.n}
MANTISSA_BITS_V = {cfg.mantissa_bits_v}
MANTISSA_BITS_W = {cfg.mantissa_bits_w}
COUNTER_BITS = {cfg.counter_bits}
UNARY_OPS = {tuple(op.name.lower() for op in cfg.unary_ops)!r}
COUNTERS = {tuple(counter_names(cfg))!r}
#: Vector memories and the ``job_memories`` ((space, address), data in ``job/<k>``).
SPACES = {tuple(_space_name(s) for s in spaces)!r}
JOB_MEMORIES = {tuple(job_memories)!r}
#: Memories the program writes (they get a private copy per job).
WRITTEN = {tuple(written)!r}
#: Whether a job can read what an earlier job wrote (then jobs run in order).
SEQUENTIAL = {bool(why)!r}
#: Weight operands of the products: ``(codes (rows, C) uint8, mantissas (rows, C*N))``.
WEIGHTS = {{key.split("/")[1]: (_DATA[f"weights/{{key.split('/')[1]}}/codes"],
                                _DATA[key])
           for key in _DATA if key.startswith("weights/") and key.endswith("/mantissas")}}
'''
    kernels_head, kernels_body = kernels.split("\n\n\n", 1)
    if "import numpy as np" not in kernels_head:
        kernels_head += "\nimport numpy as np"
    kernels_head = "import threading\n" + kernels_head
    text = (header + kernels_head + "\n\n\ndef _np_load(path):\n"
            "    with np.load(path, allow_pickle=False) as f:\n"
            "        return {name: f[name] for name in f.files}\n"
            + prelude + "\n\n# --- kernels (generated from host.numerics) " + "-" * 40
            + "\n\n" + kernels_body + "\n\n# --- glue: the model's chain steps on a batch "
            + "-" * 37 + "\n" + helpers + "\n\n# --- the chains " + "-" * 66 + "\n\n\n"
            + "\n\n".join(chain_sources) + "\n" + run_src)
    compile(text, path, "exec")            # a syntax error here is a bug of the exporter
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    with open(npz_path, "wb") as f:
        f.write(buf.getvalue())
    with open(path, "w") as f:
        f.write(text)
    return path, npz_path
