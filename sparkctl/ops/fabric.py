"""Fabric preparation on the hosts: run the ``fabric apply`` and ``fabric restore`` plans.

The plans are pure (:mod:`sparkctl.plan.fabricplan`); this module reads the one
fact they need (each cabled node's netplan files: :func:`read_netplan`), renders
what they push, locks every node (the plans' first step), runs them with the one interpreter
(:func:`sparkctl.ops.executor.run_plan`) and maps a failed step to an error
naming its phase.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sparkctl.errors import LifecycleError
from sparkctl.facts.batch import PRELUDE, fact_script
from sparkctl.facts.netplanfiles import NETPLAN_FILES
from sparkctl.facts.registry import ScriptContext
from sparkctl.model.inventory import Inventory
from sparkctl.model.netplanfile import NetplanFile
from sparkctl.model.profiles import Resolved
from sparkctl.model.resources import Roots
from sparkctl.model.wheels import PROMETHEUS_CLIENT
from sparkctl.ops.executor import Progress, TransportBackend, raise_failure, release_lock, run_plan, take_lock
from sparkctl.ops.wheelhouse import default_cache, fetch_wheel
from sparkctl.plan import exporterplan, fabricplan, lockplan
from sparkctl.plan.render import render
from sparkctl.plan.steps import Plan
from sparkctl.transport import Transport


@dataclass(frozen=True)
class FabricResult:
    op: str
    nodes: tuple[str, ...]
    steps: tuple[dict[str, Any], ...]


def read_netplan(inv: Inventory, transport: Transport) -> dict[str, tuple[NetplanFile, ...]]:
    """Each cabled node's netplan files (the fact ``netplan.files``), read as root where the node
    allows sudo (netplan files are 0600 root). Reads only; a node that does not answer raises."""
    cabled = [n.name for n in inv.nodes if inv.node_links(n.name)]
    cmds = {n: "sh -c " + fabricplan.q(PRELUDE + NETPLAN_FILES.command(ScriptContext(inv.node(n)), ""))
            for n in cabled}
    results = transport.run_all(cmds, sudo={n: inv.node(n).sudo for n in cabled}).raise_for(
        "reading the netplan files", LifecycleError, hint="fabric apply reads /etc/netplan before it plans")
    out: dict[str, tuple[NetplanFile, ...]] = {n: NETPLAN_FILES.parse(results[n].stdout) for n in cabled}
    return out


def exporters_of(inv: Inventory, roots: Roots) -> exporterplan.ExporterFiles:
    """Every node's exporter files, with the probe of the facts the exporter reads at each scrape."""
    return exporterplan.render_exporters(inv, roots, {n.name: fact_script(n) for n in inv.nodes})


def plan_apply(inv: Inventory, roots: Roots, res: Resolved | None = None,
               secrets: dict[str, str] | None = None,
               netplan: dict[str, tuple[NetplanFile, ...]] | None = None,
               holder: Mapping[str, Any] | None = None) -> tuple[Plan, fabricplan.FabricFiles]:
    """The plan and the files of ``fabric apply`` for the nodes' netplan files as read
    (:func:`read_netplan`; None: as if no node had a foreign one); with ``holder``, between
    locking every node and releasing them."""
    rendering = render(res, inv, roots, secrets or {}) if res is not None else None
    files = fabricplan.render_fabric(inv, roots, rendering)
    plan = fabricplan.plan_fabric_apply(inv, files, res.name if res is not None else None,
                                        res.profile.laws if res is not None else None, netplan,
                                        exporters_of(inv, roots))
    return (lockplan.with_lock(plan, inv, holder) if holder else plan), files


def _run(op: str, inv: Inventory, transport: Transport, progress: Progress | None,
         make: Callable[[Mapping[str, Any]], tuple[Plan, dict[str, bytes]]]) -> FabricResult:
    """Take the lock (the plan's first step), read and plan, run the plan (it releases the lock)."""
    say = progress or (lambda *_: None)
    holder = take_lock(inv, transport, op, say)
    try:
        plan, blobs = make(holder)
    except BaseException:
        release_lock(inv, transport, op, holder, say)
        raise
    backend = TransportBackend(inv, transport, say)
    backend.blobs.update(blobs)
    state = run_plan(plan, backend, done=("lock",))
    if state.failed is not None:
        raise_failure(state, plan.op)
    nodes = tuple(dict.fromkeys(n for s in plan.steps if s.kind != "lock" for n in s.nodes))
    return FabricResult(plan.op, nodes, tuple(state.outcomes))


def apply(inv: Inventory, transport: Transport, roots: Roots, res: Resolved | None = None, *,
          secrets: dict[str, str] | None = None, progress: Progress | None = None) -> FabricResult:
    # the pinned wheel, fetched before the lock (the nodes may have no internet) and checked against its pin
    wheel = fetch_wheel(PROMETHEUS_CLIENT, default_cache()).read_bytes()

    def make(holder: Mapping[str, Any]) -> tuple[Plan, dict[str, bytes]]:
        plan, files = plan_apply(inv, roots, res, secrets, read_netplan(inv, transport), holder)
        exporters = exporters_of(inv, roots)  # the same bytes the plan names (reproducible)
        return plan, {**files.blobs(), **exporters.blobs(), PROMETHEUS_CLIENT.sha256: wheel}
    return _run("fabric apply", inv, transport, progress, make)


def plan_restore(inv: Inventory, holder: Mapping[str, Any] | None = None) -> Plan:
    """The plan of ``fabric restore`` (the exporters removed too); with ``holder``, between
    locking every node and releasing them."""
    plan = fabricplan.plan_fabric_restore(inv)
    return lockplan.with_lock(plan, inv, holder) if holder else plan


def restore(inv: Inventory, transport: Transport, *, progress: Progress | None = None) -> FabricResult:
    return _run("fabric restore", inv, transport, progress, lambda holder: (plan_restore(inv, holder), {}))
