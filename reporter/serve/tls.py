"""TLS for a server: a certificate and key from files, read again when they change.

kube-scheduler calls an extender over HTTPS with `enableHTTPS: true` (verifying it with
`tlsConfig.caFile`/`caData`, and presenting its own certificate with `certFile`/`keyFile`).
cert-manager and Secret volumes renew a certificate by replacing the files (a Secret volume swaps a
symlink): the first handshake after a change reads them again, so a renewed certificate is served
without a restart. A pair that does not load (written half-way, a key of another certificate) is
logged once and the last good pair kept. With a client CA, a client must present a certificate it
signed: the scheduler's, and nobody else's (the CA file is read at start). Files are read within
MAX_PEM_BYTES before OpenSSL sees them (it reads to the end: `/dev/zero` would never end).
"""

from __future__ import annotations

import os
import ssl

import structlog

from reporter.errors import ConfigError
from reporter.inputs import MAX_PEM_BYTES, load_cert_chain, read_bounded

_Stamp = tuple[tuple[int, int, int], ...]


class ServingCertificate:
    """The server's TLS context: `context` goes to the server, and serves the current pair."""

    def __init__(
        self,
        cert_file: str,
        key_file: str,
        *,
        client_ca_file: str | None = None,
        log: structlog.typing.FilteringBoundLogger | None = None,
    ) -> None:
        """Raises ConfigError naming the file when the pair (or the client CA) does not load."""
        self._cert_file, self._key_file = cert_file, key_file
        self._log = log or structlog.get_logger("topo_reporter.tls")
        # Read once: every context, the first and each renewal's, verifies clients with it.
        self._client_ca = (
            None
            if client_ca_file is None
            else read_bounded(
                client_ca_file, limit=MAX_PEM_BYTES, what="client CA file", error=ConfigError
            )
        )
        try:
            self._seen = self._stamp()
        except OSError as e:
            raise ConfigError(f"cannot read TLS file {e.filename}: {e.strerror}") from e
        self.context = self._current = self._load()
        self.context.sni_callback = self._hello

    def _stamp(self) -> _Stamp:
        """What changes when either file is replaced (the target of a swapped symlink too)."""
        stats = (os.stat(path) for path in (self._cert_file, self._key_file))
        return tuple((s.st_ino, s.st_mtime_ns, s.st_size) for s in stats)

    def _load(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        certificate, key = (
            read_bounded(path, limit=MAX_PEM_BYTES, what=what, error=ConfigError).encode()
            for path, what in ((self._cert_file, "TLS certificate"), (self._key_file, "TLS key"))
        )
        try:
            load_cert_chain(context, certificate, key)
        except ssl.SSLError as e:
            raise ConfigError(
                f"TLS certificate {self._cert_file} and key {self._key_file} do not load: "
                f"{e.reason or e}"
            ) from None
        if self._client_ca is not None:
            try:
                context.load_verify_locations(cadata=self._client_ca)
            except ssl.SSLError as e:
                raise ConfigError(f"the client CA does not load: {e.reason or e}") from None
            context.verify_mode = ssl.CERT_REQUIRED
        return context

    def _hello(self, connection: ssl.SSLObject, server_name: str | None, _: object) -> None:
        """Called at every ClientHello (with or without SNI): serve the current pair."""
        try:
            stamp = self._stamp()
        except OSError:
            stamp = self._seen  # mid-swap: a moment later the new files are there
        if stamp != self._seen:
            self._seen = stamp
            try:
                self._current = self._load()
            except ConfigError as e:
                self._log.warning("tls_certificate_not_reloaded", error=str(e))
            else:
                self._log.info("tls_certificate_reloaded", certificate=self._cert_file)
        if self._current is not self.context:
            connection.context = self._current
