"""Input past every bound a careless or hostile hand can reach: depth, size, no end, digits.

A Node annotation nested ~985 deep, YAML alias bombs, deep nesting and 5,000-digit integers in
every YAML file the program reads, and files with no end (`/dev/zero`): each ends in a SchemaError
or one clear line and a non-zero exit, and the running agent survives what the node or the
cluster hands it, repairing what it owns.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes.config import incluster_config
from structlog.testing import capture_logs

from parsers.cpulist import parse_cpulist
from parsers.errors import ParseError
from reporter.agent import SchemaProjection
from reporter.cli import main
from reporter.collect.kubelet import read_kubelet, read_kubelet_policies
from reporter.errors import (
    ApiPermanentError,
    ApiTransientError,
    CredentialsError,
    InputError,
    SchemaError,
)
from reporter.inputs import read_bounded
from reporter.publish import errors_map
from reporter.publish.api import NODES
from reporter.publish.kube import KubeApiClient, load_configuration
from reporter.publish.patch import Desired
from reporter.publish.rest import RestApiClient, load_rest_config
from reporter.schema.codec import decode, from_document
from reporter.schema.node import decode_node
from tests.parsers.test_documents import ALIAS_BOMB, nested_json
from tests.support.agent_support import NODE, PREFIX, FakeScanner, WireAgent, ok, topology
from tests.support.kube_double import ApiServerDouble

FIXTURES = Path(__file__).parents[1] / "fixtures"
GOLDEN = json.loads((FIXTURES / "nvidia-smi" / "03-dgx-a100-nv12-mlx5.golden.json").read_text())
TOPOLOGY_KEY = f"{PREFIX}/topology"
DEVICE_WITHOUT_END = "/dev/zero"


def poisoned(depth: int) -> str:
    """The review's 2 KB annotation: a valid document whose `gpus` is a list `depth` deep."""
    text = json.dumps({**GOLDEN, "gpus": "POISON"}, separators=(",", ":"))
    return text.replace('"POISON"', nested_json(depth))


# -- item 1: the 2 KB annotation -----------------------------------------------------------------


@pytest.mark.parametrize("depth", [9, 100, 984, 985, 987, 990, 10_000])
def test_a_deep_annotation_is_a_schema_error_from_both_decoders(
    depth: int, recursion_limit: int
) -> None:
    text = poisoned(depth)
    with pytest.raises(SchemaError, match="nested more than 8 levels deep"):
        decode(text)
    node = {"kind": "Node", "metadata": {"name": "n1", "annotations": {TOPOLOGY_KEY: text}}}
    with pytest.raises(SchemaError, match="nested more than 8 levels deep"):
        decode_node(node)


@pytest.mark.parametrize("offset", [-20, -5, 0, 5, 20])
def test_a_deep_annotation_near_the_recursion_limit_is_a_schema_error(
    offset: int, recursion_limit: int
) -> None:
    with pytest.raises(SchemaError):
        decode(poisoned(recursion_limit + offset))


def test_a_deep_document_built_in_code_is_a_schema_error_before_validation() -> None:
    deep: list[Any] = []
    for _ in range(5000):
        deep = [deep]
    with pytest.raises(SchemaError, match="nested more than 8 levels deep"):
        from_document({**GOLDEN, "gpus": deep})


def test_the_agent_reads_a_poisoned_annotation_of_any_depth_as_not_its_own() -> None:
    # The RecursionError window of the review is a few levels wide and moves with the stack:
    # sweep every depth to the recursion limit and past it.
    projection = SchemaProjection(PREFIX)
    for depth in range(1, sys.getrecursionlimit() + 50):
        published = Desired(labels={}, annotations={TOPOLOGY_KEY: poisoned(depth)})
        assert projection.topology(published) is None


def test_the_agent_overwrites_a_poisoned_annotation_instead_of_dying(
    apiserver: ApiServerDouble, kubeconfig: Path, wire: WireAgent
) -> None:
    apiserver.edit_node(NODE, {"metadata": {"annotations": {TOPOLOGY_KEY: poisoned(985)}}})
    w = wire(kubeconfig, FakeScanner([ok(topology())]))
    assert w.agent.step()
    assert decode(apiserver.annotations(NODE)[TOPOLOGY_KEY]) == topology()


def _doctor(kubeconfig: Path, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    status = main(["doctor", "--kubeconfig", str(kubeconfig), *argv])
    out, err = capsys.readouterr()
    assert err == ""
    return status, out


def test_doctor_reports_a_poisoned_node_as_damaged_and_goes_on(
    apiserver: ApiServerDouble, admin_kubeconfig: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    apiserver.add_node("healthy")
    apiserver.edit_node("healthy", {"metadata": {"annotations": {TOPOLOGY_KEY: decode_golden()}}})
    apiserver.edit_node(NODE, {"metadata": {"annotations": {TOPOLOGY_KEY: poisoned(985)}}})
    status, out = _doctor(admin_kubeconfig, capsys, "--node", NODE, "--format", "json")
    findings = json.loads(out)["nodes"][0]["findings"]
    assert status == 1
    assert findings[0]["code"] == "topology-unreadable"
    assert "nested more than 8 levels deep" in findings[0]["evidence"][0]
    status, out = _doctor(admin_kubeconfig, capsys, "--all", "--format", "json")
    by_node = {n["node"]: n["findings"] for n in json.loads(out)["nodes"]}
    assert set(by_node) == {NODE, "healthy"}
    assert by_node[NODE][0]["code"] == "topology-unreadable"
    assert "topology-unreadable" not in [f["code"] for f in by_node["healthy"]]


def decode_golden() -> str:
    return json.dumps(GOLDEN, separators=(",", ":"))


# -- items 3 and 15: every file the CLI reads ------------------------------------------------------


def _one_line_exit(argv: list[str], capsys: pytest.CaptureFixture[str], status: int = 1) -> str:
    """The error line of `argv`, which must exit `status`: 1 for input that does not read, 2 for
    a settings file or profile (a bad value, as a flag's would be)."""
    exited = main(argv)
    out, err = capsys.readouterr()
    assert (exited, out) == (status, "")
    assert err.count("\n") == 1
    assert err.startswith("topo-reporter: error: ")
    assert len(err) < 400
    return err


DOCUMENT_INPUTS: list[tuple[str, str, str]] = [
    ("driver: an alias bomb", ALIAS_BOMB.replace("a: &a", "driver: &a", 1), "alias"),
    ("YAML nested 985 deep", "driver: " + nested_json(985), "nested more than"),
    ("JSON nested 985 deep", '{"v":1,"driver":' + nested_json(985) + "}", "nested more than"),
    ("a 5,000-digit integer", f"v: {'1' * 5000}\n", "5000 digits"),
    ("a 5,000-digit JSON integer", '{"v":' + "1" * 5000 + "}", "5000 digits"),
]


@pytest.mark.parametrize("command", ["render", "best-set"])
@pytest.mark.parametrize(
    ("text", "said"), [c[1:] for c in DOCUMENT_INPUTS], ids=[c[0] for c in DOCUMENT_INPUTS]
)
def test_a_hostile_topology_document_is_one_line(
    command: str, text: str, said: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "doc.yaml"
    path.write_text(text)
    extra = ["--gpus", "1"] if command == "best-set" else []
    assert said in _one_line_exit([command, str(path), *extra], capsys)


@pytest.mark.parametrize("command", ["parse", "render", "best-set"])
def test_input_without_an_end_is_refused_at_the_size_bound(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    extra = ["--gpus", "1"] if command == "best-set" else []
    err = _one_line_exit([command, DEVICE_WITHOUT_END, *extra], capsys)
    assert "larger than 4 MiB" in err


SETTINGS_FILES: list[tuple[str, str | None, str]] = [
    ("interval: an alias bomb", ALIAS_BOMB.replace("a: &a", "interval: &a", 1), "alias"),
    ("nested 985 deep", "interval: " + nested_json(985), "nested more than"),
    ("a 5,000-digit interval", f"interval: {'1' * 5000}\n", "5000 digits"),
    ("a 5,000-digit hex interval", f"interval: 0x{'f' * 5000}\n", "digits: at most 64"),
    ("/dev/zero", None, "larger than 64 KiB"),
]


@pytest.mark.parametrize(
    ("text", "said"), [c[1:] for c in SETTINGS_FILES], ids=[c[0] for c in SETTINGS_FILES]
)
def test_a_hostile_settings_file_is_one_line(
    text: str | None, said: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "settings.yaml"
    if text is not None:
        path.write_text(text)
    config = str(path) if text is not None else DEVICE_WITHOUT_END
    err = _one_line_exit(["run", "--config", config, "--dry-run", "--once"], capsys, 2)
    assert said in err
    assert "settings file" in err


PROFILES: list[tuple[str, str | None, str]] = [
    ("an alias bomb", ALIAS_BOMB, "alias"),
    ("nested 985 deep", "numa_nodes: " + nested_json(985), "nested more than"),
    ("a 5,000-digit NUMA id", f"numa_nodes: [{{id: {'1' * 5000}, cpus: '0'}}]\npcie: []\n", "5000"),
    ("gpu defaults that are a list", "numa_nodes: []\ngpu: [1]\npcie: []\n", "machine profile"),
    ("/dev/zero", None, "larger than 1 MiB"),
]


@pytest.mark.parametrize(("text", "said"), [c[1:] for c in PROFILES], ids=[c[0] for c in PROFILES])
def test_a_hostile_machine_profile_is_one_line(
    text: str | None, said: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "box.yaml"
    if text is not None:
        path.write_text(text)
    profile = str(path) if text is not None else DEVICE_WITHOUT_END
    assert said in _one_line_exit(["collect", "--simulate", profile], capsys, 2)


KUBELET_CONFIGS: list[tuple[str, str | None, str]] = [
    ("an alias bomb", ALIAS_BOMB.replace("a: &a", "topologyManagerPolicy: &a", 1), "alias"),
    ("nested 985 deep", "topologyManagerPolicy: " + nested_json(985), "nested more than"),
    ("a 5,000-digit integer", f"cpuManagerPolicy: {'1' * 5000}\n", "5000 digits"),
    ("/dev/zero", None, "larger than 1 MiB"),
]


@pytest.mark.parametrize(
    ("text", "said"), [c[1:] for c in KUBELET_CONFIGS], ids=[c[0] for c in KUBELET_CONFIGS]
)
def test_a_hostile_kubelet_config_is_logged_once_and_the_agent_keeps_publishing(
    text: str | None,
    said: str,
    apiserver: ApiServerDouble,
    kubeconfig: Path,
    tmp_path: Path,
    wire: WireAgent,
) -> None:
    path = tmp_path / "config.yaml"
    if text is not None:
        path.write_text(text)
    kubelet = Path(DEVICE_WITHOUT_END) if text is None else path
    with pytest.raises(InputError, match=said):
        read_kubelet_policies(kubelet)
    w = wire(
        kubeconfig,
        FakeScanner([ok(topology())]),
        kubelet=functools.partial(read_kubelet, kubelet),
    )
    with capture_logs() as logs:
        for _ in range(3):
            assert w.agent.step()
            w.clock.advance(60)
    assert [e["event"] for e in logs].count("kubelet_config_unreadable") == 1
    assert w.state.readiness().ok
    assert decode(apiserver.annotations(NODE)[TOPOLOGY_KEY]) == topology()


KUBECONFIGS: list[tuple[str, str | None, str]] = [
    ("an alias bomb", ALIAS_BOMB.replace("a: &a", "clusters: &a", 1), "alias"),
    ("nested 985 deep", "clusters: " + nested_json(985), "nested more than"),
    ("a 5,000-digit integer", f"current-context: {'1' * 5000}\n", "5000 digits"),
    ("/dev/zero", None, "larger than 4 MiB"),
]
LOADERS: dict[str, Callable[[str], object]] = {
    "lean": load_rest_config,
    "official": load_configuration,
}


@pytest.mark.parametrize("client", sorted(LOADERS))
@pytest.mark.parametrize(
    ("text", "said"), [c[1:] for c in KUBECONFIGS], ids=[c[0] for c in KUBECONFIGS]
)
def test_a_hostile_kubeconfig_is_a_credentials_error_naming_the_file(
    client: str, text: str | None, said: str, tmp_path: Path
) -> None:
    path = tmp_path / "kubeconfig"
    if text is not None:
        path.write_text(text)
    where = str(path) if text is not None else DEVICE_WITHOUT_END
    with pytest.raises(CredentialsError, match=said) as e:
        LOADERS[client](where)
    assert where in str(e.value)
    assert "\n" not in str(e.value)


def test_a_token_file_without_an_end_is_a_credentials_error_not_a_hang(
    apiserver: ApiServerDouble, kubeconfig: Path
) -> None:
    text = kubeconfig.read_text().replace("token: agent-token", f"tokenFile: {DEVICE_WITHOUT_END}")
    assert text != kubeconfig.read_text()
    kubeconfig.write_text(text)
    client = RestApiClient(load_rest_config(str(kubeconfig)), request_timeout_s=(2.0, 2.0))
    with pytest.raises(CredentialsError, match="larger than 64 KiB"):
        client.get(NODES, NODE)


def fifo(tmp_path: Path) -> Path:
    """A FIFO nobody writes: a plain open() of it waits forever."""
    path = tmp_path / "fifo"
    os.mkfifo(path)
    return path


def test_a_fifo_nobody_writes_is_read_as_empty_not_waited_on(tmp_path: Path) -> None:
    assert read_bounded(fifo(tmp_path), limit=10, what="settings file") == ""


TLS_ENTRIES = [
    ("clusters", "certificate-authority", "certificate-authority file"),
    ("users", "client-certificate", "client-certificate file"),
    ("users", "client-key", "client-key file"),
]


def kubeconfig_naming(path: Path, section: str, key: str, target: str) -> Path:
    """A kubeconfig whose cluster or user names `target` for `key` (a PEM file's place)."""
    cluster: dict[str, Any] = {"server": "https://127.0.0.1:6443"}
    user: dict[str, Any] = {"token": "t"}
    if section == "clusters":
        cluster[key] = target
    else:
        # The other half of the pair is a good-sized file: the one under test is what fails.
        other = path.parent / "other.pem"
        other.write_text("-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n")
        user.update({"client-certificate": str(other), "client-key": str(other), key: target})
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "c",
                "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
                "clusters": [{"name": "k", "cluster": cluster}],
                "users": [{"name": "u", "user": user}],
            }
        )
    )
    return path


def lean_client(kubeconfig: str) -> object:
    return RestApiClient(load_rest_config(kubeconfig))


TLS_LOADERS: dict[str, Callable[[str], object]] = {
    "lean": lean_client,
    "official": load_configuration,
}


@pytest.mark.parametrize("client", sorted(TLS_LOADERS))
@pytest.mark.parametrize(("section", "key", "what"), TLS_ENTRIES, ids=[e[1] for e in TLS_ENTRIES])
def test_a_tls_file_too_large_to_be_one_is_a_credentials_error_before_openssl_reads_it(
    client: str, section: str, key: str, what: str, tmp_path: Path
) -> None:
    huge = tmp_path / "huge.pem"
    with huge.open("wb") as f:
        f.truncate(2 << 30)  # sparse: 2 GiB that OpenSSL would read to the end
    kubeconfig = kubeconfig_naming(tmp_path / "kubeconfig", section, key, str(huge))
    with pytest.raises(CredentialsError, match=f"{what} {huge} is larger than 1 MiB"):
        TLS_LOADERS[client](str(kubeconfig))


@pytest.mark.parametrize("client", sorted(TLS_LOADERS))
@pytest.mark.parametrize(("section", "key", "what"), TLS_ENTRIES, ids=[e[1] for e in TLS_ENTRIES])
def test_a_tls_file_without_an_end_is_one_credentials_error_not_a_hang(
    client: str, section: str, key: str, what: str, tmp_path: Path
) -> None:
    kubeconfig = kubeconfig_naming(tmp_path / "kubeconfig", section, key, DEVICE_WITHOUT_END)
    with pytest.raises(CredentialsError) as e:
        TLS_LOADERS[client](str(kubeconfig))
    # The official loader refuses a file that is not a regular one itself, in its own words.
    if client == "lean":
        assert f"{what} {DEVICE_WITHOUT_END} is larger than 1 MiB" in str(e.value)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("client", sorted(TLS_LOADERS))
def test_a_fifo_named_as_the_ca_ends_in_one_error_not_a_hang(client: str, tmp_path: Path) -> None:
    named = str(fifo(tmp_path))
    kubeconfig = kubeconfig_naming(
        tmp_path / "kubeconfig", "clusters", "certificate-authority", named
    )
    with pytest.raises(CredentialsError) as e:
        lean_client(str(kubeconfig)) if client == "lean" else official_client(str(kubeconfig))
    assert "\n" not in str(e.value)


def official_client(kubeconfig: str) -> object:
    """The official client as the agent builds it: an empty CA fails at its first TLS context."""
    return KubeApiClient(load_configuration(kubeconfig))


def test_an_in_cluster_token_file_without_an_end_is_refused_by_the_official_loader(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    ca = tmp_path / "ca.crt"
    ca.write_text("")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "6443")
    monkeypatch.setattr(incluster_config, "SERVICE_TOKEN_FILENAME", DEVICE_WITHOUT_END)
    monkeypatch.setattr(incluster_config, "SERVICE_CERT_FILENAME", str(ca))
    with pytest.raises(CredentialsError, match="token file /dev/zero is larger than 64 KiB"):
        load_configuration(None)


@pytest.mark.parametrize(
    ("answer", "error", "said"),
    [
        (b"[" * 5000 + b"]" * 5000, ApiPermanentError, "nested more than 100 levels deep"),
        (b'{"metadata": {"annotations": {"a": "' + b"[" * 5000 + b'"}}}', None, ""),
        (b"<html>502 Bad Gateway</html>", ApiTransientError, "is not JSON"),
        (b'{"replicas": ' + b"9" * 5000 + b"}", ApiPermanentError, "5000 digits"),
    ],
    ids=[
        "an object nested 5,000 deep",
        "brackets inside a string are only text",
        "a proxy's error page",
        "a 5,000-digit integer",
    ],
)
def test_an_api_answer_is_read_within_bounds(
    answer: bytes, error: type[Exception] | None, said: str
) -> None:
    if error is None:
        assert errors_map.answer_json(answer, "read node n1")["metadata"]
        return
    with pytest.raises(error, match=said):
        errors_map.answer_json(answer, "read node n1")


# -- issue 19, item 1: numbers too long for int() ------------------------------------------------

LONG_NUMBER = "1" * 4400
"""The review's CPU number: past int()'s 4,300-digit limit, where it raises a bare ValueError."""
A100_PASTE = FIXTURES / "nvidia-smi" / "03-dgx-a100-nv12-mlx5.txt"
ASUS_SYSFS = FIXTURES / "machines" / "asus-esc8000a" / "sysfs"
ASUS_GPU2 = "devices/pci0000:c0/0000:c0:01.1/0000:c1:00.0"


def paste_with_long_cpu_number(tmp_path: Path) -> Path:
    """The DGX A100 paste with GPU0's CPU affinity a 4,400-digit number."""
    text = A100_PASTE.read_text()
    assert "\t48-63,176-191\t" in text
    path = tmp_path / "paste.txt"
    path.write_text(text.replace("\t48-63,176-191\t", f"\t{LONG_NUMBER}\t", 1))
    return path


@pytest.mark.parametrize("command", ["parse", "best-set"])
def test_a_paste_with_a_4400_digit_cpu_number_is_one_line(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    extra = ["--gpus", "2"] if command == "best-set" else []
    err = _one_line_exit([command, str(paste_with_long_cpu_number(tmp_path)), *extra], capsys)
    assert "a number of 4400 digits" in err
    assert "line 10" in err


@pytest.fixture
def sysfs_with_long_cpu_number(tmp_path: Path) -> Path:
    """The ASUS machine's sysfs tree with GPU 2's `local_cpulist` a 4,400-digit number."""
    root = tmp_path / "sysfs"
    shutil.copytree(ASUS_SYSFS, root, symlinks=True)
    (root / ASUS_GPU2 / "local_cpulist").write_text(LONG_NUMBER + "\n")
    return root


def test_collect_reads_a_4400_digit_cpu_list_in_sysfs_as_unknown(
    sysfs_with_long_cpu_number: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status = main(
        ["collect", "--backend", "sysfs", "--sysfs-root", str(sysfs_with_long_cpu_number)]
    )
    out, _ = capsys.readouterr()
    assert status == 0
    gpus = json.loads(out.strip().splitlines()[-1])["gpus"]
    # That GPU's CPU list is unknown, as where the file is missing; the scan goes on.
    assert [g["cpus"] for g in gpus] == ["0-31", "0-31", None, "32-63"]


def test_the_run_loop_publishes_through_a_4400_digit_cpu_list_in_sysfs(
    sysfs_with_long_cpu_number: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["run", "--once", "--dry-run", "--node", "n1", "--backend", "sysfs"]
    status = main([*argv, "--sysfs-root", str(sysfs_with_long_cpu_number), "--listen", ""])
    out, _ = capsys.readouterr()
    assert status == 0
    assert f'"{TOPOLOGY_KEY}"' in out


def test_a_stride_group_wider_than_any_machine_is_refused_not_allocated() -> None:
    # 2**99999999999 bits was allocated before the check; 9 digits took 1.5 s and 125 MB.
    with pytest.raises(ParseError, match="0 < used <= group <= 65536"):
        parse_cpulist("0-15:99999999999/99999999999")
