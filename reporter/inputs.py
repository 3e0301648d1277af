"""Reading the files a user or the node hands us, never more than a bound.

Every file the program reads as a whole goes through `read_bounded`: the CLI's FILE or stdin, the
settings file, the kubelet config, kubeconfigs and their token files, machine profiles. A path
such as `/dev/zero`, a log file passed by mistake or a hostile mount must end in one clear error
after reading at most `limit + 1` bytes, not in a hang or an exhausted memory. (sysfs goes through
`HostFS`, whose files are a page at most.)

What the commands' FILE holds is decoded by reporter.schema.reading, so reading the settings or a
kubeconfig loads no schema.
"""

from __future__ import annotations

import fcntl
import os
import ssl
import sys
import tempfile
from pathlib import Path
from typing import BinaryIO

from parsers.documents import MAX_CHARS
from reporter.errors import InputError, TopoReporterError

STDIN = "-"
MAX_PEM_BYTES = 1024 * 1024
"""A CA bundle, a certificate chain or a key: the system bundle is about 220 KiB."""


def size_text(limit: int) -> str:
    """`4 MiB`, `64 KiB`: a limit as people write it."""
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if limit >= scale and limit % scale == 0:
            return f"{limit // scale} {unit}"
    return f"{limit} bytes"


def read_bounded(
    source: str | Path, *, limit: int, what: str, error: type[TopoReporterError] = InputError
) -> str:
    """The UTF-8 text of the file `source` (`-`: stdin), refused when larger than `limit` bytes.

    Raises `error` (InputError unless told) naming `what` and `source` when the file cannot be
    read, is larger than `limit` or is not UTF-8; the OSError, if any, is its `__cause__`.
    """
    try:
        if str(source) == STDIN:
            data = sys.stdin.buffer.read(limit + 1)
        else:
            with _open(source) as f:
                data = f.read(limit + 1)
    except OSError as e:
        raise error(f"cannot read {what} {source}: {e.strerror or type(e).__name__}") from e
    if len(data) > limit:
        raise error(f"{what} {source} is larger than {size_text(limit)}: is it the right file?")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{what} {source} is not UTF-8 text (byte {e.start})") from None


def _open(source: str | Path) -> BinaryIO:
    """The file opened for reading without waiting for a writer.

    A plain open() of a FIFO waits until something opens it for writing: forever, for a FIFO
    nobody writes. Opened non-blocking, it returns at once; blocking again afterwards, a read
    waits for what a writer sends and sees end of file where there is no writer.
    """
    fd = os.open(source, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def load_cert_chain(context: ssl.SSLContext, certificate: bytes, key: bytes | None) -> None:
    """Load a PEM certificate chain (and its key) that was read within a bound into `context`.

    ssl loads a chain from files only, and reads them to their end: the bytes go through private
    copies, in a 0700 directory under the temp dir (the chart mounts an emptyDir on /tmp; the root
    file system is read-only), created 0600 and gone before this returns. Raises ssl.SSLError
    when they do not load.
    """
    with tempfile.TemporaryDirectory(prefix="topo-reporter-") as private:
        paths: list[str | None] = []
        for name, data in (("tls.crt", certificate), ("tls.key", key)):
            if data is None:
                paths.append(None)
                continue
            target = os.path.join(private, name)
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            paths.append(target)
        context.load_cert_chain(paths[0] or "", paths[1])


# What the commands read: a few kilobytes; a Node object with every annotation is at most a few
# hundred.


def read_input(source: str) -> str:
    """The text of FILE, or of stdin for `-`. Raises InputError with the reason."""
    return read_bounded(source, limit=MAX_CHARS, what="input")
