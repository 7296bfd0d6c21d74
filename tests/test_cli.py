"""python -m gpuaccel doctor | bench | demo, and the examples, on this
(CPU-only) machine; the doctor's rules with made-up versions."""

import json
import os
import shutil
import sys

import pytest

import gpuaccel as ga
from gpuaccel import doctor

from helpers import python_env, run_python

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(*argv, timeout=600):
    """A gpuaccel command or example in a fresh interpreter outside the
    checkout; they may take minutes on a slow (or sanitized) machine."""
    return run_python(*argv, timeout=timeout)


# ------------------------------------------------------------------ doctor

def test_doctor_on_this_machine_is_consistent_and_json_is_well_formed():
    text = run("-m", "gpuaccel", "doctor")
    assert text.returncode == 0, text.stdout + text.stderr
    out = run("-m", "gpuaccel", "doctor", "--json")
    assert out.returncode == 0
    data = json.loads(out.stdout)
    assert data["consistent"] is True
    # one verdict, the same in both forms, that agrees with the findings
    levels = [f["level"] for f in data["findings"]]
    assert "verdict: %s" % data["verdict"] in text.stdout
    assert ("nothing to fix" in data["verdict"]) == (set(levels) <= {"ok"})
    assert ("warning" in data["verdict"]) == ("warning" in levels)
    assert os.path.samefile(data["facts"]["gpuaccel_path"], os.path.dirname(ga._C.__file__))
    if not ga.built_with_cuda():  # the CPU-only build says so where a user looks, with the reason
        assert "CPU-ONLY BUILD" in text.stdout
    facts = data["facts"]
    assert facts["python"] == "%d.%d.%d" % sys.version_info[:3]
    assert facts["gpuaccel_built_with_cuda"] == ga.built_with_cuda()
    assert facts["cuda_available"] == ga.cuda_available()
    assert all(set(f) == {"level", "finding", "fix"} for f in data["findings"])
    # torch is imported by doctor, nothing set: torch's flags decide, with its defaults
    assert facts["tf32"] == {"matmul": {"allowed": False, "source": "torch"},
                             "conv": {"allowed": True, "source": "torch"}}
    assert ("TF32        float32 matmuls off (torch.get_float32_matmul_precision()), convolutions on "
            "(torch.backends.cudnn.allow_tf32)") in text.stdout


def test_doctor_names_where_each_tf32_setting_comes_from():
    facts = consistent_gpu_machine()
    facts["tf32"] = {"matmul": {"allowed": True, "source": "gpuaccel"}, "conv": {"allowed": True, "source": "default"}}
    text = doctor.report(facts, doctor.diagnose(facts))
    assert ("TF32        float32 matmuls on (gpuaccel.set_matmul_precision), convolutions on (torch's default)"
            in text)


def consistent_gpu_machine():
    """Facts of a healthy H100 machine (made up)."""
    return {
        "os": "Linux", "python": "3.12.0", "numpy": "2.3.0", "gpuaccel": "0.1.0",
        "gpuaccel_built_with_cuda": True, "gpuaccel_cuda_archs": [80, 86, 89, 90],
        "gpuaccel_cuda_runtime": (13, 0), "driver_version": "580.95.05", "driver_cuda": (13, 0),
        "cublaslt_built": 130100, "cublaslt_loaded": 130105, "cublaslt_library": "libcublasLt.so.13",
        "cudnn_built": 91400, "cudnn_loaded": 91400, "cudnn_library": "libcudnn.so.9",
        "cuda_available": True,
        "gpus": [{"index": 0, "name": "NVIDIA H100 80GB HBM3", "compute_capability": [9, 0],
                  "memory_gib": 79.2, "multiprocessors": 132}],
        "torch": "2.11.0+cu130", "torch_cuda": "13.0", "torch_cudnn": 91400, "torch_sees_gpu": True,
        "visible_devices": None, "gpuaccel_path": "/site-packages/gpuaccel", "gpuaccel_build_note": "",
    }


def errors(facts):
    return [what for level, what, fix in doctor.diagnose(facts) if level == doctor.ERROR]


def test_a_healthy_gpu_machine_has_no_errors_and_reports_tf32_bf16():
    facts = consistent_gpu_machine()
    assert errors(facts) == []
    assert any("TF32 and bfloat16" in what for level, what, fix in doctor.diagnose(facts) if level == doctor.OK)
    text = doctor.report(facts, doctor.diagnose(facts))
    assert "H100" in text and "verdict: consistent: nothing to fix" in text


def test_the_readme_doctor_sample_is_what_doctor_prints_for_its_machine():
    # the README shows a CUDA build on a machine without a GPU: the same lines (labels, findings, verdict) as
    # doctor prints for those facts today, and the architectures a default build compiles for
    import re

    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    sample = readme.split("$ python -m gpuaccel doctor", 1)[1].split("```", 1)[0].splitlines()[1:]
    facts = consistent_gpu_machine()
    facts.update(driver_version=None, driver_cuda=None, gpus=[], cuda_available=False, torch_sees_gpu=False,
                 tf32={"matmul": {"allowed": False, "source": "torch"}, "conv": {"allowed": True, "source": "torch"}},
                 jpeg="2.1.5", jpeg_build_note="", nvjpeg="13.3.2", nvjpeg_build_note="")
    assert set(facts) >= set(doctor.collect())  # every fact doctor collects today, so that its line shows
    printed = doctor.report(facts, doctor.diagnose(facts)).splitlines()

    def label(line):
        return line.split()[0] if line.startswith("  ") and not line.startswith("   ") else line.strip()[:5]

    assert [label(line) for line in sample] == [label(line) for line in printed]
    exact = ("  warning", "           fix", "  verdict", "  TF32", "  JPEG")
    assert [line for line in printed if line.startswith(exact)] == [line for line in sample if line.startswith(exact)]
    with open(os.path.join(ROOT, "setup.py"), encoding="utf-8") as f:
        archs = re.search(r'DEFAULT_ARCHS = "([\d;]+)"', f.read()).group(1).split(";")
    assert "kernels for %s" % ", ".join("sm_" + a for a in archs) in "\n".join(sample)


@pytest.mark.parametrize("levels, expected", [
    ([], "consistent: nothing to fix"),
    (["ok", "ok"], "consistent: nothing to fix"),
    (["ok", "warning"], "usable, with 1 warning: see the fix above"),
    (["warning", "warning"], "usable, with 2 warnings: see the fixes above"),
    (["error"], "1 problem to fix"),
    (["error", "warning", "error"], "2 problems to fix and 1 warning"),
])
def test_the_verdict_agrees_with_the_findings(levels, expected):
    assert doctor.verdict([(level, "what", "fix") for level in levels]) == expected


def test_a_warning_is_never_followed_by_nothing_to_fix():
    facts = consistent_gpu_machine()
    facts["driver_cuda"], facts["gpus"] = None, []  # the README's example: a CUDA build without a driver
    text = doctor.report(facts, doctor.diagnose(facts))
    assert "warning  no NVIDIA driver" in text
    assert "nothing to fix" not in text and "verdict: usable, with 1 warning" in text


@pytest.mark.parametrize("change, words", [
    (dict(driver_cuda=(12, 4)), "older than the CUDA 13.0 runtime"),
    (dict(torch_cuda=None), "CPU-only build"),
    (dict(torch_cuda="14.0"), "newer than the driver"),
    (dict(gpuaccel_built_with_cuda=False), "built without CUDA"),
    (dict(gpus=[{"index": 0, "name": "Tesla T4", "compute_capability": [7, 5], "memory_gib": 15.0,
                 "multiprocessors": 40}]), "no kernels for Tesla T4"),
    (dict(cudnn_loaded=None), "cuDNN could not be loaded"),
    (dict(cudnn_loaded=81000), "built against cuDNN"),
    (dict(cublaslt_loaded=120400), "built against cuBLAS"),
    (dict(gpus=[]), "no GPU is visible"),
    (dict(torch_sees_gpu=False), "torch cannot use the GPU"),
])
def test_each_mismatch_is_an_error_with_a_fix(change, words):
    facts = consistent_gpu_machine()
    facts.update(change)
    findings = [(what, fix) for level, what, fix in doctor.diagnose(facts) if level == doctor.ERROR]
    assert any(words in what for what, fix in findings), findings
    assert all(fix for what, fix in findings)  # every error says what to do


def test_warnings_are_not_errors():
    facts = consistent_gpu_machine()
    facts["driver_cuda"] = None  # a CUDA build on a machine without a driver: runs on the CPU
    facts["gpus"] = []
    assert errors(facts) == []
    assert any("no NVIDIA driver" in what for level, what, fix in doctor.diagnose(facts) if level == doctor.WARNING)
    newer = consistent_gpu_machine()
    newer["gpus"][0]["compute_capability"] = [10, 0]  # newer than every compiled arch: PTX JIT
    assert errors(newer) == []
    assert any("JIT" in what for level, what, fix in doctor.diagnose(newer))


# ------------------------------------------------------------------- bench

def test_bench_json_on_the_cpu():
    out = run("-m", "gpuaccel", "bench", "--json", "--only", "matmul", "logger", "--device", "cpu", "--rounds", "3")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["cuda"] is False and "CPU" in data["device"] and data["rounds"] == 3
    assert data["cpus"] == len(os.sched_getaffinity(0)) and len(data["load_average"]) == 2
    groups = {r["group"] for r in data["rows"]}
    assert groups == {"matmul", "logger"}
    # physically plausible on this machine: a unit slip (ms for s, FLOP for GFLOP) is off by 1000x.
    # A core's float32 peak: 2 AVX-512 FMA units x 16 lanes x 2 FLOP at 5 GHz = 320 GFLOP/s
    cores = len(os.sched_getaffinity(0))
    limits = {"GFLOP/s": (0.05, 400.0 * cores), "steps/s": (1.0, 1e6)}
    for r in data["rows"]:
        low, high = limits[r["unit"]]
        assert low < r["gpuaccel"] < high and low < r["torch"] < high, r
        assert r["rounds"] == 3 and r["note"] in ("", "noise", "noisy")
        for side in ("gpuaccel", "torch", "ratio"):  # a median within its range
            assert r[side + "_min"] <= r[side] <= r[side + "_max"], r
    # the ceiling column, recomputed: the gpuaccel number over the best number of the same dtype
    matmul = [r for r in data["rows"] if r["group"] == "matmul"]
    assert len(matmul) >= 2
    for r in matmul:
        same = [m for m in matmul if m["case"].split()[0] == r["case"].split()[0]]
        best = max(max(m["gpuaccel"], m["torch"]) for m in same)
        assert r["ceiling_fraction"] == (pytest.approx(r["gpuaccel"] / best) if len(same) > 1 else None)


def test_bench_table_explains_its_columns_and_fills_ceilings_only_where_they_compare():
    from gpuaccel import bench

    rows = [bench.Row("bandwidth", "host->host copy", "GB/s", 10.0, 12.0, ceiling_key="h2h"),
            bench.Row("matmul", "256 float32", "GFLOP/s", 30.0, 40.0, ceiling_key="mm32"),
            bench.Row("matmul", "512 float32", "GFLOP/s", 50.0, 45.0, ceiling_key="mm32"),
            bench.Row("logger", "per-step", "steps/s", 3.0, 6.0)]
    bench._fill_ceilings(rows)
    assert rows[0]["ceiling_fraction"] is None  # one row of its kind: no ceiling to compare with
    assert rows[1]["ceiling_fraction"] == pytest.approx(30 / 50) and rows[2]["ceiling_fraction"] == 1.0
    cpu = bench.table(rows, "MACHINE X", on_gpu=False)
    assert cpu.count("MACHINE X") == 1 and "of ceiling: the gpuaccel number" in cpu
    assert "loss.item() is a plain read" in cpu  # the CPU logger row is explained where it is shown
    assert "plain read" not in bench.table(rows, "an H100", on_gpu=True)


def test_bench_plot_without_matplotlib_says_so_before_benchmarking(tmp_path, monkeypatch):
    from gpuaccel import bench

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    rows = [bench.Row("matmul", "x", "GFLOP/s", [2.0, 2.2], [1.0, 1.1])]
    message = bench.plot(rows, str(tmp_path / "p.png"))
    assert "matplotlib" in message and not (tmp_path / "p.png").exists()
    code = ("import sys; sys.modules['matplotlib'] = None\n"
            "from gpuaccel import bench\n"
            "sys.exit(bench.main(['--plot', %r, '--device', 'cpu']))" % str(tmp_path / "p.png"))
    out = run_python("-c", code, timeout=120)
    assert out.returncode == 2
    assert out.stderr.strip() == bench.PLOT_NEEDS and out.stdout == ""  # said first: nothing was benchmarked


def test_bench_rows_say_their_spread_and_when_they_are_noise():
    from gpuaccel import bench

    steady = bench.Row("matmul", "x", "GFLOP/s", [10.0, 12.0, 11.0], [5.0, 6.0, 5.0])
    assert steady["ratio"] == pytest.approx(2.0) and steady["note"] == ""  # per-round 2.0, 2.0, 2.2
    assert (steady["ratio_min"], steady["ratio_max"]) == (pytest.approx(2.0), pytest.approx(2.2))
    assert (steady["gpuaccel_min"], steady["gpuaccel"], steady["gpuaccel_max"]) == (10.0, 11.0, 12.0)
    # the rounds disagree on which side is faster
    assert bench.Row("matmul", "x", "GFLOP/s", [10.0, 10.0, 10.0], [8.0, 12.0, 9.0])["note"] == "noise"
    # they agree, but one round says 1.2x and another 3x
    noisy = bench.Row("matmul", "x", "GFLOP/s", [12.0, 30.0, 20.0], [10.0, 10.0, 10.0])
    assert noisy["note"] == "noisy" and noisy["ratio"] == pytest.approx(2.0)
    text = bench.table([steady, noisy], "MACHINE X", on_gpu=True)
    assert "2.00x (2.00-2.20)" in text and "noisy" in text and "11 (10-12)" in text
    assert "noise = the rounds disagree" in " ".join(text.split())
    assert bench.load_note((1.0, 2), (1.5, 2)) is None  # a quiet machine goes unmentioned
    busy = bench.load_note((1.0, 2), (3.0, 2))
    assert "load average 3.0 on 2 CPUs" in busy
    assert "load average 3.0 on 2 CPUs" in " ".join(bench.table([steady], "MACHINE X", load=busy).split())


def test_bench_measures_both_sides_round_by_round_in_alternating_order():
    from gpuaccel import bench

    calls = []
    torch = pytest.importorskip("torch")
    ms_g, ms_t = bench.time_pair_ms(lambda: calls.append("g"), lambda: calls.append("t"), torch, "cpu", rounds=4,
                                    min_batch_s=0.0, warmup=1)
    assert len(ms_g) == len(ms_t) == 4
    # warm-up and one calibration call each, then batches of one call: g t, t g, g t, t g
    assert "".join(calls) == "gg" + "tt" + "gttggttg"


def test_bench_host_copy_row_times_copying_not_allocating(monkeypatch):
    # the row's torch side copies into a tensor allocated once (clone() allocated 64 MiB per call: that row
    # measured page faults), and gpuaccel's copies into an array allocated once
    import gpuaccel as ga
    from gpuaccel import bench

    torch = pytest.importorskip("torch")
    captured = []

    def capture(fn_g, fn_t, *args, **kwargs):
        captured.append((fn_g, fn_t))
        return [1.0], [1.0]

    monkeypatch.setattr(bench, "time_pair_ms", capture)
    (row,) = bench.bench_bandwidth(torch, "cpu", full=False)
    assert "copy into an array" in row["case"]
    fn_g, fn_t = captured[0]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn_t()
    ops = {e.key for e in prof.key_averages()}
    assert "aten::copy_" in ops and not ops & {"aten::clone", "aten::empty", "aten::empty_like"}, ops
    fn_g()
    before = ga.memory_stats()
    fn_g()
    assert ga.memory_stats() == before  # nothing allocated by the copy


def test_bench_rejects_unknown_groups():
    out = run("-m", "gpuaccel", "bench", "--only", "nonsense")
    assert out.returncode == 2 and "invalid choice" in out.stderr


# -------------------------------------------------------------------- demo

def test_tiny_demo_learns_well_above_chance(tmp_path):
    out = run("-m", "gpuaccel", "demo", "--device", "cpu", "--samples", "2000", "--steps", "80",
              "--batch-size", "32", "--block", "13", "--threads", "1", "--json", "--data", str(tmp_path))
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    for name in ("gpuaccel", "torch"):
        r = data["results"][name]
        assert r["steps"] == 62  # one epoch of 2000/32 steps caps the run
        assert r["accuracy"] > 0.4, r  # chance is 0.1
        assert r["images_per_s"] > 0
    # 62 - 6 warm-up steps in blocks of 13: five timed blocks a side, paired back to back
    ratio = data["ratio"]
    assert ratio["pairs"] == 5 and ratio["min"] <= ratio["median"] <= ratio["max"]
    assert data["torch_threads"] == 1 and data["cpus"] == len(os.sched_getaffinity(0))


def test_demo_alternates_the_sides_block_by_block():
    from gpuaccel import demo

    torch = pytest.importorskip("torch")
    order = []

    def steps(name, count):
        def train(bar, results):
            for _ in range(count):
                order.append(name)
                yield 4  # images per step
            results["steps"] = count
        return train

    sides = [demo._Side("g", steps("g", 12), demo._Null(), None), demo._Side("t", steps("t", 12), demo._Null(), None)]
    demo._interleave(torch, torch.device("cpu"), sides, 2, 3)
    # two warm-up steps each, then blocks of 3, the order swapped each round; the last blocks are short
    assert " ".join("".join(order)[i:j] for i, j in ((0, 2), (2, 4), (4, 7), (7, 10), (10, 13), (13, 16), (16, 19),
                                                      (19, 22), (22, 23), (23, 24))) == \
        "gg tt ggg ttt ttt ggg ggg ttt t g"
    assert sides[0].done and sides[1].done and sides[0].results == {"steps": 12}
    assert [images for images, _ in sides[0].blocks] == [12, 12, 12, 4] == [i for i, _ in sides[1].blocks]
    assert len(demo._block_ratios(*sides)) == 4


def test_demo_says_when_the_machine_was_busy():
    from gpuaccel import demo

    assert demo._busy_note((0.5, 2), (1.9, 2)) is None
    note = demo._busy_note((0.5, 2), (3.2, 2))
    assert "load average 3.2 on 2 CPUs" in note and "--threads 1" in note


def test_demo_only_one_side(tmp_path):
    out = run("-m", "gpuaccel", "demo", "--device", "cpu", "--samples", "1000", "--steps", "10",
              "--batch-size", "32", "--json", "--only", "gpuaccel", "--data", str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert list(json.loads(out.stdout)["results"]) == ["gpuaccel"]


def test_unknown_command_is_a_usage_error():
    out = run("-m", "gpuaccel", "frobnicate")
    assert out.returncode == 2 and "unknown command 'frobnicate'" in out.stderr and "doctor" in out.stderr
    assert "did you mean" not in out.stderr


def test_a_mistyped_command_gets_the_nearest_one():
    out = run("-m", "gpuaccel", "doktor")
    assert out.returncode == 2
    assert "unknown command 'doktor'; did you mean 'doctor'?" in out.stderr


def test_help_goes_to_stdout_with_status_0():
    out = run("-m", "gpuaccel", "--help")
    assert out.returncode == 0 and "doctor" in out.stdout and out.stderr == ""


@pytest.mark.parametrize("argv", [
    ("-m", "gpuaccel", "demo", "--help"),
    (os.path.join(ROOT, "examples", "train.py"), "--help"),
    (os.path.join(ROOT, "examples", "train_ddp.py"), "--help"),
    (os.path.join(ROOT, "examples", "export_onnx.py"), "--help"),
    (os.path.join(ROOT, "examples", "train_checkpointed.py"), "--help"),
    (os.path.join(ROOT, "examples", "fuse_torchvision.py"), "--help"),
])
def test_help_texts_are_whole_and_every_option_has_one(argv):
    out = run(*argv)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert not text.rstrip().endswith(":"), text[-300:]  # no description cut off before its list
    options = [line.split()[0] for line in text.splitlines() if line.startswith("  --")]
    assert options, text
    lines = text.splitlines() + [""]
    for i, line in enumerate(lines[:-1]):
        if line.startswith("  --"):
            # an option's help text is on its line (after the metavar) or the next
            assert len(line.split()) > 2 or lines[i + 1].startswith(" " * 10), "no help for %s" % line


@pytest.mark.parametrize("argv", [
    ("-m", "gpuaccel", "demo", "--device", "cuda"),
    (os.path.join(ROOT, "examples", "train.py"), "--device", "cuda"),
    ("-m", "gpuaccel", "bench", "--device", "cuda"),
])
def test_an_unusable_cuda_device_fails_up_front_in_one_line(argv, tmp_path):
    if ga.cuda_available():
        pytest.skip("this machine has a usable GPU")
    out = run(*argv, "--data", str(tmp_path)) if "bench" not in argv else run(*argv)
    assert out.returncode == 2
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr  # one line, no traceback
    assert "--device cuda" in out.stderr and "doctor" in out.stderr
    assert not list(tmp_path.iterdir())  # and before generating any data


# ---------------------------------------------------------------- examples

def test_example_training_script_runs_on_the_cpu_and_its_seed_repeats_a_run(tmp_path):
    def train(seed):
        out = run(os.path.join(ROOT, "examples", "train.py"), "--device", "cpu", "--steps", "60", "--batch-size",
                  "32", "--samples", "2000", "--data", str(tmp_path), "--seed", str(seed))
        assert out.returncode == 0, out.stderr
        return out.stdout

    first = train(7)
    accuracy = float(first.split("held-out accuracy:")[1].split("%")[0])
    assert accuracy > 40
    assert train(7) == first  # same weights, same order, same losses and accuracy
    assert train(8) != first


@pytest.mark.parametrize("route", [[], ["--torchscript"], ["--exported-program"]],
                         ids=["dynamo", "torchscript", "exported_program"])
def test_example_onnx_export_runs_in_onnxruntime(route, tmp_path):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    out = run("-W", "default::DeprecationWarning", os.path.join(ROOT, "examples", "export_onnx.py"),
              "--out", str(tmp_path / "m.onnx"), *route)
    assert out.returncode == 0, out.stderr
    # with no flag, torch's current exporter: not the TorchScript one, which torch deprecates
    assert ("DeprecationWarning" in out.stderr) == (route == ["--torchscript"]), out.stderr
    assert "Conv" in out.stdout and "Gemm" in out.stdout and (tmp_path / "m.onnx").exists()
    assert float(out.stdout.split("largest difference")[1]) < 1e-4


def test_example_fuse_torchvision_prints_the_reports_and_the_same_outputs():
    pytest.importorskip("torchvision")
    out = run(os.path.join(ROOT, "examples", "fuse_torchvision.py"), "--models", "resnet18,vit_b_16", "--size", "32")
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("gpuaccel.torch.fuse report for") == 2
    assert "fused (20):" in out.stdout and "FusedConv2dBN(relu), BatchNorm folded" in out.stdout
    assert "heads.head" in out.stdout  # a Linear left unfused, with its reason
    differences = [float(line.split(": ")[1].split()[0]) for line in out.stdout.splitlines()
                   if line.startswith("largest difference")]
    assert len(differences) == 2 and max(differences) < 1e-4, differences


def test_example_checkpointed_accumulating_training_learns(tmp_path):
    out = run(os.path.join(ROOT, "examples", "train_checkpointed.py"), "--device", "cpu", "--steps", "30",
              "--batch-size", "16", "--micro-batches", "3", "--samples", "2000", "--data", str(tmp_path))
    assert out.returncode == 0, out.stderr
    losses = [float(line.split("loss")[1]) for line in out.stdout.splitlines() if line.startswith("step")]
    assert len(losses) == 3 and losses[-1] < 0.8 * losses[0], losses  # ln(10) = 2.3 at the start


def test_example_ddp_script_run_directly_says_to_use_torchrun(tmp_path):
    script = os.path.join(ROOT, "examples", "train_ddp.py")
    out = run(script, "--device", "cpu", "--data", tmp_path)
    assert out.returncode == 2
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr  # one line, no traceback
    assert "torchrun --standalone --nproc-per-node=2 examples/train_ddp.py" in out.stderr
    assert not list(tmp_path.iterdir())  # nothing started
    assert "torchrun --standalone" in " ".join(run(script, "--help").stdout.split())


def test_example_ddp_script_runs_on_two_cpu_ranks(tmp_path):
    out = run("-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
              os.path.join(ROOT, "examples", "train_ddp.py"), "--device", "cpu", "--steps", "30",
              "--batch-size", "16", "--samples", "1000", "--data", tmp_path, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "(mean of 2 ranks)" in out.stdout and "final loss" in out.stdout


# -------------------------------------------------------- the test suite

def pytest_with_our_conftest(tmp_path, name, text, *args, **env):
    """pytest run on one test file `text` beside a copy of tests/conftest.py."""
    shutil.copy(os.path.join(ROOT, "tests", "conftest.py"), tmp_path / "conftest.py")
    (tmp_path / name).write_text(text)
    path = os.pathsep.join([os.path.join(ROOT, "tests"), python_env()["PYTHONPATH"]])
    return run_python("-m", "pytest", "-p", "no:cacheprovider", "-q", *args, str(tmp_path), cwd=tmp_path,
                      env=dict(env, PYTHONPATH=path))


def test_the_skip_summary_groups_skips_by_reason(tmp_path):
    out = pytest_with_our_conftest(tmp_path, "test_some.py",
        "import pytest\n"
        "@pytest.mark.parametrize('i', range(3))\n"
        "def test_a(i):\n    pytest.skip('reason A')\n"
        "def test_b():\n    pytest.skip('reason B')\n"
        "def test_c():\n    pass\n", "-rfEX")
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if "skipped, by reason" in line)
    assert lines[start + 1].split() == ["3", "reason", "A:", "test_some.py", "(3)"]
    assert lines[start + 2].split() == ["1", "reason", "B:", "test_some.py", "(1)"]
    assert not any(line.startswith("SKIPPED") for line in lines)


def test_tests_draw_the_same_inputs_every_run_and_a_failure_says_how_to_reproduce_it(tmp_path):
    source = ("import random, numpy as np, torch\n"
              "def test_draw(rng):\n"
              "    print('DRAW', rng.integers(1 << 30), np.random.randint(1 << 30), random.random(),"
              " float(torch.rand(())))\n"
              "    assert False\n")

    def draw(**env):
        out = pytest_with_our_conftest(tmp_path, "test_draws.py", source, **env)
        assert out.returncode == 1, out.stdout + out.stderr
        line = next(line for line in out.stdout.splitlines() if line.startswith("DRAW"))
        return line, out.stdout

    first, text = draw()
    assert draw()[0] == first  # fixed per test: the same inputs in every run
    seed = int(text.split("reproduce with GPUACCEL_TEST_SEED=")[1].split()[0])
    assert draw(GPUACCEL_TEST_SEED=str(seed))[0] == first  # what the failure prints reproduces it
    assert draw(GPUACCEL_TEST_SEED="random")[0] != first  # fresh draws on request
