"""Our PodResources .proto against the kubelet's, and the committed stubs against their generator.

The upstream file is the Go module k8s.io/kubelet's `pkg/apis/podresources/v1/api.proto`, fetched
into the module cache with `go mod download` (the Go toolchain the control-plane tests use too).
Both files are compiled by the same protoc (grpcio-tools) and their descriptors compared: every
message, every field's number, type, label and message type, the service and its methods.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from google.protobuf import descriptor_pb2

from tests.support.controlplane_fixtures import go_binary

KUBELET_MODULE = "k8s.io/kubelet@v0.34.4"
UPSTREAM = "pkg/apis/podresources/v1/api.proto"
ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "reporter/collect/podresources_v1"
GENERATED = ("api_pb2.py", "api_pb2.pyi", "api_pb2_grpc.py")


def protoc(*args: str, cwd: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def upstream_proto() -> Path:
    """The kubelet's api.proto from the Go module cache; fails in one line without Go."""
    result = subprocess.run(
        [go_binary(), "mod", "download", "-json", KUBELET_MODULE],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "GOFLAGS": "-mod=mod"},
        cwd="/",
    )
    assert result.returncode == 0, f"go mod download {KUBELET_MODULE}: {result.stderr.strip()}"
    return Path(json.loads(result.stdout)["Dir"]) / UPSTREAM


def descriptor(proto: Path, tmp: Path, name: str) -> descriptor_pb2.FileDescriptorProto:
    out = tmp / f"{name}.pb"
    protoc(f"-I{proto.parent}", f"--descriptor_set_out={out}", proto.name, cwd=tmp)
    files = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file
    assert len(files) == 1
    return files[0]


def shape(file: descriptor_pb2.FileDescriptorProto) -> dict[str, Any]:
    """What the wire depends on: package, messages and fields by number, service methods."""
    return {
        "package": file.package,
        "messages": {
            m.name: {
                f.number: (f.name, f.type, f.label, f.type_name, f.proto3_optional) for f in m.field
            }
            for m in file.message_type
        },
        "services": {
            s.name: {m.name: (m.input_type, m.output_type) for m in s.method} for s in file.service
        },
    }


def test_our_proto_has_the_kubelets_messages_fields_and_methods(tmp_path: Path) -> None:
    ours = shape(descriptor(ROOT / PACKAGE / "api.proto", tmp_path, "ours"))
    theirs = shape(descriptor(upstream_proto(), tmp_path, "theirs"))
    assert ours == theirs
    # The comparison is not vacuous: the messages the reader uses are there.
    assert ours["services"]["PodResourcesLister"]["List"] == (
        ".v1.ListPodResourcesRequest",
        ".v1.ListPodResourcesResponse",
    )
    assert ours["messages"]["ContainerDevices"][2][0] == "device_ids"


def test_the_committed_stubs_are_what_grpcio_tools_generates(tmp_path: Path) -> None:
    target = tmp_path / PACKAGE
    target.mkdir(parents=True)
    shutil.copy(ROOT / PACKAGE / "api.proto", target / "api.proto")
    protoc(
        "-I.",
        "--python_out=.",
        "--pyi_out=.",
        "--grpc_python_out=.",
        f"{PACKAGE}/api.proto",
        cwd=tmp_path,
    )
    stale = [
        name
        for name in GENERATED
        if (target / name).read_bytes() != (ROOT / PACKAGE / name).read_bytes()
    ]
    assert not stale, (
        f"{', '.join(stale)} differ from what grpcio-tools generates from api.proto: "
        "regenerate them with the command at the top of api.proto"
    )
