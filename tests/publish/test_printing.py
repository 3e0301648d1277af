"""The dry run: the real sinks over the printing client print what they would send, once."""

from __future__ import annotations

import io
import json
import threading
from typing import Any

import pytest
import structlog
from structlog.testing import capture_logs

from reporter.publish import nodefeature as nf
from reporter.publish import patch as node_patch
from reporter.publish.api import NODE_FEATURES, NODE_RESOURCE_TOPOLOGIES, NODES, PODS
from reporter.publish.client import EventType
from reporter.publish.printing import PrintingClient, merged
from reporter.publish.sink import NodePatchSink
from reporter.schema import nrt
from tests.support.agent_support import FAST

NODE = "gpu-node-1"
PREFIX = "gpu.topology.io"
LOG = structlog.get_logger("test")


def printed(out: io.StringIO) -> list[dict[str, Any]]:
    """Each JSON document printed, in order: each is followed by one newline."""
    decoder, text, docs, at = json.JSONDecoder(), out.getvalue(), [], 0
    while at < len(text):
        doc, at = decoder.raw_decode(text, at)
        assert text[at] == "\n"
        docs.append(doc)
        at += 1
    return docs


def want(count: str) -> node_patch.Desired:
    return node_patch.desired({f"{PREFIX}/count": count}, {f"{PREFIX}/matrix": "m"}, PREFIX)


def node_sink(out: io.StringIO) -> NodePatchSink:
    api = PrintingClient(out, LOG, objects={(NODES, NODE): {"metadata": {"name": NODE}}})
    return NodePatchSink(
        api, node=NODE, prefix=PREFIX, stop=threading.Event(), backoff=FAST, log=LOG
    )


def test_the_node_sink_prints_the_patch_for_an_empty_node_then_nothing_while_unchanged() -> None:
    out = io.StringIO()
    sink = node_sink(out)
    assert sink.publish(want("8"))
    assert printed(out) == [
        node_patch.minimal_patch(node_patch.NodeMetadata(NODE), want("8"), PREFIX)
    ]
    assert out.getvalue().startswith('{\n  "metadata": {')  # indented, keys sorted
    assert not sink.publish(want("8"))
    sink.forget()  # a resync reads again: still nothing to send
    assert not sink.publish(want("8"))
    assert sink.published() == want("8")
    assert len(printed(out)) == 1


def test_a_change_prints_only_what_would_be_sent() -> None:
    out = io.StringIO()
    sink = node_sink(out)
    sink.publish(want("8"))
    assert sink.publish(want("4"))
    assert printed(out)[1] == {"metadata": {"labels": {f"{PREFIX}/count": "4"}}}


def test_events_are_logged_not_printed() -> None:
    out = io.StringIO()
    sink = node_sink(out)
    with capture_logs() as logs:
        sink.event(EventType.WARNING, "GPULost", "GPU3 lost")
    assert out.getvalue() == ""
    assert {
        "event": "event",
        "type": "Warning",
        "reason": "GPULost",
        "message": "GPU3 lost",
    }.items() <= logs[0].items()


def test_the_nodefeature_sink_prints_the_object_it_would_create() -> None:
    out = io.StringIO()
    sink = nf.NodeFeatureSink(
        PrintingClient(out, LOG),
        node=NODE,
        prefix=PREFIX,
        namespace="gpu-topology",
        stop=threading.Event(),
        backoff=FAST,
        log=LOG,
    )
    assert sink.publish(want("8"))
    expected = nf.node_feature(
        want("8"), node=NODE, namespace="gpu-topology", prefix=PREFIX, current=None
    )
    assert printed(out) == [expected]
    assert not sink.publish(want("8"))
    assert len(printed(out)) == 1


def test_reads_answer_what_was_written_and_nothing_else() -> None:
    api = PrintingClient(io.StringIO(), LOG)
    assert api.get(NODE_FEATURES, "x", "ns") is None
    api.create(NODE_FEATURES, {"metadata": {"name": "x"}, "spec": {}}, "ns")
    assert api.get(NODE_FEATURES, "x", "ns") == {"metadata": {"name": "x"}, "spec": {}}
    assert api.list(NODE_FEATURES)["items"] == [{"metadata": {"name": "x"}, "spec": {}}]
    assert api.list(PODS)["items"] == []
    assert list(api.watch(NODES, "1", threading.Event(), timeout_s=1)) == []


@pytest.mark.parametrize(
    ("target", "patch", "result"),
    [
        ({"a": "b"}, {"a": "c"}, {"a": "c"}),
        ({"a": "b"}, {"b": "c"}, {"a": "b", "b": "c"}),
        ({"a": "b"}, {"a": None}, {}),
        ({"a": {"b": "c", "d": "e"}}, {"a": {"b": None}}, {"a": {"d": "e"}}),
        ({"a": [1]}, {"a": [2]}, {"a": [2]}),
        ("text", {"a": "b"}, {"a": "b"}),
    ],
)
def test_merge_patch_follows_rfc_7386(target: Any, patch: Any, result: Any) -> None:
    assert merged(target, patch) == result


def test_the_nrt_resource_is_the_schemas() -> None:
    r = NODE_RESOURCE_TOPOLOGIES
    assert (r.group, r.version, r.plural, r.kind) == (nrt.GROUP, nrt.VERSION, nrt.PLURAL, nrt.KIND)


@pytest.mark.parametrize(
    ("resource", "namespace", "name", "path"),
    [
        (NODES, None, "n/1", "/api/v1/nodes/n%2F1"),
        (NODES, "ignored", None, "/api/v1/nodes"),
        (PODS, None, None, "/api/v1/pods"),
        (NODE_FEATURES, "ns", "x", "/apis/nfd.k8s-sigs.io/v1alpha1/namespaces/ns/nodefeatures/x"),
    ],
)
def test_resource_paths(resource: Any, namespace: str | None, name: str | None, path: str) -> None:
    assert resource.path(namespace, name) == path
