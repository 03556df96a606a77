"""The node-state-only tool outputs, rendered to files when the node's state changes.

Most of what sparkctl asks a node (``uname -r``, ``getconf PAGESIZE``, ``apt-mark
showhold``, ``lspci -vv -s BDF``, ``ethtool IFACE``, ``dpkg-query -W ...``) depends
only on the node's state file, the caller's euid and a netdev's operstate. Each call
used to start a Python interpreter (~60 ms); now :func:`render_views` renders the
answers of a fixed table of command lines beside the state file, and the ``#!/bin/sh``
wrapper of each tool (:func:`wrapper`) sources the matching one: builtin ``printf`` and
``exit``, no fork, no Python. A command line not in the table, or a view not rendered
yet, falls back to the Python shim (``python3 -S -m sparkctl_sim.shims TOOL``), which
computes the same answer with the same formatter (the views cannot disagree with it)
and, when the state has no views, renders them (:func:`ensure_views`). A state write
drops the views of the state it replaces (``nodestate._write``, under the state's lock),
so no view outlives its state, and nodestate imports none of the shims. A writer that is
Python with the renderer at hand (a simulated engine registering or releasing its memory, a
shim that changes the state) passes :func:`renderer` and renders the new views at once,
under the same lock: about 4 ms, where the node's next tool call would start an interpreter
(about 100 ms) to render them.

What varies apart from the state, and how the wrapper picks it without Python:

* the euid (``lspci -vv`` shows capabilities to root only, ethtool's WOL_GET needs
  CAP_NET_ADMIN): the ``Uid:`` line of ``/proc/self/status`` (proc(5): real,
  effective, saved, filesystem uid), read with the builtin ``read``;
* a netdev's carrier (``ethtool IFACE``, ``ibdev2netdev``):
  ``/sys/class/net/IFACE/operstate`` as the real ibdev2netdev script reads it; the
  node's sysfs is its own network namespace's (``ip netns exec`` remounts /sys).
  No operstate file (rootless mode, a missing netdev): the Python shim decides,
  from netlink.

``ps`` is no view but a sh filter (:func:`_ps`): the real ps, the rows of this network
namespace's processes (Python only to settle a dead engine's memory). Time-dependent answers (nvidia-smi's power, clocks and
timestamps) are not here: they stay in Python, started with ``-S`` (no ``site``).

SIMULATION ONLY. Pure except :func:`ensure_views`.
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

from sparkctl_sim import nodestate
from sparkctl_sim.nodestate import VIEWS_DIR
from sparkctl_sim.shimbase import ShimError
from sparkctl_sim.shims.common import BDF_OF_NETDEV, ROCE_DEVICES, VIEW_TOOLS, Netdev, State, ToolResult
from sparkctl_sim.shims.lspci import ROOT_PORTS
from sparkctl_sim.shims.nvidia_smi import SW_CAP_PCT
from sparkctl_sim.shims.run import run_tool

NETDEVS = tuple(BDF_OF_NETDEV)
_BDFS = tuple(sorted(ROOT_PORTS + tuple(BDF_OF_NETDEV.values())))
# The command lines rendered per tool: those sparkctl's facts and laws run, and their kin.
TABLE: dict[str, tuple[tuple[str, ...], ...]] = {
    "uname": ((), ("-r",), ("-a",), ("-n",), ("-s",), ("-m",), ("-v",), ("-rn",), ("-nr",)),
    "getconf": (("PAGESIZE",), ("PAGE_SIZE",)),
    "apt-mark": (("showhold",),),
    "lspci": ((), ("-D",), *((v, "-s", b) for v in ("-vv", "-vvv") for b in _BDFS),
              *(("-PP", "-D", "-s", b) for b in _BDFS), *(("-P", "-D", "-s", b) for b in _BDFS)),
    "ethtool": (*(("-i", n) for n in NETDEVS), *((n,) for n in NETDEVS)),
    "dpkg-query": (("-W", "--showformat=${db:Status-Status}", "earlyoom"),
                   ("-W", "-f=${db:Status-Status}", "earlyoom")),
}
# nvidia-smi's query lines that sparkctl runs (sparkctl/facts/gpu.py: the GPU fact, telemetry_command):
# their values follow the state and the whole second (gb10.gpu_sample: jitter per second), never the
# caller, so they are rendered per second, SMI_WINDOW_S seconds ahead, and the wrapper picks the
# current second (`date +%s`). `-q -d PERFORMANCE` is not: its event-reason counters run in
# microseconds of uptime.
SMI_LINES: tuple[tuple[str, ...], ...] = (
    ("--query-gpu=name,compute_cap,driver_version,clocks.sm,clocks.max.sm,clocks_event_reasons.active,"
     "power.draw,temperature.gpu", "--format=csv,noheader,nounits"),
    ("--query-gpu=power.draw,clocks.sm,temperature.gpu,clocks_event_reasons.active", "--format=csv,noheader,nounits"),
    ("-q", "-d", "CLOCK,PERFORMANCE"),  # the GPU clocks fact (sparkctl/facts/gpu.py)
)
# `-q -d PERFORMANCE`'s SW power capping counter runs in microseconds of uptime (nvidia_smi.render_smi_q):
# its view computes it from the wrapper's clock ($T, microseconds since the epoch) and the state's boot time
_SW_CAP = re.compile(r"\n +SW Power Capping +: (\d+) us\n")
SMI_WINDOW_S = 30
# docker's node-state-only line sparkctl runs (sparkctl/model/imageid.py store_command): the image store's
# kind is the state's docker_store (dockerimages.store_kind). Its wrapper is procshims.install_procshims'.
DOCKER_LINES: tuple[tuple[str, ...], ...] = (("info", "--format", "{{json .DriverStatus}}"),)
# and the image inspections it runs of every tag in the node's image store (sparkctl/facts/engine.py;
# CONTENT_FORMAT of sparkctl/model/imageid.py): a view of the store and the state's store kind
IMAGE_FORMATS = ("{{.Id}}", "{{json .RootFS.Layers}} {{json .Config.Env}} {{json .Config.Entrypoint}} "
                 "{{json .Config.Cmd}} {{json .Config.WorkingDir}} {{json .Config.User}} "
                 "{{json .Os}} {{json .Architecture}}")
assert tuple(TABLE) == VIEW_TOOLS  # the Python shim renders the views of these (dispatch.main)
EUIDS = {"root": 0, "user": 1000}  # any non-zero euid reads the same
EUID_TOOLS = ("lspci", "ethtool")
# carrier-dependent entries: (tool, args) -> the netdev whose operstate picks the view
LINK_ARG = {("ethtool", (n,)): n for n in NETDEVS}


def _result(tool: str, args: tuple[str, ...], state: State, euid: int, link_up: bool | None) -> ToolResult:
    if tool == "dpkg-query":
        from sparkctl_sim.debpkg import dpkg_query

        out, err, rc = dpkg_query(args, state)
        return ToolResult(out, err, rc)
    nd = LINK_ARG.get((tool, args))
    netdevs = {nd: Netdev(nd, "up" if link_up else "down")} if nd else {}
    return run_tool(tool, state, args, now=0.0, euid=euid, netdevs=netdevs)


def _fragment(res: ToolResult) -> str:
    """The sh the wrapper sources: builtin printf of stdout and stderr, then exit."""
    body = ""
    if res.stdout:
        body += f"printf %s {shlex.quote(res.stdout)}\n"
    if res.stderr:
        body += f"printf %s {shlex.quote(res.stderr)} >&2\n"
    return body + f"exit {int(res.exit_code)}\n"


def view_key(user: str | None = None, link: str | None = None) -> str:
    """The arm of a line's view file its wrapper picks: ``"$v"`` (``.user``/``.root`` for the euid
    tools, then ``.up``/``.down`` for a carrier-dependent line; empty for the rest)."""
    return "".join(f".{x}" for x in (user, link) if x)


def _cases(word: str, arms: dict[str, str]) -> str:
    """One view file: ``case WORD in`` with an arm per key, each a fragment that exits (a lone arm
    for the empty key: the fragment itself). A word that matches no arm falls through to the Python
    shim. One file per line of a tool (its euid and carrier variants as arms) and one per second for
    nvidia-smi (its lines as arms): a node's state write renders ~80 files, not ~180, each a create
    and a write on the host's disk under the state's lock, and a call sources a few KiB, not a
    whole tool's answers."""
    if list(arms) == [""]:
        return arms[""]
    return f"case {word} in\n" + "".join(f"{shlex.quote(key)})\n{body};;\n" for key, body in arms.items()) + "esac\n"


def render_smi_views(state: State, start: int) -> dict[str, str]:
    """File name -> sh, for every second from ``start`` on (:data:`SMI_WINDOW_S` of them): the arms of
    every line of :data:`SMI_LINES` in that second. Pure."""
    return {f"nvidia-smi.{sec}.sh": _cases('"$k"', {str(k): _smi_fragment(state, args, sec)
                                                    for k, args in enumerate(SMI_LINES)})
            for sec in range(start, start + SMI_WINDOW_S)}


def _smi_fragment(state: State, args: tuple[str, ...], sec: int) -> str:
    res = run_tool("nvidia-smi", state, args, now=float(sec), euid=0)
    m = _SW_CAP.search(res.stdout)
    if m is None or not state.get("boot_time") or res.stderr or res.exit_code:
        return _fragment(res)
    boot_us = int(float(state["boot_time"]) * 1_000_000)
    # int(max(0, now - boot) * SW_CAP_PCT * 1e4), in sh's integer arithmetic (the same floor to within rounding);
    # the counter's digits are sh's, the rest is the rendered text
    head, rest = res.stdout[:m.start(1)], res.stdout[m.end(1):]
    return (f"u=$((T - {boot_us})); [ \"$u\" -lt 0 ] && u=0\n"
            f"printf '%s%s%s' {shlex.quote(head)} \"$((u * {SW_CAP_PCT} / 100))\" {shlex.quote(rest)}\nexit 0\n")


def render_views(state: State, now: float | None = None, node_dir: str | os.PathLike[str] | None = None
                 ) -> dict[str, str]:
    """File name -> sh fragment, for every command line of :data:`TABLE` (and of
    :data:`SMI_LINES` from the second ``now`` on, when given). Pure.

    An answer that needs the real tool (``exec_argv``) or changes the state is not
    rendered: the wrapper then falls back to the Python shim.
    """
    out: dict[str, str] = {}
    for tool, lines in TABLE.items():
        users = tuple(EUIDS) if tool in EUID_TOOLS else (None,)
        for k, args in enumerate(lines):
            links = ("up", "down") if (tool, args) in LINK_ARG else (None,)
            arms: dict[str, str] = {}
            for user in users:
                for link in links:
                    res = _result(tool, args, state, EUIDS[user] if user else 0,
                                  None if link is None else link == "up")
                    if res.exec_argv is None and res.new_state is None:
                        arms[view_key(user, link)] = _fragment(res)
            if arms:
                out[f"{tool}.{k}.sh"] = _cases('"$v"', arms)
    from sparkctl_sim.dockerimages import kind_of
    from sparkctl_sim.dockerps import info_text

    for k, args in enumerate(DOCKER_LINES):  # docker info --format FMT
        out[f"docker.{k}.sh"] = _fragment(ToolResult(info_text(kind_of(state), args[2])))
    if node_dir is not None:
        out["docker-images.sh"] = render_image_views(Path(node_dir), kind_of(state))
    return out if now is None else {**out, **render_smi_views(state, int(now))}


def render_image_views(node_dir: Path, kind: str) -> str:
    """sh answering ``docker image inspect --format F TAG`` for each of :data:`IMAGE_FORMATS` and
    each tag in the node's image store, as dockerimages.docker_image_inspect prints it."""
    from sparkctl_sim.dockerimages import Images, inspect_view, node_store_dir
    from sparkctl_sim.dockerps import render_template

    arms = []
    for rec in Images(node_store_dir(node_dir), kind).all().values():
        for tag in rec["RepoTags"]:
            for fmt in IMAGE_FORMATS:
                try:
                    text = render_template(fmt, inspect_view(rec, kind)) + "\n"
                except ShimError:
                    continue
                key = shlex.quote(f"5:image inspect --format {fmt} {tag}")
                arms.append(f"  {key}) printf %s {shlex.quote(text)}; exit 0 ;;\n")
    return 'case "$#:$*" in\n' + "".join(arms) + "esac\n"


def renderer(state_path: str | os.PathLike[str]) -> nodestate.Views:
    """The views of the node whose state file is ``state_path`` (nodestate's ``views``), rendered
    from the second they are written on."""
    import time

    node_dir = os.path.dirname(os.fspath(state_path))
    return lambda s: render_views(s, time.time(), node_dir)


def ensure_views(state_path: str | os.PathLike[str], renew: bool = False) -> None:
    """Render the views into ``rendered/`` beside the state file, unless the state has them
    (``renew``: nvidia-smi's ran out; all are rendered again, from this second on)."""
    nodestate.ensure_views(state_path, renderer(state_path), renew)


# --------------------------------------------------------------------------- the wrappers

_UID = ('u=user; while read -r key r e rest; do [ "$key" = Uid: ] && { [ "$e" = 0 ] && u=root; break; }; '
        'done </proc/self/status\n')
# `ip netns exec` mounts the namespace's own sysfs. An absent operstate file where that sysfs
# has the node's management port (OWN_SYSFS): the twin has no netdev in the namespace, which
# the Python shim answers as a port without link (shims.ethtool, shims.ibdev2netdev: "a real
# Spark always has all four"), so the view of "down" is that answer. Without the management port
# (rootless mode, a bare `unshare -n` that left the host's sysfs): Python decides (netlink).
OWN_SYSFS = "/sys/class/net/enP7s7"  # sparkctl_sim.clusterroot.MGMT_IFNAME (not imported: lean)
_LINK = ('l=; [ -r /sys/class/net/{nd}/operstate ] && read -r l </sys/class/net/{nd}/operstate\n'
         f'    case "$l" in up|unknown) l=up ;; "") [ -e {OWN_SYSFS} ] && l=down || k= ;; *) l=down ;; esac\n')


def _case(tool: str) -> str:
    arms = []
    for k, args in enumerate(TABLE.get(tool, ())):
        key = shlex.quote(f"{len(args)}:{' '.join(args)}")
        arm = f"{key}) k={k}"
        nd = LINK_ARG.get((tool, args))
        if nd:
            arm += f"\n    {_LINK.format(nd=nd)}    v=$v.$l"
        arms.append(f"  {arm} ;;")
    return 'k=; v=\ncase "$#:$*" in\n' + "\n".join(arms) + "\nesac\n"


def _ibdev2netdev() -> str:
    """The real ibdev2netdev's loop: each RoCE device's netdev and its operstate (sysfs)."""
    lines = ["k=ok"]
    for i, (dev, nd, _bdf) in enumerate(ROCE_DEVICES):
        lines.append(f"s{i}=; [ -r /sys/class/net/{nd}/operstate ] && read -r s{i} </sys/class/net/{nd}/operstate"
                     f" || [ -e {OWN_SYSFS} ] || k=")
    out = []
    for i, (dev, nd, _bdf) in enumerate(ROCE_DEVICES):
        out.append(f'case "$s{i}" in up|unknown) t{i}=Up ;; *) t{i}=Down ;; esac')
    fmt = "".join(f"{dev} port 1 ==> {nd} (%s)\\n" for dev, nd, _ in ROCE_DEVICES)
    args = " ".join(f'"$t{i}"' for i in range(len(ROCE_DEVICES)))
    return ("\n".join(lines) + '\nif [ "$k" = ok ]; then\n  ' + "\n  ".join(out)
            + f"\n  printf '{fmt}' {args}\n  exit 0\nfi\n")


def _ps(python: str) -> str:
    """``ps`` as a real node sees it: the real ps, its rows kept when the process shares this shell's
    network namespace (find -L -samefile: the nsfs inode). SIMULATION: the simulated nodes share one
    PID namespace, where a real node's ps lists only its own (proc(5): /proc shows the processes of
    the PID namespace it was mounted from). Dead engines' memory is settled whenever someone looks at
    the processes: when one of ``engine_pids`` (beside the state) is gone or a zombie (as
    nodestate.pid_alive reads /proc/PID/stat), Python settles the state first (nodestate.settle_file).

    A row is told apart by its PID column. A format of the caller's own (``-o``, ``-eo``, ``-O``,
    ``--format``, BSD ``axo``) may have none (``ps -eo args``): a ``pid`` column is put first
    (procps joins every ``-o`` in order, a first ``-o pid`` included, even beside BSD ``axo``), read,
    and cut off again, so the caller sees its own columns, and its header only if it asked for one.
    A default format without a PID column (``--no-headers``) cannot be told apart: an error, never
    another node's processes (which would make a stopped engine look alive, or a live one stopped).

    ``ps -eo FORMAT`` (how sparkctl asks) on a node whose processes have a cgroup of their own
    (``procs`` beside the state: sparkctl_sim.netns.node_cgroup) skips the scan: the real ps reads
    just those pids (``-q``, in the order they joined: pid order, as ``-e`` lists them, until pids
    wrap around; the kernel lists a cgroup v2's members as they joined) and becomes this shell's
    process, so its own row is there as on a real node. The list must hold this shell, else the
    cgroup is not this node's and the scan decides."""
    settle = "from sparkctl_sim import nodestate as n; import os; n.settle_file(os.environ.get('SPARKCTL_SIM_STATE'))"
    return r"""e="${SPARKCTL_SIM_STATE%/*}/engine_pids"; k=
[ -r "$e" ] && { read -r ps_pids <"$e"; k=ok; }
for p in $ps_pids; do
  st=; [ -r /proc/$p/stat ] && read -r st 2>/dev/null </proc/$p/stat
  st=${st##*)}; st=${st# }
  case "$st" in ""|Z*|X*) k= ;; esac
done
[ -n "$k" ] || @SETTLE@ 2>/dev/null
ps=; for p in /bin/ps /usr/bin/ps; do [ -x "$p" ] && { ps=$p; break; }; done
[ -n "$ps" ] || { echo "ps: not found" >&2; exit 127; }
c="${SPARKCTL_SIM_STATE%/*}/procs"
if [ "$#" = 2 ] && [ "$1" = -eo ] && [ -r "$c" ]; then
  l=; while read -r p; do l=$l,$p; done <"$c"
  case "$l," in *",$$,"*) exec "$ps" -q "${l#,}" -o "$2" ;; esac
fi
mine=$(find -L /proc/[0-9]*/ns/net -maxdepth 0 -samefile /proc/$$/ns/net 2>/dev/null)
own=
for a in "$@"; do
  case "$a" in --format|--format=*) own=1 ;; --*) ;; -*[oO]*) own=1 ;; esac
done
case "${1:-}" in -*|"") ;; *[oO]*) own=1 ;; esac
[ -z "$own" ] || set -- -o pid "$@"
exec 3>&1
rcs=$({ { "$ps" "$@"; echo $? >&4; } | { awk -v mine="$mine" -v own="$own" '
  BEGIN { n = split(mine, a, "\n"); for (i = 1; i <= n; i++) { split(a[i], f, "/"); keep[f[3]] = 1 } }
  NR == 1 && own { cut = index($0, "PID") + 4; h = substr($0, cut); if (h ~ /[^ ]/) print h; col = 1; next }
  NR == 1 { for (i = 1; i <= NF; i++) if ($i == "PID") { col = i; break }
            if (!col) { print "ps (sparkctl SIMULATION): no PID column to tell the node'"'"'s processes apart" \
                          "; ask for one (-o pid,...)" > "/dev/stderr"; exit 1 }
            print; next }
  NF >= col && $col ~ /^[0-9]+$/ && ($col in keep) { print (own ? substr($0, cut) : $0) }' >&3 || echo 1 >&4; }; } 4>&1)
for r in $rcs; do [ "$r" = 0 ] || exit "$r"; done
exit 0
""".replace("@SETTLE@", f"{shlex.quote(python)} -S -c {shlex.quote(settle)}")


def pick_view(lines: tuple[tuple[str, ...], ...], file: str) -> str:
    """sh that sources the view ``file`` (a word that may use ``$k``) when ``"$@"`` is ``lines[k]``."""
    arms = "".join(f"  {shlex.quote(f'{len(a)}:{chr(32).join(a)}')}) k={k} ;;\n" for k, a in enumerate(lines))
    return f'k=\ncase "$#:$*" in\n{arms}esac\nif [ -n "$k" ]; then\n  f={file}\n  [ -r "$f" ] && . "$f"\nfi\n'


def wrapper(tool: str, python: str, pre: str) -> str:
    """The ``#!/bin/sh`` for ``tool``: its rendered view when there is one, else the Python shim."""
    head = f"#!/bin/sh\n# sparkctl SIMULATION: {tool} (views: sparkctl_sim/shims/rendered.py)\n"
    fast = ""
    if tool == "ibdev2netdev":
        fast = '[ "$#" = 0 ] && {\n' + _ibdev2netdev() + "}\n"
    elif tool == "ps":
        fast = _ps(python)
    elif tool == "nvidia-smi":  # T: now in microseconds; the view of this second
        fast = ("T=$(date +%s%N); T=${T%???}\n"
                + pick_view(SMI_LINES, f'"${{SPARKCTL_SIM_STATE%/*}}/{VIEWS_DIR}/nvidia-smi.${{T%??????}}.sh"'))
    elif tool in TABLE:
        d = '"${%s%%/*}/%s"' % ("SPARKCTL_SIM_STATE", VIEWS_DIR)
        uid = _UID if tool in EUID_TOOLS else ""
        fast = (_case(tool) + 'if [ -n "$k" ]; then\n  ' + uid.replace("\n", "\n  ").rstrip(" ")
                + ('  v=.$u$v\n' if uid else "") + f"  f={d}/{tool}.$k.sh\n"
                + '  [ -r "$f" ] && . "$f"\nfi\n')
    return f"{head}{pre}{fast}exec {shlex.quote(python)} -S -m sparkctl_sim.shims {shlex.quote(tool)} \"$@\"\n"
