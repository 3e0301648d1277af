"""`topo-reporter prune` on the real kube-apiserver: what the real agent wrote goes, nothing else.

The agent itself (`run --once` on simulated machines, admin credentials) writes everything it can
write: a GB200 tray with an unhealthy fabric and `--taint-unhealthy-fabric --dra-device-taints
--availability --nrt --heartbeat` (labels, annotations, the fabric taint, a DeviceTaintRule per
GPU, the NodeResourceTopology, the heartbeat Lease), and a second node through the nodefeature
sink (NFD's real CRDs). Beside them, what others own: their labels, annotations and taints, a
key under our prefix that the agent never listed, another producer's NodeResourceTopology, a
rule carrying our labels in another node's pool, a Lease and a NodeFeature of others; and
NodeResourceTopology and NodeFeature objects of ours written under another prefix, and by a
version before the `<prefix>/node` label (none).
"""

from __future__ import annotations

import base64
import contextlib
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

from reporter.collect.simulate.racks import rack_nodes, write_profiles
from reporter.schema import dra
from reporter.schema.nrt import MANAGED_BY, MANAGER, own_labels
from tests.cli.test_run import CLI, env
from tests.support.controlplane_fixtures import RULES_VERSION, NodeFactory, RealApiServer, unique
from tests.support.kube_double import write_kubeconfig

pytestmark = pytest.mark.controlplane

PREFIX = "gpu.topology.io"
OLD_PREFIX = "old.example.com"
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
FOREIGN_LABELS = {"team": "ml", f"{PREFIX}/set-by-hand": "yes"}
FOREIGN_ANNOTATIONS = {"other.io/note": "keep"}
NRT = ("topology.node.k8s.io", "v1alpha2", "noderesourcetopologies")
NFD = ("nfd.k8s-sigs.io", "v1alpha1", "nodefeatures")
RULES = ("resource.k8s.io", RULES_VERSION, "devicetaintrules")


def kubeconfig_for_token(server: RealApiServer, token: str, work: Path) -> Path:
    """A kubeconfig for the real server that authenticates with `token`."""
    admin = yaml.safe_load(server.kubeconfig.read_text())
    cluster = admin["clusters"][0]["cluster"]
    ca = work / "ca.crt"
    ca.write_bytes(base64.b64decode(cluster["certificate-authority-data"]))
    return write_kubeconfig(work / "token.kubeconfig", cluster["server"], token, ca_cert=ca)


def unhealthy_tray(tmp_path: Path) -> Path:
    """A GB200 NVL72 compute tray whose fabric is unhealthy: tainted, every GPU ruled."""
    (node,) = rack_nodes(1, trays=1)
    node.profile["fabric"]["health"] = "unhealthy"
    (path,) = write_profiles([node], tmp_path / "unhealthy")
    return path


def agent(server: RealApiServer, node: str, *args: str) -> None:
    ran = subprocess.run(
        [*CLI, "run", "--once", "--node", node, "--listen", "", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env(KUBECONFIG=str(server.kubeconfig), TOPO_REPORTER_LOG_FORMAT="json"),
        check=False,
    )
    assert ran.returncode == 0, ran.stderr[-3000:]


def prune(kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, "prune", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env(KUBECONFIG=str(kubeconfig)),
        check=False,
    )


@dataclass
class Cluster:
    """The nodes and objects the agents and the others wrote, and the admin's view."""

    server: RealApiServer
    namespace: str
    tray: str
    nfd_node: str
    other: str
    custom: k8s.CustomObjectsApi
    old_prefixed: str
    """The name of our NodeResourceTopology, and the node of our NodeFeature, written under
    OLD_PREFIX."""
    unlabelled: str
    """The same, written by a version before the `<prefix>/node` label."""

    def node(self, name: str) -> Any:
        return self.server.core().read_node(name)

    def names(
        self, group: str, version: str, plural: str, namespace: str | None = None
    ) -> set[str]:
        if namespace is None:
            found = self.custom.list_cluster_custom_object(group, version, plural)
        else:
            found = self.custom.list_namespaced_custom_object(group, version, namespace, plural)
        return {o["metadata"]["name"] for o in found["items"]}

    def leases(self) -> set[str]:
        coordination = k8s.CoordinationV1Api(self.server.api())
        return {
            lease.metadata.name
            for lease in coordination.list_namespaced_lease(self.namespace).items
        }

    def snapshot(self) -> dict[str, Any]:
        """Everything prune may touch, as the server holds it."""
        nodes = {}
        for name in (self.tray, self.nfd_node, self.other):
            node = self.node(name)
            nodes[name] = (
                node.metadata.labels,
                node.metadata.annotations,
                [t.to_dict() for t in node.spec.taints or ()],
            )
        return {
            "nodes": nodes,
            "nrt": self.names(*NRT),
            "rules": self.names(*RULES),
            "leases": self.leases(),
            "nodefeatures": self.names(*NFD, self.namespace),
        }


def foreign_rule(pool: str, node_label: str) -> dict[str, Any]:
    """A rule carrying our labels for `node_label` but selecting devices in `pool`: not ours."""
    return {
        "apiVersion": f"{RULES[0]}/{RULES[1]}",
        "kind": "DeviceTaintRule",
        "metadata": {
            "name": f"{dra.NAME_PREFIX}.{node_label}.gpu-9",
            "labels": {MANAGED_BY: MANAGER, f"{PREFIX}/{'node'}": node_label},
        },
        "spec": {
            "deviceSelector": {"driver": dra.DRIVER, "pool": pool, "device": "gpu-9"},
            "taint": {"key": "example.com/hand", "value": "x", "effect": "NoSchedule"},
        },
    }


def earlier_objects(name: str, owner: dict[str, str], namespace: str) -> list[dict[str, Any]]:
    """Our NodeResourceTopology named `name` and NodeFeature for node `name`, as the agent wrote
    them under the prefix of `owner` (`{}`: a version before the owner label)."""
    labels = {MANAGED_BY: MANAGER, **owner}
    return [
        {
            "apiVersion": f"{NRT[0]}/{NRT[1]}",
            "kind": "NodeResourceTopology",
            "metadata": {"name": name, "labels": labels},
            "zones": [],
            "topologyPolicies": ["None"],
        },
        {
            "apiVersion": f"{NFD[0]}/{NFD[1]}",
            "kind": "NodeFeature",
            "metadata": {
                "name": f"{name}-topo-reporter",
                "namespace": namespace,
                "labels": {"nfd.node.kubernetes.io/node-name": name, **labels},
            },
            "spec": {"labels": {}},
        },
    ]


def create(custom: k8s.CustomObjectsApi, obj: dict[str, Any]) -> None:
    """Create a NodeResourceTopology or a NodeFeature (in its namespace) as the admin."""
    namespace = obj["metadata"].get("namespace")
    if namespace is None:
        custom.create_cluster_custom_object(*NRT, obj)
    else:
        custom.create_namespaced_custom_object(NFD[0], NFD[1], namespace, NFD[2], obj)


@pytest.fixture
def cluster(
    real_apiserver: RealApiServer,
    real_namespace: str,
    real_node_factory: NodeFactory,
    real_nrt_crd: str,
    real_nfd_crds: list[str],
    tmp_path: Path,
) -> Iterator[Cluster]:
    core = real_apiserver.core()
    custom = k8s.CustomObjectsApi(real_apiserver.api())
    made = [
        real_node_factory(labels=FOREIGN_LABELS, annotations=FOREIGN_ANNOTATIONS) for _ in range(3)
    ]
    tray, nfd_node, other = made
    for name in made:
        core.patch_node(name, {"spec": {"taints": [GPU_TAINT]}})
    agent(
        real_apiserver,
        tray,
        "--simulate",
        str(unhealthy_tray(tmp_path)),
        "--taint-unhealthy-fabric",
        "--dra-device-taints",
        "--availability",
        "--simulate-used",
        "0",
        "--nrt",
        "--topology-manager-policy",
        "single-numa-node",
        "--heartbeat",
        "--namespace",
        real_namespace,
    )
    agent(
        real_apiserver,
        nfd_node,
        "--simulate",
        "dgx-h100",
        "--sink",
        "nodefeature",
        "--namespace",
        real_namespace,
    )
    # What others own, beside ours.
    custom.create_cluster_custom_object(
        *NRT,
        {
            "apiVersion": f"{NRT[0]}/{NRT[1]}",
            "kind": "NodeResourceTopology",
            "metadata": {"name": other, "labels": {"app.kubernetes.io/managed-by": "nfd"}},
            "zones": [],
            "topologyPolicies": ["None"],
        },
    )
    custom.create_cluster_custom_object(*RULES, foreign_rule(pool=other, node_label=tray))
    k8s.CoordinationV1Api(real_apiserver.api()).create_namespaced_lease(
        real_namespace,
        k8s.V1Lease(
            metadata=k8s.V1ObjectMeta(name=other), spec=k8s.V1LeaseSpec(holder_identity=other)
        ),
    )
    custom.create_namespaced_custom_object(
        *NFD[:2],
        real_namespace,
        NFD[2],
        {
            "apiVersion": f"{NFD[0]}/{NFD[1]}",
            "kind": "NodeFeature",
            "metadata": {
                "name": f"{other}-nfd-worker",
                "labels": {"nfd.node.kubernetes.io/node-name": other},
            },
            "spec": {"labels": {"feature.node.kubernetes.io/x": "y"}},
        },
    )
    # Ours, but not this prefix's: another install's, and an earlier version's (no prefix label).
    old_prefixed, unlabelled = unique("old"), unique("early")
    for name, owner in ((old_prefixed, {f"{OLD_PREFIX}/node": old_prefixed}), (unlabelled, {})):
        for obj in earlier_objects(name, owner, real_namespace):
            create(custom, obj)
    made_cluster = Cluster(
        real_apiserver, real_namespace, tray, nfd_node, other, custom, old_prefixed, unlabelled
    )
    try:
        yield made_cluster
    finally:
        for name in made_cluster.names(*NRT):
            with contextlib.suppress(k8s.ApiException):
                custom.delete_cluster_custom_object(*NRT, name)
        for name in made_cluster.names(*RULES):
            if any(node in name for node in made):
                with contextlib.suppress(k8s.ApiException):
                    custom.delete_cluster_custom_object(*RULES, name)


def ours_on_the_cluster(c: Cluster) -> dict[str, Any]:
    """What the agents wrote that is still there."""
    tray = c.node(c.tray)
    return {
        "labels": sorted(
            k for k in tray.metadata.labels if k.startswith(PREFIX) and k not in FOREIGN_LABELS
        ),
        "annotations": sorted(k for k in tray.metadata.annotations if k.startswith(PREFIX)),
        "taints": [t.key for t in tray.spec.taints or () if t.key.startswith(PREFIX)],
        "rules": sorted(
            n
            for n in c.names(*RULES)
            if n.startswith(f"{dra.NAME_PREFIX}.{c.tray}.gpu-") and not n.endswith("gpu-9")
        ),
        "nrt": c.tray in c.names(*NRT),
        "lease": c.tray in c.leases(),
        "nodefeature": f"{c.nfd_node}-topo-reporter" in c.names(*NFD, c.namespace),
    }


def earlier_left(c: Cluster) -> bool:
    """Whether our objects of another prefix, and an earlier version's, are all still there."""
    names = {c.old_prefixed, c.unlabelled}
    return names <= c.names(*NRT) and {f"{n}-topo-reporter" for n in names} <= c.names(
        *NFD, c.namespace
    )


NOTHING = {
    "labels": [],
    "annotations": [],
    "taints": [],
    "rules": [],
    "nrt": False,
    "lease": False,
    "nodefeature": False,
}


def test_prune_removes_what_the_agents_wrote_and_nothing_foreign(cluster: Cluster) -> None:
    before = ours_on_the_cluster(cluster)
    # The agents wrote every kind: the test would prove nothing otherwise.
    assert before["labels"], before
    assert before["annotations"], before
    assert len(before["rules"]) == 4, before
    assert before["taints"] == [f"{PREFIX}/fabric-health"]
    assert before["nrt"], before
    assert before["lease"], before
    assert before["nodefeature"], before
    snapshot = cluster.snapshot()

    dry = prune(cluster.server.kubeconfig, "--namespace", cluster.namespace, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert cluster.snapshot() == snapshot
    assert f"would remove node {cluster.tray}: labels {PREFIX}/count" in dry.stdout
    assert f"taint {PREFIX}/fabric-health=unhealthy:NoSchedule" in dry.stdout
    assert f"would remove Lease {cluster.namespace}/{cluster.tray}\n" in dry.stdout
    assert f"would remove NodeResourceTopology {cluster.tray}\n" in dry.stdout
    assert cluster.other not in dry.stdout.replace(f"{dra.NAME_PREFIX}.{cluster.tray}", "")

    done = prune(cluster.server.kubeconfig, "--namespace", cluster.namespace)
    assert done.returncode == 0, done.stderr
    assert done.stdout.replace("removed", "would remove") == dry.stdout
    assert ours_on_the_cluster(cluster) == NOTHING
    for name in (cluster.tray, cluster.nfd_node, cluster.other):
        node = cluster.node(name)
        assert {
            k: v for k, v in node.metadata.labels.items() if k in FOREIGN_LABELS
        } == FOREIGN_LABELS
        assert not {k for k in node.metadata.labels if k.startswith(PREFIX)} - set(FOREIGN_LABELS)
        assert node.metadata.annotations == FOREIGN_ANNOTATIONS
        assert [t.to_dict() for t in node.spec.taints] == [{**GPU_TAINT, "time_added": None}]
    assert cluster.other in cluster.names(*NRT)
    assert f"{dra.NAME_PREFIX}.{cluster.tray}.gpu-9" in cluster.names(*RULES)
    assert cluster.other in cluster.leases()
    assert f"{cluster.other}-nfd-worker" in cluster.names(*NFD, cluster.namespace)
    assert earlier_left(cluster)
    # An object of ours that names no prefix is said, and left.
    assert (
        f"left NodeResourceTopology {cluster.unlabelled}: it carries no <prefix>/node label"
        in done.stdout
    )
    assert f"left NodeFeature {cluster.namespace}/{cluster.unlabelled}-topo-reporter" in done.stdout
    assert cluster.old_prefixed not in done.stdout

    again = prune(cluster.server.kubeconfig, "--namespace", cluster.namespace)
    assert again.returncode == 0, again.stderr
    assert again.stdout.endswith(f"removed 0 of {PREFIX}/: nothing else touched\n")


def test_prune_of_an_old_prefix_leaves_the_current_ones_keys(
    real_apiserver: RealApiServer, real_node_factory: NodeFactory
) -> None:
    node = real_node_factory(labels={"team": "ml"})
    agent(real_apiserver, node, "--simulate", "dgx-h100", "--prefix", "old.example.com")
    agent(real_apiserver, node, "--simulate", "dgx-h100")
    old = {k for k in real_apiserver.core().read_node(node).metadata.labels if k.startswith("old.")}
    assert "old.example.com/count" in old

    done = prune(real_apiserver.kubeconfig, "--prefix", "old.example.com")
    assert done.returncode == 0, done.stderr
    labels = real_apiserver.core().read_node(node).metadata.labels
    annotations = real_apiserver.core().read_node(node).metadata.annotations
    assert not [k for k in (*labels, *annotations) if k.startswith("old.example.com/")]
    assert labels[f"{PREFIX}/count"] == "8"
    assert f"{PREFIX}/owned" in annotations
    assert labels["team"] == "ml"


def test_prune_of_an_old_prefix_leaves_the_objects_the_current_install_wrote(
    real_apiserver: RealApiServer,
    real_namespace: str,
    real_node_factory: NodeFactory,
    real_nrt_crd: str,
    real_nfd_crds: list[str],
) -> None:
    # Issue 41: installed under OLD_PREFIX, then again under PREFIX. `prune --prefix OLD` (what
    # `prune --help` says to run after a prefix change) deleted the NodeResourceTopology and
    # NodeFeature objects the current install's agents had written over the old ones.
    nrt_args = ("--simulate", "dgx-h100", "--availability", "--simulate-used", "0", "--nrt")
    nrt_args += ("--topology-manager-policy", "single-numa-node")
    nf_args = ("--simulate", "dgx-h100", "--sink", "nodefeature", "--namespace", real_namespace)
    stale, moved, stale_nf, moved_nf = (real_node_factory() for _ in range(4))
    for node, args in (
        (stale, nrt_args),
        (moved, nrt_args),
        (stale_nf, nf_args),
        (moved_nf, nf_args),
    ):
        agent(real_apiserver, node, *args, "--prefix", OLD_PREFIX)
    # The new install's agents have run on two of the nodes: the objects there are theirs.
    agent(real_apiserver, moved, *nrt_args)
    agent(real_apiserver, moved_nf, *nf_args)
    custom = k8s.CustomObjectsApi(real_apiserver.api())
    moved_nrt = custom.get_cluster_custom_object(*NRT, moved)
    assert moved_nrt["metadata"]["labels"] == own_labels(moved, PREFIX)
    moved_feature = custom.get_namespaced_custom_object(
        NFD[0], NFD[1], real_namespace, NFD[2], f"{moved_nf}-topo-reporter"
    )
    assert f"{OLD_PREFIX}/node" not in moved_feature["metadata"]["labels"]
    assert moved_feature["metadata"]["labels"][f"{PREFIX}/node"] == moved_nf

    done = prune(real_apiserver.kubeconfig, "--prefix", OLD_PREFIX, "--namespace", real_namespace)
    assert done.returncode == 0, done.stderr
    assert f"removed NodeResourceTopology {stale}\n" in done.stdout
    assert f"removed NodeFeature {real_namespace}/{stale_nf}-topo-reporter\n" in done.stdout
    nrts = {o["metadata"]["name"] for o in custom.list_cluster_custom_object(*NRT)["items"]}
    features = {
        o["metadata"]["name"]
        for o in custom.list_namespaced_custom_object(NFD[0], NFD[1], real_namespace, NFD[2])[
            "items"
        ]
    }
    assert moved in nrts
    assert stale not in nrts
    assert f"{moved_nf}-topo-reporter" in features
    assert f"{stale_nf}-topo-reporter" not in features
    # The current install's objects stand as its agents wrote them.
    assert custom.get_cluster_custom_object(*NRT, moved) == moved_nrt
    assert (
        custom.get_namespaced_custom_object(
            NFD[0], NFD[1], real_namespace, NFD[2], f"{moved_nf}-topo-reporter"
        )
        == moved_feature
    )
    for name in nrts & {stale, moved}:
        custom.delete_cluster_custom_object(*NRT, name)


def test_asked_for_them_prune_removes_the_objects_an_earlier_version_wrote(
    real_apiserver: RealApiServer, real_namespace: str, real_nrt_crd: str, real_nfd_crds: list[str]
) -> None:
    custom = k8s.CustomObjectsApi(real_apiserver.api())
    early, other = unique("early"), unique("old")
    for name, owner in ((early, {}), (other, {f"{OLD_PREFIX}/node": other})):
        for obj in earlier_objects(name, owner, real_namespace):
            create(custom, obj)
    # Under a prefix of its own: no Node of the session carries a key under it.
    prefix = f"{unique('p')}.example.com"
    done = prune(
        real_apiserver.kubeconfig, "--prefix", prefix, "--namespace", real_namespace, "--unlabelled"
    )
    assert done.returncode == 0, done.stderr
    assert f"removed NodeResourceTopology {early}\n" in done.stdout
    assert f"removed NodeFeature {real_namespace}/{early}-topo-reporter\n" in done.stdout
    assert other not in done.stdout
    nrts = {o["metadata"]["name"] for o in custom.list_cluster_custom_object(*NRT)["items"]}
    assert early not in nrts
    assert other in nrts
    custom.delete_cluster_custom_object(*NRT, other)


def test_a_token_without_the_rights_ends_in_one_line_and_exit_1(
    real_apiserver: RealApiServer, real_namespace: str, tmp_path: Path
) -> None:
    core = real_apiserver.core()
    account = unique("nobody")
    core.create_namespaced_service_account(
        real_namespace, k8s.V1ServiceAccount(metadata=k8s.V1ObjectMeta(name=account))
    )
    token = core.create_namespaced_service_account_token(
        account,
        real_namespace,
        k8s.AuthenticationV1TokenRequest(spec=k8s.V1TokenRequestSpec(audiences=[])),
    ).status.token
    kubeconfig = kubeconfig_for_token(real_apiserver, token, tmp_path)

    done = prune(kubeconfig)
    assert done.returncode == 1
    (line,) = done.stderr.splitlines()
    assert line.startswith("topo-reporter: error: list nodes: forbidden (403)")
    assert "the chart's pre-delete hook holds exactly these" in line
