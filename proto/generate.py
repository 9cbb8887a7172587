"""Regenerate the Python code of the control-plane API from ``proto/tfsync/api/v1/*.proto``.

Usage (from anywhere)::

    python proto/generate.py            # into the repository: tfsync/api/v1/*_pb2*.py
    python proto/generate.py OUT_DIR    # into OUT_DIR/tfsync/api/v1/ (tests compare)

It runs exactly::

    python -m grpc_tools.protoc -I proto --python_out=OUT --grpc_python_out=OUT \
        proto/tfsync/api/v1/*.proto

from the repository root, with the grpcio-tools version pinned in setup.py's "test"
extra; another version generates different bytes and tests/test_api.py says so.
"""

from __future__ import annotations

import argparse
import glob
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
API_DIR = os.path.join("tfsync", "api", "v1")


def proto_files() -> list[str]:
    """The .proto files, relative to the repository root, sorted."""
    files = sorted(glob.glob(os.path.join("proto", API_DIR, "*.proto"), root_dir=REPO))
    if not files:
        raise FileNotFoundError(f"no .proto files under {os.path.join(REPO, 'proto', API_DIR)}")
    return files


def generated_files(out_dir: str) -> list[str]:
    """The generated modules under ``out_dir``, relative to it, sorted."""
    return sorted(glob.glob(os.path.join(API_DIR, "*_pb2*.py"), root_dir=out_dir))


def generate(out_dir: str = REPO) -> list[str]:
    """Run protoc into ``out_dir``; return the generated files (relative to ``out_dir``)."""
    out_dir = os.path.abspath(out_dir)
    os.makedirs(os.path.join(out_dir, API_DIR), exist_ok=True)
    cmd = [sys.executable, "-m", "grpc_tools.protoc", "-I", "proto",
           f"--python_out={out_dir}", f"--grpc_python_out={out_dir}", *proto_files()]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"protoc failed with code {done.returncode}:\n{done.stderr.strip()}\n"
                           "install the pinned generator: pip install -e '.[test]'")
    return generated_files(out_dir)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out_dir", nargs="?", default=REPO, help="output root (default: the repository)")
    args = p.parse_args(argv)
    for path in generate(args.out_dir):
        print(os.path.join(args.out_dir, path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
