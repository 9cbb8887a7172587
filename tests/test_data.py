"""Tests of tfsync.base.data: npz and IDX loading, the bundled sample, default-path order."""
import gzip
import hashlib
import logging
from pathlib import Path

import numpy as np
import pytest

from tfsync.base import data

pytestmark = pytest.mark.unit

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
needs_shared = pytest.mark.skipif(not (SHARED / "mnist.npz").is_file(),
                                  reason="../shared/data not present")


@pytest.fixture(scope="module")
def sample():
    with np.load(data.BUNDLED_SAMPLE) as d:
        return {k: d[k] for k in data.KEYS}


def _small_npz(path, sample, n=50):
    np.savez(path, x_train=sample["x_train"][:n], y_train=sample["y_train"][:n],
             x_test=sample["x_test"][:n], y_test=sample["y_test"][:n])
    return path


def test_bundled_sample_is_balanced_uint8_and_small(sample):
    assert data.BUNDLED_SAMPLE.stat().st_size < 2.5e6
    assert sample["x_train"].shape == (6000, 28, 28) and sample["x_test"].shape == (1000, 28, 28)
    for k in data.KEYS:
        assert sample[k].dtype == np.uint8
    assert np.bincount(sample["y_train"], minlength=10).tolist() == [600] * 10
    assert np.bincount(sample["y_test"], minlength=10).tolist() == [100] * 10
    # shuffled, not sorted by class
    assert (np.diff(sample["y_train"].astype(int)) != 0).mean() > 0.5


@needs_shared
def test_bundled_sample_is_real_mnist(sample):
    with np.load(SHARED / "mnist.npz") as d:
        full = {hashlib.sha1(img.tobytes()).digest(): int(lab)
                for img, lab in zip(d["x_train"], d["y_train"])}
    for img, lab in zip(sample["x_train"][:500], sample["y_train"][:500]):
        assert full[hashlib.sha1(img.tobytes()).digest()] == lab


def test_load_npz_shapes_dtypes_ranges(tmp_path, sample):
    ds = data.load("mnist", _small_npz(tmp_path / "m.npz", sample))
    assert ds.x_train.shape == (50, 28, 28, 1) and ds.x_test.shape == (50, 28, 28, 1)
    assert ds.x_train.dtype == np.float32 and ds.y_train.dtype == np.int64
    assert ds.x_train.min() >= 0.0 and ds.x_train.max() == 1.0
    np.testing.assert_allclose(ds.x_train[..., 0] * 255, sample["x_train"][:50], atol=1e-3)
    np.testing.assert_array_equal(ds.y_test, sample["y_test"][:50])
    assert (ds.num_classes, ds.input_shape, ds.name) == (10, (28, 28, 1), "mnist")
    assert ds.source == str(tmp_path / "m.npz")
    with pytest.raises(ValueError):
        ds.x_train[0, 0, 0, 0] = 0.5  # read-only


def test_load_bundled_sample_and_keras_style_labels(tmp_path, sample):
    ds = data.load("mnist", data.BUNDLED_SAMPLE)
    assert ds.x_train.shape == (6000, 28, 28, 1) and ds.y_test.shape == (1000,)
    np.savez(tmp_path / "c.npz", x_train=np.zeros((4, 32, 32, 3), np.uint8),
             y_train=np.arange(4).reshape(4, 1), x_test=np.full((2, 32, 32, 3), 255, np.uint8),
             y_test=np.array([[9], [0]]))
    c = data.load("cifar10", tmp_path / "c.npz")
    assert c.x_test.shape == (2, 32, 32, 3) and float(c.x_test.max()) == 1.0
    assert c.y_train.tolist() == [0, 1, 2, 3] and c.y_test.dtype == np.int64


@needs_shared
def test_load_real_cifar10_subset():
    ds = data.load("cifar10", SHARED / "cifar10_subset.npz")
    assert ds.x_train.shape == (10000, 32, 32, 3) and ds.x_test.shape == (2000, 32, 32, 3)
    assert 0.0 <= ds.x_train.min() and ds.x_train.max() <= 1.0
    assert np.bincount(ds.y_train).tolist() == [1000] * 10


@pytest.mark.parametrize("gz", [False, True])
def test_idx_round_trip(tmp_path, sample, gz):
    names = {"x_train": "train-images-idx3-ubyte", "y_train": "train-labels-idx1-ubyte",
             "x_test": "t10k-images-idx3-ubyte", "y_test": "t10k-labels-idx1-ubyte"}
    part = {k: v[:1000] for k, v in sample.items()}
    for key, fname in names.items():
        data.write_idx(tmp_path / (fname + (".gz" if gz else "")), part[key])
    raw = (tmp_path / "train-images-idx3-ubyte").read_bytes() if not gz else \
        gzip.decompress((tmp_path / "train-images-idx3-ubyte.gz").read_bytes())
    assert raw[:4] == b"\x00\x00\x08\x03"  # magic: ubyte, 3 dims
    assert raw[4:16] == (1000).to_bytes(4, "big") + (28).to_bytes(4, "big") * 2
    ds = data.load("mnist", tmp_path)
    np.testing.assert_array_equal(ds.y_train, part["y_train"])
    np.testing.assert_array_equal(np.rint(ds.x_test[..., 0] * 255), part["x_test"])
    assert ds.source == str(tmp_path)


def test_idx_multibyte_big_endian(tmp_path):
    a = np.arange(-6, 6, dtype=np.int32).reshape(3, 4)
    data.write_idx(tmp_path / "a.idx", a)
    assert (tmp_path / "a.idx").read_bytes()[:12] == b"\x00\x00\x0c\x02" + b"\0\0\0\x03\0\0\0\x04"
    np.testing.assert_array_equal(data.read_idx(tmp_path / "a.idx"), a)


def test_idx_bad_magic_and_truncated(tmp_path, sample):
    for magic in (b"\x08\x03\x00\x00", b"\x01\x00\x08\x01", b"\x00\x01\x08\x01",
                  b"\x00\x00\x07\x01", b""):
        (tmp_path / "bad").write_bytes(magic + bytes(20) if magic else b"")
        with pytest.raises(data.DataError, match=r"bad magic number"):
            data.read_idx(tmp_path / "bad")
    data.write_idx(tmp_path / "t", sample["x_test"][:3])
    (tmp_path / "t").write_bytes((tmp_path / "t").read_bytes()[:-10])
    with pytest.raises(data.DataError, match="truncated"):
        data.read_idx(tmp_path / "t")


def test_idx_dir_missing_file(tmp_path, sample):
    data.write_idx(tmp_path / "train-images-idx3-ubyte", sample["x_train"][:5])
    with pytest.raises(data.DataError, match="t10k|train-labels"):
        data.load("mnist", tmp_path)


def test_errors_name_path_and_fix(tmp_path, sample):
    with pytest.raises(data.DataError) as e:
        data.load("mnist", tmp_path / "missing.npz")
    msg = str(e.value)
    assert "missing.npz" in msg and "no such file" in msg and "data.path" in msg
    assert "\n" not in msg
    (tmp_path / "corrupt.npz").write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(data.DataError, match="corrupt.npz: not a readable .npz"):
        data.load("mnist", tmp_path / "corrupt.npz")
    np.savez(tmp_path / "keys.npz", x_train=sample["x_train"][:2])
    with pytest.raises(data.DataError, match="missing keys y_train, x_test, y_test"):
        data.load("mnist", tmp_path / "keys.npz")
    with pytest.raises(data.DataError, match=r"shape \(50, 28, 28\), expected \(N, 32, 32, 3\)"):
        data.load("cifar10", _small_npz(tmp_path / "m.npz", sample))
    with pytest.raises(data.DataError, match="unknown data set"):
        data.load("imagenet", None)


def test_default_order_env_then_repo_then_bundled(tmp_path, monkeypatch, sample, caplog):
    env_dir, repo_dir = tmp_path / "env", tmp_path / "repo"
    env_dir.mkdir(), repo_dir.mkdir()
    _small_npz(env_dir / "mnist.npz", sample, n=10)
    _small_npz(repo_dir / "mnist.npz", sample, n=20)
    monkeypatch.setattr(data, "REPO_DATA_DIR", repo_dir)
    monkeypatch.setenv(data.ENV_DATA_DIR, str(env_dir))
    caplog.set_level(logging.INFO, logger="tfsync.base.data")
    ds = data.load("mnist", None)
    assert ds.source == str(env_dir / "mnist.npz") and len(ds.x_train) == 10
    assert "TFSYNC_DATA_DIR" in caplog.text
    monkeypatch.delenv(data.ENV_DATA_DIR)
    ds = data.load("mnist", None)
    assert ds.source == str(repo_dir / "mnist.npz") and len(ds.x_train) == 20
    (repo_dir / "mnist.npz").unlink()
    ds = data.load("mnist", None)
    assert ds.source == str(data.BUNDLED_SAMPLE) and len(ds.x_train) == 6000
    assert "bundled sample" in caplog.text
    with pytest.raises(data.DataError, match="no cifar10 data found"):
        data.load("cifar10", None)


def test_env_dir_without_file_is_an_error(tmp_path, monkeypatch):
    monkeypatch.setenv(data.ENV_DATA_DIR, str(tmp_path))
    with pytest.raises(data.DataError, match=f"TFSYNC_DATA_DIR={tmp_path}: no mnist.npz"):
        data.load("mnist", None)


@needs_shared
def test_repo_default_points_at_shared_data():
    assert data.REPO_DATA_DIR.resolve() == SHARED.resolve()


def test_shard_disjoint_strided_cover():
    x, y = np.arange(10) * 10, np.arange(10)
    shards = [data.shard(x, y, i, 3) for i in range(3)]
    assert shards[1][1].tolist() == [1, 4, 7]
    assert sorted(np.concatenate([s[1] for s in shards]).tolist()) == list(range(10))
    assert all((sx == sy * 10).all() for sx, sy in shards)
    for bad in [(3, 3), (-1, 3), (0, 0)]:
        with pytest.raises(ValueError):
            data.shard(x, y, *bad)
    with pytest.raises(ValueError):
        data.shard(x, y[:5], 0, 2)
