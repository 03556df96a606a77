"""A simulated node's Debian packages: ``apt-get install`` and ``dpkg-query -W`` for what sparkctl installs.

SIMULATION ONLY. A fresh DGX OS node (Ubuntu 24.04) has no earlyoom; sparkctl's
``fabric apply`` installs it. The simulated nodes share this machine's /usr,
where the test image may have Debian's earlyoom installed, so the node's
package database is its state file (``packages``), not /var/lib/dpkg:

* ``dpkg-query -W [-f FORMAT] PKG...`` answers from that database only, with
  dpkg-query's own texts (dpkg-query(1); "dpkg-query: no packages found matching
  X", exit 1). ``${db:Status-Status}``, ``${Status}``, ``${Package}`` and
  ``${Version}`` are the fields it knows. Stricter than a real node: every
  package of the base image is unknown here.
* ``apt-get update`` (root) changes nothing: the simulated lists are always current.
* The dpkg frontend lock: a fresh node (``sparkctl sim up --dpkg-lock-s N``) has it held by
  a simulated unattended-upgrades for N (simulated) seconds after its first boot, as a
  fresh Ubuntu box does. ``apt-get install`` takes it as apt does (apt-pkg/deb/debsystem.cc
  ``debSystem::Lock``/``GetLockMaybeWait``, apt-pkg/contrib/fileutl.cc ``GetLock``):
  without ``-o DPkg::Lock::Timeout=S`` (default 0) it fails at once, exit 100, with apt's
  two errors; with it, it retries once a second for S seconds, printing "Waiting for cache
  lock: ..." each time unless ``-qq`` (OpTextProgress shows nothing at quiet >= 2), then
  fails with the second error alone. tests/test_real_tools.py holds a real lock against the
  real apt-get and compares the texts. The second counts SIMULATED time: one real second
  is ``speedup`` of them (the lock record's, from SPARKCTL_SIM_SPEEDUP at ``sim up``).
* ``apt-get install [-y] [-q...] [--no-install-recommends] PKG...`` needs root
  (the dpkg frontend lock, as apt-get says it) and knows one package, earlyoom:
  it writes what Debian's package installs (the unit, the conffile
  /etc/default/earlyoom with Debian's own ``EARLYOOM_ARGS="-r 3600"``, kept when
  present, as dpkg keeps a conffile) and does what its maintainer scripts do:
  ``deb-systemd-helper enable`` and start (dh_installsystemd's default for a
  unit with [Install]). Any other package: "E: Unable to locate package X", exit 100.
  The unit goes to the node's unit directory ($SPARKCTL_SIM_UNIT_DIR, the only
  one the simulated systemctl reads), where a real node has it under
  /lib/systemd/system; ``/usr/bin/earlyoom`` resolves to the node's stand-in
  (:mod:`sparkctl_sim.earlyoomsim`), never to this machine's binary, which
  would watch this machine's processes.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from sparkctl_sim import nodestate
from sparkctl_sim.envnames import PREFIX_ENV, STATE_ENV, UNIT_DIR_ENV

# Ubuntu 24.04 (noble) arm64: earlyoom 1.7-1 (packages.ubuntu.com/noble/earlyoom).
# The unit and the conffile are Debian's earlyoom 1.7 files as `dpkg -L earlyoom` lists
# them (/lib/systemd/system/earlyoom.service, /etc/default/earlyoom), verbatim.
EARLYOOM_VERSION = "1.7-1"
EARLYOOM_UNIT = """[Unit]
Description=Early OOM Daemon
Documentation=man:earlyoom(1) https://github.com/rfjakob/earlyoom

[Service]
EnvironmentFile=-/etc/default/earlyoom
ExecStart=/usr/bin/earlyoom $EARLYOOM_ARGS
# Run as an unprivileged user with random user id
DynamicUser=true
# Allow killing processes and calling mlockall()
AmbientCapabilities=CAP_KILL CAP_IPC_LOCK
# We don't need write access anywhere
ProtectSystem=strict
# We don't need /home at all, make it inaccessible
ProtectHome=true
# earlyoom never exits on it's own, so have systemd
# restart it should it get killed for some reason.
Restart=always
# set memory limits and max tasks number
TasksMax=10
MemoryMax=50M

[Install]
WantedBy=multi-user.target
"""
EARLYOOM_DEFAULT = """# Default settings for earlyoom. This file is sourced by /bin/sh from
# /etc/init.d/earlyoom or by systemd from earlyoom.service.

# Options to pass to earlyoom
EARLYOOM_ARGS="-r 3600"

# Examples:

# Print memory report every second instead of every minute
# EARLYOOM_ARGS="-r 1"

# Available minimum memory 5%
# EARLYOOM_ARGS="-m 5"

# Available minimum memory 15% and free minimum swap 5%
# EARLYOOM_ARGS="-m 15 -s 5"

# Avoid killing processes whose name matches this regexp
# EARLYOOM_ARGS="--avoid '(^|/)(init|X|sshd|firefox)$'"

# See more at `earlyoom -h'
"""
KNOWN = {"earlyoom": EARLYOOM_VERSION}
LOCK_FRONTEND = "/var/lib/dpkg/lock-frontend"
# unattended-upgrades' process name as /proc/PID/comm has it (15 characters at most), as apt
# prints it; the pid is fictional (the simulated holder is a record, not a process).
UNATTENDED_COMM = "unattended-upgr"
UNATTENDED_PID = 1187


def hold_lock_at_first_boot(state: dict[str, object], seconds: float, speedup: float, now: float) -> None:
    """unattended-upgrades holds the dpkg lock for ``seconds`` (simulated) from ``now``, this boot only."""
    state["dpkg_lock"] = {"pid": UNATTENDED_PID, "comm": UNATTENDED_COMM, "boot_id": state.get("boot_id"),
                          "until": now + seconds / speedup, "speedup": speedup}


def lock_holder(state: dict[str, object], now: float) -> dict[str, object] | None:
    lk = state.get("dpkg_lock")
    if not isinstance(lk, dict) or lk.get("boot_id") != state.get("boot_id"):
        return None  # a reboot ended it
    return lk if now < float(lk.get("until", 0)) else None


def _options(args: Sequence[str]) -> tuple[list[str], dict[str, str], int]:
    """apt's command line (apt-pkg/contrib/cmndline.cc): words, ``-o KEY=VALUE`` (keys are
    case-insensitive), and the quiet level (-q, -qq, -q=N)."""
    words: list[str] = []
    opts: dict[str, str] = {}
    quiet = 0
    it = iter(args)
    for a in it:
        if a in ("-o", "--option"):
            kv = next(it, "")
        elif a.startswith("-o") and not a.startswith("--"):
            kv = a[2:].lstrip("=")
        elif a.startswith("--option="):
            kv = a.partition("=")[2]
        elif a.startswith("-q=") or a.startswith("--quiet="):
            quiet = int(a.partition("=")[2] or 0)
            continue
        elif re.fullmatch(r"-q+", a):
            quiet += len(a) - 1
            continue
        elif a == "--quiet":
            quiet += 1
            continue
        else:
            if not a.startswith("-"):
                words.append(a)
            continue
        key, _, val = kv.partition("=")
        opts[key.lower()] = val
    return words, opts, quiet


def _take_lock(state_path: str, timeout_s: int, quiet: int) -> bool:
    """debSystem::Lock on the frontend lock: False (messages printed) when it stays held."""
    held = lock_holder(nodestate.load(state_path), time.time())
    if held is None:
        return True
    busy = f"Could not get lock {LOCK_FRONTEND}. It is held by process {held['pid']} ({held['comm']})"
    refused = (f"E: Unable to acquire the dpkg frontend lock ({LOCK_FRONTEND}), "
               "is another process using it?")
    if timeout_s <= 0:
        print(f"E: {busy}\n{refused}", file=sys.stderr)
        return False
    step_s = 1.0 / float(held.get("speedup") or 1.0)
    for _ in range(timeout_s):  # GetLockMaybeWait: try, say so, sleep one second
        if lock_holder(nodestate.load(state_path), time.time()) is None:
            return True
        if quiet < 2:
            print(f"Waiting for cache lock: {busy}...", flush=True)
        time.sleep(step_s)
    if lock_holder(nodestate.load(state_path), time.time()) is None:
        return True
    print(refused, file=sys.stderr)
    return False


def installed(state: dict[str, object]) -> dict[str, str]:
    pk = state.get("packages")
    return dict(pk) if isinstance(pk, dict) else {}


def lay_down(name: str, root: str, unit_dir: str) -> list[str]:
    """Write the package's files under the node's root; the unit names to enable. No state."""
    if name != "earlyoom":
        return []
    conf = Path(root, "etc/default/earlyoom")
    conf.parent.mkdir(parents=True, exist_ok=True)
    if not conf.exists():  # a conffile the admin has is kept (dpkg's conffile handling)
        conf.write_text(EARLYOOM_DEFAULT)
    Path(unit_dir).mkdir(parents=True, exist_ok=True)
    Path(unit_dir, "earlyoom.service").write_text(EARLYOOM_UNIT)
    return ["earlyoom.service"]


def _format(fmt: str, name: str, version: str | None) -> str:
    fields = {"Package": name, "Version": version or "",
              "db:Status-Status": "installed" if version else "not-installed",
              "Status": "install ok installed" if version else "unknown ok not-installed"}
    out = re.sub(r"\$\{([^}]+)\}", lambda m: fields.get(m.group(1), ""), fmt)
    return out.replace("\\n", "\n").replace("\\t", "\t")


def dpkg_query(args: Sequence[str], state: dict[str, object]) -> tuple[str, str, int]:
    fmt, names, show = "${Package}\t${Version}\n", [], False
    it = iter(args)
    for a in it:
        if a in ("-W", "--show"):
            show = True
        elif a in ("-f", "--showformat"):
            fmt = next(it, "")
        elif a.startswith("--showformat="):
            fmt = a.partition("=")[2]
        elif a.startswith("-f") and len(a) > 2:
            # dpkg's own option parser (lib/dpkg/options.c, dpkg_options_parse): a short
            # option's value is the rest of its word, so "-f=X" is the format "=X"
            fmt = a[2:]
        elif a.startswith("-"):
            return "", f"dpkg-query: error: unknown option {a}\n(not simulated)\n", 2
        else:
            names.append(a)
    if not show:
        return "", "dpkg-query: only -W is simulated\n", 2
    have = installed(state)
    out, err, rc = [], [], 0
    for n in names:
        if n not in have:
            err.append(f"dpkg-query: no packages found matching {n}\n")
            rc = 1
        else:
            out.append(_format(fmt, n, have[n]))
    return "".join(out), "".join(err), rc


def apt_get(args: Sequence[str], state_path: str, *, euid: int, root: str, unit_dir: str) -> int:
    words, opts, quiet = _options(args)
    if not words:
        print("E: No operation specified", file=sys.stderr)
        return 100
    op, pkgs = words[0], words[1:]
    if op == "update":  # the package lists: nothing to fetch here (no network), they are current
        if euid != 0:
            print("E: Could not open lock file /var/lib/apt/lists/lock - open (13: Permission denied)",
                  file=sys.stderr)
            return 100
        return 0
    if op != "install":
        print(f"E: simulated apt-get: only install is simulated (got {op})", file=sys.stderr)
        return 100
    if euid != 0:
        print("E: Could not open lock file /var/lib/dpkg/lock-frontend - open (13: Permission denied)\n"
              "E: Unable to acquire the dpkg frontend lock (/var/lib/dpkg/lock-frontend), are you root?",
              file=sys.stderr)
        return 100
    try:
        timeout_s = int(opts.get("dpkg::lock::timeout", "0"))
    except ValueError:
        timeout_s = 0  # apt's FindI: a value that is not a number reads as the default
    if not _take_lock(state_path, timeout_s, quiet):
        return 100
    for p in pkgs:
        if p not in KNOWN:
            print(f"E: Unable to locate package {p}", file=sys.stderr)
            return 100
    new: list[str] = []
    with nodestate.edit(state_path) as s:
        have = installed(s)
        for p in pkgs:
            if p in have:
                print(f"{p} is already the newest version ({have[p]}).")
            else:
                have[p] = KNOWN[p]
                new.append(p)
        s["packages"] = have
    for p in new:
        print(f"Setting up {p} ({KNOWN[p]}) ...")
        for unit in lay_down(p, root, unit_dir):
            # the maintainer scripts: deb-systemd-helper enable, then deb-systemd-invoke start
            subprocess.run(["systemctl", "enable", unit], check=False, capture_output=True)
            r = subprocess.run(["systemctl", "start", unit], check=False, capture_output=True, text=True)
            if r.returncode != 0:
                print(f"{p}: starting {unit} failed: {r.stderr.strip()}", file=sys.stderr)
    return 0


def preinstall(state_path: str, root: str, unit_dir: str, seen_unit_dir: str, name: str = "earlyoom") -> None:
    """A pre-configured node (``sim up --ready``): the package installed and enabled, before its boot.

    ``root``/``unit_dir`` are where this machine writes the node's files; ``seen_unit_dir`` is
    the unit directory as the node sees it (the enable link's target, as `systemctl enable`
    makes it)."""
    with nodestate.edit(state_path) as s:
        have = installed(s)
        if name in have:
            return
        have[name] = KNOWN[name]
        s["packages"] = have
    for unit in lay_down(name, root, unit_dir):
        wants = Path(unit_dir, "multi-user.target.wants")
        wants.mkdir(parents=True, exist_ok=True)
        link = wants / unit
        if not link.is_symlink():
            link.symlink_to(Path(seen_unit_dir, unit))


def main(tool: str, args: Sequence[str]) -> int:
    path = os.environ.get(STATE_ENV, "")
    if not path:
        print(f"{tool}: {STATE_ENV} is not set (simulated node state file)", file=sys.stderr)
        return 127
    if tool == "dpkg-query":
        out, err, rc = dpkg_query(args, nodestate.load(path))
        sys.stdout.write(out)
        sys.stderr.write(err)
        return rc
    unit_dir = os.environ.get(UNIT_DIR_ENV, "")
    if not unit_dir:
        print(f"apt-get: {UNIT_DIR_ENV} is not set", file=sys.stderr)
        return 100
    return apt_get(args, path, euid=os.geteuid(), root=os.environ.get(PREFIX_ENV) or "/", unit_dir=unit_dir)
