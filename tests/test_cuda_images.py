"""PinnedLoader over JPEG folders on a CUDA device: decode="cpu" (libjpeg-turbo
on the workers, the copy stream and the fused normalize) and decode="gpu"
(nvJPEG, then the resize kernel and the normalize on the copy stream).

In the simulator (kernels/sim/sim.c) nvJPEG's stand-in decodes on the CPU, so
these check the GPU path's buffers, kernels and stream order; nvJPEG's own
decoding (and its hardware backend) needs a real GPU."""

import numpy as np
import pytest

import gpuaccel as ga

pytestmark = pytest.mark.cuda
torch = pytest.importorskip("torch")
PIL = pytest.importorskip("PIL.Image")

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def gpu_decode_or_skip():
    if ga._C._LoaderIter.nvjpeg_version() is None:
        pytest.skip("this build has no nvJPEG")


def write_files(tmp_path, rng, n):
    pairs = []
    for i in range(n):
        h, w = int(rng.integers(40, 130)), int(rng.integers(40, 130))
        y, x = np.mgrid[0:h, 0:w]
        img = np.stack([x * 2 + i, y * 2, (x + y + 40 * i) % 256], -1) % 256 + rng.integers(0, 30, (h, w, 3))
        path = str(tmp_path / ("%03d.jpg" % i))
        PIL.fromarray(img.clip(0, 255).astype(np.uint8)).save(path, quality=92)
        pairs.append((path, i))
    return pairs


def reference(pairs, label, geometry, epoch, seed, decode="cpu"):
    """What sample `label` becomes on the CPU (nvJPEG decodes at full size:
    so does the GPU path's reference)."""
    decoded = ga.decode_image(pairs[label][0], geometry, index=label, epoch=epoch, seed=seed,
                              dct_scaling=decode == "cpu")
    return (decoded / 255.0 - np.array(MEAN)) / np.array(STD), decoded


@pytest.mark.parametrize("decode", ["cpu", "gpu"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_batches_are_the_samples_decoded_and_normalized(rng, tmp_path, decode, layout):
    if decode == "gpu":
        gpu_decode_or_skip()
    pairs = write_files(tmp_path, rng, 23)
    geometry = ga.Compose([ga.RandomResizedCrop((31, 26)), ga.RandomHorizontalFlip()])
    t = ga.Compose(geometry.transforms + [ga.ImageNormalize(MEAN, STD, dtype="float32", layout=layout)])
    loader = ga.PinnedLoader(pairs, 5, shuffle=True, seed=2, device="cuda", transform=t, decode=decode,
                             num_threads=3, output="gpuaccel")
    assert loader.decode_backend == decode
    loader.set_epoch(1)
    seen = []
    for x, y in loader:
        assert x.device == "cuda:0" and x.shape[1:] == (3, 31, 26)
        for image, label in zip(x.numpy(), y.numpy()):
            ref, _ = reference(pairs, label, geometry, 1, 2, decode)
            err = np.abs(image.transpose(1, 2, 0) - ref)
            # the CPU decode is the reference's own; the GPU's resize sums in
            # one pass where the CPU rounds between two (up to 2 units off
            # the exact value): up to 3 units apart, rarely more than 0
            unit = 1.0 / 255.0 / min(STD)
            assert err.max() <= (1e-5 if decode == "cpu" else 3 * unit + 1e-5), err.max()
            assert err.mean() <= (1e-6 if decode == "cpu" else 0.25 * unit)
        seen += y.numpy().tolist()
    assert sorted(seen) == list(range(23))


def test_gpu_decode_without_normalize_gives_uint8(rng, tmp_path):
    gpu_decode_or_skip()
    pairs = write_files(tmp_path, rng, 7)
    t = ga.Compose([ga.Resize(40), ga.CenterCrop(36)])
    batches = list(ga.PinnedLoader(pairs, 4, device="cuda", transform=t, decode="gpu", output="gpuaccel"))
    for x, y in batches:
        assert x.dtype == "uint8" and x.shape[1:] == (36, 36, 3)
        for image, label in zip(x.numpy(), y.numpy()):
            _, decoded = reference(pairs, label, t, 0, 0, "gpu")
            assert np.abs(image.astype(int) - decoded.astype(int)).max() <= 3


@pytest.mark.parametrize("decode", ["cpu", "gpu"])
def test_bad_files_raise_or_are_skipped(rng, tmp_path, decode):
    if decode == "gpu":
        gpu_decode_or_skip()
    pairs = write_files(tmp_path, rng, 9)
    good = open(pairs[2][0], "rb").read()
    with open(pairs[2][0], "wb") as f:  # a header, then the data cut short: found by the decode itself
        f.write(good[: len(good) // 2])
    with open(pairs[5][0], "wb") as f:  # not a JPEG: found when the header is read
        f.write(b"not an image at all")
    t = ga.Compose([ga.Resize((12, 12)), ga.ImageNormalize(MEAN, STD)])
    with pytest.raises(OSError, match="(002|005).jpg"):
        list(ga.PinnedLoader(pairs, 4, device="cuda", transform=t, decode=decode, output="gpuaccel"))
    loader = ga.PinnedLoader(pairs, 4, device="cuda", transform=t, decode=decode, on_error="skip",
                             output="gpuaccel")
    labels = [int(v) for _, y in loader for v in y.numpy()]
    assert labels == [0, 1, 3, 4, 6, 7, 8]
    assert loader.stats()["skipped"] == 2


def test_decode_choices(rng, tmp_path):
    pairs = write_files(tmp_path, rng, 2)
    t = ga.CenterCrop(8)
    loader = ga.PinnedLoader(pairs, 2, device="cpu", transform=t)
    assert loader.decode_backend == "cpu"
    with pytest.raises(ValueError, match="decode='gpu' needs device='cuda'"):
        ga.PinnedLoader(pairs, 2, device="cpu", transform=t, decode="gpu")
    auto = ga.PinnedLoader(pairs, 2, device="cuda", transform=t)
    assert auto.decode_backend == ("gpu" if ga._C._LoaderIter.nvjpeg_version() else "cpu")


def test_over_a_dataloader_on_the_device(rng):
    images = rng.integers(0, 256, size=(30, 9, 7, 3), dtype=np.uint8)
    ds = torch.utils.data.TensorDataset(torch.from_numpy(images).permute(0, 3, 1, 2), torch.arange(30))
    dl = torch.utils.data.DataLoader(ds, batch_size=8)
    loader = ga.PinnedLoader(dl, device="cuda", transform=ga.ImageNormalize(MEAN, STD, dtype="float32"),
                             output="gpuaccel")
    for x, y in loader:
        assert x.device == "cuda:0"
        ref = (images[y.numpy()] / 255.0 - np.array(MEAN)) / np.array(STD)
        np.testing.assert_allclose(x.numpy().transpose(0, 2, 3, 1), ref, rtol=1e-6, atol=1e-6)
