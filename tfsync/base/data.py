"""Data sets for the main job: Keras-format .npz, MNIST IDX files, the bundled sample.

`load(name, path)` returns a `Dataset` with x as float32 in [0, 1] and a channel axis,
y as int64. With no path it looks, in order, at $TFSYNC_DATA_DIR/<name>.npz, the
repository's ../shared/data, and (MNIST only) the small real sample shipped in
tfsync/datasets, and logs which one it used.
"""
from __future__ import annotations

import dataclasses
import gzip
import logging
import os
import struct
import zipfile
from pathlib import Path

import numpy as np

from . import safefile
from .exits import BadInput

log = logging.getLogger(__name__)

ENV_DATA_DIR = "TFSYNC_DATA_DIR"
INPUT_SHAPES = {"mnist": (28, 28, 1), "cifar10": (32, 32, 3)}
NUM_CLASSES = 10
KEYS = ("x_train", "y_train", "x_test", "y_test")
# File names tried in $TFSYNC_DATA_DIR / a data directory, and in ../shared/data.
NPZ_NAMES = {"mnist": ("mnist.npz",), "cifar10": ("cifar10.npz", "cifar10_subset.npz")}
# Official MNIST IDX names (the second spelling is a common re-upload), each maybe .gz.
IDX_NAMES = {
    "x_train": ("train-images-idx3-ubyte", "train-images.idx3-ubyte"),
    "y_train": ("train-labels-idx1-ubyte", "train-labels.idx1-ubyte"),
    "x_test": ("t10k-images-idx3-ubyte", "t10k-images.idx3-ubyte"),
    "y_test": ("t10k-labels-idx1-ubyte", "t10k-labels.idx1-ubyte"),
}
# IDX type byte -> numpy dtype (all multi-byte types are big-endian).
IDX_DTYPES = {0x08: np.dtype("u1"), 0x09: np.dtype("i1"), 0x0B: np.dtype(">i2"),
              0x0C: np.dtype(">i4"), 0x0D: np.dtype(">f4"), 0x0E: np.dtype(">f8")}

BUNDLED_SAMPLE = Path(__file__).resolve().parents[1] / "datasets" / "mnist_sample.npz"
REPO_DATA_DIR = Path(__file__).resolve().parents[3] / "shared" / "data"

_EXPECTED = ("a Keras-format .npz (keys x_train, y_train, x_test, y_test)"
             " or, for mnist, a directory of the IDX files")
_FIX = f"pass the right file as data.path, or set {ENV_DATA_DIR} to a directory holding it"


class DataError(BadInput, ValueError):
    """A data file is missing, unreadable or does not hold the expected data set."""


@dataclasses.dataclass(frozen=True, eq=False)
class Dataset:
    """One data set in memory; arrays are read-only."""

    x_train: np.ndarray = dataclasses.field(repr=False)  # float32 (N, H, W, C) in [0, 1]
    y_train: np.ndarray = dataclasses.field(repr=False)  # int64 (N,)
    x_test: np.ndarray = dataclasses.field(repr=False)
    y_test: np.ndarray = dataclasses.field(repr=False)
    num_classes: int
    input_shape: tuple[int, ...]
    name: str
    source: str  # the file or directory it was read from


def load(name: str, path: str | os.PathLike | None = None) -> Dataset:
    """Load data set `name` ("mnist" or "cifar10") from `path`, or the default source."""
    if name not in INPUT_SHAPES:
        raise DataError(f"data.name = {name!r}: unknown data set; expected one of "
                        f"{', '.join(INPUT_SHAPES)}")
    if path is None:
        src, why = _default_path(name)
        log.info("loading %s from %s (%s)", name, src, why)
    else:
        src = Path(path).expanduser()
        log.info("loading %s from %s", name, src)
    return _finish(name, _read(name, src), str(src))


def shard(x: np.ndarray, y: np.ndarray, index: int, count: int) -> tuple[np.ndarray, np.ndarray]:
    """The `index`-th of `count` disjoint strided shards: x[index::count], y[index::count]."""
    if count < 1 or not 0 <= index < count:
        raise ValueError(f"shard index={index}, count={count}: need count >= 1 and "
                         f"0 <= index < count")
    if len(x) != len(y):
        raise ValueError(f"shard: x has {len(x)} rows but y has {len(y)}")
    return x[index::count], y[index::count]


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Read one IDX file (optionally gzipped): magic 0 0 <type> <ndim>, big-endian dims."""
    path = Path(path)
    try:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rb") as f:
            raw = f.read()
    except (OSError, EOFError) as e:
        raise DataError(f"{path}: cannot read IDX file ({e}); {_FIX}") from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in IDX_DTYPES:
        raise DataError(f"{path}: bad magic number {raw[:4].hex() or 'empty'}; expected an "
                        f"IDX file (00 00 <type> <ndim>); {_FIX}")
    dtype, ndim = IDX_DTYPES[raw[2]], raw[3]
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DataError(f"{path}: truncated IDX header; {_FIX}")
    dims = struct.unpack(f">{ndim}I", raw[4:header])
    count = int(np.prod(dims, dtype=np.int64))
    if len(raw) - header != count * dtype.itemsize:
        raise DataError(f"{path}: IDX header says {dims} ({count * dtype.itemsize} bytes of "
                        f"data) but the file holds {len(raw) - header}; the file is truncated "
                        f"or corrupt; {_FIX}")
    array = np.frombuffer(raw, dtype, count, offset=header).reshape(dims)
    return array.astype(dtype.newbyteorder("="))  # native byte order, writable copy


def write_idx(path: str | os.PathLike, array: np.ndarray) -> None:
    """Write `array` as an IDX file (gzipped if the name ends in .gz)."""
    path = Path(path)
    array = np.asarray(array)
    codes = {dt.newbyteorder(">"): code for code, dt in IDX_DTYPES.items()}
    code = codes.get(array.dtype.newbyteorder(">"))
    if code is None:
        raise ValueError(f"write_idx: dtype {array.dtype} has no IDX type code")
    header = bytes([0, 0, code, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    body = array.astype(IDX_DTYPES[code]).tobytes()
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "wb") as f:
        f.write(header + body)


def _default_path(name: str) -> tuple[Path, str]:
    """Where to read `name` from when no path is given, and why."""
    env = os.environ.get(ENV_DATA_DIR)
    if env:
        d = Path(env).expanduser()
        for fname in NPZ_NAMES[name]:
            if (d / fname).is_file():
                return d / fname, f"${ENV_DATA_DIR}"
        raise DataError(f"{ENV_DATA_DIR}={env}: no {' or '.join(NPZ_NAMES[name])} there; "
                        f"expected {_EXPECTED}; put the file there, unset {ENV_DATA_DIR}, "
                        f"or pass data.path")
    for fname in NPZ_NAMES[name]:
        if (REPO_DATA_DIR / fname).is_file():
            return REPO_DATA_DIR / fname, "the repository's shared data folder"
    if name == "mnist" and BUNDLED_SAMPLE.is_file():
        return BUNDLED_SAMPLE, "bundled sample: 6000 train / 1000 test images, for smoke tests"
    raise DataError(f"no {name} data found: {ENV_DATA_DIR} is not set and {REPO_DATA_DIR} "
                    f"has no {' or '.join(NPZ_NAMES[name])}; expected {_EXPECTED}; {_FIX}")


def _read(name: str, path: Path) -> dict[str, np.ndarray]:
    """The four raw arrays from a .npz file or a data directory."""
    if path.is_dir():
        if name == "mnist" and _idx_file(path, "x_train") is not None:
            return _read_idx_dir(path)
        for fname in NPZ_NAMES[name]:
            if (path / fname).is_file():
                return _read_npz(path / fname)
        raise DataError(f"{path}: directory holds no {' or '.join(NPZ_NAMES[name])}"
                        f"{' and no IDX files' if name == 'mnist' else ''}; "
                        f"expected {_EXPECTED}; {_FIX}")
    if not path.exists():
        raise DataError(f"{path}: no such file or directory; expected {_EXPECTED}; {_FIX}")
    problem = safefile.not_regular(path, path.stat())  # a FIFO would block np.load forever
    if problem:
        raise DataError(f"{problem}; expected {_EXPECTED}; {_FIX}")
    return _read_npz(path)


def _read_npz(path: Path) -> dict[str, np.ndarray]:
    try:
        d = np.load(path, allow_pickle=False)
        if not isinstance(d, np.lib.npyio.NpzFile):
            raise ValueError("a single .npy array, not an .npz archive")
        with d:
            files = list(d.files)
            arrays = {k: d[k] for k in KEYS if k in files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        why = str(e).splitlines()[0] if str(e) else "corrupt"
        raise DataError(f"{path}: not a readable .npz ({type(e).__name__}: {why}); "
                        f"expected {_EXPECTED}; {_FIX}") from None
    missing = [k for k in KEYS if k not in arrays]
    if missing:
        raise DataError(f"{path}: missing keys {', '.join(missing)} (has "
                        f"{', '.join(files) or 'none'}); expected {_EXPECTED}; {_FIX}")
    return arrays


def _idx_file(directory: Path, key: str) -> Path | None:
    for base in IDX_NAMES[key]:
        for fname in (base, base + ".gz"):
            if (directory / fname).is_file():
                return directory / fname
    return None


def _read_idx_dir(directory: Path) -> dict[str, np.ndarray]:
    out = {}
    for key in KEYS:
        f = _idx_file(directory, key)
        if f is None:
            raise DataError(f"{directory}: no {IDX_NAMES[key][0]}[.gz]; expected all four MNIST "
                            f"IDX files ({', '.join(n[0] for n in IDX_NAMES.values())}); {_FIX}")
        out[key] = read_idx(f)
    return out


def _finish(name: str, raw: dict[str, np.ndarray], source: str) -> Dataset:
    """Check shapes and labels, scale x to float32 [0, 1] with a channel axis."""
    shape = INPUT_SHAPES[name]
    out = {}
    for split in ("train", "test"):
        x, y = raw[f"x_{split}"], raw[f"y_{split}"]
        if name == "mnist" and x.shape[1:] == shape[:2]:
            x = x[..., np.newaxis]
        elif name == "cifar10" and x.shape[1:] == (3, 32, 32):
            x = np.transpose(x, (0, 2, 3, 1))  # channels-first -> channels-last
        if x.shape[1:] != shape:
            raise DataError(f"{source}: x_{split} has shape {x.shape}, expected (N, "
                            f"{', '.join(map(str, shape))}) for {name}; set data.name to the "
                            f"data set the file holds, or point data.path at a {name} file")
        y = y.reshape(-1) if y.ndim == 2 and y.shape[1] == 1 else y
        if y.ndim != 1 or len(y) != len(x) or not np.issubdtype(y.dtype, np.integer):
            raise DataError(f"{source}: y_{split} has shape {y.shape} dtype {y.dtype}, expected "
                            f"{len(x)} integer labels; {_FIX}")
        if len(y) and (y.min() < 0 or y.max() >= NUM_CLASSES):
            raise DataError(f"{source}: y_{split} has labels {y.min()}..{y.max()}, expected "
                            f"0..{NUM_CLASSES - 1}; {_FIX}")
        out[f"x_{split}"] = _scale(x, f"{source}: x_{split}")
        out[f"y_{split}"] = y.astype(np.int64)
    for a in out.values():
        a.setflags(write=False)
    return Dataset(**out, num_classes=NUM_CLASSES, input_shape=shape, name=name, source=source)


def _scale(x: np.ndarray, what: str) -> np.ndarray:
    if x.dtype == np.uint8:
        out = x.astype(np.float32)
        out /= np.float32(255.0)
        return out
    if np.issubdtype(x.dtype, np.floating) and (x.size == 0 or (x.min() >= 0 and x.max() <= 1)):
        return x.astype(np.float32)
    raise DataError(f"{what} has dtype {x.dtype}, expected uint8 pixels 0..255 or floats "
                    f"in [0, 1]; {_FIX}")
