"""One simulated node's hardware state: a JSON file per node.

This is the single source of truth that the GB10 tool shims read (and, for
``nvidia-smi -lgc``, write), that the simulated engines read (clock lock, stale
links, wedge faults) and write (memory they hold), and that ``sparkctl sim set``
and ``sparkctl sim fault`` change. Writes are atomic (temp file + rename) under
an exclusive ``flock`` on a sibling lock file, so concurrent shims and engines
never see a torn file.

SIMULATION ONLY: real nodes have no such file.
"""

from __future__ import annotations

import contextlib
import copy
import fcntl
import json
import os
from collections.abc import Callable, Iterator

# Light on purpose (no pathlib, typing or uuid at run time): the shims without a rendered view
# import this in a fresh `python3 -S` on every call.
TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy reads the name)
if TYPE_CHECKING:
    from typing import Any


# Real GB10 boxes report MemTotal around 127.6 million kB (docs/reference/spark-facts.md §5.4).
MEM_TOTAL_KIB = 127_600_816
# An idle Spark with its page cache dropped: ~118 GiB available of ~121.7 GiB
# (docs/reference/spark-facts.md §5.4 shows 115,669,068 kB on a head with some cache in use).
IDLE_MEM_AVAILABLE_KIB = 123_500_000

TWIN_NETDEVS = ("enp1s0f0np0", "enP2p1s0f0np0", "enp1s0f1np1", "enP2p1s0f1np1")


def default_state(hostname: str) -> dict[str, Any]:
    """The state of a healthy, freshly power-cycled simulated Spark."""
    return {
        "hostname": hostname,
        "kernel_release": "6.17.0-1029-nvidia",  # the field report's known-good pin
        "page_size": 4096,  # stock DGX OS kernel flavour is 4 KiB
        "held_packages": [
            "linux-headers-nvidia-hwe-24.04",
            "linux-image-nvidia-hwe-24.04",
            "linux-modules-nvidia-580-open-nvidia-hwe-24.04",
            "linux-modules-nvidia-fs-nvidia-hwe-24.04",
            "linux-nvidia-hwe-24.04",
            "linux-tools-nvidia-hwe-24.04",
        ],
        "boot_id": _new_boot_id(),
        "boot_time": None,  # epoch seconds; filled by sim up / power cycle
        "mem_total_kib": MEM_TOTAL_KIB,
        "mem_idle_available_kib": IDLE_MEM_AVAILABLE_KIB,
        # GiB held by running engines, keyed by pid (str); removed on clean exit.
        "engine_mem_gib": {},
        # GiB held after an engine died (the leak law); cleared only by a reboot.
        "leaked_mem_gib": 0.0,
        # kB of file pages in the page cache (file reads fill it; drop_caches 1|3 empties it):
        # MemFree falls by it, MemAvailable does not (it is reclaimable). See fill_page_cache.
        "page_cache_kib": 0,
        "gpu": {
            "name": "NVIDIA GB10",
            "driver": "580.173.02",
            "cuda": "13.0",
            "compute_cap": "12.1",
            "bus_id": "0000000F:01:00.0",
            "max_sm_mhz": 3003,
            "default_app_mhz": 2418,
            "clock_lock_mhz": None,  # [min, max] after nvidia-smi -lgc; lost on reboot
            "temp_c": 43,
        },
        # Per twin netdev: speed as ethtool reports it, and whether the link is in
        # the stale post-cable-change state (nominal speed, a fraction of the
        # bandwidth). Admin up/down and MTU are the REAL veth state in the node's
        # namespace, not stored here.
        "links": {
            # link_local_ipv4: an IPv4LL address's RoCE GID ahead of the fabric one (shims.ibdev.gid_table)
            name: {"speed_mbps": 200000, "stale": False, "cabled": False, "link_local_ipv4": None}
            for name in TWIN_NETDEVS
        },
        # healthy Gen5 x4 per CX7 function, under root ports that give Gen5 x4 (a GX10-style
        # node: root_ports.0002.width 2, sparkctl_sim/shims/lspci.py)
        "pcie": {"gen_gts": 32, "width": 4,
                 "root_ports": {"0000": {"gen_gts": 32, "width": 4}, "0002": {"gen_gts": 32, "width": 4}}},
        "faults": {"wedged": False, "unreachable": False, "sshd_stopped": False},
        # Docker's image store: classic (image ID = config digest) or containerd (ID = manifest
        # digest); sparkctl_sim/dockerimages.py
        "docker_store": "classic",
    }


def _new_boot_id() -> str:
    import uuid

    return str(uuid.uuid4())


def _beside(path: str | os.PathLike[str], name: str) -> str:
    return os.path.join(os.path.dirname(os.fspath(path)), name)


def _read(path: str | os.PathLike[str]) -> str:
    with open(path, encoding="utf-8") as fh:
        return fh.read()


@contextlib.contextmanager
def _locked(path: str | os.PathLike[str]) -> Iterator[None]:
    with open(os.fspath(path) + ".lock", "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def load(path: str | os.PathLike[str]) -> dict[str, Any]:
    with _locked(path):
        return json.loads(_read(path))  # type: ignore[no-any-return]


def _atomic_text(p: str, text: str) -> None:
    tmp = _beside(p, f".{os.path.basename(p)}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.replace(tmp, p)


Views = Callable[[dict[str, "Any"]], dict[str, str]]  # state -> the tools' rendered views (file -> text)


def _write(p: str, state: dict[str, Any], views: Views | None = None) -> None:
    """Write the state and the files derived from it (the node's /proc views).

    ``meminfo`` and ``boot_id`` beside the state file are what the simulated
    node sees as /proc/meminfo and /proc/sys/kernel/random/boot_id (bind-mounted
    in its mount namespace), so they are refreshed on every write; ``engine_pids``
    tells the ``ps`` wrapper whether any engine holding memory is gone (shims.rendered).
    The tools' rendered views of another state are dropped first (:func:`ensure_views`);
    ``views``: a writer that has the renderer at hand renders the new state's views at once,
    so the node's next tool call finds them instead of starting Python to render them.
    """
    derived = (("meminfo", render_meminfo(state)), ("boot_id", render_boot_id(state)),
               ("drop_caches", ""), (ENGINE_PIDS, render_engine_pids(state)))
    text = json.dumps(state, indent=2, sort_keys=True) + "\n"
    kept = _drop_views(p, text)
    _atomic_text(p, text)
    # Write in place (not rename): a bind mount pins the inode it was mounted on.
    for name, view in derived:
        with open(_beside(p, name), "w") as fh:
            fh.write(view)
    if views is not None and not kept:
        _render(p, text, views)


# --------------------------------------------------------------------------
# The node-state-only tools' answers (sparkctl_sim.shims.rendered): dropped when the state
# changes (under the state's lock, before the new state is written), rendered again by the
# first reader that finds none (:func:`ensure_views`, under the same lock). A directory that
# exists holds the views of the current state, complete: it appears by one rename.
# --------------------------------------------------------------------------

VIEWS_DIR = "rendered"
_VIEWS_MARK = ".state"  # the state text the views were rendered from


def _drop_views(p: str, text: str) -> bool:
    """True when the views were kept: rendered from this very state (a rewrite that changed nothing)."""
    d = _beside(p, VIEWS_DIR)
    try:
        if _read(os.path.join(d, _VIEWS_MARK)) == text:
            return True
    except OSError:
        pass
    _remove_dir(d)
    return False


def _remove_dir(d: str) -> None:
    gone = f"{d}.{os.getpid()}.gone"
    try:
        os.rename(d, gone)  # readers see the views, or none; never half of them
    except FileNotFoundError:
        return
    for name in os.listdir(gone):
        os.unlink(os.path.join(gone, name))
    os.rmdir(gone)


def drop_views(path: str | os.PathLike[str]) -> None:
    """Drop the views of a node whose other inputs changed (its docker image store: dockerimages)."""
    p = os.fspath(path)
    if os.path.isfile(p):
        with _locked(p):
            _remove_dir(_beside(p, VIEWS_DIR))


def views_ready(path: str | os.PathLike[str]) -> bool:
    return os.path.isfile(os.path.join(_beside(path, VIEWS_DIR), _VIEWS_MARK))


def ensure_views(path: str | os.PathLike[str], render: Views, renew: bool = False) -> None:
    """Render on read: when the state has no views (or ``renew``: they ran out), ``render(state)``
    (file name -> text) them, under the state's lock, into a new directory that replaces the old
    by one rename."""
    p = os.fspath(path)
    if views_ready(p) and not renew:
        return
    with _locked(p):
        if views_ready(p) and not renew:
            return
        _render(p, _read(p), render)


def _render(p: str, text: str, render: Views) -> None:
    """The views of the state ``text`` into a new directory that replaces the old by one rename
    (the caller holds the state's lock)."""
    views = {**render(json.loads(text)), _VIEWS_MARK: text}
    d = _beside(p, VIEWS_DIR)
    new = f"{d}.{os.getpid()}.new"
    _remove_dir(new)  # a reader killed mid-render
    os.mkdir(new)
    for name, body in views.items():
        with open(os.path.join(new, name), "w", encoding="utf-8") as fh:
            fh.write(body)
    _remove_dir(d)
    os.rename(new, d)


def create(path: str | os.PathLike[str], state: dict[str, Any]) -> None:
    """Write a new state file (and its derived /proc views)."""
    p = os.fspath(path)
    os.makedirs(os.path.dirname(p) or ".", exist_ok=True)
    with _locked(p):
        _write(p, state)


def save(path: str | os.PathLike[str], state: dict[str, Any]) -> None:
    p = os.fspath(path)
    with _locked(p):
        _write(p, state)


@contextlib.contextmanager
def edit(path: str | os.PathLike[str], *, rewrite: bool = False, views: Views | None = None
         ) -> Iterator[dict[str, Any]]:
    """Read-modify-write under the lock: ``with edit(p) as s: s["x"] = 1``.

    ``rewrite`` writes even when nothing changed, which also re-renders the
    derived /proc views (a writer killed between the two writes leaves them stale);
    ``views``: render the tools' views of the new state at once (:func:`_write`).
    """
    p = os.fspath(path)
    with _locked(p):
        state = json.loads(_read(p))
        before = copy.deepcopy(state)
        if absorb_drop_caches(p, state):
            rewrite = True
        yield state
        if rewrite or state != before:
            _write(p, state, views)


# The kernel keeps a floor of free pages (min_free_kbytes and the zone watermarks,
# Documentation/admin-guide/sysctl/vm.rst): reads reclaim older cache below it.
MIN_FREE_KIB = 262_144


def fill_page_cache(state: dict[str, Any], nbytes: int) -> None:
    """File pages read or written stay cached ("Page Cache", Documentation/admin-guide/mm/concepts.rst):
    MemFree falls, MemAvailable does not. The cache grows until only MIN_FREE_KIB is free."""
    room = max(0, mem_free_base_kib(state) - int(state.get("page_cache_kib", 0)) - MIN_FREE_KIB)
    state["page_cache_kib"] = int(state.get("page_cache_kib", 0)) + min(room, max(0, nbytes) // 1024)


def absorb_drop_caches(p: str | os.PathLike[str], state: dict[str, Any]) -> bool:
    """What the node wrote to /proc/sys/vm/drop_caches (bind-mounted from ``drop_caches`` beside
    the state): 1 (page cache) or 3 (page cache, dentries and inodes) empties the page cache;
    2 frees slab objects only (vm.rst, drop_caches). True when the state changed."""
    f = _beside(p, "drop_caches")
    try:
        words = _read(f).split()
    except OSError:
        return False
    if not words:
        return False
    with open(f, "w"):  # in place: the bind mount pins the inode
        pass
    if words[-1] in ("1", "3") and state.get("page_cache_kib"):
        state["page_cache_kib"] = 0
        return True
    return False


def mem_free_base_kib(state: dict[str, Any]) -> int:
    """MemFree with an empty page cache (what render_meminfo shows before file reads)."""
    avail = mem_available_kib(state)
    cached = min(3_407_872, max(0, avail - 1_000_000))
    return max(0, avail - cached - 13252 - 477572 // 2)


def mem_free_kib(state: dict[str, Any]) -> int:
    """MemFree: the free memory less the page cache (never below the kernel's floor)."""
    base = mem_free_base_kib(state)
    return max(min(base, MIN_FREE_KIB), base - int(state.get("page_cache_kib", 0)))


def mem_available_kib(state: dict[str, Any]) -> int:
    held_gib = sum(state["engine_mem_gib"].values()) + state["leaked_mem_gib"]
    return max(0, int(state["mem_idle_available_kib"] - held_gib * 1024 * 1024))


# --------------------------------------------------------------------------
# The /proc views derived from the state (written beside it by ``_write``)
# --------------------------------------------------------------------------


def render_meminfo(state: dict[str, Any]) -> str:
    """A full arm64 6.17 ``/proc/meminfo`` whose MemAvailable follows the state."""
    total = int(state["mem_total_kib"])
    avail = mem_available_kib(state)
    engines_kib = int((sum(state["engine_mem_gib"].values()) + state["leaked_mem_gib"]) * 1024 * 1024)
    buffers, sreclaim, sunreclaim = 13252, 477572, 520360
    cached = min(3_407_872, max(0, avail - 1_000_000))
    free = max(0, avail - cached - buffers - sreclaim // 2)  # mem_free_base_kib
    # The page cache of file reads (fill_page_cache): out of MemFree, into Cached;
    # MemAvailable counts it as reclaimable (mm/page_alloc.c si_mem_available).
    in_cache = free - mem_free_kib(state)
    free, cached = free - in_cache, cached + in_cache
    anon = max(0, min(total - free - cached - buffers - sreclaim - sunreclaim, 1_712_244 + engines_kib))
    shmem = 3028
    huge_kb = 2048 if int(state.get("page_size", 4096)) == 4096 else 524288
    rows: list[tuple[str, int]] = [
        ("MemTotal", total), ("MemFree", free), ("MemAvailable", avail), ("Buffers", buffers),
        ("Cached", cached), ("SwapCached", 0),
        ("Active", anon // 2 + cached // 2), ("Inactive", anon - anon // 2 + cached - cached // 2),
        ("Active(anon)", anon // 2), ("Inactive(anon)", anon - anon // 2),
        ("Active(file)", cached // 2), ("Inactive(file)", cached - cached // 2),
        ("Unevictable", 24640), ("Mlocked", 24640),
        ("SwapTotal", 16777212), ("SwapFree", 16777212), ("Zswap", 0), ("Zswapped", 0),
        ("Dirty", 312), ("Writeback", 0), ("AnonPages", anon), ("Mapped", 612_480), ("Shmem", shmem),
        ("KReclaimable", sreclaim), ("Slab", sreclaim + sunreclaim), ("SReclaimable", sreclaim),
        ("SUnreclaim", sunreclaim), ("KernelStack", 23_168), ("PageTables", 31_412), ("SecPageTables", 0),
        ("NFS_Unstable", 0), ("Bounce", 0), ("WritebackTmp", 0),
        ("CommitLimit", total // 2 + 16777212), ("Committed_AS", 6_903_148 + engines_kib),
        ("VmallocTotal", 133_141_626_880), ("VmallocUsed", 101_620), ("VmallocChunk", 0),
        ("Percpu", 27_520),
    ]
    out = [f"{k + ':':<16}{v:>8} kB" for k, v in rows]
    out.append(f"HardwareCorrupted: {0:>5} kB")
    out += [f"{k + ':':<16}{v:>8} kB" for k, v in (
        ("AnonHugePages", 0), ("ShmemHugePages", 0), ("ShmemPmdMapped", 0),
        ("FileHugePages", 0), ("FilePmdMapped", 0), ("CmaTotal", 131_072), ("CmaFree", 69_320),
    )]
    out += [
        f"HugePages_Total:   {0:>5}",
        f"HugePages_Free:    {0:>5}",
        f"HugePages_Rsvd:    {0:>5}",
        f"HugePages_Surp:    {0:>5}",
        f"Hugepagesize:   {huge_kb:>8} kB",
        f"Hugetlb:        {0:>8} kB",
    ]
    return "\n".join(out) + "\n"


def render_boot_id(state: dict[str, Any]) -> str:
    return f"{state['boot_id']}\n"


ENGINE_PIDS = "engine_pids"


def render_engine_pids(state: dict[str, Any]) -> str:
    """The pids of the engines holding memory, one line (what :func:`settle` checks)."""
    return " ".join(str(p) for p in state.get("engine_mem_gib", {})) + "\n"



# The field report: 6.17.0-1031-nvidia "leaks ~80 GiB on engine death"; 1029 does not.
LEAKY_KERNELS = ("6.17.0-1031-nvidia",)


def pid_alive(pid: int) -> bool:
    """True for a live process: a zombie holds no memory, counts as dead (proc(5): the state is
    the field after the parenthesised comm, which may itself hold ``)`` and spaces)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def settle(state: dict[str, Any]) -> None:
    """Engines that died without giving their memory back: leaked on a leaky kernel
    (or with the ``leak_on_death`` fault), given back otherwise."""
    leaky = state.get("kernel_release") in LEAKY_KERNELS or bool(state.get("faults", {}).get("leak_on_death"))
    for pid, gib in list(state.get("engine_mem_gib", {}).items()):
        if not (str(pid).isdigit() and pid_alive(int(pid))):
            if leaky:
                state["leaked_mem_gib"] = float(state.get("leaked_mem_gib", 0.0)) + float(gib)
            del state["engine_mem_gib"][pid]


def settle_file(path: str | os.PathLike[str] | None) -> None:
    """``settle`` the node's state file, if there is one (called by the shims that stop things)."""
    if path and os.path.isfile(path):
        with edit(path, rewrite=True) as state:
            settle(state)
