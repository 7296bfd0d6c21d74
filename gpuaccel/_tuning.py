"""The persisted cuDNN engine choices (like cudnn.benchmark, but kept across
processes): a small JSON file under $GPUACCEL_CACHE_DIR (default
~/.cache/gpuaccel), one entry per GPU model, cuDNN version and call shape.

csrc/ops.c looks a choice up before each cuDNN call and stores the one a
tuning call picked.  A corrupt or unreadable file is ignored with a warning
and rewritten.
"""

import json
import os
import tempfile
import threading
import warnings

_lock = threading.Lock()
_loaded = {}   # path -> {key: choice}
_prefixes = {}  # device -> "GPU name|cudnn version"


def cache_dir():
    return os.environ.get("GPUACCEL_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "gpuaccel")


def path():
    return os.path.join(cache_dir(), "conv_tuning.json")


def _prefix(device):
    if device not in _prefixes:
        from . import _C

        name = _C.device_properties(device)["name"] if device >= 0 else "cpu"
        _prefixes[device] = "%s|cudnn%s" % (name, _C.build_info().get("cudnn_loaded"))
    return _prefixes[device]


def _table(file):
    table = _loaded.get(file)
    if table is None:
        table = {}
        if os.path.exists(file):
            try:
                with open(file) as f:
                    data = json.load(f)
                if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
                    raise ValueError("not a mapping of strings")
                table = data
            except (OSError, ValueError) as e:
                warnings.warn("gpuaccel: ignoring the conv tuning cache %s (%s); it will be rewritten"
                              % (file, e), RuntimeWarning, stacklevel=3)
        _loaded[file] = table
    return table


def lookup(device, key):
    """The stored engine choice for this call, or None."""
    with _lock:
        return _table(path()).get(_prefix(device) + "|" + key)


def store(device, key, choice):
    """Remembers a tuned choice, rewriting the file atomically."""
    file = path()
    with _lock:
        table = _table(file)
        table[_prefix(device) + "|" + key] = choice
        try:
            os.makedirs(os.path.dirname(file), exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=os.path.dirname(file), prefix=".conv_tuning.")
            with os.fdopen(fd, "w") as f:
                json.dump(table, f, indent=0, sort_keys=True)
            os.replace(tmp, file)
        except OSError as e:
            warnings.warn("gpuaccel: could not write the conv tuning cache %s: %s" % (file, e),
                          RuntimeWarning, stacklevel=3)


def forget():
    """Drops what was read (tests; or after the file was edited)."""
    with _lock:
        _loaded.clear()
        _prefixes.clear()
