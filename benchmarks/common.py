"""Shared benchmark plumbing: timing, tables, the machine's description."""

import platform
import statistics
import time


def time_per_call_us(fn, iterations, repeats=7, warmup=None):
    """Median over `repeats` runs of the mean cost of fn() in microseconds."""
    for _ in range(warmup or max(iterations // 10, 10)):
        fn()
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(iterations):
            fn()
        runs.append((time.perf_counter() - start) / iterations * 1e6)
    return statistics.median(runs)


def machine():
    import numpy

    parts = ["%s, Python %s, NumPy %s" % (platform.processor() or platform.machine(), platform.python_version(),
                                         numpy.__version__)]
    try:
        import torch

        parts.append("torch %s" % torch.__version__)
        if torch.cuda.is_available():
            parts.append(torch.cuda.get_device_name())
    except ImportError:
        pass
    return ", ".join(parts)


def print_table(title, header, rows):
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    line = "  ".join("%-*s" % (w, h) for w, h in zip(widths, header))
    print("\n" + title)
    print(line)
    print("-" * len(line))
    for row in rows:
        print("  ".join("%-*s" % (w, c) for w, c in zip(widths, row)))
