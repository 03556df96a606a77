"""Neighbours that boot minutes apart: carrier follows power, networkd follows carrier.

Owns what happens to a node's fabric ports while a cabled neighbour is off or still
booting, and that neighbour's late boot in ``sparkctl sim reboot --late NODE=SECONDS``:

* a box that is off has no light on its cables: its veth ends are down, so every
  neighbour's end has NO-CARRIER (a QSFP port sees carrier only when both ends are up);
* systemd-networkd configures a link only with carrier (systemd.network(5),
  ConfigureWithoutCarrier=, false by default) and drops a link's static configuration
  when its carrier goes (IgnoreCarrierLoss=, defaulting to ConfigureWithoutCarrier=):
  the neighbour's port has no fabric address, so no RoCE v2 GID (the mlx5 GID table
  follows the netdev's IPv4 addresses), until the late box comes up;
* when it does, the ports get carrier and networkd configures them: their addresses,
  routes and GIDs appear while the early boxes' engines are already starting.

The delay is simulated time: it is divided by ``SPARKCTL_SIM_SPEEDUP`` (as every
simulated duration of the engines is), so a "3 minute" late boot costs 9 s at 20x.
The early boxes' own waits (the launch's ``serve.fabric_wait_s``, systemd's start
limit) run in real time, which only makes the late box earlier for them than it would
be at 1x, never later.

SIMULATION ONLY.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterable, Mapping

from sparkctl_sim import netns as nx
from sparkctl_sim.clusterboot import _sshd_pid, _write_sysfs, clusterinit_argv, spec_carrier_sync
from sparkctl_sim.clusterroot import SimPaths, _node_links, netns_name
from sparkctl_sim.netns import SimError
from sparkctl_sim.spec import ClusterSpec

log = logging.getLogger(__name__)

SPEEDUP_ENV = "SPARKCTL_SIM_SPEEDUP"  # the engines' factor (sparkctl_sim.engines.runtime)


def speedup() -> float:
    try:
        value = float(os.environ.get(SPEEDUP_ENV) or 1.0)
    except ValueError:
        raise SimError(f"{SPEEDUP_ENV} must be a number", f"e.g. {SPEEDUP_ENV}=20") from None
    if value <= 0:
        raise SimError(f"{SPEEDUP_ENV} must be > 0")
    return value


def parse_late(items: Iterable[str], nodes: Iterable[str]) -> dict[str, float]:
    """``NODE=SECONDS`` (simulated seconds after the others) for nodes being rebooted."""
    targets = set(nodes)
    out: dict[str, float] = {}
    for item in items:
        name, eq, value = item.partition("=")
        try:
            seconds = float(value)
        except ValueError:
            seconds = -1.0
        if not eq or seconds < 0:
            raise SimError(f"--late {item!r}: expected NODE=SECONDS (simulated seconds, >= 0)",
                           "e.g. --late spark-b=180")
        if name not in targets:
            raise SimError(f"--late {name}: {name} is not among the nodes being rebooted",
                           "name it in the node list too")
        out[name] = seconds
    return out


def cables_dark(spec: ClusterSpec, node: str) -> None:
    """The box is off: its cable ends go down, so its neighbours' ends lose carrier."""
    ns = netns_name(node)
    for ifname, *_ in _node_links(spec, node):
        nx.ip(ns, "link", "set", ifname, "down")


def peers(spec: ClusterSpec, nodes: Iterable[str]) -> list[str]:
    names = set(nodes)
    nodes_ = {n.name for n in spec.nodes}  # a switch port's peer is the switch, not a node
    return sorted({peer for n in names for _i, _c, peer, _pi in _node_links(spec, n) if peer in nodes_} - names)


def carrier_changed(p: SimPaths, spec: ClusterSpec, nodes: Iterable[str]) -> None:
    """Each running node's systemd-networkd reacts to its ports' carrier (see the module doc).

    Pre-configured nodes without netplan files hold the spec's addresses; a node's own
    netplan files (``fabric apply``) are followed through its networkd (clusterinit).
    """
    for node in nodes:
        if not spec.fresh:
            spec_carrier_sync(spec, node)
        pid = _sshd_pid(p, node)
        if pid is not None:  # the node is up: its networkd (clusterinit networkd-carrier)
            sim_node = next(n for n in spec.nodes if n.name == node)
            out = nx.run(clusterinit_argv(p, sim_node, pid, "networkd-carrier"), timeout_s=60.0)
            log.info("%s: networkd on carrier: %s", node, out.stdout.strip())
        _write_sysfs(p, node)


def order(late: Mapping[str, float]) -> list[tuple[str, float]]:
    """The late nodes by their delay, with the real seconds to sleep before each boots."""
    factor = speedup()
    out, slept = [], 0.0
    for node, delay in sorted(late.items(), key=lambda kv: kv[1]):
        real = delay / factor
        out.append((node, max(0.0, real - slept)))
        slept = max(slept, real)
    return out


def wait(seconds: float) -> None:
    if seconds > 0:
        time.sleep(seconds)


def describe(late: Mapping[str, float]) -> str:
    return json.dumps({n: f"{s:g} s (simulated), {s / speedup():g} s (real)" for n, s in late.items()})
