"""What the command-line tools (demo, bench, doctor, examples/) share: the
up-front device check and the "did you mean" of a mistyped word."""

import difflib
import sys


def cuda_unusable(torch):
    """Why a CUDA device can't be used by both gpuaccel and torch here, or
    None when it can."""
    import gpuaccel as ga

    if not ga.built_with_cuda():
        return "this gpuaccel was built without CUDA (python -m gpuaccel doctor says why)"
    if not ga.cuda_available():
        return "gpuaccel finds no usable CUDA driver or GPU"
    if not torch.cuda.is_available():
        return "torch finds no usable CUDA device (torch %s, built for CUDA %s)" % (torch.__version__,
                                                                                    torch.version.cuda)
    return None


def check_device(torch, spec, option="--device"):
    """Parses `spec` ("cpu", "cuda", "cuda:N") into a torch.device; on a bad
    or unusable device prints one line to stderr and returns None, so that a
    tool can exit with status 2 before doing any work."""
    try:
        device = torch.device(spec)
    except (RuntimeError, ValueError, TypeError):
        print("%s %s: not a device; expected cpu, cuda or cuda:N" % (option, spec), file=sys.stderr)
        return None
    if device.type not in ("cpu", "cuda"):
        print("%s %s: gpuaccel runs on cpu or cuda[:N], not %s" % (option, spec, device.type), file=sys.stderr)
        return None
    if device.type == "cuda":
        why = cuda_unusable(torch)
        if why is None and device.index is not None and device.index >= torch.cuda.device_count():
            why = "there are only %d CUDA devices" % torch.cuda.device_count()
        if why is not None:
            print("%s %s: %s; run python -m gpuaccel doctor, or use %s cpu" % (option, spec, why, option),
                  file=sys.stderr)
            return None
    return device


def nearest(word, choices):
    """The choice closest to a mistyped `word`, or None."""
    found = difflib.get_close_matches(word, choices, n=1, cutoff=0.5)
    return found[0] if found else None
