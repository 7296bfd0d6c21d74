"""Every ```python block of README.md runs as written, each in a fresh
interpreter in an empty folder (README.md's rule: a snippet imports what it
uses and defines its data; one that wants a GPU picks the CPU without one),
leaves that folder empty (what it writes goes to a temporary folder), and
prints to stderr only what the README explains.  A block whose first line
is `# needs: a b` says in the README what it needs beyond torch, and is
skipped where one of those is not installed."""

import os
import re

import pytest

from helpers import run_python

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as _f:
    README = _f.read()

# What a block may print to stderr: progress bars (LossLogger's tqdm), the
# lines torch's CUDA build prints from its profiler library (kineto) on a
# machine without a GPU, which the README explains under the profiler block,
# and the one warning of a process's first activation="gelu", which the README
# explains where it lists the activations.
PROGRESS = re.compile(r"\d+it/s|\?it/s|\d+/\d+ \[")
EXPLAINED = ("gpuGetDeviceCount failed with code 35", "profiler_start", "profiler_stop", "GeluChangedWarning")


def python_blocks():
    blocks = []
    for match in re.finditer(r"^```python\n(.*?)^```", README, re.S | re.M):
        line = README.count("\n", 0, match.start()) + 1
        blocks.append(pytest.param(match.group(1), id="README.md:%d" % line))
    return blocks


def test_the_readme_has_python_blocks():
    assert len(python_blocks()) >= 5


def test_what_blocks_may_print_is_explained_in_the_readme():
    for text in EXPLAINED:
        assert text in README, text


def unexplained(stderr):
    lines = [line for line in stderr.replace("\r", "\n").splitlines() if line.strip()]
    return [line for line in lines if not PROGRESS.search(line) and not any(text in line for text in EXPLAINED)]


@pytest.mark.parametrize("code", python_blocks())
def test_readme_snippet_runs_as_written(code, tmp_path):
    pytest.importorskip("torch")
    needs = re.match(r"# needs: (.*)\n", code)
    for module in needs.group(1).split() if needs else ():
        pytest.importorskip(module)
    run = run_python("-c", code, cwd=tmp_path, timeout=600)
    assert run.returncode == 0, "the snippet failed:\n%s\n%s" % (code, run.stderr[-3000:])
    assert not os.listdir(tmp_path), "the snippet left files in its working folder"
    assert not unexplained(run.stderr), run.stderr[-3000:]


def _imported(code):
    return {m.group(1).split(".")[0] for m in re.finditer(r"^\s*(?:import|from)\s+([\w.]+)", code, re.M)}


def test_a_block_that_needs_more_than_the_demo_install_says_so():
    # what `pip install ".[demo]"` brings (and the standard library) goes unsaid; anything else is named in
    # the block's `# needs:` line, so that a reader without it knows before running it
    import sys

    brought = {"numpy", "torch", "tqdm", "gpuaccel"} | set(sys.stdlib_module_names)
    for param in python_blocks():
        code = param.values[0]
        needs = re.match(r"# needs: (.*)\n", code)
        declared = set(needs.group(1).split()) if needs else set()
        assert _imported(code) - brought <= declared, (param.id, _imported(code) - brought - declared)
    onnx_block = next(p.values[0] for p in python_blocks() if "onnxruntime" in p.values[0])
    assert onnx_block.startswith("# needs: onnx onnxscript onnxruntime")


def test_the_cpu_torch_advice_comes_before_the_first_install():
    # a newcomer reads it before starting PyPI's 3 GB CUDA download, with what to do without that index
    cpu_index = README.index("pip install torch --index-url https://download.pytorch.org/whl/cpu")
    assert cpu_index < README.index('pip install ".[demo]"') and cpu_index < README.index('pip install ".[test]"')
    assert "No matching distribution found for torch" in README[:README.index('pip install ".[demo]"')]
