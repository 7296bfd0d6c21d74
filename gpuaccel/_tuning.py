"""The persisted cuDNN engine choices (like cudnn.benchmark, but kept across
processes): a small JSON file under $GPUACCEL_CACHE_DIR (default
~/.cache/gpuaccel), one entry per GPU model, cuDNN version and call shape.

csrc/conv.c looks a choice up when the process has none for a call's shape
(the backend's plan cache missed, and hands back its key, kernels/conv_key.h:
one key for both) and stores the one the search picked; a plan-cache hit
reads nothing here.  A corrupt or unreadable file is ignored with a warning
and rewritten.  Processes that tune at once (the ranks of a DDP job) merge
their entries: each write re-reads the file under a lock file, adds its own
entries, and replaces the file atomically.
"""

import fcntl
import json
import os
import tempfile
import threading
import warnings

_lock = threading.Lock()
_loaded = {}   # path -> {key: choice}
_mine = {}     # path -> the keys this process tuned (they win a merge)
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


def _read(file):
    """The entries in `file` ({} when there is none); raises OSError or
    ValueError for an unreadable or corrupt one."""
    if not os.path.exists(file):
        return {}
    with open(file) as f:
        data = json.load(f)
    if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
        raise ValueError("not a mapping of strings")
    return data


def _table(file):
    table = _loaded.get(file)
    if table is None:
        table = _loaded[file] = {}  # before warning: -W error must not repeat it every call
        try:
            table.update(_read(file))
        except (OSError, ValueError) as e:
            warnings.warn("gpuaccel: ignoring the conv tuning cache %s (%s); it will be rewritten"
                          % (file, e), RuntimeWarning, stacklevel=3)
    return table


def lookup(device, key):
    """The stored engine choice for this call, or None."""
    with _lock:
        return _table(path()).get(_prefix(device) + "|" + key)


def store(device, key, choice):
    """Remembers a tuned choice, merging it into the file atomically."""
    file = path()
    with _lock:
        table = _table(file)
        full_key = _prefix(device) + "|" + key
        table[full_key] = choice
        mine = _mine.setdefault(file, set())
        mine.add(full_key)
        folder = os.path.dirname(file)
        tmp = None
        try:
            os.makedirs(folder, exist_ok=True)
            with open(file + ".lock", "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)  # released when closed
                try:
                    merged = _read(file)  # what other processes stored meanwhile
                except (OSError, ValueError):
                    merged = {}  # corrupt: rewritten with what this process has
                # entries other ranks wrote since this process read the
                # file win over its stale copies; its own tunings win
                merged.update({k: table[k] for k in mine})
                table.update(merged)
                fd, tmp = tempfile.mkstemp(dir=folder, prefix=".conv_tuning.")
                with os.fdopen(fd, "w") as f:
                    json.dump(merged, f, indent=0, sort_keys=True)
                os.replace(tmp, file)
                tmp = None
        except OSError as e:
            warnings.warn("gpuaccel: could not write the conv tuning cache %s: %s" % (file, e),
                          RuntimeWarning, stacklevel=3)
        finally:
            if tmp is not None:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass


def forget():
    """Drops what was read (tests; or after the file was edited)."""
    with _lock:
        _loaded.clear()
        _mine.clear()
        _prefixes.clear()
