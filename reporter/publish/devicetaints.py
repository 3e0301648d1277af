"""The DeviceTaintRule sink: this node's rules on the cluster kept equal to its unhealthy GPUs.

Opt-in (`run --dra-device-taints`). At start it lists this node's rules (our labels, naming the
node) in the newest version of resource.k8s.io the cluster serves DeviceTaintRules in; a 404 for
every version means the cluster does not serve them (the `DRADeviceTaints` gate and, on 1.34 and
1.35, `--runtime-config=resource.k8s.io/v1alpha3=true`): that is said once, with the fix, and the
sink does nothing more until the agent restarts. Then, on each scan, it creates the rules that
are missing and deletes the ones no longer wanted (a rule whose reason changed is deleted and
created again: the agent holds no `update` right), and lists again once per resync period. So
while health is steady it writes nothing.

It touches only rules it listed with its own labels that are rules it writes (its name, its
node's pool, its driver, one whole GPU, its taint key, NoSchedule): our labels are anyone's to
write, and a rule they mark that is of any other shape (another pool, none, an administrator's
NoExecute quarantine) is left alone and reported once. A create that meets an object of that name
(409) met someone else's rule, which it leaves alone. Either way a GPU whose rule name someone
else's rule holds stays unmarked by the agent: `blocked` names them, and the agent's output says
so in a log line and a Warning Event on the Node, with the fix. The admission policy (chart) keeps
each agent to rules of exactly that shape for its own node, so no agent can take another's name.

It writes through `reporter.publish.api.ApiClient`, so the dry run prints each rule it would create.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import structlog

from reporter.errors import ApiPermanentError, PublishError
from reporter.publish.api import ApiClient, Resource, device_taint_rules
from reporter.publish.client import EventType
from reporter.schema import dra as devicetaints
from reporter.schema.dra import DeviceTaint
from reporter.schema.model import Topology
from reporter.telling import Told

RBAC_VERBS = ("list", "create", "delete")
"""Exactly the verbs the sink uses on devicetaintrules."""
REASON_BLOCKED = "DeviceTaintRuleNameTaken"
"""The Warning Event reason when someone else's rule holds the name of a rule the agent needs."""


class DeviceTaintSink:
    """Keeps this node's DeviceTaintRules equal to the GPUs it is told are unhealthy."""

    def __init__(
        self,
        api: ApiClient,
        *,
        node: str,
        prefix: str,
        resync_s: float,
        log: structlog.typing.FilteringBoundLogger,
        versions: Sequence[str] = devicetaints.VERSIONS,
        driver: str = devicetaints.DRIVER,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Raises ConfigError for a node name that cannot label its rules."""
        devicetaints.check_node_name(node)
        self._api = api
        self._node = node
        self._prefix = prefix
        self._resync_s = resync_s
        self._log = log
        self._versions = tuple(versions)
        self._driver = driver
        self._clock = clock
        self._resource: Resource | None = None
        self._served = True
        """False once every version answered 404: nothing more is asked."""
        self._known: dict[str, tuple[Any, ...]] | None = None
        """Our rules on the cluster, by name, as last listed or written; None: list again."""
        self._listed_at = -float("inf")
        self._not_ours_told: Told[tuple[str, ...]] = Told(())
        """The names of the rules under our labels that are not ours, as last said."""
        self._foreign: set[str] = set()
        """Names taken by someone else's rule: not tried again until the next list."""
        self._blocked: tuple[str, ...] = ()
        self._refused: tuple[tuple[DeviceTaint, ...], float, ApiPermanentError] | None = None
        """Taints whose writes the API refused for good, when, and the refusal: not sent again
        until they change or a resync period passed (the refusal is raised again meanwhile)."""

    @property
    def served(self) -> bool:
        """False when the cluster serves no DeviceTaintRules (told once, never asked again)."""
        return self._served

    @property
    def blocked(self) -> tuple[str, ...]:
        """The rules wanted at the last publish whose names someone else's rule holds: the GPUs
        they would mark stay unmarked by the agent."""
        return self._blocked

    def publish(self, taints: Sequence[DeviceTaint]) -> int:
        """Make this node's rules be `taints`; returns the writes made (creates and deletes).

        Raises PublishError; what the cluster holds is then listed again next time. A permanent
        refusal is raised again, without a request, until the taints change or a resync period
        passed.
        """
        if not self._served:
            return 0
        wanted = tuple(taints)
        refused = self._refused
        if refused and refused[0] == wanted and self._clock() - refused[1] < self._resync_s:
            raise refused[2]
        self._refused = None
        try:
            if self._known is None or self._clock() - self._listed_at >= self._resync_s:
                self._list()
            if self._resource is None or self._known is None:
                return 0  # not served: _list said so
            return self._converge(self._resource, self._known, wanted)
        except PublishError as e:
            self._known = None
            if isinstance(e, ApiPermanentError):
                self._refused = (wanted, self._clock(), e)
            raise

    def _list(self) -> None:
        selector = devicetaints.owned_selector(self._node, self._prefix)
        if self._resource is not None:
            candidates: tuple[Resource, ...] = (self._resource,)
        else:
            candidates = tuple(device_taint_rules(v) for v in self._versions)
        for resource in candidates:
            try:
                page = self._api.list(resource, query={"labelSelector": selector})
            except ApiPermanentError as e:
                if e.status == 404:
                    continue
                raise
            self._resource = resource
            own = [
                devicetaints.own_rule(item, self._node, self._prefix, self._driver)
                for item in page["items"]
            ]
            self._known = dict(rule for rule in own if rule is not None)
            self._listed_at = self._clock()
            self._foreign.clear()
            self._not_ours(page["items"], own)
            return
        self._served = False
        self._log.error(
            "device_taints_not_served",
            versions=[f"{devicetaints.GROUP}/{v}" for v in self._versions],
            hint="this cluster serves no DeviceTaintRules: on Kubernetes 1.34 and 1.35 start the "
            "kube-apiserver with --feature-gates=DRADeviceTaints=true (1.35: also "
            "DRADeviceTaintRules=true) and --runtime-config=resource.k8s.io/v1alpha3=true, and "
            "the kube-scheduler with the same gates, then restart the agent; no rule is written "
            "until then",
        )

    def _not_ours(self, items: list[Any], own: list[tuple[str, Any] | None]) -> None:
        """Rules under our labels that are not ones this agent writes: left alone (their names
        not created over), said once while they stay."""
        names = sorted(
            devicetaints.listed_name(item)
            for item, rule in zip(items, own, strict=True)
            if rule is None
        )
        self._foreign.update(names)
        if self._not_ours_told.changed(tuple(names)) and names:
            self._log.warning(
                "device_taint_rules_not_ours",
                rules=[name[:80] for name in names[:8]],
                count=len(names),
                hint="these carry this agent's labels but are not rules it writes (another "
                "pool, no pool, not its name, another driver, device, taint or effect): left "
                "alone; delete them if nobody needs them",
            )

    def _converge(
        self, resource: Resource, known: dict[str, tuple[Any, ...]], taints: Sequence[DeviceTaint]
    ) -> int:
        want = {
            devicetaints.rule_name(self._node, t.device): devicetaints.rule(
                t,
                node=self._node,
                prefix=self._prefix,
                version=resource.version,
                driver=self._driver,
            )
            for t in taints
        }
        writes = 0
        for name, content in sorted(known.items()):
            if name not in want or devicetaints.rule_content(want[name]) != content:
                self._api.delete(resource, name)
                del known[name]
                writes += 1
                self._log.info("device_taint_rule_deleted", rule=name)
        for name, body in sorted(want.items()):
            if name in known or name in self._foreign:
                continue
            try:
                self._api.create(resource, body)
            except PublishError as e:
                if e.status != 409:
                    raise
                self._foreign.add(name)
                continue
            known[name] = devicetaints.rule_content(body)
            writes += 1
            spec = body["spec"]
            self._log.info(
                "device_taint_rule_created",
                rule=name,
                device=spec["deviceSelector"]["device"],
                reason=spec["taint"]["value"],
            )
        self._blocked = tuple(sorted(name for name in want if name in self._foreign))
        return writes


class DeviceTaintOutput:
    """The agent's per-scan output: the rules for the chosen topology; failures are logged, and
    a GPU left unmarked because someone else's rule holds its rule's name is told as a log line
    and a Warning Event on the Node, once while it lasts."""

    def __init__(
        self,
        sink: DeviceTaintSink,
        log: structlog.typing.FilteringBoundLogger,
        event: Callable[[EventType, str, str], None],
    ) -> None:
        self._sink = sink
        self._log = log
        self._event = event
        self._error: Told[str | None] = Told(None)
        self._unnamed: Told[tuple[int, ...]] = Told(())
        self._blocked: Told[tuple[str, ...]] = Told(())

    def __call__(self, topology: Topology) -> None:
        taints, unnamed = devicetaints.device_taints(topology)
        if self._unnamed.changed(unnamed) and unnamed:
            self._log.warning(
                "device_taint_unnamed",
                gpus=list(unnamed),
                hint="unhealthy, but its minor number is unknown: no DeviceTaintRule names it",
            )
        try:
            self._sink.publish(taints)
        except PublishError as e:
            if self._error.changed(str(e)):
                # It is tried again at every scan: said once per distinct error.
                self._log.warning("device_taints_failed", error=str(e))
            return
        if self._error.changed(None):
            self._log.info("device_taints_recovered")
        self._tell_blocked(self._sink.blocked)

    def _tell_blocked(self, blocked: tuple[str, ...]) -> None:
        if not self._blocked.changed(blocked) or not blocked:
            return
        shown = ", ".join(name[:120] for name in blocked[:4])
        more = f" and {len(blocked) - 4} more" if len(blocked) > 4 else ""
        message = (
            f"someone else's DeviceTaintRule holds the name this node's agent gives its rule "
            f"for an unhealthy GPU, which the agent therefore does not mark: {shown}{more}. "
            "Delete it if nobody needs it (kubectl delete devicetaintrule NAME): the agent "
            "writes its own at its next resync"
        )
        self._log.warning(
            "device_taint_rule_blocked", rules=[name[:120] for name in blocked[:8]], hint=message
        )
        try:
            self._event(EventType.WARNING, REASON_BLOCKED, message)
        except PublishError as e:
            # Best effort, as every Event: the log line above says it too.
            self._log.warning("event_failed", reason=REASON_BLOCKED, error=str(e))
