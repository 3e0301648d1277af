"""The agent's lean Kubernetes client: its HTTP transport over urllib3, without `kubernetes`.

Importing the official client nearly doubles the agent's memory and was most of its start-up (its
package imports every generated model; bench/README.md, "Footprint"), for a handful of calls.
`RestTransport` sends them itself, and `RestApiClient` is the resource-generic
`reporter.publish.api.ApiClient` over it (`reporter.publish.wire`, shared with the official
client, so messages, retries and Retry-After are the same with either).

Credentials come from the pod's service account or from a kubeconfig that uses only what this
module understands (`load_rest_config`); a kubeconfig needing an `exec` or `auth-provider`
plugin (EKS, GKE, OIDC), a proxy or anything else is refused with `LeanClientUnsupportedError`,
and the caller falls back to the official client. A token file is re-read when it changes or
every minute (bound service-account tokens rotate); as in client-go, its last good content wins
over an inline `token`, which is used only until the file can first be read. This module must
never import `kubernetes`, and never log or put into a message a token, a key or a kubeconfig's
content.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import ssl
import threading
import time
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

import urllib3

from parsers.documents import DocumentBoundError, load_yaml
from parsers.errors import ParseError, excerpt
from reporter.errors import ApiTransientError, CredentialsError, InputError
from reporter.inputs import MAX_PEM_BYTES, load_cert_chain, read_bounded
from reporter.publish import errors_map
from reporter.publish.client import COMPONENT
from reporter.publish.wire import ApiRequest, WireClient

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
TOKEN_REFRESH_S = 60.0
# A kubeconfig with a few dozen clusters and their certificates is well under 1 MiB; a bound
# service account token or an OIDC token is a few KiB.
MAX_KUBECONFIG_BYTES = 4 * 1024 * 1024
MAX_TOKEN_BYTES = 64 * 1024
"""A token file is re-read at least this often, even when it looks unchanged."""

_CLUSTER_KEYS = frozenset(
    {"server", "certificate-authority", "certificate-authority-data", "insecure-skip-tls-verify"}
)
_USER_KEYS = frozenset(
    {"token", "tokenFile", "client-certificate", "client-certificate-data", "client-key"}
    | {"client-key-data"}
)
# Keys that carry nothing the connection depends on.
_IGNORED_KEYS = frozenset({"extensions"})


class LeanClientUnsupportedError(CredentialsError):
    """The credentials need something only the official client does (a plugin, a proxy)."""


@dataclass(frozen=True, slots=True)
class RestConfig:
    """Where the API server is and how to authenticate to it. Never printed (it holds secrets)."""

    server: str
    """`https://host:port` (no trailing slash)."""
    source: str
    """Where this came from, for messages: "in-cluster" or the kubeconfig's path."""
    ca_file: str | None = None
    ca_data: str | None = None
    """PEM text of the cluster CA; with ca_file None and both None, the system's trust store."""
    token: str | None = None
    """The inline token: with a token_file too, used only until the file can first be read."""
    token_file: str | None = None
    """Read for each request when changed, and every TOKEN_REFRESH_S (it rotates)."""
    client_cert_file: str | None = None
    client_key_file: str | None = None
    client_cert_data: bytes | None = None
    client_key_data: bytes | None = None
    insecure: bool = False

    def __repr__(self) -> str:
        return f"RestConfig(server={excerpt(self.server)}, source={excerpt(self.source)})"


# -- loading ---------------------------------------------------------------------------------


def load_rest_config(
    kubeconfig: str | None,
    *,
    environ: Mapping[str, str] | None = None,
    service_account_dir: Path = SERVICE_ACCOUNT_DIR,
) -> RestConfig:
    """The named kubeconfig, else in-cluster (KUBERNETES_SERVICE_HOST set), else ~/.kube/config.

    Raises LeanClientUnsupportedError when only the official client can use these credentials, and
    CredentialsError (one line, naming the path, never the content) when they cannot be loaded.
    """
    env = os.environ if environ is None else environ
    if kubeconfig is None and env.get("KUBERNETES_SERVICE_HOST"):
        return _in_cluster(env, service_account_dir)
    path = kubeconfig_path(kubeconfig, env)
    if os.pathsep in path:
        raise LeanClientUnsupportedError(f"{path} is a list of kubeconfigs to merge")
    config = _from_kubeconfig(Path(path))
    _refuse_proxy(config.server)
    return config


def kubeconfig_path(kubeconfig: str | None, environ: Mapping[str, str]) -> str:
    """The kubeconfig path(s) read outside a pod: the one named, else KUBECONFIG's, else
    ~/.kube/config. Both clients read these, and their errors name them."""
    return kubeconfig or environ.get("KUBECONFIG") or str(Path.home() / ".kube" / "config")


def in_cluster_source(directory: Path = SERVICE_ACCOUNT_DIR) -> str:
    """How an error names the pod's own credentials."""
    return f"the in-cluster service account ({directory})"


def unloadable(where: str, why: str, *, context: str | None = None) -> CredentialsError:
    """The one error of credentials that do not load, for every command and both clients:
    `where` is the path tried (or in_cluster_source()), `why` what went wrong, never content."""
    if context is not None:
        where += f" with context {context!r}"
    return CredentialsError(
        f"cannot load Kubernetes credentials from {where} ({why}): pass --kubeconfig or set "
        "KUBECONFIG to a readable kubeconfig"
        + (" that has that context" if context is not None else ", or run in a pod")
    )


def _in_cluster(env: Mapping[str, str], directory: Path) -> RestConfig:
    host, port = env.get("KUBERNETES_SERVICE_HOST", ""), env.get("KUBERNETES_SERVICE_PORT", "")
    where = in_cluster_source(directory)
    if not port:
        raise unloadable(where, "KUBERNETES_SERVICE_PORT is not set")
    token, ca = directory / "token", directory / "ca.crt"
    for required in (token, ca):
        if not required.is_file():
            raise unloadable(where, f"{required.name} is missing")
    # IPv6 service addresses go in brackets, as the official loader writes them.
    netloc = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    server = f"https://{netloc}"
    _refuse_proxy(server)
    return RestConfig(server=server, source="in-cluster", ca_file=str(ca), token_file=str(token))


def _named(entries: Any, name: str, kind: str, where: str) -> dict[str, Any]:
    for entry in entries or ():
        if isinstance(entry, dict) and entry.get("name") == name:
            found = entry.get(kind)
            return found if isinstance(found, dict) else {}
    raise unloadable(
        where, f"its current-context names {kind} {excerpt(name)}, which it does not define"
    )


def read_kubeconfig(path: Path) -> Any:
    """The YAML document of a kubeconfig, read within MAX_KUBECONFIG_BYTES by the bounded loader.

    Raises CredentialsError naming the path (never the content); its `__cause__` is the OSError,
    if any.
    """
    where = str(path)
    try:
        return load_yaml(read_bounded(path, limit=MAX_KUBECONFIG_BYTES, what="kubeconfig"))
    except InputError as e:
        cause = e.__cause__
        raise unloadable(where, type(cause).__name__ if cause else str(e)) from cause
    except DocumentBoundError as e:
        raise unloadable(where, str(e)) from None
    except ParseError as e:
        raise unloadable(where, "not YAML") from e


def _from_kubeconfig(path: Path) -> RestConfig:
    where = str(path)
    doc = read_kubeconfig(path)
    if not isinstance(doc, dict):
        raise unloadable(where, "not a kubeconfig")
    current = doc.get("current-context")
    if not current:
        raise CredentialsError(
            f"cannot load Kubernetes credentials from {where}: it sets no current-context: run "
            "`kubectl config use-context NAME` or pass a kubeconfig that sets one"
        )
    context = _named(doc.get("contexts"), str(current), "context", where)
    cluster = _named(doc.get("clusters"), str(context.get("cluster", "")), "cluster", where)
    user = (
        _named(doc.get("users"), str(context["user"]), "user", where) if context.get("user") else {}
    )
    for section, allowed in ((user, _USER_KEYS), (cluster, _CLUSTER_KEYS)):
        unknown = sorted(k for k, v in section.items() if v and k not in allowed | _IGNORED_KEYS)
        if unknown:
            # exec and auth-provider plugins (EKS, GKE, OIDC), basic auth, proxy-url,
            # tls-server-name: the official client knows them, and is used instead.
            raise LeanClientUnsupportedError(f"{where} uses {', '.join(unknown)}")
    server = str(cluster.get("server") or "").rstrip("/")
    if not server:
        raise unloadable(where, f"cluster {excerpt(context.get('cluster'))} has no server")
    base = path.parent

    def file(section: Mapping[str, Any], key: str) -> str | None:
        value = section.get(key)
        return str(base / str(value)) if value else None

    def data(section: Mapping[str, Any], key: str) -> bytes | None:
        value = section.get(key)
        if not value:
            return None
        try:
            return base64.b64decode(str(value), validate=True)
        except (binascii.Error, ValueError) as e:
            raise unloadable(where, f"{key} is not base64") from e

    # Where both a file and its `-data` are given, the file wins, as in the official client: the
    # same kubeconfig means the same credentials with either. A `token` is kept beside its
    # `tokenFile`: client-go sends it while the file cannot be read (see BearerToken).
    ca_file = file(cluster, "certificate-authority")
    ca_data = None if ca_file else data(cluster, "certificate-authority-data")
    token_file = file(user, "tokenFile")
    cert_file, key_file = file(user, "client-certificate"), file(user, "client-key")
    return RestConfig(
        server=server,
        source=where,
        ca_file=ca_file,
        ca_data=ca_data.decode("ascii", "replace") if ca_data else None,
        token=str(user["token"]) if user.get("token") else None,
        token_file=token_file,
        client_cert_file=cert_file,
        client_key_file=key_file,
        client_cert_data=None if cert_file else data(user, "client-certificate-data"),
        client_key_data=None if key_file else data(user, "client-key-data"),
        insecure=bool(cluster.get("insecure-skip-tls-verify")),
    )


def _refuse_proxy(server: str) -> None:
    """The official client goes through HTTPS_PROXY when it applies; the lean one does not."""
    host = urlsplit(server).hostname or ""
    scheme = urlsplit(server).scheme
    if urllib.request.getproxies().get(scheme) and not urllib.request.proxy_bypass(host):
        raise LeanClientUnsupportedError(f"a {scheme} proxy is set in the environment for {host}")


# -- the connection --------------------------------------------------------------------------


class BearerToken:
    """The token to send, as client-go's bearer round tripper picks it.

    Without a file, the fixed token. With one, the file's content, re-read when the file changes
    and at least every TOKEN_REFRESH_S; when it cannot be read, its last good content, else the
    inline token (client-go's cached file token source and `BearerToken` fallback). Only when
    there is neither is the failure raised. Both clients use this, so one kubeconfig means one
    token whichever client runs.
    """

    def __init__(
        self, token: str | None, path: str | None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._fixed = token
        self.path = path
        """The token file, if any."""
        self._clock = clock
        self._lock = threading.Lock()
        self._seen: tuple[int, int, int] | None = None
        self._read_at = 0.0
        self._value: str | None = None

    def value(self, source: str) -> str | None:
        """Raises CredentialsError for a file too large to be a token, ApiTransientError for one
        that cannot be read, when no earlier content or inline token can stand in.

        The kubelet rewrites a projected token file atomically, and a remount can briefly hide
        it: the agent stays up, not ready, and retries like any other failed API call.
        """
        if self.path is None:
            return self._fixed
        with self._lock:
            try:
                self._refresh(self.path)
            except InputError as e:
                if self._value or self._fixed:
                    return self._value or self._fixed
                # A file that never ends is the wrong file: no retry cures it.
                raise CredentialsError(
                    f"cannot read the bearer token file of {source} ({e}): check "
                    "the service account token mount (automountServiceAccountToken) or tokenFile"
                ) from e
            except OSError as e:
                if self._value or self._fixed:
                    return self._value or self._fixed
                why = type(e).__name__
                raise ApiTransientError(
                    f"cannot read the bearer token file of {source} ({why}): check "
                    "the service account token mount (automountServiceAccountToken) or tokenFile"
                ) from e
            return self._value or self._fixed

    def _refresh(self, path: str) -> None:
        st = os.stat(path)
        stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        if stamp != self._seen or self._clock() - self._read_at >= TOKEN_REFRESH_S:
            token = read_bounded(path, limit=MAX_TOKEN_BYTES, what="token file").strip()
            # client-go refuses an empty token file; the last good token stays.
            if token:
                self._value = token
            self._seen, self._read_at = stamp, self._clock()


def pem_file(path: str, what: str) -> str:
    """A TLS file named by a kubeconfig, read within MAX_PEM_BYTES before OpenSSL sees it: OpenSSL
    reads a file to its end, and `/dev/zero` or a FIFO named by mistake would never end."""
    text = read_bounded(path, limit=MAX_PEM_BYTES, what=what, error=CredentialsError)
    if not text.strip():
        raise CredentialsError(f"{what} {path} is empty: is it the right file?")
    return text


def _ssl_context(config: RestConfig) -> ssl.SSLContext:
    ca_data = (
        config.ca_data
        if config.ca_file is None
        else pem_file(config.ca_file, "certificate-authority file")
    )
    context = ssl.create_default_context(cadata=ca_data)
    if config.insecure:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if config.client_cert_file or config.client_cert_data:
        _load_client_certificate(context, config)
    return context


def _load_client_certificate(context: ssl.SSLContext, config: RestConfig) -> None:
    """Client certificate and key, each read within MAX_PEM_BYTES before OpenSSL sees it."""

    def content(data: bytes | None, named: str | None, what: str) -> bytes | None:
        if data is not None or named is None:
            return data
        return pem_file(named, what).encode("utf-8")

    certificate = content(
        config.client_cert_data, config.client_cert_file, "client-certificate file"
    )
    key = content(config.client_key_data, config.client_key_file, "client-key file")
    load_cert_chain(context, certificate or b"", key)


def _user_agent() -> str:
    try:
        return f"{COMPONENT}/{version('topo-reporter')}"
    except PackageNotFoundError:
        return COMPONENT


class RestTransport:
    """JSON requests to one API server over one small urllib3 pool; urllib3 never retries.

    `reporter.publish.retry` owns retrying, as with the official client (its retries are off too).
    """

    def __init__(
        self,
        config: RestConfig,
        *,
        request_timeout_s: tuple[float, float] = (5.0, 15.0),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Raises CredentialsError when the CA or the client certificate cannot be loaded."""
        self.host = config.server
        self._source = config.source
        try:
            context = _ssl_context(config)
        except (OSError, ssl.SSLError, ValueError) as e:
            raise CredentialsError(
                f"cannot load the TLS files of {config.source} ({type(e).__name__}): check the "
                "certificate-authority and client-certificate/client-key entries"
            ) from e
        # urllib3 sets verify_mode and matches the host name itself unless told not to.
        verify: dict[str, Any] = (
            {"cert_reqs": ssl.CERT_NONE, "assert_hostname": False} if config.insecure else {}
        )
        self._pool = urllib3.PoolManager(num_pools=1, maxsize=2, ssl_context=context, **verify)
        self._token = BearerToken(config.token, config.token_file, clock)
        self._timeout = urllib3.Timeout(connect=request_timeout_s[0], read=request_timeout_s[1])
        self._user_agent = _user_agent()

    def send(self, request: ApiRequest) -> urllib3.BaseHTTPResponse:
        """The response with its body unread; raises the mapped transport error (ApiTransientError
        or, for TLS, ApiPermanentError) when no answer came."""
        headers = {"Accept": request.accept, "User-Agent": self._user_agent}
        token = self._token.value(self._source)
        if token:
            headers["Authorization"] = f"Bearer {token}"
        data = None
        if request.body is not None:
            data = json.dumps(request.body).encode()
            headers["Content-Type"] = request.content_type
        timeout = self._timeout
        if request.read_timeout_s is not None:
            timeout = urllib3.Timeout(
                connect=self._timeout.connect_timeout, read=request.read_timeout_s
            )
        query = f"?{urlencode(request.query)}" if request.query else ""
        try:
            return self._pool.request(
                request.method,
                self.host + request.path + query,
                body=data,
                headers=headers,
                timeout=timeout,
                retries=False,
                redirect=False,
                preload_content=False,
            )
        except (urllib3.exceptions.HTTPError, OSError) as e:
            raise errors_map.transport_error(e, request.what, self.host) from e


class RestApiClient(WireClient):
    """The ApiClient over RestTransport. Every call has a (connect, read) timeout."""

    def __init__(
        self,
        config: RestConfig,
        *,
        request_timeout_s: tuple[float, float] = (5.0, 15.0),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Raises CredentialsError when the TLS files cannot be loaded."""
        super().__init__(RestTransport(config, request_timeout_s=request_timeout_s, clock=clock))
