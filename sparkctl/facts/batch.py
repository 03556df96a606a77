"""One batched probe per node: the script that prints every registered fact, and its parser.

What this module owns:

* :data:`REGISTRY` -- the facts of a node, in script order;
* :func:`build_script` -- ONE POSIX ``sh`` script that iterates the registry
  and prints every fact between markers, so a single round trip gathers them::

      @@sparkctl:manifest:hostname kernel ...@@      (the sections to expect)
      @@sparkctl:section:NAME@@
      <the command's stdout, byte for byte>
      <one newline added by the script>
      @@sparkctl:rc:NAME:<exit code>@@
      ...
      @@sparkctl:done@@

  Every value interpolated into it is ``shlex``-quoted; it contains no
  backslash (so a login shell such as fish that rewrites backslashes inside
  single quotes cannot corrupt it) and assumes no login shell, no ``.bashrc``
  and no ``/usr/sbin`` on ``PATH``. A missing command exits 127 in its own
  subshell: the fact becomes "not available", the batch goes on;
* :func:`parse_batch`, which resolves every section back to its registered
  fact (never by pairing names by hand), applies the fact's exit-code table,
  then its parser, and never raises: a section it cannot read becomes an
  entry of ``NodeFacts.unreadable`` ("cannot read X on node Y: ...");
* :func:`gather`, which runs the script through any runner
  ``run(command) -> (exit_code, stdout, stderr)`` and parses the result.

What it must not do: import a transport (SSH lives in ``sparkctl.transport``),
change anything on a node, or read a clock.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from sparkctl.facts import engine as engine_fact
from sparkctl.facts import gpu, modelfiles, net, netplanfiles, pci, services, system
from sparkctl.facts import nccl as nccl_fact
from sparkctl.facts import watchdog as watchdog_fact
from sparkctl.facts.nodefacts import GpuFacts, LinkFacts, NodeFacts, PcieFacts
from sparkctl.facts.registry import (
    SECTION_NAME,
    Fact,
    ProbeParseError,
    Registry,
    ScriptContext,
    WeightsPaths,
    q,
)

if TYPE_CHECKING:  # no pydantic on a node (sparkctl.node.bundle)
    from sparkctl.model.inventory import Node

MARKER_PREFIX = services.MARKER_PREFIX

REGISTRY = Registry((
    system.HOSTNAME, system.KERNEL, system.PAGE_SIZE, system.HELD_PACKAGES, system.BOOT_ID, system.UPTIME,
    system.MEMINFO, system.DISK, services.WEIGHTS, modelfiles.MODEL_FILES, gpu.GPU, gpu.GPU_CLOCKS, system.CLOCK_LOCK,
    net.IBDEV2NETDEV, net.NET_OPERSTATE, net.NET_MTU, net.NET_IPV4, net.NET_ETHTOOL, net.GIDS, pci.PCIE,
    services.ENGINES, services.PORTS, services.MODELS, services.ENGINE_UNIT,
    engine_fact.ENGINE, engine_fact.IMAGE, nccl_fact.NCCL, watchdog_fact.WATCHDOG, netplanfiles.NETPLAN_FILES,
))

PRELUDE = """\
PATH="${PATH:-/usr/bin:/bin}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
export PATH
LC_ALL=C
export LC_ALL
sec() { echo "@@sparkctl:section:$1@@"; }
end() { echo; echo "@@sparkctl:rc:$1:$2@@"; }
have() { command -v "$1" >/dev/null 2>&1; }
show() { { while IFS= read -r show_l || [ -n "$show_l" ]; do printf %s "$show_l"; echo; done < "$1"; } 2>/dev/null || cat "$1"; }
"""


# One call of the prelude's `show` on one quoted path (registry.small_file): a function that
# returns (never exits) and sets nothing the next section reads, so it needs no subshell of its
# own: a fork less per sysfs file, a dozen per probe and per exporter scrape.
_SHOW_ONLY = re.compile(r"show (?:'[^']*'|[A-Za-z0-9_@%+=:,./-]+)")


def _isolated(body: str) -> str:
    """``body`` in a subshell of its own (a section's ``exit`` or ``cd`` ends there), save a lone ``show``."""
    return body if _SHOW_ONLY.fullmatch(body) else f"( {body} )"


def section_title(name: str) -> str:
    """The human name of a section, for messages (``MTU of enp1s0f0np0``)."""
    hit = REGISTRY.resolve(name)
    return hit[0].title_of(hit[1]) if hit else name


def frame(steps: list[tuple[str, str]], manifest: str | None = None) -> str:
    """The script around ``(section, sh body)`` steps: manifest (the section
    names unless given), markers, done."""
    for name, _ in steps:
        if not SECTION_NAME.fullmatch(name):  # names reach the shell unquoted
            raise ValueError(f"unsafe probe section name {name!r}")
    names = " ".join(n for n, _ in steps) if manifest is None else manifest
    # The sections' output leaves in one piece: each section's markers and tool wrote apart, and
    # sshd sent each write as a packet of its own (about 150 per probe), every one decrypted and
    # checked in Python by the operator's paramiko: 14 to 19 ms of its CPU per node against 2 ms
    # for one write of the same 19 KB (measured against a simulated node's sshd). The trap keeps
    # what was read when `timeout` stops the batch (its TERM ends the sections, this shell prints
    # what they said).
    out = [PRELUDE, "trap : TERM", "o=$(", f"echo {q(f'{MARKER_PREFIX}manifest:{names}@@')}"]
    out += [f"sec {name}; {_isolated(body)}; end {name} $?" for name, body in steps]
    out += [f"echo {q(MARKER_PREFIX + 'done@@')}", ")", 'printf %s "$o"', "echo"]
    return "\n".join(out) + "\n"


def build_script(node: Node, weights_path: str | None = None, endpoint_port: int | None = None,
                 weights: WeightsPaths | None = None, engine: engine_fact.EngineProbe | None = None,
                 endpoint_host: str | None = None, endpoint_key: tuple[str, str] | None = None) -> str:
    """The batched probe script for ``node`` (POSIX sh; see the module docstring).

    ``endpoint_port``: also ask the engine for its served models, at ``endpoint_host``
    (the bound address; 127.0.0.1 when None), with the key read on the node from
    ``endpoint_key`` (env file, variable) when given;
    ``weights``: also ask the weights agent what its hash cache vouches for."""
    ctx = ScriptContext(node, weights_path, endpoint_port, weights, engine, endpoint_host, endpoint_key)
    return frame([(section, fact.command(ctx, item)) for fact in REGISTRY for item, section in fact.sections(ctx)])


# What the node's exporter reads at every scrape (sparkctl.node.exporter): the facts of a
# status row and of the fabric ports, in registry order (a netdev's `gone` fact first).
EXPORTER_FACTS = (system.BOOT_ID, system.MEMINFO, gpu.GPU, gpu.GPU_CLOCKS, system.CLOCK_LOCK, net.IBDEV2NETDEV,
                  net.NET_OPERSTATE, net.NET_MTU, net.NET_IPV4, net.NET_ETHTOOL, net.GIDS, services.ENGINES,
                  services.ENGINE_UNIT, watchdog_fact.WATCHDOG, watchdog_fact.KILLS)


def frame_parallel(steps: list[tuple[str, str]], then: list[tuple[str, str]] | None = None,
                   manifest: str | None = None) -> str:
    """The batch's output format, every section's command run at once (each into its own file
    of a private temp dir), then printed in order: a scrape waits for the slowest tool, not
    for the sum of them. The same markers, so :func:`parse_batch` reads it unchanged.
    ``then``: sections run one after another once all of ``steps`` are done."""
    later = then or []
    for name, _ in steps + later:
        if not SECTION_NAME.fullmatch(name):
            raise ValueError(f"unsafe probe section name {name!r}")
    names = " ".join(n for n, _ in steps + later) if manifest is None else manifest
    out = [PRELUDE, 'd=$(mktemp -d) || exit 1', "trap 'rm -rf \"$d\"' EXIT"]
    # each section writes its own markers (sec and end are shell functions): a section costs its
    # subshells and its tool, and the sections are printed in order by one cat
    out += [f'( sec {name}; {_isolated(body)}; end {name} "$?" ) > "$d/{i}" &' for i, (name, body) in enumerate(steps)]
    out.append("wait")
    out += [f'( sec {name}; {_isolated(body)}; end {name} "$?" ) > "$d/{i}"'
            for i, (name, body) in enumerate(later, start=len(steps))]
    out.append(f"echo {q(f'{MARKER_PREFIX}manifest:{names}@@')}")
    out.append("cat " + " ".join(f'"$d/{i}"' for i in range(len(steps) + len(later))))
    out.append(f"echo {q(MARKER_PREFIX + 'done@@')}")
    return "\n".join(out) + "\n"


def fact_script(node: Node, facts: tuple[Fact[Any], ...] = EXPORTER_FACTS) -> str:
    """A probe script of ``facts`` only, in the batch's format (``parse_batch`` reads the registered
    ones; a fact outside the registry, such as earlyoom's kills, is read from ``split_batch``'s
    sections), its commands run in parallel (:func:`frame_parallel`)."""
    ctx = ScriptContext(node)
    return frame_parallel([(section, fact.command(ctx, item)) for fact in facts
                           for item, section in fact.sections(ctx)])


def remote_command(script: str) -> str:
    """The command line to hand to a transport: ``sh -c '<script>'`` (no login shell)."""
    return f"sh -c {q(script)}"


# --------------------------------------------------------------------------- splitting


@dataclass(frozen=True)
class Section:
    text: str
    rc: int | None  # None: the end marker never came (output cut off)


_MARK = re.compile(r"@@sparkctl:(manifest|section|rc|done)(?::(.*))?@@")


def split_batch(stdout: str) -> tuple[list[str] | None, dict[str, Section], bool]:
    """(manifest, sections, done) from the script's stdout. Never raises."""
    manifest: list[str] | None = None
    sections: dict[str, Section] = {}
    done = False
    name: str | None = None
    buf: list[str] = []

    def close(rc: int | None) -> None:
        nonlocal name, buf
        if name is not None and name not in sections:
            text = "\n".join(buf)
            if rc is None and text.endswith("\n"):
                text = text[:-1]
            sections[name] = Section(text, rc)
        name, buf = None, []

    for line in stdout.split("\n"):
        m = _MARK.fullmatch(line)
        if not m:
            if name is not None:
                buf.append(line)
            continue
        kind, arg = m.group(1), m.group(2) or ""
        if kind == "manifest" and manifest is None:
            manifest = [n for n in arg.split(" ") if SECTION_NAME.fullmatch(n)]
        elif kind == "section" and SECTION_NAME.fullmatch(arg):
            close(None)
            name = arg
        elif kind == "rc":
            rc_name, _, rc = arg.rpartition(":")
            if rc_name == name and rc.isdigit():
                close(int(rc))
            elif name is not None:
                buf.append(line)
        elif kind == "done":
            close(None)
            done = True
    close(None)
    return manifest, sections, done


# --------------------------------------------------------------------------- reading


class _Reader:
    """Reads each section through its fact; keeps what it could not read and why."""

    def __init__(self, node: str, sections: Mapping[str, Section]) -> None:
        self.node = node
        self.sections = sections
        self.values: dict[tuple[Fact[Any], str], Any] = {}
        self.gone: set[tuple[object, str]] = set()  # (kind of item, item) that does not exist
        self.unreadable: dict[str, str] = {}
        self.not_available: dict[str, str] = {}

    def fail(self, key: str, detail: str) -> None:
        self.unreadable.setdefault(key, f"cannot read {section_title(key)} on node {self.node}: {detail}")

    def read(self, fact: Fact[Any], item: str) -> None:
        key = fact.section(item)
        sec = self.sections.get(key)
        if sec is None:
            self.fail(key, "missing from the probe output (output cut off?)")
            return
        if sec.rc is None:
            self.fail(key, "output cut off before the end of the section")
            return
        for code in fact.exit_codes:
            if code.matches(sec.rc, sec.text):
                detail = code.detail.replace("{}", item)
                if code.means == "absent":
                    self.values[(fact, item)] = code.value
                elif code.means == "not_available":
                    self.not_available[key] = f"{fact.title_of(item)} not available on node {self.node}: {detail}"
                elif code.means == "gone":
                    self.gone.add((fact.items, item))
                    self.fail(key, detail)
                else:
                    self.fail(key, detail)
                return
        if sec.rc != 0 and not sec.text.strip():
            self.fail(key, f"command failed with exit code {sec.rc} and printed nothing")
            return
        try:
            self.values[(fact, item)] = fact.parse(sec.text)
        except ProbeParseError as exc:
            self.fail(key, f"{exc.detail}{f' (exit code {sec.rc})' if sec.rc else ''}")
        except Exception as exc:  # noqa: BLE001 - parse_batch never raises; tests keep parsers honest
            self.fail(key, f"unexpected {type(exc).__name__}: {exc}")

    def get(self, fact: Fact[Any], item: str = "") -> Any:
        return self.values.get((fact, item))


def parse_batch(node_name: str, stdout: str) -> NodeFacts:
    """Parse the batched script's stdout into :class:`NodeFacts`. Never raises:
    every section it cannot read is explained in ``unreadable``."""
    try:
        return _parse_batch(node_name, stdout)
    except Exception as exc:  # noqa: BLE001 - last resort; must not happen
        return NodeFacts(node=node_name, unreadable={"batch": f"cannot read any fact on node {node_name}: "
                                                              f"{type(exc).__name__}: {exc}"})


def _parse_batch(node: str, stdout: str) -> NodeFacts:
    manifest, sections, done = split_batch(stdout)
    r = _Reader(node, sections)
    # Without a manifest only the core facts are known to be due.
    names = list(manifest) if manifest else [f.key for f in REGISTRY if f.core and f.items is None]
    names += [n for n in sections if n not in names]
    if manifest is None:
        r.unreadable["batch"] = f"cannot read the probe batch on node {node}: no manifest line (not sparkctl output?)"
    elif not done:
        r.unreadable["batch"] = f"cannot read the probe batch on node {node}: output cut off (no done marker)"
    due = [hit for n in names if (hit := REGISTRY.resolve(n)) is not None]
    due.sort(key=lambda hit: REGISTRY.order(hit[0]))  # stable: an item keeps its manifest order
    for fact, item in due:
        if (fact.items, item) not in r.gone:
            r.read(fact, item)
    return _assemble(node, r, due)


def _gpu(r: _Reader) -> GpuFacts | None:
    q_: gpu.GpuQuery | None = r.get(gpu.GPU)
    clocks: gpu.SmiClocks | None = r.get(gpu.GPU_CLOCKS)
    if q_ is None:
        return None
    if q_.event_reasons_mask is not None:
        reasons = gpu.decode_reasons(q_.event_reasons_mask)
    else:
        reasons = clocks.event_reasons or () if clocks else ()
    return GpuFacts(
        name=q_.name, compute_cap=q_.compute_cap, driver=q_.driver,
        sm_mhz=q_.sm_mhz if q_.sm_mhz is not None else (clocks.sm_mhz if clocks else None),
        max_sm_mhz=q_.max_sm_mhz if q_.max_sm_mhz is not None else (clocks.max_sm_mhz if clocks else None),
        clock_lock_max_mhz=clocks.lock_max_mhz if clocks else None,
        event_reasons=reasons, power_w=q_.power_w, temp_c=q_.temp_c,
    )


def _links(r: _Reader, netdevs: list[str]) -> dict[str, LinkFacts]:
    ibmap: dict[str, net.IbMapping] = r.get(net.IBDEV2NETDEV) or {}
    gids: dict[str, dict[int, net.Gid]] = r.get(net.GIDS) or {}
    links: dict[str, LinkFacts] = {}
    for nd in netdevs:
        if (net.NET_OPERSTATE.items, nd) in r.gone:
            continue
        ipv4 = r.get(net.NET_IPV4, nd)
        eth: net.Ethtool | None = r.get(net.NET_ETHTOOL, nd)
        rdma = ibmap[nd].rdma if nd in ibmap else next(
            (dev for dev, t in gids.items() if any(g.netdev == nd for g in t.values())), None)
        links[nd] = LinkFacts(
            netdev=nd, rdma=rdma, operstate=r.get(net.NET_OPERSTATE, nd), mtu=r.get(net.NET_MTU, nd), ipv4=ipv4,
            speed_mbps=eth.speed_mbps if eth else None, link_detected=eth.link_detected if eth else None,
            gid_index_rocev2_ipv4=net.rocev2_ipv4_gid_index(gids[rdma], nd, ipv4) if rdma in gids else None,
        )
    return links


def _assemble(node: str, r: _Reader, due: list[tuple[Fact[Any], str]]) -> NodeFacts:
    mem: system.Meminfo | None = r.get(system.MEMINFO)
    disk: system.DiskFree | None = r.get(system.DISK)
    pcie: dict[str, PcieFacts] = {}
    for fact, bdf in due:
        if fact is pci.PCIE and (p := r.get(pci.PCIE, bdf)) is not None:
            pcie[bdf] = replace(p, bdf=bdf)
    return NodeFacts(
        node=node,
        clock_lock_record=r.get(system.CLOCK_LOCK),
        weights=r.get(services.WEIGHTS),
        model_files=r.get(modelfiles.MODEL_FILES),
        hostname=r.get(system.HOSTNAME),
        kernel=r.get(system.KERNEL),
        page_size_bytes=r.get(system.PAGE_SIZE),
        held_packages=r.get(system.HELD_PACKAGES),
        boot_id=r.get(system.BOOT_ID),
        uptime_s=r.get(system.UPTIME),
        mem_total_kib=mem.total_kib if mem else None,
        mem_available_kib=mem.available_kib if mem else None,
        mem_free_kib=mem.free_kib if mem else None,
        mem_cached_kib=mem.cached_kib if mem else None,
        disk_free_gib=round(disk.free_gib, 3) if disk else None,
        gpu=_gpu(r),
        links=_links(r, [item for fact, item in due if fact is net.NET_OPERSTATE]),
        pcie=pcie,
        engines=r.get(services.ENGINES),
        listening_ports=r.get(services.PORTS),
        served_models=r.get(services.MODELS),
        engine_found=r.get(engine_fact.ENGINE),
        image=r.get(engine_fact.IMAGE),
        nccl_version=nccl.version if isinstance(nccl := r.get(nccl_fact.NCCL), nccl_fact.NcclReading) else nccl,
        nccl_library=nccl.library if isinstance(nccl, nccl_fact.NcclReading) else None,
        nccl_torch=nccl.torch if isinstance(nccl, nccl_fact.NcclReading) else None,
        watchdog=r.get(watchdog_fact.WATCHDOG),
        netplan_files=r.get(netplanfiles.NETPLAN_FILES),
        engine_unit=r.get(services.ENGINE_UNIT),
        unreadable=r.unreadable,
        not_available=r.not_available,
    )


def gather(
    run: Callable[[str], tuple[int, str, str]],
    node: Node,
    weights_path: str | None = None,
    endpoint_port: int | None = None,
) -> NodeFacts:
    """Run the batched probe on ``node`` in ONE call of ``run`` and parse it.

    ``run(command) -> (exit_code, stdout, stderr)``; whatever it raises (a
    transport error: the node did not answer) propagates: that is the
    transport's verdict, not a fact. A run whose stdout carries no probe output
    yields facts whose every section is unreadable, with stderr's last line.
    """
    code, out, err = run(remote_command(build_script(node, weights_path, endpoint_port)))
    facts = parse_batch(node.name, out)
    if "batch" in facts.unreadable and (code != 0 or err.strip()):
        tail = err.strip().splitlines()[-1][:200] if err.strip() else ""
        facts.unreadable["batch"] += f" (exit code {code}{': ' + tail if tail else ''})"
    return facts
