"""Running from the repository root: use the installed copy.

`pip install .` and `python -m gpuaccel demo` both run from the repository
root, and there Python finds the source folder gpuaccel/ first (the current
directory leads sys.path for `python -m`, `python -c` and the REPL).  The
source folder has no compiled extension unless it was built in place
(`pip install -e .` or `setup.py build_ext --inplace`).  So when the folder
this package was imported from has no `_C` extension, gpuaccel/__init__.py
points the package's `__path__` at the installed copy's folder: every
submodule (`_C`, the API, `gpuaccel.torch`, `gpuaccel.__main__`) then comes
from that one installed copy, and only the few lines of __init__.py run from
the source folder.  An in-place build always wins: its folder has `_C`.
"""

import importlib.machinery
import os
import sys


def has_extension(folder):
    """Whether `folder` holds gpuaccel's compiled extension (_C plus one of
    this interpreter's extension suffixes, e.g. _C.cpython-311-x86_64-linux-gnu.so)."""
    try:
        names = set(os.listdir(folder))
    except OSError:
        return False
    return any("_C" + suffix in names for suffix in importlib.machinery.EXTENSION_SUFFIXES)


def installed_copy(source_folder):
    """The folder of another `gpuaccel` package on sys.path that has the
    extension, or None.  `source_folder` is skipped."""
    source = os.path.realpath(source_folder)
    for entry in sys.path:
        folder = os.path.join(entry or os.getcwd(), "gpuaccel")
        if os.path.realpath(folder) == source:
            continue
        if os.path.isfile(os.path.join(folder, "__init__.py")) and has_extension(folder):
            return folder
    return None


def missing_extension_error(source_folder):
    return ImportError(
        "gpuaccel's compiled extension is missing from %s (the source folder, not built in place) "
        "and no installed gpuaccel was found on sys.path.  Install it with `pip install .` "
        "(then `import gpuaccel` works from any folder, this one included), or build it in place "
        "with `pip install -e .`." % source_folder
    )
