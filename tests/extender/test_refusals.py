"""One-line refusals for what the standard JSON decoder reads and no encoder writes (issue 41,
item 7): a lone surrogate escape (`"\\ud800x"`) anywhere in a filter, prioritize or preempt
body, in every form, is answered 200 or 400 with one line: never a 500, never a traceback in the
log."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from structlog.testing import capture_logs

from reporter.extender.cache import NodeCache
from reporter.extender.server import ExtenderMetrics, ExtenderServer
from reporter.publish.watch import NodeAnnotation
from reporter.schema.availability import encode_availability
from reporter.serve.httpserver import Request
from tests.extender.test_protocol import CREATED, availability, pod

WAIT_S = 10.0
SURROGATE = "\ud800x"
"""The repro's node name: `"\\ud800x"` as JSON."""


@pytest.fixture(scope="module")
def extender() -> Iterator[ExtenderServer]:
    """An extender (started) whose cache knows two nodes, one with 4 free GPUs not connected."""
    cache = NodeCache("gpu.topology.io")
    cache.replace(
        [
            NodeAnnotation("pcie", encode_availability(availability("pcie-8x", tuple(range(8))))),
            NodeAnnotation("dgx", encode_availability(availability("dgx-a100", (5,)))),
        ]
    )
    server = ExtenderServer(
        ("127.0.0.1", 0), cache=cache, metrics=ExtenderMetrics(cache), connected_wait_s=7200.0
    ).start()
    yield server
    server.stop()


def answered(server: ExtenderServer, verb: str, raw: bytes) -> tuple[int, bytes]:
    """The handler's answer, as the HTTP server would send it (an exception would reach here)."""
    response = server.handle(Request("POST", f"/{verb}", raw))
    return response.status, response.body


def one_line_or_json(status: int, answer: bytes) -> None:
    assert status in (200, 400), answer
    if status == 400:
        assert answer.endswith(b"\n")
        assert answer.count(b"\n") == 1
    else:
        json.loads(answer)


@pytest.mark.parametrize("verb", ["filter", "prioritize"])
@pytest.mark.parametrize("form", ["NodeNames", "Nodes"])
def test_the_repros_node_name_is_a_400_line_over_http_and_nothing_is_logged(
    extender: ExtenderServer, verb: str, form: str
) -> None:
    names = ["pcie", SURROGATE]
    nodes = {"items": [{"metadata": {"name": n}} for n in names]}
    raw = json.dumps({"Pod": pod(1), form: names if form == "NodeNames" else nodes}).encode()
    assert b'"\\ud800x"' in raw
    connection = http.client.HTTPConnection(*extender.address, timeout=WAIT_S)
    with capture_logs() as logs:
        for _ in range(2):  # every call, not only the first
            connection.request("POST", f"/{verb}", body=raw)
            response = connection.getresponse()
            where = "NodeNames[1]" if form == "NodeNames" else "Nodes.items[1]"
            assert (response.status, response.read().decode()) == (
                400,
                f"{where} is not a node name: it holds a lone surrogate escape (\\ud800 to "
                "\\udfff), which no Kubernetes name can\n",
            )
    connection.close()
    assert logs == []


JSON_TEXT = st.text(st.characters(categories=("Cs", "L", "N", "P", "Cc")), max_size=6)
"""Strings with lone surrogates among letters, digits, punctuation and control characters:
json.dumps writes each surrogate as an escape the standard decoder reads back alone."""


@st.composite
def bodies(draw: st.DrawFn) -> bytes:
    """An ExtenderArgs of either form whose strings (node names, the pod's name, UID, creation
    time, annotation, selector, affinity and tolerations) may hold lone surrogates."""
    text = JSON_TEXT | st.sampled_from(["pcie", "dgx", SURROGATE, "\udfff", "\ud83d\ude00"])
    names = draw(st.lists(text, max_size=4))
    spec = pod(draw(st.sampled_from([1, 4])))
    spec["metadata"] |= {
        "name": draw(text),
        "uid": draw(text),
        "creationTimestamp": draw(st.sampled_from([CREATED]) | text),
        "annotations": {draw(text): draw(text)},
    }
    spec["spec"] |= {
        "nodeSelector": draw(st.dictionaries(text, text, max_size=2)),
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": draw(text), "operator": "In", "values": [u]}]}
                        for u in draw(st.lists(text, max_size=2))
                    ]
                }
            }
        },
        "tolerations": [{"key": draw(text), "operator": "Exists"}],
    }
    # Read by preempt only (the other verbs leave it): its victims' nodes and UIDs.
    victims = {n: {"Pods": [{"UID": draw(text)}]} for n in names}
    found: dict[str, Any] = {"Pod": spec, "NodeNameToMetaVictims": victims}
    if draw(st.booleans()):
        found["NodeNames"] = names
    else:
        found["Nodes"] = {"items": [{"metadata": {"name": n}} for n in names]}
    return json.dumps(found).encode()


@given(raw=bodies(), verb=st.sampled_from(["filter", "prioritize", "preempt"]))
def test_strings_with_lone_surrogates_anywhere_are_answered_never_failed(
    extender: ExtenderServer, raw: bytes, verb: str
) -> None:
    status, answer = answered(extender, verb, raw)
    one_line_or_json(status, answer)
