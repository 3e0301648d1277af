"""Writes Koordinator's device-info file into koordlet's xpu-device-infos directory, atomically.

koordlet reads every plain file of that directory and, when one does not decode, drops every
device it knows from files: a reader must never see a half-written file. The new content goes
to a private subdirectory first (koordlet skips directories), is flushed to disk, and is renamed
over the old file in one step. Nothing is written when the content is unchanged.
"""

from __future__ import annotations

import os
from pathlib import Path

import structlog

from reporter.schema.koordinator import FILE_NAME, device_infos_text
from reporter.schema.model import Topology

_SCRATCH = ".topo-reporter"


class DeviceInfoFile:
    """The one file topo-reporter owns in koordlet's device-info directory."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.path = directory / FILE_NAME

    def write(self, text: str) -> bool:
        """Make the file hold `text`; True when it was written. Raises OSError."""
        data = text.encode()
        try:
            if self.path.read_bytes() == data:
                return False
        except FileNotFoundError:
            pass
        scratch = self.directory / _SCRATCH
        scratch.mkdir(mode=0o755, exist_ok=True)
        staged = scratch / FILE_NAME
        fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(staged, self.path)
        return True


class DeviceInfoOutput:
    """The agent's Koordinator output: the file follows the published topology.

    A failed write is logged once per distinct error and retried with the next scan; it never
    stops the agent or its Node publishing.
    """

    def __init__(self, target: DeviceInfoFile, log: structlog.typing.FilteringBoundLogger) -> None:
        self._target = target
        self._log = log
        self._error: str | None = None

    def __call__(self, topology: Topology) -> None:
        try:
            wrote = self._target.write(device_infos_text(topology))
        except OSError as e:
            error = f"{self._target.path}: {e.strerror or e}"
            if error != self._error:
                self._log.error("koordinator_file_failed", error=error)
            self._error = error
            return
        self._error = None
        if wrote:
            self._log.info("koordinator_file_written", path=str(self._target.path))
