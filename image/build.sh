#!/bin/sh
# Build the topo-reporter image without Docker Hub and without a Docker daemon (docs/image.md).
#
#   sh image/build.sh [--arch amd64|arm64]
#
# 1. The base of the build stage: Debian 12 (bookworm) minbase + python3 + ca-certificates, made
#    by mmdebstrap from Debian's own signed packages, trimmed, its package list checked against
#    image/debian.lock (image/base.sh; reused until that script or the lock changes).
# 2. The wheels: every package of image/requirements.txt, downloaded for the target architecture
#    with their pinned SHA-256 (wheels only), and the package's own wheel built from this checkout.
# 3. The image: the repository's Dockerfile, the one `docker build .` reads, with podman on that
#    base (BASE_IMAGE), the wheels' folder in place of its wheels stage (--build-context) and
#    --network=none, file times and the creation time set to the last commit's time
#    (SOURCE_DATE_EPOCH). Its build stage installs the wheels on the base; the image holds only what
#    image/rootfs.py gathers from there (the interpreter, its libraries, the wheels, CA
#    certificates): no shell.
# 4. dist/: the image as an OCI archive, and its CycloneDX SBOM (image/sbom.py, run in the image).
#
# Tagged localhost/topo-reporter:<version> for this machine's architecture, and
# localhost/topo-reporter:<version>-<arch> always. Another architecture runs through QEMU user
# emulation (qemu-user-static with binfmt_misc), or natively on a host of that architecture.
# Environment: DEBIAN_MIRROR, DEBIAN_SECURITY_MIRROR (default: the mirrors of this machine's
# apt sources, else deb.debian.org), TOPO_REPORTER_RELOCK=1 (accept a changed Debian package list
# and rewrite image/debian.lock), SOURCE_DATE_EPOCH (default: the last commit's time).
set -eu
# The whole script is one compound command: the shell reads all of it before it runs any, so an
# edit while it runs cannot change what it does.
{

say() { printf 'image/build.sh: %s\n' "$*" >&2; }
fail() { say "$*"; exit 1; }

cd "$(dirname "$0")/.."
ARCH=""
while [ $# -gt 0 ]; do
    case "$1" in
        --arch) [ $# -ge 2 ] || fail "--arch needs a value: amd64 or arm64"; ARCH=$2; shift 2 ;;
        --arch=*) ARCH=${1#--arch=}; shift ;;
        *) fail "unknown argument $1: the only option is --arch amd64|arm64" ;;
    esac
done

for tool in podman mmdebstrap python3; do
    command -v "$tool" >/dev/null 2>&1 ||
        fail "$tool not found: install podman, runc and mmdebstrap (apt-get install podman runc mmdebstrap), or build with Docker: docker build -t topo-reporter:VERSION ."
done
command -v runc >/dev/null 2>&1 ||
    fail "runc not found: install it (apt-get install runc); podman's crun 1.8 fails on hybrid cgroups"
python3 -m pip --version >/dev/null 2>&1 ||
    fail "python3 has no pip: install python3-pip, or run this from a virtual environment"

HOST_ARCH=$(dpkg --print-architecture 2>/dev/null || uname -m)
case "$HOST_ARCH" in x86_64) HOST_ARCH=amd64 ;; aarch64) HOST_ARCH=arm64 ;; esac
ARCH=${ARCH:-$HOST_ARCH}
case "$ARCH" in
    amd64) MACHINE=x86_64 ;;
    arm64) MACHINE=aarch64 ;;
    *) fail "unsupported architecture $ARCH: the image is built for amd64 and arm64" ;;
esac
if [ "$ARCH" != "$HOST_ARCH" ]; then
    grep -qs enabled "/proc/sys/fs/binfmt_misc/qemu-$MACHINE" ||
        fail "cannot run $ARCH programs on this $HOST_ARCH machine: install qemu-user-static and binfmt-support, mount binfmt_misc (mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc) and enable qemu-$MACHINE (update-binfmts --enable qemu-$MACHINE), or build on an $ARCH host"
    command -v arch-test >/dev/null 2>&1 ||
        fail "arch-test not found: mmdebstrap needs it to make a base for another architecture (apt-get install arch-test)"
fi

VERSION=$(python3 -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')
SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}
export SOURCE_DATE_EPOCH
REVISION=$(git rev-parse HEAD 2>/dev/null || echo unknown)
# What the image is made of: a changed source, lock or recipe gives another key. An image that
# carries this key, with its archive and SBOM in dist/, is up to date and not built again.
INPUTS=$(find Dockerfile .dockerignore pyproject.toml README.md parsers reporter image -type f ! -path '*/__pycache__/*' |
    LC_ALL=C sort | xargs sha256sum | sha256sum | cut -c1-16)
IMAGE=localhost/topo-reporter
RUNTIME="--runtime runc"
mkdir -p dist
SUFFIX=""
[ "$ARCH" = "$HOST_ARCH" ] || SUFFIX=-$ARCH
ARCHIVE=dist/topo-reporter-$VERSION-$ARCH.oci.tar
SBOM=dist/topo-reporter-$VERSION$SUFFIX.cdx.json
built=$(podman image inspect --format '{{ index .Labels "io.github.topo-reporter.inputs" }}' \
    "$IMAGE:$VERSION-$ARCH" 2>/dev/null || true)
if [ "$built" = "$INPUTS" ] && [ -s "$ARCHIVE" ] && [ -s "$SBOM" ]; then
    [ "$ARCH" = "$HOST_ARCH" ] && podman tag "$IMAGE:$VERSION-$ARCH" "$IMAGE:$VERSION"
    say "$IMAGE:$VERSION-$ARCH is up to date (inputs $INPUTS), with $ARCHIVE and $SBOM"
    exit 0
fi

# 1. The base (image/base.sh: made once per architecture and recipe, then reused).
BASE=$(sh image/base.sh "$ARCH")

# 2. The wheels, for the target architecture, in dist/build-<arch>/wheels; pip, the installer
#    and not a package of the image, beside them in pip/; install.txt. The layout of the
#    Dockerfile's wheels stage, which this folder replaces; its build stage mounts it on /mnt.
STAGE=dist/build-$ARCH
rm -rf "$STAGE"
mkdir -p "$STAGE/pip"
python3 -m pip download --quiet --disable-pip-version-check --dest "$STAGE/wheels" --no-deps \
    --require-hashes --only-binary=:all: --implementation cp --python-version 3.11 --abi cp311 \
    --platform "manylinux2014_$MACHINE" --platform "manylinux_2_17_$MACHINE" \
    --platform "manylinux_2_28_$MACHINE" -r image/requirements.txt ||
    fail "the wheels of image/requirements.txt could not be downloaded for $ARCH (see above): is the package index reachable?"
# From a copy of what `pip install .` reads: setuptools writes build/ and *.egg-info beside the
# sources, which two builds at once (amd64 and arm64) would share.
mkdir -p "$STAGE/src"
cp -R pyproject.toml README.md parsers reporter "$STAGE/src/"
python3 -m pip wheel --quiet --disable-pip-version-check --no-deps --wheel-dir "$STAGE/wheels" \
    "./$STAGE/src" || fail "the topo-reporter wheel did not build (see above)"
rm -rf "$STAGE/src"
mv "$STAGE"/wheels/pip-*.whl "$STAGE/pip/"
# Installed by name from the folder (not by file: pip would record each file's URL and hash in a
# direct_url.json, and the package's own wheel differs from build to build).
(cd "$STAGE/wheels" && ls ./*.whl | sed 's|^\./\([^-]*\)-\([^-]*\)-.*|\1==\2|') > "$STAGE/install.txt"

# 3. The image.
say "building $IMAGE:$VERSION-$ARCH"
# --no-cache: podman's layer cache does not look into the wheels' folder, so it would reuse a layer
# installed from other wheels; --layers=false: one commit, no intermediate images.
previous=$(podman image inspect --format '{{.Id}}' "$IMAGE:$VERSION-$ARCH" 2>/dev/null || true)
podman build --quiet --no-cache --layers=false $RUNTIME --network=none --arch "$ARCH" --timestamp "$SOURCE_DATE_EPOCH" \
    --build-arg BASE_IMAGE="$BASE" --build-context wheels="$PWD/$STAGE" \
    --label org.opencontainers.image.version="$VERSION" \
    --label org.opencontainers.image.revision="$REVISION" \
    --label io.github.topo-reporter.inputs="$INPUTS" \
    --file Dockerfile --tag "$IMAGE:$VERSION-$ARCH" . >/dev/null ||
    fail "podman build failed (see above)"
[ "$ARCH" = "$HOST_ARCH" ] && podman tag "$IMAGE:$VERSION-$ARCH" "$IMAGE:$VERSION"
# The image this one replaces, untagged now: removed unless a container still uses it.
current=$(podman image inspect --format '{{.Id}}' "$IMAGE:$VERSION-$ARCH")
if [ -n "$previous" ] && [ "$previous" != "$current" ]; then
    podman rmi "$previous" >/dev/null 2>&1 || true
fi

# 4. dist/: the OCI archive and the SBOM.
rm -f "$ARCHIVE" "$SBOM"
podman save --quiet --format oci-archive -o "$ARCHIVE" "$IMAGE:$VERSION-$ARCH"
podman run $RUNTIME --rm --interactive --network=none --read-only --cap-drop=ALL \
    --ulimit nofile=20000:20000 --ulimit nproc=4096:4096 --entrypoint /usr/bin/python3 \
    "$IMAGE:$VERSION-$ARCH" - "$IMAGE:$VERSION" "$ARCH" "$REVISION" "$SOURCE_DATE_EPOCH" \
    < image/sbom.py > "$SBOM.tmp" ||
    fail "the SBOM could not be written (see above)"
mv "$SBOM.tmp" "$SBOM"
size=$(podman image inspect --format '{{.Size}}' "$IMAGE:$VERSION-$ARCH")
say "built $IMAGE:$VERSION-$ARCH ($((size / 1000000)) MB), $ARCHIVE, $SBOM"
exit
}
