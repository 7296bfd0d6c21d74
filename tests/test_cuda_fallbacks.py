"""The fallback policy: what a CUDA op does when cuBLASLt or cuDNN did not run
the call gpuaccel asked for.

kernels/cuda reports why (ga_fallback_reason, with the library's status and
message); csrc/fallback.c counts every reason in matmul_stats()/conv_stats() and,
for the reasons that may hide a bug or a broken installation, warns once per op
and reason, raises FallbackError, or stays silent, as set_fallback_policy() or
GPUACCEL_FALLBACK says.  Which reason kernels/cuda/matmul.cu gives for which
call is checked against the real cuBLASLt by tests/test_cuda_descriptors.py;
here the simulator build (GPUACCEL_SIM=1) injects a library's answer with
GPUACCEL_SIM_FALLBACK so that the Python side runs end to end without a GPU.
"""

import json
import textwrap

import pytest

import gpuaccel

from helpers import run_python, simulated

REASONS = gpuaccel._C._fallback_reasons
# the reasons the policy covers: from no_engine on (kernels/kernels.h)
POLICED = REASONS[REASONS.index("no_engine"):]


def test_the_policy_setting_and_its_errors():
    before = gpuaccel.get_fallback_policy()
    try:
        for policy in ("allow", "raise", "warn"):
            gpuaccel.set_fallback_policy(policy)
            assert gpuaccel.get_fallback_policy() == policy
        for bad in ("loud", "WARN", None, 1):
            with pytest.raises(ValueError) as err:
                gpuaccel.set_fallback_policy(bad)
            text = str(err.value)
            assert "set_fallback_policy: policy" in text and repr(bad) in text
            assert all(p in text for p in ("'allow'", "'warn'", "'raise'"))
            assert gpuaccel.get_fallback_policy() == "warn"
    finally:
        gpuaccel.set_fallback_policy(before)


def test_the_stats_count_every_reason():
    assert REASONS[0] == "none" and len(set(REASONS)) == len(REASONS)
    assert {"layout", "epilogue", "deterministic", "not_supported", "bad_param"} <= set(REASONS)
    for stats in (gpuaccel.matmul_stats(), gpuaccel.conv_stats()):
        assert set(stats["fallback_reasons"]) == set(REASONS[1:])
        assert all(isinstance(v, int) and v >= 0 for v in stats["fallback_reasons"].values())


@pytest.mark.parametrize("value, policy, warned", [("raise", "raise", False), ("allow", "allow", False),
                                                   ("", "warn", False), ("loud", "warn", True)])
def test_the_environment_sets_the_policy_at_import(value, policy, warned):
    proc = run_python("-W", "always", "-c", "import gpuaccel; print(gpuaccel.get_fallback_policy())",
                      env={"GPUACCEL_FALLBACK": value})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [policy]
    assert ("GPUACCEL_FALLBACK=loud is not a fallback policy" in proc.stderr) == warned
    if warned:
        assert "RuntimeWarning" in proc.stderr and "'allow', 'warn' and 'raise'" in proc.stderr


# ------------------------------------------------ end to end, simulated GPU

SCRIPT = """
import json, warnings
import numpy as np
import gpuaccel as ga

rng = np.random.default_rng(7)
x = rng.standard_normal((19, 13)).astype(np.float32)
w = rng.standard_normal((11, 13)).astype(np.float32)
b = rng.standard_normal(11).astype(np.float32)
img = rng.standard_normal((2, 3, 9, 7)).astype(np.float32)
k = rng.standard_normal((5, 3, 3, 3)).astype(np.float32)
want_linear = np.maximum(x @ w.T + b, 0)
out = {"warnings": [], "errors": [], "linear_ok": [], "conv_ok": []}

def run(op):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            if op == "linear":
                y = ga.linear(ga.asarray(x, device="cuda"), ga.asarray(w, device="cuda"),
                              ga.asarray(b, device="cuda"), activation="relu")
                out["linear_ok"].append(bool(np.allclose(y.numpy(), want_linear, rtol=1e-5, atol=1e-5)))
            else:
                y = ga.conv2d(ga.asarray(img, device="cuda"), ga.asarray(k, device="cuda"), padding=1)
                cpu = ga.conv2d(ga.asarray(img), ga.asarray(k), padding=1).numpy()
                out["conv_ok"].append(bool(np.allclose(y.numpy(), cpu, rtol=1e-5, atol=1e-5)))
        except ga.FallbackError as e:
            out["errors"].append([op, e.name, e.code, e.call, str(e)])
    out["warnings"] += [[op, w.category.__name__, str(w.message)] for w in caught]

for op in OPS:
    run(op)
out["matmul"] = ga.matmul_stats()["fallback_reasons"]
out["conv"] = ga.conv_stats()["fallback_reasons"]
print(json.dumps(out))
"""

sim_only = pytest.mark.skipif(not simulated(), reason="needs a simulator build (GPUACCEL_SIM=1)")


def run_injected(reason, policy, ops, status=3000, text="CUDNN_STATUS_BAD_PARAM: injected by the test"):
    # conftest.py sets GPUACCEL_FALLBACK=raise for the test session: None
    # here is the default
    env = {"GPUACCEL_SIM_FALLBACK": "%d:%d:%s" % (REASONS.index(reason), status, text),
           "GPUACCEL_FALLBACK": policy or ""}
    proc = run_python("-c", "OPS = %r\n" % (ops,) + textwrap.dedent(SCRIPT), env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@sim_only
@pytest.mark.parametrize("reason", ["bad_param", "compilation_failed"])
def test_warn_is_the_default_and_warns_once_per_op_and_reason(reason):
    out = run_injected(reason, None, ["linear", "linear", "conv", "linear", "conv"])
    assert out["linear_ok"] == [True] * 3 and out["conv_ok"] == [True] * 2  # the fallback's results stand
    assert out["errors"] == []
    assert [(op, cat) for op, cat, _ in out["warnings"]] == [("linear", "FallbackWarning"),
                                                            ("conv", "FallbackWarning")]
    linear_msg, conv_msg = out["warnings"][0][2], out["warnings"][1][2]
    assert linear_msg.startswith("linear: ") and conv_msg.startswith("conv2d: ")
    for msg in (linear_msg, conv_msg):
        assert "reason '%s'" % reason in msg and "injected by the test" in msg
        assert "set_fallback_policy('allow')" in msg and "'raise'" in msg
    assert out["matmul"][reason] == 3 and out["conv"][reason] == 2
    assert sum(out["matmul"].values()) == 3 and sum(out["conv"].values()) == 2


@sim_only
def test_raise_raises_after_the_op_and_the_next_op_still_works():
    out = run_injected("bad_param", "raise", ["linear", "conv", "linear"], status=2002)
    assert out["warnings"] == [] and out["linear_ok"] == [] and out["conv_ok"] == []
    assert [e[:4] for e in out["errors"]] == [["linear", "bad_param", 2002, "linear"],
                                              ["conv", "bad_param", 2002, "conv2d"],
                                              ["linear", "bad_param", 2002, "linear"]]
    assert "injected by the test" in out["errors"][0][4] and "set_fallback_policy('warn')" in out["errors"][0][4]
    assert out["matmul"]["bad_param"] == 2 and out["conv"]["bad_param"] == 1


@sim_only
def test_allow_only_counts():
    out = run_injected("no_engine", "allow", ["linear", "conv", "conv"])
    assert out["warnings"] == [] and out["errors"] == []
    assert out["linear_ok"] == [True] and out["conv_ok"] == [True, True]
    assert out["matmul"]["no_engine"] == 1 and out["conv"]["no_engine"] == 2


@sim_only
@pytest.mark.parametrize("reason", ["layout", "epilogue", "deterministic", "not_supported"])
def test_documented_limits_are_counted_never_warned_or_raised(reason):
    assert reason not in POLICED
    out = run_injected(reason, "raise", ["linear", "conv"])
    assert out["warnings"] == [] and out["errors"] == []
    assert out["linear_ok"] == [True] and out["conv_ok"] == [True]
    assert out["matmul"][reason] == 1 and out["conv"][reason] == 1


@sim_only
def test_a_warning_made_an_error_by_the_filter_is_raised():
    code = """
import warnings, numpy as np, gpuaccel as ga
warnings.simplefilter("error", ga.FallbackWarning)
x = ga.asarray(np.ones((4, 3), np.float32), device="cuda")
try:
    ga.linear(x, x)
except ga.FallbackWarning as w:
    print("raised", "reason 'execution_failed'" in str(w))
y = ga.linear(x, x)  # warned once already: runs
print("second", float(y.numpy().sum()))
"""
    proc = run_python("-c", code, env={"GPUACCEL_SIM_FALLBACK": "%d:0:none ran" % REASONS.index("execution_failed"),
                                       "GPUACCEL_FALLBACK": "warn"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split("\n")[:2] == ["raised True", "second 48.0"]
