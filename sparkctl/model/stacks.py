"""Several stacks on one cluster: which stack a profile is, what other stacks refuse, what lives. Pure.

A **stack** is a named set of nodes running one profile (``topology.stack``;
``default`` when unset). Stacks on disjoint nodes live side by side: each has
its own run record (:func:`sparkctl.model.paths.record_path`), its own lock
scope (the locks of its nodes, ``sparkctl.ops.lock``), its own ``status
--stack`` and ``down --stack``. ``up`` or ``switch`` of a profile replaces
what its own stack ran and never touches another stack's nodes.

Refused (:func:`refusal`), before anything changes, in one line each:

- a profile whose nodes a live stack of another name uses (the stack and the
  nodes are named);
- a profile whose ``model.served_name`` a live stack of another name already
  serves, unless the profile declares itself a replica (``topology.shared_name``)
  and both serve the same model (``model.id@model.revision``): then the gateway
  balances between them.

:func:`live_from_records` is what a gateway registers backends from: every
live stack with its served name, its nodes and its heads' endpoints.

No SSH, no sockets, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from sparkctl.errors import ConfigError, Ref
from sparkctl.model.inventory import Inventory
from sparkctl.model.paths import DEFAULT_STACK
from sparkctl.model.profiles import Resolved
from sparkctl.model.record import LIVE_STATES, Route, RunRecord, on_node_host, operator_route

__all__ = ["DEFAULT_STACK", "LIVE_STATES", "HeadEndpoint", "LiveStack", "StackConflict", "live_from_records",
           "model_identity", "refusal", "stack_of"]


class StackConflict(ConfigError):
    """A profile asks for nodes or a served name another live stack holds (bad input: exit 2)."""


def stack_of(res: Resolved) -> str:
    """The stack a resolved profile runs as."""
    return res.profile.topology.stack or DEFAULT_STACK


def model_identity(res: Resolved) -> str:
    """What two stacks sharing a served name must agree on: the model and its revision."""
    m = res.profile.model
    return f"{m.id}@{m.revision}"


def _nodes_text(nodes: Iterable[str]) -> str:
    return ", ".join(nodes)


def refusal(stack: str, nodes: Iterable[str], served_name: str, model: str, shared_name: bool,
            records: Iterable[RunRecord], ref: Ref | None = None) -> StackConflict | None:
    """Why a profile of ``stack`` on ``nodes`` may not start beside ``records``; None when it may.

    Only live records of other stacks count: the record of the stack itself is what
    ``up`` replaces, and a stopped or failed stack holds nothing. Nodes are judged
    first (a shared node would stop another stack's ranks), then the served name.
    """
    others = [r for r in records if r.live and r.stack != stack]
    want = list(nodes)
    for r in others:
        shared = [n for n in want if n in r.nodes]
        if shared:
            return StackConflict(
                f"{_nodes_text(shared)} {'is' if len(shared) == 1 else 'are'} used by live stack {r.stack!r} "
                f"({r.profile}, {r.state}, {r.served_name!r} on {_nodes_text(r.nodes)})", ref,
                hint=f"pick nodes outside it (topology.nodes), `sparkctl down --stack {r.stack}` first, or set "
                     f"topology.stack={r.stack} to replace what that stack runs")
    for r in others:
        if r.served_name != served_name:
            continue
        if shared_name and model and r.model == model:
            continue
        if shared_name:
            theirs = r.model or "a model its record does not name (recorded before stacks)"
            return StackConflict(
                f"live stack {r.stack!r} ({r.profile}) serves {served_name!r} from {theirs}, not {model}: "
                "topology.shared_name declares a replica of the same model only", ref,
                hint="give this profile another model.served_name, or serve the same model.id and revision")
        return StackConflict(
            f"live stack {r.stack!r} ({r.profile}, {r.state} on {_nodes_text(r.nodes)}) already serves "
            f"{served_name!r}", ref,
            hint="another model: give it another model.served_name; a replica of the same model: set "
                 "topology.shared_name: true")
    return None


@dataclass(frozen=True)
class HeadEndpoint:
    """One head of a stack's replicas: where its OpenAI endpoint listens and how it is reached."""

    node: str  # the head's inventory name
    port: int
    host: str  # the head's management address (the inventory's host)
    listen: str  # what the engine binds (serve.bind): 0.0.0.0, the management host, or its fabric address
    on_node_host: str  # what a client ON the head itself asks (loopback for a wildcard bind)
    route: Route  # how the operator's machine reaches it (``via``: an SSH forward through the head)

    @property
    def url(self) -> str:
        """The operator's URL (through ``route.via`` when set)."""
        return self.route.url


@dataclass(frozen=True)
class LiveStack:
    """A live stack as a gateway registers it: one backend per head, routed by ``served_name``."""

    stack: str
    profile: str
    state: str  # starting | serving | stopping | switching: only "serving" answers
    served_name: str
    model: str  # "<model.id>@<model.revision>" ("" in records written before stacks)
    engine: str
    nodes: tuple[str, ...]  # every node of the stack, heads first
    heads: tuple[HeadEndpoint, ...]
    api_key_env: str | None  # the operator's variable with the endpoint's key, never the key
    shared_name: bool

    @property
    def serving(self) -> bool:
        return self.state == "serving"


def live_from_records(records: Mapping[str, RunRecord] | Iterable[RunRecord], inv: Inventory,
                      *, serving_only: bool = False) -> tuple[LiveStack, ...]:
    """Every live stack in ``records`` (ordered by stack name), with its heads' endpoints.

    ``serving_only``: only the stacks whose record says "serving" (what a gateway
    routes to; a "starting" stack is not ready, a "stopping" one must get no new request).
    """
    recs = records.values() if isinstance(records, Mapping) else records
    out = []
    for r in sorted(recs, key=lambda r: r.stack):
        if not r.live or (serving_only and r.state != "serving"):
            continue
        heads = []
        for h in r.heads:
            mgmt = inv.node(h).host if h in inv.names else h
            listen = r.listen.get(h) or "0.0.0.0"
            heads.append(HeadEndpoint(node=h, port=r.port, host=mgmt, listen=listen,
                                      on_node_host=on_node_host(r.listen.get(h)),
                                      route=operator_route(h, mgmt, r.listen.get(h), r.port)))
        order = list(r.heads) + [n for n in r.nodes if n not in r.heads]
        out.append(LiveStack(stack=r.stack, profile=r.profile, state=r.state, served_name=r.served_name,
                             model=r.model, engine=r.engine, nodes=tuple(order), heads=tuple(heads),
                             api_key_env=r.api_key_env, shared_name=r.shared_name))
    return tuple(out)
