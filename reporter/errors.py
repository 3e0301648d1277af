"""The exception tree of topo-reporter. Library errors are mapped onto it once, at the boundary.

    TopoReporterError                 anything we raise on purpose; the CLI prints it as one line
    ├── ConfigError                   a bad flag, environment variable or settings file (exit 2)
    ├── CredentialsError              Kubernetes credentials that do not load (kubeconfig, pod's)
    ├── InputError                    a file or annotation we were handed does not read
    │   ├── SchemaError               a topology document our schema refuses (names the field)
    │   └── PlacementError            a GPU request the topology cannot meet (a ValueError too)
    ├── CollectError                  a source failed as a whole
    │   └── NvmlUnavailable           NVML could not be initialised (driver, runtime, permissions)
    └── PublishError                  the Kubernetes API refused or could not be reached
        ├── ApiTransientError         worth retrying: connection, timeout, 429, 5xx, 409
        └── ApiPermanentError         not worth retrying until something changes: 401, 403, 404, 422

Every message is written for the person who has to act on it: what happened and what to do.
The commands exit 2 for a ConfigError (the way they were called: reporter.commands.run_guarded)
and 1 for every other error here.
"""

from __future__ import annotations


class TopoReporterError(Exception):
    """Base of every error topo-reporter raises on purpose."""


class ConfigError(TopoReporterError):
    """A setting is missing or invalid."""


class CredentialsError(TopoReporterError):
    """The Kubernetes credentials cannot be loaded or used; the message names the path tried.

    Not a ConfigError: a kubeconfig that does not load is the cluster out of reach, whoever
    named it. Not a PublishError either: the loops that ride out an API failure must not ride
    out this one, which no retry cures.
    """


class InputError(TopoReporterError):
    """Input handed to us (a file, stdin, an annotation) cannot be read."""


class SchemaError(InputError):
    """A topology document does not validate against the schema (v2, or v1 where it says v1)."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(f"{field}: {message}" if field else message)


class PlacementError(InputError, ValueError):
    """A GPU set request that does not fit the topology: k < 1, too few GPUs, an unknown index.

    Also a ValueError, so a scheduler plugin that knows nothing of our tree can still catch it.
    """


class CollectError(TopoReporterError):
    """A collector could not observe the machine at all."""


class NvmlUnavailable(CollectError):
    """NVML did not initialise; the message says what to check."""


class PublishError(TopoReporterError):
    """Publishing to the Kubernetes API failed."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        self.status = status
        super().__init__(message)


class ApiTransientError(PublishError):
    """A failure that a retry may cure (connection refused, timeout, 429, 5xx, 409 conflict)."""

    def __init__(
        self, message: str, *, status: int | None = None, retry_after: float | None = None
    ) -> None:
        self.retry_after = retry_after
        super().__init__(message, status=status)


class ApiPermanentError(PublishError):
    """A failure no retry cures until an operator acts (401, 403, 404, 422)."""
