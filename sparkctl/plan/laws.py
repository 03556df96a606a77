"""The operational laws: pure verdicts over node facts and a profile.

Each law is one object: an ``id`` that matches a heading in docs/LAWS.md, a
pure ``check(ctx) -> list[Verdict]`` (one verdict per node, or per link), and,
where one exists, a remedy described as data (the commands to run). Nothing here
touches a host: ``sparkctl.ops.check`` gathers the facts and applies the remedies.

Magic numbers carry a comment naming their source in ../shared/reference.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sparkctl.model.inventory import Inventory, Link
from sparkctl.model.schema import Profile
from sparkctl.plan import clocklock

OK, WARN, FAIL, WAIVED, SKIP = "ok", "warn", "fail", "waived", "skip"

# Healthy 200 Gb/s per cable = two twins of ~100 Gb/s; ethtool reports 200000Mb/s
# per twin on a Spark (spark-facts.md §3.1).
NOMINAL_SPEED_MBPS = 200_000
# ib_write_bw per twin: healthy 92-111 Gb/s, stale 8-25 Gb/s (spark-facts.md §4).
BANDWIDTH_FLOOR_GBPS = 60.0
# A node with no engine that still has this much less available than total has
# memory held by a dead engine (1031 leaked ~80 GiB on engine death).
LEAK_THRESHOLD_GIB = 24.0
# The driver may report a nearby value for a lock: 1976 for 2000 (spark-facts.md §1.5).
CLOCK_LOCK_SLACK_MHZ = 50

AC_CYCLE_FIX = ("shut both ends down, unplug them from AC for at least 60 seconds, then reconnect "
                "without moving the cables (a warm reboot does not clear stale PCIe/link state)")


@dataclass(frozen=True)
class Verdict:
    law: str
    node: str
    status: str  # ok | warn | fail | waived | skip
    observed: str
    expected: str
    fix: str = ""
    subject: str = ""  # a link, a device: what exactly on the node

    @property
    def failed(self) -> bool:
        return self.status == FAIL


@dataclass(frozen=True)
class Waiver:
    law: str
    reason: str


@dataclass(frozen=True)
class HwChange:
    """A recorded cable/PCIe change (``sparkctl hw-change``)."""

    note: str
    at: str
    boot_ids: Mapping[str, str]
    nodes: tuple[str, ...]


@dataclass(frozen=True)
class LinkProbe:
    """Results of the active fabric probes for one twin, seen from one end."""

    node: str
    netdev: str
    peer: str
    peer_address: str
    df_ping_ok: bool | None = None
    bandwidth_gbps: float | None = None


@dataclass(frozen=True)
class Context:
    profile: Profile
    inventory: Inventory
    nodes: tuple[str, ...]
    facts: Mapping[str, Any]  # node -> NodeFacts (None when the node did not answer)
    unreachable: Mapping[str, str] = field(default_factory=dict)  # node -> error
    waivers: Mapping[str, Waiver] = field(default_factory=dict)
    hw_change: HwChange | None = None
    link_probes: Sequence[LinkProbe] = ()
    relay_ok: Mapping[tuple[str, str], bool] = field(default_factory=dict)  # (from, to) -> reached
    endpoint_models: Mapping[str, list[str] | None] = field(default_factory=dict)  # head -> served names
    # "node:netdev" -> the node's boot id when this stale link was first seen (check keeps the history)
    stale_seen: Mapping[str, str] = field(default_factory=dict)
    profile_name: str = "PROFILE"  # for the commands a fix names


@dataclass(frozen=True)
class Remedy:
    law: str
    safe: bool  # --fix applies only safe remedies
    commands: Mapping[str, tuple[str, ...]]  # node -> commands (run with sudo)
    readback: str = ""
    text: str = ""


@dataclass(frozen=True)
class Law:
    id: str
    title: str
    check: Callable[[Context], list[Verdict]]
    remedy: Callable[[Context, list[Verdict]], Remedy | None] | None = None


def _facts(ctx: Context, node: str) -> Any:
    return ctx.facts.get(node)


def _unreadable(law: str, node: str, what: str, f: Any) -> Verdict | None:
    if f is None:
        return None
    why = getattr(f, "unreadable", {}).get(what)
    if why:
        return Verdict(law, node, FAIL, "unreadable", what, why)
    return None


def _each(ctx: Context, law: str, what: str, out: list[Verdict]) -> Iterator[tuple[str, Any]]:
    """The nodes that answered, with their facts; an unreadable fact becomes a verdict in ``out``."""
    for node in ctx.nodes:
        f = _facts(ctx, node)
        if f is None:
            continue
        u = _unreadable(law, node, what, f)
        if u:
            out.append(u)
            continue
        yield node, f


# --------------------------------------------------------------------------- kernel pin


def check_kernel(ctx: Context) -> list[Verdict]:
    law = ctx.profile.laws
    out: list[Verdict] = []
    for node, f in _each(ctx, "kernel_pin", "kernel", out):
        k = f.kernel
        pin = law.kernel_allow[0] if law.kernel_allow else None
        if k in law.kernel_deny:
            out.append(Verdict("kernel_pin", node, FAIL, k, f"not {k}",
                               f"{k} is denied: {law.kernel_deny[k]}. Boot {pin or 'a known-good kernel'} on {node} "
                               "and hold the kernel meta-packages (`sparkctl check --explain kernel_pin`)"))
            continue
        if law.kernel_allow and k not in law.kernel_allow:
            out.append(Verdict("kernel_pin", node, FAIL, k, " or ".join(law.kernel_allow),
                               f"{k} is not on the allow-list: boot {pin} on {node}, or add {k} to "
                               "laws.kernel_allow once it is qualified"))
            continue
        held = set(getattr(f, "held_packages", ()) or ())
        missing = [p for p in law.kernel_hold_packages if p not in held]
        if missing:
            out.append(Verdict("kernel_pin", node, FAIL, f"{k}; not held: {', '.join(missing)}", "meta-packages held",
                               f"on {node}: sudo apt-mark hold {' '.join(missing)} (an upgrade would pull a new kernel)"))
            continue
        out.append(Verdict("kernel_pin", node, OK, k, " or ".join(law.kernel_allow) or "not denied"))
    return out


def remedy_kernel(ctx: Context, verdicts: list[Verdict]) -> Remedy | None:
    bad = [v for v in verdicts if v.failed]
    if not bad:
        return None
    law = ctx.profile.laws
    pin = law.kernel_allow[0] if law.kernel_allow else "<known-good>"
    steps = (
        f"sudo apt-mark hold {' '.join(law.kernel_hold_packages)}",
        f"sudo grub-set-default 'Advanced options for DGX OS>DGX OS, with Linux {pin}'  "
        "# or the matching entry in /boot/grub/grub.cfg (GRUB_DEFAULT=saved)",
        "sudo reboot",
    )
    return Remedy("kernel_pin", False, {v.node: steps for v in bad},
                  text="sparkctl never upgrades or installs kernels; these are the steps to run yourself")


# --------------------------------------------------------------------------- page size


def check_page_size(ctx: Context) -> list[Verdict]:
    want = ctx.profile.laws.page_size_kib
    out: list[Verdict] = []
    for node, f in _each(ctx, "page_size", "page_size", out):
        have = (f.page_size_bytes or 0) // 1024
        if want is None or have == want:
            out.append(Verdict("page_size", node, OK, f"{have} KiB", f"{want} KiB" if want else "any"))
            continue
        w = ctx.waivers.get("page_size")
        if w:
            out.append(Verdict("page_size", node, WAIVED, f"{have} KiB", f"{want} KiB",
                               f"waived: {w.reason} (an unqualified configuration, recorded in every bench row)"))
        else:
            out.append(Verdict("page_size", node, FAIL, f"{have} KiB", f"{want} KiB",
                               f"the profile asks for a {want} KiB-page kernel; boot one on {node}, or run it "
                               "unqualified with --waive page_size --reason \"...\""))
    return out


# --------------------------------------------------------------------------- memory guard


def check_memory(ctx: Context) -> list[Verdict]:
    law = ctx.profile.laws
    out: list[Verdict] = []
    for node, f in _each(ctx, "memory_guard", "meminfo", out):
        avail = f.mem_available_kib / 1024 / 1024
        total = f.mem_total_kib / 1024 / 1024
        running = bool(getattr(f, "engines", ()))
        if law.gpu_memory_utilization > 0.92:
            out.append(Verdict("memory_guard", node, FAIL, f"utilization {law.gpu_memory_utilization}", "<= 0.92",
                               "lower laws.gpu_memory_utilization: UVM over-commit livelocks the box"))
            continue
        if not running and total - avail > LEAK_THRESHOLD_GIB:
            out.append(Verdict("memory_guard", node, FAIL, f"{total - avail:.1f} GiB held, no engine running",
                               f"< {LEAK_THRESHOLD_GIB:.0f} GiB held when idle",
                               f"memory held after an engine died (a leak): reboot {node} to give it back"))
            continue
        if running and avail < law.min_free_gib:
            out.append(Verdict("memory_guard", node, FAIL, f"MemAvailable {avail:.1f} GiB",
                               f">= {law.min_free_gib:g} GiB",
                               f"lower laws.gpu_memory_utilization or stop what else runs on {node}"))
            continue
        out.append(Verdict("memory_guard", node, OK, f"{avail:.1f} of {total:.1f} GiB available",
                           f">= {law.min_free_gib:g} GiB, utilization <= 0.92"))
    return out


# --------------------------------------------------------------------------- clock cap


def check_clock(ctx: Context) -> list[Verdict]:
    """The 580 driver does not report an applied ``-lgc`` lock, so the lock is
    judged from sparkctl's record (boot id + cap, written when it locked the
    clock, by the remedy or by sparkctl-clock-cap.service at boot) against the
    node's current boot id, and from evidence: a busy GPU above the cap."""
    cap = ctx.profile.laws.clock_cap_mhz
    out: list[Verdict] = []
    for node, f in _each(ctx, "clock_cap", "gpu", out):
        rec = getattr(f, "clock_lock_record", None)
        in_force = rec is not None and rec[0] == f.boot_id
        locked_cap = rec[1] if in_force else None
        sm = f.gpu.sm_mhz if f.gpu else None
        if cap is None:
            out.append(Verdict("clock_cap", node, WARN if locked_cap else OK,
                               f"lock 0,{locked_cap} MHz" if locked_cap else "no lock", "uncapped",
                               f"sudo nvidia-smi -rgc on {node}" if locked_cap else ""))
            continue
        fix = (f"`sparkctl check --fix` runs nvidia-smi -lgc 0,{cap} on {node} "
               "(and enable sparkctl-clock-cap.service so it comes back after a reboot)")
        if rec is not None and not in_force:
            out.append(Verdict("clock_cap", node, FAIL, "lock lost: the node rebooted since it was applied",
                               f"0,{cap} MHz", "the lock does not survive a reboot: " + fix))
        elif locked_cap is None:
            out.append(Verdict("clock_cap", node, FAIL, "no clock lock applied", f"0,{cap} MHz", fix))
        elif locked_cap != cap:
            out.append(Verdict("clock_cap", node, FAIL, f"lock 0,{locked_cap} MHz", f"0,{cap} MHz", fix))
        elif sm is not None and sm > cap + CLOCK_LOCK_SLACK_MHZ:
            out.append(Verdict("clock_cap", node, FAIL, f"SM clock {sm} MHz above the lock", f"<= {cap} MHz", fix))
        else:
            out.append(Verdict("clock_cap", node, OK, f"lock 0,{cap} MHz (SM {sm} MHz)", f"0,{cap} MHz"))
    return out


def remedy_clock(ctx: Context, verdicts: list[Verdict]) -> Remedy | None:
    cap = ctx.profile.laws.clock_cap_mhz
    bad = [v for v in verdicts if v.failed]
    if cap is None or not bad:
        return None
    return Remedy("clock_cap", True, {v.node: clock_lock_commands(cap, ctx.inventory.node(v.node).prefix, ctx.inventory.node(v.node).proc_root) for v in bad},
                  readback="nvidia-smi --query-gpu=clocks.sm,clocks_event_reasons.active --format=csv,noheader",
                  text=f"lock the GPU clock at 0,{cap} MHz, record it for this boot, read it back")


def clock_lock_commands(cap: int, prefix: str = "/", proc_root: str = "/proc") -> tuple[str, ...]:
    """The remedy of the clock law: :func:`sparkctl.plan.clocklock.lock_commands`."""
    return clocklock.lock_commands(cap, prefix, proc_root)


# --------------------------------------------------------------------------- fabric


def _cabled_links(ctx: Context) -> list[Link]:
    nodes = set(ctx.nodes)
    return [lk for lk in ctx.inventory.links if lk.a.node in nodes and lk.b.node in nodes and lk.a.node != lk.b.node]


def check_fabric(ctx: Context) -> list[Verdict]:
    out: list[Verdict] = []
    mtu = ctx.inventory.mtu
    for lk in _cabled_links(ctx):
        cable = f"{lk.a.node}:{lk.a.netdev} <-> {lk.b.node}:{lk.b.netdev}"
        for ep, other in ((lk.a, lk.b), (lk.b, lk.a)):
            f = _facts(ctx, ep.node)
            if f is None:
                continue
            lf = f.links.get(ep.netdev) if getattr(f, "links", None) else None
            if lf is None:
                out.append(Verdict("fabric", ep.node, FAIL, "interface missing", ep.netdev,
                                   f"{ep.netdev} not found on {ep.node}: check the inventory's port names", cable))
                continue
            problems = []
            if lf.operstate != "up":
                problems.append(f"link {lf.operstate}")
            if lf.speed_mbps is not None and lf.speed_mbps < NOMINAL_SPEED_MBPS and lf.operstate == "up":
                problems.append(f"speed {lf.speed_mbps} Mb/s")
            if lf.mtu != mtu:
                problems.append(f"MTU {lf.mtu}")
            want_addr = f"{ep.address}/24"
            if lf.ipv4 != want_addr:
                problems.append(f"address {lf.ipv4 or 'none'}")
            if lf.operstate == "up" and lf.gid_index_rocev2_ipv4 is None:
                problems.append(f"no RoCEv2 IPv4 GID on {ep.rdma}")
            if problems:
                fix = []
                if any(p.startswith("link") for p in problems):
                    fix.append(f"check the cable {cable} (seated at both ends?) and `ip link set {ep.netdev} up`")
                if any(p.startswith("MTU") for p in problems):
                    fix.append(f"set MTU {mtu} on {ep.node}:{ep.netdev} (both ends must match)")
                if any(p.startswith("address") for p in problems):
                    fix.append(f"apply the fabric plan on {ep.node}: sudo netplan apply (60-sparkctl-fabric.yaml)")
                if any(p.startswith("speed") for p in problems):
                    fix.append(AC_CYCLE_FIX)
                if any(p.startswith("no RoCE") for p in problems):
                    fix.append("re-apply the address; the GID appears once the interface has its IPv4 address")
                out.append(Verdict("fabric", ep.node, FAIL, "; ".join(problems),
                                   f"up, {NOMINAL_SPEED_MBPS} Mb/s, MTU {mtu}, {want_addr}", "; ".join(fix), cable))
            else:
                out.append(Verdict("fabric", ep.node, OK,
                                   f"up {lf.speed_mbps} Mb/s MTU {lf.mtu} GID {lf.gid_index_rocev2_ipv4}",
                                   f"up, MTU {mtu}", subject=f"{ep.netdev}"))
    for probe in ctx.link_probes:
        if probe.df_ping_ok is False:
            out.append(Verdict("fabric", probe.node, FAIL, "don't-fragment ping failed",
                               f"{mtu - 28}-byte DF ping to {probe.peer_address}",
                               f"MTU mismatch or dead path between {probe.node}:{probe.netdev} and {probe.peer}: "
                               f"set MTU {mtu} at both ends", probe.netdev))
    for (src, dst), ok in ctx.relay_ok.items():
        if not ok:
            out.append(Verdict("fabric", src, FAIL, f"{dst} unreachable", "reachable through the relay",
                               "enable IP forwarding on the neighbours (net.ipv4.ip_forward=1) and check the routes; "
                               "Docker's FORWARD DROP policy looks exactly like a dead cable", f"-> {dst}"))
    return out


def stale_links(ctx: Context) -> dict[str, list[tuple[str, str]]]:
    """node -> [(netdev, description)] for every twin measured below the floor, at both ends."""
    out: dict[str, list[tuple[str, str]]] = {}
    for probe in ctx.link_probes:
        if probe.bandwidth_gbps is None or probe.bandwidth_gbps >= BANDWIDTH_FLOOR_GBPS:
            continue
        desc = f"{probe.bandwidth_gbps:.1f} Gb/s, link up at nominal speed"
        out.setdefault(probe.node, []).append((probe.netdev, f"{probe.netdev} {desc}"))
        lk = next((lk for lk in ctx.inventory.links if lk.touches(probe.node) and lk.touches(probe.peer)
                   and lk.end(probe.node).netdev == probe.netdev), None)
        if lk is not None:
            peer = lk.other(probe.node)
            out.setdefault(peer.node, []).append((peer.netdev, f"{peer.netdev} {desc} (measured from {probe.node})"))
    return out


def check_ac_cycle(ctx: Context) -> list[Verdict]:
    if not ctx.profile.laws.ac_cycle:
        return []
    out: list[Verdict] = []
    stale = stale_links(ctx)
    hw = ctx.hw_change
    for node in ctx.nodes:
        f = _facts(ctx, node)
        if f is None:
            continue
        boot = getattr(f, "boot_id", None)
        reasons = []
        if hw and node in hw.nodes and hw.boot_ids.get(node) == boot:
            reasons.append(f"not rebooted since the hardware change '{hw.note}' ({hw.at})")
        if node in stale:
            rebooted = any(ctx.stale_seen.get(f"{node}:{nd}") not in (None, boot) for nd, _ in stale[node])
            rebooted = rebooted or bool(hw and node in hw.nodes and hw.boot_ids.get(node) != boot)
            reasons.append("stale link: " + "; ".join(d for _, d in stale[node])
                           + ("; the node has rebooted since, and a warm reboot did not clear it" if rebooted else ""))
        if reasons:
            out.append(Verdict("ac_cycle", node, FAIL, "; ".join(reasons), "booted after the change, links at full rate",
                               f"{node} and its cable peers: {AC_CYCLE_FIX}"))
        else:
            out.append(Verdict("ac_cycle", node, OK, "no pending change" if not hw else "booted since the change",
                               "links at full rate"))
    return out


def check_served_model(ctx: Context) -> list[Verdict]:
    want = ctx.profile.model.served_name
    out = []
    for head, models in ctx.endpoint_models.items():
        if models is None:
            out.append(Verdict("served_model", head, SKIP, "no endpoint running", want))
        elif want in models:
            out.append(Verdict("served_model", head, OK, ", ".join(models), want))
        else:
            out.append(Verdict("served_model", head, FAIL, ", ".join(models) or "no models", want,
                               f"port {ctx.profile.serve.port} on {head} serves another model: stop it "
                               f"(`sparkctl down`) or switch to its profile; a port answering is not health"))
    return out


def check_weights(ctx: Context) -> list[Verdict]:
    """Free disk on every node, and the same files on every node (as sparkctl's hash caches say).

    The files part reads what each node's hash cache vouches for (the probe
    hashes nothing): nodes whose digests differ hold different files, so
    their ranks would load different weights: FAIL, naming the odd nodes
    against the largest group. A file changed since the node hashed it, or a
    transfer left partial, is a WARN (``weights sync`` re-verifies and
    resumes). Nothing at the path is a WARN (the engine would not start),
    and a node sparkctl never fetched or synced on is skipped: its weights
    may be managed some other way.
    """
    out = []
    path = ctx.profile.model.weights_path
    for node in ctx.nodes:
        f = _facts(ctx, node)
        if f is None:
            continue
        free = getattr(f, "disk_free_gib", None)
        if free is None:
            out.append(Verdict("weights", node, WARN, "free disk unknown", ">= 10 GiB free",
                               f"cannot read free disk space for {path} on {node}"))
        elif free < 10:
            out.append(Verdict("weights", node, FAIL, f"{free:.1f} GiB free", ">= 10 GiB free",
                               f"free disk space on {node}"))
        else:
            out.append(Verdict("weights", node, OK, f"{free:.0f} GiB free", ">= 10 GiB free"))
    return out + _same_weights(ctx, path)


def _same_weights(ctx: Context, path: str) -> list[Verdict]:
    out: list[Verdict] = []
    want = "the same files on every node"
    sync = f"sparkctl weights sync {ctx.profile_name}"
    verified: dict[str, Any] = {}  # node -> its WeightsSummary, every file vouched for
    for node in ctx.nodes:
        f = _facts(ctx, node)
        if f is None:
            continue
        why = getattr(f, "unreadable", {}).get("weights")
        w = getattr(f, "weights", None)
        if why:
            out.append(Verdict("weights", node, WARN, "unreadable", want, why, subject="files"))
        elif w is None or w.kind == "no-agent":
            out.append(Verdict("weights", node, SKIP, "not fetched or synced by sparkctl here", want,
                               subject="files"))
        elif w.kind == "missing":
            out.append(Verdict("weights", node, WARN, f"nothing at {path}", want,
                               f"`sparkctl weights fetch {ctx.profile_name} --node NODE` on one node, "
                               f"then `{sync}`", subject="files"))
        elif getattr(w, "n_hub_differ", 0):
            out.append(Verdict("weights", node, FAIL, f"{w.n_hub_differ} files differ from the Hub manifest "
                               f"(commit {str(w.hub_commit)[:12]})", want,
                               f"`sparkctl weights fetch {ctx.profile_name}` fetches them again", subject="files"))
        elif w.partial or w.n_unverified or w.digest is None:
            seen = []
            if w.n_unverified:
                named = ", ".join(w.unverified[:3]) + (" ..." if w.n_unverified > 3 else "")
                seen.append(f"{w.n_unverified} of {w.files} files changed since verified ({named})")
            if w.partial:
                seen.append(f"{w.partial} partial files of an interrupted transfer")
            out.append(Verdict("weights", node, WARN, "; ".join(seen) or "not verified", want,
                               f"`{sync}` verifies every file, repairs what differs and resumes what is partial",
                               subject="files"))
        else:
            verified[node] = w
    groups: dict[str, list[str]] = {}
    for node, w in verified.items():
        groups.setdefault(w.digest, []).append(node)
    # the largest group is the reference; on a tie, the one with the first node in profile order
    order = {n: i for i, n in enumerate(ctx.nodes)}
    ref_digest, ref_nodes = min(groups.items(), key=lambda kv: (-len(kv[1]), order[kv[1][0]])) \
        if groups else ("", [])
    for node, w in verified.items():
        size = f"{w.files} files, {w.bytes / 2**30:.2f} GiB, digest {w.digest[:12]}"
        if getattr(w, "hub_commit", None):  # the manifest is one of the files: same digest, same commit
            size += f", {w.hub_repo}@{w.hub_commit[:12]}"
        if w.digest == ref_digest:
            others = len(ref_nodes) - 1
            out.append(Verdict("weights", node, OK, size + (f", as on {others} other nodes" if others else ""),
                               want, subject="files"))
        else:
            out.append(Verdict("weights", node, FAIL, size, f"digest {ref_digest[:12]} as on {', '.join(ref_nodes)}",
                               f"the ranks would load different weights: `{sync} --from {ref_nodes[0]}` "
                               f"(only the chunks that differ travel)", subject="files"))
    return out


LAWS: tuple[Law, ...] = (
    Law("kernel_pin", "Kernel pin", check_kernel, remedy_kernel),
    Law("page_size", "Page size", check_page_size),
    Law("memory_guard", "Memory guard", check_memory),
    Law("clock_cap", "GPU clock cap", check_clock, remedy_clock),
    Law("ac_cycle", "AC power cycle after a hardware change", check_ac_cycle),
    Law("fabric", "Fabric", check_fabric),
    Law("served_model", "Served model name", check_served_model),
    Law("weights", "Weights and disk", check_weights),
)


def judge(ctx: Context) -> list[Verdict]:
    """Every law's verdicts, plus one per node that did not answer."""
    out = [Verdict("reach", n, FAIL, err, "answers over ssh", f"node {n} did not answer: {err}")
           for n, err in ctx.unreachable.items()]
    for law in LAWS:
        out.extend(law.check(ctx))
    return out
