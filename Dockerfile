# syntax=docker/dockerfile:1
# The topo-reporter image (docs/image.md): `docker build -t topo-reporter:<version> .` on a host
# with Docker Hub, and image/build.sh's image without it. One recipe for both:
#
# - base: Debian 12 (bookworm) with Python 3.11 and CA certificates from Debian's packages. For
#   Docker, debian:bookworm-slim with those installed by apt; image/build.sh passes its own base
#   (BASE_IMAGE: made by mmdebstrap, package list locked), which has them and no apt.
# - wheels: the package's wheel and every dependency's (the official kubernetes client
#   included), built from the repository root as `pip install .` reads it, and pip's own wheel.
#   image/build.sh replaces this stage (--build-context wheels=...) with its hash-pinned wheels,
#   which leave the official client out (image/lock.py), and builds with --network=none.
# - build: the wheels installed offline into /opt/topo-reporter, then image/rootfs.py gathers
#   what runs it into /rootfs.
# - the image: that gathering alone, on nothing: no shell, no package manager, no setuid file.

ARG BASE_IMAGE=debian:bookworm-slim

FROM ${BASE_IMAGE} AS base
# A base with Python already (image/build.sh's) is used as it is: this step must not need the
# network, which that build does not have.
RUN command -v python3 >/dev/null || { \
        apt-get update \
        && DEBIAN_FRONTEND=noninteractive apt-get install --yes --no-install-recommends \
           python3 ca-certificates \
        && rm -rf /var/lib/apt/lists/*; \
    }

# pip and venv's ensurepip (python3-venv) only here: the standard library the image gathers from
# the build stage is the same as on image/build.sh's base.
FROM base AS wheel-build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install --yes --no-install-recommends python3-venv \
    && rm -rf /var/lib/apt/lists/*
# What `pip install .` reads: the project metadata, the README it names, the two packages; and
# the image's lock, so this path installs the same hash-pinned wheels as image/build.sh.
COPY pyproject.toml README.md /src/
COPY parsers/ /src/parsers/
COPY reporter/ /src/reporter/
COPY image/requirements.txt /src/image/requirements.txt
# The layout image/build.sh gives its folder: wheels/, pip/ (the installer, not a package of the
# image), install.txt (each wheel by name and version).
RUN python3 -m venv /pip \
    && /pip/bin/pip download --quiet --no-deps --only-binary=:all: --require-hashes \
       --dest /stage/wheels -r /src/image/requirements.txt \
    && /pip/bin/pip wheel --quiet --no-deps --wheel-dir /stage/wheels /src \
    && mkdir /stage/pip && mv /stage/wheels/pip-*.whl /stage/pip/ \
    && (cd /stage/wheels && ls ./*.whl | sed 's|^\./\([^-]*\)-\([^-]*\)-.*|\1==\2|') > /stage/install.txt

FROM scratch AS wheels
COPY --from=wheel-build /stage /

FROM base AS build
# pip runs from its own wheel, so no pip lands in the image. --no-deps: the wheels are the whole
# set, the lock's (the official kubernetes client left out on purpose). The wheels are copied, not
# bind-mounted: a layer cache keys a COPY by its content, and a RUN by its text alone. The
# libraries' own test suites go (no command loads them). Byte code: compiled once here, since on a read-only root
# nothing can write it at run time (unchecked-hash pyc: no time stamps in it, so two builds match).
COPY image/rootfs.py /usr/local/lib/rootfs.py
COPY --from=wheels / /mnt/
RUN set -- /mnt/pip/pip-*.whl \
    && python3 -m venv --without-pip /opt/topo-reporter \
    && /opt/topo-reporter/bin/python "$1/pip" install --quiet --no-index \
       --no-cache-dir --disable-pip-version-check --no-deps --no-compile \
       --find-links /mnt/wheels -r /mnt/install.txt \
    && find /opt/topo-reporter/lib -depth -type d -path '*/site-packages/*/tests' -exec rm -rf {} + \
    && /opt/topo-reporter/bin/python -m compileall -q -j 1 --invalidation-mode unchecked-hash \
       /opt/topo-reporter/lib \
    && /opt/topo-reporter/bin/topo-reporter --version \
    && python3 /usr/local/lib/rootfs.py /opt/topo-reporter /rootfs

FROM scratch
LABEL org.opencontainers.image.title="topo-reporter" \
      org.opencontainers.image.description="GPU link matrix and NUMA affinity as Kubernetes Node labels and annotations" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="scratch (files of Debian bookworm packages)"
COPY --from=build /rootfs /
ENV PATH=/opt/topo-reporter/bin:/usr/bin \
    LANG=C.UTF-8
# Numeric, so that the kubelet can verify runAsNonRoot without reading /etc/passwd.
USER 65532:65532
ENTRYPOINT ["topo-reporter"]
CMD ["run"]
