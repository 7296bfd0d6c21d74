"""python -m gpuaccel: what gpuaccel found on this machine."""

import platform
import sys


def describe():
    import gpuaccel

    info = gpuaccel.build_info()
    lines = [
        "gpuaccel %s on Python %s (%s)" % (gpuaccel.__version__, platform.python_version(), platform.platform()),
        "  built with CUDA:   %s" % ("yes, for sm_" + ", sm_".join(map(str, info["cuda_archs"])) if info["built_with_cuda"] else "no (CPU-only build)"),
    ]
    if info["built_with_cuda"]:
        lines.append("  CUDA runtime:      %s (static)" % _version(info["cuda_runtime_built"]))
        lines.append("  driver supports:   %s" % (_version(info["driver_cuda_version"]) if info["driver_cuda_version"] else "no NVIDIA driver found"))
        lines.append("  cuBLASLt loaded:   %s  %s" % (info["cublaslt_loaded"], info["cublaslt_library"]))
        lines.append("  cuDNN loaded:      %s  %s" % (info["cudnn_loaded"], info["cudnn_library"]))
    lines.append("  CUDA available:    %s" % gpuaccel.cuda_available())
    for index in range(gpuaccel.device_count()):
        p = gpuaccel.device_properties(index)
        lines.append(
            "  cuda:%d  %s  sm_%d%d  %.1f GiB  %d SMs"
            % (index, p["name"], *p["compute_capability"], p["total_memory"] / 2**30, p["multiprocessors"])
        )
    lines.append("  CPU threads:       %d" % info["cpu_threads"])
    return "\n".join(lines)


def _version(v):
    return "%d.%d" % (v // 1000, (v % 1000) // 10) if v else "none"


def main(argv=None):
    print(describe())
    return 0


if __name__ == "__main__":
    sys.exit(main())
