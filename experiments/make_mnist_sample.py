"""Make the small real MNIST sample bundled in tfsync (tfsync/datasets/mnist_sample.npz).

A class-balanced random subset of the full MNIST .npz (Keras format), chosen with a
fixed seed so the same source always gives the same images in the same order.

    python experiments/make_mnist_sample.py --source ../shared/data/mnist.npz
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
DEFAULT_SOURCE = REPO.parent / "shared" / "data" / "mnist.npz"
DEFAULT_OUT = REPO / "tfsync" / "datasets" / "mnist_sample.npz"
NUM_CLASSES = 10


def balanced_indices(y: np.ndarray, total: int, rng: np.random.Generator) -> np.ndarray:
    """`total // 10` random indices of each class, in shuffled order."""
    per_class, rest = divmod(total, NUM_CLASSES)
    if rest:
        raise SystemExit(f"error: sample size {total} is not a multiple of {NUM_CLASSES}")
    picks = []
    for c in range(NUM_CLASSES):
        members = np.flatnonzero(y == c)
        if len(members) < per_class:
            raise SystemExit(f"error: class {c} has {len(members)} images, need {per_class}")
        picks.append(rng.choice(members, size=per_class, replace=False))
    return rng.permutation(np.concatenate(picks))


def make_sample(source: Path, out: Path, train: int, test: int, seed: int = 0) -> None:
    """Write a class-balanced uint8 subset of `source` to `out` (np.savez_compressed)."""
    rng = np.random.default_rng(seed)
    with np.load(source, allow_pickle=False) as d:
        arrays = {k: d[k] for k in ("x_train", "y_train", "x_test", "y_test")}
    sample = {}
    for split, n in (("train", train), ("test", test)):
        idx = balanced_indices(arrays[f"y_{split}"], n, rng)
        sample[f"x_{split}"] = arrays[f"x_{split}"][idx].astype(np.uint8)
        sample[f"y_{split}"] = arrays[f"y_{split}"][idx].astype(np.uint8)
    out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(out, **sample)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, default=DEFAULT_SOURCE,
                        help="full MNIST .npz with x_train, y_train, x_test, y_test "
                             "(default: %(default)s)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT,
                        help="where to write the sample (default: %(default)s)")
    parser.add_argument("--train", type=int, default=6000, help="train images (default: 6000)")
    parser.add_argument("--test", type=int, default=1000, help="test images (default: 1000)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    args = parser.parse_args(argv)
    if not args.source.is_file():
        parser.error(f"--source {args.source}: no such file; pass the full MNIST .npz")
    make_sample(args.source, args.out, args.train, args.test, args.seed)
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes, "
          f"{args.train} train + {args.test} test images)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
