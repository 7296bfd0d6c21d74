"""python -m gpuaccel bench: gpuaccel against torch, side by side in one run.

Each row times one task both ways in the same process, in rounds: one
batch of each side back to back, the order alternating from round to round,
so that a change of the machine's load falls on both sides alike.  It prints
each side's median over the rounds with its min and max, the median of the
per-round ratios (gpuaccel / torch, > 1 is better for gpuaccel) with theirs,
a note where the rounds disagree (noise), and the gpuaccel number as a
fraction of the ceiling measured in this run for that kind of work
(bandwidth rows: the fastest copy of that direction measured here; matmul
rows: the fastest matmul of that dtype measured here).  GPU work is timed
with CUDA events after warm-up; CPU work, and what the host waits for, with
perf_counter.  When the load average reached the number of CPUs, the table
says so.

On a machine without a GPU it benchmarks the CPU paths and says so.

    python -m gpuaccel bench [--full] [--rounds N] [--json] [--plot FILE.png] [--only GROUP ...]

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


def _calls_per_batch(fn, torch, device, min_batch_s, warmup):
    """Warms fn up and returns how many calls make a batch of about
    min_batch_s seconds."""
    for _ in range(warmup):
        fn()
    _sync(torch, device)
    start = time.perf_counter()
    fn()
    _sync(torch, device)
    once = max(time.perf_counter() - start, 1e-6)
    return max(1, min(1000, int(min_batch_s / once)))


def _batch_ms(fn, n, torch, device, wall):
    """Milliseconds per call over one batch of n calls: CUDA events on
    torch's current stream, or (wall=True, or the CPU) perf_counter around
    a device-wide synchronize."""
    if device == "cuda" and not wall:
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        for _ in range(n):
            fn()
        end.record()
        end.synchronize()
        return begin.elapsed_time(end) / n
    _sync(torch, device)
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    _sync(torch, device)
    return (time.perf_counter() - t0) * 1e3 / n


def time_pair_ms(fn_gpuaccel, fn_torch, torch, device, rounds=None, min_batch_s=0.05, warmup=3, wall=False):
    """Milliseconds per call of both sides, measured in `rounds` rounds
    (default ROUNDS), each one batch of each side back to back, the order
    alternating from round to round (g t, t g, g t, ...): a change of the
    machine's load between rounds falls on both sides alike.  Returns two
    lists, one number per round and side."""
    rounds = rounds or ROUNDS
    n_g = _calls_per_batch(fn_gpuaccel, torch, device, min_batch_s, warmup)
    n_t = _calls_per_batch(fn_torch, torch, device, min_batch_s, warmup)
    ms_g, ms_t = [], []
    for i in range(rounds):
        sides = ((fn_gpuaccel, n_g, ms_g), (fn_torch, n_t, ms_t))
        for fn, n, out in (sides if i % 2 == 0 else sides[::-1]):
            out.append(_batch_ms(fn, n, torch, device, wall))
    return ms_g, ms_t


def time_ms(fn, torch, device, min_batch_s=0.05, batches=5, warmup=3, wall=False):
    """Median milliseconds per call of fn() alone: warm-up calls, then
    `batches` batches of about min_batch_s seconds each."""
    n = _calls_per_batch(fn, torch, device, min_batch_s, warmup)
    return statistics.median(_batch_ms(fn, n, torch, device, wall) for _ in range(batches))


# Rounds per row; each is one batch of each side.  More rounds narrow the
# spread on a busy machine (--rounds).
ROUNDS = 7

# A row whose rounds disagree by more than this factor (the largest
# per-round ratio over the smallest) is flagged noisy.
NOISY_SPREAD = 1.5


class Row(dict):
    """One benchmark row: group, case, unit, and per side the median over
    the rounds with its min and max (higher is better for every unit here);
    ratio: the median of the per-round ratios gpuaccel / torch (each round's
    two numbers were measured back to back), with ratio_min / ratio_max;
    note: "noise" when the rounds do not agree on which side is faster,
    "noisy" when they agree but differ by more than NOISY_SPREAD; and
    ceiling_fraction.  `gpuaccel` and `torch` are lists of per-round rates
    (or single numbers)."""

    def __init__(self, group, case, unit, gpuaccel, torch, ceiling_key=None):
        g = [gpuaccel] if isinstance(gpuaccel, (int, float)) else list(gpuaccel)
        t = [torch] if isinstance(torch, (int, float)) else list(torch)
        ratios = [a / b for a, b in zip(g, t) if b and a == a and b == b]
        super().__init__(group=group, case=case, unit=unit, gpuaccel=statistics.median(g),
                         gpuaccel_min=min(g), gpuaccel_max=max(g), torch=statistics.median(t), torch_min=min(t),
                         torch_max=max(t), rounds=len(g),
                         ratio=statistics.median(ratios) if ratios else None,
                         ratio_min=min(ratios) if ratios else None, ratio_max=max(ratios) if ratios else None,
                         note=_note(ratios), ceiling_fraction=None, ceiling_key=ceiling_key)


def _note(ratios):
    if len(ratios) < 2:
        return ""
    low, high = min(ratios), max(ratios)
    if low < 1.0 < high:
        return "noise"
    if high > NOISY_SPREAD * low:
        return "noisy"
    return ""


def _rates(amount, ms_list):
    """Per-round rates: `amount` per call over milliseconds per call."""
    return [amount / ms for ms in ms_list]


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
        # into a destination allocated (and its pages touched) once: the
        # copy itself, not the page faults of fresh memory
        src_t, dst_t = torch.ones(size, dtype=torch.uint8), torch.zeros(size, dtype=torch.uint8)
        src_g, dst_g = ga.full((size,), 1, dtype="uint8"), ga.zeros((size,), dtype="uint8")

        def copy_g():
            dst_g[...] = src_g

        ms_g, ms_t = time_pair_ms(copy_g, lambda: dst_t.copy_(src_t), torch, device)
        # a copy reads and writes every byte
        return [Row("bandwidth", "host -> host copy into an array, %d MiB (read+write)" % (size >> 20), "GB/s",
                    _rates(2 * size / 1e6, ms_g), _rates(2 * size / 1e6, ms_t), "h2h")]
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
        ms_g, ms_t = time_pair_ms(lambda: host_g.to("cuda"), lambda: host_t.to("cuda", non_blocking=pinned),
                                  torch, device, wall=True)
        rows.append(Row("bandwidth", "H2D from %s host, %d MiB" % (kind, size >> 20), "GB/s",
                        _rates(size / 1e6, ms_g), _rates(size / 1e6, ms_t), "h2d"))
    ms_g, ms_t = time_pair_ms(lambda: dev_g.to("cpu"), lambda: dev_t.to("cpu"), torch, device, wall=True)
    rows.append(Row("bandwidth", "D2H into a new host array, %d MiB" % (size >> 20), "GB/s",
                    _rates(size / 1e6, ms_g), _rates(size / 1e6, ms_t), "d2h"))
    ms_g, ms_t = time_pair_ms(lambda: dev_g.to("cuda", copy=True), lambda: dev_t.clone(), torch, device, wall=True)
    # a copy reads and writes every byte
    rows.append(Row("bandwidth", "D2D copy, %d MiB (read+write)" % (size >> 20), "GB/s",
                    _rates(2 * size / 1e6, ms_g), _rates(2 * size / 1e6, ms_t), "d2d"))
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
                ms_g, ms_t = time_pair_ms(lambda: ga.matmul(a, b, out=out, stream=stream),
                                          lambda: torch.matmul(a, b, out=out), torch, device)
                flop = 2.0 * n ** 3
                rows.append(Row("matmul", "%s %d^3%s" % (label, n, CPU_KERNELS_NOTE if device == "cpu" else ""),
                                unit, _rates(flop / scale, ms_g), _rates(flop / scale, ms_t), "matmul-" + label))
    finally:
        ga.set_matmul_precision(saved[0])
        torch.backends.cuda.matmul.allow_tf32 = saved[1]
    return rows


# What runs on the CPU, said in the rows' names: ga.matmul runs gpuaccel's
# own CPU kernels (a tested reference, not a fast path), while the fused
# layers above gt.CPU_TORCH_THRESHOLD run torch's kernels, like the layers
# they replace: such a row compares torch's kernels with themselves, plus
# the layer's host time.
CPU_KERNELS_NOTE = " (gpuaccel's CPU reference kernel)"


def _torch_kernels_note(device, op, multiply_adds):
    if device != "cpu":
        return ""
    import gpuaccel.torch as gt

    if multiply_adds > gt.CPU_TORCH_THRESHOLD[op]:
        return " (both torch's kernels: above CPU_TORCH_THRESHOLD)"
    return CPU_KERNELS_NOTE


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
        unit = "TFLOP/s" if device == "cuda" else "GFLOP/s"
        scale = 1e9 if device == "cuda" else 1e6
        name = "%s %dx%d->%d fwd+bwd" % (act, tokens, fin, fout)
        name += _torch_kernels_note(device, "linear", tokens * fin * fout)
        ms_g, ms_t = time_pair_ms(linear_step(torch, fused, x), linear_step(torch, eager, x), torch, device)
        rows.append(Row("linear", name + " vs eager", unit, _rates(flop / scale, ms_g), _rates(flop / scale, ms_t)))
        if compiled:
            compiled_fn = torch.compile(eager)
            ms_g, ms_c = time_pair_ms(linear_step(torch, fused, x), linear_step(torch, compiled_fn, x), torch, device)
            rows.append(Row("linear", name + " vs torch.compile", unit, _rates(flop / scale, ms_g),
                            _rates(flop / scale, ms_c)))
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
            ms_g, ms_t = time_pair_ms(linear_step(torch, fused, x), linear_step(torch, plain, x), torch, device)
            if compiled:
                ms_gc, ms_c = time_pair_ms(linear_step(torch, fused, x), linear_step(torch, torch.compile(plain), x),
                                           torch, device)
        finally:
            torch.backends.cudnn.benchmark = saved
        unit = "TFLOP/s" if device == "cuda" else "GFLOP/s"
        scale = 1e9 if device == "cuda" else 1e6
        name = "relu %dx%dx%dx%d k%d %dx%d fwd+bwd" % (n, c, hw, hw, k, r, r)
        name += _torch_kernels_note(device, "conv2d", n * k * hw * hw * c * r * r)
        rows.append(Row("conv", name + " vs eager", unit, _rates(flop / scale, ms_g), _rates(flop / scale, ms_t)))
        if compiled:
            rows.append(Row("conv", name + " vs torch.compile", unit, _rates(flop / scale, ms_gc),
                            _rates(flop / scale, ms_c)))
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


def _endless(make_iterable):
    """Batches from epoch after epoch of an iterable a call makes."""
    iterable = make_iterable()
    while True:
        yield from iterable


def _samples_per_s(batches, count, skip, torch, device):
    """Samples per second of `count` batches taken from `batches` after
    `skip` more: those came from what the loader prefetched while the other
    side was measured, not from its steady rate."""
    for _ in range(skip):
        next(batches)
    _sync(torch, device)
    t0, done = time.perf_counter(), 0
    for _ in range(count):
        done += next(batches)[0].shape[0]
    _sync(torch, device)
    return done / (time.perf_counter() - t0)


def bench_loader(torch, device, full, folder=None, rounds=None):
    """PinnedLoader against DataLoader(num_workers, pin_memory) +
    .to(non_blocking) + normalization on the device, samples/s, for
    memmapped uint8 images to normalized NCHW batches; both loaders live
    side by side, measured in alternating rounds."""
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
        per_round = max(4, n // batch // 4)

        loader = ga.PinnedLoader([xp, yp], batch, shuffle=True, drop_last=True, device=device,
                                 transform=ga.ImageNormalize(mean, std, dtype=dtype_name))

        class Images(torch.utils.data.Dataset):
            def __init__(self):
                self.x = np.load(xp, mmap_mode="r")
                self.y = np.load(yp, mmap_mode="r")

            def __len__(self):
                return len(self.y)

            def __getitem__(self, i):
                return torch.from_numpy(np.array(self.x[i])), int(self.y[i])

        dl = torch.utils.data.DataLoader(Images(), batch_size=batch, shuffle=True, drop_last=True,
                                         num_workers=workers, pin_memory=device == "cuda", persistent_workers=True)
        m = torch.tensor(mean, device=device).view(1, 3, 1, 1) * 255
        s = torch.tensor(std, device=device).view(1, 3, 1, 1) * 255

        def torch_batches():
            for xb, yb in _endless(lambda: dl):
                xb = xb.to(device, non_blocking=True).permute(0, 3, 1, 2).float()
                yield ((xb - m) / s).to(tdtype), yb.to(device, non_blocking=True)

        ours, theirs = _endless(lambda: loader), torch_batches()
        skip = 2 * workers + 2  # beyond what either side prefetches (DataLoader: 2 batches per worker)
        rates_g, rates_t = [], []
        for i in range(rounds or ROUNDS):
            sides_ = ((ours, rates_g), (theirs, rates_t))
            for batches, out in (sides_ if i % 2 == 0 else sides_[::-1]):
                out.append(_samples_per_s(batches, per_round, skip, torch, device))
        loader.close()
        del ours, theirs  # and with them the DataLoader's workers
        rows.append(Row("loader", "%dx%dx3 uint8 -> normalized, batch %d (DataLoader: %d workers)"
                        % (side, side, batch, workers), "samples/s", rates_g, rates_t))
    return rows


def bench_logger(torch, device, full, rounds=None):
    """A training-like loop (a small matmul per step) that logs its loss
    every step: LossLogger.log against loss.item(); steps/s."""
    n = 512 if device == "cuda" else 128
    a = torch.randn(n, n, device=device)
    logger = ga.LossLogger(every=100)

    def step_logged():
        logger.log(loss=(a @ a).mean())

    def step_item():
        (a @ a).mean().item()

    ms_g, ms_t = time_pair_ms(step_logged, step_item, torch, device, rounds=rounds, wall=True)
    logger.close()
    return [Row("logger", "per-step loss logging, %dx%d matmul per step" % (n, n), "steps/s", _rates(1e3, ms_g),
                _rates(1e3, ms_t))]


BENCHES = {"bandwidth": bench_bandwidth, "matmul": bench_matmul, "linear": bench_linear, "conv": bench_conv,
           "loader": bench_loader, "logger": bench_logger}


# ----------------------------------------------------------------- output

def _fmt(v):
    if v is None or v != v:
        return "-"
    return "%.3g" % v if abs(v) < 100 else "%.0f" % v


def _spread(r, side):
    """'median (min-max)' of a side over the rounds."""
    if r["rounds"] < 2:
        return _fmt(r[side])
    return "%s (%s-%s)" % (_fmt(r[side]), _fmt(r[side + "_min"]), _fmt(r[side + "_max"]))


def _ratio(r):
    if r["ratio"] is None:
        return "-"
    if r["rounds"] < 2:
        return "%.2fx" % r["ratio"]
    return "%.2fx (%.2f-%.2f)" % (r["ratio"], r["ratio_min"], r["ratio_max"])


NOTES = (
    "Each row is measured in rounds, one batch of each side back to back, the order alternating, so a change of "
    "load between rounds falls on both sides: a side's number is its median over the rounds (min-max in "
    "brackets), gpuaccel/torch the median of the per-round ratios (> 1 is better for gpuaccel).  note: noise = the "
    "rounds disagree on which side is faster (the two are within the machine's noise); noisy = they agree, but "
    "differ by more than %.1fx.  of ceiling: the gpuaccel number as a fraction of the best number (either side) "
    "measured in this run for that kind of work (the same copy direction, the same matmul dtype); shown where a "
    "kind has more than one row." % NOISY_SPREAD,
)
CPU_NOTES = (
    "On the CPU, ga.matmul runs gpuaccel's own kernels, a tested reference rather than a fast path; the fused "
    "layers above gpuaccel.torch.CPU_TORCH_THRESHOLD run torch's kernels, as the layers they replace do, so those "
    "rows differ by the layers' host time and noise only.",
    "On the CPU, loss.item() is a plain read (there is no device to wait for), so the logger row measures only "
    "LossLogger's bookkeeping and can be below 1x; on a GPU each .item() stalls the host until the queue drains, "
    "which is what LossLogger avoids.",
)


def machine_load():
    """(1-minute load average, usable CPUs), or None where the OS has no
    load average."""
    try:
        return os.getloadavg()[0], len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


def load_note(before, after):
    """A line saying that other processes competed for the CPUs, when the
    load average (the higher of the run's start and end) reached the number
    of CPUs; None on a quiet machine."""
    if not before or not after:
        return None
    load, cpus = max(before[0], after[0]), before[1]
    if load < cpus:
        return None
    return ("The machine was busy: load average %.1f on %d CPUs (%.1f at the start, %.1f at the end).  Other "
            "processes competed for the CPUs, so the spread is wide; the ratios, measured round by round, hold "
            "better than the absolute numbers." % (load, cpus, before[0], after[0]))


def table(rows, device_desc, on_gpu=True, load=None):
    header = ("group", "case", "unit", "gpuaccel", "torch", "gpuaccel/torch", "note", "of ceiling")
    body = [(r["group"], r["case"], r["unit"], _spread(r, "gpuaccel"), _spread(r, "torch"), _ratio(r),
             r.get("note") or "",
             "-" if r["ceiling_fraction"] is None else "%.0f%%" % (100 * r["ceiling_fraction"])) for r in rows]
    widths = [max(len(str(x)) for x in col) for col in zip(header, *body)]
    lines = ["gpuaccel bench on %s" % device_desc, ""]
    lines.append("  ".join("%-*s" % (w, h) for w, h in zip(widths, header)))
    lines.append("-" * len(lines[-1]))
    lines.extend("  ".join("%-*s" % (w, c) for w, c in zip(widths, row)) for row in body)
    cpu_notes = CPU_NOTES[:1] if any(r["group"] in ("matmul", "linear", "conv") for r in rows) else ()
    if any(r["group"] == "logger" for r in rows):
        cpu_notes += CPU_NOTES[1:]
    notes = NOTES + (() if on_gpu else cpu_notes) + ((load,) if load else ())
    lines.append("")
    lines.extend(textwrap.fill(note, 110) for note in notes)
    return "\n".join(lines)


def _pyplot():
    """matplotlib's pyplot with a file backend, or None when it is not
    installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


PLOT_NEEDS = "--plot needs matplotlib: pip install matplotlib (or leave --plot out: the table has every number)"


def plot(rows, path):
    """A bar chart of the gpuaccel/torch ratios, with their spread over the
    rounds.  Returns an error message instead of raising when matplotlib is
    missing."""
    plt = _pyplot()
    if plt is None:
        return PLOT_NEEDS
    shown = [r for r in rows if r["ratio"] is not None]
    fig, ax = plt.subplots(figsize=(10, 0.45 * len(shown) + 1.5))
    ratios = [r["ratio"] for r in shown]
    spread = [[r["ratio"] - r["ratio_min"] for r in shown], [r["ratio_max"] - r["ratio"] for r in shown]]
    ax.barh(range(len(shown)), ratios, xerr=spread, color=["#bbb" if r.get("note") else "#3a7" for r in shown])
    ax.set_yticks(range(len(shown)))
    ax.set_yticklabels(["%s: %s" % (r["group"], r["case"]) for r in shown], fontsize=8)
    ax.axvline(1.0, color="k", lw=1)
    ax.set_xlabel("gpuaccel / torch (higher is better; bars: median and min-max over the rounds; grey: noise)")
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
    global ROUNDS
    parser = argparse.ArgumentParser(prog="python -m gpuaccel bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--full", action="store_true", help="more sizes (several minutes)")
    parser.add_argument("--rounds", type=int, default=ROUNDS,
                        help="rounds per row, each one batch of each side (default: %(default)s; more narrow the "
                             "spread on a busy machine)")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.add_argument("--plot", metavar="FILE.png", help="write a bar chart of the ratios (needs matplotlib)")
    parser.add_argument("--only", nargs="+", choices=GROUPS, help="run these groups only")
    parser.add_argument("--device", choices=("cuda", "cpu"), help="default: cuda when available")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1, got %d" % args.rounds)
    if args.plot and _pyplot() is None:  # before minutes of benchmarking, not after
        print(PLOT_NEEDS, file=sys.stderr)
        return 2
    try:
        import torch
    except ImportError:
        print("bench compares with torch: pip install torch", file=sys.stderr)
        return 2
    device = args.device or ("cuda" if ga.cuda_available() and torch.cuda.is_available() else "cpu")
    if check_device(torch, device) is None:
        return 2
    ROUNDS = args.rounds
    desc = device_description(torch, device)
    load_before = machine_load()
    rows = []
    for group in args.only or GROUPS:
        if not args.json:  # progress on stderr, on one line; the table's header names the device
            print("\rbenchmarking %-10s" % group, end="", file=sys.stderr, flush=True)
        rows.extend(BENCHES[group](torch, device, args.full))
    if not args.json:
        print("\r%s\r" % (" " * 24), end="", file=sys.stderr, flush=True)
    load_after = machine_load()
    _fill_ceilings(rows)
    if args.json:
        load = {"load_average": [load_before[0], load_after[0]], "cpus": load_before[1]} if load_before else {}
        print(json.dumps({"device": desc, "cuda": device == "cuda", "rounds": ROUNDS, **load, "rows": rows},
                         indent=2))
    else:
        print(table(rows, desc, on_gpu=device == "cuda", load=load_note(load_before, load_after)))
    if args.plot:
        message = plot(rows, args.plot)
        if message:
            print(message, file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
