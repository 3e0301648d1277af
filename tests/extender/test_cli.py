"""`topo-reporter extender` as an operator runs it: a process, the double as cluster, HTTP calls."""

from __future__ import annotations

import http.client
import json
import signal
import subprocess
from pathlib import Path

import pytest

from tests.cli.test_run import CLI, env
from tests.extender.test_protocol import pod
from tests.support.kube_double import ApiServerDouble, Certificate, write_kubeconfig


def test_it_serves_the_verbs_until_sigterm_then_exits_zero(
    apiserver: ApiServerDouble, apiserver_certificate: Certificate, tmp_path: Path
) -> None:
    kubeconfig = write_kubeconfig(
        tmp_path / "extender.kubeconfig",
        apiserver.url,
        "extender-token",
        ca_cert=apiserver_certificate.cert,
    )
    with subprocess.Popen(
        [*CLI, "extender", "--listen", "127.0.0.1:0", "--kubeconfig", str(kubeconfig)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env(TOPO_REPORTER_LOG_FORMAT="json"),
    ) as proc:
        assert proc.stderr is not None
        address = ""
        for line in proc.stderr:
            event = json.loads(line)
            if event["event"] == "serving":
                address = event["address"]
                break
        host, port = address.rsplit(":", 1)
        connection = http.client.HTTPConnection(host, int(port), timeout=10)
        args = {"Pod": pod(1), "NodeNames": ["gpu-node-1"]}
        connection.request("POST", "/filter", json.dumps(args))
        filtered = json.loads(connection.getresponse().read())
        connection.request("POST", "/prioritize", json.dumps(args))  # the same connection
        ranked = json.loads(connection.getresponse().read())
        connection.close()
        proc.send_signal(signal.SIGTERM)
        status = proc.wait(timeout=10)
        rest = proc.stderr.read()
    assert status == 0, rest
    assert filtered["NodeNames"] == ["gpu-node-1"]
    assert ranked == [{"Host": "gpu-node-1", "Score": 5}]
    assert "extender-token" not in rest


@pytest.mark.parametrize(
    ("flags", "message", "status"),
    [
        (["--listen", "nowhere"], "is not host:port", 2),
        (["--listen", ""], "needs --listen HOST:PORT", 2),
        (["--resource", "Nvidia GPUs"], "is not a resource name", 2),
        (["--max-request-bytes", "0"], "--max-request-bytes must be at least 1", 2),
        (["--kubeconfig", "/nonexistent/kubeconfig"], "cannot load Kubernetes credentials", 1),
        (["--heartbeat-namespace", "GPU_System"], "is not a namespace name", 2),
        (["--connected-wait", "25h"], "--connected-wait must be a duration from 0s to 24h", 2),
        (["--connected-wait", "soon"], "--connected-wait 'soon' is not a duration", 2),
    ],
    ids=[
        "an address without a port",
        "no address",
        "a bad resource",
        "no room",
        "no credentials",
        "a heartbeat namespace that cannot be one",
        "a hold longer than a day",
        "a hold that is not a duration",
    ],
)
def test_a_bad_setting_is_one_line_and_exit_2_credentials_that_do_not_load_exit_1(
    flags: list[str], message: str, status: int
) -> None:
    result = subprocess.run(
        [*CLI, "extender", *flags],
        capture_output=True,
        text=True,
        timeout=60,
        env=env(),
        check=False,
    )
    assert result.returncode == status
    assert result.stderr.count("\n") == 1
    assert message in result.stderr


def test_credentials_only_the_official_client_can_use_are_refused_in_one_line(
    apiserver: ApiServerDouble, apiserver_certificate: Certificate, tmp_path: Path
) -> None:
    kubeconfig = write_kubeconfig(
        tmp_path / "exec.kubeconfig",
        apiserver.url,
        "extender-token",
        ca_cert=apiserver_certificate.cert,
        exec_plugin=True,
    )
    result = subprocess.run(
        [*CLI, "extender", "--listen", "127.0.0.1:0", "--kubeconfig", str(kubeconfig)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env(),
        check=False,
    )
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1
    assert "the extender reads Nodes with the lean client only" in result.stderr
