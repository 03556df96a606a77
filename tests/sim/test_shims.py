"""The GB10 tool shims against verbatim real captures (tests/fixtures/spark/)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from sparkctl_sim import nodestate, shims
from sparkctl_sim.shims import GpuProcess, GpuSample, Netdev

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "spark"
NOW = 1_789_300_000.0


def fixture_lines(name: str) -> list[str]:
    return (FIX / name).read_text().splitlines()


@pytest.fixture
def state() -> dict:
    return nodestate.default_state("spark-5c2d")


def up(name: str, *ips: str, mtu: int = 1500) -> Netdev:
    return Netdev(name=name, operstate="up", mtu=mtu, ipv4=tuple((ip, 24) for ip in ips))


def port0_netdevs() -> dict[str, Netdev]:
    """Cable in port 0: the f0 twins up with addresses, f1 twins down (spark-5c2d)."""
    return {
        "enp1s0f0np0": up("enp1s0f0np0", "192.168.100.10"),
        "enP2p1s0f0np0": up("enP2p1s0f0np0", "192.168.101.10"),
        "enp1s0f1np1": Netdev("enp1s0f1np1", "lowerlayerdown"),
        "enP2p1s0f1np1": Netdev("enP2p1s0f1np1", "down"),
    }


def busy(state: dict) -> dict:
    state["engine_mem_gib"] = {"400721": 94.3}
    return state


# ---------------------------------------------------------------- nvidia-smi


def test_default_table_idle_matches_real_capture(state: dict) -> None:
    real = fixture_lines("nvidia-smi-table-idle-580.173.02.txt")
    sample = GpuSample(False, 208, 4.0, 43, 0, "P8", shims.REASON_IDLE)
    ours = shims.render_smi_table(state, NOW, [], sample=sample).splitlines()
    assert len(ours) == len(real)
    assert ours[1:] == real[1:]
    assert re.fullmatch(r"\w{3} \w{3} \d\d \d\d:\d\d:\d\d \d{4} {7}", ours[0])


def test_default_table_busy_with_processes_matches_real_capture(state: dict) -> None:
    real = fixture_lines("nvidia-smi-table-gnome-580.159.03.txt")
    state["gpu"]["driver"] = "580.159.03"
    procs = [
        GpuProcess(2011225, "/usr/share/cursor/cursor", 168, "G"),
        GpuProcess(3345981, "/usr/lib/xorg/Xorg", 559, "G"),
        GpuProcess(3346134, "/usr/bin/gnome-shell", 349, "G"),
        GpuProcess(3347112, "/opt/google/chrome/chrome --type=gpu --crash-track-uuid=3190708988185955192", 197, "G"),
    ]
    sample = GpuSample(True, 2400, 8.0, 42, 6, "P0", 0)
    ours = shims.render_smi_table(state, NOW, procs, sample=sample).splitlines()
    # only Disp.A differs: that box had a desktop attached, ours is headless
    real[8] = real[8].replace("0000000F:01:00.0  On", "0000000F:01:00.0 Off")
    assert ours[1:] == real[1:]
    assert ours[0].rstrip() != ""


def test_vllm_process_row_matches_real_capture(state: dict) -> None:
    real = fixture_lines("nvidia-smi-proc-rows-vllm.txt")
    ours = shims.render_smi_table(state, NOW, [GpuProcess(400721, "VLLM::EngineCore", 96581)]).splitlines()
    assert ours[-2] == real[2]
    assert ours[-1] == real[3]


def test_process_rows_come_from_state_engine_pids(state: dict) -> None:
    state["engine_mem_gib"] = {"4242": 10.0, "999999": 5.0}
    procs = shims.gpu_processes(state, {4242: "VLLM::EngineCore"})  # 999999 is dead
    assert procs == [GpuProcess(4242, "VLLM::EngineCore", 10240)]
    table = shims.render_smi_table(state, NOW, procs)
    assert "|    0   N/A  N/A            4242      C   VLLM::EngineCore" in table
    assert "10240MiB |" in table
    assert "No running processes found" not in table
    assert "P0" in table  # engines running = busy


def test_query_gpu_identity_csv(state: dict) -> None:
    r = shims.nvidia_smi(state, ["--query-gpu=name,compute_cap,driver_version", "--format=csv"], now=NOW, euid=1000)
    assert (r.stdout, r.exit_code) == ("name, compute_cap, driver_version\nNVIDIA GB10, 12.1, 580.173.02\n", 0)


def test_query_gpu_memory_is_na_with_and_without_units(state: dict) -> None:
    r = shims.nvidia_smi(state, ["--query-gpu=index,name,memory.total,memory.free", "--format=csv"], now=NOW, euid=0)
    assert r.stdout == "index, name, memory.total [MiB], memory.free [MiB]\n0, NVIDIA GB10, [N/A], [N/A]\n"
    r = shims.nvidia_smi(
        state,
        ["--query-gpu=index,name,memory.total,memory.used,memory.free", "--format=csv,noheader,nounits"],
        now=NOW,
        euid=0,
    )
    assert r.stdout == "0, NVIDIA GB10, [N/A], [N/A], [N/A]\n"


def test_query_gpu_clock_columns_units_and_nounits(state: dict) -> None:
    fields = (
        "index,name,driver_version,clocks.sm,clocks.max.sm,clocks.applications.graphics,"
        "clocks_event_reasons.active,persistence_mode,utilization.gpu"
    )
    busy(state)
    with_units = shims.nvidia_smi(state, [f"--query-gpu={fields}", "--format=csv,noheader"], now=NOW, euid=0).stdout
    no_units = shims.nvidia_smi(state, [f"--query-gpu={fields}", "--format=csv,noheader,nounits"], now=NOW, euid=0).stdout
    assert re.fullmatch(
        r"0, NVIDIA GB10, 580\.173\.02, (\d{4}) MHz, 3003 MHz, 2418 MHz, 0x0000000000000000, Enabled, \d+ %\n", with_units
    )
    assert re.fullmatch(r"0, NVIDIA GB10, 580\.173\.02, \d{4}, 3003, 2418, 0x0000000000000000, Enabled, \d+\n", no_units)
    hdr = shims.nvidia_smi(
        state,
        ["--query-gpu=name,clocks.current.graphics,clocks.max.graphics,temperature.gpu,power.draw,power.limit", "--format=csv"],
        now=NOW,
        euid=0,
    ).stdout.splitlines()
    assert hdr[0] == ("name, clocks.current.graphics [MHz], clocks.max.graphics [MHz], temperature.gpu, power.draw [W], "
                      "power.limit [W]")
    assert re.fullmatch(r"NVIDIA GB10, \d{4} MHz, 3003 MHz, \d+, \d+\.\d\d W, \[N/A\]", hdr[1])


def test_query_gpu_unknown_field_is_the_real_error(state: dict) -> None:
    r = shims.nvidia_smi(state, ["--query-gpu=name,x", "--format=csv"], now=NOW, euid=0)
    assert r.exit_code == 2
    assert r.stdout.splitlines()[0] == 'Field "x" is not a valid field to query.'


def test_q_clock_performance_contains_real_gb10_block(state: dict) -> None:
    real = fixture_lines("nvidia-smi-q-clock-event-reasons-node0.txt")
    sample = GpuSample(True, 2398, 60.0, 55, 97, "P0", 0)
    ours = shims.render_smi_q(state, NOW, [], ["CLOCK", "PERFORMANCE"], sample=sample).splitlines()
    it = iter(ours)
    missing = [line for line in real if not any(line == o for o in it)]
    assert missing == [], "real block must be an ordered subsequence of ours"
    for line in ours:
        if " : " in line:
            assert line.index(": ") == 55, line  # 580-driver key padding
    assert "    Supported Clocks                                   : N/A" in ours
    assert not any("Temperature" == line.strip() for line in ours)  # -d filtered


def test_q_full_has_power_and_temperature_sections(state: dict) -> None:
    out = shims.nvidia_smi(state, ["-q", "-d", "POWER,TEMPERATURE"], now=NOW, euid=0).stdout
    assert "        GPU Current Temp                               : 43 C" in out
    assert re.search(r"^        Average Power Draw {29}: \d+\.\d\d W$", out, re.M)
    assert "        Current Power Limit                            : N/A" in out
    assert "Clocks Event Reasons" not in out
    full = shims.nvidia_smi(state, ["-q"], now=NOW, euid=0).stdout
    assert full.splitlines()[1] == "==============NVSMI LOG=============="
    assert "    Product Name                                       : NVIDIA GB10" in full
    assert "        Total                                          : N/A" in full


def test_lgc_non_root_is_refused_with_exit_4(state: dict) -> None:
    r = shims.nvidia_smi(state, ["-lgc", "0,2000"], now=NOW, euid=1000)
    assert r.exit_code == 4
    assert r.stdout == (
        "The current user does not have permission to change clocks for GPU 0000000F:01:00.0.\n"
        "Terminating early due to previous errors.\n"
    )
    assert r.new_state is None
    assert shims.nvidia_smi(state, ["-rgc"], now=NOW, euid=1000).exit_code == 4


def _run_main(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], path: Path, argv: list[str],
              euid: int = 0, netdevs: dict | None = None) -> tuple[int, str, str]:
    monkeypatch.setenv(shims.STATE_ENV, str(path))
    monkeypatch.setattr(shims.dispatch.os, "geteuid", lambda: euid)
    monkeypatch.setattr(shims.dispatch, "read_netdevs", lambda *a, **k: netdevs or {})
    rc = shims.main(argv)
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_lgc_as_root_writes_state_and_rgc_resets(
    state: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "node.json"
    nodestate.save(path, state)
    rc, out, _ = _run_main(monkeypatch, capsys, path, ["nvidia-smi", "-lgc", "0,2000"])
    assert rc == 0
    assert out == 'GPU clocks set to "(gpuClkMin 0, gpuClkMax 2000)" for GPU 0000000F:01:00.0\nAll done.\n'
    assert nodestate.load(path)["gpu"]["clock_lock_mhz"] == [0, 2000]
    rc, out, _ = _run_main(monkeypatch, capsys, path, ["nvidia-smi", "-lgc", "0,2000"], euid=1000)
    assert rc == 4
    rc, out, _ = _run_main(monkeypatch, capsys, path, ["nvidia-smi", "-rgc"])
    assert (rc, out) == (0, "All done.\n")
    assert nodestate.load(path)["gpu"]["clock_lock_mhz"] is None


@pytest.mark.parametrize("lock,lo,hi,sm_lo,sm_hi", [(None, 63.0, 66.0, 2380, 2500), ([0, 2000], 33.0, 36.0, 1970, 2000)])
def test_busy_power_follows_clock_cap(state: dict, lock, lo, hi, sm_lo, sm_hi) -> None:
    busy(state)
    state["gpu"]["clock_lock_mhz"] = lock
    samples = [shims.gpu_sample(state, NOW + k) for k in range(120)]
    assert all(lo <= s.power_w <= hi for s in samples), [s.power_w for s in samples]
    assert all(sm_lo <= s.sm_mhz <= sm_hi for s in samples)
    assert len({s.sm_mhz for s in samples}) > 3  # a little jitter
    assert all(s.pstate == "P0" for s in samples)
    assert all(bool(s.reasons & shims.REASON_APP_CLOCKS) == (lock is not None) for s in samples)
    assert shims.gpu_sample(state, NOW) == shims.gpu_sample(state, NOW + 0.5)  # deterministic


def test_idle_gpu_is_p8_208mhz_3_to_5_watts(state: dict) -> None:
    samples = [shims.gpu_sample(state, NOW + k) for k in range(60)]
    assert all(s.sm_mhz == 208 and s.pstate == "P8" and 3.0 <= s.power_w <= 5.0 for s in samples)
    out = shims.nvidia_smi(state, ["-q", "-d", "PERFORMANCE"], now=NOW, euid=0).stdout
    assert "        Idle                                           : Active" in out


def test_locked_busy_reports_applications_clocks_event_reason(state: dict) -> None:
    busy(state)
    state["gpu"]["clock_lock_mhz"] = [0, 2000]
    out = shims.nvidia_smi(state, ["-q", "-d", "PERFORMANCE"], now=NOW, euid=0).stdout
    assert "        Applications Clocks Setting                    : Active" in out
    q = shims.nvidia_smi(state, ["--query-gpu=clocks_event_reasons.active", "--format=csv,noheader"], now=NOW, euid=0)
    assert q.stdout == "0x0000000000000002\n"


# ---------------------------------------------------------------- RDMA identity


def test_ibdev2netdev_matches_real_capture(state: dict) -> None:
    r = shims.ibdev2netdev(state, [], port0_netdevs())
    assert r.stdout.splitlines() == fixture_lines("ibdev2netdev-spark-5c2d.txt")
    port1 = {n: up(n) for n in ("enp1s0f1np1", "enP2p1s0f1np1")}  # f0 twins missing entirely
    assert shims.ibdev2netdev(state, [], port1).stdout.splitlines() == fixture_lines("ibdev2netdev-port1.txt")


def test_show_gids_layout_matches_real_capture(state: dict) -> None:
    out = shims.show_gids(state, [], port0_netdevs()).stdout.splitlines()
    real_full = fixture_lines("show_gids-mlx5-full.txt")
    real_spark = fixture_lines("show_gids-spark-rows.txt")
    assert out[:2] == real_full[:2]
    assert real_spark[1] in out  # the v2 IPv4 row at index 3, byte for byte
    ll = [line for line in out if line.startswith("rocep1s0f0\t1\t1\t")][0]
    assert re.fullmatch(r"rocep1s0f0\t1\t1\tfe80:0000:0000:0000:4ebb:47ff:fe[0-9a-f]{2}:[0-9a-f]{4}\t\t\tv2\tenp1s0f0np0", ll)
    # f0 twins: 4 GIDs each; f1 lowerlayerdown: link-local only; f1 admin down: none
    assert out[-1] == "n_gids_found=10"
    assert len(out) == 2 + 10 + 1
    one = shims.show_gids(state, ["roceP2p1s0f0"], port0_netdevs()).stdout.splitlines()
    assert one[-1] == "n_gids_found=4"
    assert one[2 + 2].split("\t")[:3] == ["roceP2p1s0f0", "1", "2"]


def test_gid_index_shift_moves_roce_v2_ipv4_gid(state: dict) -> None:
    nds = port0_netdevs()
    assert shims.roce_v2_ipv4_gid_index(state, "rocep1s0f0", nds) == 3
    state["gid_index_shift"] = {"enp1s0f0np0": 1}
    table = shims.gid_table(state, "rocep1s0f0", nds)
    assert sorted(table) == [0, 1, 2, 4]
    assert (table[2].type, table[4].type) == ("IB/RoCE v1", "RoCE v2")
    assert shims.roce_v2_ipv4_gid_index(state, "rocep1s0f0", nds) == 4
    state["gid_index_shift"] = {"enp1s0f0np0": 2}
    assert shims.roce_v2_ipv4_gid_index(state, "rocep1s0f0", nds) == 5
    assert shims.roce_v2_ipv4_gid_index(state, "roceP2p1s0f0", nds) == 3  # per netdev
    no_ip = {"enp1s0f0np0": up("enp1s0f0np0")}
    assert sorted(shims.gid_table(state, "rocep1s0f0", no_ip)) == [0, 1]


def test_link_local_ipv4_gid_sits_before_the_fabric_gid(state: dict) -> None:
    nds = port0_netdevs()
    state["links"]["enp1s0f0np0"]["link_local_ipv4"] = "169.254.23.7"
    table = shims.gid_table(state, "rocep1s0f0", nds)
    assert [(k, g.type, g.ipv4) for k, g in sorted(table.items()) if g.ipv4] == [
        (2, "IB/RoCE v1", "169.254.23.7"), (3, "RoCE v2", "169.254.23.7"),
        (4, "IB/RoCE v1", "192.168.100.10"), (5, "RoCE v2", "192.168.100.10")]
    assert shims.roce_v2_ipv4_gid_index(state, "rocep1s0f0", nds) == 3  # the naive pick: wrong
    assert shims.fabric_gid_index(state, "rocep1s0f0", nds) == 5
    assert shims.fabric_gid_index(state, "roceP2p1s0f0", nds) == 3  # per netdev
    rows = [r.split("\t") for r in shims.show_gids(state, ["rocep1s0f0"], nds).stdout.splitlines()[2:-1]]
    assert [(r[2], r[4].strip()) for r in rows if r[4].strip()] == [
        ("2", "169.254.23.7"), ("3", "169.254.23.7"), ("4", "192.168.100.10"), ("5", "192.168.100.10")]
    state["gid_index_shift"] = {"enp1s0f0np0": 1}  # drift moves the fabric v2 GID, not the link-local one
    assert shims.fabric_gid_index(state, "rocep1s0f0", nds) == 6


def test_sysfs_infiniband_tree(state: dict, tmp_path: Path) -> None:
    nds = port0_netdevs()
    shims.write_sysfs_infiniband(tmp_path, state, nds)
    port = tmp_path / "class/infiniband/rocep1s0f0/ports/1"
    assert (port / "gids/3").read_text() == "0000:0000:0000:0000:0000:ffff:c0a8:640a\n"
    assert (port / "gid_attrs/types/3").read_text() == "RoCE v2\n"
    assert (port / "gid_attrs/types/2").read_text() == "IB/RoCE v1\n"
    assert (port / "gid_attrs/types/0").read_text() == "IB/RoCE v1\n"
    assert (port / "gid_attrs/ndevs/3").read_text() == "enp1s0f0np0\n"
    assert (port / "gids/7").read_text() == "0000:0000:0000:0000:0000:0000:0000:0000\n"
    assert not (port / "gid_attrs/types/7").exists()
    assert len(list((port / "gids").iterdir())) == 256
    assert (port / "rate").read_text() == "200 Gb/sec (4X HDR)\n"
    assert (port / "state").read_text() == "4: ACTIVE\n"
    down = tmp_path / "class/infiniband/rocep1s0f1/ports/1"
    assert (down / "state").read_text() == "1: DOWN\n"
    assert (down / "rate").read_text() == "40 Gb/sec (4X QDR)\n"
    # drift: rewrite moves the v2 GID to 4 and empties 3
    state["gid_index_shift"] = {"enp1s0f0np0": 1}
    shims.write_sysfs_infiniband(tmp_path, state, nds)
    assert (port / "gids/3").read_text() == "0000:0000:0000:0000:0000:0000:0000:0000\n"
    assert not (port / "gid_attrs/types/3").exists()
    assert (port / "gid_attrs/types/4").read_text() == "RoCE v2\n"
    # show_gids prints what sysfs holds
    assert shims.show_gids(state, ["rocep1s0f0"], nds).stdout.count("\n") == 2 + 4 + 1


# ---------------------------------------------------------------- ethtool, lspci


def test_ethtool_up_200g(state: dict) -> None:
    r = shims.ethtool(state, ["enp1s0f0np0"], port0_netdevs(), euid=0)
    lines = r.stdout.splitlines()
    assert lines[0] == "Settings for enp1s0f0np0:"
    assert all(line.startswith("\t") for line in lines[1:])
    assert "\t                        200000baseCR4/Full" in lines
    grep = [line for line in lines if re.search("Speed|Link detected", line)]
    assert grep == ["\tSpeed: 200000Mb/s", "\tLink detected: yes"]
    i = lines.index("\tSpeed: 200000Mb/s")
    assert lines[i : i + 5] == ["\tSpeed: 200000Mb/s", "\tLanes: 4", "\tDuplex: Full", "\tAuto-negotiation: on",
                                "\tPort: Direct Attach Copper"]
    state["links"]["enp1s0f0np0"]["speed_mbps"] = 100000
    assert "\tSpeed: 100000Mb/s" in shims.ethtool(state, ["enp1s0f0np0"], port0_netdevs(), euid=0).stdout


@pytest.mark.parametrize("netdevs", [port0_netdevs(), {}])
def test_ethtool_down_form(state: dict, netdevs: dict) -> None:
    out = shims.ethtool(state, ["enp1s0f1np1"], netdevs, euid=0).stdout.splitlines()
    assert "\tSpeed: Unknown!" in out
    assert "\tDuplex: Unknown! (255)" in out
    assert out[-1] == "\tLink detected: no"
    assert not any("Lanes" in line for line in out)


def test_ethtool_unknown_device(state: dict) -> None:
    r = shims.ethtool(state, ["eth9"], {}, euid=0)
    assert r.exit_code == 1 and "No such device" in r.stderr


def test_lspci_lines_match_real_capture(state: dict) -> None:
    mellanox = [ln for ln in shims.lspci(state, [], euid=1000).stdout.splitlines() if "Mellanox" in ln]
    assert mellanox == fixture_lines("lspci-cx7.txt")  # the capture is `lspci | grep -i mellanox`
    assert shims.lspci(state, ["-s", "0002:01:00.1"], euid=0).stdout.splitlines() == fixture_lines("lspci-cx7.txt")[3:]


def _lnk(out: str) -> list[str]:
    return [line.strip().expandtabs(8) for line in out.splitlines() if re.search("LnkCap:|LnkSta:", line)]


def test_lspci_vvv_link_healthy_and_degraded(state: dict) -> None:
    real = [line.strip() for line in fixture_lines("lspci-vvv-lnk-healthy.txt")]
    out = shims.lspci(state, ["-vvv", "-s", "0000:01:00.0"], euid=0).stdout
    assert _lnk(out) == real
    assert "\t\tLnkSta:\tSpeed 32GT/s, Width x4\n" in out
    state["pcie"] = {"gen_gts": 2.5, "width": 4}
    out = shims.lspci(state, ["-vv", "-s", "0000:01:00.0"], euid=0).stdout
    assert _lnk(out) == [real[0], "LnkSta: Speed 2.5GT/s (downgraded), Width x4"]
    assert "Capabilities: <access denied>" in shims.lspci(state, ["-vv"], euid=1000).stdout


# ---------------------------------------------------------------- OS identity


def test_uname_forms(state: dict) -> None:
    assert shims.uname(state, []).stdout == "Linux\n"
    assert shims.uname(state, ["-r"]).stdout == "6.17.0-1029-nvidia\n"
    assert shims.uname(state, ["-m"]).stdout == "aarch64\n"
    assert shims.uname(state, ["-n"]).stdout == "spark-5c2d\n"
    assert shims.uname(state, ["-a"]).stdout == (
        "Linux spark-5c2d 6.17.0-1029-nvidia #29-Ubuntu SMP PREEMPT_DYNAMIC Wed May 27 19:14:05 UTC 2026"
        " aarch64 aarch64 aarch64 GNU/Linux\n"
    )
    assert shims.uname(state, ["-q"]).exit_code == 1


def test_getconf(state: dict) -> None:
    assert shims.getconf(state, ["PAGESIZE"]).stdout == "4096\n"
    state["page_size"] = 65536
    assert shims.getconf(state, ["PAGESIZE"]).stdout == "65536\n"
    assert shims.getconf(state, ["LONG_BIT"]).exec_argv == ("/usr/bin/getconf", "LONG_BIT")


def test_apt_mark(state: dict) -> None:
    shown = shims.apt_mark(state, ["showhold"], euid=1000).stdout
    assert shown.splitlines() == sorted(state["held_packages"])
    refused = shims.apt_mark(state, ["unhold", "linux-nvidia-hwe-24.04"], euid=1000)
    assert refused.exit_code == 100 and refused.new_state is None
    r = shims.apt_mark(state, ["unhold", "linux-nvidia-hwe-24.04"], euid=0)
    assert r.stdout == "Canceled hold on linux-nvidia-hwe-24.04.\n"
    assert "linux-nvidia-hwe-24.04" not in r.new_state["held_packages"]
    r2 = shims.apt_mark(r.new_state, ["hold", "linux-nvidia-hwe-24.04"], euid=0)
    assert r2.stdout == "linux-nvidia-hwe-24.04 set on hold.\n"
    assert r2.new_state["held_packages"] == sorted(state["held_packages"])


def test_meminfo_format_and_available(state: dict) -> None:
    real = fixture_lines("meminfo-head.txt")
    ours = nodestate.render_meminfo(state).splitlines()
    keys = [line.split(":")[0] for line in ours]
    real_keys = [line.split(":")[0] for line in real]
    assert [k for k in keys if k in real_keys] == real_keys  # same order
    exact = {"MemTotal", "Buffers", "Unevictable", "Mlocked", "Shmem", "KReclaimable", "SUnreclaim", "NFS_Unstable",
             "VmallocUsed", "Percpu", "CmaTotal", "CmaFree", "HugePages_Total", "Hugetlb"}
    for line in real:
        if line.split(":")[0] in exact:
            assert line in ours
    for line in ours:
        assert re.fullmatch(r"[A-Za-z_()]+:\s+\d+( kB)?", line), line
    avail = dict((line.split(":")[0], int(line.split()[1])) for line in ours)
    assert avail["MemAvailable"] == nodestate.IDLE_MEM_AVAILABLE_KIB
    busy(state)
    avail2 = dict((line.split(":")[0], int(line.split()[1])) for line in nodestate.render_meminfo(state).splitlines())
    assert avail2["MemAvailable"] == nodestate.mem_available_kib(state) < avail["MemAvailable"]
    assert avail2["MemFree"] <= avail2["MemAvailable"]
    assert nodestate.render_boot_id(state) == state["boot_id"] + "\n"


# ---------------------------------------------------------------- ib_write_bw


def test_ib_write_bw_header_matches_real_capture(state: dict) -> None:
    real = fixture_lines("ib_write_bw-rdma-cm.txt")
    nds = {"enp1s0f1np1": up("enp1s0f1np1", "192.168.177.11")}
    r = shims.ib_write_bw(state, ["192.168.177.12", "-d", "rocep1s0f1", "--report_gbits", "-q", "4", "-R",
                                  "--force-link", "IB"], nds)
    ours = [line.expandtabs(8) for line in r.stdout.splitlines()]
    assert r.exit_code == 0
    assert ours[:15] == real[:15]
    assert ours[23:25] == real[23:25]  # rule + result header
    cols = [m.start() for m in re.finditer(r"\S+", real[25])]
    assert [m.start() for m in re.finditer(r"\S+", ours[25])] == cols
    assert ours[-1] == real[-1]
    assert [bool(re.match(r" (local|remote) address: LID 0000 QPN 0x[0-9a-f]{4} PSN 0x[0-9a-f]+$", line))
            for line in ours[15:23]] == [True] * 8


def test_ib_write_bw_healthy_stale_down(state: dict) -> None:
    nds = port0_netdevs()
    argv = ["-d", "rocep1s0f0", "--report_gbits", "192.168.100.11"]
    r = shims.ib_write_bw(state, argv, nds)
    assert " GID index       : 3" in r.stdout
    assert " GID: 00:00:00:00:00:00:00:00:00:00:255:255:192:168:100:10" in r.stdout
    row = r.stdout.splitlines()[-2]
    bw = float(row.split()[3])
    assert 92.0 <= bw <= 111.0
    assert shims.ib_write_bw(state, argv, nds).stdout == r.stdout  # deterministic
    state["links"]["enp1s0f0np0"]["stale"] = True
    stale = float(shims.ib_write_bw(state, argv, nds).stdout.splitlines()[-2].split()[3])
    assert 13.0 <= stale <= 14.0
    down = shims.ib_write_bw(state, ["-d", "rocep1s0f1", "--report_gbits", "192.168.100.11"], nds)
    assert down.exit_code == 1 and "Port number 1 state is Down" in down.stderr
    wrong_x = shims.ib_write_bw(state, argv + ["-x", "1"], nds)  # link-local v2: header, no row
    assert wrong_x.exit_code == 0 and "#bytes" not in wrong_x.stdout


# ---------------------------------------------------------------- main, wrappers


def test_main_lists_live_engine_pid(
    state: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    state["engine_mem_gib"] = {str(os.getpid()): 20.0}
    path = tmp_path / "node.json"
    nodestate.save(path, state)
    rc, out, _ = _run_main(monkeypatch, capsys, path, ["nvidia-smi"])
    assert rc == 0
    assert re.search(rf"\|    0   N/A  N/A {os.getpid():>15}      C   \S+.*20480MiB \|", out)
    rc, out, _ = _run_main(monkeypatch, capsys, path, ["ibdev2netdev"], netdevs=port0_netdevs())
    assert out.splitlines() == fixture_lines("ibdev2netdev-spark-5c2d.txt")


def test_read_netdevs_parses_sysfs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, oper, mtu in (("enp1s0f0np0", "up", "9000"), ("enp1s0f1np1", "down", "1500")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "operstate").write_text(oper + "\n")
        (tmp_path / name / "mtu").write_text(mtu + "\n")
    ip_json = (
        '[{"ifname":"enp1s0f0np0","operstate":"UP","mtu":9000,"addr_info":[{"family":"inet","local":"10.0.0.1",'
        '"prefixlen":30},{"family":"inet6","local":"fe80::1","prefixlen":64}]},'
        '{"ifname":"enP2p1s0f0np0","operstate":"LOWERLAYERDOWN","mtu":1500,"addr_info":[]}]'
    )
    # read_netdevs imports subprocess where it runs `ip` (the shims start lean): patch the module
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 0, ip_json, ""))
    nds = shims.read_netdevs(sys_class_net=str(tmp_path))
    assert nds == {
        "enp1s0f0np0": Netdev("enp1s0f0np0", "up", 9000, (("10.0.0.1", 30),)),
        "enp1s0f1np1": Netdev("enp1s0f1np1", "down", 1500, ()),
        # not in this (stale) sysfs view, known to netlink
        "enP2p1s0f0np0": Netdev("enP2p1s0f0np0", "lowerlayerdown", 1500, ()),
    }


def test_install_shims_wrappers_run(state: dict, tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin dir"
    path = tmp_path / "st ate.json"
    nodestate.save(path, state)
    written = shims.install_shims(bin_dir, state_path=path)
    assert sorted(p.name for p in written) == sorted(shims.TOOLS)
    text = (bin_dir / "uname").read_text()
    assert text.startswith("#!/bin/sh\n")
    assert text.rstrip().endswith('-m sparkctl_sim.shims uname "$@"')
    assert "'" in text  # quoted paths with spaces
    assert os.access(bin_dir / "uname", os.X_OK)
    env = {k: v for k, v in os.environ.items() if k not in (shims.STATE_ENV, "PYTHONPATH")}
    out = subprocess.run([str(bin_dir / "uname"), "-rn"], capture_output=True, text=True, env=env, timeout=30)
    assert (out.returncode, out.stdout) == (0, "spark-5c2d 6.17.0-1029-nvidia\n")


def test_lspci_gx10_root_port_caps_the_function_and_pp_names_the_port(state: dict) -> None:
    """SIMULATED GX10: the second controller behind a two-lane root port (forum thread 367853)."""
    from sparkctl.facts.pci import parse_lspci_link

    assert shims.lspci(state, ["-PP", "-D", "-s", "0002:01:00.0"], euid=0).stdout.splitlines() == \
        fixture_lines("lspci-PP-D-gx10-cx7-constructed.txt")
    state["pcie"]["root_ports"]["0002"]["width"] = 2
    ep = shims.lspci(state, ["-vv", "-s", "0002:01:00.0"], euid=0).stdout
    assert _lnk(ep) == _lnk((FIX / "lspci-vv-gx10-cx7-x2-constructed.txt").read_text())
    root = shims.lspci(state, ["-vv", "-s", "0002:00:00.0"], euid=0).stdout
    assert _lnk(root) == _lnk((FIX / "lspci-vv-gx10-rootport-x2-constructed.txt").read_text())
    link = parse_lspci_link(ep + "upstream 0002:00:00.0\n" + root, "0002:01:00.0")
    assert (link.sta_width, link.slot_width, link.downgraded) == (2, 2, True)
    assert "x2" not in shims.lspci(state, ["-vv", "-s", "0000:01:00.0"], euid=0).stdout  # the first controller: x4
