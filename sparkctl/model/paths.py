"""Every path sparkctl keeps on a node, in one place. Pure.

Paths are written as on a real DGX Spark; a node's ``prefix`` (the inventory's
``prefix:``, ``/`` on real boxes, a per-node directory on the simulated
cluster) is put in front by :func:`under`. Nothing else in the product spells
``/var/lib/sparkctl`` or ``/var/log/sparkctl``.
"""

from __future__ import annotations

import hashlib
import posixpath

STATE_DIR = "/var/lib/sparkctl"  # systemd's StateDirectory=sparkctl
LOG_DIR = "/var/log/sparkctl"  # systemd's LogsDirectory=sparkctl
ETC_DIR = "/etc/sparkctl"
OPT_DIR = "/opt/sparkctl"
UNIT_DIR = "/etc/systemd/system"

# rendered per node
ENV_FILE = f"{ETC_DIR}/engine.env"
MANIFEST = f"{ETC_DIR}/manifest.json"
LAUNCH = f"{OPT_DIR}/launch.sh"
DETACHED = f"{OPT_DIR}/run-detached.sh"
UNIT = f"{UNIT_DIR}/sparkctl-engine.service"
CLOCK_UNIT = f"{UNIT_DIR}/sparkctl-clock-cap.service"
NETPLAN = "/etc/netplan/60-sparkctl-fabric.yaml"
SYSCTL = "/etc/sysctl.d/60-sparkctl-forward.conf"
FORWARD_UNIT = f"{UNIT_DIR}/sparkctl-fabric-forward.service"  # fabric filter: INPUT; DOCKER-USER on relays
NETPLAN_DIR = "/etc/netplan"
SYSCTL_DIR = "/etc/sysctl.d"
# Debian's earlyoom package: its unit reads EARLYOOM_ARGS from here (EnvironmentFile=-/etc/default/earlyoom)
EARLYOOM_DEFAULT = "/etc/default/earlyoom"

# state
RECORD = f"{STATE_DIR}/record.json"  # the run record of the stack "default" (the one record before stacks)
STACKS_DIR = f"{STATE_DIR}/stacks"  # the run record of every other stack: stacks/<name>.json
LOCKS_DIR = f"{STATE_DIR}/locks"  # one lock dir per node: locks/<node>.d (sparkctl.ops.lock)
LOCK_DIR = f"{STATE_DIR}/lock.d"  # the one cluster lock before stacks: only `unlock` still removes it
CLOCK_LOCK = f"{STATE_DIR}/clock-lock"  # "<boot id> <MHz>": see sparkctl.model.clocklock
ENGINE_LOG = f"{LOG_DIR}/engine.log"
# the last verdict of every law, kept per stack by the check step of `up`/`switch` (status and the exporter
# read them): laws.json for the stack "default" (the one file before stacks), laws/<name>.json for the others
LAWS_VERDICTS = f"{STATE_DIR}/laws.json"
LAWS_DIR = f"{STATE_DIR}/laws"
FABRIC_BACKUP = f"{STATE_DIR}/fabric-backup"  # what `fabric apply` replaced; `fabric restore` puts it back

# the supervised switch (runs on the head)
SUPERVISOR_PLAN = f"{STATE_DIR}/supervisor-plan.json"
SUPERVISOR_RUNNER = f"{OPT_DIR}/planrun.py"
SUPERVISOR_PROBE = f"{OPT_DIR}/endpoint_probe.py"  # the readiness probe the runner imports, beside it
SUPERVISOR_PUTFILES = f"{OPT_DIR}/putfiles.py"  # and the file writer it shares with the transport
SUPERVISOR_EVENTS = f"{STATE_DIR}/supervisor.jsonl"
SUPERVISOR_PID = f"{STATE_DIR}/supervisor.pid"
SUPERVISOR_LOG = f"{LOG_DIR}/supervisor.log"
SUPERVISOR_KEY = f"{STATE_DIR}/id_supervisor"
SUPERVISOR_KNOWN_HOSTS = f"{STATE_DIR}/known_hosts"
NODE_AUTHORIZED_KEYS = f"{ETC_DIR}/authorized_keys"
# image sync's node-to-node key (sparkctl.ops.nodessh IMAGE_SYNC): its own key, and the forced command on the peers
IMAGE_SYNC_KEY = f"{STATE_DIR}/id_image_sync"
IMAGE_SYNC_KNOWN_HOSTS = f"{STATE_DIR}/known_hosts.image-sync"
IMAGE_SYNC_GATE = f"{OPT_DIR}/image-sync-gate.sh"

# facts kept per image ID (an image's NCCL never changes): sparkctl.facts.nccl
NCCL_CACHE_DIR = f"{STATE_DIR}/nccl-by-image"

# the gateway (sparkctl.model.gateway): smg unpacked per release, its files, the ctl beside them
GATEWAY_DIR = f"{OPT_DIR}/gateway"  # <release>/site: the unpacked wheels; wheels/: the pushed files
GATEWAY_ENV = f"{ETC_DIR}/gateway.env"
GATEWAY_CONFIG = f"{ETC_DIR}/gateway.json"
GATEWAY_LAUNCH = f"{OPT_DIR}/gateway-launch.sh"
GATEWAY_CTL = f"{OPT_DIR}/gateway_ctl.py"
GATEWAY_UNIT = f"{UNIT_DIR}/sparkctl-gateway.service"
GATEWAY_LOG = f"{LOG_DIR}/gateway.log"
# on a gateway node that is not the state node: a copy of each stack's record whose gateway runs there, written
# by the same record step (sparkctl.plan.planner.record_step's mirror), read by the unit's rebuild
GATEWAY_RECORDS = f"{STATE_DIR}/gateway-records"
# the node's exporter (sparkctl.node.exporter): its code, the pinned wheels, its configuration, its unit
EXPORTER_DIR = f"{OPT_DIR}/exporter"
EXPORTER_CONFIG = f"{ETC_DIR}/exporter.json"
EXPORTER_UNIT = f"{UNIT_DIR}/sparkctl-exporter.service"

# weights
WEIGHTS_AGENT = f"{OPT_DIR}/weights_agent.py"
WEIGHTS_JOBS = f"{OPT_DIR}/weights"


DEFAULT_STACK = "default"


def record_path(stack: str) -> str:
    """Where a stack's run record lives on the state node (the inventory's first node).

    The stack ``default`` keeps the path of the one record sparkctl kept before it ran
    several stacks, so such a record is read as that stack, unchanged."""
    return RECORD if stack == DEFAULT_STACK else f"{STACKS_DIR}/{stack}.json"


def laws_path(stack: str) -> str:
    """Where a stack's laws' verdicts live on the state node: beside its record, as :func:`record_path`
    (the stack ``default`` keeps ``laws.json``, the one file before stacks, so an older one reads as its)."""
    return LAWS_VERDICTS if stack == DEFAULT_STACK else f"{LAWS_DIR}/{stack}.json"


def gateway_record_path(stack: str) -> str:
    """The copy of a stack's record on its gateway's node (when that is not the state node)."""
    return f"{GATEWAY_RECORDS}/{stack}.json"


def node_lock_dir(node: str) -> str:
    """The lock of one node (a node name matches the schema's NAME_RE: a safe file name)."""
    return f"{LOCKS_DIR}/{node}.d"


# A lock scope's key for a served name (beside node names): ``up``/``switch`` claim the name they
# will serve, so two stacks on disjoint nodes cannot both start serving it (sparkctl.ops.executor.lock_scope).
NAME_KEY = "name:"


def name_lock_dir(served_name: str) -> str:
    """The claim of one served name: ``locks/name-<sha256[:16]>.d`` (a served name is any string: hashed)."""
    return f"{LOCKS_DIR}/name-{hashlib.sha256(served_name.encode()).hexdigest()[:16]}.d"


def under(prefix: str, path: str) -> str:
    """``path`` inside a node's filesystem prefix (``/`` on real nodes)."""
    if prefix in ("", "/"):
        return path
    return posixpath.join(prefix, path.lstrip("/"))
