"""Loading the CUDA libraries the extension links, before it is imported.

torch (and other packages) bring cuBLASLt and cuDNN as NVIDIA wheels under
site-packages/nvidia/.  The dynamic linker keeps one copy of a library per
soname in a process, so if gpuaccel loaded the CUDA toolkit's (older) copy
first, torch would be handed that one and could fail to load.  Preloading the
wheels' copies, when they are installed, makes both packages share them.
"""

import ctypes
import os
import sys

_WHEEL_DIRS = (
    os.path.join("nvidia", "cu13", "lib"),
    os.path.join("nvidia", "cublas", "lib"),
    os.path.join("nvidia", "cudnn", "lib"),
)


def wheel_library_paths(sonames):
    """The NVIDIA wheels' files for these sonames, where installed."""
    found = {}
    for entry in sys.path:
        if not entry or not os.path.isdir(os.path.join(entry, "nvidia")):
            continue
        for sub in _WHEEL_DIRS:
            for soname in sonames:
                path = os.path.join(entry, sub, soname)
                if soname not in found and os.path.isfile(path):
                    found[soname] = path
    return found


def preload_cuda_libraries():
    """Returns {soname: path} of what was preloaded (empty for a CPU build)."""
    try:
        from . import _build_config
    except ImportError:
        return {}
    if not _build_config.BUILT_WITH_CUDA:
        return {}
    loaded = {}
    for soname, path in wheel_library_paths(_build_config.CUDA_LIBRARY_SONAMES).items():
        try:
            ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            loaded[soname] = path
        except OSError:
            pass  # the extension's own search path still applies
    return loaded
