"""The run record: what sparkctl started, where, from which files. Pure data.

One record per stack (``stack``: the profile's topology.stack, ``default`` when
unset), kept on the inventory's first node (the state node:
``/var/lib/sparkctl/record.json`` for the stack ``default``,
``/var/lib/sparkctl/stacks/<name>.json`` for the others, under its prefix:
:func:`sparkctl.model.paths.record_path`) and cached on the operator's side, so
``status`` works from any workstation that has the inventory. A record written
before sparkctl ran several stacks has no ``stack``: it is read as ``default``,
from the path it always had.

Also where an endpoint is asked (:func:`operator_route`, :func:`on_node_host`),
from what the record keeps of serve.bind (``listen``): pure, shared by the
planner's ready step, ``status``, ``check`` and ``bench``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from sparkctl.model.paths import DEFAULT_STACK

# Where the records and the node locks live on the state node: sparkctl.model.paths
# (RECORD, STACKS_DIR, LOCKS_DIR, record_path, node_lock_dir).
SCHEMA = 1
STATES = ("starting", "serving", "stopping", "switching", "degraded", "failed", "stopped")
# A stack whose record is in one of these may have engines running: its nodes are its own
# (another stack's up refuses them) until a down or a failed run records otherwise.
# "degraded": a rolling switch's way back failed part way; some replicas serve the new profile,
# some the old one (``replicas`` says which), the ones that did not come back are stopped.
LIVE_STATES = ("starting", "serving", "stopping", "switching", "degraded")
# The states whose gateway backends serve (a degraded record lists exactly the replicas left serving);
# sparkctl/remote/gateway_ctl.py, stdlib only, keeps its own copy (tests/test_gateway.py compares them).
SERVING_STATES = ("serving", "degraded")


@dataclass(frozen=True)
class NodeRecord:
    rank: int
    replica: int
    hash: str
    files: dict[str, str]  # path -> sha256
    supervisor: str  # systemd | detached


@dataclass(frozen=True)
class Serves:
    """What a node of a record serves (:meth:`RunRecord.serves_on`)."""
    profile: str
    served_name: str
    port: int
    engine: str
    clock_cap_mhz: int | None


@dataclass(frozen=True)
class RunRecord:
    profile: str
    sets: tuple[str, ...]
    digest: str
    engine: str
    engine_version: str
    served_name: str
    port: int
    heads: tuple[str, ...]
    nodes: dict[str, NodeRecord]
    # starting | serving | stopping | switching (supervised) | failed | stopped. Only
    # "serving" claims a stack answers; a transitional state outlives its run only if
    # that run was killed (status says so when no lock holder is left).
    state: str
    started_at: str
    updated_at: str
    clock_cap_mhz: int | None = None
    waivers: dict[str, str] = field(default_factory=dict)
    note: str = ""
    schema: int = SCHEMA
    # The plan steps the run that wrote this record executed, in order: id, phase, ok, seconds.
    steps: tuple[dict[str, Any], ...] = ()
    # serve.api_key_env: the NAME of the operator's variable that holds the endpoint's key
    # (status and bench read the key from it); the key itself is never recorded.
    api_key_env: str | None = None
    # serve.bind: per head, the address its engine listens on (the rendered --host:
    # 0.0.0.0, the management host, or the head's fabric address). Empty in records
    # written before sparkctl recorded it: such an endpoint listened on 0.0.0.0.
    listen: dict[str, str] = field(default_factory=dict)
    # topology.stack: which stack this is ("default" in records written before stacks).
    stack: str = DEFAULT_STACK
    # The model served, "<model.id>@<model.revision>": what two stacks sharing a served
    # name must agree on (topology.shared_name). Empty in records written before stacks.
    model: str = ""
    # topology.shared_name: this stack declared itself a replica of a name another serves.
    shared_name: bool = False
    # serve.gateway: where the gateway runs and what it routes to this stack (node, url as its
    # node asks it, backends: url as the gateway reaches each head + served name, the engine's
    # in-flight gauge, drain_timeout_s; sparkctl.plan.gatewayplan.record_entry). Empty: no gateway.
    gateway: dict[str, Any] = field(default_factory=dict)
    # state "degraded" only: per serving head, what it serves (profile, served_name, port, engine,
    # clock_cap_mhz, nodes; :meth:`serves_on`);
    # the gateway entry's backends are exactly these heads. Empty otherwise.
    replicas: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def live(self) -> bool:
        return self.state in LIVE_STATES

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["sets"] = list(self.sets)
        d["heads"] = list(self.heads)
        d["steps"] = [dict(s) for s in self.steps]
        if not self.replicas:  # only a degraded record has them: the others keep their shape
            del d["replicas"]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "RunRecord":
        nodes = {k: NodeRecord(**v) for k, v in d.get("nodes", {}).items()}
        return cls(
            profile=d["profile"], sets=tuple(d.get("sets", ())), digest=d["digest"], engine=d["engine"],
            engine_version=d.get("engine_version", ""), served_name=d["served_name"], port=int(d["port"]),
            heads=tuple(d.get("heads", ())), nodes=nodes, state=d["state"], started_at=d["started_at"],
            updated_at=d.get("updated_at", d["started_at"]), clock_cap_mhz=d.get("clock_cap_mhz"),
            waivers=dict(d.get("waivers", {})), note=d.get("note", ""), schema=int(d.get("schema", SCHEMA)),
            steps=tuple(dict(s) for s in d.get("steps", ()) if isinstance(s, dict)),
            api_key_env=d.get("api_key_env") or None,
            listen={str(k): str(v) for k, v in (d.get("listen") or {}).items()},
            stack=str(d.get("stack") or DEFAULT_STACK), model=str(d.get("model") or ""),
            shared_name=bool(d.get("shared_name", False)),
            gateway=dict(d.get("gateway") or {}),
            replicas={str(k): dict(v) for k, v in (d.get("replicas") or {}).items() if isinstance(v, dict)},
        )

    def serves_on(self, node: str) -> "Serves | None":
        """What ``node`` is expected to serve: the record's profile on every node it names, or, in a
        degraded record, its replica's (the old profile's served name, port, engine and clock cap
        on the heads given back); None for a degraded record's node in no replica (stopped on purpose)."""
        if self.state != "degraded":
            return Serves(self.profile, self.served_name, self.port, self.engine, self.clock_cap_mhz)
        for r in self.replicas.values():
            if node in r.get("nodes", ()):
                return Serves(str(r.get("profile", self.profile)), str(r.get("served_name", self.served_name)),
                              int(r.get("port", self.port)), str(r.get("engine", self.engine)),
                              r.get("clock_cap_mhz", self.clock_cap_mhz))
        return None

    def with_state(self, state: str, updated_at: str, note: str = "") -> "RunRecord":
        from dataclasses import replace

        return replace(self, state=state, updated_at=updated_at, note=note or self.note)


WILDCARD = "0.0.0.0"
LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class Route:
    """How the operator's machine reaches one head's endpoint: ``host:port`` directly,
    or through an SSH local forward to ``via`` (the head) when only the head reaches it."""

    host: str
    port: int
    via: str | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


def operator_route(head: str, mgmt_host: str, listen: str | None, port: int) -> Route:
    """serve.bind, seen from the operator: ``all`` (0.0.0.0, or a record written before
    sparkctl kept the address) and ``management`` listen where the operator's SSH goes;
    ``fabric`` listens on the head's fabric address, a point-to-point link the operator's
    machine has no route to, so the probe goes through the head (an SSH forward)."""
    if not listen or listen in (WILDCARD, mgmt_host):
        return Route(mgmt_host, port)
    return Route(listen, port, via=head)


def on_node_host(listen: str | None) -> str:
    """The address a probe run on the head itself asks: the bound one (an engine bound to
    one address does not answer on 127.0.0.1), loopback for a wildcard bind."""
    return LOOPBACK if not listen or listen == WILDCARD else listen
