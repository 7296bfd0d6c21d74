"""PinnedLoader vs torch's DataLoader, side by side in one run.

Task: uint8 images in a memory-mapped .npy (32x32x3 and 224x224x3) plus int64
labels -> shuffled batches of normalized bfloat16 NCHW on the device.

- gpuaccel: PinnedLoader(paths, transform=ImageNormalize(...)).
- torch: DataLoader over a memmap Dataset, num_workers = cores,
  pin_memory=True (with CUDA), .to(device, non_blocking=True), the
  normalization done on the device, as the popular guides teach.

Goals ([loader]): >= 3x DataLoader samples/s (also on a CPU-only machine with
device="cpu"), and on an H100 >= 80% of the measured pinned H2D bandwidth for
224x224 images.

    python benchmarks/bench_loader.py [--device cpu|cuda] [--quick]
"""

import argparse
import os
import tempfile
import time

import numpy as np

import gpuaccel as ga

from common import machine, print_table

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


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
        np.save(labels, np.arange(n, dtype=np.int64) % 1000)
        os.replace(partial, path)
    return path, labels


def sync(device):
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def time_gpuaccel(path, labels, batch, device, batches):
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


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="cuda" if ga.cuda_available() else "cpu")
    parser.add_argument("--quick", action="store_true", help="fewer batches")
    parser.add_argument("--data", default=os.environ.get("GPUACCEL_CACHE_DIR", tempfile.gettempdir()))
    args = parser.parse_args()
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
    print_table("PinnedLoader vs DataLoader(num_workers=%d), device=%s  [%s]" % (workers, args.device, machine()),
                header, rows)


if __name__ == "__main__":
    main()
