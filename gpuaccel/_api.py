"""gpuaccel's public API, imported by gpuaccel/__init__.py (see _source.py for why
the package's __init__ is kept this small)."""

from ._libs import preload_cuda_libraries as _preload_cuda_libraries

_preload_cuda_libraries()

try:
    from . import _C  # noqa: F401 - only to tell a missing extension from a broken one
except ImportError as _exc:  # pragma: no cover - depends on the install
    raise ImportError(
        "gpuaccel's extension could not be loaded: %s.  If a CUDA library is missing, install "
        "the NVIDIA wheels (pip install torch brings them) or rebuild CPU-only with "
        "GPUACCEL_NO_CUDA=1 pip install ." % _exc
    ) from _exc

from ._C import (  # noqa: E402
    MAX_NDIM,
    Array,
    CublasError,
    CudaError,
    CudnnError,
    Device,
    Event,
    FallbackError,
    FallbackWarning,
    GeluChangedWarning,
    OutOfMemoryError,
    Stream,
    asarray,
    bfloat16,
    bool_,
    build_info,
    built_with_cuda,
    conv2d,
    conv2d_backward,
    conv_stats,
    cuda_available,
    current_stream,
    default_device,
    device_count,
    device_properties,
    empty,
    empty_cache,
    float16,
    float32,
    float64,
    from_dlpack,
    full,
    get_conv_allow_tf32,
    get_deterministic,
    get_fallback_policy,
    get_matmul_precision,
    int8,
    int16,
    int32,
    int64,
    linear,
    linear_backward,
    matmul,
    matmul_stats,
    memory_stats,
    ones,
    set_conv_allow_tf32,
    set_default_device,
    set_deterministic,
    set_fallback_policy,
    set_matmul_precision,
    set_memory_limit,
    synchronize,
    uint8,
    zeros,
)
from .images import (  # noqa: E402
    JPEG_EXTENSIONS,
    CenterCrop,
    Compose,
    ImageFolder,
    RandomHorizontalFlip,
    RandomResizedCrop,
    Resize,
    decode_image,
)
from .loader import ImageNormalize, PinnedLoader  # noqa: E402
from .logger import LossLogger, NonFiniteError  # noqa: E402

__version__ = "0.1.0"

DTYPES = (bool_, uint8, int8, int16, int32, int64, float16, bfloat16, float32, float64)

__all__ = [
    "Array", "CenterCrop", "Compose", "CublasError", "CudaError", "CudnnError", "DTYPES", "Device", "Event",
    "FallbackError", "FallbackWarning", "GeluChangedWarning", "ImageFolder", "JPEG_EXTENSIONS", "MAX_NDIM",
    "RandomHorizontalFlip", "RandomResizedCrop", "Resize", "decode_image",
    "ImageNormalize", "LossLogger", "NonFiniteError", "OutOfMemoryError", "PinnedLoader", "Stream", "asarray",
    "bfloat16", "bool_", "build_info", "built_with_cuda",
    "conv2d", "conv2d_backward", "conv_stats", "cuda_available", "current_stream", "default_device", "device_count",
    "device_properties",
    "empty", "empty_cache", "float16", "float32", "float64", "from_dlpack", "full",
    "get_conv_allow_tf32", "get_deterministic", "get_fallback_policy", "get_matmul_precision", "int8", "int16",
    "int32", "int64", "linear", "linear_backward", "matmul", "matmul_stats", "memory_stats", "ones",
    "set_conv_allow_tf32", "set_default_device", "set_deterministic", "set_fallback_policy", "set_matmul_precision",
    "set_memory_limit",
    "synchronize", "uint8", "zeros",
]

NVIDIA_DRIVER_FILE = "/proc/driver/nvidia/version"


def cpu_only_notice(built_with_cuda, build_note, driver_present):
    """The one-line notice for a CPU-only build on a machine with an NVIDIA
    driver, or None.  pip hides the build's own notice at normal verbosity,
    so a build that fell back to CPU-only (no nvcc, no cuDNN) would otherwise
    go unnoticed until the GPU sits idle.  Not for builds that asked for it
    (GPUACCEL_NO_CUDA=1, GPUACCEL_SIM=1)."""
    if built_with_cuda or not driver_present or build_note.startswith(("GPUACCEL_NO_CUDA", "GPUACCEL_SIM")):
        return None
    return ("gpuaccel is a CPU-only build (%s), but this machine has an NVIDIA driver: its GPU will not be used. "
            "python -m gpuaccel doctor says how to fix it; silence this with "
            "warnings.filterwarnings('ignore', message='gpuaccel is a CPU-only build')"
            % (build_note or "CUDA was not found at build time"))


def _warn_once_if_cpu_only():
    try:
        from . import _build_config
    except ImportError:  # pragma: no cover - written by every build
        return
    import os
    import warnings

    notice = cpu_only_notice(_build_config.BUILT_WITH_CUDA, getattr(_build_config, "CUDA_BUILD_NOTE", ""),
                             os.path.exists(NVIDIA_DRIVER_FILE))
    if notice:
        warnings.warn(notice, RuntimeWarning, stacklevel=4)


_warn_once_if_cpu_only()  # a module runs once per process: once
