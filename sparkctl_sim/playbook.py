"""Nodes as NVIDIA's "Connect two Sparks" playbook leaves them, and as a desktop install
with NetworkManager leaves them: the files in their /etc/netplan.

Source: NVIDIA/dgx-spark-playbooks, nvidia/connect-two-sparks/README.md, "Step 3.
Network Interface Configuration":

* ``link-local`` -- "Option 1: Automatic IP Assignment" of the playbook until July
  2026 (commit 718d828, and assets/cx7-netplan.yaml today): ``link-local: [ ipv4 ]``
  on enp1s0f0np0 and enp1s0f1np1;
* ``static`` -- "Option 1: Manual IP Assignment with the netplan configure file" of
  today's playbook (commit a6da172): 192.168.100.{10,11}/24 on enp1s0f1np1 and
  192.168.101.{10,11}/24 on enP2p1s0f1np1, ``dhcp4: no``. The playbook says to use
  the interfaces that show "(Up)" (its example cabled port 1): the sim writes the
  twins of the node's cabled port (port 1 when cabled, else port 0).

Both write ``/etc/netplan/40-cx7.yaml`` with ``sudo tee`` (a here-document: the
text below, byte for byte, with its final newline), ``chmod 600`` it and run
``netplan apply``. The playbook is written for two nodes (node 1 gets .10, node
2 .11); the sim gives the n-th node .1n.

NetworkManager (``network_manager``): Ubuntu desktop's ``01-network-manager-all.yaml``
(a global ``renderer: NetworkManager``) and the management link's connection as
NetworkManager writes it back to netplan (``90-NM-<uuid>.yaml``,
netplan doc/netplan-everywhere.md): :mod:`sparkctl_sim.netplansim`.

SIMULATION ONLY.
"""

from __future__ import annotations

import uuid
from pathlib import Path

from sparkctl_sim import netplansim

PLAYBOOK_FILE = "40-cx7.yaml"
OPTIONS = ("link-local", "static")

LINK_LOCAL = """network:
  version: 2
  ethernets:
    enp1s0f0np0:
      link-local: [ ipv4 ]
    enp1s0f1np1:
      link-local: [ ipv4 ]
"""


def static(index: int, twins: tuple[str, str] = ("enp1s0f1np1", "enP2p1s0f1np1")) -> str:
    host = 10 + index
    return f"""network:
  version: 2
  ethernets:
    {twins[0]}:
      addresses:
        - 192.168.100.{host}/24
      dhcp4: no
    {twins[1]}:
      addresses:
        - 192.168.101.{host}/24
      dhcp4: no
"""


def static_twins(cabled: set[str]) -> tuple[str, str]:
    return ("enp1s0f1np1", "enP2p1s0f1np1") if "enp1s0f1np1" in cabled or not cabled \
        else ("enp1s0f0np0", "enP2p1s0f0np0")


def text_for(option: str, index: int, cabled: set[str] | None = None) -> str:
    if option == "link-local":
        return LINK_LOCAL
    if option == "static":
        return static(index, static_twins(cabled or set()))
    raise ValueError(f"playbook option {option!r}: one of {', '.join(OPTIONS)}")


def _write(d: Path, name: str, text: str) -> None:
    f = d / name
    f.write_text(text)
    f.chmod(0o600)


def lay_out(netplan_dir: Path, option: str, index: int, network_manager: bool, node: str,
            cabled: set[str] | None = None) -> list[str]:
    """Write the files into a node's private /etc/netplan; the names written."""
    written = []
    netplan_dir.mkdir(parents=True, exist_ok=True)
    if network_manager:
        _write(netplan_dir, "01-network-manager-all.yaml", netplansim.NM_GLOBAL)
        conn = str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{node}.sparkctl-sim"))
        _write(netplan_dir, f"90-NM-{conn}.yaml", netplansim.nm_connection_yaml(conn))
        written += ["01-network-manager-all.yaml", f"90-NM-{conn}.yaml"]
    if option:
        _write(netplan_dir, PLAYBOOK_FILE, text_for(option, index, cabled))
        written.append(PLAYBOOK_FILE)
    return written
