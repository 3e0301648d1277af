"""`topo-reporter doctor --all` on the real kube-apiserver: a template `dra-template` made from the
Nodes, applied, then a Node of another wiring added, which the template does not cover, or a
node's NVLinks down, which it would misroute.

The shared apiserver has DRADerivedAttributes on, so the stored template keeps its
derivedAttributes and the gate-off finding never shows here (tests/doctor/test_templates.py judges
a template stored without them). Each test's Nodes and templates carry a prefix of their own, so
what other tests publish is not read.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

from bench.dra_template import nvlinks_down
from reporter.doctor.model import Code
from reporter.schema import dra_template, keys
from reporter.schema.codec import encode
from tests.cli.test_run import CLI, env
from tests.controlplane.test_dra_template import own_uuids, scanned
from tests.support.controlplane_fixtures import NodeFactory, RealApiServer, unique

MISROUTED = Code.DRA_TEMPLATE_MISROUTED_NODES
UNCOVERED = Code.DRA_TEMPLATE_UNCOVERED_NODES

pytestmark = pytest.mark.controlplane

GROUP, VERSION, PLURAL = "resource.k8s.io", "v1", "resourceclaimtemplates"


@pytest.fixture
def prefix() -> str:
    return f"{unique('t')}.example.com"


@pytest.fixture
def applied(real_apiserver: RealApiServer, real_namespace: str) -> Iterator[list[str]]:
    """Names of the templates the test applied in `real_namespace`, deleted after it: a namespace
    no controller finalizes would leave them listable."""
    made: list[str] = []
    yield made
    api = k8s.CustomObjectsApi(real_apiserver.api())
    for name in made:
        with contextlib.suppress(k8s.ApiException):
            api.delete_namespaced_custom_object(GROUP, VERSION, real_namespace, PLURAL, name)


def cli(server: RealApiServer, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args, "--kubeconfig", str(server.kubeconfig)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env(),
        check=False,
    )


def publish(make: NodeFactory, prefix: str, profile: str) -> str:
    return make(
        annotations={keys.key(prefix, keys.TOPOLOGY): encode(scanned(profile))},
        name=unique(profile.split("-", maxsplit=1)[0]),
    )


def apply_template(
    server: RealApiServer, namespace: str, prefix: str, applied: list[str]
) -> dict[str, Any]:
    """`dra-template --gpus 2` from the Nodes now, created as printed; the stored object."""
    printed = cli(
        server, "dra-template", "--gpus", "2", "--prefix", prefix, "--namespace", namespace
    )
    assert printed.returncode == 0, printed.stderr
    document = yaml.safe_load(printed.stdout)
    api = k8s.CustomObjectsApi(server.api())
    stored = api.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, document)
    assert isinstance(stored, dict)
    applied.append(stored["metadata"]["name"])
    return stored


def template_findings(server: RealApiServer, prefix: str) -> dict[str, list[dict[str, Any]]]:
    """The doctor's findings under each template subject, from `--all --format json`."""
    done = cli(server, "doctor", "--all", "--prefix", prefix, "--format", "json")
    assert done.returncode in (0, 1), done.stderr
    report = json.loads(done.stdout)
    return {n["template"]: n["findings"] for n in report["nodes"] if "template" in n}


def test_a_node_of_a_wiring_added_after_the_template_is_named_with_the_fix(
    real_apiserver: RealApiServer,
    real_node_factory: NodeFactory,
    real_namespace: str,
    applied: list[str],
    prefix: str,
) -> None:
    publish(real_node_factory, prefix, "pcie-8x-nvlink-pairs")
    stored = apply_template(real_apiserver, real_namespace, prefix, applied)
    pairs = dra_template.wiring_digest(scanned("pcie-8x-nvlink-pairs"))
    covered = stored["metadata"]["annotations"][keys.key(prefix, keys.DRA_TEMPLATE_MACHINES)]
    assert covered == pairs
    added = publish(real_node_factory, prefix, "dgx-h100")

    found = template_findings(real_apiserver, prefix)

    subject = f"{real_namespace}/{stored['metadata']['name']}"
    assert list(found) == [subject]
    (finding,) = found[subject]
    assert (finding["code"], finding["severity"]) == (UNCOVERED, "warning")
    assert finding["evidence"] == [
        f"nodes: {added}",
        f"their wirings: {dra_template.wiring_digest(scanned('dgx-h100'))}",
        f"the template covers: {pairs}",
    ]
    assert finding["fix"] == (
        "where their NVLinks are down, bring them back; then make the template again from the "
        f"nodes now and apply it: `topo-reporter dra-template --gpus 2 --name "
        f"{stored['metadata']['name']} --namespace {real_namespace} --prefix {prefix}`"
    )


def test_a_node_whose_nvlinks_go_down_after_the_template_is_an_error_with_the_fix(
    real_apiserver: RealApiServer,
    real_node_factory: NodeFactory,
    real_namespace: str,
    applied: list[str],
    prefix: str,
) -> None:
    """Issue 41's repro: a template made over two DGX H100 nodes, then the second's fabric
    manager stops (every pair SYS): its GPUs keep the clique, and the doctor says so."""
    topologies = [own_uuids(scanned("dgx-h100")) for _ in range(2)]
    annotation = keys.key(prefix, keys.TOPOLOGY)
    first, second = (
        real_node_factory(annotations={annotation: encode(t)}, name=unique("dgx"))
        for t in topologies
    )
    stored = apply_template(real_apiserver, real_namespace, prefix, applied)
    down = encode(nvlinks_down(topologies[1]))
    real_apiserver.core().patch_node(second, {"metadata": {"annotations": {annotation: down}}})

    found = template_findings(real_apiserver, prefix)

    name = stored["metadata"]["name"]
    (finding,) = found[f"{real_namespace}/{name}"]
    assert (finding["code"], finding["severity"]) == (MISROUTED, "error")
    assert finding["summary"].endswith(
        "claims for 2 GPUs from it can get GPUs there that are not NVLink-connected, handed out "
        "as connected"
    )
    assert finding["evidence"][0] == f"nodes: {second}"
    assert finding["fix"] == (
        "make the template again from the nodes now and apply it: `topo-reporter dra-template "
        f"--gpus 2 --name {name} --namespace {real_namespace} --prefix {prefix}` (a node that "
        "joined later or whose NVLinks went down then gets no clique)"
    )
    assert first not in finding["evidence"][0]


def test_a_template_made_from_every_wiring_has_no_finding(
    real_apiserver: RealApiServer,
    real_node_factory: NodeFactory,
    real_namespace: str,
    applied: list[str],
    prefix: str,
) -> None:
    publish(real_node_factory, prefix, "pcie-8x-nvlink-pairs")
    publish(real_node_factory, prefix, "dgx-h100")
    stored = apply_template(real_apiserver, real_namespace, prefix, applied)
    # The gate is on here: the stored request keeps the derived attribute, so no gate-off finding.
    (request,) = stored["spec"]["spec"]["devices"]["requests"]
    assert request["exactly"]["derivedAttributes"]

    found = template_findings(real_apiserver, prefix)

    assert found == {}
