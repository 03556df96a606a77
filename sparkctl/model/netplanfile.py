"""A netplan file of a node as sparkctl read it: what it configures. Pure data.

Read by the fact ``netplan.files`` (:mod:`sparkctl.facts.netplanfiles`); used by the
``fabric apply`` plan (:mod:`sparkctl.plan.fabricplan`) and the fabric law.
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase

from sparkctl.model.paths import NETPLAN, NETPLAN_DIR


@dataclass(frozen=True)
class NetplanFile:
    """One file of the node's netplan dir: its name, the SHA-256 of its bytes, the
    interfaces it configures (definition ids, ``match: name:``, ``set-name:``, the
    members of its bonds and bridges, the links of its vlans), and why it could
    not be read (then ``interfaces`` is empty)."""

    name: str
    sha256: str = ""
    interfaces: tuple[str, ...] = ()
    renderer: str = ""  # the file's global ``renderer:``, "" when it sets none
    error: str = ""

    @property
    def path(self) -> str:
        return f"{NETPLAN_DIR}/{self.name}"


# A definition matched by driver only may be any of these (the CX-7's driver; a MAC alone cannot be
# told from here, so it counts as another interface and the file is refused rather than moved).
CX7_DRIVERS = ("mlx5_core",)


def split_ports(f: NetplanFile, cx7: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(the CX-7 netdevs ``f`` may configure, every other name it configures). A ``match: name:`` glob
    (netplan matches names with fnmatch) that takes a CX-7 port is among both: it may take more."""
    ports: list[str] = []
    others: list[str] = []
    for name in f.interfaces:
        if name.startswith("match:driver="):
            pattern = name.partition("=")[2]  # netplan matches a driver with fnmatch too
            hit = list(cx7) if any(fnmatchcase(d, pattern) for d in CX7_DRIVERS) else []
            glob = True
        else:
            hit = [nd for nd in cx7 if fnmatchcase(nd, name)]
            glob = any(c in name for c in "*?[")
        ports += [nd for nd in hit if nd not in ports]
        if not hit or glob:
            others.append(name)
    return tuple(ports), tuple(others)


def foreign(files: tuple[NetplanFile, ...]) -> tuple[NetplanFile, ...]:
    """Every file but sparkctl's own (``60-sparkctl-fabric.yaml``)."""
    own = NETPLAN.rsplit("/", 1)[1]
    return tuple(f for f in files if f.name != own)
