"""PinnedLoader side by side with other loaders, in one run.

Two suites:

dataloader — PinnedLoader vs torch's DataLoader as the popular guides use it.
  uint8 images in a memory-mapped .npy (32x32x3 and 224x224x3) plus int64
  labels -> shuffled batches of normalized bfloat16 NCHW on the device.
  DataLoader: num_workers = cores, pin_memory=True (with CUDA),
  .to(device, non_blocking=True), normalization on the device.
  Goals ([loader]): >= 3x DataLoader samples/s (also on a CPU-only machine
  with device="cpu"), and on an H100 >= 80% of the measured pinned H2D
  bandwidth for 224x224 images.

contenders (CPU only) — PinnedLoader vs NVIDIA DALI's CPU pipeline, FFCV and an
  expert-tuned DataLoader ([loader-speed]).  One workload for all: 20,000 uint8
  64x64x3 images in a memory-mapped .npy (FFCV: the same arrays in its .beton
  format), shuffled batches of 256 -> normalized float32, drop_last, 2 threads
  or workers each, page cache warm.  Each contender runs in its own process,
  round after round (3 rounds of 3 timed epochs by default), after one
  untimed epoch whose every batch is checked against a NumPy float64
  reference (values, shape, and the memory layout it claims).  Per epoch:
  samples/s, user and system CPU seconds and minor page faults of the
  process and its children.  Two layouts: contiguous NCHW, and channels_last
  (shape NCHW, memory NHWC; PinnedLoader's layout="NHWC").
  Goals: PinnedLoader >= 1.2x DALI in NCHW float32; >= 1.0x FFCV when both
  produce channels_last; PinnedLoader's system time per epoch <= its user time.

DALI (pip install nvidia-dali-cuda130) and FFCV (pip install ffcv; it compiles
against Debian's libopencv-dev and libturbojpeg0-dev) may live in another
virtual environment than gpuaccel: give its interpreter with
--contender-python or GPUACCEL_BENCH_CONTENDER_PYTHON (it needs torch and
NumPy too).  A contender that is not installed is reported, not fatal.

    python benchmarks/bench_loader.py [--device cpu|cuda] [--quick]
    python benchmarks/bench_loader.py --suite contenders [--contender-python PY] [--rounds 3] [--epochs 3]
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

from common import machine, print_table

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
# (image side, images, batch, batches timed) (tests/test_launch_shapes.py
# checks the normalize kernel's launch shape at these sizes)
LOADER_CASES = [(32, 50000, 256, 60), (224, 2048, 64, 20)]
HERE = os.path.dirname(os.path.abspath(__file__))


def make_dataset(folder, n, side):
    path = os.path.join(folder, "images_%d_%d.npy" % (n, side))
    labels = os.path.join(folder, "labels_%d.npy" % n)
    if not (os.path.exists(path) and os.path.exists(labels)):
        os.makedirs(folder, exist_ok=True)
        rng = np.random.default_rng(0)
        # written under another name and renamed: a run cut off halfway
        # leaves no file that a later run would take for the dataset
        partial = path + ".%d.partial" % os.getpid()
        mm = np.lib.format.open_memmap(partial, mode="w+", dtype=np.uint8, shape=(n, side, side, 3))
        for start in range(0, n, 1024):
            stop = min(n, start + 1024)
            mm[start:stop] = rng.integers(0, 256, size=(stop - start, side, side, 3), dtype=np.uint8)
        mm.flush()
        del mm
        partial_labels = labels + ".%d.partial.npy" % os.getpid()
        np.save(partial_labels, np.arange(n, dtype=np.int64) % 1000)
        os.replace(partial_labels, labels)
        os.replace(partial, path)
    return path, labels


def sync(device):
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


# ================================================================ dataloader

def time_gpuaccel(path, labels, batch, device, batches):
    import gpuaccel as ga

    loader = ga.PinnedLoader([path, labels], batch, shuffle=True, device=device,
                             transform=ga.ImageNormalize(MEAN, STD, dtype="bfloat16"))
    done = 0
    it = iter(loader)
    for _ in range(3):  # warm-up
        next(it)
    sync(device)
    start = time.perf_counter()
    for xb, _ in it:
        done += xb.shape[0]
        if done >= batches * batch:
            break
    sync(device)
    elapsed = time.perf_counter() - start
    loader.close()
    return done / elapsed, loader.stats()


class MemmapImages:
    def __init__(self, path, labels):
        self.x = np.load(path, mmap_mode="r")
        self.y = np.load(labels, mmap_mode="r")

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        import torch

        return torch.from_numpy(np.array(self.x[i])), int(self.y[i])


def time_dataloader(path, labels, batch, device, batches, workers):
    import torch
    from torch.utils.data import DataLoader

    loader = DataLoader(MemmapImages(path, labels), batch_size=batch, shuffle=True, num_workers=workers,
                        pin_memory=device == "cuda", persistent_workers=False)
    mean = torch.tensor(MEAN, device=device).view(1, 3, 1, 1) * 255
    std = torch.tensor(STD, device=device).view(1, 3, 1, 1) * 255
    done = 0
    it = iter(loader)
    for _ in range(3):
        next(it)
    sync(device)
    start = time.perf_counter()
    for xb, yb in it:
        xb = xb.to(device, non_blocking=True).permute(0, 3, 1, 2).float()
        xb = ((xb - mean) / std).to(torch.bfloat16)
        yb = yb.to(device, non_blocking=True)
        done += xb.shape[0]
        if done >= batches * batch:
            break
    sync(device)
    elapsed = time.perf_counter() - start
    del it
    return done / elapsed


def pinned_h2d_gbps():
    import torch

    src = torch.empty(1 << 28, dtype=torch.uint8).pin_memory()
    dst = torch.empty_like(src, device="cuda")
    for _ in range(3):
        dst.copy_(src, non_blocking=True)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(10):
        dst.copy_(src, non_blocking=True)
    torch.cuda.synchronize()
    return 10 * src.numel() / (time.perf_counter() - start) / 1e9


def suite_dataloader(args):
    workers = len(os.sched_getaffinity(0))
    rows = []
    h2d = pinned_h2d_gbps() if args.device == "cuda" else None
    for side, n, batch, batches in LOADER_CASES:
        if args.quick:
            batches = max(5, batches // 4)
        path, labels = make_dataset(args.data, n, side)
        ours, stats = time_gpuaccel(path, labels, batch, args.device, batches)
        theirs = time_dataloader(path, labels, batch, args.device, batches, workers)
        row = ["%dx%dx3" % (side, side), str(batch), "%.0f" % ours, "%.0f" % theirs, "%.2fx" % (ours / theirs),
               "yes" if ours / theirs >= 3 else "NO"]
        if h2d:
            gbps = ours * side * side * 3 / 1e9
            row += ["%.1f" % gbps, "%.0f%%" % (100 * gbps / h2d)]
        rows.append(row)
    header = ["images", "batch", "gpuaccel samples/s", "DataLoader samples/s", "ratio", ">=3x"]
    if h2d:
        header += ["GB/s (uint8)", "of pinned H2D %.1f GB/s" % h2d]
    import gpuaccel as ga  # noqa: F401  (machine() reports torch; this says which gpuaccel ran)

    print_table("PinnedLoader vs DataLoader(num_workers=%d), device=%s  [%s]" % (workers, args.device, machine()),
                header, rows)


# ================================================================ contenders
#
# Every contender is a function (images path, labels path, workload) -> a
# zero-argument callable that runs one epoch and returns its batches as
# (images tensor, sample indices) pairs, lazily.  The labels array holds each
# sample's own index, so any loader's shuffled batch can be checked against
# the reference rows.

N_IMAGES, SIDE, BATCH, THREADS = 20000, 64, 256, 2


def contender_gpuaccel(layout):
    def make(images, labels, work):
        import gpuaccel as ga

        loader = ga.PinnedLoader([np.load(images, mmap_mode="r"), np.load(labels, mmap_mode="r")], work["batch"],
                                 shuffle=True, drop_last=True, num_threads=work["threads"], device="cpu",
                                 transform=ga.ImageNormalize(MEAN, STD, dtype="float32", layout=layout))
        return lambda: iter(loader)
    return make


def contender_dali(layout):
    def make(images, labels, work):
        from nvidia.dali import fn, pipeline_def, types
        from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

        x = np.load(images, mmap_mode="r")
        n, batch = len(x), work["batch"]

        class ShuffledBatches:
            """external_source: per epoch a new permutation; each batch the
            memmap's rows gathered by NumPy into one array (a list of 256
            row views costs DALI half as much CPU again)."""

            def __init__(self):
                self.epoch = 0

            def __iter__(self):
                self.order = np.random.default_rng([0, self.epoch]).permutation(n)
                self.epoch += 1
                self.at = 0
                return self

            def __next__(self):
                if self.at + batch > n:  # drop_last
                    raise StopIteration
                idx = self.order[self.at:self.at + batch]
                self.at += batch
                return x[idx], idx.astype(np.int64).reshape(-1, 1)

        @pipeline_def(batch_size=batch, num_threads=work["threads"], device_id=None, prefetch_queue_depth=2)
        def pipe():
            imgs, idx = fn.external_source(source=ShuffledBatches(), num_outputs=2, batch=True, cycle="raise",
                                           dtype=[types.UINT8, types.INT64], layout=["HWC", ""])
            imgs = fn.crop_mirror_normalize(imgs, dtype=types.FLOAT, output_layout="CHW" if layout == "NCHW" else "HWC",
                                            mean=[m * 255 for m in MEAN], std=[s * 255 for s in STD])
            return imgs, idx

        p = pipe()
        p.build()
        it = DALIGenericIterator(p, ["images", "index"], last_batch_policy=LastBatchPolicy.DROP)

        def epoch():
            for out in it:
                images_t, index_t = out[0]["images"], out[0]["index"]
                if layout == "NHWC":
                    images_t = images_t.permute(0, 3, 1, 2)  # channels_last view, no copy
                yield images_t, index_t.view(-1)
            it.reset()  # the source ended the epoch: start the next one
        return epoch
    return make


def _ffcv_file(images, labels, folder):
    """The dataset in FFCV's format (written once, next to the .npy)."""
    path = os.path.join(folder, "images_%d_%d.beton" % (N_IMAGES, SIDE))
    if os.path.exists(path):
        return path
    from ffcv.fields import IntField, NDArrayField
    from ffcv.writer import DatasetWriter

    x = np.load(images, mmap_mode="r")

    class Rows:
        def __len__(self):
            return len(x)

        def __getitem__(self, i):
            return np.ascontiguousarray(x[i]), int(i)

    partial = path + ".%d.partial" % os.getpid()
    writer = DatasetWriter(partial, {"image": NDArrayField(np.dtype(np.uint8), x.shape[1:]), "index": IntField()},
                           num_workers=THREADS)
    writer.from_indexed_dataset(Rows())
    os.replace(partial, path)
    return path


def contender_ffcv(layout):
    def make(images, labels, work):
        from ffcv.fields.decoders import IntDecoder, NDArrayDecoder
        from ffcv.loader import Loader, OrderOption
        from ffcv.transforms import NormalizeImage, ToTensor, ToTorchImage

        path = _ffcv_file(images, labels, os.path.dirname(images))
        mean, std = np.array(MEAN) * 255, np.array(STD) * 255
        loader = Loader(path, batch_size=work["batch"], num_workers=work["threads"], order=OrderOption.RANDOM,
                        drop_last=True, os_cache=True, seed=0,
                        pipelines={"image": [NDArrayDecoder(), NormalizeImage(mean, std, np.float32), ToTensor(),
                                             ToTorchImage(channels_last=layout == "NHWC")],
                                   "index": [IntDecoder(), ToTensor()]})

        def epoch():
            for images_t, index_t in loader:
                yield images_t, index_t.view(-1)
        return epoch
    return make


class _BatchImages:
    """torch Dataset fetched a batch at a time (the sampler hands out whole
    index lists): one fancy index into the memmap, normalized in the worker."""

    def __init__(self, images):
        self.images = images
        self.x = None

    def __len__(self):
        return N_IMAGES

    def __getitem__(self, idx):
        import torch

        if self.x is None:  # opened in the worker, after the fork
            self.x = np.load(self.images, mmap_mode="r")
            self.mean = torch.tensor(MEAN).view(1, 3, 1, 1) * 255
            self.std = torch.tensor(STD).view(1, 3, 1, 1) * 255
        idx = np.asarray(idx)
        xb = torch.from_numpy(self.x[idx]).permute(0, 3, 1, 2)
        # written straight into shared memory: sending it to the main
        # process then passes a handle instead of copying the batch
        out = torch.empty(xb.shape, dtype=torch.float32).share_memory_()
        torch.sub(xb, self.mean, out=out)
        out.div_(self.std)
        return out, torch.from_numpy(idx)


def contender_dataloader(images, labels, work):
    import torch
    from torch.utils.data import BatchSampler, DataLoader, RandomSampler

    generator = torch.Generator().manual_seed(0)
    sampler = BatchSampler(RandomSampler(range(N_IMAGES), generator=generator), work["batch"], drop_last=True)
    loader = DataLoader(_BatchImages(images), sampler=sampler, batch_size=None, num_workers=work["threads"],
                        persistent_workers=True, prefetch_factor=2)  # torch runs each worker on 1 thread
    return lambda: iter(loader)


CONTENDERS = {
    # name: (constructor, layout, needs the contender interpreter)
    "gpuaccel": (contender_gpuaccel("NCHW"), "NCHW", False),
    "gpuaccel-cl": (contender_gpuaccel("NHWC"), "channels_last", False),
    "dali": (contender_dali("NCHW"), "NCHW", True),
    "dali-cl": (contender_dali("NHWC"), "channels_last", True),
    "ffcv": (contender_ffcv("NCHW"), "NCHW", True),
    "ffcv-cl": (contender_ffcv("NHWC"), "channels_last", True),
    "dataloader": (contender_dataloader, "NCHW", False),
}
TITLES = {
    "gpuaccel": "gpuaccel.PinnedLoader", "gpuaccel-cl": "gpuaccel.PinnedLoader, layout=\"NHWC\"",
    "dali": "NVIDIA DALI CPU pipeline", "dali-cl": "NVIDIA DALI CPU pipeline, HWC output",
    "ffcv": "FFCV", "ffcv-cl": "FFCV, ToTorchImage(channels_last=True)",
    "dataloader": "torch DataLoader, expert-tuned",
}


def _proc_stat(pid):
    """(user s, system s, minor faults, major faults) of one process."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick, int(fields[7]), int(fields[9])


def _children(pid):
    try:
        with open("/proc/%d/task/%d/children" % (pid, pid)) as f:
            kids = [int(k) for k in f.read().split()]
    except OSError:
        return []
    return kids + [g for k in kids for g in _children(k)]


def process_usage():
    """CPU seconds and page faults of this process (all its threads) and of
    its live child processes (DataLoader workers)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    user, system, minor, major = r.ru_utime, r.ru_stime, r.ru_minflt, r.ru_majflt
    for kid in _children(os.getpid()):
        try:
            u, s, mi, ma = _proc_stat(kid)
        except OSError:
            continue
        user, system, minor, major = user + u, system + s, minor + mi, major + ma
    return {"user": user, "sys": system, "minor_faults": minor, "major_faults": major}


def check_epoch(batches, reference_images, layout, work):
    """Every batch of an epoch against the float64 reference: values, shape
    and memory layout; every sample at most once."""
    import torch

    seen = []
    worst = 0.0
    for images_t, index_t in batches:
        idx = index_t.numpy().astype(np.int64)
        assert images_t.dtype == torch.float32, images_t.dtype
        n, side = work["batch"], SIDE
        assert tuple(images_t.shape) == (n, 3, side, side), tuple(images_t.shape)
        fmt = torch.channels_last if layout == "channels_last" else torch.contiguous_format
        assert images_t.is_contiguous(memory_format=fmt), (layout, images_t.stride())
        ref = (reference_images[idx].astype(np.float64) / 255.0 - np.array(MEAN)) / np.array(STD)
        got = images_t.numpy().transpose(0, 2, 3, 1)
        err = np.abs(got - ref)
        bad = err > 1e-5 + 1e-5 * np.abs(ref)
        assert not bad.any(), "max error %g" % err.max()
        worst = max(worst, float(err.max()))
        seen.append(idx)
    seen = np.concatenate(seen)
    assert len(seen) == (N_IMAGES // work["batch"]) * work["batch"], len(seen)
    assert len(np.unique(seen)) == len(seen), "a sample came twice in one epoch"
    return worst


def run_worker(name, images, labels, work):
    """One contender, in this process: a checked warm-up epoch, then the
    timed ones.  Prints one JSON line."""
    make, layout, _ = CONTENDERS[name]
    try:
        epoch = make(images, labels, work)
    except ImportError as e:
        print(json.dumps({"name": name, "missing": str(e)}))
        return
    worst = check_epoch(epoch(), np.load(images, mmap_mode="r"), layout, work)
    epochs = []
    for _ in range(work["epochs"]):
        before = process_usage()
        start = time.perf_counter()
        samples = 0
        for images_t, _ in epoch():
            samples += images_t.shape[0]  # a training step would run here; the batch is dropped
        elapsed = time.perf_counter() - start
        after = process_usage()
        epochs.append(dict({k: after[k] - before[k] for k in after}, seconds=elapsed, samples=samples,
                           samples_per_second=samples / elapsed))
    print(json.dumps({"name": name, "epochs": epochs, "max_error": worst}))


def _run_contender(name, python, images, labels, work, timeout):
    cmd = [python, os.path.abspath(__file__), "--worker", name, "--images", images, "--labels", labels,
           "--epochs", str(work["epochs"]), "--batch", str(work["batch"]), "--threads", str(work["threads"])]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=HERE)
    except subprocess.TimeoutExpired:
        return {"name": name, "failed": "timed out after %d s" % timeout}
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["exit %d" % done.returncode])[-1]
        return {"name": name, "failed": tail[:200]}
    return json.loads(lines[-1])


def _median(values):
    return statistics.median(values) if values else float("nan")


def suite_contenders(args):
    python = args.contender_python or os.environ.get("GPUACCEL_BENCH_CONTENDER_PYTHON") or sys.executable
    names = args.contenders.split(",") if args.contenders else list(CONTENDERS)
    unknown = [n for n in names if n not in CONTENDERS]
    if unknown:
        raise SystemExit("unknown contenders %s; choose from %s" % (unknown, ", ".join(CONTENDERS)))
    work = {"epochs": args.epochs, "batch": BATCH, "threads": THREADS}
    images, _ = make_dataset(args.data, N_IMAGES, SIDE)
    labels = os.path.join(args.data, "index_%d.npy" % N_IMAGES)
    if not os.path.exists(labels):
        np.save(labels, np.arange(N_IMAGES, dtype=np.int64))
    with open(images, "rb") as f:  # page cache warm for everyone
        while f.read(1 << 24):
            pass
    load_before = os.getloadavg()
    results = {n: [] for n in names}
    for r in range(args.rounds):
        for name in names:
            exe = python if CONTENDERS[name][2] else sys.executable
            out = _run_contender(name, exe, images, labels, work, timeout=args.timeout)
            results[name].append(out)
            status = out.get("missing") or out.get("failed") or "%.0f samples/s" % _median(
                [e["samples_per_second"] for e in out["epochs"]])
            print("round %d  %-12s %s" % (r + 1, name, status), file=sys.stderr, flush=True)
    load_after = os.getloadavg()
    report_contenders(results, names, work, args, load_before, load_after, python)


def report_contenders(results, names, work, args, load_before, load_after, python):
    def round_medians(name):
        return [_median([e["samples_per_second"] for e in out["epochs"]]) if "epochs" in out else None
                for out in results[name]]

    def per_epoch(name, key):
        return _median([e[key] for out in results[name] if "epochs" in out for e in out["epochs"]])

    baseline = {"NCHW": "gpuaccel", "channels_last": "gpuaccel-cl"}
    rows = []
    for name in names:
        outs = results[name]
        broken = [o for o in outs if "epochs" not in o]
        if len(broken) == len(outs):
            why = broken[0].get("missing") or broken[0].get("failed")
            rows.append([TITLES[name], CONTENDERS[name][1], "not run: %s" % why] + [""] * 6)
            continue
        rates = round_medians(name)
        base = baseline[CONTENDERS[name][1]]
        ratios = [a / b for a, b in zip(rates, round_medians(base)) if a and b] if base in results else []
        ratio = ("%.2f-%.2fx" % (min(ratios), max(ratios)) if len(ratios) > 1 else
                 "%.2fx" % ratios[0] if ratios else "")
        rows.append([TITLES[name], CONTENDERS[name][1], " / ".join("%.1fk" % (r / 1e3) if r else "-" for r in rates),
                     ratio, "%.3f" % per_epoch(name, "user"), "%.3f" % per_epoch(name, "sys"),
                     "%.0f" % per_epoch(name, "minor_faults"),
                     "%.1e" % max(o["max_error"] for o in outs if "epochs" in o),
                     "%d failed" % len(broken) if broken else "ok"])
    print_table("Loaders on the CPU: %d uint8 %dx%dx3 images (memory-mapped .npy) -> shuffled batches of %d, "
                "normalized float32, drop_last, %d threads/workers; %d rounds x %d epochs, one process per "
                "contender and round  [%s; load average %.2f before, %.2f after]"
                % (N_IMAGES, SIDE, SIDE, work["batch"], work["threads"], args.rounds, work["epochs"], machine(),
                   load_before[0], load_after[0]),
                ["contender", "layout", "samples/s (round medians)", "ratio to PinnedLoader, same layout",
                 "user s/epoch", "sys s/epoch", "minor faults/epoch", "max |error|", "checked"], rows)
    if python != sys.executable:
        print("DALI and FFCV ran with %s" % python)

    def goal(ours, theirs, target):
        a, b = round_medians(ours) if ours in results else [], round_medians(theirs) if theirs in results else []
        pairs = [x / y for x, y in zip(a, b) if x and y]
        if not pairs:
            return "not measured"
        worst, median = min(pairs), _median(pairs)
        return "%.2fx (median of rounds), %.2fx (worst round): %s" % (
            median, worst, "met" if median >= target else "NOT met")

    print("goal: PinnedLoader >= 1.2x DALI, NCHW float32: %s" % goal("gpuaccel", "dali", 1.2))
    print("goal: PinnedLoader >= 1.0x FFCV, both channels_last: %s" % goal("gpuaccel-cl", "ffcv-cl", 1.0))
    for name in ("gpuaccel", "gpuaccel-cl"):
        if name in results and any("epochs" in o for o in results[name]):
            user, system = per_epoch(name, "user"), per_epoch(name, "sys")
            print("goal: %s system time per epoch <= user time: %.3f s <= %.3f s: %s"
                  % (TITLES[name], system, user, "met" if system <= user else "NOT met"))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default=None, help="dataloader suite: cpu or cuda (default: cuda if usable)")
    parser.add_argument("--suite", choices=["dataloader", "contenders", "all"], default=None,
                        help="default: all on the CPU, dataloader with CUDA (the contenders suite is CPU-only)")
    parser.add_argument("--quick", action="store_true", help="fewer batches, rounds and epochs")
    parser.add_argument("--data", default=os.environ.get("GPUACCEL_CACHE_DIR", tempfile.gettempdir()))
    parser.add_argument("--contender-python", default=None,
                        help="interpreter for DALI and FFCV (default: $GPUACCEL_BENCH_CONTENDER_PYTHON, else this one)")
    parser.add_argument("--contenders", default=None, help="comma-separated subset of: " + ", ".join(CONTENDERS))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--timeout", type=int, default=600, help="seconds per contender process")
    # one contender in this process (what the suite runs as a subprocess)
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--images", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--labels", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, default=BATCH, help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=THREADS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        run_worker(args.worker, args.images, args.labels,
                   {"epochs": args.epochs, "batch": args.batch, "threads": args.threads})
        return
    if args.device is None:
        import gpuaccel as ga

        args.device = "cuda" if ga.cuda_available() else "cpu"
    suite = args.suite or ("all" if args.device == "cpu" else "dataloader")
    if args.quick:
        args.rounds, args.epochs = min(args.rounds, 1), min(args.epochs, 2)
    if suite in ("dataloader", "all"):
        suite_dataloader(args)
    if suite in ("contenders", "all"):
        suite_contenders(args)


if __name__ == "__main__":
    main()
