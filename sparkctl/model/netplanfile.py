"""A netplan file of a node as sparkctl read it: what it configures. Pure data.

Read by the fact ``netplan.files`` (:mod:`sparkctl.facts.netplanfiles`); used by the
``fabric apply`` plan (:mod:`sparkctl.plan.fabricplan`) and the fabric law.
"""

from __future__ import annotations

from dataclasses import dataclass

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


def foreign(files: tuple[NetplanFile, ...]) -> tuple[NetplanFile, ...]:
    """Every file but sparkctl's own (``60-sparkctl-fabric.yaml``)."""
    own = NETPLAN.rsplit("/", 1)[1]
    return tuple(f for f in files if f.name != own)
