"""The memory watchdog: earlyoom's arguments from the profile, the watchdog fact, the memory_watchdog law."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from sparkctl.facts import watchdog as wf
from sparkctl.facts.registry import ScriptContext
from sparkctl.model import watchdog
from sparkctl.model.schema import LawsSpec
from sparkctl.plan import laws

from helpers import DS, INV, ctx, healthy

FIX = Path(__file__).resolve().parent / "fixtures" / "spark"


def test_arguments_follow_the_profiles_floor_and_round_trip_the_file() -> None:
    a = watchdog.earlyoom_args(LawsSpec(min_free_gib=12))
    assert a[:2] == ("-M", f"{6 * 1024 * 1024},{3 * 1024 * 1024}")
    assert watchdog.earlyoom_args(LawsSpec(min_free_gib=16))[1] == f"{8 * 1024 * 1024},{4 * 1024 * 1024}"
    assert "sshd" in a[a.index("--avoid") + 1] and "llama-server" in a[a.index("--prefer") + 1]
    assert all(" " not in w and "'" not in w and '"' not in w for w in a)  # systemd splits $EARLYOOM_ARGS at spaces
    assert wf.parse_args_line(watchdog.render_default(LawsSpec())) == watchdog.earlyoom_args(LawsSpec())


@pytest.mark.skipif(shutil.which("earlyoom") is None, reason="Debian's earlyoom not installed (Makefile APT_PACKAGES)")
def test_the_real_earlyoom_accepts_the_arguments() -> None:
    # --dryrun kills nothing; it prints its settings then loops: the timeout ends it
    try:
        out = subprocess.run(["earlyoom", "--dryrun", *watchdog.earlyoom_args(LawsSpec())],
                             capture_output=True, text=True, timeout=3)
        text = out.stdout + out.stderr
    except subprocess.TimeoutExpired as exc:
        text = (exc.stdout or b"").decode() + (exc.stderr or b"").decode()
    assert "Preferring to kill process names that match regex" in text
    assert "Will avoid killing process names that match regex '^(sshd|" in text


def test_fact_parser_on_the_fixtures() -> None:
    d = wf.parse_watchdog((FIX / "watchdog-earlyoom-debian-default-constructed.txt").read_text())
    assert d == wf.WatchdogFacts(True, "enabled", "active", ("-r", "3600"))
    a = wf.parse_watchdog((FIX / "watchdog-earlyoom-absent-constructed.txt").read_text())
    assert not a.installed and a.args is None


def test_fact_command_reads_the_file_under_the_prefix() -> None:
    node = replace(INV.nodes[0], prefix="/srv/sim/a b")
    cmd = wf.WATCHDOG.command(ScriptContext(node), "")
    assert "'/srv/sim/a b/etc/default/earlyoom'" in cmd and "systemctl show -p UnitFileState,ActiveState earlyoom" in cmd
    assert "dpkg-query -W --showformat='${db:Status-Status}' earlyoom" in cmd  # the package, not a binary on PATH


def judged(w: wf.WatchdogFacts | None) -> set[str]:
    facts = {n: replace(healthy(n), watchdog=w) for n in INV.names}
    return {v.status for v in laws.judge(ctx(facts=facts)) if v.law == "memory_watchdog"}


def test_law_ok_only_with_sparkctls_arguments_enabled_and_running() -> None:
    want = watchdog.earlyoom_args(DS.laws)
    assert judged(wf.WatchdogFacts(True, "enabled", "active", want)) == {"ok"}
    assert judged(wf.WatchdogFacts(True, "enabled", "active", ("-r", "3600"))) == {"warn"}
    assert judged(wf.WatchdogFacts(True, "disabled", "active", want)) == {"warn"}
    assert judged(wf.WatchdogFacts(True, "enabled", "failed", want)) == {"warn"}
    assert judged(wf.WatchdogFacts(False, "", "inactive", None)) == {"fail"}  # only fabric apply installs it
    assert judged(None) == {"warn"}


@pytest.mark.skipif(shutil.which("dpkg-query") is None, reason="no dpkg on this machine")
def test_the_real_dpkg_query_judges_the_installed_test() -> None:
    """The test sparkctl runs on a node, run by this machine's real dpkg-query: true for a
    package dpkg has installed, false for one it never knew (the simulator's dpkg-query once
    caught `-f='...'`, which the real one reads as a format starting with '=')."""
    from sparkctl.model.watchdog import INSTALLED_TEST

    have = subprocess.run(["dpkg-query", "-W", "--showformat=${db:Status-Status}", "dpkg"],
                          capture_output=True, text=True).stdout
    assert have == "installed"
    assert subprocess.run(["sh", "-c", INSTALLED_TEST.replace(" earlyoom ", " dpkg ")]).returncode == 0
    assert subprocess.run(["sh", "-c", INSTALLED_TEST.replace(" earlyoom ", " sparkctl-no-such-pkg ")]).returncode == 1


def test_install_refreshes_stale_package_lists_once(tmp_path: Path) -> None:
    """A fresh box whose apt lists do not know earlyoom yet: install, update, install again; an
    installed package is left alone."""
    import os

    from sparkctl.model.watchdog import install_command

    log = tmp_path / "apt.log"
    (tmp_path / "apt-get").write_text(
        "#!/bin/sh\necho \"$*\" >> " + str(log) + "\n"
        "case \"$*\" in *install*) [ -e " + str(tmp_path / "updated") + " ] || exit 100 ;; "
        "*update*) : > " + str(tmp_path / "updated") + " ;; esac\n")
    (tmp_path / "dpkg-query").write_text("#!/bin/sh\n[ -e " + str(tmp_path / "installed") + " ] && printf installed\n"
                                         "exit 0\n")
    for f in ("apt-get", "dpkg-query"):
        (tmp_path / f).chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}:/usr/bin:/bin"}
    assert subprocess.run(["sh", "-c", install_command()], env=env).returncode == 0
    lines = log.read_text().splitlines()
    wait = "-o DPkg::Lock::Timeout=300"  # every call waits (bounded) for the dpkg lock
    assert lines == [f"{wait} install -y -qq --no-install-recommends earlyoom", f"{wait} update -qq",
                     f"{wait} install -y -qq --no-install-recommends earlyoom"]
    (tmp_path / "installed").touch()
    log.unlink()
    assert subprocess.run(["sh", "-c", install_command()], env=env).returncode == 0 and not log.exists()
