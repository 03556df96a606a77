"""The memory watchdog sparkctl configures on every node: earlyoom's arguments and file. Pure.

GB10 memory is unified and an over-commit livelocks the box with no OOM kill
(docs/reference/spark-facts.md; the field report's UVM law), so a userspace
watchdog must kill the engine before the kernel is starved. earlyoom (Debian and
Ubuntu package ``earlyoom``; rfjakob/earlyoom README and ``earlyoom -h``, v1.7):

* ``-M SIZE[,KILL_SIZE]``: SIGTERM the chosen process once MemAvailable is below
  SIZE KiB, SIGKILL below KILL_SIZE;
* ``-s PERCENT``: free swap minimum; "both memory and swap must be below minimum
  for earlyoom to act", so ``-s 100,100`` makes memory alone decide;
* ``--prefer REGEX`` / ``--avoid REGEX``: matched against the process name
  (``/proc/PID/comm``, at most 15 characters), not the command line;
* ``-r INTERVAL``: the memory report interval (Debian's default file: 3600).

Debian's unit runs ``ExecStart=/usr/bin/earlyoom $EARLYOOM_ARGS`` with
``EnvironmentFile=-/etc/default/earlyoom``: systemd splits the unquoted variable
at whitespace and does not interpret quotes in it, so every argument here is a
single word without quotes or spaces.
"""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING

from sparkctl.model import paths

if TYPE_CHECKING:  # the watchdog fact imports INSTALLED_TEST on a node, without pydantic
    from sparkctl.model.schema import LawsSpec

# The engines' process names (comm): vLLM renames its workers (VLLM::EngineCore,
# VLLM::Worker), SGLang's are python3, llama.cpp's is llama-server.
PREFER = "^(python3?|python3[.][0-9]+|VLLM::.*|vllm|sglang.*|llama-server|ds41f|tensorfold)$"
# What must survive: the way in (sshd), init and the container runtime, earlyoom itself.
AVOID = "^(sshd|systemd|systemd-.*|init|dockerd|containerd.*|earlyoom|sudo)$"
REPORT_INTERVAL_S = 60
KIB_PER_GIB = 1024 * 1024


def thresholds_kib(law: LawsSpec) -> tuple[int, int]:
    """(SIGTERM, SIGKILL) MemAvailable in KiB: half and a quarter of the profile's floor.

    ``laws.min_free_gib`` is what the memory_guard law keeps free while serving
    (10-15 GiB advised); the watchdog acts only well below it, when the floor is
    already lost and the livelock is near."""
    term = int(law.min_free_gib * KIB_PER_GIB / 2)
    return term, term // 2


def earlyoom_args(law: LawsSpec) -> tuple[str, ...]:
    term, kill = thresholds_kib(law)
    return ("-M", f"{term},{kill}", "-s", "100,100", "-r", str(REPORT_INTERVAL_S), "--prefer", PREFER, "--avoid", AVOID)


def render_default(law: LawsSpec) -> str:
    """The text of /etc/default/earlyoom (sparkctl.model.paths.EARLYOOM_DEFAULT)."""
    return ("# Written by sparkctl from the profile's memory limits (laws.min_free_gib): the engine\n"
            "# is killed first, sshd never. See sparkctl/model/watchdog.py.\n"
            f'EARLYOOM_ARGS="{" ".join(earlyoom_args(law))}"\n')


UNIT = "earlyoom.service"
PACKAGE = "earlyoom"
# dpkg-query(1): ${db:Status-Status} is "installed" for an installed package; it prints
# nothing and exits 1 for one dpkg never knew (sparkctl.facts.watchdog reads the same).
INSTALLED_TEST = "[ \"$(dpkg-query -W --showformat='${db:Status-Status}' earlyoom 2>/dev/null)\" = installed ]"


# On a fresh box unattended-upgrades holds the dpkg frontend lock for minutes after the first
# boot, and apt-get does not wait for it by default: "DPkg::Lock::Timeout" is 0 (apt
# apt-pkg/deb/debsystem.cc debSystem::Lock; only the `apt` binary defaults to waiting,
# apt-private/private-cmndline.cc), so it fails at once with "Could not get lock
# /var/lib/dpkg/lock-frontend. It is held by process N (unattended-upgr)" (exit 100). With
# the option set it retries once a second up to that many seconds (GetLockMaybeWait, apt >= 1.9.11).
DPKG_LOCK_TIMEOUT_S = 300
APT_GET = f"apt-get -o DPkg::Lock::Timeout={DPKG_LOCK_TIMEOUT_S}"


def install_command() -> str:
    """Install Debian's earlyoom when dpkg does not have it (root), waiting (bounded) for the
    dpkg lock. Its maintainer scripts enable and start the unit with Debian's arguments;
    :func:`configure_command` sets ours."""
    install = f"DEBIAN_FRONTEND=noninteractive {APT_GET} install -y -qq --no-install-recommends {PACKAGE}"
    # apt-get -qq prints nothing while it waits (apt's OpTextProgress shows no progress at
    # quiet >= 2): say it here, where the step's output keeps it
    say = (f"echo 'installing {PACKAGE}: apt-get waits up to {DPKG_LOCK_TIMEOUT_S} s for the dpkg lock "
           "(unattended-upgrades holds it for minutes after a fresh box boots)' >&2")
    # a box whose package lists are stale or empty ("Unable to locate package"): refresh once, retry
    return f"if ! {INSTALLED_TEST}; then {say}; {install} || {{ {APT_GET} update -qq && {install}; }}; fi"


def configure_command(law: LawsSpec, prefix: str) -> str:
    """Write /etc/default/earlyoom when its text differs (atomically), enable the unit and
    restart it when the file changed or it does not run. Prints ``configured`` or ``kept``."""
    conf = shlex.quote(paths.under(prefix, paths.EARLYOOM_DEFAULT))
    text = shlex.quote(render_default(law))
    return "\n".join([
        "set -e",
        f"{INSTALLED_TEST} || {{ echo 'earlyoom is not installed: run sparkctl fabric apply' >&2; exit 3; }}",
        f"f={conf}",
        f'if printf %s {text} | cmp -s - "$f"; then changed=0; else',
        f'  printf %s {text} > "$f.sparkctl-tmp"; chmod 644 "$f.sparkctl-tmp"; mv -f "$f.sparkctl-tmp" "$f"; changed=1; fi',
        f"systemctl enable {UNIT} >/dev/null 2>&1",
        f'if [ "$changed" = 1 ] || ! systemctl is-active --quiet {UNIT}; then systemctl restart {UNIT}; '
        "echo configured; else echo kept; fi",
    ])
