"""Every ```python block of README.md runs as written, each in a fresh
interpreter in an empty folder (README.md's rule: a snippet imports what it
uses and defines its data; one that wants a GPU picks the CPU without one)."""

import os
import re

import pytest

from helpers import run_python

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def python_blocks():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        text = f.read()
    blocks = []
    for match in re.finditer(r"^```python\n(.*?)^```", text, re.S | re.M):
        line = text.count("\n", 0, match.start()) + 1
        blocks.append(pytest.param(match.group(1), id="README.md:%d" % line))
    return blocks


def test_the_readme_has_python_blocks():
    assert len(python_blocks()) >= 5


@pytest.mark.parametrize("code", python_blocks())
def test_readme_snippet_runs_as_written(code, tmp_path):
    pytest.importorskip("torch")
    run = run_python("-c", code, cwd=tmp_path, timeout=600)
    assert run.returncode == 0, "the snippet failed:\n%s\n%s" % (code, run.stderr[-3000:])
