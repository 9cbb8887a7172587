# The image `tfsync k8s` names by default: tfsync and TensorFlow (CPU), run as a user of
# its own. Build it from the repository's root:
#   docker build -t tfsync:0.1.0 .
# Pin the base by digest where your registry allows it:
#   docker build --build-arg BASE=python:3.11.13-slim-bookworm@sha256:<digest> -t tfsync:0.1.0 .
# Your own code named as a module ("mypkg.models:build") goes in an image FROM this one
# (pip install it there); code named by file ("model.py:build") travels in the ConfigMap.
ARG BASE=python:3.11.13-slim-bookworm
FROM ${BASE}

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Every package at the version the test suite passed with (image-constraints.txt);
# TensorFlow first, in a layer of its own that a change to tfsync does not rebuild.
COPY image-constraints.txt /etc/tfsync-constraints.txt
RUN pip install --constraint /etc/tfsync-constraints.txt tensorflow tf-keras

# The uid is the manifests' runAsUser and fsGroup (tfsync.deploy.k8s.UID); runs/ holds the
# chief's run directories when no volume is mounted there (0700: tfsync refuses a run
# directory inside a folder others may write).
RUN groupadd --gid 10001 tfsync \
    && useradd --uid 10001 --gid 10001 --create-home --home-dir /home/tfsync --shell /usr/sbin/nologin tfsync \
    && install -d -m 0700 -o 10001 -g 10001 /home/tfsync/runs

COPY setup.py README.md /src/
COPY tfsync /src/tfsync
RUN pip install --constraint /etc/tfsync-constraints.txt /src && rm -rf /src

USER 10001:10001
ENV HOME=/home/tfsync
WORKDIR /home/tfsync
CMD ["tfsync", "--help"]
