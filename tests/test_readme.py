"""Every Python and shell example of README.md runs as written.

The ``python`` blocks run in order, each in a fresh namespace, in one temporary folder;
the ``sh`` blocks run there too, line by line, through the shell, with the venv's ``npu``
first on ``PATH``, after the Python blocks that come before them (so ``net.npz`` and
``inputs.npy`` exist). Lines that start with ``make`` are the set-up and regression
commands this suite is itself run by, and are not run again here. Each command must exit
0. A block of another language (``text``) is not run.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)


def blocks(text: str) -> list[tuple[str, str, int]]:
    """``(language, code, line)`` of every fenced block of ``text``."""
    return [(m.group(1), m.group(2), text.count("\n", 0, m.start()) + 1)
            for m in FENCE.finditer(text)]


def test_the_readme_has_runnable_examples():
    kinds = [lang for lang, _, _ in blocks((REPO / "README.md").read_text())]
    assert kinds.count("python") >= 4 and kinds.count("sh") >= 2


def test_fences_are_found_with_their_language():
    text = "a\n```python\nx = 1\n```\n```sh\nls\n```\n```text\nno\n```\n"
    assert blocks(text) == [("python", "x = 1\n", 2), ("sh", "ls\n", 5), ("text", "no\n", 8)]


def test_every_example_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "zoo").symlink_to(REPO / "zoo")      # the examples use the model zoo
    env = {**os.environ, "PATH": os.pathsep.join([str(Path(sys.executable).parent),
                                                  os.environ.get("PATH", "")]),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO),
                                                       os.environ.get("PYTHONPATH")]))}
    ran = 0
    for lang, code, line in blocks((REPO / "README.md").read_text()):
        if lang == "python":
            try:
                exec(compile(code, f"README.md:{line}", "exec"), {"__name__": "readme"})
            except Exception as exc:
                pytest.fail(f"the Python example at README.md line {line} failed: {exc!r}")
            ran += 1
        elif lang == "sh":
            for command in code.splitlines():
                command = command.split(" #")[0].strip()
                if not command or command.startswith("make "):
                    continue
                assert shlex.split(command)[0] == "npu", command
                done = subprocess.run(command, shell=True, env=env, capture_output=True,
                                      text=True, timeout=300)
                assert done.returncode == 0, (f"README.md line {line}: {command!r} exited "
                                              f"{done.returncode}:\n{done.stderr}")
                ran += 1
    assert ran >= 10
    assert (tmp_path / "outputs.npy").is_file()
