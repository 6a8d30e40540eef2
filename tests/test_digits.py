"""Digit loaders (MNIST, USPS, MNIST-M) and the LeNet backbone."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from eada.data.base import TensorDomain
from eada.data.digits import (
    DIGIT_DOMAINS,
    load_digits,
    read_mnist_idx,
    read_mnist_m,
    read_usps,
)
from eada.models.base import EnergyNet
from eada.models.lenet import lenet, lenet_backbone
from support import real_data

DIGITS = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "digits"
USPS_TRAIN_COUNTS = [1194, 1005, 731, 658, 652, 556, 664, 645, 542, 644]


@pytest.fixture(scope="module")
def digits_root() -> Path:
    return real_data("digits")


@pytest.fixture(scope="module")
def mnist_m(digits_root: Path) -> TensorDomain:
    real_data("digits/mnist_m")  # a part the GPU check's carried data may leave out
    return load_digits("mnist_m", digits_root, image_size=32, channels=3)


def _check_domain(dom: TensorDomain, n: int, channels: int, size: int) -> None:
    assert len(dom) == n
    assert dom.x.shape == (n, channels, size, size)
    assert dom.x.dtype == torch.float32
    assert dom.y.shape == (n,)
    assert dom.y.dtype == torch.int64
    assert dom.classes == [str(d) for d in range(10)]
    assert float(dom.x.min()) >= -1.0 and float(dom.x.max()) <= 1.0
    # real images span (almost) the whole range: background and strokes both present
    assert float(dom.x.min()) < -0.9 and float(dom.x.max()) > 0.9
    assert int(dom.y.min()) == 0 and int(dom.y.max()) == 9
    assert set(torch.unique(dom.y).tolist()) == set(range(10))


# ---------------------------------------------------------------- real data


@pytest.mark.data
def test_mnist_real(digits_root: Path) -> None:
    dom = load_digits("mnist", digits_root)
    _check_domain(dom, 10_000, 1, 28)
    assert dom.name == "mnist"
    assert load_digits("mnist", digits_root, split="test").x.shape == dom.x.shape
    # the first MNIST test digits are 7, 2, 1, 0, 4
    assert dom.y[:5].tolist() == [7, 2, 1, 0, 4]
    with pytest.raises(ValueError, match="split 'train' is not available"):
        load_digits("mnist", digits_root, split="train")


@pytest.mark.data
def test_mnist_raw_reader(digits_root: Path) -> None:
    images, labels = read_mnist_idx(
        digits_root / "mnist" / "t10k-images-idx3-ubyte.gz",
        digits_root / "mnist" / "t10k-labels-idx1-ubyte.gz",
    )
    assert images.shape == (10_000, 28, 28) and images.dtype == np.uint8
    assert labels.shape == (10_000,) and labels.dtype == np.int64
    assert images.max() == 255 and images.min() == 0


@pytest.mark.data
def test_mnist_to_rgb_32(digits_root: Path) -> None:
    dom = load_digits("mnist", digits_root, image_size=32, channels=3)
    _check_domain(dom, 10_000, 3, 32)
    # grey -> RGB replicates the channel
    assert torch.equal(dom.x[:, 0], dom.x[:, 1]) and torch.equal(dom.x[:, 1], dom.x[:, 2])


@pytest.mark.data
def test_usps_real(digits_root: Path) -> None:
    train = load_digits("usps", digits_root, split="train", image_size=16)
    test = load_digits("usps", digits_root, split="test", image_size=16)
    _check_domain(train, 7_291, 1, 16)
    _check_domain(test, 2_007, 1, 16)
    assert torch.bincount(train.y, minlength=10).tolist() == USPS_TRAIN_COUNTS
    both = load_digits("usps", digits_root, image_size=16)
    assert len(both) == 9_298
    assert torch.equal(both.x[:7_291], train.x) and torch.equal(both.x[7_291:], test.x)
    assert torch.equal(both.y, torch.cat([train.y, test.y]))
    # default: resized to 28 x 28
    _check_domain(load_digits("usps", digits_root, split="test"), 2_007, 1, 28)


@pytest.mark.data
def test_usps_raw_reader(digits_root: Path) -> None:
    images, labels = read_usps(digits_root / "usps" / "zip.test.gz")
    assert images.shape == (2_007, 16, 16) and images.dtype == np.uint8
    assert labels.dtype == np.int64
    assert images.min() == 0 and images.max() == 255
    with gzip.open(digits_root / "usps" / "zip.test.gz", "rt") as fh:
        first = [float(v) for v in fh.readline().split()]
    assert labels[0] == int(first[0])
    expected = np.rint((np.asarray(first[1:]) + 1.0) * 127.5).astype(np.uint8)
    np.testing.assert_array_equal(images[0].ravel(), expected)


@pytest.mark.data
def test_mnist_m_real(digits_root: Path, mnist_m: TensorDomain) -> None:
    _check_domain(mnist_m, 9_001, 3, 32)
    with open(digits_root / "mnist_m" / "mnist_m_test_labels.txt") as fh:
        first = [int(next(fh).split()[1]) for _ in range(20)]
    assert mnist_m.y[:20].tolist() == first
    # the first image as decoded directly by Pillow
    with Image.open(digits_root / "mnist_m" / "mnist_m_test" / "00000000.png") as im:
        raw = torch.from_numpy(np.array(im.convert("RGB"))).permute(2, 0, 1).float() / 255
    torch.testing.assert_close(mnist_m.x[0], (raw - 0.5) / 0.5)
    with pytest.raises(ValueError, match="split 'train' is not available"):
        load_digits("mnist_m", digits_root, split="train")


@pytest.mark.data
def test_mnist_m_grey_28(digits_root: Path, mnist_m: TensorDomain) -> None:
    grey = load_digits("mnist_m", digits_root, image_size=28, channels=1)
    _check_domain(grey, 9_001, 1, 28)
    assert torch.equal(grey.y, mnist_m.y)


@pytest.mark.data
def test_load_digits_errors(digits_root: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"unknown digit domain 'svhn'.*mnist, usps, mnist_m"):
        load_digits("svhn", digits_root)
    with pytest.raises(ValueError, match="unknown split"):
        load_digits("usps", digits_root, split="val")
    with pytest.raises(ValueError, match="channels must be 1 or 3"):
        load_digits("usps", digits_root, channels=2)
    missing = tmp_path / "nowhere"
    with pytest.raises(FileNotFoundError, match="nowhere"):
        load_digits("mnist", missing)
    with pytest.raises(FileNotFoundError, match=r"t10k-images-idx3-ubyte\.gz"):
        load_digits("mnist", tmp_path)
    with pytest.raises(FileNotFoundError, match=r"zip\.train\.gz"):
        load_digits("usps", tmp_path)


def test_domain_names() -> None:
    assert DIGIT_DOMAINS == ("mnist", "usps", "mnist_m")


# ---------------------------------------------------------------- synthetic files


def _idx_bytes(array: np.ndarray) -> bytes:
    header = struct.pack(">HBB", 0, 0x08, array.ndim)
    header += struct.pack(f">{array.ndim}I", *array.shape)
    return header + array.astype(np.uint8).tobytes()


def _write_gz(path: Path, data: bytes) -> Path:
    with gzip.open(path, "wb") as fh:
        fh.write(data)
    return path


@pytest.fixture
def tiny_idx(tmp_path: Path) -> tuple[np.ndarray, np.ndarray, Path, Path]:
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(5, 7, 6), dtype=np.uint8)
    labels = np.array([3, 1, 4, 1, 5], dtype=np.uint8)
    img_path = _write_gz(tmp_path / "img.gz", _idx_bytes(images))
    lbl_path = _write_gz(tmp_path / "lbl.gz", _idx_bytes(labels))
    return images, labels, img_path, lbl_path


def test_idx_round_trip(tiny_idx: tuple[np.ndarray, np.ndarray, Path, Path]) -> None:
    images, labels, img_path, lbl_path = tiny_idx
    got_images, got_labels = read_mnist_idx(img_path, lbl_path)
    assert got_images.dtype == np.uint8 and got_labels.dtype == np.int64
    np.testing.assert_array_equal(got_images, images)
    np.testing.assert_array_equal(got_labels, labels.astype(np.int64))


def test_idx_bad_magic(tmp_path: Path, tiny_idx: tuple[np.ndarray, np.ndarray, Path, Path]) -> None:
    images, _, _, lbl_path = tiny_idx
    raw = bytearray(_idx_bytes(images))
    raw[2] = 0x0D  # float type code instead of unsigned byte
    bad = _write_gz(tmp_path / "bad-magic.gz", bytes(raw))
    with pytest.raises(ValueError, match=r"bad-magic\.gz.*bad IDX magic number 0x00000d03"):
        read_mnist_idx(bad, lbl_path)
    # an images file given as labels: wrong number of dims
    _, _, img_path, _ = tiny_idx
    with pytest.raises(ValueError, match=r"img\.gz.*bad IDX magic number"):
        read_mnist_idx(img_path, img_path)


def test_idx_truncated(tmp_path: Path, tiny_idx: tuple[np.ndarray, np.ndarray, Path, Path]) -> None:
    images, _, _, lbl_path = tiny_idx
    raw = _idx_bytes(images)
    short = _write_gz(tmp_path / "short.gz", raw[:-10])
    with pytest.raises(ValueError, match=r"short\.gz.*truncated"):
        read_mnist_idx(short, lbl_path)
    header_only = _write_gz(tmp_path / "header.gz", raw[:9])
    with pytest.raises(ValueError, match=r"header\.gz.*truncated"):
        read_mnist_idx(header_only, lbl_path)
    # a cut gzip stream is reported as a ValueError naming the file, too
    cut = tmp_path / "cut.gz"
    cut.write_bytes(gzip.compress(raw)[:-12])
    with pytest.raises(ValueError, match=r"cut\.gz"):
        read_mnist_idx(cut, lbl_path)


def test_idx_count_mismatch(
    tmp_path: Path, tiny_idx: tuple[np.ndarray, np.ndarray, Path, Path]
) -> None:
    _, _, img_path, _ = tiny_idx
    four = _write_gz(tmp_path / "four.gz", _idx_bytes(np.array([1, 2, 3, 4], dtype=np.uint8)))
    with pytest.raises(ValueError, match=r"img\.gz holds 5 images but .*four\.gz holds 4"):
        read_mnist_idx(img_path, four)


def _usps_line(label: int, values: np.ndarray) -> str:
    return " ".join([f"{label:.4f}", *(f"{v:.4f}" for v in values)]) + " \n"


def test_usps_synthetic(tmp_path: Path) -> None:
    ramp = np.linspace(-1.0, 1.0, 256)
    text = _usps_line(3, ramp) + _usps_line(0, -ramp)
    path = _write_gz(tmp_path / "zip.tiny.gz", text.encode())
    images, labels = read_usps(path)
    assert images.shape == (2, 16, 16) and images.dtype == np.uint8
    assert labels.tolist() == [3, 0]
    assert images[0, 0, 0] == 0 and images[0, -1, -1] == 255
    assert images[1, 0, 0] == 255 and images[1, -1, -1] == 0


def test_usps_short_line(tmp_path: Path) -> None:
    good = _usps_line(1, np.zeros(256))
    bad = _usps_line(2, np.zeros(199))  # digit + 199 values = 200 values
    path = _write_gz(tmp_path / "zip.bad.gz", (good + good + bad + good).encode())
    with pytest.raises(ValueError, match=r"zip\.bad\.gz, line 3: expected 257 values.*found 200"):
        read_usps(path)


def test_usps_bad_values(tmp_path: Path) -> None:
    good = _usps_line(1, np.zeros(256))
    text = good + good.replace("0.0000", "abc", 1)
    path = _write_gz(tmp_path / "zip.nan.gz", text.encode())
    with pytest.raises(ValueError, match=r"zip\.nan\.gz, line 2: non-numeric value 'abc'"):
        read_usps(path)
    path = _write_gz(tmp_path / "zip.lbl.gz", (good + _usps_line(12, np.zeros(256))).encode())
    with pytest.raises(ValueError, match=r"zip\.lbl\.gz, line 2: label .* not a digit"):
        read_usps(path)


def _write_pngs(folder: Path, n: int) -> list[int]:
    folder.mkdir()
    rng = np.random.default_rng(1)
    labels = [int(v) for v in rng.integers(0, 10, size=n)]
    for i in range(n):
        pixels = rng.integers(0, 256, size=(32, 32, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(folder / f"{i:08d}.png")
    return labels


def test_mnist_m_synthetic(tmp_path: Path) -> None:
    labels = _write_pngs(tmp_path / "imgs", 4)
    lines = [f"{i:08d}.png {lab}" for i, lab in enumerate(labels)]
    labels_file = tmp_path / "labels.txt"
    labels_file.write_text("\n".join(reversed(lines)) + "\n")
    images, got = read_mnist_m(tmp_path / "imgs", labels_file)
    assert images.shape == (4, 32, 32, 3) and images.dtype == np.uint8
    assert got.dtype == np.int64 and got.tolist() == labels[::-1]
    with Image.open(tmp_path / "imgs" / "00000003.png") as im:
        np.testing.assert_array_equal(images[0], np.asarray(im))


def test_mnist_m_missing_png(tmp_path: Path) -> None:
    labels = _write_pngs(tmp_path / "imgs", 2)
    labels_file = tmp_path / "labels.txt"
    labels_file.write_text(f"00000000.png {labels[0]}\n00000042.png 5\n")
    with pytest.raises(FileNotFoundError, match=r"00000042\.png listed in .*labels\.txt"):
        read_mnist_m(tmp_path / "imgs", labels_file)


def test_mnist_m_malformed_labels(tmp_path: Path) -> None:
    _write_pngs(tmp_path / "imgs", 1)
    labels_file = tmp_path / "labels.txt"
    labels_file.write_text("00000000.png\n")
    with pytest.raises(ValueError, match=r"labels\.txt, line 1: expected 'file label'"):
        read_mnist_m(tmp_path / "imgs", labels_file)


def _fake_root(tmp_path: Path) -> tuple[Path, np.ndarray, np.ndarray]:
    """A tiny ``digits`` folder: 3 MNIST images, 3 MNIST-M images."""
    root = tmp_path / "digits"
    rng = np.random.default_rng(2)
    (root / "mnist").mkdir(parents=True)
    grey = rng.integers(0, 256, size=(3, 28, 28), dtype=np.uint8)
    _write_gz(root / "mnist" / "t10k-images-idx3-ubyte.gz", _idx_bytes(grey))
    _write_gz(root / "mnist" / "t10k-labels-idx1-ubyte.gz", _idx_bytes(np.array([0, 9, 4])))
    folder = root / "mnist_m" / "mnist_m_test"
    folder.mkdir(parents=True)
    rgb = rng.integers(0, 256, size=(3, 32, 32, 3), dtype=np.uint8)
    for i in range(3):
        Image.fromarray(rgb[i]).save(folder / f"{i:08d}.png")
    (root / "mnist_m" / "mnist_m_test_labels.txt").write_text(
        "00000000.png 1\n00000001.png 2\n00000002.png 3\n"
    )
    return root, grey, rgb


def test_load_digits_conversions(tmp_path: Path) -> None:
    root, grey, rgb = _fake_root(tmp_path)
    # no resizing: exact (x / 255 - 0.5) / 0.5
    dom = load_digits("mnist", root)
    assert dom.y.tolist() == [0, 9, 4]
    expected = (torch.from_numpy(grey).float() / 255 - 0.5) / 0.5
    torch.testing.assert_close(dom.x[:, 0], expected)
    # RGB -> grey with the luma weights
    dom = load_digits("mnist_m", root, image_size=32, channels=1)
    assert dom.x.shape == (3, 1, 32, 32) and dom.y.tolist() == [1, 2, 3]
    rgb01 = torch.from_numpy(rgb).float() / 255
    luma = 0.299 * rgb01[..., 0] + 0.587 * rgb01[..., 1] + 0.114 * rgb01[..., 2]
    torch.testing.assert_close(dom.x[:, 0], (luma - 0.5) / 0.5)
    # RGB kept, channel-first
    dom = load_digits("mnist_m", root, image_size=32, channels=3)
    torch.testing.assert_close(dom.x, (rgb01.permute(0, 3, 1, 2) - 0.5) / 0.5)
    # downsizing keeps values in [-1, 1]
    dom = load_digits("mnist_m", root, image_size=20, channels=3)
    assert dom.x.shape == (3, 3, 20, 20)
    assert float(dom.x.min()) >= -1.0 and float(dom.x.max()) <= 1.0
    # grey -> RGB after resizing
    dom = load_digits("mnist", root, image_size=32, channels=3)
    assert dom.x.shape == (3, 3, 32, 32) and torch.equal(dom.x[:, 0], dom.x[:, 2])


def test_load_digits_resize_constant(tmp_path: Path) -> None:
    root = tmp_path / "digits"
    (root / "mnist").mkdir(parents=True)
    images = np.full((2, 28, 28), 51, dtype=np.uint8)  # 0.2 -> -0.6 after normalisation
    _write_gz(root / "mnist" / "t10k-images-idx3-ubyte.gz", _idx_bytes(images))
    _write_gz(root / "mnist" / "t10k-labels-idx1-ubyte.gz", _idx_bytes(np.array([1, 2])))
    for size in (20, 32, 64):
        dom = load_digits("mnist", root, image_size=size)
        torch.testing.assert_close(dom.x, torch.full((2, 1, size, size), -0.6))


# ---------------------------------------------------------------- LeNet


@pytest.mark.parametrize(("channels", "size"), [(1, 28), (3, 28), (3, 32), (1, 20)])
def test_lenet_shapes(channels: int, size: int) -> None:
    torch.manual_seed(0)
    net = lenet(num_classes=10, in_channels=channels, image_size=size)
    assert isinstance(net, EnergyNet)
    x = torch.randn(4, channels, size, size)
    assert net(x).shape == (4, 10)
    assert net.embed(x).shape == (4, 100)


def test_lenet_backbone() -> None:
    backbone, dim = lenet_backbone(in_channels=3, image_size=32)
    assert dim == 100
    assert backbone(torch.randn(2, 3, 32, 32)).shape == (2, 100)
    assert lenet(num_classes=5).head.out_features == 5
    assert not any(isinstance(m, torch.nn.Dropout) for m in backbone.modules())


def test_lenet_too_small() -> None:
    with pytest.raises(ValueError, match="image_size >= 20"):
        lenet(image_size=16)
    with pytest.raises(ValueError, match="image_size >= 20"):
        lenet_backbone(image_size=19)
