"""tfsync: fast parameter-server training on slow, uneven or changing clusters."""

from setuptools import find_packages, setup

DOCS = ["mkdocs>=1.6,<2", "mkdocs-material>=9.5,<10", "mkdocstrings[python]>=1.0,<2"]

setup(
    name="tfsync",
    version="0.1.0",
    description="Synchronization protocols (BSP, ASP, SSP, Sync-Switch, LB-BSP, ...) on "
                "TensorFlow's ParameterServerStrategy",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["tfsync", "tfsync.*"]),
    package_data={"tfsync.datasets": ["*.npz"]},
    install_requires=[
        "tensorflow>=2.21,<2.22",
        "tf-keras>=2.21,<2.22",
        "grpcio>=1.85.1",  # the generated tfsync/api code checks it at import
        "protobuf>=7.35.1",  # likewise
        "psutil>=5.9",
        "statsmodels>=0.14",
        "scipy>=1.11",  # linprog (LB-BSP's GPU rule), L-BFGS (NARX fits); statsmodels brings it, we use it directly
        # One BLAS thread around small fits (ARIMA, simulator) in processes that already
        # imported NumPy; env variables only work before that import.
        "threadpoolctl>=3",
        "numpy>=1.26",
        # Every run ends with its report (tfsync.report): figures drawn with matplotlib.
        "matplotlib>=3.8",
        # TF 2.21 no longer brings it: `tensorboard --logdir runs/` and the Keras callback need it.
        "tensorboard>=2.21,<2.22",
        # The live progress bar of `tfsync run` (already installed with TF's keras 3).
        "rich>=13",
    ],
    extras_require={
        # grpcio-tools is pinned: tests/test_api.py regenerates tfsync/api/v1 and compares bytes.
        # pytest-timeout ends a test that runs away (one did for an hour in CI) with its stack.
        # kubernetes-validate: the Kubernetes API's schemas, offline, for `tfsync k8s`'s manifests (issue 56).
        # The documentation site (mkdocs.yml): MkDocs reads the pages as they are written, in
        # Markdown; Material gives the site its search; mkdocstrings the API reference from the
        # docstrings, read without importing TensorFlow. The tests build it (tests/test_docs.py).
        "docs": DOCS,
        "test": ["pytest>=8", "pytest-timeout>=2.3", "grpcio-tools==1.85.1", "kubernetes-validate==1.37.0", *DOCS],
    },
    entry_points={"console_scripts": ["tfsync=tfsync.cli:main"]},
)
