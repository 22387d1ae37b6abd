"""docs/maths.md is the document the code cites: every cited section must exist.

A citation is the path of the document followed, on the same line, by section numbers
("§6.2", "§3 and §7", "(§1.2 local std, §4 splatting"). Each number must be the number
of a heading of docs/maths.md ("## 6. Registration", "### 6.2 Losses"). The notes the
document replaced ("SPEC" and a section sign) must not be cited any more in src/ or tests/.
"""

from __future__ import annotations

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
MATHS = ROOT / "docs" / "maths.md"
DOC_NAME = "docs/maths.md"
SECTION = "\u00a7"  # the section sign, spelled out so this file cites nothing itself

#: where citations of the document are checked
CITING = ("src", "csrc", "tests", "benchmarks", "README.md")
#: where the old notes must no longer be cited
NO_SPEC = ("src", "tests")

HEADING = re.compile(r"^#{1,6}\s+(\d+(?:\.\d+)*)")
NUMBER = re.compile(SECTION + r"\s?(\d+(?:\.\d+)*)")
TEXT_SUFFIXES = {
    ".py",
    ".md",
    ".h",
    ".hpp",
    ".c",
    ".cc",
    ".cpp",
    ".cu",
    ".cuh",
    ".txt",
    ".toml",
    ".cfg",
    ".yaml",
    ".yml",
    ".rst",
    ".sh",
}


def _files(names):
    for name in names:
        path = ROOT / name
        if path.is_file():
            yield path
        elif path.is_dir():
            for p in sorted(path.rglob("*")):
                if p.is_file() and p.suffix in TEXT_SUFFIXES and "__pycache__" not in p.parts:
                    yield p


def _lines(path):
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return
    yield from enumerate(text.splitlines(), 1)


def headings() -> set[str]:
    numbers = set()
    in_code = False
    for _, line in _lines(MATHS):
        if line.lstrip().startswith("```"):
            in_code = not in_code
        if not in_code and (match := HEADING.match(line)):
            numbers.add(match.group(1))
    return numbers


def citations() -> list[tuple[str, int, str]]:
    """``(file, line, section)`` for every section number cited after the document's path."""
    found = []
    for path in _files(CITING):
        for number, line in _lines(path):
            start = line.find(DOC_NAME)
            if start < 0:
                continue
            for match in NUMBER.finditer(line, start + len(DOC_NAME)):
                found.append((str(path.relative_to(ROOT)), number, match.group(1)))
    return found


def test_maths_document_exists_with_numbered_headings():
    assert MATHS.is_file(), f"{DOC_NAME} is missing"
    numbers = headings()
    assert {str(n) for n in range(1, 10)} <= numbers


def test_heading_parser_reads_section_numbers():
    assert HEADING.match("## 1. Local standard deviation").group(1) == "1"
    assert HEADING.match("### 1.2 Window sums and the backward").group(1) == "1.2"
    assert HEADING.match("## Contents") is None
    line = f"see {DOC_NAME} {SECTION}3 and {SECTION}7; ({SECTION}1.2 local std)."
    assert [m.group(1) for m in NUMBER.finditer(line)] == ["3", "7", "1.2"]


def test_every_cited_section_exists():
    found = citations()
    assert found, f"no citation of {DOC_NAME} found: is the search looking in the right place?"
    numbers = headings()
    missing = [
        f"{file}:{line}: {SECTION}{section}"
        for file, line, section in found
        if section not in numbers
    ]
    assert not missing, f"sections cited but not in {DOC_NAME}:\n" + "\n".join(missing)


@pytest.mark.parametrize("folder", NO_SPEC)
def test_no_spec_citations_left(folder):
    marker = "SPEC " + SECTION
    left = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in _files([folder])
        for number, line in _lines(path)
        if marker in line
    ]
    assert not left, f"cite {DOC_NAME} instead of the old notes:\n" + "\n".join(left)
