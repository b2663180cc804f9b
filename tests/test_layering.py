"""The import layering of ``docs/architecture.md``, checked on every module's imports.

Each module of ``host``, ``hw`` and ``sim`` is parsed (not imported) and every import it
makes, at the top or inside a function, is resolved to a module of the project. The rules:

* ``host`` never imports ``hw`` or ``sim``;
* ``hw`` imports only ``host.spec`` and ``host.numerics`` of the host package;
* the host layers go up in this order, and a module imports only its own layer and the
  ones below: ``spec`` < ``numerics`` < ``model`` < ``runtime`` < ``compiler`` < ``quant``
  < ``cli``;
* no import circles among modules.

Each rule is also shown to fail: the checker is run on a small made-up tree that breaks it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("host", "hw", "sim")
HOST_LAYERS = ("spec", "numerics", "model", "runtime", "compiler", "quant", "cli")


def _module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules(root: Path) -> dict[str, Path]:
    """Every module of the project's packages under ``root``, by dotted name."""
    return {_module_name(root, p): p for pkg in PACKAGES if (root / pkg).is_dir()
            for p in sorted((root / pkg).rglob("*.py"))}


def imports(root: Path, name: str, path: Path, known: set[str]) -> set[str]:
    """The project modules that module ``name`` imports (resolved to the longest known
    module name: ``from host.spec import isa`` is ``host.spec.isa``)."""
    is_package = path.name == "__init__.py"
    found = set()

    def add(target: str) -> None:
        while target and target not in known:
            target = target.rpartition(".")[0]
        if target and target != name:
            found.add(target)

    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[:len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module
            for alias in node.names:
                full = f"{module}.{alias.name}"
                add(full if full in known else module)
    return found


def graph(root: Path) -> dict[str, set[str]]:
    mods = modules(root)
    known = set(mods)
    return {name: imports(root, name, path, known) for name, path in mods.items()}


def _host_layer(module: str) -> int | None:
    parts = module.split(".")
    if parts[0] != "host" or len(parts) < 2:
        return None
    return HOST_LAYERS.index(parts[1]) if parts[1] in HOST_LAYERS else None


def violations(g: dict[str, set[str]]) -> list[str]:
    """Every import that breaks a layering rule, as ``"a imports b: why"``."""
    out = []
    for a, targets in sorted(g.items()):
        top = a.split(".")[0]
        for b in sorted(targets):
            btop = b.split(".")[0]
            if top == "host" and btop in ("hw", "sim"):
                out.append(f"{a} imports {b}: host never imports hw or sim")
            elif top == "hw" and btop == "host" and _host_layer(b) not in (0, 1):
                out.append(f"{a} imports {b}: hw imports only host.spec and host.numerics")
            elif top == "hw" and btop == "sim":
                out.append(f"{a} imports {b}: hw never imports sim")
            elif top == "host" and btop == "host":
                la, lb = _host_layer(a), _host_layer(b)
                if a != "host" and la is None:
                    out.append(f"{a}: a host module outside the layers {HOST_LAYERS}")
                elif b != "host" and lb is None:
                    out.append(f"{a} imports {b}: not a module of a host layer")
                elif la is not None and lb is not None and lb > la:
                    out.append(f"{a} imports {b}: host.{HOST_LAYERS[la]} is below "
                               f"host.{HOST_LAYERS[lb]}")
    return out


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of ``g`` (one path around each strongly connected component)."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):                                       # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(g.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in g.get(v, ()):
                found.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return found


# --- the project -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def project():
    return graph(REPO)


def test_the_graph_sees_the_project(project):
    # The checker must see real imports, or every rule passes vacuously.
    assert "host.spec.isa" in project["hw.core.decode"]
    assert "host.numerics.unary" in project["hw.arith.fp16_unary"]
    assert "host.model.core" in project["host.compiler.image"]
    assert len(project) > 60


def test_layering_rules_hold(project):
    assert violations(project) == []


def test_no_import_circles(project):
    assert cycles(project) == []


def test_host_spec_imports_only_host_spec(project):
    bad = {(a, b) for a, t in project.items() if a.startswith("host.spec")
           for b in t if b.startswith("host.") and not b.startswith("host.spec")}
    assert bad == set()


# --- the checker fails on trees that break each rule -------------------------------------------

def _tree(tmp_path, files: dict[str, str]) -> Path:
    for rel, text in {"host/__init__.py": "", "hw/__init__.py": "", "sim/__init__.py": "",
                      "host/spec/__init__.py": "", "host/spec/isa.py": "",
                      "host/model/__init__.py": "", "host/model/core.py": "",
                      "host/runtime/__init__.py": "", "host/runtime/device.py": "",
                      "hw/core.py": "", "sim/board.py": "", **files}.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    return tmp_path


@pytest.mark.parametrize("rel, text, says", [
    ("host/model/core.py", "def f():\n    from hw.core import X\n", "host never imports hw"),
    ("host/runtime/device.py", "import sim.board\n", "host never imports hw or sim"),
    ("hw/core.py", "from host.model import core\n", "hw imports only host.spec"),
    ("hw/core.py", "from host.runtime.device import Device\n", "hw imports only host.spec"),
    ("host/spec/isa.py", "from host.model.core import NpuModel\n",
     "host.spec is below host.model"),
    ("host/model/core.py", "from ..runtime import device\n",
     "host.model is below host.runtime"),
])
def test_a_forbidden_import_is_caught(tmp_path, rel, text, says):
    g = graph(_tree(tmp_path, {rel: text}))
    assert any(says in v for v in violations(g)), violations(g)


def test_a_circle_is_caught(tmp_path):
    g = graph(_tree(tmp_path, {"host/runtime/device.py": "from host.runtime import server\n",
                               "host/runtime/server.py": "import host.runtime.device\n"}))
    assert cycles(g) == [["host.runtime.device", "host.runtime.server"]]
