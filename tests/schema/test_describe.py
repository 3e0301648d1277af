"""The `matrix` annotation as `kubectl describe node` shows it: whole lines, aligned, every fact."""

from __future__ import annotations

import pytest
from hypothesis import given, settings

from parsers.cpulist import format_cpulist
from parsers.kubelet import KubeletPolicies
from parsers.links import SELF
from reporter.agent import SchemaProjection
from reporter.schema.keys import DEFAULT_PREFIX
from reporter.schema.labels import kubelet_labels, summary
from reporter.schema.matrix import DESCRIBE_WIDTH, describe_matrix
from reporter.schema.model import Gpu, Nic, Source, Topology
from tests.support.describe_machines import NODE, NV12, SYS, generated_16_gpus_12_nics, machines
from tests.support.strategies import topologies

MACHINES = sorted(machines())


def rows_of(text: str, label: str) -> list[list[str]]:
    return [line.split() for line in text.splitlines() if line.startswith(label + " ")]


def assert_whole_and_complete(topology: Topology, text: str) -> None:
    """Every line fits; the summary comes first; every GPU's links, NIC paths and affinity show."""
    lines = text.splitlines()
    assert all(len(line) <= DESCRIBE_WIDTH for line in lines), max(lines, key=len)
    assert "\t" not in text
    assert lines[0] == summary(topology) or len(summary(topology)) > DESCRIBE_WIDTH
    n = len(topology.gpus)
    for i, gpu in enumerate(topology.gpus):
        rows = rows_of(text, f"GPU{i}")
        assert rows, f"no row for GPU{i}"
        cells = [c for row in rows for c in row[1:]]
        links = [c.token for c in topology.links[i]]
        if n <= 16:  # wider machines are cut into column groups
            assert rows[0][1 : n + 1] == links
        shown = " ".join(cells)
        for value in (gpu.cpus, gpu.numa):
            if value and len(format_cpulist(value)) < DESCRIBE_WIDTH // 2:
                assert format_cpulist(value) in shown
    for k, nic in enumerate(topology.nics if n else ()):
        column = [c.token for c in nic.links]
        as_rows = rows_of(text, f"NIC{k}")
        if as_rows:
            assert as_rows[0][1 : n + 1] == column
        else:
            first_row = next(r for r, line in enumerate(lines) if line.startswith("GPU0 "))
            header = lines[first_row - 1].split()
            position = header.index(f"NIC{k}") + 1
            assert [rows_of(text, f"GPU{i}")[0][position] for i in range(n)] == column


@pytest.mark.parametrize("name", MACHINES)
def test_every_machine_shows_whole_in_kubectl_describe(name: str) -> None:
    topology = machines()[name]
    assert_whole_and_complete(topology, describe_matrix(topology))


@settings(max_examples=60, deadline=None)
@given(topologies(max_gpus=16, max_nics=12))
def test_any_machine_up_to_16_gpus_and_12_nics_shows_whole(topology: Topology) -> None:
    assert_whole_and_complete(topology, describe_matrix(topology))


def test_a_dgx_h100_keeps_nics_and_affinity_beside_the_matrix_as_nvidia_smi_does() -> None:
    text = describe_matrix(machines()["profile dgx-h100"])
    lines = text.splitlines()
    assert lines[0] == "8x NVIDIA H100 80GB HBM3, NVSwitch NV18, 2 NUMA nodes, 8 RDMA NICs"
    assert lines[1].split()[-4:] == ["CPU", "Affinity", "NUMA", "Affinity"]
    assert lines[6].split() == [
        "GPU4", *["NV18"] * 4, "X", *["NV18"] * 3, *["SYS"] * 4, "PIX", *["NODE"] * 3,
        "56-111,168-223", "1",
    ]  # fmt: skip
    # Columns align: every cell of a column starts where its header does.
    start = lines[1].index("NIC4")
    assert all(line[start:].startswith(("PIX", "NODE", "SYS")) for line in lines[2:10])
    assert "NIC Legend: NIC<k> = mlx5_<k>, k = 0-7" in lines
    assert not rows_of(text, "NIC0"), "NIC-to-NIC paths are left to the topology annotation"


def test_16_gpus_with_12_nics_put_the_nics_below_as_rows_as_nvidia_smi_prints_them() -> None:
    text = describe_matrix(generated_16_gpus_12_nics())
    lines = text.splitlines()
    assert lines[1].split() == [
        *(f"GPU{i}" for i in range(16)),
        "CPU",
        "Affinity",
        "NUMA",
        "Affinity",
    ]
    assert rows_of(text, "GPU15")[0][-2:] == ["56-111,168-223", "1"]
    assert rows_of(text, "NIC11")[0] == ["NIC11", *["SYS"] * 8, *["NODE"] * 8]


def scattered_affinity(topology: Topology, nics: tuple[Nic, ...]) -> Topology:
    """`topology` with `nics`, and CPU lists too long to sit beside the matrix (`0,2,4,...`)."""
    gpus = tuple(
        Gpu(g.index, model=g.model, numa=g.numa, cpus=frozenset(range(g.index % 2, 64, 2)))
        for g in topology.gpus
    )
    return Topology(topology.source, gpus, topology.links, nics=nics, nvswitch=True)


def test_affinity_too_wide_to_sit_beside_goes_on_lines_of_its_own_with_the_nearest_nic() -> None:
    base = generated_16_gpus_12_nics()
    text = describe_matrix(scattered_affinity(base, base.nics))
    lines = text.splitlines()
    assert all(len(line) <= DESCRIBE_WIDTH for line in lines)
    assert lines[1].split() == [f"GPU{i}" for i in range(16)]
    affinity = lines.index(next(line for line in lines if "Nearest NIC" in line))
    assert lines[affinity].split() == ["NUMA", "Affinity", "Nearest", "NIC", "CPU", "Affinity"]
    assert lines[affinity + 1].split()[:4] == ["GPU0", "0", "NIC0", "PIX"]
    assert lines[affinity + 16].split() == [
        "GPU15",
        "1",
        "NIC7",
        "PIX",
        "1,3,5,7,9,11,13,15,17,19,"
        "21,23,25,27,29,31,33,35,37,39,41,43,45,47,49,51,53,55,57,59,61,63",
    ]


def test_nearest_nic_lists_ties_and_says_all_when_every_nic_is_as_near() -> None:
    base = generated_16_gpus_12_nics()
    nics = (
        Nic("ib0", (NODE,) * 16),
        Nic("ib1", (NODE,) * 15 + (SYS,)),
        *(Nic(f"ib{k}", (SYS,) * 16) for k in range(2, 12)),
    )
    text = describe_matrix(scattered_affinity(base, nics))
    assert rows_of(text, "GPU0")[-1][1:4] == ["0", "NIC0,NIC1", "NODE"]
    assert rows_of(text, "GPU15")[-1][1:4] == ["1", "NIC0", "NODE"]
    same = tuple(Nic(f"n{k}", (SYS,) * 16) for k in range(12))
    text = describe_matrix(scattered_affinity(base, same))
    assert rows_of(text, "GPU3")[-1][1:4] == ["0", "all", "SYS"]
    assert "NIC Legend: NIC<k> = n<k>, k = 0-11" in text.splitlines()


def test_a_cpulist_too_long_for_a_line_wraps_at_commas_under_its_gpu() -> None:
    scattered = frozenset(range(0, 512, 2))  # 256 single CPUs: `0,2,4,...`
    t = Topology(
        Source.NVML,
        (Gpu(0, cpus=scattered, numa=frozenset({0})), Gpu(1, cpus=frozenset({1}))),
        ((SELF, SYS), (SYS, SELF)),
    )
    lines = describe_matrix(t).splitlines()
    assert all(len(line) <= DESCRIBE_WIDTH for line in lines)
    start = next(i for i, line in enumerate(lines) if line.startswith("GPU0 ") and "0,2,4" in line)
    pieces = [lines[start].split()[-1]]
    for line in lines[start + 1 :]:
        if not line.startswith("      "):
            break
        pieces.append(line.strip())
    assert "".join(pieces) == format_cpulist(scattered)
    assert all(piece.endswith(",") for piece in pieces[:-1])


def test_more_gpus_than_a_line_holds_are_cut_into_column_groups() -> None:
    n = 40
    t = Topology(
        Source.NVML,
        tuple(Gpu(i) for i in range(n)),
        tuple(tuple(SELF if a == b else NV12 for b in range(n)) for a in range(n)),
    )
    text = describe_matrix(t)
    assert all(len(line) <= DESCRIBE_WIDTH for line in text.splitlines())
    cells = [c for row in rows_of(text, "GPU39") for c in row[1:]]
    assert cells[:n] == ["NV12"] * 39 + ["X"]


def test_no_gpus_is_the_summary_alone() -> None:
    assert describe_matrix(Topology(Source.NVML, (), ())) == "no GPUs\n"


def test_nic_names_that_do_not_follow_their_column_are_listed_one_by_one() -> None:
    base = generated_16_gpus_12_nics()
    nics = (Nic("mlx5_2", (SYS,) * 16), Nic("mlx5_3", (SYS,) * 16))
    text = describe_matrix(Topology(base.source, base.gpus, base.links, nics=nics))
    assert text.splitlines()[-1] == "NIC Legend: NIC0=mlx5_2 NIC1=mlx5_3"


def test_a_dgx_h100_node_carries_at_most_6_kib_of_ours_keys_included() -> None:
    """Every watcher of Nodes receives these bytes on every update of the Node. Schema v2 added
    each GPU's minor and NVLink count (256 bytes) and three labels: 5 KiB became 6."""
    longest = KubeletPolicies("single-numa-node", "container", "static")
    node = "ip-10-0-123-234.us-west-2.compute.internal"  # a long name: its own NVLink domain
    projection = SchemaProjection(DEFAULT_PREFIX, node)
    want = projection.desired(
        machines()["profile dgx-h100"], kubelet_labels(longest, DEFAULT_PREFIX)
    )
    items = {**want.labels, **want.annotations}
    assert sum(len(k.encode()) + len(v.encode()) for k, v in items.items()) <= 6 * 1024


def test_names_from_the_machine_cannot_break_a_line_or_widen_it_in_bytes() -> None:
    """kubectl counts bytes, and a newline in a name would start a line kubectl shows bare."""
    gpus = tuple(Gpu(i, model="Ünïcode GPU\nX: injected") for i in range(2))
    t = Topology(
        Source.NVML,
        gpus,
        ((SELF, SYS), (SYS, SELF)),
        nics=(Nic("nïc\tname\n0", (SYS, SYS)),),
    )
    lines = describe_matrix(t).splitlines()
    assert all(len(line.encode()) <= DESCRIBE_WIDTH for line in lines)
    assert lines[0].startswith("2x \\xdcn\\xefcode GPU?X: injected")
    assert lines[-1] == "NIC Legend: NIC0=n\\xefc?name?0"


def test_the_schemas_largest_machine_renders_in_column_groups() -> None:
    n = 256
    t = Topology(
        Source.NVML,
        tuple(Gpu(i) for i in range(n)),
        tuple(tuple(SELF if a == b else NV12 for b in range(n)) for a in range(n)),
    )
    lines = describe_matrix(t).splitlines()
    assert all(len(line) <= DESCRIBE_WIDTH for line in lines)
    assert sum(1 for line in lines if line.startswith("GPU255 ")) > 1
