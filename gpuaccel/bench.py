"""python -m gpuaccel bench: gpuaccel against torch, side by side in one run.

Each row times one task both ways in the same process and prints both
numbers, their ratio (gpuaccel / torch, > 1 is better for gpuaccel) and the
gpuaccel number as a fraction of the ceiling measured in this run for that
kind of work (bandwidth rows: the fastest copy of that direction measured
here; matmul rows: the fastest matmul of that dtype measured here).  GPU
work is timed with CUDA events (median of several batches after warm-up);
CPU work with perf_counter.

On a machine without a GPU it benchmarks the CPU paths and says so.

    python -m gpuaccel bench [--full] [--json] [--plot FILE.png] [--only GROUP ...]

The benchmark scripts in benchmarks/ use these same functions with more
sizes and compare with torch.compile as well.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import textwrap
import time

import numpy as np

import gpuaccel as ga
from gpuaccel._cli import check_device

GROUPS = ("bandwidth", "matmul", "linear", "conv", "loader", "logger")


# ------------------------------------------------------------------ timing

def _sync(torch, device):
    if device == "cuda":
        torch.cuda.synchronize()


def time_ms(fn, torch, device, min_batch_s=0.05, batches=5, warmup=3, wall=False):
    """Median milliseconds per call of fn(): warm-up calls, then `batches`
    batches of n calls each (n chosen so a batch lasts about min_batch_s),
    timed by CUDA events on torch's current stream — or, with wall=True or
    on the CPU, by perf_counter around a device-wide synchronize."""
    for _ in range(warmup):
        fn()
    _sync(torch, device)
    start = time.perf_counter()
    fn()
    _sync(torch, device)
    once = max(time.perf_counter() - start, 1e-6)
    n = max(1, min(1000, int(min_batch_s / once)))
    per_call = []
    for _ in range(batches):
        if device == "cuda" and not wall:
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            for _ in range(n):
                fn()
            end.record()
            end.synchronize()
            per_call.append(begin.elapsed_time(end) / n)
        else:
            _sync(torch, device)
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            _sync(torch, device)
            per_call.append((time.perf_counter() - t0) * 1e3 / n)
    return statistics.median(per_call)


class Row(dict):
    """One benchmark row: group, case, unit, gpuaccel, torch (higher is
    better for every unit here), ratio, and ceiling_fraction."""

    def __init__(self, group, case, unit, gpuaccel, torch, ceiling_key=None):
        ratio = gpuaccel / torch if torch and gpuaccel == gpuaccel and torch == torch else None
        super().__init__(group=group, case=case, unit=unit, gpuaccel=gpuaccel, torch=torch, ratio=ratio,
                         ceiling_fraction=None, ceiling_key=ceiling_key)


def _fill_ceilings(rows):
    """ceiling_fraction: the gpuaccel number over the best number (either
    side) of rows of the same kind; only where a kind has more than one row
    (a row alone is its own ceiling, and "100%" would say nothing)."""
    best, count = {}, {}
    for r in rows:
        if r["ceiling_key"]:
            count[r["ceiling_key"]] = count.get(r["ceiling_key"], 0) + 1
    for r in rows:
        if r["ceiling_key"]:
            for v in (r["gpuaccel"], r["torch"]):
                if v == v and v is not None:
                    best[r["ceiling_key"]] = max(best.get(r["ceiling_key"], 0.0), v)
    for r in rows:
        key = r.pop("ceiling_key")
        if key and best.get(key) and count[key] > 1:
            r["ceiling_fraction"] = r["gpuaccel"] / best[key]


# ------------------------------------------------------------- the groups

def bench_bandwidth(torch, device, full):
    """Host<->device copies from pageable and pinned memory, and a
    device-to-device copy (CPU: a host-to-host copy), in GB/s."""
    size = (256 if full else 64) << 20
    rows = []
    if device == "cpu":
        # both allocate the copy on each call
        src_t = torch.empty(size, dtype=torch.uint8).fill_(1)
        src_g = ga.full((size,), 1, dtype="uint8")
        ms_g = time_ms(lambda: src_g.to("cpu", copy=True), torch, device)
        ms_t = time_ms(lambda: src_t.clone(), torch, device)
        return [Row("bandwidth", "host -> host copy, %d MiB" % (size >> 20), "GB/s", size / ms_g / 1e6,
                    size / ms_t / 1e6, "h2h")]
    # Both sides allocate their destination from their own pool on each
    # call (gpuaccel has no copy-into), and both are timed by the wall clock
    # around a device-wide synchronize, since gpuaccel queues on its own
    # current stream.
    dev_t = torch.empty(size, dtype=torch.uint8, device="cuda")
    dev_g = ga.empty((size,), dtype="uint8", device="cuda")
    for pinned in (False, True):
        host_t = torch.empty(size, dtype=torch.uint8)
        host_t = host_t.pin_memory() if pinned else host_t
        host_g = ga.empty((size,), dtype="uint8", device="cpu", pinned=pinned)
        kind = "pinned" if pinned else "pageable"
        ms_g = time_ms(lambda: host_g.to("cuda"), torch, device, wall=True)
        ms_t = time_ms(lambda: host_t.to("cuda", non_blocking=pinned), torch, device, wall=True)
        rows.append(Row("bandwidth", "H2D from %s host, %d MiB" % (kind, size >> 20), "GB/s", size / ms_g / 1e6,
                        size / ms_t / 1e6, "h2d"))
    ms_g = time_ms(lambda: dev_g.to("cpu"), torch, device, wall=True)
    ms_t = time_ms(lambda: dev_t.to("cpu"), torch, device, wall=True)
    rows.append(Row("bandwidth", "D2H into a new host array, %d MiB" % (size >> 20), "GB/s", size / ms_g / 1e6,
                    size / ms_t / 1e6, "d2h"))
    ms_g = time_ms(lambda: dev_g.to("cuda", copy=True), torch, device, wall=True)
    ms_t = time_ms(lambda: dev_t.clone(), torch, device, wall=True)
    # a copy reads and writes every byte
    rows.append(Row("bandwidth", "D2D copy, %d MiB (read+write)" % (size >> 20), "GB/s", 2 * size / ms_g / 1e6,
                    2 * size / ms_t / 1e6, "d2d"))
    return rows


def bench_matmul(torch, device, full, sizes=None):
    """Square matmuls, TFLOP/s (GFLOP/s on the CPU): ga.matmul on torch
    tensors against torch.matmul."""
    if device == "cpu":
        sizes = sizes or ((256, 512, 1024) if full else (256, 512))
        cases = [("float32", torch.float32, "highest")]
    else:
        sizes = sizes or ((1024, 2048, 4096, 8192) if full else (1024, 4096))
        cases = [("float16", torch.float16, "highest"), ("bfloat16", torch.bfloat16, "highest"),
                 ("tf32", torch.float32, "high")]
    scale, unit = (1e9, "TFLOP/s") if device == "cuda" else (1e6, "GFLOP/s")
    rows = []
    # gpuaccel's own setting, or None when it follows torch's flag (set below too)
    followed = ga._C._tf32_state("matmul")[1] != "gpuaccel"
    saved = None if followed else ga.get_matmul_precision(), torch.backends.cuda.matmul.allow_tf32
    try:
        for label, dtype, precision in cases:
            ga.set_matmul_precision(precision)
            torch.backends.cuda.matmul.allow_tf32 = precision == "high"
            for n in sizes:
                a = torch.randn(n, n, device=device, dtype=dtype)
                b = torch.randn(n, n, device=device, dtype=dtype)
                out = torch.empty(n, n, device=device, dtype=dtype)
                stream = torch.cuda.current_stream().cuda_stream if device == "cuda" else None
                ms_g = time_ms(lambda: ga.matmul(a, b, out=out, stream=stream), torch, device)
                ms_t = time_ms(lambda: torch.matmul(a, b, out=out), torch, device)
                flop = 2.0 * n ** 3
                rows.append(Row("matmul", "%s %d^3" % (label, n), unit, flop / ms_g / scale, flop / ms_t / scale,
                                "matmul-" + label))
    finally:
        ga.set_matmul_precision(saved[0])
        torch.backends.cuda.matmul.allow_tf32 = saved[1]
    return rows


def linear_step(torch, layer_fn, x):
    """One forward + backward of a layer on x (the loss: the output's sum)."""
    def step():
        y = layer_fn(x)
        y.backward(torch.ones_like(y))
    return step


def bench_linear(torch, device, full, shapes=None, compiled=False):
    """Fused linear + activation, forward and backward, against
    F.linear + activation (torch eager, and torch.compile when asked)."""
    import gpuaccel.torch as gt

    if device == "cpu":
        shapes = shapes or [(512, 256, 1024, "gelu")]
        dtype = torch.float32
    else:
        shapes = shapes or ([(4096, 4096, 16384, "gelu_tanh"), (4096, 4096, 16384, "gelu"),
                             (4096, 16384, 4096, "gelu"), (8192, 4096, 16384, "relu"), (8192, 16384, 4096, "silu")]
                            if full else [(4096, 4096, 16384, "gelu")])
        dtype = torch.bfloat16
    rows = []
    for tokens, fin, fout, act in shapes:
        x = torch.randn(tokens, fin, device=device, dtype=dtype, requires_grad=True)
        fused = gt.FusedLinear(fin, fout, activation=act, device=device, dtype=dtype)
        plain = torch.nn.Linear(fin, fout, device=device, dtype=dtype)

        def eager(t, act=act):  # the activation's own torch module, as the model had it
            return gt._torch_activation(plain(t), act)

        flop = 6.0 * tokens * fin * fout  # forward + two backward GEMMs
        ms_g = time_ms(linear_step(torch, fused, x), torch, device)
        ms_t = time_ms(linear_step(torch, eager, x), torch, device)
        name = "%s %dx%d->%d fwd+bwd" % (act, tokens, fin, fout)
        unit = "TFLOP/s" if device == "cuda" else "GFLOP/s"
        scale = 1e9 if device == "cuda" else 1e6
        rows.append(Row("linear", name + " vs eager", unit, flop / ms_g / scale, flop / ms_t / scale))
        if compiled:
            compiled_fn = torch.compile(eager)
            ms_c = time_ms(linear_step(torch, compiled_fn, x), torch, device)
            rows.append(Row("linear", name + " vs torch.compile", unit, flop / ms_g / scale, flop / ms_c / scale))
    return rows


def bench_conv(torch, device, full, shapes=None, compiled=False):
    """FusedConv2d (conv + bias + ReLU, forward and backward) against
    nn.Conv2d + ReLU; bfloat16 channels-last on a GPU, float32 on the CPU."""
    import gpuaccel.torch as gt

    if device == "cpu":
        shapes = shapes or [(8, 32, 32, 28, 3)]
        dtype, fmt = torch.float32, torch.contiguous_format
    else:
        shapes = shapes or ([(64, 64, 64, 56, 3), (64, 128, 128, 28, 3), (64, 256, 256, 14, 3), (256, 64, 64, 32, 1)]
                            if full else [(64, 64, 64, 56, 3)])
        dtype, fmt = torch.bfloat16, torch.channels_last
    rows = []
    for n, c, k, hw, r in shapes:
        x = torch.randn(n, c, hw, hw, device=device, dtype=dtype).contiguous(memory_format=fmt).requires_grad_(True)
        fused = gt.FusedConv2d(c, k, r, padding=r // 2, activation="relu", device=device, dtype=dtype)
        plain = torch.nn.Sequential(torch.nn.Conv2d(c, k, r, padding=r // 2, device=device, dtype=dtype),
                                    torch.nn.ReLU())
        fused.to(memory_format=fmt)
        plain.to(memory_format=fmt)
        flop = 3 * 2.0 * n * k * hw * hw * c * r * r
        saved = torch.backends.cudnn.benchmark
        torch.backends.cudnn.benchmark = True  # torch at its best: per-shape algorithm search
        try:
            ms_g = time_ms(linear_step(torch, fused, x), torch, device)
            ms_t = time_ms(linear_step(torch, plain, x), torch, device)
            ms_c = time_ms(linear_step(torch, torch.compile(plain), x), torch, device) if compiled else None
        finally:
            torch.backends.cudnn.benchmark = saved
        unit = "TFLOP/s" if device == "cuda" else "GFLOP/s"
        scale = 1e9 if device == "cuda" else 1e6
        name = "relu %dx%dx%dx%d k%d %dx%d fwd+bwd" % (n, c, hw, hw, k, r, r)
        rows.append(Row("conv", name + " vs eager", unit, flop / ms_g / scale, flop / ms_t / scale))
        if ms_c:
            rows.append(Row("conv", name + " vs torch.compile", unit, flop / ms_g / scale, flop / ms_c / scale))
    return rows


def _dataset(folder, n, side):
    x = os.path.join(folder, "bench_x_%d_%d.npy" % (n, side))
    y = os.path.join(folder, "bench_y_%d.npy" % n)
    if not os.path.exists(x):
        rng = np.random.default_rng(0)
        mm = np.lib.format.open_memmap(x + ".tmp.npy", mode="w+", dtype=np.uint8, shape=(n, side, side, 3))
        for start in range(0, n, 4096):
            stop = min(n, start + 4096)
            mm[start:stop] = rng.integers(0, 256, size=(stop - start, side, side, 3), dtype=np.uint8)
        mm.flush()
        del mm
        os.replace(x + ".tmp.npy", x)
        np.save(y, (np.arange(n) % 10).astype(np.int64))
    return x, y


def bench_loader(torch, device, full, folder=None):
    """PinnedLoader against DataLoader(num_workers, pin_memory) +
    .to(non_blocking) + normalization on the device, samples/s, for
    memmapped uint8 images to normalized NCHW batches."""
    folder = folder or os.path.join(tempfile.gettempdir(), "gpuaccel-bench")
    os.makedirs(folder, exist_ok=True)
    sides = (32, 224) if full else (32,)
    mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
    dtype_name = "bfloat16" if device == "cuda" else "float32"
    tdtype = torch.bfloat16 if device == "cuda" else torch.float32
    workers = max(1, min(8, len(os.sched_getaffinity(0))))
    rows = []
    for side in sides:
        n = 20000 if side == 32 else 4000
        batch = 256 if side == 32 else 64
        xp, yp = _dataset(folder, n, side)
        budget = n // batch - 4

        loader = ga.PinnedLoader([xp, yp], batch, shuffle=True, drop_last=True, device=device,
                                 transform=ga.ImageNormalize(mean, std, dtype=dtype_name))
        it = iter(loader)
        for _ in range(3):
            next(it)
        _sync(torch, device)
        t0, done = time.perf_counter(), 0
        for _ in range(budget):
            xb, yb = next(it)
            done += xb.shape[0]
        _sync(torch, device)
        rate_g = done / (time.perf_counter() - t0)
        loader.close()

        class Images(torch.utils.data.Dataset):
            def __init__(self):
                self.x = np.load(xp, mmap_mode="r")
                self.y = np.load(yp, mmap_mode="r")

            def __len__(self):
                return len(self.y)

            def __getitem__(self, i):
                return torch.from_numpy(np.array(self.x[i])), int(self.y[i])

        dl = torch.utils.data.DataLoader(Images(), batch_size=batch, shuffle=True, drop_last=True,
                                         num_workers=workers, pin_memory=device == "cuda")
        m = torch.tensor(mean, device=device).view(1, 3, 1, 1) * 255
        s = torch.tensor(std, device=device).view(1, 3, 1, 1) * 255
        it = iter(dl)
        for _ in range(3):
            next(it)
        _sync(torch, device)
        t0, done = time.perf_counter(), 0
        for _ in range(budget):
            xb, yb = next(it)
            xb = xb.to(device, non_blocking=True).permute(0, 3, 1, 2).float()
            xb = ((xb - m) / s).to(tdtype)
            yb = yb.to(device, non_blocking=True)
            done += xb.shape[0]
        _sync(torch, device)
        rate_t = done / (time.perf_counter() - t0)
        del it, dl
        rows.append(Row("loader", "%dx%dx3 uint8 -> normalized, batch %d (DataLoader: %d workers)"
                        % (side, side, batch, workers), "samples/s", rate_g, rate_t))
    return rows


def bench_logger(torch, device, full):
    """A training-like loop (a small matmul per step) that logs its loss
    every step: LossLogger.log against loss.item(); steps/s."""
    n = 512 if device == "cuda" else 128
    a = torch.randn(n, n, device=device)
    steps = 2000 if device == "cuda" else 500

    def run(log_fn):
        _sync(torch, device)
        t0 = time.perf_counter()
        for _ in range(steps):
            loss = (a @ a).mean()
            log_fn(loss)
        _sync(torch, device)
        return steps / (time.perf_counter() - t0)

    logger = ga.LossLogger(every=100)
    run(lambda loss: logger.log(loss=loss))  # warm-up
    rate_g = run(lambda loss: logger.log(loss=loss))
    logger.close()
    rate_t = run(lambda loss: loss.item())
    return [Row("logger", "per-step loss logging, %dx%d matmul per step" % (n, n), "steps/s", rate_g, rate_t)]


BENCHES = {"bandwidth": bench_bandwidth, "matmul": bench_matmul, "linear": bench_linear, "conv": bench_conv,
           "loader": bench_loader, "logger": bench_logger}


# ----------------------------------------------------------------- output

def _fmt(v):
    if v is None or v != v:
        return "-"
    return "%.3g" % v if abs(v) < 100 else "%.0f" % v


NOTES = (
    "gpuaccel/torch: > 1 is better for gpuaccel.  of ceiling: the gpuaccel number as a fraction of the best "
    "number (either side) measured in this run for that kind of work (the same copy direction, the same matmul "
    "dtype); shown where a kind has more than one row.",
)
CPU_NOTES = (
    "On the CPU, loss.item() is a plain read (there is no device to wait for), so the logger row measures only "
    "LossLogger's bookkeeping and can be below 1x; on a GPU each .item() stalls the host until the queue drains, "
    "which is what LossLogger avoids.",
)


def table(rows, device_desc, on_gpu=True):
    header = ("group", "case", "unit", "gpuaccel", "torch", "gpuaccel/torch", "of ceiling")
    body = [(r["group"], r["case"], r["unit"], _fmt(r["gpuaccel"]), _fmt(r["torch"]),
             "-" if r["ratio"] is None else "%.2fx" % r["ratio"],
             "-" if r["ceiling_fraction"] is None else "%.0f%%" % (100 * r["ceiling_fraction"])) for r in rows]
    widths = [max(len(str(x)) for x in col) for col in zip(header, *body)]
    lines = ["gpuaccel bench on %s" % device_desc, ""]
    lines.append("  ".join("%-*s" % (w, h) for w, h in zip(widths, header)))
    lines.append("-" * len(lines[-1]))
    lines.extend("  ".join("%-*s" % (w, c) for w, c in zip(widths, row)) for row in body)
    notes = NOTES + (() if on_gpu or not any(r["group"] == "logger" for r in rows) else CPU_NOTES)
    lines.append("")
    lines.extend(textwrap.fill(note, 110) for note in notes)
    return "\n".join(lines)


def plot(rows, path):
    """A bar chart of the gpuaccel/torch ratios.  Returns an error message
    instead of raising when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "--plot needs matplotlib (pip install matplotlib); the table above has every number"
    shown = [r for r in rows if r["ratio"] is not None]
    fig, ax = plt.subplots(figsize=(10, 0.45 * len(shown) + 1.5))
    ax.barh(range(len(shown)), [r["ratio"] for r in shown], color="#3a7")
    ax.set_yticks(range(len(shown)))
    ax.set_yticklabels(["%s: %s" % (r["group"], r["case"]) for r in shown], fontsize=8)
    ax.axvline(1.0, color="k", lw=1)
    ax.set_xlabel("gpuaccel / torch (higher is better)")
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return None


def device_description(torch, device):
    if device == "cuda":
        return "%s (torch %s, CUDA %s)" % (torch.cuda.get_device_name(), torch.__version__, torch.version.cuda)
    return "the CPU (%d threads; no GPU, so the CPU paths are benchmarked) with torch %s" % (
        len(os.sched_getaffinity(0)), torch.__version__)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m gpuaccel bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--full", action="store_true", help="more sizes (several minutes)")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.add_argument("--plot", metavar="FILE.png", help="write a bar chart of the ratios (needs matplotlib)")
    parser.add_argument("--only", nargs="+", choices=GROUPS, help="run these groups only")
    parser.add_argument("--device", choices=("cuda", "cpu"), help="default: cuda when available")
    args = parser.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("bench compares with torch: pip install torch", file=sys.stderr)
        return 2
    device = args.device or ("cuda" if ga.cuda_available() and torch.cuda.is_available() else "cpu")
    if check_device(torch, device) is None:
        return 2
    desc = device_description(torch, device)
    rows = []
    for group in args.only or GROUPS:
        if not args.json:  # progress on stderr, on one line; the table's header names the device
            print("\rbenchmarking %-10s" % group, end="", file=sys.stderr, flush=True)
        rows.extend(BENCHES[group](torch, device, args.full))
    if not args.json:
        print("\r%s\r" % (" " * 24), end="", file=sys.stderr, flush=True)
    _fill_ceilings(rows)
    if args.json:
        print(json.dumps({"device": desc, "cuda": device == "cuda", "rows": rows}, indent=2))
    else:
        print(table(rows, desc, on_gpu=device == "cuda"))
    if args.plot:
        message = plot(rows, args.plot)
        if message:
            print(message, file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
