"""gpuaccel.PinnedLoader: batches gathered by native threads into a fixed
ring of pinned buffers, copied to the GPU on a copy stream and normalized
there by one fused kernel, handed over without ever blocking the host on the
GPU.  The native engine is csrc/loader.c; this module holds the Python side:
arguments, epochs, shuffling, distributed shards, resuming, torch tensors,
progress bars.

Outputs come from gpuaccel's stream-ordered device pool (pinned host memory
on device="cpu" when CUDA is usable, else its pageable host pool): each batch
gets memory that stays valid for as long as you hold it; when you drop it, the
memory goes back to the pool and is reused only after the streams that used it
are done with it.  A loop that drops each batch thus keeps cycling through the
same few buffers, whose pages are already faulted in.
"""

import atexit
import collections
import mmap
import os
import warnings
import weakref

import numpy as np

from . import _C

__all__ = ["ImageNormalize", "PinnedLoader"]

_DECODE = ("cpu", "gpu", "auto")
_ON_ERROR = ("raise", "skip")

_FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")


class ImageNormalize:
    """The transform PinnedLoader fuses into the copy of the first array:
    uint8 images (N, H, W, C) become ``(x * scale - mean) / std`` in `dtype`,
    as (N, C, H, W) batches.  layout="NCHW" (default) writes them contiguous;
    layout="NHWC" keeps the channels last in memory, with no transpose at all,
    and hands them over in torch's ``channels_last`` memory format (shape
    (N, C, H, W), ``is_contiguous(memory_format=torch.channels_last)``), which
    is what a model converted with ``.to(memory_format=torch.channels_last)``
    takes without copying.

    mean and std are per channel (a sequence with one value per channel, or a
    single number for all channels), in the units of ``x * scale``.
    """

    def __init__(self, mean, std, *, dtype="bfloat16", layout="NCHW", scale=1.0 / 255.0):
        self.mean = _float_list(mean, "mean")
        self.std = _float_list(std, "std")
        if len(self.mean) != len(self.std) and 1 not in (len(self.mean), len(self.std)):
            raise ValueError("ImageNormalize: mean has %d values and std %d; give one per channel"
                             % (len(self.mean), len(self.std)))
        if any(s == 0.0 for s in self.std):
            raise ValueError("ImageNormalize: std must not contain 0, got %r" % (self.std,))
        dtype = str(dtype).replace("torch.", "")
        if dtype not in _FLOAT_DTYPES:
            raise ValueError("ImageNormalize: dtype must be one of %s, got %r" % (", ".join(_FLOAT_DTYPES), dtype))
        if layout not in ("NCHW", "NHWC"):
            raise ValueError("ImageNormalize: layout must be 'NCHW' or 'NHWC', got %r" % (layout,))
        if not isinstance(scale, (int, float)) or isinstance(scale, bool):
            raise TypeError("ImageNormalize: scale must be a number, got %r" % (scale,))
        self.dtype, self.layout, self.scale = dtype, layout, float(scale)

    def _spec(self, channels):
        """(per-channel multiplier, per-channel offset, dtype, nchw) for C."""
        mean = self.mean * channels if len(self.mean) == 1 else self.mean
        std = self.std * channels if len(self.std) == 1 else self.std
        if len(mean) != channels or len(std) != channels:
            raise ValueError("ImageNormalize: the images have %d channels, but mean/std have %d values"
                             % (channels, max(len(self.mean), len(self.std))))
        multiplier = [self.scale / s for s in std]
        offset = [-m / s for m, s in zip(mean, std)]
        return multiplier, offset, self.dtype, self.layout == "NCHW"

    def __repr__(self):
        return "ImageNormalize(mean=%r, std=%r, dtype=%r, layout=%r, scale=%r)" % (
            self.mean, self.std, self.dtype, self.layout, self.scale)


def _float_list(value, name):
    values = [value] if isinstance(value, (int, float)) else list(value)
    try:
        out = [float(v) for v in values]
    except (TypeError, ValueError):
        raise TypeError("ImageNormalize: %s must be a number or a sequence of numbers, got %r"
                        % (name, value)) from None
    if not out:
        raise ValueError("ImageNormalize: %s is empty" % name)
    return out


def _npy_source(path, index):
    """('file', path, data offset, rows, dtype, row shape) from a .npy header,
    without reading the data."""
    path = os.fspath(path)
    with open(path, "rb") as f:
        try:
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
            else:
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
        except ValueError as e:
            raise ValueError("arrays[%d]: %r is not a readable .npy file: %s" % (index, path, e)) from None
        offset = f.tell()
    if len(shape) < 1:
        raise ValueError("arrays[%d]: %r holds a 0-d array; the loader needs a first (sample) dimension"
                         % (index, path))
    if fortran and len(shape) > 1:
        raise ValueError("arrays[%d]: %r is stored in Fortran order; re-save it in C order "
                         "(np.save(path, np.ascontiguousarray(a)))" % (index, path))
    if dtype.hasobject or not dtype.isnative:
        raise ValueError("arrays[%d]: %r has dtype %s; the loader reads native-endian numeric data"
                         % (index, path, dtype))
    _check_dtype(dtype, index)
    needed = offset + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    size = os.path.getsize(path)
    if size < needed:
        raise ValueError("arrays[%d]: %r is %d bytes, but its header describes %s %s data ending at byte %d: "
                         "the file is truncated" % (index, path, size, shape, dtype, needed))
    return ("file", path, offset, shape[0], dtype, tuple(shape[1:]))


_SUPPORTED = {"bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64"}


def _check_dtype(dtype, index):
    if np.dtype(dtype).name not in _SUPPORTED:
        raise TypeError("arrays[%d] has dtype %s, which is not supported; gpuaccel supports %s"
                        % (index, np.dtype(dtype), ", ".join(sorted(_SUPPORTED))))


def _memory_source(array, index):
    if array.ndim < 1:
        raise ValueError("arrays[%d] is 0-d; the loader needs a first (sample) dimension" % index)
    _check_dtype(array.dtype, index)
    rows_dense = array[:1].flags.c_contiguous if array.shape[0] else True
    if not rows_dense:
        array = np.ascontiguousarray(array)  # each row must be one dense block
    if not array.dtype.isnative:
        array = array.astype(array.dtype.newbyteorder("="))
    return ("memory", array)


def _memmap_file_source(array, index):
    """A np.memmap over a shared mapping of a file, rows back to back, is
    read like a .npy path: from the file, whose page cache its mapping
    shares, through the loader's own mapping of it (csrc/loader.c), whose
    copies are guarded: the SIGBUS of a file truncated under them becomes
    an OSError instead of killing the process, as copying out of the
    memmap itself would.  None where that does not apply (copy-on-write
    mode "c", strided rows, a file gone or replaced)."""
    mm, filename = getattr(array, "_mmap", None), getattr(array, "filename", None)
    if (mm is None or filename is None or array.ndim < 1 or getattr(array, "mode", "c") not in ("r", "r+", "w+")
            or not array.flags.c_contiguous or not array.dtype.isnative or array.dtype.hasobject):
        return None
    try:
        mapped = np.frombuffer(mm, dtype=np.uint8)
        # numpy maps from `offset` rounded down to the allocation granularity
        start = array.offset - array.offset % mmap.ALLOCATIONGRANULARITY
        position = start + (array.ctypes.data - mapped.ctypes.data)
        size = os.path.getsize(filename)
    except (ValueError, TypeError, OSError):
        return None
    del mapped
    if not 0 <= position or position + array.nbytes > size or position + array.nbytes > start + len(mm):
        return None
    _check_dtype(array.dtype, index)
    return ("file", os.fspath(filename), position, array.shape[0], array.dtype, tuple(array.shape[1:]))


def _describe(arrays):
    if isinstance(arrays, (str, os.PathLike, np.ndarray)) or not hasattr(arrays, "__len__"):
        raise TypeError("arrays must be a sequence (list or tuple) of NumPy arrays, np.memmap or .npy paths, "
                        "got %s" % type(arrays).__name__)
    if len(arrays) == 0:
        raise ValueError("arrays is empty: give at least one array")
    sources, lengths = [], []
    for i, a in enumerate(arrays):
        if isinstance(a, (str, os.PathLike)):
            spec = _npy_source(a, i)
            length = spec[3]
        elif isinstance(a, np.ndarray):
            spec = (_memmap_file_source(a, i) if isinstance(a, np.memmap) else None) or _memory_source(a, i)
            length = spec[3] if spec[0] == "file" else spec[1].shape[0]
        elif isinstance(a, _C.Array) and a.device == "cpu":
            spec = _memory_source(a.numpy(), i)
            length = spec[1].shape[0]
        else:
            raise TypeError("arrays[%d] must be a NumPy array, np.memmap or a path to a .npy file, got %s"
                            % (i, type(a).__name__))
        sources.append(spec)
        lengths.append(length)
    if len(set(lengths)) != 1:
        raise ValueError("all arrays must have the same first dimension (number of samples); got lengths %s" % lengths)
    return sources, lengths[0]


def _distributed_defaults(rank, world_size):
    if rank is None or world_size is None:
        try:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                rank = dist.get_rank() if rank is None else rank
                world_size = dist.get_world_size() if world_size is None else world_size
        except ImportError:
            pass
    return (0 if rank is None else rank), (1 if world_size is None else world_size)


_live_loaders = weakref.WeakSet()


@atexit.register
def _close_all():
    for loader in list(_live_loaders):
        loader.close()


def _is_dataloader(data):
    """A torch DataLoader (or a subclass), told by its class alone: torch may
    be half imported by another thread, and need not be imported at all."""
    return any(c.__name__ == "DataLoader" and c.__module__.startswith("torch.utils.data")
               for c in type(data).__mro__)


def _image_pairs(data):
    """The (path, label) pairs of an image data set (gpuaccel's ImageFolder,
    torchvision's, or a list of pairs), or None for other data."""
    from .images import ImageFolder

    if isinstance(data, ImageFolder):
        return data.samples, "ImageFolder(%r)" % data.root
    samples = getattr(data, "samples", None)
    if isinstance(samples, list) and hasattr(data, "class_to_idx"):  # torchvision's DatasetFolder
        if getattr(data, "transform", None) is not None or getattr(data, "target_transform", None) is not None:
            raise ValueError("PinnedLoader reads %s's files itself and applies gpuaccel's transforms, not its "
                             "transform=: make it without one and give PinnedLoader transform=ga.Compose([...])"
                             % type(data).__name__)
        return samples, type(data).__name__
    if isinstance(data, (list, tuple)) and data and isinstance(data[0], tuple) and len(data[0]) == 2 and \
            isinstance(data[0][0], (str, bytes, os.PathLike)):
        return list(data), "the (path, label) list"
    return None


class PinnedLoader:
    """Iterates over batches of rows gathered from `data`: NumPy arrays,
    np.memmap or paths to .npy files, all with the same number of rows; or a
    folder of JPEGs (gpuaccel.ImageFolder, or a list of (path, label) pairs),
    decoded by native threads with `transform` (gpuaccel's Compose of
    RandomResizedCrop / Resize / CenterCrop / RandomHorizontalFlip /
    ImageNormalize), yielding (images, labels); or a torch DataLoader, whose
    CPU batches get the pinned ring, the copy stream and the fused
    ImageNormalize (see _FeedLoader).

    Each batch is a tuple with one entry per array: torch tensors (output=
    "torch", on the device, the consumer being torch's current stream) or
    gpuaccel Arrays (output="gpuaccel").  `transform` (an ImageNormalize)
    applies to the first array.  Iterating again starts the next epoch;
    set_epoch() picks one.  With shuffle, the order is a permutation drawn
    from (seed, epoch), the same whatever num_threads is.  Under
    torch.distributed each rank gets a disjoint shard of equal length (padded
    like torch's DistributedSampler).

    A np.memmap (modes "r", "r+", "w+") is read from its file like a .npy
    path, through a mapping the loader keeps from epoch to epoch (pread()
    where the file cannot be mapped): a file truncated under a running epoch
    raises OSError instead of killing the process with SIGBUS.  Batches come
    from gpuaccel's memory pools and stay valid while you hold them; a loop
    that drops each batch reuses the same few buffers.  Threads may share one
    epoch's iterator (they take turns; each batch goes to exactly one of
    them), and close() from any thread ends the epoch, waking a waiting
    next() with StopIteration.  After fork() the child starts epochs of its
    own; one begun in the parent raises RuntimeError there.
    """

    def __new__(cls, data=None, *args, **kwargs):
        if cls is PinnedLoader and _is_dataloader(data):
            return super().__new__(_FeedLoader)
        return super().__new__(cls)

    def __init__(self, data, batch_size=None, *, shuffle=False, seed=0, drop_last=False, num_threads=None,
                 prefetch=2, device=None, transform=None, rank=None, world_size=None, output="torch",
                 progress=False, on_error="raise", decode="auto"):
        if batch_size is None:
            raise TypeError("PinnedLoader: batch_size is required (except over a torch DataLoader, whose own "
                            "batches are used)")
        if on_error not in _ON_ERROR:
            raise ValueError("on_error must be 'raise' or 'skip', got %r" % (on_error,))
        if decode not in _DECODE:
            raise ValueError("decode must be 'cpu', 'gpu' or 'auto', got %r" % (decode,))
        self.on_error, self.decode = on_error, decode
        self._image_source = None  # (paths, offsets, spec): the decoder's per-epoch source
        pairs = _image_pairs(data)
        if pairs is not None:
            self._sources, self.num_samples = self._describe_images(pairs[0], pairs[1], transform, seed)
            transform = self._pipeline.normalize
        else:
            if on_error != "raise":
                raise ValueError("on_error applies to image files; arrays have no files to skip")
            if decode == "gpu":
                raise ValueError("decode='gpu' applies to image files, not arrays")
            self._sources, self.num_samples = _describe(data)
        self._mappings = None  # the last epoch's mappings of the source files, for the next
        if not isinstance(batch_size, (int, np.integer)) or isinstance(batch_size, bool) or batch_size < 1:
            raise ValueError("batch_size must be a positive int, got %r" % (batch_size,))
        self.batch_size = int(batch_size)
        if num_threads is None:
            cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
            num_threads = max(1, min(8, cpus))
        if not isinstance(num_threads, int) or isinstance(num_threads, bool) or not 1 <= num_threads <= 64:
            raise ValueError("num_threads must be an int from 1 to 64, got %r" % (num_threads,))
        if not isinstance(prefetch, int) or isinstance(prefetch, bool) or not 0 <= prefetch <= 64:
            raise ValueError("prefetch must be an int from 0 to 64, got %r" % (prefetch,))
        if not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ValueError("seed must be a non-negative int, got %r" % (seed,))
        if device is None:
            device = "cuda" if _C.cuda_available() else "cpu"
        self.device = _C.Device(device)
        if self.device.type == "cuda" and not _C.cuda_available():
            _C.empty(0, device=self.device)  # raises the RuntimeError that says why
        if transform is not None and not isinstance(transform, ImageNormalize):
            raise TypeError("transform must be None or a gpuaccel.ImageNormalize for arrays (image folders take "
                            "gpuaccel.Compose([...])), got %s" % type(transform).__name__)
        self._transform_spec = None
        if transform is not None:
            first = self._sources[0]
            if first[0] == "images":
                dtype, row_shape = np.uint8, self._pipeline.size + (3,)
            else:
                dtype, row_shape = (first[1].dtype, first[1].shape[1:]) if first[0] == "memory" else (first[4],
                                                                                                        first[5])
            if np.dtype(dtype) != np.uint8 or len(row_shape) != 3:
                raise ValueError("ImageNormalize applies to the first array, which must be uint8 images of shape "
                                 "(N, H, W, C); it is %s with rows of shape %s" % (np.dtype(dtype), tuple(row_shape)))
            self._transform_spec = transform._spec(row_shape[2])
        self.transform = transform
        if output not in ("torch", "gpuaccel"):
            raise ValueError("output must be 'torch' or 'gpuaccel', got %r" % (output,))
        if output == "torch":
            import torch  # noqa: F401  (fails early with ImportError if missing)
        self.output = output
        self.rank, self.world_size = _distributed_defaults(rank, world_size)
        if not (isinstance(self.world_size, int) and self.world_size >= 1 and isinstance(self.rank, int)
                and 0 <= self.rank < self.world_size):
            raise ValueError("rank must be in 0..world_size-1 and world_size >= 1, got rank=%r world_size=%r"
                             % (self.rank, self.world_size))
        self.shuffle, self.seed, self.drop_last = bool(shuffle), int(seed), bool(drop_last)
        self.decode_backend = None  # "cpu" (libjpeg-turbo) or "gpu" (nvJPEG) for image folders
        if self._image_source is not None:
            self.decode_backend = self._pick_decoder(decode)
        self.num_threads, self.prefetch, self.progress = num_threads, prefetch, bool(progress)
        self._epoch = 0
        self._resume_batch = 0
        self._current = None  # (weakref to the live epoch iterator, its epoch)
        self._last_stats = None
        _live_loaders.add(self)

    def _describe_images(self, pairs, what, transform, seed):
        from .images import RandomResizedCrop, _ImageSamples, _Pipeline

        if transform is None:
            raise ValueError("PinnedLoader over %s needs transform=: images of a batch have one size, e.g. "
                             "ga.Compose([ga.RandomResizedCrop(224), ga.RandomHorizontalFlip(), "
                             "ga.ImageNormalize(mean, std)])" % what)
        if isinstance(transform, ImageNormalize):
            raise ValueError("PinnedLoader over %s: transform=ImageNormalize(...) alone gives no image size; "
                             "put it last in ga.Compose([ga.Resize(256), ga.CenterCrop(224), ...])" % what)
        self._pipeline = _Pipeline(transform, seed=seed)
        samples = _ImageSamples(pairs, what)
        samples.check_jpeg(what)
        self._image_samples = samples
        self.random_crop = any(isinstance(t, RandomResizedCrop) for t in getattr(transform, "transforms",
                                                                                 [transform]))
        self._image_source = (samples.blob, samples.offsets)
        return [("images",), ("memory", samples.labels)], len(samples)

    def _pick_decoder(self, decode):
        """decode="auto": nvJPEG on a CUDA device when this build has it (the
        decode then costs the CPU only the file reads), else libjpeg-turbo."""
        nvjpeg = _C._LoaderIter.nvjpeg_version()
        if decode == "gpu":
            if self.device.type != "cuda":
                raise ValueError("decode='gpu' needs device='cuda', got device=%r" % str(self.device))
            if nvjpeg is None:
                from . import _build_config

                note = getattr(_build_config, "NVJPEG_BUILD_NOTE", "")
                raise RuntimeError("decode='gpu' needs nvJPEG: %s" % (
                    "this gpuaccel was built without it (%s)" % note if note else
                    "libnvjpeg could not be loaded; pip install nvidia-nvjpeg"))
            return "gpu"
        if decode == "auto" and self.device.type == "cuda" and nvjpeg is not None:
            return "gpu"
        if _C._LoaderIter.jpeg_version() is None:
            from . import _build_config

            raise RuntimeError("PinnedLoader decodes JPEG on the CPU with libjpeg-turbo, which this gpuaccel was "
                               "built without (%s)" % getattr(_build_config, "JPEG_BUILD_NOTE", ""))
        return "cpu"

    def _epoch_sources(self, epoch):
        if self._image_source is None:
            return list(self._sources)
        blob, offsets = self._image_source
        spec = self._pipeline.spec[:11] + (self.seed,) + self._pipeline.spec[12:]  # load_state_dict may set it
        images = ("images", blob, offsets, spec, epoch, self.on_error == "skip", self.decode_backend == "gpu")
        return [images] + list(self._sources[1:])

    # ------------------------------------------------------------ epochs

    def _shard_size(self):
        n, w = self.num_samples, self.world_size
        return n // w if self.drop_last else -(-n // w)

    def __len__(self):
        per_rank = self._shard_size()
        return per_rank // self.batch_size if self.drop_last else -(-per_rank // self.batch_size)

    def epoch_indices(self, epoch):
        """The sample indices this rank reads in `epoch`, in order."""
        n = self.num_samples
        order = np.random.default_rng([self.seed, epoch]).permutation(n) if self.shuffle else np.arange(n)
        order = order.astype(np.int64, copy=False)
        per_rank = self._shard_size()
        total = per_rank * self.world_size
        if total > n:  # pad by repeating from the start, as DistributedSampler does
            order = np.concatenate([order, np.resize(order, total - n)])
        shard = order[self.rank:total:self.world_size]
        if self.drop_last:
            shard = shard[: (len(shard) // self.batch_size) * self.batch_size]
        return np.ascontiguousarray(shard)

    def set_epoch(self, epoch):
        """Makes the next iteration run `epoch` (its order and shard)."""
        if not isinstance(epoch, (int, np.integer)) or epoch < 0:
            raise ValueError("epoch must be a non-negative int, got %r" % (epoch,))
        self._epoch, self._resume_batch = int(epoch), 0

    def __iter__(self):
        epoch, start = self._epoch, self._resume_batch
        self._epoch, self._resume_batch = epoch + 1, 0
        mappings, self._mappings = self._mappings, None
        engine = _C._LoaderIter(
            self._epoch_sources(epoch), self.epoch_indices(epoch), self.batch_size, self.device, self.num_threads,
            self.prefetch, self._transform_spec, start, mappings)
        self._mappings = engine.mappings  # reused by the next epoch while they map the same files
        it = _EpochIterator(self, engine, epoch)
        self._current = (weakref.ref(it), epoch)
        return it

    # ------------------------------------------------------- resume/stats

    def state_dict(self):
        """Where iteration stands: loading it into a loader over the same data
        resumes at exactly the next batch."""
        live = self._current[0]() if self._current else None
        if live is not None and not live.finished:
            epoch, batch = self._current[1], live.next_batch_index
        else:
            epoch, batch = self._epoch, self._resume_batch
        return {"epoch": epoch, "batch": batch, "seed": self.seed, "shuffle": self.shuffle,
                "num_samples": self.num_samples, "batch_size": self.batch_size, "rank": self.rank,
                "world_size": self.world_size, "drop_last": self.drop_last}

    def load_state_dict(self, state):
        for key in ("num_samples", "batch_size", "world_size", "shuffle", "drop_last"):
            if state.get(key) != getattr(self, key):
                raise ValueError("load_state_dict: the state was saved with %s=%r, but this loader has %r"
                                 % (key, state.get(key), getattr(self, key)))
        batch = int(state["batch"])
        if not 0 <= batch <= len(self):
            raise ValueError("load_state_dict: batch %d is outside 0..%d" % (batch, len(self)))
        self.seed = int(state["seed"])
        self._epoch, self._resume_batch = int(state["epoch"]), batch

    def stats(self):
        """Batches, samples/s, gather/copy seconds and the time the consumer
        waited, for the epoch running now (or the last one)."""
        live = self._current[0]() if self._current else None
        if live is not None:
            return live.stats()
        return dict(self._last_stats) if self._last_stats else {
            "batches": 0, "samples": 0, "samples_per_second": 0.0, "gather_seconds": 0.0,
            "copy_seconds": 0.0, "consumer_wait_seconds": 0.0, "skipped": 0, "skipped_files": []}

    def close(self):
        """Stops the worker threads of a running epoch and frees its ring."""
        live = self._current[0]() if self._current else None
        if live is not None:
            live.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __repr__(self):
        return ("PinnedLoader(%d samples, batch_size=%d, %d batches, device='%s', shuffle=%s, threads=%d, "
                "prefetch=%d, rank %d/%d)" % (self.num_samples, self.batch_size, len(self), self.device,
                                              self.shuffle, self.num_threads, self.prefetch, self.rank,
                                              self.world_size))


class _EpochIterator:
    def __init__(self, loader, engine, epoch):
        self._loader = loader
        self._engine = engine
        self.epoch = epoch
        self.finished = False
        self._torch = None
        self._bar = None
        if loader.output == "torch":
            import torch

            self._torch = torch
        if loader.progress:
            try:
                from tqdm.auto import tqdm

                self._bar = tqdm(total=len(loader), initial=engine.next_batch_index, desc="epoch %d" % epoch,
                                 unit="batch")
            except ImportError:
                warnings.warn("PinnedLoader(progress=True) needs tqdm (pip install tqdm); no progress bar shown",
                              stacklevel=3)

    @property
    def next_batch_index(self):
        return self._engine.next_batch_index

    def __iter__(self):
        return self

    def __next__(self):
        stream = None
        torch = self._torch
        if torch is not None and self._loader.device.type == "cuda":
            stream = torch.cuda.current_stream(self._loader.device.index).cuda_stream
        try:
            batch = self._next_batch(torch, stream)
            while batch[0].shape[0] == 0:  # every file of the batch was skipped (on_error="skip")
                batch = self._next_batch(torch, stream)
        except StopIteration:
            self._finish()
            raise
        except BaseException:
            self._finish()
            raise
        if self._bar is not None:
            self._bar.update(1)
        if torch is not None:
            return tuple(torch.from_dlpack(a) for a in batch)
        return batch

    def _next_batch(self, torch, stream):
        if torch is not None and torch.autograd._profiler_enabled():
            # a profiled step names the batch handoff (and, on a GPU, NVTX names the copy and normalize)
            with torch.autograd.profiler.record_function("gpuaccel::loader_batch"):
                return self._engine.next_batch(stream=stream)
        return self._engine.next_batch(stream=stream)

    def _finish(self):
        if not self.finished:
            self.finished = True
            self._loader._last_stats = self._engine.stats()
            self._engine.close()
            if self._bar is not None:
                self._bar.close()

    def stats(self):
        return self._engine.stats()

    def close(self):
        self._finish()

    def __del__(self):
        self._finish()


# ========================================================== over a DataLoader

class _FeedLoader(PinnedLoader):
    """PinnedLoader over a torch DataLoader (what ``PinnedLoader(dataloader,
    ...)`` makes): the DataLoader's workers produce CPU batches as they do
    now; each batch goes through the native engine like an array batch — its
    rows copied by a native thread into pinned staging memory, sent to the
    device on the loader's copy stream and normalized there by the fused
    kernel (the first tensor, with `transform`), the consumer's stream made
    to wait for it — while the next batches are already on their way
    (`prefetch` of them).  This is Apex's ImageNet ``data_prefetcher``, with
    the normalize fused into the copy.

    The batches are what the DataLoader yields (a tensor, or a tuple or list
    of tensors); the first is normalized when `transform` is given: uint8
    images, channels last (N, H, W, C) or first (N, C, H, W) as
    torchvision's tensors are.  Shuffling, sharding and the epoch belong to
    the DataLoader (and its sampler's set_epoch).
    """

    def __init__(self, data, batch_size=None, *, device=None, transform=None, prefetch=2, output="torch",
                 progress=False, **ignored):
        unsupported = sorted(k for k, v in ignored.items() if v not in (None, False, 0, "raise", "auto")
                             and not (k == "num_threads"))
        if batch_size is not None or unsupported:
            raise ValueError("PinnedLoader over a DataLoader takes its batches, order and sharding from the "
                             "DataLoader; set %s there" % ", ".join(["batch_size"] * (batch_size is not None)
                                                                   + unsupported))
        self.dataloader = data
        if not isinstance(prefetch, int) or isinstance(prefetch, bool) or not 0 <= prefetch <= 64:
            raise ValueError("prefetch must be an int from 0 to 64, got %r" % (prefetch,))
        if device is None:
            device = "cuda" if _C.cuda_available() else "cpu"
        self.device = _C.Device(device)
        if self.device.type == "cuda" and not _C.cuda_available():
            _C.empty(0, device=self.device)  # raises the RuntimeError that says why
        if transform is not None and not isinstance(transform, ImageNormalize):
            raise TypeError("transform over a DataLoader must be None or a gpuaccel.ImageNormalize, got %s"
                            % type(transform).__name__)
        if output not in ("torch", "gpuaccel"):
            raise ValueError("output must be 'torch' or 'gpuaccel', got %r" % (output,))
        import torch  # noqa: F401  (a DataLoader implies torch)

        self.transform, self.prefetch, self.output, self.progress = transform, prefetch, output, bool(progress)
        self.batch_size = getattr(data, "batch_size", None)
        self._current = None
        self._last_stats = None
        _live_loaders.add(self)

    def __len__(self):
        return len(self.dataloader)

    def __iter__(self):
        it = _FeedIterator(self)
        self._current = (weakref.ref(it), None)
        return it

    def set_epoch(self, epoch):
        sampler = getattr(self.dataloader, "sampler", None)
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)

    def state_dict(self):
        raise TypeError("PinnedLoader over a DataLoader has no state of its own to save: the DataLoader's "
                        "sampler decides the order")

    load_state_dict = state_dict

    def __repr__(self):
        return "PinnedLoader(%r, device='%s', transform=%r, prefetch=%d)" % (
            self.dataloader, self.device, self.transform, self.prefetch)


class _FeedIterator:
    """One pass over the DataLoader, `prefetch` batches ahead."""

    def __init__(self, loader):
        self._loader = loader
        self._batches = iter(loader.dataloader)
        self._queue = collections.deque()
        self._exhausted = False
        self.finished = False
        self.next_batch_index = 0
        self._stats = {"batches": 0, "samples": 0, "samples_per_second": 0.0, "gather_seconds": 0.0,
                       "copy_seconds": 0.0, "consumer_wait_seconds": 0.0, "skipped": 0, "skipped_files": []}
        self._bar = None
        if loader.progress:
            try:
                from tqdm.auto import tqdm

                self._bar = tqdm(total=len(loader), unit="batch")
            except ImportError:
                warnings.warn("PinnedLoader(progress=True) needs tqdm (pip install tqdm); no progress bar shown",
                              stacklevel=3)
        import time

        self._started = time.perf_counter()
        self._fill()

    def _start(self, batch):
        """An engine that copies (and normalizes) this batch, started now."""
        import torch

        kind = type(batch)
        parts = [batch] if isinstance(batch, torch.Tensor) else list(batch) if isinstance(batch, (list, tuple)) \
            else None
        if parts is None:
            raise TypeError("PinnedLoader over a DataLoader takes batches that are a tensor or a tuple/list of "
                            "tensors, got %s" % kind.__name__)
        arrays = []
        for i, t in enumerate(parts):
            if isinstance(t, torch.Tensor):
                if t.device.type != "cpu":
                    raise ValueError("batch[%d] is already on %s: give PinnedLoader the DataLoader's CPU batches "
                                     "(pin_memory=False; it pins them itself)" % (i, t.device))
                t = t.numpy()
            arrays.append(np.asarray(t))
        n = arrays[0].shape[0] if arrays and arrays[0].ndim else 0
        sources, _ = _describe(arrays)
        spec = None
        if self._loader.transform is not None:
            images = arrays[0]
            if images.dtype != np.uint8 or images.ndim != 4:
                raise ValueError("ImageNormalize applies to the batch's first tensor, which must be uint8 images "
                                 "(N, H, W, C) or (N, C, H, W); it is %s of shape %s" % (images.dtype, images.shape))
            channels_first = images.shape[1] in (1, 3) and images.shape[3] not in (1, 3, 4)
            spec = self._loader.transform._spec(images.shape[1] if channels_first else images.shape[3])
            spec = spec + (channels_first,)
        engine = _C._LoaderIter(sources, np.arange(n, dtype=np.int64), max(n, 1), self._loader.device, 1, 0, spec)
        return engine, kind

    def _fill(self):
        while not self._exhausted and len(self._queue) < self._loader.prefetch + 1:
            try:
                batch = next(self._batches)
            except StopIteration:
                self._exhausted = True
                break
            self._queue.append(self._start(batch))

    def __iter__(self):
        return self

    def __next__(self):
        if not self._queue:
            self._finish()
            raise StopIteration
        engine, kind = self._queue.popleft()
        self._fill()  # the next batches are copied while this one is handed over
        loader = self._loader
        stream = None
        torch = None
        if loader.output == "torch":
            import torch
            if loader.device.type == "cuda":
                stream = torch.cuda.current_stream(loader.device.index).cuda_stream
        try:
            out = engine.next_batch(stream=stream)
        finally:
            self._account(engine.stats())
            engine.close()
        self.next_batch_index += 1
        if self._bar is not None:
            self._bar.update(1)
        if torch is not None:
            out = tuple(torch.from_dlpack(a) for a in out)
        if kind is list:
            return list(out)
        if kind is tuple or len(out) != 1:
            return out
        return out[0]

    def _account(self, engine_stats):
        import time

        s = self._stats
        s["batches"] += engine_stats["batches"]
        s["samples"] += engine_stats["samples"]
        for key in ("gather_seconds", "copy_seconds", "consumer_wait_seconds"):
            s[key] += engine_stats[key]
        elapsed = time.perf_counter() - self._started
        s["elapsed_seconds"] = elapsed
        s["samples_per_second"] = s["samples"] / elapsed if elapsed > 0 else 0.0

    def stats(self):
        return dict(self._stats)

    def _finish(self):
        if not self.finished:
            self.finished = True
            while self._queue:
                self._queue.popleft()[0].close()
            self._loader._last_stats = self.stats()
            if self._bar is not None:
                self._bar.close()

    def close(self):
        self._finish()

    def __del__(self):
        self._finish()
