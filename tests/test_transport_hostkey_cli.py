"""A changed host key on the head, through the CLI, against a real sshd on 127.0.0.1.

`sparkctl up` must refuse it before anything runs on the node, naming the node
and the key's SHA256 fingerprint, with exit code 3 (TransportError), never as an
"internal error" (exit 70).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from sshd_fixture import SshdHandle, fingerprint_of, keygen, sshd_available, start_sshd

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not sshd_available(), reason="OpenSSH sshd not installed")]


@pytest.fixture
def sshd(tmp_path: Path) -> Iterator[SshdHandle]:
    handle = start_sshd(tmp_path / "sshd")
    yield handle
    handle.stop()


def _inventory(tmp_path: Path, sshd: SshdHandle, known_hosts: Path) -> Path:
    inv = tmp_path / "inventory.yaml"
    inv.write_text(
        "nodes:\n"
        f"  - {{name: spark-a, host: {sshd.host}, ssh_port: {sshd.port}, ssh_user: {sshd.user}, sudo: false,\n"
        f"     ssh_identity: {sshd.key_path}, known_hosts: {known_hosts}, prefix: {tmp_path / 'node'}}}\n"
    )
    return inv


def test_up_refuses_a_changed_head_key_with_node_fingerprint_and_exit_3(
    sshd: SshdHandle, tmp_path: Path, sparkctl, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = keygen(tmp_path / "old_host_key")
    old_fp = fingerprint_of(other.with_name("old_host_key.pub"))
    kh = tmp_path / "known_hosts"
    kh.write_text(f"[{sshd.host}]:{sshd.port} {' '.join(other.with_name('old_host_key.pub').read_text().split()[:2])}\n")
    before = kh.read_text()
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # keeps the developer's ~/.ssh out of it
    inv = _inventory(tmp_path, sshd, kh)
    log_before = sshd.log()

    r = sparkctl("-i", str(inv), "up", "tiny-llamacpp", "--connect-timeout", "2")

    assert r.code == 3, (r.code, r.out, r.err)
    assert "internal error" not in r.err
    assert "node spark-a" in r.err and "HOST KEY CHANGED" in r.err
    assert sshd.fingerprint in r.err and old_fp in r.err
    assert kh.read_text() == before  # nothing was recorded
    # the key exchange was refused before any login: sshd saw no accepted session
    assert "Accepted publickey" not in sshd.log()[len(log_before):]


def test_check_reports_an_unknown_head_key_with_its_fingerprint_and_trust_records_it(
    sshd: SshdHandle, tmp_path: Path, sparkctl, monkeypatch: pytest.MonkeyPatch
) -> None:
    kh = tmp_path / "kh" / "known_hosts"
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    inv = _inventory(tmp_path, sshd, kh)
    r = sparkctl("-i", str(inv), "up", "tiny-llamacpp", "--connect-timeout", "2")
    assert r.code == 3, (r.code, r.out, r.err)
    assert "unknown host key" in r.err and sshd.fingerprint in r.err and "sparkctl trust spark-a" in r.err
    assert not kh.exists()
    t = sparkctl("-i", str(inv), "trust", "spark-a", "--fingerprint", sshd.fingerprint)
    assert t.code == 0, (t.out, t.err)
    assert kh.read_text().split()[1:] == sshd.hostkey_pub.read_text().split()[:2]
