"""Every ```python block of README.md runs, in order, as a reader would paste them.

The blocks share one namespace (a later block may use an earlier one's names) and run in
a fresh interpreter whose working directory is a temporary folder; any exception fails
the test, with the README line it came from.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"

_RUNNER = r"""
import json, linecache, sys, traceback
blocks = json.loads(open(sys.argv[1], encoding="utf-8").read())
namespace = {"__name__": "__main__"}
for number, (line, code) in enumerate(blocks, 1):
    # Padded so that tracebacks give README.md's own line numbers, and shown from it.
    source = "\n" * (line - 1) + code
    linecache.cache["README.md"] = (len(source), None, source.splitlines(True), "README.md")
    try:
        exec(compile(source, "README.md", "exec"), namespace)
    except BaseException:
        print(f"README.md python block {number} (line {line}) failed:", file=sys.stderr)
        traceback.print_exc()
        sys.exit(1)
    print(f"block {number} ok", flush=True)
"""


def python_blocks(text: str) -> list[tuple[int, str]]:
    """``(first code line, code)`` of every fenced block whose info string is ``python``."""
    blocks = []
    for match in re.finditer(r"^```python[ \t]*\n(.*?)^```[ \t]*$", text, re.M | re.S):
        line = text.count("\n", 0, match.start(1)) + 1
        blocks.append((line, match.group(1)))
    return blocks


def test_python_blocks_are_found_with_their_line_numbers():
    text = "intro\n```python\nx = 1\n```\n```bash\nls\n```\n\n```python\ny = x + 1\n```\n"
    assert python_blocks(text) == [(3, "x = 1\n"), (10, "y = x + 1\n")]


def _missing_modules(code: str) -> list[str]:
    """The top-level packages a block imports that are not installed here (the [large]
    extra's, where it is absent)."""
    names = set(re.findall(r"^\s*(?:import|from)\s+([A-Za-z_]\w*)", code, re.M))
    return sorted(n for n in names if not _installed(n))


def _installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:  # a finder that refuses it (tests/_blocker)
        return False


def test_readme_python_blocks_run_in_order(tmp_path):
    blocks = python_blocks(README.read_text(encoding="utf-8"))
    assert blocks, "README.md has no ```python block"
    # A block that needs a package this install lacks ends the run there (later blocks may
    # use its names); the test then says which were left out.
    missing = [(i, _missing_modules(code)) for i, (_, code) in enumerate(blocks)]
    first_missing = next(((i, names) for i, names in missing if names), None)
    left_out = blocks[first_missing[0] :] if first_missing else []
    blocks = blocks[: first_missing[0]] if first_missing else blocks
    (tmp_path / "blocks.json").write_text(json.dumps(blocks), encoding="utf-8")
    (tmp_path / "run_blocks.py").write_text(_RUNNER, encoding="utf-8")
    work = tmp_path / "cwd"
    work.mkdir()
    result = subprocess.run(
        [sys.executable, str(tmp_path / "run_blocks.py"), str(tmp_path / "blocks.json")],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "MPLBACKEND": "Agg"},
    )
    assert result.returncode == 0, result.stderr[-6000:]
    assert result.stdout.count(" ok") == len(blocks)
    if left_out:
        pytest.skip(
            f"README.md blocks from line {left_out[0][0]} on need {', '.join(first_missing[1])}"
            f" (not installed); the {len(blocks)} before them ran"
        )
