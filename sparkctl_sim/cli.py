"""The ``sim`` and ``demo`` command groups (SIMULATION ONLY).

They register into sparkctl's CLI through the ``sparkctl.commands`` entry
points (pyproject.toml); the product never imports this package. Without the
``sim`` extra (gguf, numpy, llama-cpp-python) they say so instead of failing.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import time
from dataclasses import asdict
from pathlib import Path

import click

from sparkctl.cli.base import emit_json, err_console, escape, json_option, out
from sparkctl.cli.main import main
from sparkctl.errors import ConfigError
from sparkctl.ops.localstate import register_inventory
from sparkctl_sim.paths import default_inventory, sim_root

# What the simulated cluster imports beyond the product (pyproject's `sim` extra).
EXTRA_MODULES = ("gguf", "numpy")


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _require_extra() -> None:
    missing = [m for m in EXTRA_MODULES if not _importable(m)]
    if missing:
        raise ConfigError("the simulated cluster needs the sim extra: pip install 'sparkctl[sim]'",
                          hint=f"missing module{'s' if len(missing) > 1 else ''}: {', '.join(missing)}")


@click.group("sim")
def sim_group() -> None:
    """The SIMULATED cluster on this machine (namespaces, real sshd, simulated GB10 tools and engines)."""
    _require_extra()


@sim_group.command("up")
@click.option("--nodes", type=click.Choice(["1", "2", "4", "8", "16"]), default="4", show_default=True,
              help="1, 2 or 4 (the ring) cabled; 2, 4, 8 or 16 behind --topology switch")
@click.option("--topology", type=click.Choice(["cables", "switch"]), default="cables", show_default=True,
              help="cables: one box, a pair, the 4-node ring; switch: every node's p0 to a simulated switch "
                   "(a bridge per port group in its own namespace)")
@click.option("--inventory-out", type=click.Path(dir_okay=False), help="where to write the inventory")
@click.option("--rootless", is_flag=True, help="degraded mode without namespaces (automatic when not root)")
@click.option("--ready", is_flag=True,
              help="pre-configured nodes (fabric addresses, routes, forwarding, no Docker firewall) "
                   "instead of fresh ones as they come out of the box")
@click.option("--no-images", is_flag=True, help="with --ready: load no engine image (fresh nodes never get one)")
@click.option("--playbook", type=click.Choice(["link-local", "static"]), default=None,
              help="fresh nodes as NVIDIA's Connect-two-Sparks playbook leaves them (its /etc/netplan/40-cx7.yaml)")
@click.option("--network-manager", is_flag=True,
              help="the management link under NetworkManager, as a desktop install leaves it")
@click.option("--dpkg-lock-s", type=click.FloatRange(min=0), default=90.0, show_default=True,
              help="fresh nodes: unattended-upgrades holds the dpkg lock this many (simulated) seconds "
                   "after the first boot, as on a fresh Ubuntu box; 0: not held")
def sim_up_cmd(nodes: str, topology: str, inventory_out: str | None, rootless: bool, ready: bool, no_images: bool,
               playbook: str | None, network_manager: bool, dpkg_lock_s: float) -> None:
    """Build (or converge) the simulated cluster and write its inventory.

    Nodes come up fresh: CX-7 ports cabled and up without fabric addresses, IP
    forwarding off, Docker's iptables rules (FORWARD policy DROP, a DOCKER-USER
    chain), the dpkg lock held by unattended-upgrades for a while (--dpkg-lock-s);
    `sparkctl fabric apply` prepares them. --ready skips that.
    """
    from sparkctl.model.inventory import loads_inventory
    from sparkctl_sim import cluster
    from sparkctl_sim.tinymodel import ensure_tiny_model
    from sparkctl_sim.topology import sim_inventory_text, spec_from_inventory

    root = sim_root()
    rootless = rootless or os.geteuid() != 0
    root.mkdir(parents=True, exist_ok=True)
    inv_path = Path(inventory_out) if inventory_out else root / "inventory.yaml"
    try:
        text = sim_inventory_text(int(nodes), root, rootless, topology)
    except ValueError as exc:
        raise ConfigError(str(exc), hint="--topology switch takes --nodes 2, 4, 8 or 16 (as root); "
                          "cables take 1, 2 or 4") from None
    inv = loads_inventory(text, str(inv_path))
    speedup = float(os.environ.get("SPARKCTL_SIM_SPEEDUP") or 1.0)
    if speedup <= 0:
        raise ConfigError(f"SPARKCTL_SIM_SPEEDUP={speedup} must be > 0")
    spec = dataclasses.replace(spec_from_inventory(inv, rootless), fresh=not ready, playbook=playbook or "",
                               network_manager=network_manager, dpkg_lock_s=0.0 if ready else dpkg_lock_s,
                               speedup=speedup)
    status = cluster.up(spec, root, progress=lambda m: err_console().print(f"[dim]{escape(m)}[/]"))
    model = ensure_tiny_model(root / "models")
    if ready and not no_images:  # pre-configured nodes: as if the operator had already built every bundled image on each
        loaded = load_bundled_images(root, [n.name for n in inv.nodes])
        err_console().print(f"[dim]--ready: loaded {len(loaded)} bundled images on every node "
                            "(fresh nodes get none: `sparkctl sim image load`)[/]")
    for n in inv.nodes:  # the tiny real engine's weights, on every node's own disk
        # profiles/tiny-llamacpp.yaml model.weights_path (its repository's local_dir)
        dest = root / "nodes" / n.name / "fs" / "srv" / "models" / "tiny-llama" / model.name
        dest.parent.mkdir(parents=True, exist_ok=True)
        if not dest.exists():
            import shutil

            shutil.copyfile(model, dest)
    inv_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = inv_path.with_name(f".{inv_path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, inv_path)
    if not inventory_out:
        register_inventory(inv_path)  # commands without -i find the simulated ring
    kind = "pre-configured" if ready else "fresh"
    out.print(f"simulated {inv.topology} of {len(inv.nodes)} {kind} nodes is up ({status.mode} mode); "
              f"inventory: {inv_path}")
    for lim in status.limitations:
        out.print(f"  not simulated: {escape(lim)}")
    if int(nodes) == 1:
        out.print(f"try: sparkctl -i {inv_path} inventory")
    elif ready and inv.topology == "switch":
        out.print(f"try: sparkctl -i {inv_path} check tensorfold-tp4x2-switch" if len(inv.nodes) == 8 else
                  f"try: sparkctl -i {inv_path} check tensorfold-tp4x2-switch --set topology.replicas=1 "
                  f"--set topology.tp_size={min(8, len(inv.nodes))}")
    elif ready:
        out.print(f"try: sparkctl -i {inv_path} check ds41f-tp4-ring")
    else:
        out.print(f"try: sparkctl -i {inv_path} fabric apply, then check ds41f-tp4-ring")


@sim_group.command("down")
def sim_down_cmd() -> None:
    """Remove every trace of the simulated cluster (also after a crash)."""
    from sparkctl_sim import cluster

    cluster.down(sim_root())
    register_inventory(None)
    out.print("simulated cluster removed")


@sim_group.command("status")
@json_option
def sim_status_cmd(as_json: bool) -> None:
    """Namespaces, sshd, reachability, boot ids and links of the simulated nodes."""
    from sparkctl_sim import cluster

    st = cluster.status(sim_root())
    if as_json:
        emit_json(asdict(st))
        return
    out.print(f"simulated cluster: {st.mode} ({st.root})")
    for n in st.nodes:
        links = " ".join(f"{lk.ifname}:{'up' if lk.oper_up else 'DOWN'}/{lk.mtu}{'/stale' if lk.stale else ''}"
                         for lk in n.links)
        out.print(f"  {n.name:<8} {n.mgmt_ip}:{n.ssh_port} sshd {'up' if n.sshd_alive else 'DOWN'} "
                  f"ssh {'ok' if n.ssh_reachable else 'NO'} boot {str(n.boot_id)[:8]}  {links}", markup=False)


@sim_group.command("set")
@click.argument("node")
@click.argument("assignments", nargs=-1, required=True)
def sim_set_cmd(node: str, assignments: tuple[str, ...]) -> None:
    """Change a simulated node's hardware state: KEY=VALUE (e.g. kernel_release=6.17.0-1031-nvidia)."""
    from sparkctl_sim import cluster

    for a in assignments:
        if "=" not in a:
            raise ConfigError(f"{a!r} is not KEY=VALUE", hint="e.g. page_size=65536 or held_packages=[]")
        key, _, value = a.partition("=")
        new = cluster.set_state(sim_root(), node, key, value)
        out.print(f"{node}: {key} = {json.dumps(new)}", markup=False)


def bundled_images() -> list[str]:
    """The container images the bundled profiles name (runtime docker)."""
    from sparkctl.model.profiles import resolve
    from sparkctl.model.resources import Roots, bundled_root

    roots = Roots.make()
    found: list[str] = []
    for path in sorted((bundled_root() / "profiles").glob("*.yaml")):
        p = resolve(path.stem, roots).profile
        if p.runtime == "docker" and p.engine.image and p.engine.image not in found:
            found.append(p.engine.image)
    return found


def load_bundled_images(root: Path, nodes: list[str], say: object = None) -> list[str]:
    """SIMULATION: stands in for the operator building/pulling every bundled profile's image on every node."""
    from sparkctl_sim import dockerimages

    images = bundled_images()
    for node in nodes:
        for ref in images:
            dockerimages.load_on_node(root, node, ref)
    return images


@sim_group.group("image")
def sim_image_group() -> None:
    """Images on the simulated nodes: what an operator's `docker build` / `docker pull` would leave there."""


@sim_image_group.command("load")
@click.argument("node")
@click.argument("images", nargs=-1)
@click.option("--variant", default="", help="a different build of the same tag (a different image ID)")
@click.option("--size-mib", type=float, default=4.0, show_default=True, help="the image's layer size")
@click.option("--bundled", is_flag=True, help="every image a bundled profile names")
@click.option("--nccl", default=None, metavar="VERSION",
              help="the NCCL the build carries and loads (ENV NCCL_VERSION, e.g. 2.28.9; a different image ID); "
                   "default: the simulated engines' 2.30.7")
@click.option("--torch-nccl", default=None, metavar="VERSION",
              help="the NCCL the image's torch was built against, when it loads another (--nccl): the "
                   "community's source-built NCCL behind torch's libnccl.so.2 (sparkctl_sim/imagefs.py)")
def sim_image_load_cmd(node: str, images: tuple[str, ...], variant: str, size_mib: float, bundled: bool,
                       nccl: str | None, torch_nccl: str | None) -> None:
    """Put IMAGES into NODE's image store (NODE may be `all`), as if the operator had built them there (SIMULATION)."""
    from sparkctl_sim import dockerimages

    root = sim_root()
    every = sorted(d.name for d in (root / "nodes").iterdir()) if (root / "nodes").is_dir() else []
    targets = every if node == "all" else [node]
    refs = list(images) + (bundled_images() if bundled else [])
    if not refs:
        raise ConfigError("name at least one image (or --bundled)")
    for flag, v in (("--nccl", nccl), ("--torch-nccl", torch_nccl)):
        if v is not None and not dockerimages.NCCL_VERSION_RE.fullmatch(v):
            raise ConfigError(f"{flag} {v}: not an NCCL version", hint=f"X.Y.Z, e.g. {flag} 2.28.9")
    for t in targets:
        if not (root / "nodes" / t).is_dir():
            raise ConfigError(f"no simulated node {t!r}", hint="`sparkctl sim status` lists them")
        for ref in refs:
            rec = dockerimages.load_on_node(root, t, ref, variant, int(size_mib * (1 << 20)), nccl, torch_nccl)
            shown = dockerimages.shown_id(rec, dockerimages.store_kind(root / "nodes" / t))
            what = (f" (NCCL {nccl or dockerimages.DEFAULT_NCCL}, torch built against {torch_nccl})" if torch_nccl
                    else f" (NCCL {nccl})" if nccl else "")
            out.print(f"{t}: {ref} {shown[:19]}{what}", markup=False)


@sim_image_group.command("publish")
@click.argument("image")
@click.option("--size-mib", type=float, default=4.0, show_default=True)
def sim_image_publish_cmd(image: str, size_mib: float) -> None:
    """Make IMAGE pullable from the simulated registry (prints its digest) (SIMULATION)."""
    from sparkctl_sim import dockerimages

    digest = dockerimages.publish(sim_root(), image, layer_bytes=int(size_mib * (1 << 20)))
    out.print(f"{image} published: {dockerimages.repository(image)}@{digest}", markup=False)


FAULTS = ("kill-engine", "link-down", "link-up", "stale-link", "mtu", "sshd-stop", "sshd-start",
          "unreachable", "reachable", "wedge", "unwedge", "leak-on-death", "disk-full", "disk-ok",
          "overcommit", "orphan-container", "cross", "switch-port")


@sim_group.command("fault")
@click.argument("node")
@click.argument("kind", type=click.Choice(FAULTS))
@click.option("--iface", default="enp1s0f0np0", show_default=True, help="the twin netdev for link faults")
@click.option("--mtu", "mtu_bytes", type=int, default=1500, show_default=True, help="for kind mtu")
@click.option("--group", default="p1.0", show_default=True,
              help="for kind switch-port: the port group (p0.0 .. p1.1) whose bridge the twin's switch port joins")
@click.option("--path", "disk_path", default="/var/lib/sparkctl", show_default=True,
              help="for kind disk-full: the node's directory whose disk fills (where the record lives)")
@click.option("--to", "cross_to", metavar="NODE:IFACE",
              help="for kind cross: the other cable end; NODE:--iface and it swap the boxes they face")
def sim_fault_cmd(node: str, kind: str, iface: str, mtu_bytes: int, group: str, disk_path: str,
                  cross_to: str | None) -> None:
    """Inject a fault into a simulated node."""
    from sparkctl_sim import cluster, clustercables, clusterdocker, clusterfaults, overcommit

    def cross() -> None:
        if not cross_to or cross_to.count(":") != 1:
            raise click.UsageError("cross needs --to NODE:IFACE (the other cable end)")
        other = cross_to.split(":")
        clustercables.cross(root, (node, iface), (other[0], other[1]))

    root = sim_root()
    actions = {
        "kill-engine": lambda: cluster.kill_engines(root, node),
        "link-down": lambda: cluster.link_down(root, node, iface),
        "link-up": lambda: cluster.link_up(root, node, iface),
        "stale-link": lambda: cluster.stale_link(root, node, iface),
        "mtu": lambda: cluster.set_mtu(root, node, iface, mtu_bytes),
        # a switched cluster: the twin's cable in another port group's switch port (or VLAN)
        "switch-port": lambda: clusterfaults.switch_port_group(root, node, iface, group),
        "sshd-stop": lambda: cluster.stop_sshd(root, node),
        "sshd-start": lambda: cluster.start_sshd(root, node),
        "unreachable": lambda: cluster.unreachable(root, node),
        "reachable": lambda: cluster.reachable(root, node),
        "wedge": lambda: cluster.set_state(root, node, "faults.wedged", "true"),
        "unwedge": lambda: cluster.set_state(root, node, "faults.wedged", "false"),
        "leak-on-death": lambda: cluster.set_state(root, node, "faults.leak_on_death", "true", allow_new=True),
        "disk-full": lambda: cluster.disk_full(root, node, disk_path),
        "disk-ok": lambda: cluster.disk_ok(root, node),
        # the largest engine grows until the box starves; it livelocks unless a watchdog kills it
        "overcommit": lambda: overcommit.overcommit(root, node),
        # the engine's `docker run` CLI is SIGKILLed; its container keeps running under its name
        "orphan-container": lambda: clusterdocker.orphan_container(root, node),
        # two cables crossed by hand: NODE:--iface and --to swap the far ends they face
        "cross": cross,
    }
    result = actions[kind]()
    out.print(f"{node}: {kind} done" + (f" ({result})" if result not in (None, []) else ""), markup=False)


LATE_HELP = ("NODE=SECONDS: that node boots SECONDS (simulated: divided by $SPARKCTL_SIM_SPEEDUP) after "
             "the others; its cables stay dark meanwhile, so its neighbours' ports have no carrier "
             "and no address. Repeatable; the command returns once it is up.")


@sim_group.command("reboot")
@click.argument("nodes", nargs=-1, required=True)
@click.option("--late", "late", multiple=True, metavar="NODE=SECONDS", help=LATE_HELP)
def sim_reboot_cmd(nodes: tuple[str, ...], late: tuple[str, ...]) -> None:
    """Warm-reboot simulated nodes together (new boot id, clock lock lost; stale links stay stale).

    Every node goes down before any comes back; at boot each runs its enabled units.
    """
    from sparkctl_sim import cluster, clusterlate

    delays = clusterlate.parse_late(late, nodes)
    cluster.reboot(sim_root(), list(nodes), late=delays)
    out.print(f"rebooted (warm): {', '.join(nodes)}" + (f"; late: {clusterlate.describe(delays)}" if delays else ""),
              markup=False)


@sim_group.command("power-cycle")
@click.argument("nodes", nargs=-1, required=True)
@click.option("--late", "late", multiple=True, metavar="NODE=SECONDS", help=LATE_HELP)
def sim_power_cycle_cmd(nodes: tuple[str, ...], late: tuple[str, ...]) -> None:
    """AC power-cycle simulated nodes (clears a stale link once both of its ends are cycled)."""
    from sparkctl_sim import cluster, clusterlate

    delays = clusterlate.parse_late(late, nodes)
    cluster.power_cycle(sim_root(), list(nodes), late=delays)
    out.print(f"power-cycled: {', '.join(nodes)}" + (f"; late: {clusterlate.describe(delays)}" if delays else ""),
              markup=False)




@sim_group.command("power-off")
@click.argument("nodes", nargs=-1, required=True)
def sim_power_off_cmd(nodes: tuple[str, ...]) -> None:
    """Switch simulated nodes off: no SSH, cables dark (neighbours lose carrier) until power-cycle."""
    from sparkctl_sim import cluster

    cluster.power_off(sim_root(), list(nodes))
    out.print(f"powered off: {', '.join(nodes)} (`sparkctl sim power-cycle` boots them)")


@click.command("demo")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="where the runs and the report go (default ./runs/demo-<time>)")
@click.option("--keep", is_flag=True, help="leave the simulated cluster up at the end")
def demo_cmd(out_dir: str | None, keep: bool) -> None:
    """The whole tour on the SIMULATED 4-node ring: sim up (fresh), fabric apply, check, up ds41f, bench, switch, bench,
    report, down."""
    _require_extra()

    base = Path(out_dir) if out_dir else Path("runs") / f"demo-{time.strftime('%Y%m%d-%H%M%S')}"
    inv = str(default_inventory())
    waive = ["--waive", "page_size", "--reason", "stock 4 KiB kernel, as in the field report"]
    bench = ["--suite", "prefill", "--suite", "decode", "--suite", "concurrency", "--lengths", "8K,32K",
             "--concurrency", "1,4,16", "--decode-tokens", "64", "--force"]
    steps: list[tuple[str, list[str], bool]] = [
        ("build the simulated ring: fresh nodes, as they come out of the box (no fabric address, "
         "Docker's FORWARD DROP, the dpkg lock held by unattended-upgrades for 20 s instead of the "
         "default 90 s)", ["sim", "up", "--nodes", "4", "--dpkg-lock-s", "20"], False),
        ("the inventory: ring order, fabric addresses, routes", ["-i", inv, "inventory"], False),
        ("the fabric plan, printed before it runs", ["-i", inv, "fabric", "apply", "ds41f-tp4-ring", "--dry-run"],
         False),
        ("fabric apply: netplan (the fabric ports only), forwarding, the INPUT and DOCKER-USER chains, the "
         "clock-cap unit enabled for boot, earlyoom (apt-get waits for the dpkg lock)",
         ["-i", inv, "fabric", "apply", "ds41f-tp4-ring"], False),
        ("SIMULATION: the operator builds the ds41f and TensorFold images on the head only "
         "(a real box has none), then copies them with image sync over the fabric",
         ["sim", "image", "load", "spark-a", "ghcr.io/ds41f/ds41f-spark:1029",
          "ghcr.io/tensorfold/tensorfold-spark:4x-2026.10"], False),
        ("image sync: docker save | ssh <fabric address> (a key that may only load, expiring) docker load, "
         "verified by content digest",
         ["-i", inv, "image", "sync", "ds41f-tp4-ring"], False),
        ("image sync TensorFold's image too", ["-i", inv, "image", "sync", "tensorfold-tp4-ring"], False),
        ("check every law; apply the clock cap; waive the 64 KiB page size like the field report",
         ["-i", inv, "check", "ds41f-tp4-ring", "--fix", *waive], False),
        ("up ds41f TP4 over the ring", ["-i", inv, "up", "ds41f-tp4-ring", *waive], False),
        ("status", ["-i", inv, "status"], False),
        ("bench ds41f", ["-i", inv, "bench", "ds41f-tp4-ring", *bench, "--out", str(base / "ds41f")], False),
        ("switch to TensorFold", ["-i", inv, "switch", "tensorfold-tp4-ring"], False),
        ("bench TensorFold", ["-i", inv, "bench", "tensorfold-tp4-ring", *bench, "--out", str(base / "tensorfold")],
         False),
        ("the memory watchdog. SIMULATION: spark-d's engine over-commits until 1 % of memory is left; "
         "earlyoom (configured by fabric apply and up) kills it before the box livelocks",
         ["sim", "fault", "spark-d", "overcommit"], False),
        ("status: earlyoom killed spark-d's rank, the other ranks left their broken communicator (drift); "
         "every box still answers, earlyoom active", ["-i", inv, "status"], False),
        ("report: the two stacks beside the published figures, with plots",
         ["bench", "report", str(base / "ds41f"), str(base / "tensorfold"), "--out", str(base / "report"), "--html"],
         False),
        ("down", ["-i", inv, "down"], True),
    ]
    if not keep:
        steps.append(("remove the simulated cluster", ["sim", "down"], True))
    for i, (title, args, always) in enumerate(steps, 1):
        out.print(f"\n[bold]== {i}/{len(steps)} {escape(title)}[/]  [dim]sparkctl {escape(' '.join(args))}[/]")
        code = main(args)
        if code != 0:
            out.print(f"[bold red]step failed (exit {code})[/]; cleaning up")
            main(["-i", inv, "down"])
            if not keep:
                main(["sim", "down"])
            raise SystemExit(code)
    out.print(f"\n[green]demo complete[/]: report in {base / 'report'}/report.md (and report.html, PNG plots)")
