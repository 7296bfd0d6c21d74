"""NVTX ranges: every gpuaccel op opens one named gpuaccel::<op>, which is
how Nsight Systems names the work each call queued.

The ranges are read the way Nsight reads them: through an NVTX injection
library (NVTX_INJECTION64_PATH) built here from the CUDA toolkit's header,
which records every push and pop of a child process that runs the ops,
the loader and the logger on a GPU (real, or the simulator's: kernels/sim/sim.c
opens the same NVTX ranges as kernels/cuda/runtime.cu)."""

import collections
import os
import shutil
import subprocess
import textwrap

import pytest

from helpers import cuda_include_dir, run_python

pytestmark = pytest.mark.cuda

# Replaces NVTX's push and pop with ones that write "push <thread> <name>"
# and "pop <thread>" lines to $GPUACCEL_TEST_RANGES.
INJECTION = r"""
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include <nvtx3/nvToolsExt.h>

static FILE *ranges;

static int push(const char *name)
{
    fprintf(ranges, "push %lu %s\n", (unsigned long)pthread_self(), name);
    return 0;
}

static int pop(void)
{
    fprintf(ranges, "pop %lu\n", (unsigned long)pthread_self());
    return 0;
}

int InitializeInjectionNvtx2(NvtxGetExportTableFunc_t get_export_table)
{
    const NvtxExportTableCallbacks *callbacks = get_export_table(NVTX_ETID_CALLBACKS);
    NvtxFunctionTable core;
    unsigned int size;
    if (!callbacks || !callbacks->GetModuleFunctionTable(NVTX_CB_MODULE_CORE, &core, &size) ||
        size <= NVTX_CBID_CORE_RangePop)
        return 0;
    if (!ranges) {
        ranges = fopen(getenv("GPUACCEL_TEST_RANGES"), "a");
        if (!ranges)
            return 0;
        setvbuf(ranges, NULL, _IOLBF, 0); /* whole lines: the loader's workers write too */
    }
    *core[NVTX_CBID_CORE_RangePushA] = (NvtxFunctionPointer)push;
    *core[NVTX_CBID_CORE_RangePop] = (NvtxFunctionPointer)pop;
    return 1;
}
"""

# One training step's worth of every op on cuda:0, gpuaccel arrays only
# (no torch CUDA needed: the simulator runs it too).
STEP = """
import numpy as np
import gpuaccel as ga

rng = np.random.default_rng(0)
def dev(*shape):
    return ga.asarray(rng.standard_normal(shape).astype(np.float32), device="cuda")

x, w, b = dev(5, 7), dev(3, 7), dev(3)
y, z = ga.linear(x, w, b, "gelu", save_preactivation=True)
ga.linear_backward(dev(5, 3), x, w, activation="gelu", preactivation=z)
ga.matmul(x, dev(7, 4))
xc, wc = dev(2, 3, 6, 5), dev(4, 3, 3, 3)
ga.conv2d(xc, wc, dev(4), padding=1, activation="relu")
ga.conv2d_backward(dev(2, 4, 6, 5), xc, wc, padding=1)
images = rng.integers(0, 256, (6, 5, 4, 3), dtype=np.uint8)
for batch, labels in ga.PinnedLoader([images, np.arange(6)], 3, device="cuda", output="gpuaccel",
                                     transform=ga.ImageNormalize(0.5, 0.25)):
    pass
log = ga.LossLogger(2)
log.log(loss=dev(1)[0])
log.close()
ga.synchronize()
"""


@pytest.fixture(scope="module")
def injection(tmp_path_factory):
    cc, include = shutil.which("gcc") or shutil.which("cc"), cuda_include_dir(os.path.join("nvtx3", "nvToolsExt.h"))
    if not cc or not include:
        pytest.skip("needs a C compiler and the CUDA toolkit's nvtx3 headers (CUDA_HOME) to build the recorder")
    folder = tmp_path_factory.mktemp("nvtx")
    src, lib = folder / "recorder.c", folder / "librecorder.so"
    src.write_text(INJECTION)
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-I" + include, str(src), "-o", str(lib), "-pthread"],
                   check=True, capture_output=True)
    return lib


def recorded_ranges(injection, tmp_path, code):
    """{name: times opened} of the NVTX ranges `code` opened, each checked
    to be closed on its own thread in order."""
    out = tmp_path / "ranges.txt"
    proc = run_python("-c", textwrap.dedent(code), timeout=300,
                      env={"NVTX_INJECTION64_PATH": str(injection), "GPUACCEL_TEST_RANGES": str(out)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert out.exists(), "no NVTX call reached the injection library"
    opened, stacks = collections.Counter(), collections.defaultdict(list)
    for line in out.read_text().splitlines():
        kind, thread, *name = line.split(" ", 2)
        if kind == "push":
            stacks[thread].append(name[0])
            opened[name[0]] += 1
        else:
            assert stacks[thread], "a pop without a push on thread %s" % thread
            stacks[thread].pop()
    assert not any(stacks.values()), "ranges left open: %s" % dict(stacks)
    return opened


def test_every_op_the_loader_and_the_logger_open_nvtx_ranges_of_their_names(injection, tmp_path):
    opened = recorded_ranges(injection, tmp_path, STEP)
    for op in ("linear", "linear_backward", "matmul", "conv2d", "conv2d_backward", "logger_update",
               "loader_gather", "loader_copy", "normalize"):
        assert opened["gpuaccel::" + op] >= 1, (op, dict(opened))
    assert opened["gpuaccel::loader_copy"] == 2  # once per batch
    assert opened["gpuaccel::normalize"] >= 2


def test_ops_on_the_cpu_open_them_too(injection, tmp_path):
    opened = recorded_ranges(injection, tmp_path, """
        import numpy as np
        import gpuaccel as ga
        x = np.ones((4, 3), np.float32)
        ga.linear(x, np.ones((2, 3), np.float32), activation="relu")
        ga.conv2d(np.ones((1, 1, 3, 3), np.float32), np.ones((1, 1, 2, 2), np.float32))
        images = np.zeros((4, 2, 2, 3), np.uint8)
        list(ga.PinnedLoader([images], 2, device="cpu", output="gpuaccel", transform=ga.ImageNormalize(0.5, 0.5)))
    """)
    assert opened["gpuaccel::linear"] == 1 and opened["gpuaccel::conv2d"] == 1, dict(opened)
    assert opened["gpuaccel::loader_gather"] >= 2 and opened["gpuaccel::normalize"] >= 2, dict(opened)
