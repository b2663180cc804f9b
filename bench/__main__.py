"""``python -m bench [names...]``: run benchmarks, print a table, write bench/results.json."""

import argparse
import os
import sys
from pathlib import Path

from bench import NO_BUILD, RESULTS, available, format_table, run_benchmarks, write_results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="Run the project's benchmarks (all of them when no name is given).")
    parser.add_argument("names", nargs="*", help="benchmarks to run (see --list)")
    parser.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    parser.add_argument("--output", type=Path, default=RESULTS,
                        help=f"JSON file the records are merged into (default: {RESULTS})")
    parser.add_argument("--no-build", action="store_true",
                        help="do not run long builds (the 30-minute board build): benchmarks "
                             "that need one use an existing build or are skipped")
    args = parser.parse_args(argv)
    if args.no_build:
        os.environ[NO_BUILD] = "1"

    names = available()
    if args.list:
        width = max((len(n) for n in names), default=0)
        for name, doc in names.items():
            print(f"{name:<{width}}  {doc}")
        return 0
    unknown = [n for n in args.names if n not in names]
    if unknown:
        parser.error(f"unknown benchmark(s) {', '.join(unknown)}; "
                     f"available: {', '.join(names)}")

    skipped = {}
    records, errors = run_benchmarks(args.names or list(names), skipped)
    if records:
        print(format_table(records))
        write_results(records, args.output)
        print(f"\n{len(records)} records written to {args.output}")
    for name, reason in skipped.items():
        print(f"benchmark {name} skipped: {reason}")
    for name, message in errors.items():
        print(f"benchmark {name} failed: {message}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
