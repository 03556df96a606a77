"""Plan, then apply: the ordered steps ``up`` takes, as data.

``sparkctl plan`` prints exactly this list, and ``sparkctl up`` executes it.
Pure: (resolved profile, inventory, rendering) -> steps. No host is touched.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sparkctl.model.inventory import Inventory
from sparkctl.model.profiles import Resolved
from sparkctl.plan.render import Rendering


@dataclass(frozen=True)
class Step:
    phase: str  # check | stop-stale | clock | push | reload | start | ready | record
    nodes: tuple[str, ...]
    summary: str
    files: tuple[str, ...] = ()
    details: dict[str, str] = field(default_factory=dict)


def plan_up(res: Resolved, inv: Inventory, rendering: Rendering) -> list[Step]:
    p = res.profile
    lay = rendering.layout
    nodes = lay.nodes
    steps: list[Step] = [
        Step("check", nodes, "probe every node in parallel and judge the laws (a failure stops here)"),
    ]
    if p.laws.clock_cap_mhz is not None:
        steps.append(Step("clock", nodes, f"apply the clock cap: nvidia-smi -lgc 0,{p.laws.clock_cap_mhz} and record "
                                          "it for this boot"))
    steps.append(Step("stop-stale", nodes,
                      "stop any sparkctl engine still running (a new rank must never join an old head's rendezvous)"))
    for r in lay.ranks:
        files = tuple(sorted(rendering.files[r.node]))
        steps.append(Step("push", (r.node,), f"write {len(files)} files atomically (temp name, then rename)",
                          files=files, details={"hash": rendering.node_hash(r.node)}))
    if p.supervisor == "systemd":
        steps.append(Step("reload", nodes, "systemctl daemon-reload"))
    for group in lay.start_sequence():
        who = ", ".join(f"{r.node} (rank {r.rank}{' head' if r.is_head else ''})" for r in group)
        how = "systemctl start sparkctl-engine" if p.supervisor == "systemd" else "run-detached.sh start"
        steps.append(Step("start", tuple(r.node for r in group), f"start {who}: {how}"))
    for head in lay.heads():
        steps.append(Step(
            "ready", (head.node,),
            f"wait up to {p.serve.ready_timeout_s} s: port {head.http_port} open, /v1/models lists "
            f"{p.model.served_name!r}, a 1-token completion, the generated-token counter advances",
        ))
    steps.append(Step("record", (lay.ranks[0].node,), "write the run record on the head node and cache it locally"))
    return steps
