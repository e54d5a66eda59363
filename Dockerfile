# syntax=docker/dockerfile:1
# gpumeter: one image for both services.
#   exporter (DaemonSet):  gpumeter exporter              port 9835
#   billing (Deployment):  gpumeter billing serve          port 9402
# Build:  docker build -t gpumeter:0.1.0 .
# Runtime dependencies come from requirements.lock (exact versions the test suite ran with;
# regenerate with `.venv/bin/python -m tests.deploy.lock_runtime > requirements.lock`).
# NVML (libnvidia-ml.so) is not in the image: the NVIDIA container toolkit injects the host driver's
# copy at run time (runtimeClassName: nvidia, NVIDIA_VISIBLE_DEVICES=all; docs/kubernetes.md).

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# ---- build: a virtual environment with the pinned dependencies and the gpumeter wheel ----
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
RUN python -m venv /opt/gpumeter
COPY requirements.lock ./
# Dependencies first: this layer is reused until requirements.lock changes. Binary wheels only, so
# the build needs no compiler (every pinned package ships manylinux wheels for amd64 and arm64).
RUN /opt/gpumeter/bin/pip install --only-binary=:all: --no-deps -r requirements.lock \
    && /opt/gpumeter/bin/pip check
# The project itself (what .dockerignore lets through: pyproject.toml and the folders
# mapped into the gpumeter package), built with a pinned setuptools and installed without touching the pins.
COPY . ./
RUN /opt/gpumeter/bin/pip install setuptools==84.2.1 \
    && /opt/gpumeter/bin/pip install --no-deps --no-build-isolation . \
    && /opt/gpumeter/bin/pip uninstall --yes setuptools pip \
    && /opt/gpumeter/bin/python -m compileall -q /opt/gpumeter/lib

# ---- runtime: the slim base, the virtual environment, a non-root user ----
FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="gpumeter" \
      org.opencontainers.image.description="NVIDIA GPU and MIG exporter, alerting and chargeback" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --system --gid 10001 gpumeter \
    && useradd --system --uid 10001 --gid gpumeter --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin gpumeter \
    && install -d -o gpumeter -g gpumeter -m 0750 /var/lib/gpumeter
COPY --from=build /opt/gpumeter /opt/gpumeter
ENV PATH=/opt/gpumeter/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
WORKDIR /var/lib/gpumeter
# Non-root by default. The exporter's DaemonSet overrides this to UID 0 with every capability
# dropped, only to reach the root-owned kubelet PodResources socket (docs/kubernetes.md).
USER 10001:10001
EXPOSE 9835 9402
ENTRYPOINT ["gpumeter"]
CMD ["--help"]
