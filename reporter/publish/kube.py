"""The one module that imports `kubernetes`: the ApiClient over the official client's transport.

Configuration: a kubeconfig when one is named (`--kubeconfig`, `KUBECONFIG`), in-cluster config
when running in a pod, else `~/.kube/config`. The client's own urllib3 retries are switched off:
`reporter.publish.retry` owns retrying, so the backoff is one policy in one place. Every library
exception becomes a `PublishError` (`reporter.publish.errors_map`, shared with the lean client),
with a message saying what to fix. It must never log or put into a message a token or kubeconfig
content.

The image leaves the official client out (image/lock.py): importing this module without it raises
CredentialsError with one line saying so, which every command that needs it prints.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import urllib3

from reporter.errors import CredentialsError
from reporter.inputs import MAX_PEM_BYTES, read_bounded
from reporter.publish import errors_map
from reporter.publish.rest import (
    MAX_TOKEN_BYTES,
    BearerToken,
    in_cluster_source,
    kubeconfig_path,
    read_kubeconfig,
    unloadable,
)
from reporter.publish.wire import ApiRequest, WireClient

OFFICIAL_CLIENT_MISSING = (
    "this needs the official kubernetes client, which is not installed (the topo-reporter image "
    "leaves it out: docs/image.md): it serves exec and auth-provider kubeconfigs, `doctor` and "
    "`kubectl gpu-topology`; pip install 'kubernetes>=29' here, or run it where "
    "`pip install topo-reporter` installed it"
)

try:
    from kubernetes import client, config
    from kubernetes.client.exceptions import ApiException
    from kubernetes.config import incluster_config, kube_config
    from kubernetes.config.config_exception import ConfigException
except ModuleNotFoundError as e:
    # Only the client's own absence is the user's to fix; a module missing inside it is a bug.
    if (e.name or "").partition(".")[0] != "kubernetes":
        raise
    raise CredentialsError(OFFICIAL_CLIENT_MISSING) from e


def load_configuration(kubeconfig: str | None, context: str | None = None) -> client.Configuration:
    """Client configuration: the named kubeconfig, else in-cluster, else KUBECONFIG or
    ~/.kube/config; `context` picks a kubeconfig context instead of its current one.

    Raises CredentialsError naming the kubeconfig path and context (never the file's content).
    """
    configuration = client.Configuration()
    in_cluster = (
        kubeconfig is None and context is None and bool(os.environ.get("KUBERNETES_SERVICE_HOST"))
    )
    source = (
        in_cluster_source(Path(incluster_config.SERVICE_TOKEN_FILENAME).parent)
        if in_cluster
        else kubeconfig_path(kubeconfig, os.environ)
    )
    try:
        if in_cluster:
            _check_sizes(
                (incluster_config.SERVICE_TOKEN_FILENAME, MAX_TOKEN_BYTES, "token file"),
                (
                    incluster_config.SERVICE_CERT_FILENAME,
                    MAX_PEM_BYTES,
                    "certificate-authority file",
                ),
            )
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]  # the client ships no annotations for its config loaders
            token: BearerToken | None = BearerToken(None, incluster_config.SERVICE_TOKEN_FILENAME)
        else:
            _check_kubeconfigs(source)
            merged = kube_config.KubeConfigMerger(source)  # type: ignore[no-untyped-call]  # as above
            if merged.config is None:
                # No path names a file: said as the lean client says it.
                raise FileNotFoundError(source)
            loader = kube_config.KubeConfigLoader(  # type: ignore[no-untyped-call]  # as above
                config_dict=merged.config,
                active_context=context,
                config_persister=merged.save_changes,
            )
            token = _kubeconfig_token(loader)
            if token is not None and token.path is not None:
                _check_sizes((token.path, MAX_TOKEN_BYTES, "token file"))
            loader.load_and_set(configuration)  # type: ignore[no-untyped-call]  # as above
    except (ConfigException, OSError) as e:
        raise unloadable(source, type(e).__name__, context=context) from e
    _check_sizes(
        *(
            (path, MAX_PEM_BYTES, what)
            for path, what in (
                (configuration.ssl_ca_cert, "certificate-authority file"),
                (configuration.cert_file, "client-certificate file"),
                (configuration.key_file, "client-key file"),
            )
            if path
        )
    )
    if token is not None:
        configuration.refresh_api_key_hook = _refresh_token(token, source)  # type: ignore[assignment]  # typed None, meant for a hook
    # Retries are reraised to our tenacity policy; urllib3's own would multiply them.
    configuration.retries = False
    return configuration


def _check_sizes(*files: tuple[str, int, str]) -> None:
    """Each (path, limit, what) that can be read is within its limit. Raises CredentialsError.

    The official client reads these files to their end, or hands them to OpenSSL, which does:
    `/dev/zero` or a FIFO named by mistake would never end. One that cannot be read at all is
    left to the client, which says so in its own terms.
    """
    for path, limit, what in files:
        try:
            read_bounded(path, limit=limit, what=what, error=CredentialsError)
        except CredentialsError as e:
            if not isinstance(e.__cause__, OSError):
                raise


def _kubeconfig_token(loader: Any) -> BearerToken | None:
    """The kubeconfig user's token file, read as the lean client reads it; None without one.

    The official loader prefers an inline `token` to `tokenFile` and reads the file once, with
    no size limit; client-go sends the file's last good content and re-reads it (it rotates).
    """
    user = loader._user  # the loader keeps the context's user only here
    if not user or not user.safe_get("tokenFile"):
        return None
    base = os.path.dirname(os.path.abspath(user.path)) if user.path else ""
    path = os.path.normpath(os.path.join(base, str(user["tokenFile"])))
    return BearerToken(str(user.safe_get("token") or "") or None, path)


def _refresh_token(token: BearerToken, source: str) -> Callable[[client.Configuration], None]:
    """The client's hook before each request: the token as the lean client would send it."""

    def refresh(configuration: client.Configuration) -> None:
        value = token.value(source)
        if value:
            configuration.api_key["BearerToken"] = f"Bearer {value}"

    return refresh


def _check_kubeconfigs(paths: str) -> None:
    """Read each kubeconfig the official loader will read through our bounded loader first: its
    own reads with no size limit and expands YAML aliases. A missing file is left to it."""
    for path in filter(None, paths.split(os.pathsep)):
        try:
            read_kubeconfig(Path(path))
        except CredentialsError as e:
            if not isinstance(e.__cause__, FileNotFoundError):
                raise


class KubeTransport:
    """One request through the official client's ApiClient: its configuration, authentication
    (tokens refreshed by its hook) and connection pool, with our paths and our error mapping."""

    def __init__(
        self,
        configuration: client.Configuration,
        *,
        request_timeout_s: tuple[float, float] = (5.0, 15.0),
    ) -> None:
        self._api = client.ApiClient(configuration)
        self.host = str(configuration.host)
        self._timeout = request_timeout_s

    def send(self, request: ApiRequest) -> urllib3.BaseHTTPResponse:
        headers = {"Accept": request.accept}
        if request.body is not None:
            headers["Content-Type"] = request.content_type
        timeout = (
            self._timeout
            if request.read_timeout_s is None
            else (self._timeout[0], request.read_timeout_s)
        )
        what = request.what
        try:
            serialized = self._api.param_serialize(
                request.method,
                request.path,
                query_params=list(request.query),
                header_params=headers,
                body=None if request.body is None else dict(request.body),
                auth_settings=["BearerToken"],
            )
            answer = self._api.call_api(*serialized, _request_timeout=timeout)
        except ApiException as e:
            # The client reports a TLS failure as an ApiException without a status, raised while
            # handling urllib3's error: a connection cut under the request is transient, as the
            # lean client maps it; any other TLS failure is the CA's.
            cause = e.__context__
            if e.status == 0 and cause is not None and errors_map.tls_cut(cause) is not None:
                raise errors_map.transport_error(cause, what, self.host) from e
            raise errors_map.tls_error(what, e.reason) from e
        except (urllib3.exceptions.HTTPError, OSError) as e:
            raise errors_map.transport_error(e, what, self.host) from e
        response: urllib3.BaseHTTPResponse = answer.response
        return response


class KubeApiClient(WireClient):
    """The ApiClient over the official client. Every call has a (connect, read) timeout."""

    def __init__(
        self,
        configuration: client.Configuration,
        *,
        request_timeout_s: tuple[float, float] = (5.0, 15.0),
    ) -> None:
        super().__init__(KubeTransport(configuration, request_timeout_s=request_timeout_s))


OPERATOR_TIMEOUT_S = (5.0, 30.0)
"""(connect, read) for an operator's command: it lists a whole cluster's Nodes, where the agent
reads one."""


def operator_client(kubeconfig: str | None, context: str | None = None) -> KubeApiClient:
    """The official client of an operator's command (`doctor`, `dra-template`, the kubectl
    plugin), for every kubeconfig kubectl reads. Raises CredentialsError as load_configuration
    does."""
    return KubeApiClient(
        load_configuration(kubeconfig, context), request_timeout_s=OPERATOR_TIMEOUT_S
    )
