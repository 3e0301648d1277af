"""The one seam between the publish layer and the Kubernetes API: resource-generic calls we own.

A sink names a `Resource` and calls get, create, replace, merge_patch or delete on it; the
extender's Node cache and its heartbeat judge list and watch. Three implementations: the lean client
(`reporter.publish.rest.RestApiClient`), the official one (`reporter.publish.kube.KubeApiClient`),
both `reporter.publish.wire.WireClient` over their own transport, and the dry run's
`reporter.publish.printing.PrintingClient`. Every implementation raises only
`reporter.errors.PublishError` subclasses, never a library exception, so a new destination is a
sink (the object it owns, when to write it) and nothing else.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar
from urllib.parse import quote

from reporter.errors import ApiPermanentError, PublishError


@dataclass(frozen=True, slots=True)
class Resource:
    """An API resource: where its objects live and what they are called."""

    group: str
    """"" for the core group (`/api/v1`)."""
    version: str
    plural: str
    kind: str
    namespaced: bool

    def path(self, namespace: str | None = None, name: str | None = None) -> str:
        """The URL path of the collection (name None) or of one object; a namespaced resource
        without a namespace is the collection across all namespaces."""
        root = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace is not None:
            root += f"/namespaces/{quote(namespace, safe='')}"
        root += f"/{self.plural}"
        return root if name is None else f"{root}/{quote(name, safe='')}"


NODES = Resource("", "v1", "nodes", "Node", namespaced=False)
EVENTS = Resource("", "v1", "events", "Event", namespaced=True)
PODS = Resource("", "v1", "pods", "Pod", namespaced=True)
NODE_FEATURES = Resource("nfd.k8s-sigs.io", "v1alpha1", "nodefeatures", "NodeFeature", True)
# reporter.schema.nrt names the same (a test checks): not imported, so the agent loads it only
# when NRT is on.
NODE_RESOURCE_TOPOLOGIES = Resource(
    "topology.node.k8s.io", "v1alpha2", "noderesourcetopologies", "NodeResourceTopology", False
)
LEASES = Resource("coordination.k8s.io", "v1", "leases", "Lease", namespaced=True)


DRA_VERSIONS = ("v1", "v1beta2", "v1beta1")
"""resource.k8s.io versions that serve ResourceSlices and ResourceClaims, newest first (v1 is GA in
1.34; v1beta1 came in 1.32)."""


T = TypeVar("T")


def newest_served(
    versions: Sequence[str], read: Callable[[str], T], *, unserved: T | None = None
) -> T | None:
    """`read(version)` in the first of `versions` (newest first) the API server serves: a 404
    tries the next. `unserved` where it serves none, None where the caller may not read it (403).
    Raises every other API error."""
    for version in versions:
        try:
            return read(version)
        except ApiPermanentError as e:
            if e.status == 404:
                continue
            if e.status == 403:
                return None
            raise
    return unserved


def resource_slices(version: str) -> Resource:
    """DRA's ResourceSlices (what a driver offers on a node) in one version of resource.k8s.io."""
    return Resource("resource.k8s.io", version, "resourceslices", "ResourceSlice", False)


def resource_claims(version: str) -> Resource:
    """DRA's ResourceClaims (what a pod asked for, and the devices it was given)."""
    return Resource("resource.k8s.io", version, "resourceclaims", "ResourceClaim", True)


RESOURCE_CLAIM_TEMPLATES = Resource(
    "resource.k8s.io", "v1", "resourceclaimtemplates", "ResourceClaimTemplate", namespaced=True
)


def device_taint_rules(version: str) -> Resource:
    """DRA's DeviceTaintRules in one version of resource.k8s.io: which one a cluster serves
    changes with its release and gates (v1alpha3 in 1.34 and 1.35, v1beta2 in 1.36, v1 later)."""
    return Resource("resource.k8s.io", version, "devicetaintrules", "DeviceTaintRule", False)


class WatchExpired(PublishError):  # noqa: N818 - the API's word (410 Gone), not a failure of ours
    """The resourceVersion to watch from is too old: list again."""


class ApiClient(Protocol):
    """Calls on any resource. Each raises ApiTransientError for what a retry may cure (409, 429,
    5xx, no answer, an object deleted since it was read) and ApiPermanentError otherwise (401,
    403, 422, a resource the server does not serve), with a message saying what to fix."""

    def get(
        self, resource: Resource, name: str, namespace: str | None = None
    ) -> dict[str, Any] | None:
        """The object; None when there is none by that name (a 404 naming it)."""
        ...

    def create(
        self,
        resource: Resource,
        body: Mapping[str, Any],
        namespace: str | None = None,
        *,
        dry_run: bool = False,
    ) -> dict[str, Any]:
        """Create `body`; returns the object as stored. `dry_run`: the server admits, defaults and
        drops fields as for a real create, and stores nothing (`dryRun=All`)."""
        ...

    def replace(
        self,
        resource: Resource,
        name: str,
        body: Mapping[str, Any],
        namespace: str | None = None,
    ) -> dict[str, Any]:
        """Replace the object (`body` carries the resourceVersion read); returns it as stored."""
        ...

    def merge_patch(
        self,
        resource: Resource,
        name: str,
        patch: Mapping[str, Any],
        namespace: str | None = None,
    ) -> dict[str, Any]:
        """Send a JSON merge patch; returns the object as patched."""
        ...

    def delete(self, resource: Resource, name: str, namespace: str | None = None) -> None:
        """Delete the object; one already gone (a 404 naming it) is no error."""
        ...

    def list(
        self,
        resource: Resource,
        namespace: str | None = None,
        *,
        query: Mapping[str, str] | None = None,
        metadata_only: bool = False,
    ) -> dict[str, Any]:
        """One page of the collection (`items`, and `metadata.continue` when there is more).

        `query`: labelSelector, fieldSelector, limit, continue. `metadata_only`: ask for
        PartialObjectMetadata (names, labels, annotations), as client-go's metadata informers do.
        """
        ...

    def watch(
        self,
        resource: Resource,
        resource_version: str,
        stop: threading.Event,
        *,
        timeout_s: int,
        metadata_only: bool = False,
        namespace: str | None = None,
        query: Mapping[str, str] | None = None,
    ) -> Iterator[dict[str, Any]]:
        """Start a watch from `resource_version` (raising at once when it is refused) and return
        its events (`type`, `object`; bookmarks included) until the server ends it after
        `timeout_s` or `stop` is set. An ERROR event is raised: WatchExpired for a 410.

        `namespace`: watch one namespace only (None: all, or a cluster-scoped resource).
        `query`: labelSelector or fieldSelector, as for `list`.
        """
        ...
