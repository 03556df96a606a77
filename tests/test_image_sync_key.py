"""image sync's node-to-node key: a forced command (the gate), an expiry, revoked by its own plan and by restore.

The gate (sparkctl/remote/image_sync_gate.sh) is run here by the real sh with a
stand-in docker on PATH that records what it was asked; the authorized_keys
rewrites the plans carry are run by the real sh on files in a temporary
directory. The e2e test through real OpenSSH is
tests/sim/test_simulated_pair_images.py.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from datetime import datetime, timezone
from pathlib import Path

import pytest

from sparkctl.model import imageid
from sparkctl.model.inventory import load_inventory
from sparkctl.ops import image, nodessh
from sparkctl.plan import fabricplan, imageplan
from sparkctl.plan.steps import FileRef

REPO = Path(__file__).resolve().parents[1]
INV = load_inventory(REPO / "inventory.yaml")
IMAGE = "ghcr.io/tensorfold/tensorfold-spark:zig-2026.10"
GATE = imageplan.gate_script()


@pytest.fixture()
def gate(tmp_path: Path) -> tuple[Path, Path, Path]:
    """(gate, the stand-in docker's log, a file that exists only if someone ran `touch` through the gate)."""
    g = tmp_path / "gate.sh"
    g.write_bytes(GATE)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    log = tmp_path / "docker.log"
    (bindir / "docker").write_text(f"#!/bin/sh\necho \"$*\" >> {log}\n"
                                   "[ \"$1\" = load ] && cat > /dev/null\n"
                                   "[ \"$1\" = image ] && echo sha256:abc\nexit 0\n")
    (bindir / "docker").chmod(0o755)
    return g, log, tmp_path / "pwned"


def _run_gate(gate: tuple[Path, Path, Path], original: str | None) -> subprocess.CompletedProcess[str]:
    g, _log, _pwned = gate
    env = {"PATH": f"{g.parent / 'bin'}:/usr/bin:/bin"}
    if original is not None:
        env["SSH_ORIGINAL_COMMAND"] = original
    return subprocess.run(["/bin/sh", str(g)], env=env, input="image tar bytes", capture_output=True, text=True,
                          timeout=30)


def test_the_gate_loads_and_prints_the_content_digest(gate: tuple[Path, Path, Path]) -> None:
    r = _run_gate(gate, f"{imageplan.LOAD_VERB} {IMAGE}")
    want = "content:sha256:" + hashlib.sha256(b"sha256:abc").hexdigest() + "\n"  # the digest of what inspect printed
    assert (r.returncode, r.stdout) == (0, want), r.stderr
    assert gate[1].read_text().splitlines() == ["load", f"image inspect --format {imageid.CONTENT_FORMAT} {IMAGE}"]


@pytest.mark.parametrize("original", [
    None,                                                       # an interactive login
    "",
    "id",
    "sh -c 'touch PWNED'",
    "docker load && touch PWNED",
    f"docker run --privileged -v /:/host {IMAGE}",
    f"docker load >&2 && docker image inspect --format '{{{{.Id}}}}' {IMAGE}",  # the old unforced form
    f"{imageplan.LOAD_VERB} {IMAGE}; touch PWNED",
    f"{imageplan.LOAD_VERB} {IMAGE} && touch PWNED",
    f"{imageplan.LOAD_VERB} $(touch PWNED)",
    f"{imageplan.LOAD_VERB} `touch PWNED`",
    f"{imageplan.LOAD_VERB} {IMAGE} --extra",
    f"{imageplan.LOAD_VERB} --format x",
    f"{imageplan.LOAD_VERB} ",
    f"{imageplan.LOAD_VERB}",
])
def test_the_gate_refuses_anything_else_and_runs_nothing(gate: tuple[Path, Path, Path], original: str | None,
                                                         tmp_path: Path) -> None:
    if original is not None:
        original = original.replace("PWNED", str(gate[2]))
    r = _run_gate(gate, original)
    assert r.returncode == 126 and "refused" in r.stderr and r.stdout == "", (r.returncode, r.stdout, r.stderr)
    assert not gate[1].exists() and not gate[2].exists()  # docker never asked, nothing else ran


def test_the_grant_line_forces_the_gate_and_expires() -> None:
    _key, pub = "x", "ssh-ed25519 AAAAC3Nza sparkctl-image-sync@x"
    line = nodessh.grant_line(INV, "spark-a", pub, command="/opt/sparkctl/image-sync-gate.sh",
                              expiry="20261202010203Z")
    opts = line.split(" ", 1)[0]
    assert opts.startswith("restrict,from=\"") and 'expiry-time="20261202010203Z"' in opts
    assert opts.endswith(',command="/opt/sparkctl/image-sync-gate.sh"') and line.endswith(pub)
    with pytest.raises(Exception, match="quote"):
        nodessh.grant_line(INV, "spark-a", pub, command='/x" ssh-rsa')


def test_the_expiry_is_utc_hours_from_now() -> None:
    now = datetime(2026, 12, 1, 22, 30, 5, tzinfo=timezone.utc)
    assert image.expiry_time(4, now) == "20261202023005Z"
    assert image.expiry_time(0.5, now) == "20261201230005Z"


def _grant(lines: dict[str, str]) -> imageplan.KeyGrant:
    targets = tuple(lines)
    return imageplan.KeyGrant(
        "sparkctl-image-sync@x", lines, "20261202023005Z",
        {t: FileRef("/opt/sparkctl/image-sync-gate.sh", 0o755, "ab" * 32) for t in targets},
        {t: "/etc/sparkctl/authorized_keys" for t in targets}, {t: True for t in targets})


def test_the_sync_plan_grants_then_copies_through_the_gate() -> None:
    plan = imageplan.plan_image_sync("P", IMAGE, "spark-a", "sha256:" + "1" * 64, ("spark-b",),
                                     {"spark-b": ["ssh", "root@10.20.0.2"]}, True, (),
                                     _grant({"spark-b": "restrict,command=\"/g\" ssh-ed25519 AAAA sparkctl-image-sync@x"}))
    ids = [s.id for s in plan.steps]
    assert ids == ["key-gate", "key-authorize", "key-authorize-user", "copy-spark-b"]  # key and known_hosts kept
    copy = plan.steps[-1].commands["spark-a"]
    assert f"root@10.20.0.2 '{imageplan.LOAD_VERB} {IMAGE}'" in copy and "docker save" in copy
    assert "until 20261202023005Z" in plan.steps[1].summary


def _sh(cmd: str, home: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["/bin/sh", "-c", cmd], env={"PATH": "/usr/bin:/bin", "HOME": str(home)},
                          capture_output=True, text=True, timeout=30)


def test_authorize_replaces_the_keys_older_line_and_revoke_removes_only_sparkctls(tmp_path: Path) -> None:
    f = tmp_path / "authorized_keys"
    others = ["ssh-ed25519 AAAAoperator me@laptop", "# a comment", "",
              "ssh-ed25519 AAAAother sparkctl-image-sync@another-cluster"]
    old = 'restrict,expiry-time="20200101Z",command="/g" ssh-ed25519 AAAAold sparkctl-image-sync@x'
    f.write_text("\n".join([others[0], old, *others[1:]]) + "\n")
    new = 'restrict,expiry-time="20301010Z",command="/g" ssh-ed25519 AAAAnew sparkctl-image-sync@x'
    grant = imageplan.grant_steps("spark-a", ("spark-b",), _grant({"spark-b": new}), True)
    cmd = next(s for s in grant if s.id == "key-authorize").commands["spark-b"].replace(
        "/etc/sparkctl/authorized_keys", str(f))
    for _ in range(2):  # the next sync renews: still one line of the key
        r = _sh(cmd, tmp_path)
        assert r.returncode == 0, r.stderr
        assert f.read_text().splitlines() == [others[0], *others[1:], new]
        assert oct(f.stat().st_mode & 0o777) == "0o600"
    sup = "restrict ssh-ed25519 AAAAsup sparkctl-supervisor@x"
    f.write_text(f.read_text() + sup + "\n")
    revoke = imageplan.revoke_steps(INV, ("image-sync", "supervisor"))[0].commands["spark-b"]
    revoke = revoke.replace("sparkctl-image-sync@" + INV.name, "sparkctl-image-sync@x").replace(
        "sparkctl-supervisor@" + INV.name, "sparkctl-supervisor@x").replace("/etc/sparkctl/authorized_keys", str(f))
    revoke = revoke.split("; rm -f ")[0]  # the files it removes are the node's, not this machine's
    r = _sh(revoke, tmp_path)
    assert r.returncode == 0, r.stderr
    assert f.read_text().splitlines() == [others[0], *others[1:]]
    (tmp_path / "missing").mkdir()
    r = _sh(revoke.replace(str(f), str(tmp_path / "missing" / "authorized_keys")), tmp_path)
    assert r.returncode == 0 and not (tmp_path / "missing" / "authorized_keys").exists(), r.stderr


def test_fabric_restore_and_image_revoke_plan_the_revocation() -> None:
    restore = fabricplan.plan_fabric_restore(INV)
    assert [s.id for s in restore.steps][:2] == ["revoke-keys", "revoke-keys-user"]
    cmd = restore.steps[0].commands[INV.names[0]]
    assert f"sparkctl-image-sync@{INV.name}" in cmd and f"sparkctl-supervisor@{INV.name}" in cmd
    assert "/opt/sparkctl/image-sync-gate.sh" in cmd and "/var/lib/sparkctl/id_image_sync" in cmd
    revoke = imageplan.plan_image_revoke(INV)
    assert revoke.op == "image revoke" and set(revoke.steps[0].nodes) == set(INV.names)
    assert "sparkctl-supervisor" not in revoke.steps[0].commands[INV.names[0]]
    assert os.path.basename("/var/lib/sparkctl/id_supervisor") not in revoke.steps[0].commands[INV.names[0]]


def test_the_gate_passes_shellcheck(tmp_path: Path) -> None:
    import shutil

    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not installed (package shellcheck)")
    g = tmp_path / "gate.sh"
    g.write_bytes(GATE)
    r = subprocess.run(["shellcheck", "--format=gcc", "--severity=style", "-s", "sh", str(g)],
                       capture_output=True, text=True, timeout=60)
    assert (r.returncode, r.stdout + r.stderr) == (0, "")
