# syntax=docker/dockerfile:1
# The topo-reporter image: `docker build -t topo-reporter:<version> .` (README, "Installing on a
# cluster"). Stage one builds wheels for the package and every dependency from the repository
# root, the same `pip install .` path the README documents; the final stage installs only those
# wheels (--no-index): no compiler, no build tool, no network there.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
WORKDIR /src
# What `pip install .` reads: the project metadata, the README it names, the two packages.
COPY pyproject.toml README.md ./
COPY parsers/ parsers/
COPY reporter/ reporter/
RUN pip wheel --wheel-dir /wheels .

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="topo-reporter" \
      org.opencontainers.image.description="GPU link matrix and NUMA affinity as Kubernetes Node labels and annotations" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# The wheels are bind-mounted from the build stage, so they never land in a layer of this image.
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-index --find-links /wheels topo-reporter \
    && groupadd --system --gid 65532 topo-reporter \
    && useradd --system --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin topo-reporter
# Numeric, so that the kubelet can verify runAsNonRoot without reading /etc/passwd.
USER 65532:65532
ENTRYPOINT ["topo-reporter"]
CMD ["run"]
