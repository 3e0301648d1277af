"""The host's sysfs, seen through one object rooted at a directory or held in memory.

Every sysfs read of the agent goes through a `HostFS`: the real one is rooted where the host's
`/sys` is mounted (`--sysfs-root`, `/host/sys` in the chart), the simulated one lives in memory so
that `--simulate` works on a read-only root filesystem. The NVIDIA driver's files in procfs
(`/proc/driver/nvidia`) are read through a second HostFS rooted at `/proc`. Paths handed to a
HostFS are relative to its root (`bus/pci/devices`), never absolute. A HostFS only reads: it must
never write, create or follow a symlink out of its root.

Every method raises `OSError` (`FileNotFoundError` for what is absent, broken symlinks included):
callers treat a file they cannot read as "the host does not say".
"""

from __future__ import annotations

import errno
import os
import posixpath
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

# A sysfs file we read is a short line; a bound keeps a hostile or broken mount from costing memory.
MAX_READ_BYTES = 64 * 1024
# The kernel allows 40 nested symlinks; a loop in a fake tree must end the same way.
_MAX_SYMLINK_HOPS = 40


class HostFS(Protocol):
    """Read-only access to a sysfs tree."""

    def read_text(self, path: str) -> str:
        """The content of a file (at most MAX_READ_BYTES). Raises OSError."""
        ...

    def listdir(self, path: str) -> list[str]:
        """The sorted entry names of a directory. Raises OSError."""
        ...

    def realpath(self, path: str) -> str:
        """`path` with every symlink resolved, relative to the root. Raises OSError."""
        ...


class DirHostFS:
    """A sysfs tree on disk: the host's `/sys`, a bind mount of it, or a test fixture."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def _host_path(self, path: str) -> Path:
        relative = posixpath.normpath(path)
        if relative.startswith(("/", "..")):
            raise FileNotFoundError(errno.ENOENT, "path leaves the sysfs root", path)
        return self.root / relative

    def read_text(self, path: str) -> str:
        with self._host_path(path).open("rb") as f:
            return f.read(MAX_READ_BYTES).decode("utf-8", errors="replace")

    def listdir(self, path: str) -> list[str]:
        return sorted(os.listdir(self._host_path(path)))

    def realpath(self, path: str) -> str:
        root = os.path.realpath(self.root)
        resolved = os.path.realpath(self._host_path(path), strict=True)
        if resolved != root and not resolved.startswith(root + os.sep):
            raise FileNotFoundError(errno.ENOENT, "symlink leaves the sysfs root", path)
        return os.path.relpath(resolved, root)


class MemoryHostFS:
    """A sysfs tree held in memory: files, directories and relative symlinks.

    `files` maps a path to its content, `symlinks` a path to its target relative to the link's
    directory, as the kernel writes them (`../../../devices/pci0000:00/0000:00:01.0`). Directories
    are implied by the paths under them.
    """

    def __init__(self, files: Mapping[str, str], symlinks: Mapping[str, str]) -> None:
        self._files = dict(files)
        self._links = dict(symlinks)
        self._children: dict[str, set[str]] = {"": set()}
        for path in (*self._files, *self._links):
            parts = path.split("/")
            for depth in range(len(parts)):
                parent = "/".join(parts[:depth])
                self._children.setdefault(parent, set()).add(parts[depth])

    def _resolve(self, path: str) -> str:
        pending = [p for p in posixpath.normpath(path).split("/") if p not in ("", ".")]
        resolved: list[str] = []
        hops = 0
        while pending:
            part = pending.pop(0)
            if part == "..":
                if not resolved:
                    raise FileNotFoundError(errno.ENOENT, "path leaves the sysfs root", path)
                resolved.pop()
                continue
            current = "/".join([*resolved, part])
            target = self._links.get(current)
            if target is None:
                resolved.append(part)
                continue
            hops += 1
            if hops > _MAX_SYMLINK_HOPS:
                raise OSError(errno.ELOOP, "too many levels of symbolic links", path)
            if target.startswith("/"):
                resolved = []
            pending = [p for p in target.split("/") if p not in ("", ".")] + pending
        joined = "/".join(resolved)
        if joined not in self._files and joined not in self._children:
            raise FileNotFoundError(errno.ENOENT, "no such file or directory", path)
        return joined

    def read_text(self, path: str) -> str:
        resolved = self._resolve(path)
        if resolved not in self._files:
            raise IsADirectoryError(errno.EISDIR, "is a directory", path)
        return self._files[resolved][:MAX_READ_BYTES]

    def listdir(self, path: str) -> list[str]:
        resolved = self._resolve(path)
        if resolved in self._files:
            raise NotADirectoryError(errno.ENOTDIR, "not a directory", path)
        return sorted(self._children.get(resolved, ()))

    def realpath(self, path: str) -> str:
        return self._resolve(path)
