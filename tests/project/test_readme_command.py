"""The README's test command: `.ci/run` runs it exactly as written, and its head (tests/prereqs.sh)
installs only what a machine lacks, on each kind of Debian machine.

The machines are doubles: a directory of commands on PATH standing for what is installed, and
doubles of apt-get (which refuses Debian's `npm` beside NodeSource's `nodejs`, exit 100, as apt
does: that `nodejs` conflicts with `npm` and provides it), dpkg-query, sudo and id. The real
shell, coreutils and python3 run the script. The Go download itself (70 MB) is not made here: each
machine has a Go 1.26 on PATH.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_MARKED_BLOCK = re.compile(r"^<!-- ci: the test command -->\n```sh\n(.*?)\n```$", re.S | re.M)
REAL_TOOLS = (
    "sh",
    "bash",
    "env",
    "awk",
    "sed",
    "grep",
    "cut",
    "cat",
    "dirname",
    "mktemp",
    "sha256sum",
    "chmod",
    "cp",
    "rm",
    "mkdir",
)
"""What every machine has: the shell and coreutils (with python3, the script's own tools)."""

APT_GET = r"""#!/bin/sh
# A double of apt-get: installs by writing the package's commands into this directory.
echo "$SUDO_MARK apt-get $*" >> "$MACHINE/log"
[ "$1" = update ] && exit 0
packages=""
for word in "$@"; do
    case "$word" in -*|install) ;; *=*) ;; *) packages="$packages $word" ;; esac
done
for p in $packages; do
    nodesource=""
    grep -qx nodejs-nodesource "$MACHINE/installed" && nodesource=1
    [ -e "$MACHINE/nodesource-repository" ] && echo " $packages " | grep -q ' nodejs ' &&
        nodesource=1
    if [ "$p" = npm ] && [ -n "$nodesource" ]; then
        echo "The following packages have unmet dependencies:" >&2
        echo " nodejs : Conflicts: npm" >&2
        echo "E: Unable to correct problems, you have held broken packages." >&2
        exit 100
    fi
done
for p in $packages; do
    case "$p" in
        nodejs)
            if [ -e "$MACHINE/nodesource-repository" ]; then
                echo nodejs-nodesource >> "$MACHINE/installed"
                tool npm
            fi
            tool node
            ;;
        graphviz) tool dot ;;
        iproute2) tool ip ;;
        lldpd)
            tool lldpd
            tool lldpcli
            # As the real package's postinst: invoke-rc.d starts the service unless policy-rc.d
            # answers 101.
            policy=0
            [ -x "$POLICY_RC_D" ] && { "$POLICY_RC_D" lldpd start; policy=$?; }
            [ "$policy" = 101 ] || echo 'lldpd started' >> "$MACHINE/log"
            ;;
        containerd)
            tool containerd
            tool ctr
            policy=0
            [ -x "$POLICY_RC_D" ] && { "$POLICY_RC_D" containerd start; policy=$?; }
            [ "$policy" = 101 ] || echo 'containerd started' >> "$MACHINE/log"
            ;;
        npm|jq|openssl|gcc|curl|podman|runc|mmdebstrap) tool "$p" ;;
        ibsim-utils) tool ibsim ;;
        opensm)
            tool opensm
            policy=0
            [ -x "$POLICY_RC_D" ] && { "$POLICY_RC_D" opensm start; policy=$?; }
            [ "$policy" = 101 ] || echo 'opensm started' >> "$MACHINE/log"
            ;;
    esac
    echo "$p" >> "$MACHINE/installed"
done
"""

TOOL = """#!/bin/sh
# Puts a command double on PATH: `node` prints the machine's Node.js version.
case "$1" in
    node) printf '#!/bin/sh\\necho v%s\\n' "$(cat "$MACHINE/node-version")" > "$MACHINE/bin/node" ;;
    *) printf '#!/bin/sh\\nexit 0\\n' > "$MACHINE/bin/$1" ;;
esac
chmod +x "$MACHINE/bin/$1"
"""

DPKG_QUERY = """#!/bin/sh
# dpkg-query -W -f='${Status}' PACKAGE
for last; do :; done
grep -qx "$last" "$MACHINE/installed" && printf 'install ok installed' && exit 0
exit 1
"""

SUDO = """#!/bin/sh
echo sudo >> "$MACHINE/log"
SUDO_MARK=sudo exec "$@"
"""


@dataclass(frozen=True)
class Machine:
    root: Path

    def run(self, command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", "-c", command],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            env={
                "PATH": str(self.root / "bin"),
                "MACHINE": str(self.root),
                "HOME": str(self.root),
                "POLICY_RC_D": str(self.root / "policy-rc.d"),
            },
            check=False,
        )

    def log(self) -> list[str]:
        path = self.root / "log"
        return path.read_text().splitlines() if path.exists() else []


def machine(
    tmp_path: Path,
    *,
    commands: tuple[str, ...] = (),
    packages: tuple[str, ...] = (),
    node: str = "20.19.2",
    nodesource: bool = False,
    root: bool = True,
) -> Machine:
    """A Debian machine with these `commands` and dpkg `packages` installed; NodeSource's
    repository configured when `nodesource` (apt's nodejs is then theirs, npm inside)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in REAL_TOOLS:
        found = shutil.which(tool)
        assert found is not None, tool
        (bin_dir / tool).symlink_to(found)
    # The interpreter itself: `python3` on PATH may be a version manager's shim.
    (bin_dir / "python3").symlink_to(Path(sys.executable).resolve())
    (tmp_path / "installed").write_text("".join(f"{p}\n" for p in packages))
    (tmp_path / "node-version").write_text(node)
    if nodesource:
        (tmp_path / "nodesource-repository").touch()
    doubles = {
        "apt-get": APT_GET,
        "tool": TOOL,
        "dpkg-query": DPKG_QUERY,
        "sudo": SUDO,
        "id": f"#!/bin/sh\necho {0 if root else 1000}\n",
        # A Go 1.26 on PATH: the 70 MB download is not made here.
        "go": "#!/bin/sh\necho go1.26.8\n",
    }
    for name, text in doubles.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    made = Machine(tmp_path)
    for command in commands:
        made.run(f"tool {command}")
    return made


def readme_command() -> str:
    found = _MARKED_BLOCK.findall((ROOT / "README.md").read_text(encoding="utf-8"))
    assert len(found) == 1, "README.md marks one sh block as the test command"
    return str(found[0])


def prerequisites() -> str:
    """The README command's first link: what a fresh machine runs before Python is there."""
    return readme_command().split(" && ")[0]


def test_ci_runs_the_readme_command_exactly_as_written() -> None:
    printed = subprocess.run(
        [str(ROOT / ".ci" / "run"), "--print"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert printed.stdout == readme_command() + "\n"
    # The line .ci/run executes is that command as a line of its own, once.
    script = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert script.count(readme_command()) == 1
    links = readme_command().split(" && ")
    assert links[0] == "sh tests/prereqs.sh"
    assert links[-1] == "pytest"
    assert "\n" not in readme_command()


IMAGE_TOOLS = ("podman", "runc", "mmdebstrap")
LLDP_TOOLS = ("ip", "lldpd", "lldpcli")
IB_TOOLS = ("ibsim", "opensm")
NODE_TOOLS = ("containerd", "ctr")
EVERYTHING = (
    "dot", "jq", "openssl", "gcc", "node", "npm", *IMAGE_TOOLS, *IB_TOOLS, *LLDP_TOOLS, *NODE_TOOLS,
)  # fmt: skip
LLDPD = "apt-get install -y -qq --no-install-recommends lldpd"
OPENSM = "apt-get install -y -qq --no-install-recommends opensm"
CONTAINERD = "apt-get install -y -qq --no-install-recommends containerd"
BUILD = ("libc6-dev", "libpfm4-dev", "containernetworking-plugins")


@pytest.mark.parametrize(
    ("kind", "installs"),
    [
        (
            {},
            [
                "apt-get update -qq",
                "apt-get install -y -qq --no-install-recommends graphviz jq openssl gcc libc6-dev "
                "libpfm4-dev podman runc mmdebstrap ibsim-utils iproute2 "
                "containernetworking-plugins nodejs",
                "apt-get install -y -qq --no-install-recommends npm",
                LLDPD,
                OPENSM,
                CONTAINERD,
            ],
        ),
        (
            {"commands": ("node", "npm"), "packages": ("nodejs-nodesource",)},
            [
                "apt-get update -qq",
                "apt-get install -y -qq --no-install-recommends graphviz jq openssl gcc libc6-dev "
                "libpfm4-dev podman runc mmdebstrap ibsim-utils iproute2 "
                "containernetworking-plugins",
                LLDPD,
                OPENSM,
                CONTAINERD,
            ],
        ),
        (
            {"nodesource": True},
            [
                "apt-get update -qq",
                "apt-get install -y -qq --no-install-recommends graphviz jq openssl gcc libc6-dev "
                "libpfm4-dev podman runc mmdebstrap ibsim-utils iproute2 "
                "containernetworking-plugins nodejs",
                LLDPD,
                OPENSM,
                CONTAINERD,
            ],
        ),
        ({"commands": EVERYTHING, "packages": BUILD}, []),
        (
            {
                "commands": (
                    "dot",
                    "jq",
                    "openssl",
                    "gcc",
                    "node",
                    *IMAGE_TOOLS,
                    *IB_TOOLS,
                    *LLDP_TOOLS,
                    *NODE_TOOLS,
                ),
                "packages": BUILD,
            },
            ["apt-get update -qq", "apt-get install -y -qq --no-install-recommends npm"],
        ),
    ],
    ids=[
        "a fresh Debian machine gets Debian's nodejs, then its npm",
        "NodeSource's nodejs already there: no npm asked for (Debian's conflicts with it)",
        "NodeSource's repository: its nodejs, which brings npm",
        "a machine with everything is left alone, without apt-get or sudo",
        "Debian's nodejs without npm gets only npm",
    ],
)
def test_the_readme_prerequisites_install_only_what_is_missing(
    tmp_path: Path, kind: dict[str, object], installs: list[str]
) -> None:
    fresh = machine(tmp_path, **kind)  # type: ignore[arg-type]
    done = fresh.run(prerequisites())
    assert done.returncode == 0, done.stderr
    assert [line.strip() for line in fresh.log()] == installs
    # A second run has nothing left to do.
    (tmp_path / "log").unlink(missing_ok=True)
    assert fresh.run(prerequisites()).returncode == 0
    assert fresh.log() == []


def test_not_root_installs_through_sudo(tmp_path: Path) -> None:
    fresh = machine(
        tmp_path,
        commands=EVERYTHING,
        root=False,
    )
    done = fresh.run(prerequisites())
    assert done.returncode == 0, done.stderr
    assert fresh.log() == [
        "sudo",
        "sudo apt-get update -qq",
        "sudo",
        "sudo apt-get install -y -qq --no-install-recommends libc6-dev libpfm4-dev "
        "containernetworking-plugins",
    ]


def test_a_nodejs_too_old_for_the_mermaid_check_is_one_clear_line(tmp_path: Path) -> None:
    """Debian 12's nodejs is 18: jsdom and mermaid in tests/mermaid need 20.19."""
    old = machine(tmp_path, commands=EVERYTHING, packages=BUILD, node="18.20.4")
    done = old.run(prerequisites())
    assert done.returncode == 1
    assert done.stderr.startswith("tests/prereqs.sh: Node.js 20.19 or newer is needed")
    assert "this is 18.20.4" in done.stderr
    assert done.stderr.count("\n") == 1


def test_the_script_is_posix_sh() -> None:
    """Fresh Debian runs `sh` as dash: the script must parse there (and in bash's POSIX mode)."""
    shell = shutil.which("dash") or shutil.which("sh")
    assert shell is not None
    for check in ([shell, "-n"], ["bash", "--posix", "-n"]):
        parsed = subprocess.run(
            [*check, str(ROOT / "tests" / "prereqs.sh")],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
        assert parsed.returncode == 0, parsed.stderr


@pytest.mark.parametrize(
    ("own_policy", "systemd"),
    [(None, False), ("#!/bin/sh\nexit 0\n", False), (None, True)],
    ids=[
        "no policy-rc.d: one denies while lldpd installs, and is gone after",
        "the machine's own policy-rc.d (allowing starts) is back after",
        "under systemd the service is also disabled and stopped",
    ],
)
def test_lldpd_is_installed_without_its_service_starting(
    tmp_path: Path, own_policy: str | None, systemd: bool
) -> None:
    everything_but_lldpd = tuple(c for c in EVERYTHING if c not in ("lldpd", "lldpcli"))
    fresh = machine(tmp_path, commands=everything_but_lldpd, packages=BUILD)
    policy = tmp_path / "policy-rc.d"
    if own_policy is not None:
        policy.write_text(own_policy)
        policy.chmod(0o755)
    if systemd:
        systemctl = tmp_path / "bin" / "systemctl"
        systemctl.write_text('#!/bin/sh\necho "systemctl $*" >> "$MACHINE/log"\n')
        systemctl.chmod(0o755)
    done = fresh.run(prerequisites())
    assert done.returncode == 0, done.stderr
    # The double logs "lldpd started ..." where policy-rc.d let the package start it.
    assert [line.strip() for line in fresh.log()] == [
        "apt-get update -qq",
        LLDPD,
        *(["systemctl disable --now lldpd"] if systemd else []),
    ]
    if own_policy is None:
        assert not policy.exists()
    else:
        assert policy.read_text() == own_policy
    assert not (tmp_path / "policy-rc.d.prereqs-saved").exists()
