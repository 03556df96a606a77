"""The over-commit fault: an engine grows until the simulated box starves, and hangs unless something kills it.

SIMULATION ONLY. On GB10 the GPU allocates from the same memory as the OS; an
engine that over-commits (a KV cache or a batch larger than what is free, a
leak) does not get an OOM kill: the box livelocks, SSH included, until an AC
power-cycle (docs/reference/spark-facts.md, the field report's UVM law; public
reports from Spark owners describe the same). Owners run earlyoom to kill the
engine first: sparkctl's memory_watchdog law.

``sparkctl sim fault NODE overcommit`` makes the node's largest engine hold all
but :data:`LEFT_PCT` of MemTotal (MemAvailable falls below any limit sparkctl's
earlyoom arguments can have: laws.min_free_gib >= 10 GiB, SIGTERM at half of it),
and starts a watcher on this machine (it ends as soon as that engine dies): if after
:data:`LIVELOCK_S` seconds that engine still lives and MemAvailable is still under :data:`FLOOR_KIB`, the box
has livelocked: the node is wedged (its engines hang) and its management port
goes down (SSH times out), as :func:`sparkctl_sim.clusterfaults.unreachable`
does. ``sparkctl sim power-cycle NODE`` brings it back. Stricter than a real
box, which may take longer to hang: the grace is what a watchdog gets.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from sparkctl_sim import netns as nx
from sparkctl_sim import nodestate
from sparkctl_sim.clusterroot import _ctx, _find_node
from sparkctl_sim.netns import SimError

LEFT_PCT = 1.0
FLOOR_KIB = 2 * 1024 * 1024
LIVELOCK_S = 15.0
REPORT_WAIT_S = 5.0  # how long `sim fault ... overcommit` waits to say whether the engine died


def overcommit(root: Path, node: str) -> dict[str, object]:
    """Grow the node's largest engine; start the livelock watcher. Returns what it did."""
    p, spec, rootless = _ctx(root)
    _find_node(spec, node)
    if rootless:
        raise SimError("overcommit needs root mode (the livelock takes the node's management port down)",
                       "run the simulator as root")
    state = p.node(node).state
    with nodestate.edit(state) as st:
        nodestate.settle(st)
        held = {k: float(v) for k, v in st.get("engine_mem_gib", {}).items()}
        if not held:
            raise SimError(f"{node}: no engine holds memory", "start a stack first (`sparkctl up`)")
        pid = max(held, key=lambda k: held[k])
        others = sum(v for k, v in held.items() if k != pid) + float(st.get("leaked_mem_gib", 0.0))
        want_avail_kib = st["mem_total_kib"] * LEFT_PCT / 100
        gib = (st["mem_idle_available_kib"] - want_avail_kib) / (1024 * 1024) - others
        st["engine_mem_gib"][pid] = round(gib, 3)
    log = p.node(node).dir / "overcommit.log"
    nx.spawn_detached([sys.executable, "-m", "sparkctl_sim.overcommit", "watch", str(root), node, pid,
                       str(LIVELOCK_S)], log)
    # what happened next, for the operator who injected it (a watchdog acts within a second or so)
    end = time.monotonic() + REPORT_WAIT_S
    while time.monotonic() < end and nx.pid_alive(int(pid)):
        time.sleep(0.1)
    fate = "still running: the box hangs unless it dies" if nx.pid_alive(int(pid)) else "gone (killed)"
    return {"node": node, "pid": int(pid), "engine_gib": round(gib, 3), "livelock_after_s": LIVELOCK_S,
            "engine": fate}


def watch(root: Path, node: str, pid: int, grace_s: float) -> int:
    from sparkctl_sim import clusterfaults

    p, _spec, _rootless = _ctx(root)
    state = p.node(node).state
    # the grace a watchdog gets; an engine that dies in it (killed, or the cluster taken down)
    # ends the watch at once: nothing can hang any more
    end = time.monotonic() + grace_s
    while time.monotonic() < end and nx.pid_alive(pid):
        time.sleep(0.2)
    if not state.exists():  # `sim down` removed the cluster meanwhile
        return 0
    with nodestate.edit(state) as st:
        nodestate.settle(st)
        avail = nodestate.mem_available_kib(st)
        hung = nx.pid_alive(pid) and avail < FLOOR_KIB
        if hung:
            st["faults"]["wedged"] = True
            st["faults"]["livelocked"] = True
    print(json.dumps({"node": node, "pid": pid, "mem_available_kib": avail, "livelocked": hung}), flush=True)
    if hung:
        clusterfaults.unreachable(root, node)
    return 0


def main(argv: list[str]) -> int:
    if len(argv) == 5 and argv[0] == "watch":
        return watch(Path(argv[1]), argv[2], int(argv[3]), float(argv[4]))
    print("usage: python -m sparkctl_sim.overcommit watch ROOT NODE PID GRACE_S", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
