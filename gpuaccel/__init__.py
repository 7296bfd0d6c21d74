"""gpuaccel — keep the GPU busy in PyTorch training.

Arrays that trade memory with torch/NumPy/CuPy/JAX through DLPack, fused
mixed-precision kernels, a pinned data loader and an async loss logger.
See README.md for the tour.

This file stays small on purpose: imported from a source folder without a
built extension (the repository root), it switches the package to the
installed copy before anything else is imported (see _source.py).
"""

import os as _os

from . import _source

if not _source.has_extension(_os.path.dirname(_os.path.abspath(__file__))):
    _installed = _source.installed_copy(_os.path.dirname(_os.path.abspath(__file__)))
    if _installed is None:
        raise _source.missing_extension_error(_os.path.dirname(_os.path.abspath(__file__)))
    __path__[:] = [_installed]
    if __spec__ is not None:
        __spec__.submodule_search_locations = __path__
    __file__ = _os.path.join(_installed, "__init__.py")

from ._api import *  # noqa: F403
from ._api import __all__, __version__  # noqa: F401
