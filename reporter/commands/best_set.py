"""`topo-reporter best-set`: the K best-connected GPUs of a node, with their score and why."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable

from parsers.errors import ParseError, excerpt
from parsers.integers import parse_decimal
from reporter import terminal
from reporter.commands import EXIT_OK, add_output_arguments
from reporter.gpuallocator import GO_GPUALLOCATOR_VERSION
from reporter.inputs import read_input
from reporter.placement import DEFAULT_BUDGET, Policy, best_gpu_set
from reporter.schema.reading import topology_from_any_text


def _count(flag: str, units: str, too_few: str) -> Callable[[str], int]:
    """The type of `flag`: a whole number of `units`, 1 or more (`too_few` says so below 1)."""

    def count(value: str) -> int:
        try:
            number = parse_decimal(value, field=flag)
        except ParseError:
            raise argparse.ArgumentTypeError(
                f"{excerpt(value)} is not a number of {units}"
            ) from None
        if number < 1:
            raise argparse.ArgumentTypeError(f"{number}: {too_few}")
        return number

    return count


_gpu_count = _count("--gpus", "GPUs", "ask for at least 1 GPU")
_work_units = _count("--budget", "work units", "give at least 1 work unit")


def _gpu_indices(value: str) -> list[int]:
    """A comma-separated list of GPU indexes; empty means none (no GPU free, nothing forced)."""
    try:
        return [
            parse_decimal(part.strip(), field="GPU") for part in value.split(",") if part.strip()
        ]
    except ParseError:
        raise argparse.ArgumentTypeError(
            f"{excerpt(value)} is not a comma-separated list of GPU indices (0,1,5)"
        ) from None


def handle(args: argparse.Namespace) -> int:
    """Print the best set `args` ask for, as text or JSON."""
    topology = topology_from_any_text(read_input(args.file), args.file, args.prefix)
    best = best_gpu_set(
        topology,
        args.gpus,
        args.available,
        must_include=args.must_include,
        policy=args.policy,
        budget=args.budget,
    )
    if args.format == "json":
        document = best.to_document()
        document["policy"] = str(args.policy)
        terminal.write(sys.stdout, json.dumps(document) + "\n")
        return EXIT_OK
    links, numa, nic, pcie = best.score
    policy = {
        Policy.BEST: "",
        Policy.PACKING: "policy: packing (connected where it can be, cutting into the smallest "
        "connected set: the largest stay whole)\n",
        Policy.NVIDIA_BESTEFFORT: f"policy: nvidia-besteffort (go-gpuallocator "
        f"{GO_GPUALLOCATOR_VERSION}'s best-effort choice, as NVIDIA's device plugin makes it; "
        "ties go to the order of --available)\n",
    }[args.policy]
    inexact = (
        ""
        if best.exact
        else f"note: not proven optimal: the search budget of {args.budget} work units ran out "
        "first; this is the best set found (raise --budget to search further)\n"
    )
    terminal.write(
        sys.stdout,
        f"GPUs: {','.join(map(str, best.gpus))}\n"
        f"score: {links} {numa} {nic} {pcie} (link points, minus NUMA nodes spanned, NIC points, "
        f"PCIe points; larger is better; {best.points_per_pair:.1f} points per pair)\n"
        f"why: {best.explain()}\n{policy}{inexact}",
    )
    return EXIT_OK


def arguments(parser: argparse.ArgumentParser) -> None:
    """FILE, the request (K, the free GPUs, the forced ones, a policy, a budget) and --format."""
    parser.add_argument("file", metavar="FILE", help="a file, or - for stdin")
    parser.add_argument(
        "--gpus", type=_gpu_count, required=True, metavar="K", help="how many GPUs to choose"
    )
    parser.add_argument(
        "--available",
        type=_gpu_indices,
        metavar="I,J,...",
        help="the GPU indices free to choose from (default: every GPU that is not lost; an empty "
        "list means none is free)",
    )
    parser.add_argument(
        "--must-include",
        type=_gpu_indices,
        default=[],
        metavar="I,J,...",
        help="GPU indices the set must hold (the kubelet's mustInclude); each must be available",
    )
    parser.add_argument(
        "--policy",
        type=Policy,
        choices=list(Policy),
        default=Policy.BEST,
        help="best: the best single set (default); packing: keep the largest NVLink-connected "
        "sets whole; nvidia-besteffort: what NVIDIA's device plugin takes (go-gpuallocator)",
    )
    parser.add_argument(
        "--budget",
        type=_work_units,
        default=DEFAULT_BUDGET,
        metavar="UNITS",
        help="search work units before settling for the best set found, reported as not proven "
        "optimal (default: %(default)s)",
    )
    add_output_arguments(
        parser,
        formats=("text", "json"),
        default="text",
        prefix_help="annotation prefix of a Node object",
    )
