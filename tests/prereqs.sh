#!/bin/sh
# The system packages the test suite needs, installed only where they are missing, on a
# Debian-based machine (Debian, Ubuntu); the head of the README's test command.
#
#   python3 3.11+ with venv   the virtual environment
#   graphviz                  `dot` checks every --format dot picture
#   jq                        reads `--format json` as the docs tell a user to
#   nodejs 20.19+, npm        the real Mermaid parser (tests/mermaid) and TypeScript on Grafana's schema (tests/grafana)
#   Go 1.26                   the real kube-apiserver, kube-scheduler and kubelet (tests/controlplane)
#   gcc, libc6-dev, libpfm4-dev   cgo builds (Koordinator's koordlet links libpfm4)
#   openssl                   the API server double's throwaway certificates
#   podman, runc, mmdebstrap  the image tests build and run the image (image/build.sh): podman
#                             with runc (crun 1.8 fails on hybrid cgroups), the base by mmdebstrap
#   ibsim-utils               ibsim, the simulated InfiniBand fabric the node's discovery walks
#                             (tests/collect/test_infiniband.py), and its umad2sim preload
#   opensm                    the real subnet manager the tests run on ibsim's switches
#                             (tests/collect/test_infiniband_fabrics.py); installed with its
#                             service kept from starting, as lldpd (below): never on real ports
#   iproute2, lldpd           tests/collect/test_lldp_namespaces.py runs the real lldpd in network
#                             namespaces it makes; lldpd is installed with its service kept from
#                             starting (below), so it never sends LLDP on this machine's interfaces
#   containerd, containernetworking-plugins   the node harness (`controlplane node`) runs the
#                             real kubelet on containerd with the CNI bridge plugin; containerd is
#                             installed with its service kept from starting (below): the harness
#                             runs its own, all state in the test's directory
#
# Idempotent: where everything is there it changes nothing and needs neither network nor sudo.
# `sudo` only where not root. Node.js: NodeSource's `nodejs` package carries its own npm and
# conflicts with Debian's `npm`, so npm is asked for only where no npm exists once nodejs is in.
# Go: where no Go 1.26 or newer is found (on PATH or in /usr/local/go), the pinned release goes
# into /usr/local/go, as the official tarball does; it is fetched as the go command fetches a
# toolchain (GOTOOLCHAIN), the golang.org/toolchain module from the Go module proxy, and checked
# against its SHA-256 below.
set -eu

GO_VERSION=1.26.8
GO_SHA256_AMD64=30c2b1bf7dcc88d3eb0a1364e47ddd9128edb3110a30e8a0ef61cd5856b31de7
GO_SHA256_ARM64=02b36b6787b3ac767668f630e2998df45a3b1f9ffee08d1bf3ef6487cd658d99
GO_ROOT=/usr/local/go
# Where invoke-rc.d and deb-systemd-invoke ask whether a package may start its service.
POLICY_RC_D=${POLICY_RC_D:-/usr/sbin/policy-rc.d}
NODE_MIN=20.19

say() { printf 'tests/prereqs.sh: %s\n' "$*" >&2; }
fail() { say "$*"; exit 1; }

as_root() {
    if [ "$(id -u)" = 0 ]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo "$@"
    else
        fail "needs root for: $* (run as root, or install sudo)"
    fi
}

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'ok installed'; }

# "1.26.8" or "20.19.2" at least "1.26" or "20.19"?
at_least() {
    printf '%s\n' "$1" | awk -F. -v want="$2" '{ split(want, w, "."); exit !($1 > w[1] || ($1 == w[1] && $2 + 0 >= w[2])) }'
}

# The version of a Go binary (1.26.8), or nothing; run where no go.mod can ask for a download.
go_version() {
    (cd / && GOTOOLCHAIN=local "$1" env GOVERSION 2>/dev/null) | sed -n 's/^go\([0-9][0-9.]*\).*/\1/p'
}

go_found() {
    for go in "$(command -v go || true)" "$GO_ROOT/bin/go"; do
        [ -n "$go" ] && [ -x "$go" ] || continue
        version=$(go_version "$go")
        [ -n "$version" ] && at_least "$version" 1.26 && return 0
    done
    return 1
}

PACKAGES=""
want() { PACKAGES="$PACKAGES $1"; }

apt_install() {
    [ -n "$apt_updated" ] || { as_root apt-get update -qq; apt_updated=1; }
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@"
}
apt_updated=""

# apt-get install "$@" with no service started: Debian's lldpd starts lldpd host-wide on install
# otherwise. A policy-rc.d denying every start (101) stands in for the machine's own, if any,
# while apt-get runs; the service is disabled and stopped after, where systemd manages it.
install_without_starting() {
    saved=""
    if [ -e "$POLICY_RC_D" ]; then
        saved="$POLICY_RC_D.prereqs-saved"
        as_root cp -p "$POLICY_RC_D" "$saved"
    fi
    deny=$(mktemp)
    printf '#!/bin/sh\n# tests/prereqs.sh: no service starts while it installs %s\nexit 101\n' "$*" > "$deny"
    as_root cp "$deny" "$POLICY_RC_D"
    rm -f "$deny"
    as_root chmod 755 "$POLICY_RC_D"
    status=0
    apt_install "$@" || status=$?
    if [ -n "$saved" ]; then
        as_root cp -p "$saved" "$POLICY_RC_D"
        as_root rm -f "$saved"
    else
        as_root rm -f "$POLICY_RC_D"
    fi
    [ "$status" = 0 ] || fail "apt-get install $* failed (exit $status)"
    if command -v systemctl >/dev/null 2>&1; then
        for unit in "$@"; do
            as_root systemctl disable --now "$unit" >/dev/null 2>&1 || true
        done
    fi
}

command -v python3 >/dev/null 2>&1 || want python3
python3 -c 'import ensurepip' 2>/dev/null || want python3-venv
command -v dot >/dev/null 2>&1 || want graphviz
command -v jq >/dev/null 2>&1 || want jq
command -v openssl >/dev/null 2>&1 || want openssl
command -v gcc >/dev/null 2>&1 || want gcc
installed libc6-dev || want libc6-dev
installed libpfm4-dev || want libpfm4-dev
command -v podman >/dev/null 2>&1 || want podman
command -v runc >/dev/null 2>&1 || want runc
command -v mmdebstrap >/dev/null 2>&1 || want mmdebstrap
command -v ibsim >/dev/null 2>&1 || want ibsim-utils
command -v ip >/dev/null 2>&1 || want iproute2
installed containernetworking-plugins || want containernetworking-plugins
command -v node >/dev/null 2>&1 || want nodejs
need_go=""
if ! go_found; then
    need_go=1
    command -v curl >/dev/null 2>&1 || want curl
    [ -s /etc/ssl/certs/ca-certificates.crt ] || want ca-certificates
fi

if [ -n "$PACKAGES" ]; then
    say "installing:$PACKAGES"
    # shellcheck disable=SC2086  # one word per package
    apt_install $PACKAGES
fi
# Only now: NodeSource's nodejs (just installed, or there before) brings npm itself.
if ! command -v npm >/dev/null 2>&1; then
    say "installing: npm"
    apt_install npm
fi
if ! command -v lldpd >/dev/null 2>&1 || ! command -v lldpcli >/dev/null 2>&1; then
    say "installing: lldpd (its service kept from starting: the tests run it in namespaces only)"
    install_without_starting lldpd
fi
if ! command -v opensm >/dev/null 2>&1; then
    say "installing: opensm (its service kept from starting: the tests run it on ibsim only)"
    install_without_starting opensm
fi
if ! command -v containerd >/dev/null 2>&1; then
    say "installing: containerd (its service kept from starting: the node harness runs its own)"
    install_without_starting containerd
fi

python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' ||
    fail "Python 3.11 or newer is needed, this is $(python3 --version 2>&1)"
node_version=$(node --version | sed 's/^v//')
at_least "$node_version" "$NODE_MIN" ||
    fail "Node.js $NODE_MIN or newer is needed by tests/mermaid (jsdom, mermaid), this is" \
        "$node_version (Debian 12 and Ubuntu 24.04 ship 18): install Node.js from NodeSource" \
        "(https://github.com/nodesource/distributions; its nodejs includes npm), or use Debian 13"

if [ -n "$need_go" ]; then
    arch=$(dpkg --print-architecture)
    case "$arch" in
        amd64) sha256=$GO_SHA256_AMD64 ;;
        arm64) sha256=$GO_SHA256_ARM64 ;;
        *) fail "no Go 1.26 found, and none pinned here for $arch: install it from https://go.dev/dl/" ;;
    esac
    # The first proxy GOPROXY names (the go command's default otherwise).
    proxy=$(printf '%s' "${GOPROXY:-}" | cut -d, -f1 | cut -d'|' -f1)
    case "$proxy" in http*) ;; *) proxy=https://proxy.golang.org ;; esac
    module="golang.org/toolchain@v0.0.1-go$GO_VERSION.linux-$arch"
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    say "installing: Go $GO_VERSION into $GO_ROOT (from $proxy)"
    curl -fsSL --retry 3 -o "$work/go.zip" \
        "$proxy/golang.org/toolchain/@v/v0.0.1-go$GO_VERSION.linux-$arch.zip"
    printf '%s  %s\n' "$sha256" "$work/go.zip" | sha256sum -c --quiet - ||
        fail "the Go $GO_VERSION download does not match its pinned SHA-256"
    python3 -m zipfile -e "$work/go.zip" "$work/unpacked"
    # A module zip keeps no file modes: the go command marks these executable when it unpacks one.
    chmod +x "$work/unpacked/$module/bin/"* "$work/unpacked/$module/pkg/tool/"*/*
    as_root rm -rf "$GO_ROOT"
    as_root mkdir -p "$(dirname "$GO_ROOT")"
    as_root cp -R "$work/unpacked/$module" "$GO_ROOT"
    [ "$(go_version "$GO_ROOT/bin/go")" = "$GO_VERSION" ] || fail "Go did not install in $GO_ROOT"
fi
