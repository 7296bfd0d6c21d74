"""python -m gpuaccel doctor: what this machine has for GPU training, and
what is inconsistent, each finding with its fix in one sentence.

collect() gathers the facts; diagnose(facts) turns them into findings (a
pure function, so every rule is tested with made-up versions); main()
prints them and exits 1 when an error was found.  A machine without a GPU is
consistent: gpuaccel then runs everything on the CPU.
"""

import json
import os
import platform
import sys

ERROR, WARNING, OK = "error", "warning", "ok"


def _version(v):
    """13000 -> (13, 0)"""
    return None if not v else (v // 1000, (v % 1000) // 10)


def _vstr(v):
    return "%d.%d" % v if v else "none"


def _driver_version():
    """The NVIDIA kernel driver's own version string (e.g. '580.159.04')."""
    try:
        with open("/proc/driver/nvidia/version") as f:
            for word in f.read().split():
                if word.count(".") >= 1 and word.replace(".", "").isdigit():
                    return word
    except OSError:
        pass
    return None


def _build_config_module():
    try:
        from gpuaccel import _build_config

        return _build_config
    except ImportError:
        return None


def collect():
    """The facts doctor reasons about (plain data: JSON-serialisable)."""
    import numpy

    import gpuaccel as ga

    info = ga.build_info()
    try:
        from gpuaccel import _build_config

        note = _build_config.CUDA_BUILD_NOTE
    except (ImportError, AttributeError):
        note = ""
    facts = {
        "os": platform.platform(),
        "python": platform.python_version(),
        "numpy": numpy.__version__,
        "gpuaccel": ga.__version__,
        "gpuaccel_path": os.path.dirname(os.path.abspath(ga._C.__file__)),
        "gpuaccel_built_with_cuda": info["built_with_cuda"],
        "gpuaccel_build_note": note,
        "gpuaccel_cuda_archs": info["cuda_archs"],
        "gpuaccel_cuda_runtime": _version(info["cuda_runtime_built"]),
        "driver_version": _driver_version(),
        "driver_cuda": _version(info["driver_cuda_version"]),
        "cublaslt_built": info["cublaslt_built"],
        "cublaslt_loaded": info["cublaslt_loaded"],
        "cublaslt_library": info["cublaslt_library"],
        "cudnn_built": info["cudnn_built"],
        "cudnn_loaded": info["cudnn_loaded"],
        "cudnn_library": info["cudnn_library"],
        "cuda_available": ga.cuda_available(),
        "gpus": [],
        "torch": None,
        "torch_cuda": None,
        "torch_cudnn": None,
        "torch_sees_gpu": None,
        "visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "jpeg": ga._C._LoaderIter.jpeg_version(),
        "jpeg_build_note": getattr(_build_config_module(), "JPEG_BUILD_NOTE", ""),
        "nvjpeg": ga._C._LoaderIter.nvjpeg_version() if hasattr(ga._C._LoaderIter, "nvjpeg_version") else None,
        "nvjpeg_build_note": getattr(_build_config_module(), "NVJPEG_BUILD_NOTE", ""),
    }
    for index in range(ga.device_count()):
        p = ga.device_properties(index)
        facts["gpus"].append({"index": index, "name": p["name"], "compute_capability": list(p["compute_capability"]),
                              "memory_gib": round(p["total_memory"] / 2**30, 1),
                              "multiprocessors": p["multiprocessors"]})
    try:
        import torch

        facts["torch"] = torch.__version__
        facts["torch_cuda"] = torch.version.cuda
        try:
            facts["torch_cudnn"] = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
        except Exception:  # noqa: BLE001 - a broken cuDNN is itself a finding
            facts["torch_cudnn"] = None
        facts["torch_sees_gpu"] = torch.cuda.is_available()
    except ImportError:
        pass
    # after torch's import: while gpuaccel's setters are not called, torch's flags decide
    facts["tf32"] = {op: dict(zip(("allowed", "source"), ga._C._tf32_state(op))) for op in ("matmul", "conv")}
    return facts


_TF32_SOURCES = {
    "matmul": {"gpuaccel": "gpuaccel.set_matmul_precision", "torch": "torch.get_float32_matmul_precision()",
               "default": "torch's default"},
    "conv": {"gpuaccel": "gpuaccel.set_conv_allow_tf32", "torch": "torch.backends.cudnn.allow_tf32",
             "default": "torch's default"},
}


def _tf32_line(tf32):
    """'float32 matmuls off (torch's default), convolutions on (...)': TF32 for float32 CUDA ops
    and which setting decides it."""
    return "float32 matmuls %s, convolutions %s" % tuple(
        "%s (%s)" % ("on" if tf32[op]["allowed"] else "off", _TF32_SOURCES[op][tf32[op]["source"]])
        for op in ("matmul", "conv"))


def _cudnn_major(v):
    return v // 10000 if v and v >= 10000 else (v // 1000 if v else None)


def diagnose(f):
    """[(level, what, fix)] for the facts of collect()."""
    out = []
    gpus = f.get("gpus") or []
    driver = f.get("driver_cuda")
    runtime = f.get("gpuaccel_cuda_runtime")
    if not f.get("gpuaccel_built_with_cuda"):
        why = " (%s)" % f["gpuaccel_build_note"] if f.get("gpuaccel_build_note") else ""
        if driver or gpus or f.get("driver_version"):
            out.append((ERROR, "gpuaccel was built without CUDA%s, but this machine has an NVIDIA driver" % why,
                        "reinstall gpuaccel with the CUDA toolkit's nvcc on PATH (or CUDA_HOME set): "
                        "pip install --force-reinstall --no-cache-dir ."))
        else:
            out.append((OK, "gpuaccel is a CPU-only build%s and there is no GPU: everything runs on the CPU" % why,
                        ""))
    if f.get("gpuaccel_built_with_cuda"):
        if not driver:
            out.append((WARNING, "no NVIDIA driver was found: gpuaccel runs on the CPU",
                        "to use a GPU, install the NVIDIA driver (in a container, start it with the GPUs visible)"))
        elif not gpus:
            out.append((ERROR, "the NVIDIA driver is loaded but no GPU is visible to this process",
                        "check CUDA_VISIBLE_DEVICES (now %r) and that the GPU is not hidden from the container"
                        % f.get("visible_devices")))
        if driver and runtime and driver[0] < runtime[0]:
            out.append((ERROR, "the driver supports CUDA %s, older than the CUDA %s runtime gpuaccel was built with"
                        % (_vstr(driver), _vstr(runtime)),
                        "update the NVIDIA driver to one that supports CUDA %d, or rebuild gpuaccel with an older "
                        "toolkit" % runtime[0]))
        elif driver and runtime and driver < runtime:
            out.append((WARNING, "the driver supports CUDA %s, gpuaccel's runtime is %s: minor-version compatibility "
                        "applies (newer PTX features may be refused)" % (_vstr(driver), _vstr(runtime)),
                        "update the NVIDIA driver when convenient"))
        archs = f.get("gpuaccel_cuda_archs") or []
        for gpu in gpus:
            cc = gpu["compute_capability"][0] * 10 + gpu["compute_capability"][1]
            if archs and cc not in archs and cc < min(archs):
                out.append((ERROR, "gpuaccel has no kernels for %s (sm_%d): it was compiled for sm_%s"
                            % (gpu["name"], cc, ", sm_".join(map(str, archs))),
                            "rebuild with GPUACCEL_CUDA_ARCH=\"%d\" pip install ." % cc))
            elif archs and cc not in archs and cc > max(archs):
                out.append((WARNING, "no machine code for %s (sm_%d): its kernels are JIT-compiled from PTX at "
                            "first use" % (gpu["name"], cc),
                            "rebuild with GPUACCEL_CUDA_ARCH including %d for a faster start" % cc))
            if cc >= 80:
                out.append((OK, "%s: TF32 and bfloat16 tensor cores available (float32 convolutions use TF32 "
                            "by default, as torch's; set_matmul_precision('high'), gpuaccel's or torch's, enables "
                            "it for matmuls)" % gpu["name"], ""))
            else:
                out.append((WARNING, "%s (sm_%d) has no bfloat16 or TF32 tensor cores" % (gpu["name"], cc),
                            "train in float16 with a loss scaler (torch.amp.GradScaler) instead of bfloat16"))
        if not f.get("cudnn_loaded"):
            out.append((ERROR, "cuDNN could not be loaded", "install cuDNN 9 (pip install nvidia-cudnn-cu13)"))
        elif _cudnn_major(f.get("cudnn_loaded")) != _cudnn_major(f.get("cudnn_built")):
            out.append((ERROR, "gpuaccel was built against cuDNN %s but loaded cuDNN %s"
                        % (f.get("cudnn_built"), f.get("cudnn_loaded")),
                        "install cuDNN %d, or rebuild gpuaccel against the installed one"
                        % _cudnn_major(f.get("cudnn_built"))))
        if f.get("cublaslt_loaded") and f.get("cublaslt_built") and \
                f["cublaslt_loaded"] // 10000 != f["cublaslt_built"] // 10000:
            out.append((ERROR, "gpuaccel was built against cuBLAS %s but loaded %s"
                        % (f["cublaslt_built"], f["cublaslt_loaded"]),
                        "install the matching cuBLAS (pip install nvidia-cublas) or rebuild gpuaccel"))
    if f.get("torch"):
        torch_cuda = f.get("torch_cuda")
        if not torch_cuda and (gpus or driver):
            out.append((ERROR, "torch %s is a CPU-only build, but this machine has an NVIDIA GPU" % f["torch"],
                        "install a CUDA build of torch (see pytorch.org's install selector)"))
        if torch_cuda and driver:
            major = int(torch_cuda.split(".")[0])
            if major > driver[0]:
                out.append((ERROR, "torch was built for CUDA %s, newer than the driver's CUDA %s"
                            % (torch_cuda, _vstr(driver)),
                            "update the NVIDIA driver, or install a torch built for CUDA %d" % driver[0]))
        if torch_cuda and gpus and f.get("torch_sees_gpu") is False:
            out.append((ERROR, "torch cannot use the GPU that gpuaccel sees",
                        "reinstall torch for this driver, and check CUDA_VISIBLE_DEVICES"))
        if f.get("torch_cudnn") and f.get("cudnn_loaded") and \
                _cudnn_major(f["torch_cudnn"]) != _cudnn_major(f["cudnn_loaded"]):
            out.append((WARNING, "torch uses cuDNN %s and gpuaccel cuDNN %s" % (f["torch_cudnn"], f["cudnn_loaded"]),
                        "install one cuDNN 9 that both load (import torch first, or pip install nvidia-cudnn-cu13)"))
    else:
        out.append((WARNING, "torch is not installed: gpuaccel.torch, the loader's torch output and the demo need it",
                    "pip install torch"))
    if "jpeg" in f and not f.get("jpeg"):
        # optional, like CUDA: only PinnedLoader over image folders needs it
        out.append((OK, "gpuaccel was built without libjpeg-turbo (%s): PinnedLoader cannot decode image folders"
                    % (f.get("jpeg_build_note") or "not found"),
                    "apt-get install libjpeg62-turbo-dev (Ubuntu: libjpeg-turbo8-dev), then reinstall gpuaccel"))
    return out


def report(facts, findings):
    lines = ["gpuaccel doctor", ""]
    lines.append("  system      %s, Python %s, NumPy %s" % (facts["os"], facts["python"], facts["numpy"]))
    lines.append("  torch       %s (CUDA %s, cuDNN %s)" % (facts["torch"] or "not installed", facts["torch_cuda"],
                                                         facts["torch_cudnn"]))
    lines.append("  driver      %s, supports CUDA %s" % (facts["driver_version"] or "none",
                                                         _vstr(facts["driver_cuda"])))
    if facts["gpuaccel_built_with_cuda"]:
        lines.append("  gpuaccel    %s, CUDA %s runtime (static), kernels for sm_%s" % (
            facts["gpuaccel"], _vstr(facts["gpuaccel_cuda_runtime"]),
            ", sm_".join(map(str, facts["gpuaccel_cuda_archs"]))))
        lines.append("  cuBLASLt    %s loaded (built %s)  %s" % (facts["cublaslt_loaded"], facts["cublaslt_built"],
                                                                  facts["cublaslt_library"]))
        lines.append("  cuDNN       %s loaded (built %s)  %s" % (facts["cudnn_loaded"], facts["cudnn_built"],
                                                                 facts["cudnn_library"]))
    else:
        lines.append("  gpuaccel    %s, CPU-ONLY BUILD%s: no GPU code" % (
            facts["gpuaccel"], " (%s)" % facts["gpuaccel_build_note"] if facts.get("gpuaccel_build_note") else ""))
    lines.append("              from %s" % facts["gpuaccel_path"])
    if "jpeg" in facts:
        lines.append("  JPEG        CPU: %s; GPU: %s" % (
            "libjpeg-turbo %s" % facts["jpeg"] if facts["jpeg"] else "none (%s)" % (facts.get("jpeg_build_note")
                                                                                     or "not built"),
            "nvJPEG %s" % facts["nvjpeg"] if facts.get("nvjpeg") else "none (%s)" % (
                facts.get("nvjpeg_build_note") or "not built")))
    for gpu in facts["gpus"]:
        lines.append("  cuda:%d      %s, sm_%d%d, %.1f GiB, %d SMs" % (
            gpu["index"], gpu["name"], gpu["compute_capability"][0], gpu["compute_capability"][1],
            gpu["memory_gib"], gpu["multiprocessors"]))
    if not facts["gpus"]:
        lines.append("  GPUs        none visible")
    if facts.get("tf32"):
        lines.append("  TF32        %s" % _tf32_line(facts["tf32"]))
    lines.append("")
    marks = {ERROR: "ERROR  ", WARNING: "warning", OK: "ok     "}
    for level, what, fix in findings:
        lines.append("  %s  %s" % (marks[level], what))
        if fix:
            lines.append("           fix: %s" % fix)
    lines.append("")
    lines.append("  verdict: %s" % verdict(findings))
    return "\n".join(lines)


def verdict(findings):
    """One line that agrees with every finding: errors are problems to fix,
    warnings are named as such, and only a clean list is "nothing to fix"."""
    def count(n, word):
        return "%d %s%s" % (n, word, "s" * (n != 1))

    errors = sum(1 for level, _, _ in findings if level == ERROR)
    warnings_ = sum(1 for level, _, _ in findings if level == WARNING)
    if errors:
        return "%s to fix%s" % (count(errors, "problem"), " and %s" % count(warnings_, "warning") if warnings_ else "")
    if warnings_:
        return "usable, with %s: see the fix%s above" % (count(warnings_, "warning"), "es" * (warnings_ != 1))
    return "consistent: nothing to fix"


def main(argv=None):
    import argparse

    parser = argparse.ArgumentParser(prog="python -m gpuaccel doctor", description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print the facts and findings as JSON")
    args = parser.parse_args(argv)
    facts = collect()
    findings = diagnose(facts)
    if args.json:
        print(json.dumps({"facts": facts,
                          "findings": [{"level": level, "finding": what, "fix": fix} for level, what, fix in findings],
                          "consistent": not any(level == ERROR for level, _, _ in findings),
                          "verdict": verdict(findings)}, indent=2))
    else:
        print(report(facts, findings))
    return 1 if any(level == ERROR for level, _, _ in findings) else 0


if __name__ == "__main__":
    sys.exit(main())
