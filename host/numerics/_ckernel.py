"""Build and load the compiled host BFP kernel (``_bfp_kernel.c``) with ctypes.

The C source is compiled on first use with ``gcc`` into a shared library in a cache
directory and loaded with :mod:`ctypes` (no Python headers, no extension build):

* cache directory: ``$NPU_KERNEL_CACHE`` if set, else ``$XDG_CACHE_HOME/bfp-npu``, else
  ``~/.cache/bfp-npu``;
* file name: ``bfp_kernel-<hash>.so``, the hash over the C source, the compiler command
  and ``platform.machine()``, so that an edited source or another machine type never loads
  a stale library;
* the compiler writes a temporary file in that directory, which is then renamed
  (``os.replace``) to the final name: parallel processes (pytest-xdist workers) either
  find the complete file or build their own, never load a half-written one.

The compiler flags are fixed: ``-O3 -std=c99 -ffp-contract=off -fPIC -shared``. No
``-march=native`` (the library is shared per machine type, not per CPU) and no
``-ffast-math``: the kernel's exactness rests on IEEE rounding evaluated as written (see
the comment at the top of ``_bfp_kernel.c``).

``$NPU_HOST_KERNEL`` chooses the kernel: ``numpy`` forces the NumPy path, ``c`` makes a
failed build an error instead of a silent fallback, and anything else (or unset) means
``auto``: the C kernel if it builds, else the NumPy path. :func:`status` tells which is
in use and why.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import NamedTuple

__all__ = [
    "CFLAGS",
    "ENV_CACHE",
    "ENV_KERNEL",
    "SOURCE",
    "KernelError",
    "KernelStatus",
    "cache_dir",
    "error_message",
    "library",
    "status",
]

ENV_KERNEL = "NPU_HOST_KERNEL"
ENV_CACHE = "NPU_KERNEL_CACHE"
SOURCE = Path(__file__).with_name("_bfp_kernel.c")
#: Fixed flags (see the module docstring: no -march=native, no -ffast-math).
CFLAGS = ("-O3", "-std=c99", "-ffp-contract=off", "-fPIC", "-shared")
#: Interface version the source must report (``bfp_kernel_version``).
VERSION = 1

#: Return codes of the C functions, and what they mean.
OK, NONFINITE = 0, 1
_ERRORS = {
    -1: "a size or width is out of range",
    -2: "a static exponent is outside [-127, 127]",
}


class KernelError(RuntimeError):
    """The C kernel reported an error, or it is required (``NPU_HOST_KERNEL=c``) and
    could not be built."""


class KernelStatus(NamedTuple):
    """Which host BFP kernel is in use: ``name`` is ``"c"`` or ``"numpy"``, ``reason``
    says why (the library's path, the environment variable, or the build error)."""
    name: str
    reason: str


def error_message(code: int) -> str:
    """What a negative return code of the C kernel means."""
    return _ERRORS.get(code, f"unknown error code {code}")


def cache_dir(environ=os.environ) -> Path:
    """Where compiled kernels are kept (see the module docstring)."""
    if environ.get(ENV_CACHE):
        return Path(environ[ENV_CACHE])
    if environ.get("XDG_CACHE_HOME"):
        return Path(environ["XDG_CACHE_HOME"]) / "bfp-npu"
    home = environ.get("HOME") or os.path.expanduser("~")
    return Path(home) / ".cache" / "bfp-npu"


def _command(compiler: str, output: str) -> list[str]:
    return [compiler, *CFLAGS, "-o", output, str(SOURCE)]


def _build() -> tuple[ctypes.CDLL | None, str]:
    """Compile (unless cached) and load the library: (library, reason) or (None, reason)."""
    compiler = shutil.which("gcc")
    if compiler is None:
        return None, "gcc not found on PATH"
    try:
        source = SOURCE.read_bytes()
    except OSError as exc:
        return None, f"cannot read {SOURCE}: {exc}"
    key = hashlib.sha256()
    for part in (source, " ".join(_command("gcc", "OUT")).encode(), platform.machine().encode()):
        key.update(part)
        key.update(b"\0")
    directory = cache_dir()
    path = directory / f"bfp_kernel-{key.hexdigest()[:20]}.so"
    if not path.exists():
        try:
            directory.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=path.stem + ".", suffix=".tmp.so", dir=directory)
            os.close(fd)
        except OSError as exc:
            return None, f"cannot write the kernel cache {directory}: {exc}"
        try:
            done = subprocess.run(_command(compiler, tmp), capture_output=True, text=True,
                                  check=False)
            if done.returncode != 0:
                return None, (f"{' '.join(_command('gcc', tmp))} failed "
                              f"(exit {done.returncode}): {done.stderr.strip()}")
            os.replace(tmp, path)
        except OSError as exc:
            return None, f"cannot build the kernel in {directory}: {exc}"
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    try:
        lib = ctypes.CDLL(str(path))
        version = lib.bfp_kernel_version()
    except (OSError, AttributeError) as exc:
        return None, f"cannot load {path}: {exc}"
    if version != VERSION:
        return None, f"{path} has interface version {version}, not {VERSION}"
    vp, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32
    lib.bfp_quantize_f32.argtypes = [vp, i64, i64, i64, i32, i32, vp, vp, vp, vp]
    lib.bfp_quantize_f32.restype = ctypes.c_int
    lib.bfp_pack.argtypes = [vp, vp, i64, i64, i32, vp]
    lib.bfp_pack.restype = ctypes.c_int
    lib.bfp_unpack.argtypes = [vp, i64, i64, i32, vp, vp, vp]
    lib.bfp_unpack.restype = ctypes.c_int
    return lib, f"compiled kernel {path}"


_lock = threading.Lock()
_built: tuple[ctypes.CDLL | None, str] | None = None


def _load() -> tuple[ctypes.CDLL | None, str]:
    global _built
    if _built is None:
        with _lock:
            if _built is None:
                _built = _build()
    return _built


def _mode(environ=os.environ) -> str:
    mode = environ.get(ENV_KERNEL, "").strip().lower()
    return mode if mode in ("numpy", "c") else "auto"


def library():
    """The loaded C library, or None when the NumPy path is to be used.

    Builds it on the first call (once per process). Raises :class:`KernelError` when
    ``NPU_HOST_KERNEL=c`` and the kernel cannot be built.
    """
    mode = _mode()
    if mode == "numpy":
        return None
    lib, reason = _load()
    if lib is None and mode == "c":
        raise KernelError(f"{ENV_KERNEL}=c but the C kernel is not available: {reason}")
    return lib


def status() -> KernelStatus:
    """Which kernel :func:`library` gives now, and why (builds it if needed)."""
    if _mode() == "numpy":
        return KernelStatus("numpy", f"{ENV_KERNEL}=numpy")
    lib, reason = _load()
    return KernelStatus("c" if lib is not None else "numpy", reason)
