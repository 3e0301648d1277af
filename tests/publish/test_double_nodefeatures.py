"""The double's NodeFeature resource keeps the apiserver contracts the nodefeature sink relies on.

Driven through the real client's CustomObjectsApi with an all-powerful token, so the double's
answers are what a client would see; each case is one contract.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from reporter.publish.kube import load_configuration
from tests.support.kube_double import ApiServerDouble

GROUP, VERSION, PLURAL, NS = "nfd.k8s-sigs.io", "v1alpha1", "nodefeatures", "gpu-topology"


def obj(name: str = "n1-topo-reporter", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "NodeFeature",
        "metadata": {"name": name, "labels": {"nfd.node.kubernetes.io/node-name": "n1"}},
        "spec": spec or {"labels": {"gpu.topology.io/count": "8"}},
    }


@pytest.fixture
def api(admin_kubeconfig: Path) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(client.ApiClient(load_configuration(str(admin_kubeconfig))))


def status_of(call: Callable[[], Any]) -> tuple[int, dict[str, Any]]:
    with pytest.raises(ApiException) as raised:
        call()
    return int(raised.value.status), json.loads(raised.value.body)


def test_create_get_and_update_bump_the_version_only_on_change(
    api: client.CustomObjectsApi,
) -> None:
    created = api.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, obj())
    version = created["metadata"]["resourceVersion"]
    got = api.get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "n1-topo-reporter")
    assert got == created
    same = api.replace_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "n1-topo-reporter", got)
    assert same["metadata"]["resourceVersion"] == version
    got["spec"]["labels"]["gpu.topology.io/count"] = "4"
    changed = api.replace_namespaced_custom_object(
        GROUP, VERSION, NS, PLURAL, "n1-topo-reporter", got
    )
    assert changed["metadata"]["resourceVersion"] != version
    assert changed["metadata"]["generation"] == 2


@pytest.mark.parametrize(
    ("setup", "call", "code", "said"),
    [
        (
            True,
            lambda a: a.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, obj()),
            409,
            "already exists",
        ),
        (
            False,
            lambda a: a.get_namespaced_custom_object(
                GROUP, VERSION, NS, PLURAL, "n1-topo-reporter"
            ),
            404,
            'nodefeatures.nfd.k8s-sigs.io "n1-topo-reporter" not found',
        ),
        (
            True,
            lambda a: a.replace_namespaced_custom_object(
                GROUP, VERSION, NS, PLURAL, "n1-topo-reporter", obj()
            ),
            422,
            "must be specified for an update",
        ),
        (
            True,
            lambda a: a.replace_namespaced_custom_object(
                GROUP,
                VERSION,
                NS,
                PLURAL,
                "n1-topo-reporter",
                {**obj(), "metadata": {**obj()["metadata"], "resourceVersion": "1"}},
            ),
            409,
            "the object has been modified",
        ),
        (
            False,
            lambda a: a.create_namespaced_custom_object(
                GROUP, VERSION, NS, PLURAL, obj(labels={"gpu.topology.io/count": 8})
            ),
            422,
            "spec.labels.gpu.topology.io/count: Invalid value: must be of type string",
        ),
        (
            False,
            lambda a: a.create_namespaced_custom_object(
                GROUP,
                VERSION,
                NS,
                PLURAL,
                obj(features={"instances": {"gputopology.gpu": {"elements": [{"x": "1"}]}}}),
            ),
            422,
            "elements[0].attributes: Required value",
        ),
        (
            False,
            lambda a: a.create_namespaced_custom_object(
                GROUP, VERSION, NS, PLURAL, obj("Bad_Name")
            ),
            422,
            "a lowercase RFC 1123 subdomain",
        ),
        (
            True,
            lambda a: a.patch_namespaced_custom_object(
                GROUP,
                VERSION,
                NS,
                PLURAL,
                "n1-topo-reporter",
                {"spec": {}},
                _content_type="application/strategic-merge-patch+json",
            ),
            415,
            "unknown format",
        ),
    ],
    ids=[
        "create twice is AlreadyExists",
        "a missing object is a 404 naming it",
        "update without resourceVersion",
        "update with a stale resourceVersion",
        "a label value that is not a string",
        "an instance without attributes",
        "a name that is not a DNS subdomain",
        "custom resources have no strategic merge patch",
    ],
)
def test_refusals_are_shaped_like_the_apiservers(
    api: client.CustomObjectsApi,
    setup: bool,
    call: Callable[[client.CustomObjectsApi], Any],
    code: int,
    said: str,
) -> None:
    if setup:
        api.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, obj())
    status, body = status_of(lambda: call(api))
    assert status == code
    assert said in body["message"]


def test_merge_patch_and_delete(api: client.CustomObjectsApi) -> None:
    api.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, obj())
    patched = api.patch_namespaced_custom_object(
        GROUP, VERSION, NS, PLURAL, "n1-topo-reporter", {"spec": {"labels": {"a.b/c": "d"}}}
    )
    assert patched["spec"]["labels"] == {"gpu.topology.io/count": "8", "a.b/c": "d"}
    api.delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "n1-topo-reporter")
    assert (
        status_of(
            lambda: api.get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "n1-topo-reporter")
        )[0]
        == 404
    )


def test_without_the_crd_everything_is_a_bare_404_and_discovery_omits_the_group(
    apiserver: ApiServerDouble, api: client.CustomObjectsApi, admin_kubeconfig: Path
) -> None:
    apis = client.ApisApi(client.ApiClient(load_configuration(str(admin_kubeconfig))))
    assert GROUP in {g.name for g in apis.get_api_versions().groups}
    apiserver.nodefeatures.installed = False
    assert GROUP not in {g.name for g in apis.get_api_versions().groups}
    status, body = status_of(
        lambda: api.get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "n1-topo-reporter")
    )
    assert status == 404
    assert body["message"] == "the server could not find the requested resource"
    assert "details" not in body
