"""Values and shapes others can write or answer (schema v2, DRA, heartbeats), end to end.

An outsider who may edit Nodes (another tool), create DeviceTaintRules, or a broken driver or
host mount answering garbage: each case here failed before its fix (a traceback that stopped the
agent, the doctor or `kubectl gpu-topology`; a topology published that the agent's own decoder
refuses; GPUs that claims hold published free; a scan stuck on a FIFO; another node's
DeviceTaintRule deleted or ours never created). What held is asserted as well, so that it keeps
holding.
"""

from __future__ import annotations

import copy
import functools
import io
import json
import os
import re
import shutil
import threading
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import structlog
import urllib3
from hypothesis import example, given
from hypothesis import strategies as st
from structlog.testing import capture_logs

from reporter.cli import main
from reporter.collect import SourceState
from reporter.collect import simulate as simulated
from reporter.collect.podresources import ClaimedDevice, DraScope, allocation_view
from reporter.collect.scanner import CollectorScanner
from reporter.collect.simulate.fake_nvml import FakeNvml, c_nvmlMemory_t
from reporter.collect.simulate.machine import load_machine
from reporter.collect.simulate.sysfs_tree import memory_hostfs, memory_procfs
from reporter.collect.sysfs import SysfsCollector, SysfsView
from reporter.doctor import reader as doctor_reader
from reporter.errors import ApiTransientError, PublishError, SchemaError
from reporter.extender.cache import NodeCache
from reporter.extender.server import ExtenderMetrics, ExtenderServer
from reporter.free_sets import compute_availability
from reporter.hostfs import DirHostFS
from reporter.kubectl_plugin import main as plugin_main
from reporter.publish.devicetaints import DeviceTaintSink
from reporter.publish.lease import LeaseWatch, beat
from reporter.publish.watch import NodeAnnotation, NodeWatch
from reporter.publish.wire import ApiRequest, WireClient
from reporter.schema import dra, keys
from reporter.schema.availability import (
    Allocation,
    decode_allocation,
    encode_allocation,
    encode_availability,
)
from reporter.schema.codec import decode, encode, from_document, to_document
from reporter.schema.dra import DeviceTaint
from reporter.schema.model import (
    FabricState,
    GpuFabric,
    NvlinkHealth,
    RackPosition,
    Topology,
)
from reporter.schema.nrt import MANAGED_BY, MANAGER
from reporter.serve.httpserver import Request
from tests.extender.test_protocol import profile as scanned
from tests.fuzz.test_codec import JSON_VALUES, _rehash
from tests.support.agent_support import (
    API_CLIENTS,
    NODE,
    PREFIX,
    FakeScanner,
    ok,
    topology,
    wire_agent,
)
from tests.support.fuzz import fuzz, outcome
from tests.support.hostile_text import controls
from tests.support.kube_double import ApiServerDouble, Fault
from tests.support.strategies import topologies

TOPOLOGY_KEY = f"{PREFIX}/topology"
PROFILES = Path(simulated.__file__).parent / "profiles"
FIXTURES = Path(__file__).parents[1] / "fixtures"
LOG = structlog.get_logger("test")


# -- 1. Numbers in the topology annotation: whole numbers only -----------------------------------


def every_field_topology() -> Topology:
    """Four GPUs with every integer the v2 document can carry: minor, NUMA ids, link health with
    links down and bonds lost, a fabric with an error and a rack position."""
    base = topology(4)
    fabric = GpuFabric(
        state=FabricState.COMPLETED,
        cluster_uuid="6b3f1c2e-9a4d-4e8b-b1c7-2f5e8d9a0c31",
        clique=7,
        error=3,
        position=RackPosition(chassis_serial="1821622000007", slot=3, tray=2, host_id=0),
    )
    gpus = tuple(
        replace(
            g,
            minor=g.index,
            gpu_numa=g.index + 2,
            fabric=fabric,
            nvlink=NvlinkHealth(18, (0, 1), ((1, 2),)) if g.index == 0 else NvlinkHealth(18),
        )
        for g in base.gpus
    )
    return replace(base, gpus=gpus)


def document_with(path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    """The every-field document with the value at `path` replaced and the hash computed again, as
    whoever edits the annotation would."""
    doc = to_document(every_field_topology())
    parent = doc
    for part in path[:-1]:
        parent = parent[part]
    assert type(parent[path[-1]]) is int, path  # the table names integers only
    parent[path[-1]] = value(parent[path[-1]])
    _rehash(doc)
    return doc


INTEGER_FIELDS = {
    "gpus[1].index": ("gpus", 1, "index"),
    "gpus[0].minor": ("gpus", 0, "minor"),
    "gpus[0].mem_mib": ("gpus", 0, "mem_mib"),
    "gpus[0].gpu_numa": ("gpus", 0, "gpu_numa"),
    "gpus[0].nvlink.links": ("gpus", 0, "nvlink", "links"),
    "gpus[0].nvlink.down[1]": ("gpus", 0, "nvlink", "down", 1),
    "gpus[0].nvlink.lost[0][0]": ("gpus", 0, "nvlink", "lost", 0, 0),
    "gpus[0].nvlink.lost[0][1]": ("gpus", 0, "nvlink", "lost", 0, 1),
    "gpus[0].fabric.error": ("gpus", 0, "fabric", "error"),
    "gpus[0].fabric.position.slot": ("gpus", 0, "fabric", "position", "slot"),
    "gpus[0].fabric.position.host_id": ("gpus", 0, "fabric", "position", "host_id"),
    "numa_nodes[1].id": ("numa_nodes", 1, "id"),
    "numa_nodes[0].distances[1]": ("numa_nodes", 0, "distances", 1),
}
NOT_WHOLE = {
    "the same value as a float (1.0)": float,
    "negative zero where zero is": lambda v: -0.0 if v == 0 else float(v),
}


@pytest.mark.parametrize("how", sorted(NOT_WHOLE))
@pytest.mark.parametrize("field", sorted(INTEGER_FIELDS))
def test_a_number_that_is_not_a_whole_number_is_a_schema_error_naming_its_field(
    field: str, how: str
) -> None:
    doc = document_with(INTEGER_FIELDS[field], NOT_WHOLE[how])
    with pytest.raises(SchemaError) as caught:
        decode(json.dumps(doc, separators=(",", ":")))
    assert caught.value.field == field
    assert "is not of type 'integer'" in str(caught.value)


def test_the_every_field_document_itself_decodes() -> None:
    # The table above tests the numbers, not a document that was refused for something else.
    assert decode(encode(every_field_topology())) == every_field_topology()


def _int_paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    if type(node) is int:
        return [prefix]
    if isinstance(node, dict):
        return [p for k, v in node.items() for p in _int_paths(v, (*prefix, k))]
    if isinstance(node, list):
        return [p for k, v in enumerate(node) for p in _int_paths(v, (*prefix, k))]
    return []


@st.composite
def documents_with_a_float(draw: st.DrawFn) -> dict[str, Any]:
    """A valid v2 document of a random topology with one whole number written as a float."""
    # With a GPU, so that there is a whole number besides `v` (a GPU's index at least).
    doc = to_document(draw(topologies(max_gpus=5).filter(lambda t: bool(t.gpus))))
    path = draw(st.sampled_from([p for p in _int_paths(doc) if p != ("v",)]))
    parent = doc
    for part in path[:-1]:
        parent = parent[part]
    parent[path[-1]] = float(parent[path[-1]])
    _rehash(doc)
    return doc


@fuzz(60)
@given(documents_with_a_float())
def test_any_whole_number_written_as_a_float_is_refused(doc: dict[str, Any]) -> None:
    result = outcome(lambda: from_document(doc), SchemaError)
    assert isinstance(result, SchemaError), "a float where the schema says integer was accepted"


def floats_annotation(t: Topology) -> str:
    """`t` as another tool could rewrite it: every GPU index a float, the hash made to match."""
    doc = to_document(t)
    for gpu in doc["gpus"]:
        gpu["index"] = float(gpu["index"])
    _rehash(doc)
    return json.dumps(doc, separators=(",", ":"))


def test_the_agent_restarted_on_a_node_whose_annotation_another_tool_rewrote_republishes(
    apiserver: ApiServerDouble, kubeconfig: Path
) -> None:
    # The annotation decoded, so the agent took it for what it had published; the next scan
    # differed, and the Event text's diff indexed the matrix with 0.0: TypeError, agent gone.
    apiserver.add_node(NODE, annotations={TOPOLOGY_KEY: floats_annotation(topology(4))})
    wired = wire_agent(kubeconfig, FakeScanner([ok(topology(4, nv=12))]))
    assert wired.agent.step()
    assert decode(apiserver.nodes[NODE]["metadata"]["annotations"][TOPOLOGY_KEY]) == topology(
        4, nv=12
    )


def test_kubectl_gpu_topology_and_the_doctor_report_such_an_annotation_as_unreadable(
    apiserver: ApiServerDouble, admin_kubeconfig: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    apiserver.add_node("edited", annotations={TOPOLOGY_KEY: floats_annotation(topology(4))})
    assert plugin_main(["edited", "--kubeconfig", str(admin_kubeconfig)]) == 1
    out = capsys.readouterr().out
    assert "topology-unreadable" in out
    assert re.search(r"gpus\[[0-3]\]\.index: ([0-3])\.0: \1\.0 is not of type 'integer'", out)
    assert main(["doctor", "--kubeconfig", str(admin_kubeconfig), "--all"]) == 1
    assert "topology-unreadable: 1 (edited)" in capsys.readouterr().out


# -- 2. Identities a GPU is found by are unique within a node -----------------------------------


IDENTITIES = {
    "minor": ("minor", lambda i: 0),
    "uuid": ("uuid", lambda i: "GPU-00000000-0000-0000-0000-000000000000"),
    "pci": ("pci", lambda i: "0000:18:00.0"),
}


@pytest.mark.parametrize("name", sorted(IDENTITIES))
def test_two_gpus_with_one_identity_are_a_schema_error(name: str) -> None:
    key, value = IDENTITIES[name]
    doc = to_document(every_field_topology())
    for i, gpu in enumerate(doc["gpus"]):
        gpu[key] = value(i)
    _rehash(doc)
    with pytest.raises(SchemaError, match=rf"^gpus\[1\]\.{key}: .* is also GPU0's"):
        from_document(doc)


def test_two_gpus_with_one_mig_device_are_a_schema_error() -> None:
    doc = to_document(every_field_topology())
    for gpu in doc["gpus"][:2]:
        gpu["mig"] = True
        gpu["mig_devices"] = ["MIG-1b2c3d4e-0000-5111-8222-333344445555"]
    _rehash(doc)
    with pytest.raises(SchemaError, match=r"^gpus\[1\]\.mig_devices: .* is also GPU0's"):
        from_document(doc)


# -- 3. A driver answering garbage is a failed source, never a topology the decoder refuses -------


def garbage_nvml(profile: str = "dgx-h100", **answers: Any) -> tuple[FakeNvml, CollectorScanner]:
    """A simulated machine whose NVML answers `answers` (function name: return value) for every
    GPU, and the scanner that reads it with the machine's sysfs and procfs."""
    machine = load_machine(profile)
    nvml = FakeNvml(machine)
    for function, answer in answers.items():
        setattr(nvml, function, lambda *args, _answer=answer: _answer)
    scanner = CollectorScanner(
        "auto", memory_hostfs(machine), lambda: nvml, procfs=memory_procfs(machine)
    )
    return nvml, scanner


def memory(total: int) -> c_nvmlMemory_t:
    answer = c_nvmlMemory_t()
    answer.total = total
    return answer


GARBAGE = {
    "a GPU name that clears the screen and retitles the window": (
        {"nvmlDeviceGetName": "NVIDIA H100\x1b]0;pwned\x07\x1b[2J"},
        ".model",
    ),
    "a GPU name of 300 characters": ({"nvmlDeviceGetName": "N" * 300}, ".model"),
    "a UUID with a space in it": ({"nvmlDeviceGetUUID": "GPU-1234 5678"}, ".uuid"),
    "every GPU with one UUID": (
        {"nvmlDeviceGetUUID": "GPU-00000000-0000-0000-0000-000000000000"},
        ".uuid: 'GPU-00000000-0000-0000-0000-000000000000' is also GPU0's",
    ),
    "a driver version with a NUL and a space": (
        {"nvmlSystemGetDriverVersion": "550.54 \x00"},
        "driver: ",
    ),
    "2^64 bytes of memory": ({"nvmlDeviceGetMemoryInfo": memory(2**64 - 1)}, ".mem_mib"),
    "a GPU memory NUMA node of a million": ({"nvmlDeviceGetNumaNodeId": 10**6}, ".gpu_numa"),
    "every GPU minor 0": ({"nvmlDeviceGetMinorNumber": 0}, ".minor: 0 is also GPU0's"),
}


@pytest.mark.parametrize("case", sorted(GARBAGE))
def test_nvml_garbage_fails_the_nvml_source_and_what_is_published_decodes(case: str) -> None:
    answers, named = GARBAGE[case]
    _, scanner = garbage_nvml(**answers)
    result = scanner.scan()
    states = {s.name: s for s in result.sources}
    assert states["nvml"].state is SourceState.FAILED
    assert "NVML answered what the topology schema cannot hold" in (states["nvml"].error or "")
    assert named in (states["nvml"].error or "")
    assert states["sysfs"].state is SourceState.OK
    # What remains is sysfs's view of the same machine, and it is what the decoder reads back.
    assert result.topology is not None
    assert decode(encode(result.topology)) == result.topology
    assert len(result.topology.gpus) == 8


@pytest.mark.parametrize("count", [10**6, -1, "8"], ids=["a million", "-1", "a string"])
def test_a_gpu_count_no_node_has_fails_nvml_before_any_gpu_is_asked_for(count: object) -> None:
    # Each GPU pair is asked for its common ancestor: a million GPUs would be 5 * 10^11 calls.
    nvml, scanner = garbage_nvml(nvmlDeviceGetCount=count)
    result = scanner.scan()
    failed = {s.name: s.error or "" for s in result.failed}
    assert f"NVML counts {count!r} GPUs" in failed["nvml"]
    assert "nvmlDeviceGetHandleByIndex" not in nvml.calls


def test_on_a_dra_node_a_driver_giving_every_gpu_minor_0_frees_no_gpu_a_claim_holds() -> None:
    # Claims name GPUs gpu-<minor>: with every minor 0, the claims on gpu-1 and gpu-2 matched no
    # GPU and the claim on gpu-0 the last GPU, so GPUs 0-2, all held, were published free.
    _, scanner = garbage_nvml(nvmlDeviceGetMinorNumber=0)
    chosen = scanner.scan().topology
    assert chosen is not None
    claims = [ClaimedDevice(dra.DRIVER, NODE, dra.gpu_device(m)) for m in (0, 1, 2)]
    view = allocation_view(chosen, [], [], claims=claims, dra=DraScope((dra.DRIVER,), NODE))
    assert view.free == (3, 4, 5, 6, 7)


def test_run_once_on_a_profile_whose_gpu_name_holds_escapes_publishes_none_of_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The Interface's way in: a profile passed to --simulate, read through the same collector.
    profile = tmp_path / "escapes.yaml"
    text = (PROFILES / "dgx-h100.yaml").read_text()
    escapes = 'model: "H100\\e]0;x\\a\\e[2J"'  # YAML's escapes: ESC ] 0 ; x BEL ESC [ 2 J
    profile.write_text(text.replace("model: NVIDIA H100 80GB HBM3", escapes))
    status = main(["run", "--once", "--dry-run", "--simulate", str(profile), "--node", NODE])
    out, err = capsys.readouterr()
    assert status == 1  # a failed source: run --once says so
    assert "\\u001b" not in out
    assert not controls(out)
    patch = json.loads(out[: out.index("\n}\n") + 2])
    annotations = patch["metadata"]["annotations"]
    assert decode(annotations[TOPOLOGY_KEY]).source.value == "sysfs"
    assert "NVML answered what the topology schema cannot hold" in err


# -- 4. A host mount that is not sysfs: FIFOs, and symlinks out of the root -----------------------


def sysfs_tree(tmp_path: Path) -> Path:
    """A copy of a real machine's sysfs fixture (its symlinks kept), to be damaged."""
    root = tmp_path / "sys"
    shutil.copytree(FIXTURES / "machines" / "aws-p5en-switch" / "sysfs", root, symlinks=True)
    return root


def test_a_fifo_at_a_sysfs_attribute_is_unreadable_not_waited_on(tmp_path: Path) -> None:
    # open() of a FIFO waits for a writer: the scan, and with it the agent's loop, stopped there.
    root = sysfs_tree(tmp_path)
    attribute = root / "devices" / "system" / "node" / "node0" / "distance"
    attribute.unlink()
    os.mkfifo(attribute)
    done = threading.Event()
    views: list[SysfsView] = []

    def scan() -> None:
        views.append(SysfsCollector(DirHostFS(root)).collect())
        done.set()

    thread = threading.Thread(target=scan, daemon=True)
    thread.start()
    try:
        assert done.wait(30), "the scan is waiting on a FIFO nobody writes"
    finally:
        if not done.is_set():
            # A writer that comes and goes ends the reader's wait: the thread does not linger.
            os.close(os.open(attribute, os.O_WRONLY | os.O_NONBLOCK))
            thread.join(10)
    node0 = views[0].numa_nodes[0]
    assert node0.id == 0
    assert node0.distances == ()  # unreadable: the host does not say


@pytest.mark.parametrize(
    "target", ["a file outside the root", "/dev/zero"], ids=["outside", "dev-zero"]
)
def test_a_symlink_out_of_the_root_is_not_followed(tmp_path: Path, target: str) -> None:
    outside = tmp_path / "secret"
    outside.write_text("0-3\n")
    root = tmp_path / "sys"
    (root / "devices").mkdir(parents=True)
    (root / "devices" / "local_cpulist").symlink_to(
        outside if target == "a file outside the root" else Path(target)
    )
    (root / "devices" / "elsewhere").symlink_to(tmp_path)
    hostfs = DirHostFS(root)
    with pytest.raises(FileNotFoundError, match="leaves the sysfs root"):
        hostfs.read_text("devices/local_cpulist")
    with pytest.raises(FileNotFoundError, match="leaves the sysfs root"):
        hostfs.listdir("devices/elsewhere")


def test_a_relative_symlink_inside_the_root_still_reads(tmp_path: Path) -> None:
    # What real sysfs is made of: bus/pci/devices/<bdf> -> ../../../devices/pci.../<bdf>.
    view = SysfsCollector(DirHostFS(sysfs_tree(tmp_path))).collect()
    assert [g.place.address for g in view.gpus] == ["0000:59:00.0", "0000:5a:00.0"]
    assert all(g.cpus and g.place.numa == 0 for g in view.gpus)
    assert [n.id for n in view.numa_nodes] == [0, 1]


# -- 5. DeviceTaintRules: a rule is this agent's only if it is one the agent writes ---------------

RULES_PATH = "/apis/resource.k8s.io/v1alpha3/devicetaintrules"
TAINTED = "dgx-07"


def our_labels(node: str = TAINTED) -> dict[str, str]:
    """The labels the agent selects its rules by: anyone who may create rules can write them."""
    return {MANAGED_BY: MANAGER, keys.key(PREFIX, keys.OWNER_NODE): node}


def planted(name: str, pool: str | None, device: str = "gpu-3") -> dict[str, Any]:
    selector = {"driver": dra.DRIVER, "device": device}
    if pool is not None:
        selector["pool"] = pool
    return {
        "apiVersion": "resource.k8s.io/v1alpha3",
        "kind": "DeviceTaintRule",
        "metadata": {"name": name, "labels": our_labels(), "resourceVersion": "1"},
        "spec": {
            "deviceSelector": selector,
            "taint": {"key": "example.com/broken", "value": "x", "effect": "NoExecute"},
        },
    }


def taint_sink(apiserver: ApiServerDouble, kubeconfig: Path) -> DeviceTaintSink:
    apiserver.device_taint_rules.installed = True
    client = API_CLIENTS["lean"](kubeconfig, (2.0, 2.0))
    return DeviceTaintSink(client, node=TAINTED, prefix=PREFIX, resync_s=300, log=LOG)


PLANTED = {
    "labelled for this node, another node's pool": planted("someone-elses", "dgx-08"),
    "labelled for this node, no pool (every node's gpu-3)": planted("someone-elses", None),
    "this node's rule name, another node's pool": planted(
        dra.rule_name(TAINTED, "gpu-3"), "dgx-08"
    ),
    "this node's rule name and pool, an administrator's NoExecute quarantine": planted(
        dra.rule_name(TAINTED, "gpu-3"), TAINTED
    ),
}


@pytest.mark.parametrize("policy", [True, False], ids=["policy denies", "no policy"])
@pytest.mark.parametrize("case", sorted(PLANTED))
def test_a_rule_planted_with_our_labels_is_left_alone_and_ours_are_still_written(
    apiserver: ApiServerDouble, admin_kubeconfig: Path, case: str, policy: bool
) -> None:
    # The agent deleted every rule its selector listed: another pool's rule (without the
    # admission policy), or (with it) a 403 that stopped the sink before any create, for good.
    rule = PLANTED[case]
    apiserver.device_taint_rules.objects[rule["metadata"]["name"]] = copy.deepcopy(rule)
    if policy:
        apiserver.plan(Fault(403, "DELETE", RULES_PATH, message="the own-device-taints policy"))
    sink = taint_sink(apiserver, admin_kubeconfig)
    with capture_logs() as logs:
        sink.publish([DeviceTaint(1, "gpu-1", dra.REASON_LOST)])
        sink.publish([DeviceTaint(1, "gpu-1", dra.REASON_LOST)])
    assert [r.method for r in apiserver.requests if r.path.startswith(RULES_PATH)] == [
        "GET",
        "POST",
    ]
    stored = apiserver.device_taint_rules.objects
    assert stored[rule["metadata"]["name"]]["spec"] == rule["spec"]
    assert stored[dra.rule_name(TAINTED, "gpu-1")]["spec"]["deviceSelector"]["pool"] == TAINTED
    told = [e for e in logs if e["event"] == "device_taint_rules_not_ours"]
    assert len(told) == 1
    assert told[0]["rules"] == [rule["metadata"]["name"]]


ODD_SHAPES = {
    "spec a string": {"spec": "x"},
    "deviceSelector a list": {"spec": {"deviceSelector": ["gpu-1"], "taint": {}}},
    "taint null": {"spec": {"deviceSelector": {"pool": TAINTED}, "taint": None}},
    "no name": {"metadata": {"labels": our_labels()}, "spec": {}},
    "name a number": {"metadata": {"name": 7, "labels": our_labels()}},
}


def test_rules_of_odd_shapes_under_our_labels_neither_crash_nor_stop_the_sink(
    apiserver: ApiServerDouble, admin_kubeconfig: Path
) -> None:
    # The list is the server's; its items' insides are whatever their writer made of them.
    for k, (case, shape) in enumerate(sorted(ODD_SHAPES.items())):
        rule = {"metadata": {"name": f"odd-{k}", "labels": our_labels()}, **shape}
        apiserver.device_taint_rules.objects[f"odd-{k}"] = rule
        assert case
    sink = taint_sink(apiserver, admin_kubeconfig)
    assert sink.publish([DeviceTaint(1, "gpu-1", dra.REASON_LOST)]) == 1
    assert len(apiserver.device_taint_rules.objects) == len(ODD_SHAPES) + 1


@fuzz(200)
@given(JSON_VALUES)
def test_a_listed_rule_of_any_shape_is_judged_without_raising(item: Any) -> None:
    found = dra.own_rule(item, TAINTED, PREFIX)
    assert found is None or found[0].startswith(f"topo-reporter.{TAINTED}.")
    assert dra.listed_name(item)


# -- 6. Held: Leases and watch streams of any shape end in a Beat or a PublishError -------------


@fuzz(300)
@given(
    st.fixed_dictionaries(
        {"metadata": st.fixed_dictionaries({"name": st.just(NODE)})},
        optional={
            "spec": st.dictionaries(
                st.sampled_from(["holderIdentity", "leaseDurationSeconds", "renewTime", "x"]),
                JSON_VALUES
                | st.sampled_from(
                    [NODE, -40, 0, 1, 86400, 86401, 2**63, "40", "2026-13-45T99:99:99Z"]
                ),
            )
        },
    )
    | JSON_VALUES
)
def test_a_lease_of_any_shape_is_a_beat_that_vouches_within_bounds_or_a_transient_error(
    lease: Any,
) -> None:
    found = outcome(lambda: beat(lease), ApiTransientError)
    if isinstance(found, ApiTransientError):
        return
    assert found.duration_s is None or 1 <= found.duration_s <= 86400
    assert found.renew_time is None or isinstance(found.renew_time, str)


class StreamTransport:
    """A double of the wire client's transport that answers every request with one body: a
    watch stream as the test writes it, garbage lines included."""

    host = "stream.example"

    def __init__(self, body: bytes) -> None:
        self._body = body

    def send(self, request: ApiRequest) -> urllib3.BaseHTTPResponse:
        return urllib3.HTTPResponse(body=io.BytesIO(self._body), status=200, preload_content=False)


LINES = st.one_of(
    JSON_VALUES.map(lambda v: json.dumps(v).encode()),
    st.binary(max_size=40),
    st.sampled_from(
        [
            b'{"type":"ADDED","object":{"metadata":{"name":"n1"}}}',
            b'{"type":"ADDED","object":{"metadata":{"name":7}}}',
            b'{"type":"MODIFIED","object":{"metadata":"x"}}',
            b'{"type":"ERROR","object":{"code":"410"}}',
            b'{"type":"ERROR","object":[]}',
            b'{"type":"BOOKMARK","object":{"metadata":{"resourceVersion":5}}}',
            b'{"type":"ADDED","object":{"metadata":{"name":"n1","annotations":{"a":1}},'
            b'"spec":{"leaseDurationSeconds":1e999}}}',
            b"[" * 40 + b"]" * 40,
            b'{"type":"ADDED","object":{"metadata":{"name":"n1"}},"x":' + b"9" * 5000 + b"}",
        ]
    ),
)


def drain(watch: Callable[[], Iterator[Any]]) -> list[Any]:
    return list(watch())


@fuzz(300)
@given(st.lists(LINES, max_size=6))
def test_a_watch_stream_of_garbage_lines_ends_in_events_or_a_publish_error(
    lines: list[bytes],
) -> None:
    body = b"\n".join(lines)
    api = WireClient(StreamTransport(body))
    for watch in (
        lambda: LeaseWatch(api, namespace="ns", prefix=PREFIX).watch_beats("1", threading.Event()),
        lambda: NodeWatch(api).watch_nodes(f"{PREFIX}/availability", "1", threading.Event()),
    ):
        outcome(functools.partial(drain, watch), PublishError)


@fuzz(200)
@given(
    st.none() | st.lists(JSON_VALUES, max_size=4),
    st.none()
    | st.lists(
        JSON_VALUES
        | st.builds(
            lambda results: {
                "metadata": {"namespace": "ns", "name": "c"},
                "status": {"allocation": {"devices": {"results": results}}},
            },
            JSON_VALUES
            | st.lists(
                st.dictionaries(
                    st.sampled_from(["driver", "pool", "device"]),
                    JSON_VALUES | st.just(NODE),
                    max_size=3,
                )
            ),
        ),
        max_size=4,
    ),
)
def test_the_doctor_reads_resource_slices_and_claims_of_any_shape(
    slices: list[Any] | None, claims: list[Any] | None
) -> None:
    # Held: anyone who may create ResourceSlices or ResourceClaims writes their insides.
    seen = doctor_reader.dra_observation(NODE, slices, claims)
    assert (seen.slices is None) == (slices is None)
    assert (seen.claims is None) == (claims is None)


# -- 7. Held: the allocation annotation reads back exactly what the agent writes, or nothing ------


ALLOCATION_TEXTS = {
    "4,301 zeros": "1;dra;" + "0" * 4301,
    "a GPU beyond the schema's 256": "1;dra;0-65535",
    "another script's digit": "1;dra;\u0663",
    "a trailing newline": "1;dra;3\n",
    "a source twice": "1;dra,dra;0",
    "sources out of order": "1;dra,device-plugin;0",
    "an unknown source": "1;nvlink;0",
    "a range backwards": "1;dra;3-1",
    "a stride": "1;dra;0-7:1/2",
    "not canonical": "1;dra;0,1",
    "version 2": "2;dra;0",
    "a fourth field": "1;dra;0;x",
    "not text": 7,
}


@pytest.mark.parametrize("case", sorted(ALLOCATION_TEXTS))
def test_a_damaged_allocation_annotation_is_a_schema_error(case: str) -> None:
    with pytest.raises(SchemaError, match=r"^allocation: "):
        decode_allocation(ALLOCATION_TEXTS[case])  # "not text": 7, as any JSON value may be


@fuzz(300)
@given(
    st.text(alphabet="0123456789,-:/;adeinpcrvgu\u0663", max_size=40)
    | st.builds(
        lambda sources, claimed: encode_allocation(Allocation(sources, claimed)),
        st.sampled_from([(), ("dra",), ("device-plugin",), ("device-plugin", "dra")]),
        st.lists(st.integers(0, 255), unique=True).map(lambda c: tuple(sorted(c))),
    )
)
def test_an_allocation_annotation_reads_back_exactly_or_is_a_schema_error(text: str) -> None:
    found = outcome(lambda: decode_allocation(text), SchemaError)
    if not isinstance(found, SchemaError):
        assert encode_allocation(found) == text


# -- 8. Held: what a pod carries for the hold (its creation, its connected-wait) never fails a call


@pytest.fixture(scope="module")
def holding_extender() -> Iterator[ExtenderServer]:
    """An extender (not listening: called as its HTTP server calls it) whose cache holds a PCIe
    node with 8 free (never connected) and an NVSwitch node with 2 free (worth waiting for)."""
    cache = NodeCache(PREFIX)
    cache.replace(
        [
            NodeAnnotation(
                "pcie", encode_availability(compute_availability(scanned("pcie-8x"), range(8)))
            ),
            NodeAnnotation(
                "dgx", encode_availability(compute_availability(scanned("dgx-a100"), (0, 1)))
            ),
        ]
    )
    server = ExtenderServer(("127.0.0.1", 0), cache=cache, metrics=ExtenderMetrics(cache))
    yield server
    server.stop()


HOSTILE_TIMES = st.sampled_from(
    [
        "0000-01-01T00:00:00Z",
        "0001-01-01T00:00:00+23:59",
        "9999-12-31T23:59:59-23:59",
        "2026-12-02T08:00:00." + "9" * 5000 + "Z",
        "2026-12-02T08:00:00Z" + " " * 100_000,
        "\u0662\u0660\u0662\u0666-12-02T08:00:00Z",
        "2026-12-02T08:00:00\u00a0Z",
        "2026-99-99T99:99:99Z",
        "-2026-12-02T08:00:00Z",
        "1e309",
    ]
) | st.builds(
    lambda minutes: (datetime.now(UTC) - timedelta(minutes=minutes)).strftime("%Y-%m-%dT%H:%M:%SZ"),
    st.integers(-(10**6), 10**6),
)
HOSTILE_WAITS = st.sampled_from(
    [
        "0",
        "30m",
        "24h",
        "24h0.000001s",
        "9" * 400 + "h",
        "1e3",
        "inf",
        "nan",
        "-1h",
        "\u0663m",
        "5m" * 10_000,
        "",
    ]
)


@fuzz(300)
# The case CI drew once (stop 33): a pod created now, waiting 30m, is held.
@example(
    created=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    wait="30m",
    meta_shape="fields",
    form="NodeNames",
    gpus=4,
)
@given(
    created=HOSTILE_TIMES | JSON_VALUES,
    wait=HOSTILE_WAITS | JSON_VALUES,
    meta_shape=st.sampled_from(["fields", "metadata not a map", "annotations not a map"]),
    form=st.sampled_from(["NodeNames", "Nodes"]),
    gpus=st.sampled_from([1, 2, 4, 8]),
)
def test_a_pods_creation_time_and_connected_wait_of_any_shape_are_answered(
    holding_extender: ExtenderServer,
    created: Any,
    wait: Any,
    meta_shape: str,
    form: str,
    gpus: int,
) -> None:
    meta: Any = {
        "name": "p",
        "creationTimestamp": created,
        "annotations": {f"{PREFIX}/connected-wait": wait},
    }
    if meta_shape == "metadata not a map":
        meta = [created, wait]
    elif meta_shape == "annotations not a map":
        meta["annotations"] = [wait]
    pod = {
        "metadata": meta,
        "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": gpus}}}]},
    }
    names = ["pcie", "dgx", "unseen"]
    args: dict[str, Any] = {"Pod": pod}
    if form == "NodeNames":
        args["NodeNames"] = names
    else:
        args["Nodes"] = {"items": [{"metadata": {"name": n}} for n in names]}
    response = holding_extender.handle(Request("POST", "/filter", json.dumps(args).encode()))
    assert response.status == 200, response.body[:200]
    answer = json.loads(response.body)
    assert set(answer) == {
        "Nodes",
        "NodeNames",
        "FailedNodes",
        "FailedAndUnresolvableNodes",
        "Error",
    }
    kept = (
        answer["NodeNames"]
        if form == "NodeNames"
        else [i["metadata"]["name"] for i in answer["Nodes"]["items"]]
    )
    # A held pod's nodes that eviction cannot help are unresolvable (issue 28); each node is
    # answered exactly once, in one of the three.
    failed = {**answer["FailedNodes"], **answer["FailedAndUnresolvableNodes"]}
    assert len(failed) == len(answer["FailedNodes"]) + len(answer["FailedAndUnresolvableNodes"])
    assert sorted(kept + list(failed)) == sorted(names)
    assert "unseen" in kept  # never filtered, held or not
    assert all(isinstance(r, str) and r.isascii() and "\n" not in r for r in failed.values())
