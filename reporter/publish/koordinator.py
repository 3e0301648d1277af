"""Writes Koordinator's device-info file into koordlet's xpu-device-infos directory, atomically.

koordlet reads every plain file of that directory and, when one does not decode, drops every
device it knows from files: a reader must never see a half-written file. The new content goes
to a private subdirectory first (koordlet skips directories), is flushed to disk, and is renamed
over the old file in one step. Nothing is written when the content is unchanged.

The agent runs as root in a directory other programs write too, so nothing there is trusted or
followed: every name is resolved from a descriptor of the directory; the scratch directory is
opened with O_NOFOLLOW (a symlink or file planted at its name is removed, never followed), the
staged file is created with O_EXCL | O_NOFOLLOW, and the current file is read only when it is a
regular file, checked before opening (lstat) and after (fstat), within MAX_FILE_BYTES and without
waiting on a FIFO. The rename replaces whatever holds the file's name (a symlink is replaced, its
target untouched).

When the file cannot be what koordlet needs (`reporter.schema.koordinator`), none is left: a file
koordlet's API server refuses, or one that misreports the GPUs, costs the node its GPUs in
Koordinator, while without it koordlet reports the GPUs NVML shows it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Callable
from pathlib import Path

import structlog

from reporter.errors import PublishError
from reporter.publish.client import EventType
from reporter.schema.koordinator import FILE_NAME, KoordinatorFileError, device_infos_text
from reporter.schema.model import Topology
from reporter.telling import Told

_SCRATCH = ".topo-reporter"
MAX_FILE_BYTES = 1 << 20
"""Far above our file (about 10 KiB for 16 GPUs): a larger file at our name is not ours."""
REASON_WITHHELD = "KoordinatorFileWithheld"
_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


class DeviceInfoFile:
    """The one file topo-reporter owns in koordlet's device-info directory."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.path = directory / FILE_NAME

    def write(self, text: str) -> bool:
        """Make the file hold `text`; True when it was written. Raises OSError."""
        data = text.encode()
        directory = os.open(self.directory, _DIRECTORY)
        try:
            if _current(directory) == data:
                return False
            scratch = _scratch(directory)
            try:
                _stage(scratch, data)
                os.replace(FILE_NAME, FILE_NAME, src_dir_fd=scratch, dst_dir_fd=directory)
            finally:
                os.close(scratch)
            os.fsync(directory)
            return True
        finally:
            os.close(directory)

    def remove(self) -> bool:
        """Take the file away; True when there was one. Raises OSError."""
        try:
            directory = os.open(self.directory, _DIRECTORY)
        except FileNotFoundError:
            return False
        try:
            # unlink never follows: a symlink at our name goes, its target stays.
            os.unlink(FILE_NAME, dir_fd=directory)
        except FileNotFoundError:
            return False
        finally:
            os.close(directory)
        return True


def _current(directory: int) -> bytes | None:
    """What our file holds; None when there is none, or what holds its name is not a regular file
    of at most MAX_FILE_BYTES (a symlink, a FIFO, a device, a directory): it is replaced, unread."""
    try:
        before = os.stat(FILE_NAME, dir_fd=directory, follow_symlinks=False)
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(before.st_mode) or before.st_size > MAX_FILE_BYTES:
        return None
    try:
        fd = os.open(
            FILE_NAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=directory
        )
    except OSError as e:
        if e.errno in (errno.ENOENT, errno.ELOOP):  # swapped since the stat: not ours to read
            return None
        raise
    try:
        now = os.fstat(fd)
        if (now.st_dev, now.st_ino) != (before.st_dev, before.st_ino) or not stat.S_ISREG(
            now.st_mode
        ):
            return None
        chunks: list[bytes] = []
        size = 0
        while size <= MAX_FILE_BYTES:
            chunk = os.read(fd, MAX_FILE_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        return None if size > MAX_FILE_BYTES else b"".join(chunks)
    finally:
        os.close(fd)


def _scratch(directory: int) -> int:
    """A descriptor of our private scratch directory, made when missing. Raises OSError."""
    for attempt in (1, 2):
        with contextlib.suppress(FileExistsError):
            os.mkdir(_SCRATCH, 0o700, dir_fd=directory)
        try:
            fd = os.open(_SCRATCH, _DIRECTORY | os.O_NOFOLLOW, dir_fd=directory)
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.ENOTDIR) and attempt == 1:
                # Something else holds our scratch name (a symlink, a file): removed, not followed.
                os.unlink(_SCRATCH, dir_fd=directory)
                continue
            raise
        held = os.fstat(fd)
        if held.st_uid != os.geteuid() or held.st_mode & 0o022:
            os.close(fd)
            raise PermissionError(
                errno.EPERM,
                "not the agent's own private directory (another user owns it, or others may "
                "write in it): remove it",
                _SCRATCH,
            )
        return fd
    raise AssertionError("unreachable: the second attempt returns or raises")


def _stage(scratch: int, data: bytes) -> None:
    """Write `data` to a new file in the scratch directory, flushed to disk. Raises OSError."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(FILE_NAME, flags, 0o644, dir_fd=scratch)
    except FileExistsError:
        # Left by an interrupted write, or planted: removed (unlink never follows), then made anew.
        os.unlink(FILE_NAME, dir_fd=scratch)
        fd = os.open(FILE_NAME, flags, 0o644, dir_fd=scratch)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


class DeviceInfoOutput:
    """The agent's Koordinator output: the file follows the published topology.

    A failed write is logged once per distinct error and retried with the next scan; it never
    stops the agent or its Node publishing. A topology the file cannot describe rightly (no PCIe
    root complex, a model that is no label value, ...) leaves no file: ours is removed, and the
    reason is logged and posted as a Warning Event on the Node, once per distinct reason.
    """

    def __init__(
        self,
        target: DeviceInfoFile,
        log: structlog.typing.FilteringBoundLogger,
        *,
        pcie_root: Callable[[str], str | None],
        event: Callable[[EventType, str, str], None],
    ) -> None:
        self._target = target
        self._log = log
        self._pcie_root = pcie_root
        """A GPU's PCIe root complex from its PCI address (sysfs), None when it does not resolve."""
        self._event = event
        self._error: Told[str | None] = Told(None)
        self._withheld: Told[str | None] = Told(None)

    def __call__(self, topology: Topology) -> None:
        roots = {}
        for gpu in topology.gpus:
            root = None if gpu.pci is None else self._pcie_root(gpu.pci)
            if root is not None:
                roots[gpu.index] = root
        try:
            text = device_infos_text(topology, roots)
        except KoordinatorFileError as e:
            self._withhold(str(e))
            return
        self._withheld.changed(None)
        try:
            wrote = self._target.write(text)
        except OSError as e:
            self._failed(e)
            return
        self._error.changed(None)
        if wrote:
            self._log.info("koordinator_file_written", path=str(self._target.path))

    def _withhold(self, reason: str) -> None:
        try:
            removed = self._target.remove()
        except OSError as e:
            self._failed(e)
            removed = False
        if not self._withheld.changed(reason):
            return
        self._log.warning(
            "koordinator_file_withheld", reason=reason, path=str(self._target.path), removed=removed
        )
        message = (
            f"Koordinator device-info file not written: {reason}; koordlet reports the GPUs "
            "NVML shows it, without NVLink partitions"
        )
        try:
            self._event(EventType.WARNING, REASON_WITHHELD, message)
        except PublishError as e:
            # Best effort, as every Event: the log line above says it too.
            self._log.warning("event_failed", reason=REASON_WITHHELD, error=str(e))

    def _failed(self, e: OSError) -> None:
        error = f"{self._target.path}: {e.strerror or e}"
        if self._error.changed(error):
            self._log.error("koordinator_file_failed", error=error)
