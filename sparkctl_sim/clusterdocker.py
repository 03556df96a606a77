"""A container that outlives its `docker run`: the ``orphan-container`` fault.

``docker run`` (no ``-d``) is a client: the container is dockerd's and containerd's
(a child of its containerd-shim, in its own cgroup), and the CLI only attaches to it and
forwards the signals it catches (``--sig-proxy``, default true: docker/cli
cli/command/container/run.go and signals.go ``ForwardAllSignals``). A SIGKILL cannot be
caught, so nothing is forwarded: the CLI dies and the container keeps running under
its name, with its ``--rm`` pending until it exits (moby daemon/monitor.go: the daemon
removes an AutoRemove container when it exits). That happens when the OOM killer or
an operator's ``kill -9`` picks the CLI, or when systemd's stop timeout SIGKILLs the
unit's cgroup (the container is not in it). The next ``docker run --name`` of the same
name is refused: "Conflict. The container name "/X" is already in use by container
"ID". You have to remove (or rename) that container to be able to reuse that name."
(moby daemon/names.go reserveName, daemon/errors.go nameConflictError; the simulated
docker refuses it the same way: sparkctl_sim.dockershim.docker_run).

In the sim the foreground CLI is the container's monitor: the fault SIGKILLs it and
leaves the container's process (its own session) running; its record stays
"running" (sparkctl_sim.dockershim.Containers), and stays after it exits (stricter
than dockerd's auto-removal: the name is still taken).

SIMULATION ONLY.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from sparkctl.model.engines import ENGINE_CONTAINER
from sparkctl_sim.clusterroot import _ctx, _find_node, _root_lock
from sparkctl_sim.netns import SimError
from sparkctl_sim.shimbase import Containers, _alive


def orphan_container(root: Path, node: str, name: str = ENGINE_CONTAINER) -> str:
    """SIGKILL the ``docker run`` CLI of container ``name`` on ``node``; return the container's id."""
    p, spec, _rootless = _ctx(root)
    _find_node(spec, node)
    with _root_lock(p):
        store = Containers(p.node(node).run)
        rec = store.find(name)
        if rec is None or rec.get("status") != "running":
            raise SimError(f"{node}: no running container {name!r}", "start the stack first (`sparkctl up`)")
        cli = rec.get("monitor_pid")
        if rec.get("detach") or not _alive(cli, rec.get("monitor_start")):
            raise SimError(f"{node}: container {name!r} has no `docker run` CLI attached to it")
        os.kill(int(cli), signal.SIGKILL)
    return str(rec["id"])[:12]
