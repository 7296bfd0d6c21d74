"""PinnedLoader over folders of JPEGs: ImageFolder against torchvision's, the
transforms' sampling against torchvision's, decoded pixels against
torchvision v2 (antialias=True) on the same crop parameters, real-file
cases (grayscale, CMYK, progressive, restart markers, damaged files, PNG),
and PinnedLoader over a torch DataLoader."""

import io
import math
import os

import numpy as np
import pytest

import gpuaccel as ga

PIL = pytest.importorskip("PIL.Image")
torch = pytest.importorskip("torch")
tv = pytest.importorskip("torchvision")
F = pytest.importorskip("torchvision.transforms.v2.functional")
T = pytest.importorskip("torchvision.transforms.v2")

pytestmark = pytest.mark.skipif(ga.images.jpeg_version() is None, reason="built without libjpeg-turbo")

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def photo(rng, h, w):
    """A smooth image with texture and noise, like a photo's mix of both."""
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    phase = rng.uniform(0, 6, 6)
    img = np.stack([128 + 90 * np.sin(x / rng.uniform(5, 40) + y / rng.uniform(5, 40) + phase[0]),
                    128 + 80 * np.cos(x / rng.uniform(5, 40) - y / rng.uniform(5, 40) + phase[1]),
                    128 + 70 * np.sin((x + y) / rng.uniform(3, 20) + phase[2])], -1)
    return (img + rng.normal(0, 12, img.shape)).clip(0, 255).astype(np.uint8)


def jpeg_bytes(img, **save):
    buf = io.BytesIO()
    PIL.fromarray(img).save(buf, format="JPEG", **save)
    return buf.getvalue()


def psnr(a, b):
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return 10 * math.log10(255.0 ** 2 / mse) if mse > 0 else float("inf")


def reference_crop(data, geometry, size, mode="RGB"):
    """torchvision v2 on the full decode: resized_crop with the sample's
    parameters (antialias=True), then the flip."""
    full = torch.from_numpy(np.array(PIL.open(io.BytesIO(data)).convert(mode))).permute(2, 0, 1)
    top, left, h, w = geometry["crop"]
    out = F.resized_crop(full, top, left, h, w, list(size), antialias=True)
    if geometry["flip"]:
        out = F.horizontal_flip(out)
    return out.permute(1, 2, 0).numpy()


TRAIN = ga.Compose([ga.RandomResizedCrop(224), ga.RandomHorizontalFlip()])


# ================================================================ ImageFolder

def make_folder(root, rng, classes=("dog", "Cat", "ant", "bee"), per_class=(3, 1, 4, 2), side=(40, 90)):
    for name, count in zip(classes, per_class):
        folder = os.path.join(root, name, "nested") if name == "bee" else os.path.join(root, name)
        os.makedirs(folder, exist_ok=True)
        for i in range(count):
            img = photo(rng, int(rng.integers(*side)), int(rng.integers(*side)))
            ext = ".JPG" if i == 1 else ".jpeg" if i == 2 else ".jpg"
            PIL.fromarray(img).save(os.path.join(folder, "%s_%d%s" % (name, i, ext)), quality=90)
    os.makedirs(os.path.join(root, "ant", "z_deeper"), exist_ok=True)
    PIL.fromarray(photo(rng, 33, 47)).save(os.path.join(root, "ant", "z_deeper", "a.jpg"))
    with open(os.path.join(root, "ant", "notes.txt"), "w") as f:
        f.write("not an image")


def test_image_folder_is_torchvisions(tmp_path, rng):
    make_folder(str(tmp_path), rng)
    ours, theirs = ga.ImageFolder(tmp_path), tv.datasets.ImageFolder(str(tmp_path))
    assert ours.classes == theirs.classes == ["Cat", "ant", "bee", "dog"]
    assert ours.class_to_idx == theirs.class_to_idx
    assert ours.samples == theirs.samples and ours.targets == theirs.targets
    image, label = ours[3]
    assert label == theirs[3][1] and image.dtype == np.uint8
    np.testing.assert_array_equal(image.shape, np.array(theirs[3][0]).shape)
    assert psnr(image, np.array(theirs[3][0])) > 60  # the same libjpeg decode, at full size


def test_image_folder_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a folder"):
        ga.ImageFolder(tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match="Couldn't find any class folder"):
        ga.ImageFolder(tmp_path)
    os.makedirs(tmp_path / "a")
    with pytest.raises(FileNotFoundError, match="Found no valid file for the classes a"):
        ga.ImageFolder(tmp_path)
    with pytest.raises(ValueError, match="not both"):
        ga.ImageFolder(tmp_path, extensions=(".jpg",), is_valid_file=lambda p: True)


def test_non_jpeg_files_are_reported_when_the_loader_is_made(tmp_path, rng):
    make_folder(str(tmp_path), rng)
    PIL.fromarray(photo(rng, 20, 20)).save(tmp_path / "dog" / "extra.png")
    folder = ga.ImageFolder(tmp_path)
    with pytest.raises(ValueError, match=r"1 \.png \(e\.g\. '.*extra\.png'\).*extensions=ga\.JPEG_EXTENSIONS"):
        ga.PinnedLoader(folder, 4, transform=TRAIN, device="cpu")
    jpeg_only = ga.ImageFolder(tmp_path, extensions=ga.JPEG_EXTENSIONS)
    assert len(jpeg_only) == len(folder) - 1
    ga.PinnedLoader(jpeg_only, 4, transform=TRAIN, device="cpu")


# ================================================================ sampling

def test_random_resized_crop_draws_torchvisions_distribution(rng):
    """Crops drawn for many samples against torchvision's get_params: the
    same bounds, and the same distribution of area, aspect ratio and
    position (means and quartiles within sampling error)."""
    width, height = 500, 375
    t = ga.RandomResizedCrop(224)
    ours = np.array([ga.images.image_geometry(width, height, t, index=i, seed=3)["crop"] for i in range(4000)])
    torch.manual_seed(int(rng.integers(1 << 30)))
    img = torch.zeros(3, height, width, dtype=torch.uint8)
    theirs = np.array([T.RandomResizedCrop.get_params(img, [0.08, 1.0], [3 / 4, 4 / 3]) for _ in range(4000)])
    for crops in (ours, theirs):
        top, left, h, w = crops.T
        assert (top >= 0).all() and (left >= 0).all() and (top + h <= height).all() and (left + w <= width).all()
    for stat in (lambda c: c[:, 2] * c[:, 3] / (width * height), lambda c: np.log(c[:, 3] / c[:, 2]),
                 lambda c: c[:, 0] + c[:, 2] / 2, lambda c: c[:, 1] + c[:, 3] / 2):
        a, b = stat(ours), stat(theirs)
        spread = np.std(b) / math.sqrt(len(b))
        assert abs(a.mean() - b.mean()) < 5 * spread * math.sqrt(2), (a.mean(), b.mean())
        for q in (25, 50, 75):
            assert abs(np.percentile(a, q) - np.percentile(b, q)) < 0.08 * (b.max() - b.min())


def test_random_resized_crop_fallback_is_torchvisions():
    """An aspect ratio no try can meet: the largest centered crop within the
    ratios, exactly as torchvision computes it."""
    img = torch.zeros(3, 30, 900, dtype=torch.uint8)
    t = ga.RandomResizedCrop(16, scale=(0.9, 1.0), ratio=(0.5, 2.0))
    expected = T.RandomResizedCrop.get_params(img, [0.9, 1.0], [0.5, 2.0])
    for i in range(20):
        assert ga.images.image_geometry(900, 30, t, index=i)["crop"] == tuple(expected)


def test_seeded_per_sample_and_epoch():
    t = ga.Compose([ga.RandomResizedCrop(64), ga.RandomHorizontalFlip()])

    def draw(**kw):
        g = ga.images.image_geometry(640, 480, t, **kw)
        return g["crop"], g["flip"]

    assert draw(index=5, epoch=2, seed=1) == draw(index=5, epoch=2, seed=1)
    per_epoch = {draw(index=5, epoch=e, seed=1) for e in range(20)}
    per_index = {draw(index=i, epoch=2, seed=1) for i in range(20)}
    per_seed = {draw(index=5, epoch=2, seed=s) for s in range(20)}
    assert len(per_epoch) > 15 and len(per_index) > 15 and len(per_seed) > 15
    flips = [draw(index=i, seed=9)[1] for i in range(2000)]
    assert 0.45 < np.mean(flips) < 0.55


# ================================================================ pixels

@pytest.mark.parametrize("subsampling", [0, 1, 2])  # 4:4:4, 4:2:2, 4:2:0
def test_training_crops_match_torchvision(rng, subsampling):
    for k in range(12):
        img = photo(rng, int(rng.integers(150, 520)), int(rng.integers(150, 520)))
        data = jpeg_bytes(img, quality=int(rng.integers(75, 96)), subsampling=subsampling)
        size = (int(rng.integers(17, 230)), int(rng.integers(17, 230)))
        t = ga.Compose([ga.RandomResizedCrop(size), ga.RandomHorizontalFlip()])
        image, g = ga._C._LoaderIter.decode_image(data, ga.images._Pipeline(t).spec, k, 3)
        assert image.shape == size + (3,)
        ref = reference_crop(data, g, size)
        assert psnr(image, ref) >= 35
        # at full scale the crop's decode is the full decode's pixels: the
        # resize's rounding apart, torchvision's own result
        exact = ga.decode_image(data, t, index=k, epoch=3, dct_scaling=False)
        assert np.abs(exact.astype(int) - ref.astype(int)).max() <= 2


def test_dct_scaled_decode_still_matches_torchvision(rng):
    """A crop at least twice the output size decodes at a reduced DCT scale:
    still within the quality goal."""
    img = photo(rng, 900, 1300)
    data = jpeg_bytes(img, quality=90)
    t = ga.RandomResizedCrop(64, scale=(0.5, 1.0))
    scores = []
    for k in range(8):
        image, g = ga._C._LoaderIter.decode_image(data, ga.images._Pipeline(t).spec, k)
        assert g["crop"][2] >= 128 and g["crop"][3] >= 128  # scaled by 1/2 at least
        scores.append(psnr(image, reference_crop(data, g, (64, 64))))
    assert min(scores) >= 35, scores


@pytest.mark.parametrize("side", [(256, 300), (500, 375), (180, 200), (90, 300)])
def test_evaluation_pipeline_matches_torchvision(rng, side):
    """Resize(256) + CenterCrop(224), zero padding included where the
    resized image is smaller than the crop."""
    img = photo(rng, *side)
    data = jpeg_bytes(img, quality=92)
    ours = ga.decode_image(data, ga.Compose([ga.Resize(256), ga.CenterCrop(224)]))
    full = torch.from_numpy(np.array(PIL.open(io.BytesIO(data)))).permute(2, 0, 1)
    ref = F.center_crop(F.resize(full, 256, antialias=True), 224).permute(1, 2, 0).numpy()
    assert ours.shape == ref.shape
    assert psnr(ours, ref) >= 35
    small = ga.decode_image(data, ga.CenterCrop((400, 420)))  # larger than the image: padded
    ref = F.center_crop(full, [400, 420]).permute(1, 2, 0).numpy()
    np.testing.assert_array_equal(small == 0, ref == 0) if side[0] > 1 else None
    assert psnr(small, ref) >= 35


def test_full_size_decode_is_libjpegs(rng):
    img = photo(rng, 123, 77)
    data = jpeg_bytes(img, quality=85)
    ours = ga.decode_image(data)
    np.testing.assert_array_equal(ours, np.array(PIL.open(io.BytesIO(data))))


def test_grayscale_becomes_three_equal_channels(rng):
    gray = photo(rng, 200, 150)[:, :, 0]
    buf = io.BytesIO()
    PIL.fromarray(gray, "L").save(buf, format="JPEG", quality=90)
    data = buf.getvalue()
    image, g = ga._C._LoaderIter.decode_image(data, ga.images._Pipeline(TRAIN).spec, 1)
    assert (image[..., 0] == image[..., 1]).all() and (image[..., 1] == image[..., 2]).all()
    assert psnr(image, reference_crop(data, g, (224, 224))) >= 35


def test_cmyk_becomes_rgb_as_pil_converts_it(rng):
    rgb = PIL.fromarray(photo(rng, 160, 210))
    buf = io.BytesIO()
    rgb.convert("CMYK").save(buf, format="JPEG", quality=95)
    data = buf.getvalue()
    assert PIL.open(io.BytesIO(data)).mode == "CMYK"
    image, g = ga._C._LoaderIter.decode_image(data, ga.images._Pipeline(TRAIN).spec, 2)
    assert psnr(image, reference_crop(data, g, (224, 224))) >= 35


@pytest.mark.parametrize("save", [{"progressive": True}, {"restart_marker_blocks": 3},
                                  {"restart_marker_rows": 1}, {"optimize": True}])
def test_progressive_and_restart_markers(rng, save):
    img = photo(rng, 300, 410)
    try:
        data = jpeg_bytes(img, quality=90, **save)
    except (TypeError, ValueError, OSError):
        pytest.skip("this Pillow cannot write %s" % save)
    for k in range(6):
        image, g = ga._C._LoaderIter.decode_image(data, ga.images._Pipeline(TRAIN).spec, k)
        assert psnr(image, reference_crop(data, g, (224, 224))) >= 35


def test_exif_orientation_is_left_as_stored(rng):
    """Like torchvision's ImageFolder (PIL's loader) and decode_jpeg's
    default: the pixels as stored, the EXIF orientation tag not applied."""
    img = PIL.fromarray(photo(rng, 100, 160))
    exif = PIL.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise to display
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=95, exif=exif.tobytes())
    ours = ga.decode_image(buf.getvalue())
    assert ours.shape == (100, 160, 3)
    assert psnr(ours, np.array(PIL.open(io.BytesIO(buf.getvalue())))) > 60


# ================================================================ bad files

def damaged_files(rng, folder):
    """name -> (bytes, what the error says)."""
    good = jpeg_bytes(photo(rng, 240, 320), quality=90)
    corrupt = bytearray(good)
    scan = good.index(b"\xff\xda")
    for k in range(30):  # markers the entropy decoder cannot take
        at = scan + 600 + 97 * k
        corrupt[at:at + 2] = b"\xff\xd3" if k % 2 else b"\xff\xc4"
    return {
        "truncated.jpg": (good[: len(good) * 2 // 3], "Premature end of JPEG file|damaged"),
        "header_only.jpg": (good[: scan + 20], "damaged|Premature"),
        "corrupt.jpg": (bytes(corrupt), "damaged|Corrupt"),
        "empty.jpg": (b"", "empty"),
        "text.jpg": (b"hello, this is not an image", "not a JPEG file: it starts with bytes 68 65 6c"),
        "image.jpg": (open_png(rng), "PNG image.*decodes JPEG only"),
    }


def open_png(rng):
    buf = io.BytesIO()
    PIL.fromarray(photo(rng, 20, 20)).save(buf, format="PNG")
    return buf.getvalue()


def test_damaged_files_raise_oserror_naming_them(rng, tmp_path):
    for name, (data, message) in damaged_files(rng, tmp_path).items():
        with pytest.raises(OSError, match=message):
            ga.decode_image(data, TRAIN)
        path = tmp_path / name
        path.write_bytes(data)
        loader = ga.PinnedLoader([(str(path), 0)], 1, transform=TRAIN, device="cpu")
        with pytest.raises(OSError, match=r"'%s' \(sample 0\).*(%s).*on_error=\"skip\"" % (path, message)):
            list(loader)


def test_truncated_below_the_crop_is_still_caught(rng):
    """Decoding stops after the crop's last row; a file cut below it is
    found by its missing end marker."""
    data = jpeg_bytes(photo(rng, 400, 300), quality=90)
    cut = data[: len(data) - 4000]
    top = ga.Compose([ga.Resize((400, 300)), ga.CenterCrop((10, 300))])  # rows 195..205 only
    ga.decode_image(data, top)
    with pytest.raises(OSError, match="Premature end"):
        ga.decode_image(cut, top)


def test_skip_leaves_bad_files_out_and_counts_them(rng, tmp_path):
    pairs = []
    bad = damaged_files(rng, tmp_path)
    for i in range(23):
        path = tmp_path / ("%02d.jpg" % i)
        if i % 4 == 1:
            path.write_bytes(list(bad.values())[i // 4][0])
        else:
            PIL.fromarray(np.full((40 + i, 50, 3), 10 * i, np.uint8)).save(path, quality=95)
        pairs.append((str(path), i))
    pairs.append((str(tmp_path / "missing.jpg"), 99))
    loader = ga.PinnedLoader(pairs, 5, transform=ga.Resize((8, 8)), device="cpu", on_error="skip", num_threads=3)
    batches = list(loader)
    labels = np.concatenate([y.numpy() for _, y in batches])
    np.testing.assert_array_equal(labels, [i for i in range(23) if i % 4 != 1])
    for x, y in batches:
        for image, label in zip(x.numpy(), y.numpy()):
            assert abs(float(image.mean()) - 10 * label) < 3  # rows stay aligned with labels
    stats = loader.stats()
    assert stats["skipped"] == 7 and stats["samples"] == 17
    assert any("missing.jpg" in s and "No such file" in s for s in stats["skipped_files"])
    assert any("Premature end" in s for s in stats["skipped_files"])


def test_a_batch_of_only_bad_files_is_passed_over(tmp_path, rng):
    pairs = [(str(tmp_path / ("bad%d.jpg" % i)), i) for i in range(4)]
    for p, _ in pairs:
        open(p, "wb").write(b"garbage")
    good = tmp_path / "good.jpg"
    PIL.fromarray(photo(rng, 30, 30)).save(good)
    loader = ga.PinnedLoader(pairs + [(str(good), 7)], 4, transform=ga.Resize((8, 8)), device="cpu",
                             on_error="skip")
    batches = list(loader)
    assert len(batches) == 1 and batches[0][1].tolist() == [7]
    assert loader.stats()["skipped"] == 4


# ================================================================ the loader

def write_dataset(root, rng, n=29):
    pairs = []
    for i in range(n):
        path = os.path.join(root, "%03d.jpg" % i)
        PIL.fromarray(photo(rng, int(rng.integers(60, 200)), int(rng.integers(60, 200)))).save(path, quality=90)
        pairs.append((path, i))
    return pairs


@pytest.mark.parametrize("dtype,layout", [("float32", "NCHW"), ("bfloat16", "NHWC"), ("float16", "NCHW")])
def test_loader_batches_are_the_decoded_samples_normalized(rng, tmp_path, dtype, layout):
    pairs = write_dataset(str(tmp_path), rng)
    geometry = ga.Compose([ga.RandomResizedCrop((40, 33)), ga.RandomHorizontalFlip()])
    transform = ga.Compose(geometry.transforms + [ga.ImageNormalize(MEAN, STD, dtype=dtype, layout=layout)])
    loader = ga.PinnedLoader(pairs, 6, shuffle=True, seed=4, transform=transform, device="cpu", num_threads=3)
    loader.set_epoch(2)
    seen = []
    tolerance = {"float32": 1e-6, "bfloat16": 1e-2, "float16": 2e-3}[dtype]
    for x, y in loader:
        assert x.shape[1:] == (3, 40, 33)
        if layout == "NHWC":
            assert x.is_contiguous(memory_format=torch.channels_last)
        for image, label in zip(x.float().numpy(), y.numpy()):
            decoded = ga.decode_image(pairs[label][0], geometry, index=label, epoch=2, seed=4)
            ref = (decoded / 255.0 - np.array(MEAN)) / np.array(STD)
            err = np.abs(image.transpose(1, 2, 0) - ref)
            assert (err <= tolerance * (1 + np.abs(ref))).all(), err.max()
        seen += y.tolist()
    assert sorted(seen) == list(range(len(pairs)))


def test_loader_epochs_reproducible_whatever_the_threads(rng, tmp_path):
    pairs = write_dataset(str(tmp_path), rng, n=17)
    t = ga.Compose([ga.RandomResizedCrop(24), ga.RandomHorizontalFlip()])

    def epoch(threads, e):
        loader = ga.PinnedLoader(pairs, 5, shuffle=True, seed=1, transform=t, device="cpu", num_threads=threads)
        loader.set_epoch(e)
        return [(x.numpy().copy(), y.numpy().copy()) for x, y in loader]

    a, b, c = epoch(1, 0), epoch(4, 0), epoch(2, 1)
    for (xa, ya), (xb, yb) in zip(a, b):
        np.testing.assert_array_equal(ya, yb)
        np.testing.assert_array_equal(xa, xb)
    first = {int(y): x for xs, ys in a for x, y in zip(xs, ys)}
    other = {int(y): x for xs, ys in c for x, y in zip(xs, ys)}
    assert sum(not np.array_equal(first[k], other[k]) for k in first) > 12  # new crops each epoch


def test_torchvision_image_folder_is_accepted_without_its_transform(tmp_path, rng):
    make_folder(str(tmp_path), rng)
    t = ga.Compose([ga.Resize(32), ga.CenterCrop(24)])
    loader = ga.PinnedLoader(tv.datasets.ImageFolder(str(tmp_path)), 4, transform=t, device="cpu")
    assert sum(len(y) for _, y in loader) == len(loader._image_samples)
    with pytest.raises(ValueError, match="not its transform="):
        ga.PinnedLoader(tv.datasets.ImageFolder(str(tmp_path), transform=lambda x: x), 4, transform=t)


def test_transform_errors(tmp_path, rng):
    pairs = write_dataset(str(tmp_path), rng, n=2)
    norm = ga.ImageNormalize(MEAN, STD)
    cases = [
        (None, ValueError, "needs transform="),
        (norm, ValueError, "gives no image size"),
        (ga.Resize(256), ValueError, "need one size"),
        (ga.Compose([norm, ga.CenterCrop(3)]), ValueError, "ImageNormalize must come last"),
        (ga.Compose([ga.CenterCrop(3), ga.Resize(5)]), ValueError, "Resize must come once, before CenterCrop"),
        (ga.Compose([ga.RandomResizedCrop(3), ga.CenterCrop(3)]), ValueError, "CenterCrop must come once"),
        (ga.Compose([ga.RandomResizedCrop(3), lambda x: x]), TypeError, "not one of gpuaccel's image transforms"),
    ]
    for transform, error, message in cases:
        with pytest.raises(error, match=message):
            ga.PinnedLoader(pairs, 2, transform=transform, device="cpu")
    with pytest.raises(ValueError, match="scale must be"):
        ga.RandomResizedCrop(8, scale=(0.5, 0.1))
    with pytest.raises(ValueError, match="only bilinear"):
        ga.Resize(8, interpolation="nearest")
    with pytest.raises(ValueError, match="only antialias=True"):
        ga.RandomResizedCrop(8, antialias=False)
    with pytest.raises(TypeError, match="size must be an int"):
        ga.CenterCrop("big")
    with pytest.raises(ValueError, match="on_error must be"):
        ga.PinnedLoader(pairs, 2, transform=ga.CenterCrop(3), on_error="ignore")
    with pytest.raises(ValueError, match="decode must be"):
        ga.PinnedLoader(pairs, 2, transform=ga.CenterCrop(3), decode="nvjpeg")
    with pytest.raises(TypeError, match=r"\[1\] must be a \(path, label\) pair"):
        ga.PinnedLoader([pairs[0], ("x",)], 2, transform=ga.CenterCrop(3))
    with pytest.raises(TypeError, match="the label must be an int"):
        ga.PinnedLoader([(pairs[0][0], "cat")], 2, transform=ga.CenterCrop(3))


# ================================================================ DataLoader

class _Images(torch.utils.data.Dataset):
    def __init__(self, images, channels_first):
        self.images, self.channels_first = images, channels_first

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        x = torch.from_numpy(self.images[i])
        return (x.permute(2, 0, 1) if self.channels_first else x), i


@pytest.mark.parametrize("channels_first,layout", [(False, "NCHW"), (True, "NCHW"), (True, "NHWC")])
def test_over_a_dataloader(rng, channels_first, layout):
    images = rng.integers(0, 256, size=(45, 13, 11, 3), dtype=np.uint8)
    dl = torch.utils.data.DataLoader(_Images(images, channels_first), batch_size=8, shuffle=True,
                                     num_workers=0, generator=torch.Generator().manual_seed(1))
    loader = ga.PinnedLoader(dl, device="cpu", transform=ga.ImageNormalize(MEAN, STD, dtype="float32",
                                                                           layout=layout))
    assert len(loader) == 6
    seen = []
    for x, y in loader:
        assert x.shape[1:] == (3, 13, 11) and x.dtype == torch.float32
        ref = (images[y.numpy()] / 255.0 - np.array(MEAN)) / np.array(STD)
        err = np.abs(x.numpy().transpose(0, 2, 3, 1) - ref)
        assert (err <= 1e-6 * (1 + np.abs(ref))).all()
        seen += y.tolist()
    assert sorted(seen) == list(range(45))
    assert loader.stats()["samples"] == 45


def test_over_a_dataloader_keeps_the_batch_structure(rng):
    data = [torch.arange(5), torch.ones(5, 2)]
    dl = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(*data), batch_size=2)
    batches = list(ga.PinnedLoader(dl, device="cpu"))
    assert all(isinstance(b, list) and len(b) == 2 for b in batches)
    np.testing.assert_array_equal(torch.cat([b[0] for b in batches]).numpy(), np.arange(5))
    with pytest.raises(ValueError, match="set batch_size, shuffle there"):
        ga.PinnedLoader(dl, 4, shuffle=True)
    dl = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.ones(4, 2, 2, 3)), batch_size=2)
    with pytest.raises(ValueError, match="must be uint8 images"):
        list(ga.PinnedLoader(dl, device="cpu", transform=ga.ImageNormalize(0, 1)))
