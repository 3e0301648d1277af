"""`topo-reporter dra-template`: a ResourceClaimTemplate for K NVLink-connected GPUs, from
simulated machine kinds or from the Nodes' published topologies."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from parsers.errors import ParseError, excerpt
from parsers.integers import parse_decimal
from reporter import terminal
from reporter.collect import build_scanner
from reporter.commands import (
    EXIT_OK,
    EXIT_USAGE,
    PROG,
    add_prefix_argument,
    logs_to_stderr,
)
from reporter.errors import ApiPermanentError, ApiTransientError, ConfigError, InputError
from reporter.publish.api import NODES, RESOURCE_CLAIM_TEMPLATES, ApiClient
from reporter.schema import dra_template, keys
from reporter.schema.model import Topology
from reporter.schema.node import decode_node, node_name


def _claim_gpus(value: str) -> int:
    # Any count reads; the template's builder refuses one it cannot serve in one line of its own.
    try:
        return parse_decimal(value, field="--gpus")
    except ParseError:
        raise argparse.ArgumentTypeError(f"{excerpt(value)} is not a number of GPUs") from None


def _simulated_machines(profiles: Sequence[str]) -> list[dra_template.Machine]:
    machines = []
    for profile in dict.fromkeys(profiles):
        topology = build_scanner("auto", Path("/"), profile).scan().topology
        if topology is None:
            raise ConfigError(f"profile {profile!r} simulates no GPU: pick one that has GPUs")
        machines.append(dra_template.Machine(profile, (topology,)))
    return machines


def _operator_client(kubeconfig: str | None) -> ApiClient:
    # An operator's tool: the official client, for every kubeconfig kubectl takes.
    from reporter.publish import kube  # noqa: PLC0415  # keeps kubernetes out of the other commands

    return kube.operator_client(kubeconfig)


def _cluster_machines(api: ApiClient, prefix: str) -> list[dra_template.Machine]:
    """The Nodes' published topologies, nodes of one wiring as one machine kind."""
    kinds: dict[str, list[tuple[str, Topology]]] = {}
    query: dict[str, str] = {"limit": "500"}
    while True:
        page = api.list(NODES, query=query)
        for node in page["items"]:
            try:
                topology = decode_node(node, prefix)
            except InputError as e:
                # A node without the annotation runs no agent (no GPUs); one that does not decode
                # is said, since the template then leaves its GPUs out.
                if keys.key(prefix, keys.TOPOLOGY) in (node["metadata"].get("annotations") or {}):
                    terminal.write(
                        sys.stderr,
                        f"{PROG}: warning: left out: node {node_name(node)}: {e}\n",
                    )
                continue
            digest = dra_template.wiring_digest(topology)
            kinds.setdefault(digest, []).append((node_name(node), topology))
        token = page.get("metadata", {}).get("continue")
        if not token:
            break
        query = {"limit": "500", "continue": token}
    if not kinds:
        raise ConfigError(
            f"no Node publishes a {keys.key(prefix, keys.TOPOLOGY)} annotation: run the agent on "
            "the GPU nodes first, or pass --simulate PROFILE"
        )
    return [
        dra_template.Machine(
            nodes[0][0] + (f" (+{len(nodes) - 1} alike)" if len(nodes) > 1 else ""),
            tuple(t for _, t in nodes),
        )
        for nodes in sorted(kinds.values(), key=lambda n: n[0][0])
    ]


def _check_served(api: ApiClient, document: dict[str, Any], namespace: str) -> None:
    """Create the template as a dry run: the apiserver answers as it would store it. With
    `DRADerivedAttributes` off it drops the derived attribute without a word (an alpha field), and
    every claim would then wait for an attribute no device carries: that is refused here, with the
    gate named. Where the caller may not create templates, it is said and the template printed."""
    try:
        stored = api.create(RESOURCE_CLAIM_TEMPLATES, document, namespace, dry_run=True)
    except ApiPermanentError as e:
        if e.status == 403:
            terminal.write(
                sys.stderr,
                f"{PROG}: warning: the feature gates were not checked (a dry-run create of the "
                f"template was refused: {e})\n",
            )
            return
        if e.status == 404:
            raise ConfigError(
                "the cluster serves no resource.k8s.io/v1 ResourceClaimTemplates in namespace "
                f"{namespace}: the template needs Kubernetes 1.37 or newer with the "
                f"{' and '.join(dra_template.GATES)} feature gates (or pass --namespace of one "
                "that exists)"
            ) from None
        raise ConfigError(f"the cluster's apiserver refuses the template: {e}") from None
    except ApiTransientError as e:
        terminal.write(sys.stderr, f"{PROG}: warning: the feature gates were not checked: {e}\n")
        return
    if not dra_template.keeps_derived_attributes(stored):
        raise ConfigError(
            "the cluster's kube-apiserver drops the template's derivedAttributes: feature gate "
            f"{dra_template.GATES[0]} is off there; turn on {' and '.join(dra_template.GATES)} on "
            "kube-apiserver and kube-scheduler, then run this again"
        )


def handle(args: argparse.Namespace) -> int:
    """Print the template; 2 when none can be made (the reason on stderr)."""
    logs_to_stderr()
    try:
        if args.simulate and args.kubeconfig:
            raise ConfigError(
                "--simulate and --kubeconfig both given: pass profiles, or read the cluster"
            )
        api = None if args.simulate else _operator_client(args.kubeconfig)
        if api is None:
            machines = _simulated_machines(args.simulate)
        else:
            machines = _cluster_machines(api, args.prefix)
        template = dra_template.build(
            machines,
            args.gpus,
            fallback=args.fallback,
            device_class=args.device_class,
            name=args.name,
            namespace=args.namespace,
            prefix=args.prefix,
            uuids_known=not args.simulate,
        )
        if api is not None:
            _check_served(api, template.document, args.namespace or "default")
    except ConfigError as e:
        terminal.write(sys.stderr, f"{PROG}: error: {e}\n")
        return EXIT_USAGE
    terminal.write(sys.stdout, dra_template.to_yaml(template, machines))
    return EXIT_OK


def arguments(parser: argparse.ArgumentParser) -> None:
    """K, where the machines come from (--simulate or --kubeconfig), and the template's names."""
    parser.add_argument(
        "--gpus",
        type=_claim_gpus,
        required=True,
        metavar="K",
        help="GPUs per claim, 2 or more (one GPU needs no NVLink)",
    )
    parser.add_argument(
        "--simulate",
        metavar="PROFILE",
        action="append",
        help="a machine kind the cluster has: a name from `topo-reporter profiles` or a profile "
        "YAML file; repeat it for each kind (without it, the Nodes' published topologies)",
    )
    parser.add_argument(
        "--kubeconfig",
        metavar="FILE",
        help="read the Nodes with this kubeconfig (default: in-cluster, else KUBECONFIG or "
        "~/.kube/config)",
    )
    parser.add_argument(
        "--fallback",
        action="store_true",
        help="add a firstAvailable alternative: K connected GPUs, else any K",
    )
    parser.add_argument(
        "--device-class",
        default=dra_template.DEFAULT_DEVICE_CLASS,
        metavar="NAME",
        help="the DeviceClass to request (default: %(default)s)",
    )
    parser.add_argument("--name", metavar="NAME", help="the template's name")
    parser.add_argument("--namespace", metavar="NS", help="the template's namespace")
    add_prefix_argument(parser, "annotation prefix")
