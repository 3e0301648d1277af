"""`topo-reporter dra-template`: a ResourceClaimTemplate for K NVLink-connected GPUs, from
simulated machine kinds (`--machine`) or from the Nodes' published topologies."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from parsers.errors import ParseError, excerpt
from parsers.integers import parse_decimal
from reporter import settings, terminal
from reporter.collect import build_scanner
from reporter.commands import EXIT_OK, PROG, logs_to_stderr
from reporter.errors import (
    ApiPermanentError,
    ApiTransientError,
    CollectError,
    ConfigError,
    InputError,
)
from reporter.publish.api import (
    DRA_VERSIONS,
    NODES,
    RESOURCE_CLAIM_TEMPLATES,
    ApiClient,
    Resource,
    newest_served,
    resource_slices,
)
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
            raise CollectError(f"profile {profile!r} simulates no GPU: pick one that has GPUs")
        machines.append(dra_template.Machine(profile, (topology,)))
    return machines


def _operator_client(kubeconfig: str | None) -> ApiClient:
    # An operator's tool: the official client, for every kubeconfig kubectl takes.
    from reporter.publish import kube  # noqa: PLC0415  # keeps kubernetes out of the other commands

    return kube.operator_client(kubeconfig)


def _pages(api: ApiClient, resource: Resource, query: Mapping[str, str]) -> Iterator[Any]:
    """Every item of a list, 500 a page."""
    page_query = {**query, "limit": "500"}
    while True:
        page = api.list(resource, query=page_query)
        yield from page["items"]
        token = page.get("metadata", {}).get("continue")
        if not token:
            return
        page_query = {**query, "limit": "500", "continue": token}


def _slices(api: ApiClient) -> list[Any] | None:
    """Every ResourceSlice, in the newest resource.k8s.io version served; [] where none is
    (no DRA: no device for the template either), None where the caller may not list them."""
    return newest_served(
        DRA_VERSIONS, lambda version: list(_pages(api, resource_slices(version), {})), unserved=[]
    )


def _warn(line: str) -> None:
    terminal.write(sys.stderr, f"{PROG}: warning: {line}\n")


def _cluster_machines(
    api: ApiClient, prefix: str, selector: str | None, excluded: Sequence[str]
) -> tuple[list[dra_template.Machine], list[dra_template.LeftOut]]:
    """The Nodes' published topologies, nodes of one wiring as one machine kind; and the nodes
    left out (`--exclude`, outside `--selector`, no readable topology, copiers of UUIDs) with
    their GPUs, which the template must still keep from cliques not theirs."""
    try:
        nodes = list(_pages(api, NODES, {}))
        chosen = (
            None
            if selector is None
            else {node_name(n) for n in _pages(api, NODES, {"labelSelector": selector})}
        )
    except ApiPermanentError as e:
        if e.status == 400 and selector is not None:
            raise ConfigError(
                f"--selector {excerpt(selector)}: the apiserver refuses it: {e}"
            ) from None
        raise
    slices = _slices(api)
    if slices is None:
        _warn(
            "ResourceSlices may not be listed: GPUs of nodes whose topology does not read are "
            "not kept from the cliques (grant list on resourceslices.resource.k8s.io)"
        )
    devices = dra_template.slice_devices(slices or [])
    read: list[tuple[str, Topology]] = []
    left_out: list[dra_template.LeftOut] = []
    annotation = keys.key(prefix, keys.TOPOLOGY)
    for node in nodes:
        name = node_name(node)
        try:
            read.append((name, decode_node(node, prefix)))
        except InputError as e:
            # A node without the annotation runs no agent; one that does not decode is said.
            # Either way its GPUs, as its slices list them, are kept from the cliques.
            if annotation in (node["metadata"].get("annotations") or {}):
                _warn(f"left out: node {name}: {e}")
            left_out.append(dra_template.LeftOut(name, devices=tuple(devices.get(name, ()))))
    known = {node_name(n) for n in nodes}
    for name in sorted(set(devices) - known):
        left_out.append(dra_template.LeftOut(name, devices=tuple(devices[name])))
    for name in sorted(set(excluded) - known):
        _warn(f"--exclude {excerpt(name)}: no such Node")
    copying, lines = dra_template.copiers(read, None if slices is None else devices)
    for line in lines:
        _warn(line)
    kinds: dict[str, list[tuple[str, Topology]]] = {}
    for name, published in read:
        topology = dra_template.with_slice_uuids(published, devices.get(name, ()))
        if name in copying or name in excluded or (chosen is not None and name not in chosen):
            left_out.append(dra_template.LeftOut(name, topology))
            continue
        kinds.setdefault(dra_template.wiring_digest(topology), []).append((name, topology))
    if not kinds:
        raise dra_template.TemplateError(
            f"no Node publishes a {annotation} annotation"
            + (" among those --selector and --exclude leave" if selector or excluded else "")
            + ": run the agent on the GPU nodes first, or pass --machine PROFILE"
        )
    machines = [
        dra_template.Machine(
            alike[0][0] + (f" (+{len(alike) - 1} alike)" if len(alike) > 1 else ""),
            tuple(t for _, t in alike),
            tuple(n for n, _ in alike),
        )
        for alike in sorted(kinds.values(), key=lambda n: n[0][0])
    ]
    return machines, left_out


def _check_served(api: ApiClient, document: dict[str, Any], namespace: str) -> None:
    """Create the template as a dry run: the apiserver answers as it would store it. With
    `DRADerivedAttributes` off it drops the derived attribute without a word (an alpha field), and
    every claim would then wait for an attribute no device carries: that is refused here, with the
    gate named (a TemplateError: the cluster cannot serve it). Where the caller may not create
    templates, it is said and the template printed."""
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
            raise dra_template.TemplateError(
                "the cluster serves no resource.k8s.io/v1 ResourceClaimTemplates in namespace "
                f"{namespace}: the template needs Kubernetes 1.37 or newer with the "
                f"{' and '.join(dra_template.GATES)} feature gates (or pass --namespace of one "
                "that exists)"
            ) from None
        raise dra_template.TemplateError(
            f"the cluster's apiserver refuses the template: {e}"
        ) from None
    except ApiTransientError as e:
        terminal.write(sys.stderr, f"{PROG}: warning: the feature gates were not checked: {e}\n")
        return
    if not dra_template.keeps_derived_attributes(stored):
        raise dra_template.TemplateError(
            "the cluster's kube-apiserver drops the template's derivedAttributes: feature gate "
            f"{dra_template.GATES[0]} is off there; turn on {' and '.join(dra_template.GATES)} on "
            "kube-apiserver and kube-scheduler, then run this again"
        )


def _check_request(args: argparse.Namespace) -> None:
    """Raise ConfigError for a --name or --namespace the apiserver would refuse (the template is
    printed to be applied; the settings check --prefix), or flags that do not go together."""
    if args.name is not None and not settings.is_subdomain(args.name):
        raise ConfigError(
            f"--name {excerpt(args.name)} is not a DNS subdomain (lower-case letters, digits, "
            "'-' and '.', at most 253 characters), which a ResourceClaimTemplate's name must be"
        )
    if args.namespace is not None and not settings.is_namespace(args.namespace):
        raise ConfigError(
            f"--namespace {excerpt(args.namespace)} is not a DNS label (lower-case letters, "
            "digits and '-', at most 63 characters), which a namespace's name must be"
        )
    if args.machine and (args.selector is not None or args.exclude):
        raise ConfigError(
            "--selector and --exclude choose among the cluster's Nodes: drop them, or "
            "--machine, to read the cluster"
        )
    if args.machine and args.kubeconfig:
        raise ConfigError(
            "--machine and --kubeconfig both given: pass profiles, or read the cluster"
        )


def handle(args: argparse.Namespace) -> int:
    """Print the template. Raises ConfigError for bad usage, TemplateError where the machines
    or the cluster cannot give one, CredentialsError or PublishError where the cluster is out of
    reach."""
    logs_to_stderr()
    config = settings.resolve_as(settings.TemplateSettings, vars(args), os.environ)
    _check_request(args)
    api = None if args.machine else _operator_client(config.kubeconfig)
    left_out: list[dra_template.LeftOut] = []
    if api is None:
        machines = _simulated_machines(args.machine)
    else:
        machines, left_out = _cluster_machines(
            api, config.prefix, args.selector, args.exclude or []
        )
    template = dra_template.build(
        machines,
        args.gpus,
        fallback=args.fallback,
        device_class=args.device_class,
        name=args.name,
        namespace=args.namespace,
        prefix=config.prefix,
        uuids_known=not args.machine,
        left_out=left_out,
        selection=[
            *(["--selector", args.selector] if args.selector is not None else []),
            *(a for node in args.exclude or [] for a in ("--exclude", node)),
        ],
    )
    for note in template.notes:
        _warn(note)
    if api is not None:
        _check_served(api, template.document, args.namespace or "default")
    terminal.write(sys.stdout, dra_template.to_yaml(template))
    return EXIT_OK


def arguments(parser: argparse.ArgumentParser) -> None:
    """K, where the machines come from (--machine, or the Nodes: the settings' --kubeconfig and
    --prefix, with --selector and --exclude beside them), and the template's names."""
    parser.add_argument(
        "--gpus",
        type=_claim_gpus,
        required=True,
        metavar="K",
        help="GPUs per claim, 2 or more (one GPU needs no NVLink)",
    )
    parser.add_argument(
        "--machine",
        metavar="PROFILE",
        action="append",
        help="a kind of machine the cluster has: a name from `topo-reporter profiles` or a "
        "profile YAML file; repeat it for each kind (without it, the Nodes' published topologies)",
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
    nodes = settings.add_arguments(parser, settings.TemplateSettings)[settings.Group.KUBERNETES]
    nodes.add_argument(
        "--selector",
        metavar="LABELSELECTOR",
        help="take the cliques from the Nodes this label selector picks (the others' GPUs are "
        "still kept from cliques not theirs)",
    )
    nodes.add_argument(
        "--exclude",
        metavar="NODE",
        action="append",
        help="leave this Node out of the cliques (its GPUs are still kept from cliques not "
        "theirs); repeat it for each",
    )
