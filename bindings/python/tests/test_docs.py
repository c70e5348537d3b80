"""The Python examples of docs/python.md and of the README run as written.

Every block tagged ``python`` is executed on its own (a fresh namespace),
in a temporary working directory that holds the checkpoint names the
pages use: ``model-w4a16`` and ``assets/sample-w4a16``, copies of the
sample. A block that needs more is marked by an HTML comment on the line
before its fence, which GitHub does not show:

    <!-- docs-test: requires torch -->     runs only where torch imports
    <!-- docs-test: requires network -->   never runs here (the Hub)

Any other marker fails the test, so that none is mistyped into skipping.
"""

import re
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SAMPLE = ROOT / "assets" / "sample-w4a16"
PAGES = [ROOT / "README.md", ROOT / "docs" / "python.md"]
MARKER = re.compile(r"<!--\s*docs-test:\s*(.*?)\s*-->")
REQUIRES = {"requires torch", "requires network"}


def closes(line, ticks):
    """Whether ``line`` closes a fence of ``ticks`` backticks."""
    line = line.rstrip()
    return len(line) >= ticks and set(line) == {"`"}


def python_blocks(text):
    """(first line, requirements, code) of each ``python`` block of ``text``."""
    blocks = []
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        ticks = len(line) - len(line.lstrip("`"))
        if ticks < 3:
            i += 1
            continue
        lang = (line[ticks:].split() or [""])[0]
        marker = MARKER.fullmatch(lines[i - 1].strip()) if i > 0 else None
        start = i + 1
        i += 1
        while i < len(lines) and not closes(lines[i], ticks):
            i += 1
        if lang == "python":
            needs = {m.strip() for m in marker.group(1).split(",")} if marker else set()
            blocks.append((start, needs, "\n".join(lines[start:i])))
        i += 1
    return blocks


CASES = [
    pytest.param(code, needs, id=f"{page.relative_to(ROOT)}:{line}")
    for page in PAGES
    for line, needs, code in python_blocks(page.read_text(encoding="utf-8"))
]


def test_the_pages_have_python_examples():
    assert len(CASES) >= 4, "docs/python.md and the README lost their python blocks"


@pytest.mark.parametrize("code,needs", CASES)
def test_python_block_runs(code, needs, tmp_path, monkeypatch):
    unknown = needs - REQUIRES
    assert not unknown, f"unknown docs-test marker: {sorted(unknown)}"
    if "requires network" in needs:
        pytest.skip("needs the Hugging Face Hub")
    if "requires torch" in needs:
        pytest.importorskip("torch")
    pytest.importorskip("ml_dtypes")  # numpy's bf16, for framework="np"
    shutil.copytree(SAMPLE, tmp_path / "model-w4a16")
    shutil.copytree(SAMPLE, tmp_path / "assets" / "sample-w4a16")
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "<docs>", "exec"), {"__name__": "__docs__"})
