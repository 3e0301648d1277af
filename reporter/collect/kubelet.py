"""The kubelet's configuration file on the host, read for its Topology Manager policies.

An absent file means unknown (the chart may not mount it, a kubelet may be configured by flags),
as does a file that does not read: no policy labels, a problem the agent tells once (a log line,
a Warning Event, /readyz's detail), and no NodeResourceTopology unless the user states the policy.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from parsers.errors import ParseError
from parsers.kubelet import MAX_INPUT_BYTES, KubeletPolicies, parse_kubelet_config
from reporter.errors import InputError
from reporter.inputs import read_bounded

POD_RESOURCES_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
"""Where the kubelet serves its PodResources API, which says which GPUs pods hold."""


def read_kubelet_policies(path: Path) -> KubeletPolicies | None:
    """The policies in the kubelet config at `path`; None when there is no such file.

    Raises InputError naming the file when it exists but cannot be read or parsed.
    """
    try:
        text = read_bounded(path, limit=MAX_INPUT_BYTES, what="kubelet config")
    except InputError as e:
        if isinstance(e.__cause__, FileNotFoundError):
            return None
        raise
    try:
        return parse_kubelet_config(text)
    except ParseError as e:
        raise InputError(f"kubelet config {path}: {e}") from None


@dataclass(frozen=True, slots=True)
class KubeletReading:
    """One read of the kubelet config: the policies it holds, or why there are none."""

    policies: KubeletPolicies | None
    problem: str | None = None
    """Why the config did not give the policies (absent, unreadable, not a KubeletConfiguration);
    None when it did, or when no config is read at all."""
    absent: bool = False
    """There is no config file: the policies are unknown, but nothing failed."""


def read_kubelet(path: Path) -> KubeletReading:
    """The kubelet config at `path`, read; an absent file is a problem too: the policies the
    kubelet admits pods by are then unknown."""
    try:
        policies = read_kubelet_policies(path)
    except InputError as e:
        return KubeletReading(None, str(e))
    if policies is None:
        return KubeletReading(None, f"no kubelet config at {path}", absent=True)
    return KubeletReading(policies)


def nrt_policies(reading: KubeletReading, stated: KubeletPolicies | None) -> KubeletPolicies:
    """The policies a NodeResourceTopology may carry: the kubelet config's, else the ones the user
    states (`--topology-manager-policy`). Raises InputError when neither is known: an object
    without them makes NodeResourceTopologyMatch take the node for policy `none` and admit pods
    that a `single-numa-node` kubelet rejects with TopologyAffinityError."""
    if reading.policies is not None:
        return reading.policies
    if stated is not None:
        return stated
    raise InputError(
        f"the kubelet's Topology Manager policy is unknown ({reading.problem or 'not read'}): "
        "a NodeResourceTopology without it makes NodeResourceTopologyMatch admit pods the "
        "kubelet may reject; mount the kubelet config (--kubelet-config), or state the policy "
        "with --topology-manager-policy"
    )
