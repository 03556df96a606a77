"""`docker` and `systemctl` stand-ins for the simulated nodes.

SIMULATION ONLY. The simulated Spark nodes have neither a Docker engine nor
systemd, yet sparkctl renders real ``docker run`` command lines and real unit
files. These shims execute those artefacts faithfully as plain processes, so an
end-to-end test proves that what was rendered is what a real node would accept:

* ``docker run`` parses docker's real flags, refuses unknown ones the way the
  docker CLI does (exit 125, ``unknown flag: --x``) and refuses to start any
  image without the four settings a multi-node engine needs on a Spark
  (``--network host``, ``--ipc host``, ``--device /dev/infiniband``,
  ``--ulimit memlock=-1``). A container is a process in its own session; its
  environment is the caller's plus ``--env-file`` and ``-e`` values (no shell
  ever sees them).
* ``systemctl`` reads unit files from ``$SPARKCTL_SIM_UNIT_DIR``, parses them
  with systemd's rules (quoting, ``$VAR``/``${VAR}`` expansion, environment
  files) and supervises ``Type=simple|exec`` services in a detached supervisor
  process; ``Type=oneshot`` runs synchronously.

State (container and unit records, logs) lives under ``$SPARKCTL_SIM_RUN_DIR``
(one per node). Records are JSON files written atomically (temp + rename) under
an ``flock``. Standard library only: the shims start on every call, so they
must start fast.

What this module must not do: import anything from the non-simulation code
paths, or talk to the network.

Deliberate differences from the real tools (documented, not accidental):

docker
  - No images, layers or mount namespace: the command runs on the node's own
    filesystem, so ``-v a:b`` is recorded and honest only when ``a == b`` (as
    sparkctl renders it). ``-w DIR`` must exist on the node.
  - Images live in a per-node store with real IDs, tags and digests
    (sparkctl_sim.dockerimages): ``docker run`` of an image not in it is
    refused with docker's own text (a pull the simulated registry refuses);
    ``sparkctl sim image load`` stands in for "the operator built it here".
    An image's entrypoint, cmd, env and workdir come from its config.
  - ``docker logs`` replays one merged stdout+stderr log.
  - ``--ulimit memlock`` is applied with ``setrlimit`` when permitted;
    ``--gpus``, ``--runtime``, ``--cap-add``, ``--shm-size`` and ``--init`` are
    validated and recorded only.
systemctl
  - Unit processes get systemd's clean environment, except that ``PATH``,
    ``HOME``, ``PYTHONPATH``, ``LANG``/``LC_ALL``/``TZ``, ``PYENV_*`` and every
    ``SPARKCTL_SIM_*`` variable are passed through from the caller (simulation
    plumbing; override the list with ``$SPARKCTL_SIM_SERVICE_PASSENV``).
  - A "control group" is the main process's process group: a child that calls
    ``setsid`` escapes it (as a docker container escapes a unit's cgroup).
  - Absolute paths ``/usr/bin/X``, ``/usr/sbin/X``, ``/bin/X``, ``/sbin/X`` of
    shimmed tools (``nvidia-smi``, ``docker``, ``systemctl`` and the names in
    ``$SPARKCTL_SIM_SHIMMED_TOOLS``) are resolved on ``PATH`` instead, so
    ``ExecStart=/usr/bin/nvidia-smi -lgc 0,2000`` reaches the node's shim.
  - ``StandardOutput=append:|file:|truncate:PATH`` into a directory that does not
    exist fails the command with status 209/STDOUT (210/STDERR), checked BEFORE
    ``LogsDirectory=``/``StateDirectory=``/``RuntimeDirectory=``/``CacheDirectory=``/
    ``ConfigurationDirectory=`` are created, in systemd's own order (see
    :func:`_open_output`). Those directories are created under the node's root
    (``$SPARKCTL_SIM_PREFIX``, ``/`` on a namespaced node), as systemd creates
    ``/var/log/NAME`` etc.
  - ``TimeoutStopSec`` is capped at 10 s; ``User=``/``Group=`` are recorded
    and ignored; ``Restart=on-failure|always`` restarts with ``RestartSec``
    (default 100 ms) up to 5 times in 10 s.
  - Command lines: quoting, C escapes, ``$$``, ``${VAR}`` inside words, and
    ``$VAR`` as a whole word (split on whitespace) are implemented; the
    prefixes ``-``, ``@``, ``:``, ``+``, ``!``, ``!!`` are understood (the
    privilege ones are no-ops). Unsupported: ``;``-separated command lists on
    one line, specifiers other than ``%% %n %N %p %i %t``, drop-in directories,
    templates (``foo@.service``), ``Type=forking|notify|dbus``.

The code, by module: shimbase (environment, records, processes), dockershim
(``docker run``), dockerimages (the image store and its verbs), dockerps (the container verbs and docker's dispatcher),
systemdunits (systemd's file formats and the unit store), systemdexec (how a
unit's process is started), systemctlshim (the supervisor and systemctl's
verbs). This module keeps the entry point ``python -m sparkctl_sim.procshims
docker|systemctl ARGS`` and the wrappers that call it.
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from sparkctl_sim.shimbase import PREFIX_ENV, RUN_DIR_ENV, UNIT_DIR_ENV, ShimError

# Each verb imports only its own tool's modules (`systemctl` never loads docker's image store):
# every call starts a fresh `python3 -S`. The parsers are re-exported lazily (PEP 562).
_LAZY = {"parse_docker_env_file": "dockershim", "parse_docker_run": "dockershim",
         **dict.fromkeys(("expand_systemd_argv", "parse_systemd_env_file", "parse_timespan_s", "parse_unit",
                          "split_systemd_words"), "systemdunits")}

__all__ = ["PREFIX_ENV", "RUN_DIR_ENV", "UNIT_DIR_ENV", "ShimError", "install_procshims", "main", *sorted(_LAZY)]


def __getattr__(name: str) -> object:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"sparkctl_sim.{_LAZY[name]}"), name)


# ===========================================================================
# entry points


def install_procshims(bin_dir: Path, python: str = sys.executable) -> list[Path]:
    """Write ``docker`` and ``systemctl`` sh wrappers into ``bin_dir``.

    The wrappers run this module with an absolute interpreter and put the
    directory that holds the ``sparkctl`` package on ``PYTHONPATH``, so they
    work in a clean environment (an SSH session, a systemd unit).
    """
    from sparkctl_sim.shims.rendered import DOCKER_LINES, VIEWS_DIR, pick_view
    from sparkctl_sim.unitsh import DOCKER_SH, JOURNALCTL_SH, SYSTEMCTL_SH  # lines answered in sh

    bin_dir.mkdir(parents=True, exist_ok=True)
    # docker's node-state-only lines answer from the views of the state beside the run dir, the one
    # dockerimages.store_kind reads (sparkctl_sim.shims.rendered)
    views = f'"${{SPARKCTL_SIM_RUN_DIR%/*}}/{VIEWS_DIR}'
    docker_fast = (pick_view(DOCKER_LINES, views + '/docker.$k.sh"')
                   + f'f={views}/docker-images.sh"; [ "$1" = image ] && [ -r "$f" ] && . "$f"\n' + DOCKER_SH)
    package_root = str(Path(__file__).resolve().parents[1])
    written = []
    for tool in ("docker", "systemctl", "journalctl"):
        path = bin_dir / tool
        body = (
            "#!/bin/sh\n"
            "# sparkctl SIMULATION shim: see sparkctl_sim/procshims.py\n"
            f"PYTHONPATH={shlex.quote(package_root)}${{PYTHONPATH:+:$PYTHONPATH}}\n"
            "export PYTHONPATH\n"
            + {"docker": docker_fast, "systemctl": SYSTEMCTL_SH, "journalctl": JOURNALCTL_SH}[tool]
            + f"exec {shlex.quote(python)} -S -m sparkctl_sim.procshims {tool} \"$@\"\n"
        )
        tmp = path.with_name(f".{tool}.tmp")
        tmp.write_text(body, encoding="utf-8")
        tmp.chmod(0o755)
        os.replace(tmp, path)
        written.append(path)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    """Dispatch ``docker ARGS`` or ``systemctl ARGS``; returns the exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in ("docker", "systemctl", "journalctl"):
        print("usage: python3 -m sparkctl_sim.procshims docker|systemctl|journalctl ARGS...", file=sys.stderr)
        return 2
    tool, rest = args[0], args[1:]
    if tool == "journalctl":  # the unit journals the simulated systemd keeps (sparkctl_sim.journalshim)
        from sparkctl_sim.journalshim import journalctl_main

        return journalctl_main(rest)
    try:
        if tool == "docker":
            from sparkctl_sim.dockerps import docker_main
            if rest[:1] in (["info"], ["image"]):  # a view missed: render on read (sparkctl_sim.shims.rendered)
                from sparkctl_sim.shims.rendered import DOCKER_LINES, ensure_views

                state = os.path.join(os.path.dirname(os.environ.get(RUN_DIR_ENV) or "/nonexistent"), "state.json")
                try:
                    if tuple(rest) in DOCKER_LINES or rest[1:3] == ["inspect", "--format"]:
                        ensure_views(state)
                except (OSError, ValueError, KeyError, TypeError):  # no node state here: docker answers alone
                    pass
            return docker_main(rest)
        from sparkctl_sim.systemctlshim import systemctl_main

        return systemctl_main(rest)
    except ShimError as exc:
        print(exc.message, file=sys.stderr)
        return exc.code
    except ValueError as exc:  # a malformed unit or argument, reported like systemd does
        print(f"{tool}: {exc}", file=sys.stderr)
        return 1
    finally:
        if rest and rest[0] in ("stop", "rm", "kill", "restart"):
            # An engine killed before it gave its memory back: settle the node's
            # simulated memory now, as the driver would when the process is gone.
            import time

            from sparkctl_sim import nodestate

            try:
                time.sleep(0.05)
                nodestate.settle_file(os.environ.get("SPARKCTL_SIM_STATE"))
            except (OSError, ValueError):
                pass


def _entry() -> NoReturn:
    sys.exit(main())


if __name__ == "__main__":
    _entry()
