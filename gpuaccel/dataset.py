"""A procedural image-classification set for the demo: ten classes of shapes
and textures, 32x32x3 uint8, generated deterministically from a seed into
memory-mapped .npy files (no download).

Classes: 0 disc, 1 square, 2 triangle, 3 plus, 4 horizontal stripes,
5 vertical stripes, 6 checkerboard, 7 ring, 8 diagonal stripes, 9 X.
Each image has its own colours, position, size, stripe period and noise, so
the classes are learnable but not trivial.
"""

import json
import os

import numpy as np

CLASSES = ["disc", "square", "triangle", "plus", "h-stripes", "v-stripes", "checker", "ring", "diagonal", "x"]
SIDE = 32
_VERSION = 1


def _masks(labels, rng):
    """Boolean foreground masks (n, 32, 32) for the given labels."""
    n = len(labels)
    yy, xx = np.mgrid[0:SIDE, 0:SIDE].astype(np.float32)
    yy, xx = yy[None], xx[None]
    cy = rng.uniform(10, 22, size=(n, 1, 1)).astype(np.float32)
    cx = rng.uniform(10, 22, size=(n, 1, 1)).astype(np.float32)
    r = rng.uniform(5, 10, size=(n, 1, 1)).astype(np.float32)
    period = rng.integers(3, 7, size=(n, 1, 1)).astype(np.float32)
    phase = rng.uniform(0, 6, size=(n, 1, 1)).astype(np.float32)
    dy, dx = yy - cy, xx - cx
    dist = np.sqrt(dy * dy + dx * dx)
    width = np.maximum(1.5, r / 3)
    shapes = [
        dist <= r,                                                      # disc
        (np.abs(dy) <= r * 0.8) & (np.abs(dx) <= r * 0.8),               # square
        (dy <= r * 0.7) & (dy >= -r) & (np.abs(dx) <= (dy + r) * 0.6),   # triangle
        ((np.abs(dy) <= width / 2) & (np.abs(dx) <= r)) | ((np.abs(dx) <= width / 2) & (np.abs(dy) <= r)),  # plus
        ((yy + phase) % (2 * period)) < period,                          # horizontal stripes
        ((xx + phase) % (2 * period)) < period,                          # vertical stripes
        ((((yy + phase) // period) + ((xx + phase) // period)) % 2) == 0,  # checkerboard
        (dist <= r) & (dist >= r * 0.55),                                # ring
        ((xx + yy + phase) % (2 * period)) < period,                     # diagonal stripes
        ((np.abs(dy - dx) <= width / 2) | (np.abs(dy + dx) <= width / 2)) & (np.abs(dy) <= r),  # X
    ]
    masks = np.zeros((n, SIDE, SIDE), dtype=bool)
    for k, shape in enumerate(shapes):
        chosen = labels == k
        masks[chosen] = np.broadcast_to(shape, (n, SIDE, SIDE))[chosen]
    return masks


def _images(labels, rng):
    n = len(labels)
    masks = _masks(labels, rng)
    background = rng.uniform(0, 110, size=(n, 1, 1, 3)).astype(np.float32)
    foreground = rng.uniform(120, 255, size=(n, 1, 1, 3)).astype(np.float32)
    images = np.where(masks[..., None], foreground, background)
    images += rng.normal(0, 18, size=images.shape).astype(np.float32)
    return np.clip(images, 0, 255).astype(np.uint8)


def default_folder():
    """Where the demo and the examples keep generated sets:
    $GPUACCEL_CACHE_DIR/data, else ~/.cache/gpuaccel/data."""
    root = os.environ.get("GPUACCEL_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "gpuaccel")
    return os.path.join(root, "data")


def paths(folder):
    return {name: os.path.join(folder, "shapes_%s.npy" % name) for name in ("train_x", "train_y", "test_x", "test_y")}


def ensure(folder, n_train=50000, n_test=10000, seed=0):
    """Generates the set once into its own subfolder of `folder`, named by
    what it holds (generator version, sample counts, seed), so that sets of
    different sizes (the demo's, the examples') live side by side instead of
    replacing each other; returns the paths of train_x, train_y, test_x,
    test_y.  Each file is written under a temporary name and renamed when
    complete, and meta.json last, so an interrupted run is redone, never
    read half-written."""
    if n_train < 1 or n_test < 1:
        raise ValueError("ensure: n_train and n_test must be at least 1, got %d and %d" % (n_train, n_test))
    folder = os.path.join(folder, "shapes-v%d-train%d-test%d-seed%d" % (_VERSION, n_train, n_test, seed))
    files = paths(folder)
    meta_path = os.path.join(folder, "meta.json")
    meta = {"version": _VERSION, "n_train": n_train, "n_test": n_test, "seed": seed}
    try:
        with open(meta_path) as f:
            if json.load(f) == meta and all(os.path.exists(p) for p in files.values()):
                return files
    except (OSError, ValueError):
        pass
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(seed)
    for split, n in (("train", n_train), ("test", n_test)):
        labels = rng.integers(0, len(CLASSES), size=n).astype(np.int64)
        tmp = files[split + "_x"] + ".%d.tmp" % os.getpid()
        x = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.uint8, shape=(n, SIDE, SIDE, 3))
        for start in range(0, n, 4096):
            stop = min(n, start + 4096)
            x[start:stop] = _images(labels[start:stop], rng)
        x.flush()
        del x
        os.replace(tmp, files[split + "_x"])
        tmp = files[split + "_y"] + ".%d.tmp" % os.getpid()
        with open(tmp, "wb") as f:
            np.save(f, labels)
        os.replace(tmp, files[split + "_y"])
    tmp = meta_path + ".%d.tmp" % os.getpid()
    with open(tmp, "w") as f:
        json.dump(meta, f)
    os.replace(tmp, meta_path)
    return files


def mean_std():
    """Per-channel mean and std of the images on the 0-1 scale (pixel/255),
    as ImageNormalize and torchvision's Normalize take them."""
    return [0.355, 0.355, 0.355], [0.27, 0.27, 0.27]  # measured on 5000 training images
