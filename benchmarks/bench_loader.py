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

jpeg — a folder of 2,000 photo-like JPEGs (300-500 px sides, quality 90,
  4:2:0, written with Pillow) -> RandomResizedCrop(224) + flip + normalize to
  float32 NCHW, batches of 128, 2 threads or workers each; and the evaluation
  pipeline Resize(256) + CenterCrop(224).  Contenders: PinnedLoader, DALI's
  CPU pipeline, torchvision's ImageFolder + PIL + transforms and
  decode_jpeg + transforms.v2 DataLoaders, and the ceiling (the crop regions
  decoded, nothing else).  Every batch of the first epoch is checked (shape,
  dtype, range, channel means); the evaluation pipelines' pixels against
  torchvision v2 (PSNR).  Goals: train >= 1.5x DALI and >= 1.8x torchvision's
  best; evaluation >= 1.5x DALI; system time <= 10% of user time.

DALI (pip install nvidia-dali-cuda130) and FFCV (pip install ffcv; it compiles
against Debian's libopencv-dev and libturbojpeg0-dev) may live in another
virtual environment than gpuaccel: give its interpreter with
--contender-python or GPUACCEL_BENCH_CONTENDER_PYTHON (it needs torch and
NumPy too).  A contender that is not installed is reported, not fatal.

    python benchmarks/bench_loader.py [--device cpu|cuda] [--quick]
    python benchmarks/bench_loader.py --suite contenders [--contender-python PY] [--rounds 3] [--epochs 3]
    python benchmarks/bench_loader.py --suite jpeg [--contenders gpuaccel,dali,...] [--rounds 3] [--epochs 2]
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
    for side, n, batch, batches in [(32, 50000, 256, 60), (224, 2048, 64, 20)]:
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


# ================================================================ jpeg
#
# A folder of JPEGs, decoded and augmented per epoch.  Each contender is a
# function (root, work) -> a zero-argument callable running one epoch,
# yielding (images tensor, labels tensor) batches; it runs in its own
# process, round after round, after one untimed epoch whose batches are
# checked.

JPEG_IMAGES, JPEG_BATCH = 2000, 128


def _texture(rng, h, w, cell):
    from PIL import Image

    small = rng.normal(0, 1, (h // cell + 2, w // cell + 2, 3)).astype(np.float32)
    im = Image.fromarray((small * 40 + 128).clip(0, 255).astype(np.uint8)).resize((w, h), Image.BICUBIC)
    return np.asarray(im, np.float32) - 128


def make_jpeg_folder(folder, n=JPEG_IMAGES, classes=10):
    """n photo-like JPEGs (textures at three scales and sensor noise), sides
    of 300-500 px, quality 90, 4:2:0, about 117 KB each, written with Pillow
    in torchvision's ImageFolder layout (once; reused by later runs)."""
    from PIL import Image

    root = os.path.join(folder, "jpeg_folder_%d" % n)
    if os.path.isdir(root):
        return root
    partial = root + ".%d.partial" % os.getpid()
    rng = np.random.default_rng(0)
    for c in range(classes):
        os.makedirs(os.path.join(partial, "class_%02d" % c))
    for i in range(n):
        h, w = int(rng.integers(300, 501)), int(rng.integers(300, 501))
        img = (128 + _texture(rng, h, w, 64) * 1.5 + _texture(rng, h, w, 12) * 0.8 + _texture(rng, h, w, 3) * 1.6
               + rng.normal(0, 12, (h, w, 3)))
        Image.fromarray(img.clip(0, 255).astype(np.uint8)).save(
            os.path.join(partial, "class_%02d" % (i % classes), "%05d.jpg" % i), quality=90, subsampling=2)
    os.replace(partial, root)
    return root


def _torch_normalize():
    import torch

    return torch.tensor(MEAN).view(3, 1, 1), torch.tensor(STD).view(3, 1, 1)


def jpeg_gpuaccel(mode, ceiling=False):
    def make(root, work):
        import gpuaccel as ga

        norm = ga.ImageNormalize(MEAN, STD, dtype="float32")
        if ceiling:  # the crop region decoded, resized to 1x1 without DCT scaling: the decode alone
            t = ga.Compose([ga.RandomResizedCrop(1), norm])
        elif mode == "train":
            t = ga.Compose([ga.RandomResizedCrop(224), ga.RandomHorizontalFlip(), norm])
        else:
            t = ga.Compose([ga.Resize(256), ga.CenterCrop(224), norm])
        loader = ga.PinnedLoader(ga.ImageFolder(root), work["batch"], shuffle=True, drop_last=True,
                                 num_threads=work["threads"], device="cpu", transform=t)
        if ceiling:
            spec = loader._pipeline.spec
            loader._pipeline.spec = spec[:12] + (False,)
        return lambda: iter(loader)
    return make


def jpeg_torchvision_pil(mode):
    def make(root, work):
        import torch
        import torchvision.transforms as T
        from torchvision.datasets import ImageFolder

        geometry = ([T.RandomResizedCrop(224), T.RandomHorizontalFlip()] if mode == "train"
                    else [T.Resize(256), T.CenterCrop(224)])
        ds = ImageFolder(root, transform=T.Compose(geometry + [T.ToTensor(), T.Normalize(MEAN, STD)]))
        loader = torch.utils.data.DataLoader(ds, batch_size=work["batch"], shuffle=True, drop_last=True,
                                             num_workers=work["threads"], persistent_workers=True)
        return lambda: iter(loader)
    return make


class _DecodeJpegFolder:
    def __init__(self, root, transform):
        from torchvision.datasets import ImageFolder

        self.samples = ImageFolder(root).samples
        self.transform = transform

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        from torchvision.io import ImageReadMode, decode_jpeg, read_file

        path, label = self.samples[i]
        return self.transform(decode_jpeg(read_file(path), mode=ImageReadMode.RGB)), label


def jpeg_torchvision_v2(mode):
    def make(root, work):
        import torch
        import torchvision.transforms.v2 as T

        geometry = ([T.RandomResizedCrop(224, antialias=True), T.RandomHorizontalFlip()] if mode == "train"
                    else [T.Resize(256, antialias=True), T.CenterCrop(224)])
        t = T.Compose(geometry + [T.ToDtype(torch.float32, scale=True), T.Normalize(MEAN, STD)])
        loader = torch.utils.data.DataLoader(_DecodeJpegFolder(root, t), batch_size=work["batch"], shuffle=True,
                                             drop_last=True, num_workers=work["threads"], persistent_workers=True)
        return lambda: iter(loader)
    return make


def jpeg_dali(mode):
    def make(root, work):
        from nvidia.dali import fn, pipeline_def, types
        from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

        @pipeline_def(batch_size=work["batch"], num_threads=work["threads"], device_id=None, prefetch_queue_depth=2)
        def pipe():
            jpegs, labels = fn.readers.file(file_root=root, random_shuffle=True, name="reader")
            if mode == "train":
                images = fn.decoders.image_random_crop(jpegs, device="cpu", output_type=types.RGB,
                                                       random_area=[0.08, 1.0], random_aspect_ratio=[3 / 4, 4 / 3])
                images = fn.resize(images, resize_x=224, resize_y=224, antialias=True)
                mirror = fn.random.coin_flip(probability=0.5)
                crop = None
            else:
                images = fn.decoders.image(jpegs, device="cpu", output_type=types.RGB)
                images = fn.resize(images, resize_shorter=256, antialias=True)
                mirror, crop = 0, (224, 224)
            images = fn.crop_mirror_normalize(images, dtype=types.FLOAT, output_layout="CHW", crop=crop,
                                              mean=[m * 255 for m in MEAN], std=[s * 255 for s in STD],
                                              mirror=mirror)
            return images, labels

        p = pipe()
        p.build()
        it = DALIGenericIterator(p, ["images", "labels"], reader_name="reader",
                                 last_batch_policy=LastBatchPolicy.DROP, auto_reset=True)

        def epoch():
            for out in it:
                yield out[0]["images"], out[0]["labels"].view(-1)
        return epoch
    return make


JPEG_CONTENDERS = {
    # name: (constructor, pipeline, title)
    "gpuaccel": (jpeg_gpuaccel("train"), "train", "gpuaccel.PinnedLoader (libjpeg-turbo crop decode, native threads)"),
    "dali": (jpeg_dali("train"), "train", "NVIDIA DALI CPU (readers.file, decoders.image_random_crop, resize, "
                                          "crop_mirror_normalize)"),
    "tv-pil": (jpeg_torchvision_pil("train"), "train", "torchvision ImageFolder + PIL + transforms, DataLoader"),
    "tv-v2": (jpeg_torchvision_v2("train"), "train", "torchvision.io.decode_jpeg + transforms.v2, DataLoader"),
    "ceiling": (jpeg_gpuaccel("train", ceiling=True), "decode", "crop-region decode only (the ceiling)"),
    "gpuaccel-eval": (jpeg_gpuaccel("eval"), "eval", "gpuaccel.PinnedLoader, Resize(256) + CenterCrop(224)"),
    "dali-eval": (jpeg_dali("eval"), "eval", "NVIDIA DALI CPU, resize_shorter=256 + crop 224"),
    "tv-pil-eval": (jpeg_torchvision_pil("eval"), "eval", "torchvision ImageFolder + PIL, Resize + CenterCrop"),
    "tv-v2-eval": (jpeg_torchvision_v2("eval"), "eval", "torchvision decode_jpeg + v2, Resize + CenterCrop"),
}


def _eval_reference(root, n=6):
    """torchvision v2 (antialias=True) on the full decode: the evaluation
    images every contender must reproduce, by file name order."""
    import torch
    import torchvision.transforms.v2.functional as F
    from torchvision.datasets import ImageFolder
    from torchvision.io import decode_jpeg, read_file

    refs = {}
    for path, _ in ImageFolder(root).samples[:n]:
        img = F.center_crop(F.resize(decode_jpeg(read_file(path)), 256, antialias=True), 224)
        refs[path] = img.to(torch.float64).numpy() / 255.0
    return refs


def check_jpeg_epoch(batches, pipeline, work):
    """The epoch's batches: shape, dtype, finite values in the normalized
    range, every label a class; the pixels' mean near the data set's
    (a black or garbled batch fails); the channels in RGB order (each has
    its own mean).  Returns (batches seen, mean pixel per channel)."""
    import torch

    sums, count, seen = np.zeros(3), 0, 0
    for images_t, labels_t in batches:
        assert images_t.dtype == torch.float32, images_t.dtype
        side = 1 if pipeline == "decode" else 224
        assert tuple(images_t.shape) == (work["batch"], 3, side, side), tuple(images_t.shape)
        x = images_t.numpy().astype(np.float64) * np.array(STD).reshape(1, 3, 1, 1) + np.array(MEAN).reshape(
            1, 3, 1, 1)
        assert np.isfinite(x).all() and x.min() > -0.01 and x.max() < 1.01, (x.min(), x.max())
        labels = labels_t.numpy()
        assert labels.min() >= 0 and labels.max() < 10
        sums += x.mean(axis=(0, 2, 3))
        count += 1
        seen += 1
    assert seen == JPEG_IMAGES // work["batch"], seen
    means = sums / count
    assert (np.abs(means - 0.5) < 0.08).all(), means  # the textures are centered on 128
    return seen, means.tolist()


def check_eval_outputs(name, root, work):
    """The evaluation pipelines against torchvision v2 on the same files:
    PSNR in dB (their resizes differ a little; each is reported)."""
    if JPEG_CONTENDERS[name][1] != "eval":
        return None
    import torch

    refs = _eval_reference(root)
    worst = float("inf")
    if name.startswith("gpuaccel"):
        import gpuaccel as ga

        t = ga.Compose([ga.Resize(256), ga.CenterCrop(224)])
        for path, ref in refs.items():
            got = ga.decode_image(path, t).transpose(2, 0, 1) / 255.0
            worst = min(worst, _psnr(got, ref))
    elif name.startswith("tv-pil"):
        import torchvision.transforms as T
        from PIL import Image

        t = T.Compose([T.Resize(256), T.CenterCrop(224), T.PILToTensor()])
        for path, ref in refs.items():
            got = t(Image.open(path).convert("RGB")).to(torch.float64).numpy() / 255.0
            worst = min(worst, _psnr(got, ref))
    elif name.startswith("tv-v2"):
        worst = float("inf")  # the reference itself
    elif name.startswith("dali"):
        from nvidia.dali import fn, pipeline_def, types

        files = list(refs)

        @pipeline_def(batch_size=len(files), num_threads=1, device_id=None)
        def pipe():
            jpegs, _ = fn.readers.file(files=files, random_shuffle=False)
            images = fn.resize(fn.decoders.image(jpegs, device="cpu", output_type=types.RGB), resize_shorter=256,
                               antialias=True)
            return fn.crop_mirror_normalize(images, dtype=types.UINT8, output_layout="CHW", crop=(224, 224))

        p = pipe()
        p.build()
        (out,) = p.run()
        for k, path in enumerate(files):
            worst = min(worst, _psnr(np.array(out.at(k), dtype=np.float64) / 255.0, refs[path]))
    return worst


def _psnr(a, b):
    mse = float(np.mean((a - b) ** 2))
    return 10 * np.log10(1.0 / mse) if mse > 0 else float("inf")


def run_jpeg_worker(name, root, work):
    make = JPEG_CONTENDERS[name][0]
    try:
        epoch = make(root, work)
    except ImportError as e:
        print(json.dumps({"name": name, "missing": str(e)}))
        return
    _, means = check_jpeg_epoch(epoch(), JPEG_CONTENDERS[name][1], work)
    quality = check_eval_outputs(name, root, work)
    epochs = []
    for _ in range(work["epochs"]):
        before = process_usage()
        start = time.perf_counter()
        samples = 0
        for images_t, _ in epoch():
            samples += images_t.shape[0]
        elapsed = time.perf_counter() - start
        after = process_usage()
        epochs.append(dict({k: after[k] - before[k] for k in after}, seconds=elapsed, samples=samples,
                           samples_per_second=samples / elapsed))
    print(json.dumps({"name": name, "epochs": epochs, "channel_means": means,
                      "psnr_vs_torchvision_v2": None if quality is None else min(quality, 99.0)}))


def suite_jpeg(args):
    names = args.contenders.split(",") if args.contenders else list(JPEG_CONTENDERS)
    unknown = [n for n in names if n not in JPEG_CONTENDERS]
    if unknown:
        raise SystemExit("unknown contenders %s; choose from %s" % (unknown, ", ".join(JPEG_CONTENDERS)))
    root = make_jpeg_folder(args.data)
    files = [os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs]
    mean_kb = np.mean([os.path.getsize(f) for f in files]) / 1e3
    for f in files:  # page cache warm for everyone
        with open(f, "rb") as fh:
            fh.read()
    work = {"epochs": args.epochs, "batch": JPEG_BATCH, "threads": THREADS}
    python = args.contender_python or os.environ.get("GPUACCEL_BENCH_CONTENDER_PYTHON") or sys.executable
    load_before = os.getloadavg()
    results = {n: [] for n in names}
    for r in range(args.rounds):
        for name in names:
            exe = python if name.startswith("dali") else sys.executable
            cmd = [exe, os.path.abspath(__file__), "--jpeg-worker", name, "--images", root,
                   "--epochs", str(work["epochs"]), "--batch", str(work["batch"]), "--threads", str(work["threads"])]
            try:
                done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, cwd=HERE)
                lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
                why = (done.stderr.strip().splitlines() or ["exit %d" % done.returncode])[-1][:200]
                out = json.loads(lines[-1]) if done.returncode == 0 and lines else {"name": name, "failed": why}
            except subprocess.TimeoutExpired:
                out = {"name": name, "failed": "timed out after %d s" % args.timeout}
            results[name].append(out)
            status = out.get("missing") or out.get("failed") or "%.0f images/s" % _median(
                [e["samples_per_second"] for e in out["epochs"]])
            print("round %d  %-14s %s" % (r + 1, name, status), file=sys.stderr, flush=True)
    load_after = os.getloadavg()
    report_jpeg(results, names, work, args, mean_kb, load_before, load_after)


def report_jpeg(results, names, work, args, mean_kb, load_before, load_after):
    def rates(name):
        return [_median([e["samples_per_second"] for e in o["epochs"]]) if "epochs" in o else None
                for o in results.get(name, [])]

    def ratio(a, b):
        pairs = [x / y for x, y in zip(rates(a), rates(b)) if x and y]
        return _median(pairs) if pairs else None

    rows = []
    for name in names:
        outs = [o for o in results[name] if "epochs" in o]
        if not outs:
            o = results[name][0]
            rows.append([JPEG_CONTENDERS[name][2], JPEG_CONTENDERS[name][1],
                         "not run: %s" % (o.get("missing") or o.get("failed"))] + [""] * 5)
            continue
        base = "dali" if JPEG_CONTENDERS[name][1] != "eval" else "dali-eval"
        r = ratio(name, base) if base in results else None
        user = _median([e["user"] for o in outs for e in o["epochs"]])
        system = _median([e["sys"] for o in outs for e in o["epochs"]])
        psnr = outs[0].get("psnr_vs_torchvision_v2")
        rows.append([JPEG_CONTENDERS[name][2], JPEG_CONTENDERS[name][1],
                     " / ".join("%.0f" % x if x else "-" for x in rates(name)),
                     "%.2fx" % r if r else "", "%.2f" % user, "%.3f" % system,
                     "" if psnr is None else "%.1f" % psnr,
                     "%d failed" % (len(results[name]) - len(outs)) if len(outs) < len(results[name]) else "ok"])
    print_table("JPEG folder: %d files, 300-500 px sides, quality 90, 4:2:0, %.0f KB mean -> batches of %d, "
                "float32 NCHW normalized, %d threads/workers, device cpu; %d rounds x %d epochs, one process per "
                "contender and round  [%s; load average %.2f before, %.2f after]"
                % (JPEG_IMAGES, mean_kb, work["batch"], work["threads"], args.rounds, work["epochs"], machine(),
                   load_before[0], load_after[0]),
                ["contender", "pipeline", "images/s (round medians)", "vs DALI (same pipeline)", "user s/epoch",
                 "sys s/epoch", "eval PSNR vs tv v2, dB", "checked"], rows)

    def goal(text, a, b, target):
        r = ratio(a, b)
        print("goal: %s: %s" % (text, "not measured" if r is None else "%.2fx: %s" % (r, "met" if r >= target
                                                                                     else "NOT met")))

    goal("train >= 1.5x DALI CPU", "gpuaccel", "dali", 1.5)
    best = max(("tv-pil", "tv-v2"), key=lambda n: _median([x for x in rates(n) if x]) if any(rates(n)) else -1)
    goal("train >= 1.8x torchvision's best (%s)" % best, "gpuaccel", best, 1.8)
    goal("evaluation >= 1.5x DALI CPU", "gpuaccel-eval", "dali-eval", 1.5)
    r = ratio("gpuaccel", "ceiling")
    print("train / the crop-decode ceiling: %s" % ("not measured" if r is None else "%.2fx" % r))
    for name in ("gpuaccel", "gpuaccel-eval"):
        outs = [o for o in results.get(name, []) if "epochs" in o]
        if outs:
            user = _median([e["user"] for o in outs for e in o["epochs"]])
            system = _median([e["sys"] for o in outs for e in o["epochs"]])
            print("goal: %s system time <= 10%% of user time: %.3f s vs %.2f s (%.1f%%): %s"
                  % (name, system, user, 100 * system / user, "met" if system <= 0.1 * user else "NOT met"))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default=None, help="dataloader suite: cpu or cuda (default: cuda if usable)")
    parser.add_argument("--suite", choices=["dataloader", "contenders", "jpeg", "all"], default=None,
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
    parser.add_argument("--jpeg-worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--images", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--labels", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, default=BATCH, help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=THREADS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.jpeg_worker:
        run_jpeg_worker(args.jpeg_worker, args.images,
                        {"epochs": args.epochs, "batch": args.batch, "threads": args.threads})
        return
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
    if suite in ("jpeg", "all"):
        suite_jpeg(args)


if __name__ == "__main__":
    main()
