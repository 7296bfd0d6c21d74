"""pytest's configuration of the test suite (helpers.py holds the helper
functions, importable as `helpers` through pyproject.toml's pythonpath):

- skips by marker: `cuda` tests without a CUDA device, `gpu` tests on the
  simulator build (the markers are declared in pyproject.toml);
- seeds: every test runs with its own fixed seed, derived from its node id
  (the same in every run, in CI and here), which seeds `rng`, NumPy's
  global generator, Python's `random` and torch; GPUACCEL_TEST_SEED=<n>
  gives every test seed n, GPUACCEL_TEST_SEED=random a fresh one per test
  (and random hypothesis draws; by default hypothesis is derandomized);
- the one-time GeluChangedWarning hidden (test_activations.py tests it in
  child processes);
- fixtures: `rng` (a generator from the test's seed) and `no_limit` (no
  memory limit on the CPU pool, during and after the test);
- a report hook that prints a failed test's seed, to reproduce it;
- a summary of the skipped tests grouped by reason, one line each (the
  short summary, `-rfEX` in pyproject.toml, lists only failures, errors
  and unexpected passes);
- CUDA tests run float32 without TF32 (see _full_float32_on_cuda);
- the fallback policy "raise" (GPUACCEL_FALLBACK, inherited by the
  scripts tests run): on a GPU, a cuBLASLt/cuDNN call that falls back for
  a reason that may hide a bug fails the test instead of passing on
  gpuaccel's own kernels.
"""

import os
import random
import sys
import warnings

import numpy as np
import pytest

os.environ.setdefault("GPUACCEL_FALLBACK", "raise")

import gpuaccel

from helpers import seed_for, simulated

CUDA = gpuaccel.cuda_available()
SIMULATED = simulated()


def pytest_collection_modifyitems(config, items):
    if CUDA and not SIMULATED:
        return
    if not CUDA:
        marker = "cuda"
        why = "needs a CUDA GPU (gpuaccel.cuda_available() is False: %s)" % (
            "built without CUDA" if not gpuaccel.built_with_cuda() else "no driver or device")
    else:
        # the simulator build runs the `cuda` tests, but not those that need
        # torch's CUDA or what only real hardware and CUDA libraries do
        marker = "gpu"
        why = "needs a real GPU (this is the simulator build, GPUACCEL_SIM=1)"
    skip = pytest.mark.skip(reason=why)
    for item in items:
        if marker in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _gelu_notice_hidden():
    """The suites ask for activation="gelu" in its present meaning (the
    exact GELU); the one-time notice that it once meant the tanh form is
    tested in child processes (test_activations.py), not shown in every
    run.  (A filter set at import would not last: pytest restores the
    filters around collection.)"""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=gpuaccel.GeluChangedWarning)
        yield


@pytest.fixture(autouse=True)
def _seeded(request):
    """Every source of randomness a test may use starts from its seed."""
    seed = seed_for(request.node.nodeid)
    request.node.user_properties.append(("seed", seed))
    random.seed(seed)
    np.random.seed(seed)
    if "torch" in sys.modules:
        sys.modules["torch"].manual_seed(seed)
    return seed


@pytest.fixture(autouse=True)
def _full_float32_on_cuda(request):
    """CUDA tests compare float32 results with float32 tolerances: TF32 off
    for gpuaccel's matmuls and convs (conv TF32 is on by default, as in
    torch) and for torch's references, restored after.  Not for
    test_precision.py, which tests the settings themselves."""
    if request.node.get_closest_marker("cuda") is None or request.path.name == "test_precision.py":
        yield
        return
    torch = sys.modules.get("torch")
    saved = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32) if torch else None
    gpuaccel.set_matmul_precision("highest")
    gpuaccel.set_conv_allow_tf32(False)
    if torch:
        torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        gpuaccel.set_matmul_precision(None)
        gpuaccel.set_conv_allow_tf32(None)
        if torch:
            torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


@pytest.fixture
def rng(_seeded):
    """A NumPy generator from the test's seed (see _seeded)."""
    return np.random.default_rng(_seeded)


@pytest.fixture
def no_limit():
    """No limit on the CPU pool during the test, and none after it."""
    gpuaccel.set_memory_limit(None, device="cpu")
    yield
    gpuaccel.set_memory_limit(None, device="cpu")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.failed:
        for name, value in item.user_properties:
            if name == "seed":
                report.sections.append(("random seed", "reproduce with GPUACCEL_TEST_SEED=%d pytest '%s'"
                                         % (value, item.nodeid)))
    return report


def pytest_terminal_summary(terminalreporter):
    """Skips grouped by reason: how many, and in which files."""
    groups = {}
    for report in terminalreporter.stats.get("skipped", []):
        if isinstance(report.longrepr, tuple):
            path, _, reason = report.longrepr
        else:
            path, reason = report.nodeid.split("::")[0], str(report.longrepr)
        reason = reason[len("Skipped: "):] if reason.startswith("Skipped: ") else reason
        files = groups.setdefault(reason, {})
        name = os.path.basename(str(path))
        files[name] = files.get(name, 0) + 1
    if not groups:
        return
    terminalreporter.section("skipped, by reason", sep="-")
    for reason, files in sorted(groups.items(), key=lambda kv: -sum(kv[1].values())):
        where = ", ".join("%s (%d)" % (name, n) for name, n in sorted(files.items()))
        terminalreporter.write_line("%4d  %s: %s" % (sum(files.values()), reason, where))
