"""The SIMULATED earlyoom and package database of the simulated nodes, judged by Debian's real earlyoom.

sparkctl_sim.earlyoomsim stands in for earlyoom 1.7 on a simulated node (the real one
would pick its victims among this machine's processes). Where the real binary is
installed (Makefile APT_PACKAGES), the stand-in must read the same arguments into the
same limits and refuse the same bad ones with the same exit codes.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from sparkctl.model import watchdog
from sparkctl.model.schema import LawsSpec
from sparkctl_sim import debpkg, earlyoomsim, nodestate

REAL = shutil.which("earlyoom")
needs_real = pytest.mark.skipif(REAL is None, reason="Debian's earlyoom not installed (Makefile APT_PACKAGES)")


def _real(args: list[str]) -> tuple[int | None, str]:
    try:
        r = subprocess.run([REAL or "earlyoom", "--dryrun", *args], capture_output=True, text=True, timeout=2)
        return r.returncode, r.stderr
    except subprocess.TimeoutExpired as exc:  # it parsed them and loops: what it printed
        return None, (exc.stderr or b"").decode()


def _host_mem() -> earlyoomsim.Mem:
    return earlyoomsim.parse_meminfo(Path("/proc/meminfo").read_text())


@needs_real
@pytest.mark.parametrize("laws", [LawsSpec(), LawsSpec(min_free_gib=10), LawsSpec(min_free_gib=20)])
def test_simulated_earlyoom_reads_sparkctls_arguments_into_the_real_ones_limits(laws: LawsSpec) -> None:
    args = list(watchdog.earlyoom_args(laws))
    rc, text = _real(args)
    assert rc is None, text
    mem = _host_mem()
    mine = earlyoomsim.startup_lines(earlyoomsim.parse_args(args, mem), mem)
    real_lines = [ln.rstrip() for ln in text.splitlines()]
    for line in mine[2:]:  # after the version and dryrun lines: regexes, totals, the two limit lines
        if line.startswith("mem total"):
            continue  # MemTotal moves by a few MiB between the two reads
        assert line in real_lines, (line, real_lines)


@needs_real
@pytest.mark.parametrize("bad", [["-M", "abc"], ["-x"], ["-r", "-1"], ["--prefer", "("], ["-m", "100"],
                                 ["-s", "101"], ["extra"]])
def test_simulated_earlyoom_refuses_what_the_real_one_refuses(bad: list[str]) -> None:
    rc, text = _real(bad)
    with pytest.raises(earlyoomsim.Fatal) as e:
        earlyoomsim.parse_args(bad, _host_mem())
    assert e.value.code == rc
    assert e.value.message.splitlines()[-1] == text.strip().splitlines()[-1]


def test_victim_is_the_preferred_engine_never_the_avoided_or_itself() -> None:
    mem = earlyoomsim.Mem(127_600_816, 1_000_000, 0, 0)
    cfg = earlyoomsim.parse_args(list(watchdog.earlyoom_args(LawsSpec())), mem)
    big_sshd = earlyoomsim.Proc(10, "sshd", 90 << 20, 700)
    engine = earlyoomsim.Proc(20, "VLLM::EngineCore", 60 << 20, 470)
    me = earlyoomsim.Proc(30, "python3", 80 << 20, 620)
    assert earlyoomsim.choose(cfg, [big_sshd, engine, me], me=30).pid == 20
    assert earlyoomsim.choose(cfg, [big_sshd], me=30).pid == 10  # avoided, still the only one (kill.c)
    assert earlyoomsim.choose(cfg, [earlyoomsim.Proc(1, "python3", 1 << 20, 900)], me=30) is None  # never init
    # the limits: sparkctl's -M is a quarter/half of laws.min_free_gib, no swap counts as 0 %
    assert earlyoomsim.lowmem_sig(cfg, mem) == signal.SIGKILL
    assert earlyoomsim.lowmem_sig(cfg, earlyoomsim.Mem(127_600_816, 100_000_000, 0, 0)) == 0
    term_kib = watchdog.thresholds_kib(LawsSpec())[0]
    assert earlyoomsim.lowmem_sig(cfg, earlyoomsim.Mem(127_600_816, term_kib - 1, 0, 0)) == signal.SIGTERM


def test_simulated_package_database_and_apt_get(tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    nodestate.create(state, nodestate.default_state("spark-a"))
    out, err, rc = debpkg.dpkg_query(["-W", "--showformat=${db:Status-Status}", "earlyoom"], nodestate.load(state))
    assert (out, rc) == ("", 1) and "no packages found matching earlyoom" in err
    units = tmp_path / "etc/systemd/system"
    assert debpkg.apt_get(["install", "-y", "earlyoom"], str(state), euid=1000, root=str(tmp_path),
                          unit_dir=str(units)) == 100  # not root: the dpkg lock
    assert debpkg.apt_get(["install", "-y", "nosuchpkg"], str(state), euid=0, root=str(tmp_path),
                          unit_dir=str(units)) == 100
    assert debpkg.apt_get(["update", "-qq"], str(state), euid=1000, root=str(tmp_path), unit_dir=str(units)) == 100
    assert debpkg.apt_get(["update", "-qq"], str(state), euid=0, root=str(tmp_path), unit_dir=str(units)) == 0
    (tmp_path / "etc/default").mkdir(parents=True)
    (tmp_path / "etc/default/earlyoom").write_text('EARLYOOM_ARGS="-m 3"\n')  # the admin's conffile stays
    env = dict(os.environ, PATH=f"{tmp_path}:{os.environ['PATH']}")
    (tmp_path / "systemctl").write_text("#!/bin/sh\nexit 0\n")  # the maintainer scripts' enable/start
    (tmp_path / "systemctl").chmod(0o755)
    old = os.environ["PATH"]
    os.environ["PATH"] = env["PATH"]
    try:
        assert debpkg.apt_get(["install", "-y", "-qq", "--no-install-recommends", "earlyoom"], str(state),
                              euid=0, root=str(tmp_path), unit_dir=str(units)) == 0
    finally:
        os.environ["PATH"] = old
    out, _, rc = debpkg.dpkg_query(["-W", "--showformat=${db:Status-Status}", "earlyoom"], nodestate.load(state))
    assert (out, rc) == ("installed", 0)
    assert (units / "earlyoom.service").read_text() == debpkg.EARLYOOM_UNIT
    assert (tmp_path / "etc/default/earlyoom").read_text() == 'EARLYOOM_ARGS="-m 3"\n'


@pytest.mark.skipif(not Path("/lib/systemd/system/earlyoom.service").is_file(), reason="Debian's earlyoom not installed")
def test_simulated_package_files_are_debians() -> None:
    assert debpkg.EARLYOOM_UNIT == Path("/lib/systemd/system/earlyoom.service").read_text()
