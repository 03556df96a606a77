"""The exporter's metric families, from a node's facts and the head's record. Pure.

A value the node does not report (``N/A`` on GB10, a netdev that is gone, a fact that
could not be read) is left out: never NaN, never 0. Units are Prometheus base units
(bytes, hertz, watts, celsius; a link's speed in bytes per second); the node is the target's ``node`` label
(set by the rendered scrape configuration, ``sparkctl.plan.exporterplan.scrape_config``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from sparkctl.facts.gpu import REASON_BITS
from sparkctl.facts.nodefacts import NodeFacts
from sparkctl.facts.statusrow import clock_lock
from sparkctl.model.record import STATES

MHZ = 1_000_000
KIB = 1024
VERDICTS = ("ok", "warn", "fail", "waived", "skip")  # sparkctl.plan.laws.base


def _gauge(name: str, doc: str, value: float | int | None, unit: str = "") -> Iterator[Metric]:
    if value is not None:
        g = GaugeMetricFamily(name, doc, unit=unit)
        g.add_metric([], float(value))
        yield g


def node_families(f: NodeFacts, kills: int | None, probe_s: float) -> Iterator[Metric]:
    """Every family of one node's facts (read at this scrape)."""
    yield from _gauge("sparkctl_probe_duration_seconds", "time the exporter's fact probe took at this scrape",
                      round(probe_s, 6))
    bad = GaugeMetricFamily("sparkctl_fact_unreadable", "1 for each fact the probe could not read at this scrape "
                            "(its value is then absent)", labels=["fact"])
    for key in sorted(f.unreadable):
        bad.add_metric([key], 1.0)
    yield bad
    g = f.gpu
    if g is not None:
        yield from _gauge("sparkctl_gpu_power_watts", "GPU power draw (nvidia-smi power.draw)", g.power_w)
        yield from _gauge("sparkctl_gpu_temperature_celsius", "GPU temperature (nvidia-smi temperature.gpu)", g.temp_c)
        yield from _gauge("sparkctl_gpu_sm_clock_hertz", "SM clock (nvidia-smi clocks.sm)",
                          g.sm_mhz * MHZ if g.sm_mhz is not None else None)
        yield from _gauge("sparkctl_gpu_sm_clock_max_hertz", "highest SM clock (nvidia-smi clocks.max.sm)",
                          g.max_sm_mhz * MHZ if g.max_sm_mhz is not None else None)
        yield from _gauge("sparkctl_gpu_clock_lock_max_hertz", "the SM clock lock nvidia-smi -q reports (upper bound)",
                          g.clock_lock_max_mhz * MHZ if g.clock_lock_max_mhz is not None else None)
        reasons = GaugeMetricFamily("sparkctl_gpu_clock_event_reason", "1 for each clock event reason active "
                                    "(nvidia-smi clocks_event_reasons), 0 for each known one that is not",
                                    labels=["reason"])
        for name in sorted({*REASON_BITS.values(), *g.event_reasons}):
            reasons.add_metric([name], 1.0 if name in g.event_reasons else 0.0)
        yield reasons
    lock = clock_lock(f)
    yield from _gauge("sparkctl_clock_lock_hertz", "the clock lock sparkctl set this boot (its record matches the "
                      "boot id; status clock_lock)", lock * MHZ if lock is not None else None)
    for key, name, doc in (("mem_total_kib", "total", "MemTotal"), ("mem_available_kib", "available", "MemAvailable"),
                           ("mem_free_kib", "free", "MemFree"), ("mem_cached_kib", "page_cache", "Cached")):
        kib = getattr(f, key)
        yield from _gauge(f"sparkctl_memory_{name}_bytes", f"/proc/meminfo {doc} (GB10 memory is unified)",
                          kib * KIB if kib is not None else None)
    w = f.watchdog
    if w is not None:
        yield from _gauge("sparkctl_earlyoom_installed", "1 when Debian's earlyoom package is installed",
                          1 if w.installed else 0)
        yield from _gauge("sparkctl_earlyoom_active", "1 when earlyoom's unit is active (systemctl is-active)",
                          1 if w.installed and w.active == "active" else 0)
    if kills is not None:
        c = CounterMetricFamily("sparkctl_earlyoom_kills", "signals earlyoom sent to a process this boot "
                                "(its 'sending SIG...' lines in the journal)")
        c.add_metric([], float(kills))
        yield c
    yield from _links(f)
    if f.engines is not None:
        yield from _gauge("sparkctl_engine_processes", "engine processes running (ps)", len(f.engines))
        yield from _gauge("sparkctl_engine_alive", "1 when an engine process runs (status alive)", 1 if f.engines else 0)


def _links(f: NodeFacts) -> Iterator[Metric]:
    labels = ["netdev", "rdma"]
    fams = {k: GaugeMetricFamily(f"sparkctl_fabric_{k}", doc, labels=labels) for k, doc in (
        ("link_up", "1 when the fabric port's operstate is up (sysfs)"),
        ("carrier", "1 when ethtool reports Link detected: yes"),
        ("speed_bytes_per_second", "the port's link speed (ethtool Speed, in bytes per second: Mb/s x 125000)"),
        ("mtu_bytes", "the port's MTU (sysfs)"),
        ("address_present", "1 when the port carries an IPv4 address"),
        ("rocev2_gid_present", "1 when the port has a RoCE v2 IPv4 GID of its own address"),
        ("rocev2_gid_index", "the index of that GID (NCCL_IB_GID_INDEX must match it)"))}
    for nd, lk in sorted(f.links.items()):
        lv = [nd, lk.rdma or ""]
        if lk.operstate is not None:
            fams["link_up"].add_metric(lv, 1.0 if lk.operstate == "up" else 0.0)
        if lk.link_detected is not None:
            fams["carrier"].add_metric(lv, 1.0 if lk.link_detected else 0.0)
        if lk.speed_mbps is not None:
            fams["speed_bytes_per_second"].add_metric(lv, float(lk.speed_mbps) * 125_000)
        if lk.mtu is not None:
            fams["mtu_bytes"].add_metric(lv, float(lk.mtu))
        fams["address_present"].add_metric(lv, 1.0 if lk.ipv4 else 0.0)
        if lk.rdma is not None:
            fams["rocev2_gid_present"].add_metric(lv, 1.0 if lk.gid_index_rocev2_ipv4 is not None else 0.0)
        if lk.gid_index_rocev2_ipv4 is not None:
            fams["rocev2_gid_index"].add_metric(lv, float(lk.gid_index_rocev2_ipv4))
    yield from fams.values()


def head_families(record: Mapping[str, Any] | None, laws: Mapping[str, Any] | None, since_s: float | None,
                  drift: list[str] | None, gateways: Sequence[Mapping[str, Any]] | None = None) -> Iterator[Metric]:
    """The head's own state: the record (profile, state, since, drift), the last verdict of every law of
    every stack (``laws``: stack -> its verdicts; one document alone is the default stack's) and the
    gateways the records name (:func:`gateway_families`)."""
    if record is not None:
        info = GaugeMetricFamily("sparkctl_record_info", "the run record: what sparkctl started (value 1)",
                                 labels=["profile", "engine", "served_name"])
        info.add_metric([str(record.get("profile", "")), str(record.get("engine", "")),
                         str(record.get("served_name", ""))], 1.0)
        yield info
        st = GaugeMetricFamily("sparkctl_record_state", "1 for the record's state, 0 for the others", labels=["state"])
        for s in STATES:
            st.add_metric([s], 1.0 if record.get("state") == s else 0.0)
        yield st
        yield from _gauge("sparkctl_record_since_timestamp_seconds", "when the record last changed (updated_at)",
                          since_s)
        ranks = GaugeMetricFamily("sparkctl_record_rank", "each node's rank in the record (value: the rank)",
                                  labels=["rank_node", "replica"])
        for n, nr in sorted((record.get("nodes") or {}).items()):
            ranks.add_metric([n, str(nr.get("replica", 0))], float(nr.get("rank", 0)))
        yield ranks
    if drift is not None:
        yield from _gauge("sparkctl_drift_lines", "lines of drift from the record the head sees (a rank not running, "
                          "earlyoom not active, the clock lock lost)", len(drift))
    if laws is not None:
        by_stack = {"default": laws} if "verdicts" in laws else laws
        v = GaugeMetricFamily("sparkctl_law_verdict", "the last verdict of every law of each stack (1 for its "
                              "status, 0 for the others), as the stack's last check step of up or switch judged it",
                              labels=["stack", "law", "law_node", "subject", "status"])
        for stack, doc in sorted(by_stack.items()):
            for d in (doc or {}).get("verdicts") or []:
                for s in VERDICTS:
                    v.add_metric([stack, str(d.get("law")), str(d.get("node")), str(d.get("subject") or ""), s],
                                 1.0 if d.get("status") == s else 0.0)
        yield v
    if gateways:
        yield from gateway_families(gateways)


def gateway_families(gateways: Sequence[Mapping[str, Any]]) -> Iterator[Metric]:
    """Each gateway the records name (:func:`sparkctl.node.headstate.read_gateways`): up or not, each
    worker as smg's ``GET /workers`` lists it (url, model, status: ready, draining, ...; healthy), and
    the backends the serving records expect. Absent when no record names a gateway."""
    up = GaugeMetricFamily("sparkctl_gateway_up", "1 when the gateway answers GET /workers", labels=["gateway_node"])
    backend = GaugeMetricFamily("sparkctl_gateway_backend", "each worker registered at the gateway (value 1), with "
                                "its status as smg reports it (ready, draining, ...)",
                                labels=["gateway_node", "url", "model", "status"])
    healthy = GaugeMetricFamily("sparkctl_gateway_backend_healthy", "1 when smg reports the worker healthy",
                                labels=["gateway_node", "url", "model"])
    expected = GaugeMetricFamily("sparkctl_gateway_backend_expected", "each backend a stack recorded serving routes "
                                 "through the gateway (value 1; compare with sparkctl_gateway_backend)",
                                 labels=["gateway_node", "url", "model", "stack"])
    for g in gateways:
        node = str(g.get("node"))
        up.add_metric([node], 1.0 if g.get("up") else 0.0)
        for w in g.get("workers") or []:
            backend.add_metric([node, str(w.get("url")), str(w.get("model")), str(w.get("status"))], 1.0)
            healthy.add_metric([node, str(w.get("url")), str(w.get("model"))], 1.0 if w.get("healthy") else 0.0)
        for e in g.get("expected") or []:
            expected.add_metric([node, str(e.get("url")), str(e.get("model")), str(e.get("stack"))], 1.0)
    yield from (up, backend, healthy, expected)
