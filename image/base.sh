#!/bin/sh
# The base of the topo-reporter image's build stage, for one architecture: Debian 12 (bookworm)
# minbase with python3 and ca-certificates, made by mmdebstrap from Debian's own signed packages,
# trimmed, its package list checked against image/debian.lock. The image itself holds only the
# files of it that image/rootfs.py gathers (no shell, no dpkg), with its own /etc/passwd. Imported as
# localhost/topo-reporter-base:<arch>-<key>, the key being the hash of this script and the lock:
# made again only when one of them changes. Prints the image's name; messages go to stderr.
#
#   sh image/base.sh amd64|arm64        (image/build.sh calls it)
#
# Environment: DEBIAN_MIRROR, DEBIAN_SECURITY_MIRROR (default: the mirrors of this machine's apt
# sources, else deb.debian.org); TOPO_REPORTER_RELOCK=1 accepts a changed package list and
# rewrites image/debian.lock.
set -eu
# The whole script is one compound command: the shell reads all of it before it runs any, so an
# edit while it runs cannot change what it does.
{

say() { printf 'image/base.sh: %s\n' "$*" >&2; }
fail() { say "$*"; exit 1; }

cd "$(dirname "$0")/.."
ARCH=$1
key() { cat image/base.sh image/debian.lock 2>/dev/null | sha256sum | cut -c1-12; }
BASE=localhost/topo-reporter-base:$ARCH-$(key)
if podman image exists "$BASE"; then
    echo "$BASE"
    exit 0
fi

SOURCES=/etc/apt/sources.list.d/debian.sources
MIRROR=${DEBIAN_MIRROR:-$(awk '/^URIs:/ {print $2; exit}' "$SOURCES" 2>/dev/null || true)}
SECURITY=${DEBIAN_SECURITY_MIRROR:-$(awk '/^URIs:/ {n++; if (n == 2) {print $2; exit}}' "$SOURCES" 2>/dev/null || true)}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
SECURITY=${SECURITY:-http://deb.debian.org/debian-security}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
root=$work/root
say "making the $ARCH base from Debian bookworm (2 to 5 minutes)"
# The merged-usr hook: /usr merged by mmdebstrap with usr-is-merged, not by the usrmerge package,
# which would bring perl (48 MB) into the image.
mmdebstrap --quiet --variant=minbase --architectures="$ARCH" \
    --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
    --include=python3,ca-certificates bookworm "$root" \
    "deb $MIRROR bookworm main" "deb $MIRROR bookworm-updates main" \
    "deb $SECURITY bookworm-security main" >&2 ||
    fail "mmdebstrap could not make the base: see its messages above (is $MIRROR reachable?)"

# Trimmed. apt goes with the libraries only it used, purged so that the dpkg database scanners
# read stays true (dpkg refuses to purge what another package still needs); then its lists and
# caches, the docs but the copyright files (the licences go where the binaries go), man pages,
# locales, logs; glibc's iconv modules (Python decodes with its own codecs), and the standard
# library's regression-test support and pydoc topics, which no command of the agent loads; the time
# zone database (tzdata's files: the agent keeps and logs time in UTC).
APT_ONLY="apt libapt-pkg6.0 gpgv debian-archive-keyring libgnutls30 libhogweed6 libnettle8 libp11-kit0 libtasn1-6 libidn2-0 libunistring2 libseccomp2 libxxhash0"
# shellcheck disable=SC2086  # one word per package
chroot "$root" dpkg --purge $APT_ONLY >/dev/null 2>"$work/purge.log" ||
    fail "could not remove apt from the base: $(grep -m1 -i error "$work/purge.log")"
find "$root/usr/share/doc" -mindepth 1 ! -name copyright ! -type d -delete
find "$root/usr/share/doc" -mindepth 1 -type d -empty -delete
rm -rf "$root/usr/share/man" "$root/usr/share/info" "$root/usr/share/locale" \
    "$root/usr/share/lintian" "$root/var/lib/apt" "$root/var/cache/apt" "$root/etc/apt" \
    "$root/var/cache/debconf/"*-old "$root/var/lib/dpkg/"*-old \
    "$root/usr/lib/"*-linux-gnu/gconv "$root/usr/lib/python3.11/test" \
    "$root/usr/lib/python3.11/pydoc_data" "$root/usr/share/zoneinfo"
find "$root/var/log" -type f -delete

chroot "$root" dpkg-query -W -f '${Package} ${Version}\n' | LC_ALL=C sort > "$work/packages.txt"
if [ "${TOPO_REPORTER_RELOCK:-}" = 1 ] || [ ! -s image/debian.lock ]; then
    cp "$work/packages.txt" image/debian.lock
    BASE=localhost/topo-reporter-base:$ARCH-$(key)
    say "wrote image/debian.lock ($(wc -l < image/debian.lock) packages): commit it"
elif ! cmp -s "$work/packages.txt" image/debian.lock; then
    diff image/debian.lock "$work/packages.txt" >&2 || true
    fail "the base's Debian packages differ from image/debian.lock (above): review them, then TOPO_REPORTER_RELOCK=1 sh image/build.sh to accept them"
fi
tar -C "$root" --create --sort=name --numeric-owner . |
    podman import --quiet --arch "$ARCH" \
        --change 'ENV PATH=/opt/topo-reporter/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'ENV LANG=C.UTF-8' - "$BASE" >/dev/null ||
    fail "podman could not import the base"
echo "$BASE"
exit
}
