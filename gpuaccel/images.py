"""Folders of JPEGs for gpuaccel.PinnedLoader: ImageFolder (torchvision's
layout and class order) and gpuaccel's own transforms, which the loader's
native threads apply while they decode (csrc/loader.c, kernels/cpu/jpeg.c).

The transforms take torchvision's parameters and draw from the same
distributions as torchvision's, from a random stream of their own: each
sample's crop and flip depend only on (seed, epoch, sample index), so an
epoch is reproducible whatever the thread count, and each epoch differs.
"""

import math
import os

import numpy as np

from . import _C

__all__ = ["CenterCrop", "Compose", "ImageFolder", "RandomHorizontalFlip", "RandomResizedCrop", "Resize",
           "decode_image", "IMG_EXTENSIONS", "JPEG_EXTENSIONS"]

# torchvision.datasets.folder.IMG_EXTENSIONS: the same files make the same samples
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
JPEG_EXTENSIONS = (".jpg", ".jpeg")


# ================================================================ ImageFolder

class ImageFolder:
    """A folder of class folders of images, as torchvision's ImageFolder reads
    it: ``root/<class>/**/<file>``; classes are the sorted names of root's
    subfolders (``classes``, ``class_to_idx``), ``samples`` the (path, class
    index) pairs, folders walked in sorted order, symlinks followed.  The same
    folder gives the same samples and labels as torchvision's.

    PinnedLoader decodes JPEG files; other image files among the samples are
    reported when a loader is made (pass ``extensions=JPEG_EXTENSIONS`` to
    leave them out).
    """

    def __init__(self, root, extensions=None, is_valid_file=None, allow_empty=False):
        self.root = os.fspath(os.path.expanduser(root))
        if extensions is not None and is_valid_file is not None:
            raise ValueError("ImageFolder: give extensions or is_valid_file, not both")
        if extensions is None and is_valid_file is None:
            extensions = IMG_EXTENSIONS
        if isinstance(extensions, str):
            extensions = (extensions,)
        self.extensions = tuple(e.lower() for e in extensions) if extensions is not None else None
        if not os.path.isdir(self.root):
            raise FileNotFoundError("ImageFolder: %r is not a folder" % self.root)
        self.classes = sorted(entry.name for entry in os.scandir(self.root) if entry.is_dir())
        if not self.classes:
            raise FileNotFoundError("Couldn't find any class folder in %s." % self.root)
        self.class_to_idx = {name: i for i, name in enumerate(self.classes)}
        valid = is_valid_file if is_valid_file is not None else (
            lambda path: path.lower().endswith(self.extensions))
        samples, found = [], set()
        for name in self.classes:
            folder = os.path.join(self.root, name)
            for dirpath, _, files in sorted(os.walk(folder, followlinks=True)):
                for fname in sorted(files):
                    path = os.path.join(dirpath, fname)
                    if valid(path):
                        samples.append((path, self.class_to_idx[name]))
                        found.add(name)
        empty = set(self.classes) - found
        if empty and not allow_empty:
            msg = "Found no valid file for the classes %s. " % ", ".join(sorted(empty))
            if self.extensions is not None:
                msg += "Supported extensions are: %s" % ", ".join(self.extensions)
            raise FileNotFoundError(msg)
        self.samples = samples
        self.imgs = samples
        self.targets = [label for _, label in samples]

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, index):
        """(image, label): the file decoded at its own size, uint8 (H, W, 3)."""
        path, label = self.samples[index]
        return decode_image(path), label

    def __repr__(self):
        return "ImageFolder(%r, %d classes, %d samples)" % (self.root, len(self.classes), len(self.samples))


class _ImageSamples:
    """(path, label) pairs as the native loader reads them: every path in one
    NUL-separated byte array, and their offsets (built once per loader)."""

    def __init__(self, pairs, what):
        paths, labels = [], []
        for k, pair in enumerate(pairs):
            try:
                path, label = pair
            except (TypeError, ValueError):
                raise TypeError("%s[%d] must be a (path, label) pair, got %r" % (what, k, pair)) from None
            if not isinstance(path, (str, bytes, os.PathLike)):
                raise TypeError("%s[%d]: the path must be a str or os.PathLike, got %s"
                                % (what, k, type(path).__name__))
            if isinstance(label, bool) or not isinstance(label, (int, np.integer)):
                raise TypeError("%s[%d]: the label must be an int, got %r" % (what, k, label))
            paths.append(os.fsencode(path))
            labels.append(int(label))
        if not paths:
            raise ValueError("%s is empty: give at least one (path, label) pair" % what)
        if any(b"\0" in p for p in paths):
            raise ValueError("%s: a path contains a NUL byte" % what)
        blob = b"\0".join(paths) + b"\0"
        lengths = np.fromiter((len(p) + 1 for p in paths), dtype=np.int64, count=len(paths))
        self.offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        self.blob = np.frombuffer(blob, dtype=np.uint8)
        self.labels = np.asarray(labels, dtype=np.int64)
        self.paths = paths

    def __len__(self):
        return len(self.paths)

    def check_jpeg(self, what):
        """Samples whose extension says they are not JPEG: a clear error now,
        rather than at their first batch."""
        others = {}
        for p in self.paths:
            ext = os.path.splitext(p)[1].decode(errors="replace").lower()
            if ext not in JPEG_EXTENSIONS:
                others.setdefault(ext or "(no extension)", []).append(p)
        if others:
            detail = ", ".join("%d %s (e.g. %r)" % (len(v), k, os.fsdecode(v[0])) for k, v in sorted(others.items()))
            raise ValueError("%s has files that are not JPEG: %s; PinnedLoader decodes JPEG only. Leave them out "
                             "with ga.ImageFolder(root, extensions=ga.JPEG_EXTENSIONS), convert them to JPEG, or "
                             "load them with a torch DataLoader and give that to PinnedLoader" % (what, detail))


# ================================================================ transforms

def _size_pair(size, name):
    if isinstance(size, (int, np.integer)) and not isinstance(size, bool):
        size = (int(size), int(size))
    elif isinstance(size, (list, tuple)) and len(size) in (1, 2) and all(
            isinstance(s, (int, np.integer)) and not isinstance(s, bool) for s in size):
        size = (int(size[0]), int(size[-1]))
    else:
        raise TypeError("%s: size must be an int or a sequence of 1 or 2 ints, got %r" % (name, size))
    if min(size) < 1 or max(size) > 65536:
        raise ValueError("%s: size must be from 1 to 65536 pixels, got %r" % (name, size))
    return size


def _check_interpolation(interpolation, antialias, name):
    mode = getattr(interpolation, "value", interpolation)
    if str(mode).lower() != "bilinear":
        raise ValueError("%s: only bilinear interpolation is implemented, got %r" % (name, interpolation))
    if antialias is not True and antialias is not None:
        raise ValueError("%s: only antialias=True is implemented (torchvision's default), got %r" % (name, antialias))


class RandomResizedCrop:
    """torchvision's RandomResizedCrop: a crop of a random area fraction in
    `scale` and aspect ratio (w/h) in `ratio` (uniform in log space), ten
    tries, then the largest centered crop within the ratios; resized to
    `size` with antialiased bilinear interpolation."""

    def __init__(self, size, scale=(0.08, 1.0), ratio=(3.0 / 4.0, 4.0 / 3.0), interpolation="bilinear",
                 antialias=True):
        self.size = _size_pair(size, "RandomResizedCrop")
        try:
            self.scale = (float(scale[0]), float(scale[1]))
            self.ratio = (float(ratio[0]), float(ratio[1]))
        except (TypeError, ValueError, IndexError):
            raise TypeError("RandomResizedCrop: scale and ratio must be pairs of numbers, got %r and %r"
                            % (scale, ratio)) from None
        if not 0 < self.scale[0] <= self.scale[1]:
            raise ValueError("RandomResizedCrop: scale must be (min, max) with 0 < min <= max, got %r" % (scale,))
        if not 0 < self.ratio[0] <= self.ratio[1]:
            raise ValueError("RandomResizedCrop: ratio must be (min, max) with 0 < min <= max, got %r" % (ratio,))
        _check_interpolation(interpolation, antialias, "RandomResizedCrop")

    def __repr__(self):
        return "RandomResizedCrop(size=%r, scale=%r, ratio=%r)" % (self.size, self.scale, self.ratio)


class RandomHorizontalFlip:
    """Mirrors the image left to right with probability p (applied to the
    output: the same as torchvision's wherever the crop is drawn)."""

    def __init__(self, p=0.5):
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p <= 1.0:
            raise ValueError("RandomHorizontalFlip: p must be a number from 0 to 1, got %r" % (p,))
        self.p = float(p)

    def __repr__(self):
        return "RandomHorizontalFlip(p=%r)" % self.p


class Resize:
    """torchvision's Resize: an int makes the shorter side that long (the
    longer ``int(size * long / short)``), (h, w) that size; antialiased
    bilinear interpolation."""

    def __init__(self, size, interpolation="bilinear", max_size=None, antialias=True):
        if max_size is not None:
            raise ValueError("Resize: max_size is not implemented, got %r" % (max_size,))
        if isinstance(size, (list, tuple)) and len(size) == 1:
            size = size[0]
        if isinstance(size, (int, np.integer)) and not isinstance(size, bool):
            if not 1 <= size <= 65536:
                raise ValueError("Resize: size must be from 1 to 65536 pixels, got %r" % (size,))
            self.size, self.shorter = int(size), True
        else:
            self.size, self.shorter = _size_pair(size, "Resize"), False
        _check_interpolation(interpolation, antialias, "Resize")

    def __repr__(self):
        return "Resize(size=%r)" % (self.size,)


class CenterCrop:
    """torchvision's CenterCrop: the center size[0] x size[1] pixels, zero
    padding around an image smaller than that."""

    def __init__(self, size):
        self.size = _size_pair(size, "CenterCrop")

    def __repr__(self):
        return "CenterCrop(size=%r)" % (self.size,)


class Compose:
    """Transforms applied in order, as torchvision's Compose: one geometry
    (RandomResizedCrop, or Resize and/or CenterCrop), RandomHorizontalFlip,
    and ImageNormalize last."""

    def __init__(self, transforms):
        self.transforms = list(transforms)

    def __repr__(self):
        return "Compose([%s])" % ", ".join(repr(t) for t in self.transforms)


_ACCEPTED = "RandomResizedCrop, Resize, CenterCrop, RandomHorizontalFlip, ImageNormalize"


class _Pipeline:
    """A transform compiled for the native decoder: the spec tuple
    csrc/image.c parses, and the ImageNormalize (or None) fused after it."""

    def __init__(self, transform, seed=0, dct_scaling=True):
        from .loader import ImageNormalize

        items = transform.transforms if isinstance(transform, Compose) else [transform]
        crop = resize = center = normalize = flip = None
        for t in items:
            if normalize is not None:
                raise ValueError("transform: ImageNormalize must come last, got %r after it" % (t,))
            if isinstance(t, RandomResizedCrop):
                if crop or resize or center:
                    raise ValueError("transform: RandomResizedCrop must be the only geometry (no Resize or "
                                     "CenterCrop with it, and only one)")
                crop = t
            elif isinstance(t, Resize):
                if crop or resize or center:
                    raise ValueError("transform: Resize must come once, before CenterCrop, without "
                                     "RandomResizedCrop")
                resize = t
            elif isinstance(t, CenterCrop):
                if crop or center:
                    raise ValueError("transform: CenterCrop must come once, without RandomResizedCrop")
                center = t
            elif isinstance(t, RandomHorizontalFlip):
                if flip is not None:
                    raise ValueError("transform: RandomHorizontalFlip must come only once")
                flip = t
            elif isinstance(t, ImageNormalize):
                normalize = t
            else:
                raise TypeError("transform: %s is not one of gpuaccel's image transforms (%s)"
                                % (type(t).__name__, _ACCEPTED))
        if crop is not None:
            out = crop.size
        elif center is not None:
            out = center.size
        elif resize is not None and not resize.shorter:
            out = resize.size
        else:
            raise ValueError("transform: the images of a batch need one size; end the geometry with "
                             "RandomResizedCrop(size), CenterCrop(size) or Resize((h, w)), got %r" % (transform,))
        resize_short = resize.size if resize is not None and resize.shorter else 0
        resize_hw = resize.size if resize is not None and not resize.shorter else (0, 0)
        scale = crop.scale if crop else (1.0, 1.0)
        ratio = crop.ratio if crop else (1.0, 1.0)
        self.size = out
        self.normalize = normalize
        self.spec = (out[0], out[1], crop is not None, scale[0], scale[1], math.log(ratio[0]), math.log(ratio[1]),
                     resize_short, resize_hw[0], resize_hw[1], flip.p if flip else 0.0, int(seed), bool(dct_scaling))


def decode_image(source, transform=None, *, index=0, epoch=0, seed=0, dct_scaling=True):
    """Decodes one JPEG (a path, or its bytes) as the loader would, into a
    uint8 NumPy array (H, W, 3): at its own size without `transform`, or
    as sample `index` of `epoch` with gpuaccel's transforms (their geometry
    and flip; an ImageNormalize in them is not applied here).
    dct_scaling=False decodes at full size before resizing even where the
    crop would allow libjpeg's reduced scales (what decode="gpu" does).
    Raises OSError for a damaged file or one that is not JPEG."""
    data = _read_source(source)
    if transform is None:
        width, height = _C._LoaderIter.image_size(data)
        transform = Resize((height, width))
    pipeline = _Pipeline(transform, seed=seed, dct_scaling=dct_scaling)
    image, _ = _C._LoaderIter.decode_image(data, pipeline.spec, int(index), int(epoch))
    return image


def image_geometry(width, height, transform, *, index=0, epoch=0, seed=0):
    """The crop, resize and flip that sample `index` of `epoch` draws for an
    image of width x height: a dict with "crop" (top, left, height, width in
    source pixels; after a Resize, (0, 0) and the resized height and width)
    and "flip" among others."""
    return _C._LoaderIter.image_geometry(int(width), int(height), _Pipeline(transform, seed=seed).spec,
                                         int(index), int(epoch))


def _read_source(source):
    if isinstance(source, (bytes, bytearray, memoryview)):
        return bytes(source)
    if isinstance(source, np.ndarray) and source.dtype == np.uint8:
        return source.tobytes()
    if isinstance(source, (str, os.PathLike)):
        with open(source, "rb") as f:
            return f.read()
    raise TypeError("decode_image: source must be a path or the file's bytes, got %s" % type(source).__name__)


def jpeg_version():
    """libjpeg-turbo's version in this build, or None when it was built
    without it."""
    return _C._LoaderIter.jpeg_version()
