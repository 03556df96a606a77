"""The node-to-node grant is verified, not re-provisioned: what is remembered, what each node must answer.

sparkctl.ops.nodessh remembers (in the operator's local state, 0600) what it
provisioned for a source; a later run keeps the grant only when every peer still
authorizes that exact line and the source still holds that exact key (mode 600)
and known_hosts. Anything else means provisioning again.
"""

from __future__ import annotations

import hashlib
import json
import stat
from pathlib import Path

import pytest

from sparkctl.model.inventory import load_inventory
from sparkctl.ops import nodessh
from sparkctl.ops.localstate import cluster_dir

REPO = Path(__file__).resolve().parents[1]
INV = load_inventory(REPO / "inventory.yaml")
SRC, PEERS = "spark-a", ("spark-b", "spark-c")
KNOWN = b"10.0.0.2 ssh-ed25519 AAAA\n"


@pytest.fixture()
def grant(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """A remembered grant for spark-a -> spark-b, spark-c, and the answers of nodes that still hold it."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    key, pub = nodessh.local_key(INV)
    line = nodessh.grant_line(INV, SRC, pub)
    path = cluster_dir(INV) / "node-ssh.json"
    path.write_text(json.dumps({SRC: {"line": line, "peers": sorted(PEERS + ("spark-d",)),
                                      "known_hosts_sha256": hashlib.sha256(KNOWN).hexdigest()}}))
    path.chmod(0o600)
    good = {p: f"auth {SRC}\n" for p in PEERS}
    good[SRC] = f"key {hashlib.sha256(key).hexdigest()} 600\nkh {hashlib.sha256(KNOWN).hexdigest()}\n"
    return good


def test_a_grant_in_place_is_kept(grant: dict[str, str]) -> None:
    assert nodessh.still_provisioned(INV, SRC, PEERS, grant)
    assert nodessh.still_provisioned(INV, SRC, ("spark-b",), grant)  # a subset of the peers provisioned


def test_a_root_owned_key_is_judged_by_mode_and_size(grant: dict[str, str]) -> None:
    size = len((cluster_dir(INV) / "id_supervisor").read_bytes())
    kh = grant[SRC].splitlines()[1]
    assert nodessh.still_provisioned(INV, SRC, PEERS, {**grant, SRC: f"keymode 600 {size}\n{kh}\n"})
    assert not nodessh.still_provisioned(INV, SRC, PEERS, {**grant, SRC: f"keymode 644 {size}\n{kh}\n"})
    assert not nodessh.still_provisioned(INV, SRC, PEERS, {**grant, SRC: f"keymode 600 {size + 1}\n{kh}\n"})


@pytest.mark.parametrize("node,answer", [
    ("spark-c", ""),                                   # the line is gone from a peer (or unreadable)
    ("spark-b", "auth spark-d\n"),                     # authorizes another source only
    (SRC, None),                                       # the key is world-readable now
    (SRC, "kh"),                                       # known_hosts changed
    (SRC, ""),                                         # the source cannot read its own files
])
def test_anything_changed_or_unreadable_provisions_again(grant: dict[str, str], node: str, answer: str | None) -> None:
    if answer is None:
        answer = grant[SRC].replace(" 600\n", " 644\n")
    elif answer == "kh":
        answer = grant[SRC].split("\n")[0] + "\nkh " + "0" * 64 + "\n"
    assert not nodessh.still_provisioned(INV, SRC, PEERS, {**grant, node: answer})


def test_a_peer_never_provisioned_or_a_forgotten_source_provisions_again(grant: dict[str, str]) -> None:
    assert not nodessh.still_provisioned(INV, "spark-b", ("spark-a",), grant)  # nothing remembered for spark-b
    assert nodessh.still_provisioned(INV, SRC, PEERS, grant)
    nodessh.forget(INV, SRC)
    assert not nodessh.still_provisioned(INV, SRC, PEERS, grant)
    mode = stat.S_IMODE((cluster_dir(INV) / "node-ssh.json").stat().st_mode)
    assert mode == 0o600


def test_a_new_operator_key_provisions_again(grant: dict[str, str]) -> None:
    local = cluster_dir(INV) / "id_supervisor"
    local.unlink()
    nodessh.local_key(INV)  # a new key pair: the remembered line no longer matches
    assert not nodessh.still_provisioned(INV, SRC, PEERS, grant)


def test_the_verify_command_quotes_the_line_and_only_reads(grant: dict[str, str]) -> None:
    import shlex

    line = json.loads((cluster_dir(INV) / "node-ssh.json").read_text())[SRC]["line"]
    peer = nodessh.verify_command(INV, "spark-b")
    assert f"grep -qxF {shlex.quote(line)}" in peer and "echo auth spark-a" in peer
    assert "sha256sum" not in peer and "sudo" not in peer  # spark-b is no remembered source; reads need no root
    src = nodessh.verify_command(INV, SRC)
    assert "echo auth" not in src and "sha256sum" in src and "stat -c %a" in src and "sudo" not in src
    for cmd in (peer, src):  # reads only: no redirection into a file, no write verbs
        assert not any(w in cmd for w in (" > ", ">>", "chmod", "printf", "mv ", "rm "))
