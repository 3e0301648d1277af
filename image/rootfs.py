"""Assemble the image's root file system from the build stage's: the interpreter, its standard
library, the shared libraries these and the wheels' extension modules load, the agent's virtual
environment, CA certificates, and the few files of /etc they read. Nothing else: no shell, no
coreutils, no package manager, no perl, no setuid or setgid file (docs/image.md, "What the image
holds"; tests/image/test_build.py lists the image's files and checks).

The Dockerfile runs it in its build stage, as root, with the base's python3 (standard library
only), then copies the result onto an empty image:

    python3 rootfs.py /opt/topo-reporter /rootfs

Each path is kept as the image must hold it: every symbolic link on the way to it (/lib64, /lib)
and what each names. The libraries are those the dynamic loader resolves (`ld.so --list`, what
ldd prints) for every ELF file kept. /var/lib/dpkg/status keeps the paragraphs of the Debian
packages whose files are kept, so that the SBOM and scanners read what the image holds, and each
of those packages' copyright file goes with it.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import stat
import subprocess
import sys
import sysconfig
from pathlib import Path

# Extension modules of the standard library that no command of the agent imports, and the
# libraries only they load: nis (deprecated; Kerberos and Sun RPC), curses and readline (a
# terminal's; there is none), dbm's Berkeley DB.
DROPPED_MODULES = re.compile(r"(nis|_curses|_curses_panel|readline|_dbm)\.cpython-[^/]*\.so$")
# venv's activation scripts: for a shell, which the image does not have.
ACTIVATE = re.compile(r"/bin/(activate(\.[a-z]+)?|Activate\.ps1)$")
# What OpenSSL reads: the trust store (a bundle and the hashed directory, each a link into
# /etc/ssl/certs and /usr/share/ca-certificates) and its configuration. Not /usr/lib/ssl/misc
# (perl scripts) nor the private key directory.
CERTIFICATES = ("/usr/lib/ssl/cert.pem", "/usr/lib/ssl/certs", "/usr/lib/ssl/openssl.cnf")
# Read by the C library: the library path configuration (the NVIDIA runtime's hook adds the
# driver's libraries to it, then runs ldconfig), the name service switch; by scanners and
# image/sbom.py: the release.
ETC = ("/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/nsswitch.conf", "/etc/os-release",
       "/etc/debian_version")  # fmt: skip
# glibc loads it by name when a thread exits or is cancelled (pthread_exit unwinds through it).
DLOPENED = ("libgcc_s.so.1",)
PASSWD = (
    "root:x:0:0:root:/root:/sbin/nologin\n"
    "topo-reporter:x:65532:65532:topo-reporter:/nonexistent:/sbin/nologin\n"
)
GROUP = "root:x:0:\ntopo-reporter:x:65532:\n"
DPKG = Path("/var/lib/dpkg")


class Root:
    """The root file system being assembled under `into`, from this one's files."""

    def __init__(self, into: Path) -> None:
        self.into = into
        self.seen: set[str] = set()

    def target(self, path: str) -> Path:
        return self.into / path.lstrip("/")

    def keep(self, path: str) -> None:
        """Keep `path`: each link on the way to it, then the file or the folder it names."""
        if path in self.seen:
            return
        self.seen.add(path)
        current = "/"
        parts = Path(path).parts[1:]
        for i, part in enumerate(parts):
            candidate = os.path.join(current, part)
            if os.path.islink(candidate):
                self._link(candidate)
                named = os.path.normpath(os.path.join(current, os.readlink(candidate)))
                self.keep(os.path.join(named, *parts[i + 1 :]))
                return
            current = candidate
        self._copy(current)

    def _parents(self, path: str) -> None:
        """The folders above `path`, with their modes (each a real folder: keep() resolved it)."""
        parent = os.path.dirname(path)
        if parent != "/" and not self.target(parent).exists():
            self._parents(parent)
            self.target(parent).mkdir()
            shutil.copystat(parent, self.target(parent))

    def _link(self, path: str) -> None:
        if not self.target(path).is_symlink():
            self._parents(path)
            self.target(path).symlink_to(os.readlink(path))

    def _copy(self, path: str) -> None:
        if ACTIVATE.search(path) or DROPPED_MODULES.search(path):
            return
        self._parents(path)
        info = os.lstat(path)
        if stat.S_ISDIR(info.st_mode):
            self.target(path).mkdir(exist_ok=True)
            for child in sorted(os.listdir(path)):
                self.keep(os.path.join(path, child))
            shutil.copystat(path, self.target(path))
        elif stat.S_ISREG(info.st_mode):
            shutil.copy2(path, self.target(path))
        else:
            sys.exit(f"rootfs.py: {path} is neither a file, a folder nor a link")
        # No file of the image needs to run as its owner or group: never carry the bits over.
        mode = stat.S_IMODE(info.st_mode) & ~(stat.S_ISUID | stat.S_ISGID)
        self.target(path).chmod(mode)

    def files(self) -> list[Path]:
        """Every regular file kept, where it lies under `into`."""
        return sorted(p for p in self.into.rglob("*") if p.is_file() and not p.is_symlink())

    def held(self) -> list[str]:
        """Every file and link kept, by its path in the image."""
        return sorted(
            "/" + str(p.relative_to(self.into))
            for p in self.into.rglob("*")
            if p.is_symlink() or p.is_file()
        )


def is_elf(path: Path) -> bool:
    with path.open("rb") as f:
        return f.read(4) == b"\x7fELF"


def libraries(loader: str, elf: str) -> list[str]:
    """What the dynamic loader maps for `elf`: its needed libraries, transitively, and itself."""
    listed = subprocess.run(
        [loader, "--list", elf], capture_output=True, text=True, check=True
    ).stdout
    found = []
    for line in listed.splitlines():
        # "\tlibssl.so.3 => /lib/x86_64-linux-gnu/libssl.so.3 (0x...)", and the loader by the
        # program's name for it and its own: "\t/lib64/ld-linux-x86-64.so.2 => /usr/lib/...".
        # Not the kernel's vDSO, which has no file.
        for side in line.rpartition(" (")[0].split(" => "):
            if side.strip().startswith("/"):
                found.append(side.strip())
    return found


def owners() -> dict[str, str]:
    """Each path a Debian package installed, as the image holds it (its folders' links resolved:
    /lib/x86_64-linux-gnu/libc.so.6 is /usr/lib/...) -> that package."""
    owner: dict[str, str] = {}
    for listing in sorted(DPKG.glob("info/*.list")):
        package = listing.name.removesuffix(".list").partition(":")[0]
        for line in listing.read_text().splitlines():
            if os.path.lexists(line) and not os.path.isdir(line):
                held = os.path.join(os.path.realpath(os.path.dirname(line)), os.path.basename(line))
                owner.setdefault(held, package)
    return owner


def sources() -> dict[str, str]:
    """Each installed package -> its source package (itself where the status names none)."""
    found = {}
    for paragraph in (DPKG / "status").read_text().strip().split("\n\n"):
        name = re.search(r"^Package: (\S+)$", paragraph, re.MULTILINE)
        source = re.search(r"^Source: (\S+)", paragraph, re.MULTILINE)
        if name:
            found[name[1]] = source[1] if source else name[1]
    return found


def dpkg_status(packages: set[str]) -> str:
    """The paragraphs of the dpkg status file for these packages, as dpkg wrote them."""
    kept = []
    for paragraph in (DPKG / "status").read_text().strip().split("\n\n"):
        name = re.search(r"^Package: (\S+)$", paragraph, re.MULTILINE)
        if name and name[1] in packages:
            kept.append(paragraph)
    return "\n\n".join(kept) + "\n"


def main() -> int:
    venv, into = sys.argv[1], Path(sys.argv[2])
    into.mkdir()
    root = Root(into)
    root.keep(venv)
    for stdlib in sorted({sysconfig.get_path("stdlib"), sysconfig.get_path("platstdlib")}):
        root.keep(stdlib)
    for path in (*CERTIFICATES, *ETC):
        root.keep(path)
    (loader,) = glob.glob("/usr/lib/*-linux-gnu/ld-linux*.so.*")
    multiarch = os.path.dirname(loader)
    for name in DLOPENED:
        root.keep(os.path.join(multiarch, name))
    for file in root.files():
        if is_elf(file):
            for library in libraries(loader, "/" + str(file.relative_to(into))):
                root.keep(library)

    owner = owners()
    packages = {owner[p] for p in root.held() if p in owner}
    # Each package's licence: its own copyright file, or, where the base's trimming removed its
    # doc folder (a link to a sibling's: libstdc++6's to gcc-12-base's), its source's siblings'.
    source = sources()
    for package in sorted(packages):
        siblings = sorted(p for p in source if source[p] == source[package])
        for sibling in sorted(siblings, key=lambda p: p != package):
            copyright_file = f"/usr/share/doc/{sibling}/copyright"
            if os.path.exists(copyright_file):
                root.keep(copyright_file)
                break
    status = into / DPKG.relative_to("/") / "status"
    status.parent.mkdir(parents=True)
    status.write_text(dpkg_status(packages))
    (into / "etc" / "passwd").write_text(PASSWD)
    (into / "etc" / "group").write_text(GROUP)
    # Python's tempfile looks here first; the chart's read-only root makes it a mount point or
    # nothing, as before.
    (into / "tmp").mkdir()
    (into / "tmp").chmod(0o1777)
    # The loader's cache for exactly these libraries (-X: the links are already there).
    subprocess.run(["ldconfig", "-X", "-r", str(into)], check=True)
    shutil.rmtree(into / "var" / "cache" / "ldconfig", ignore_errors=True)
    print(
        f"rootfs.py: {len(root.files())} files from {len(packages)} Debian packages",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
