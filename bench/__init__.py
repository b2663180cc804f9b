"""Benchmarks of the BFP NPU project: ``python -m bench [names...]`` (``make bench``).

A benchmark is a module of this package that defines ``run() -> list[dict]``; it is found
by name, nothing else needs registering. Each record it returns is::

    {"name": "host quantize+pack throughput", "value": 812.3, "unit": "MB/s",
     "config": {...}}

``name`` is plain words, ``value`` a number, ``unit`` its unit and ``config`` a dict of
what was measured (sizes, widths, versions). Modules whose name starts with ``_`` and
modules without a ``run`` function (helpers such as ``bench.fpga``) are not benchmarks.

``python -m bench`` runs every benchmark, prints a table and writes ``bench/results.json``
(a JSON list of records). Records of benchmarks not run this time are kept in that file;
those of the benchmarks that ran replace their earlier ones (each record's config carries
the benchmark's name under ``"bench"``).

A benchmark that cannot measure anything this time (``bench/board.py`` with no board
build and ``--no-build``) raises :class:`Skipped` with the reason: it is reported as
skipped, not failed, and its earlier records stay in ``results.json``.
"""

from __future__ import annotations

import importlib
import json
import os
import pkgutil
import time
from pathlib import Path

__all__ = ["RESULTS", "NO_BUILD", "Skipped", "available", "load", "record", "best_time",
           "run_benchmarks", "no_build", "format_table", "merge_results", "write_results"]

RESULTS = Path(__file__).resolve().parent / "results.json"


#: Environment variable that ``python -m bench --no-build`` sets: benchmarks that would
#: run a long build (``bench/board.py``: the 30-minute board build) use an existing one
#: or skip themselves instead.
NO_BUILD = "BENCH_NO_BUILD"


class Skipped(Exception):
    """Raised by a benchmark's ``run`` that has nothing to measure this time; the message
    says why."""


def no_build(environ=os.environ) -> bool:
    """Whether long builds are off (:data:`NO_BUILD` set to 1, yes, on or true)."""
    return environ.get(NO_BUILD, "").strip().lower() in ("1", "yes", "on", "true")


def available() -> dict[str, str]:
    """Benchmark names and their one-line descriptions, sorted by name."""
    found = {}
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("_"):
            continue
        try:
            module = importlib.import_module(f"{__name__}.{info.name}")
        except Exception as exc:            # listed, so that running it reports the error
            found[info.name] = f"(cannot be imported: {type(exc).__name__}: {exc})"
            continue
        run = getattr(module, "run", None)
        if callable(run):
            doc = (run.__doc__ or module.__doc__ or "").strip()
            found[info.name] = doc.splitlines()[0] if doc else ""
    return dict(sorted(found.items()))


def load(name: str):
    """The ``run`` function of benchmark ``name``.

    Raises
    ------
    ValueError
        naming the benchmark and the available ones when there is no such benchmark.
    """
    names = available()
    if name not in names:
        raise ValueError(f"no benchmark named {name!r}; available: {', '.join(names)}")
    return importlib.import_module(f"{__name__}.{name}").run    # raises its import error


def record(name: str, value, unit: str, **config) -> dict:
    """One benchmark record (see the module docstring)."""
    return {"name": name, "value": value, "unit": unit, "config": config}


def best_time(fn, repeats: int = 5, warmup: int = 1, clock=time.perf_counter) -> float:
    """Smallest time of ``fn()`` over ``repeats`` calls, in seconds, by ``clock``
    (wall-clock by default; ``time.process_time`` for the process's CPU time).

    ``warmup`` calls run first and are not timed (page faults of first use, caches).
    """
    for _ in range(warmup):
        fn()
    best = float("inf")
    for _ in range(repeats):
        start = clock()
        fn()
        best = min(best, clock() - start)
    return best


def run_benchmarks(names, skipped=None) -> tuple[list[dict], dict[str, str]]:
    """Run the named benchmarks; returns their records and the errors of those that failed.
    The reasons of those that skipped themselves (:class:`Skipped`) go into ``skipped``
    (a dict) when one is given."""
    records, errors = [], {}
    for name in names:
        try:
            got = load(name)()
        except Skipped as exc:
            if skipped is not None:
                skipped[name] = str(exc)
            continue
        except Exception as exc:            # one broken benchmark must not hide the others
            errors[name] = f"{type(exc).__name__}: {exc}"
            continue
        for r in got:
            missing = {"name", "value", "unit"} - set(r)
            if missing:
                errors[name] = f"record {r!r} lacks {sorted(missing)}"
                break
            config = dict(r.get("config") or {})
            config.setdefault("bench", name)
            records.append({"name": r["name"], "value": r["value"], "unit": r["unit"],
                            "config": config})
    return records, errors


def merge_results(old: list[dict], new: list[dict]) -> list[dict]:
    """Keep the old records of benchmarks that produced no new ones, then the new records."""
    ran = {r["config"].get("bench") for r in new}
    return [r for r in old if (r.get("config") or {}).get("bench") not in ran] + new


def _fmt_value(v) -> str:
    if isinstance(v, float):
        return f"{v:,.3g}" if abs(v) < 100 else f"{v:,.0f}"
    return str(v)


#: Config entries left out of the printed table (they stay in results.json).
_QUIET_KEYS = {"bench", "numpy", "python", "machine", "repeats", "ratio"}


def format_table(records: list[dict]) -> str:
    """A plain-text table of records: name, value, unit and the config in short."""
    rows = [("benchmark", "value", "unit", "config")]
    for r in records:
        parts = []
        for k, v in (r.get("config") or {}).items():
            if k in _QUIET_KEYS or isinstance(v, dict):
                continue
            if isinstance(v, (list, tuple)):
                v = "x".join(str(i) for i in v)
            parts.append(f"{k}={v}")
        rows.append((r["name"], _fmt_value(r["value"]), r["unit"], ", ".join(parts)))
    widths = [max(len(str(row[i])) for row in rows) for i in range(3)]
    lines = []
    for i, row in enumerate(rows):
        lines.append(f"{row[0]:<{widths[0]}}  {row[1]:>{widths[1]}}  {row[2]:<{widths[2]}}  "
                     f"{row[3]}".rstrip())
        if i == 0:
            lines.append("-" * (sum(widths) + 6 + max(len(row[3]), 6)))
    return "\n".join(lines)


def write_results(records: list[dict], path: Path = RESULTS) -> list[dict]:
    """Merge ``records`` into the JSON list at ``path`` (see :func:`merge_results`)."""
    try:
        old = json.loads(path.read_text())
        if not isinstance(old, list):
            old = []
    except (OSError, ValueError):
        old = []
    merged = merge_results(old, records)
    path.write_text(json.dumps(merged, indent=2) + "\n")
    return merged
