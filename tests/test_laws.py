"""Laws as pure functions: synthetic facts in, verdicts out (no hosts, no SSH)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sparkctl.plan import laws

from helpers import INV, ctx, healthy


def fails(c: laws.Context) -> set[tuple[str, str]]:
    return {(v.law, v.node) for v in laws.judge(c) if v.failed}


def test_healthy_ring_fails_only_the_page_size_and_passes_waived() -> None:
    assert fails(ctx()) == {("page_size", n) for n in INV.names}
    waived = ctx(waivers={"page_size": laws.Waiver("page_size", "stock kernel")})
    assert fails(waived) == set()
    assert {v.status for v in laws.judge(waived) if v.law == "page_size"} == {"waived"}


@pytest.mark.parametrize("change,law", [
    ({"kernel": "6.17.0-1031-nvidia"}, "kernel_pin"),
    ({"kernel": "6.17.0-1021-nvidia"}, "kernel_pin"),   # not known good: unqualified
    ({"kernel": "7.0.0-1019-nvidia"}, "kernel_pin"),    # known bad (public reports, kernels.yaml)
    ({"held_packages": []}, "kernel_pin"),
    ({"mem_available_kib": 20_000_000}, "memory_guard"),           # idle, 100 GiB missing: a leak
    ({"clock_lock_record": None}, "clock_cap"),
    ({"clock_lock_record": ("another-boot-id-0000-0000-000000000000", 2000)}, "clock_cap"),  # rebooted since
    ({"disk_free_gib": 3.0}, "weights"),
])
def test_each_fault_is_caught_by_its_law_on_its_node(change: dict, law: str) -> None:
    bad = replace(healthy("spark-b"), **change)
    got = fails(ctx(facts={"spark-b": bad}, waivers={"page_size": laws.Waiver("page_size", "x")}))
    assert got == {(law, "spark-b")}


def test_weights_law_fails_the_node_whose_files_differ_from_the_others() -> None:
    from sparkctl.facts.nodefacts import WeightsSummary

    same = WeightsSummary("dir", files=2, bytes=3 << 30, digest="a" * 64)
    facts = {n: replace(healthy(n), weights=same) for n in INV.names}

    def files(c: laws.Context) -> dict[str, laws.Verdict]:
        return {v.node: v for v in laws.judge(c) if v.law == "weights" and v.subject == "files"}

    ok = files(ctx(facts=facts))
    assert {v.status for v in ok.values()} == {"ok"} and "as on 3 other nodes" in ok["spark-a"].observed
    odd = files(ctx(facts={**facts, "spark-c": replace(facts["spark-c"], weights=replace(same, digest="b" * 64))},
                    profile_name="ds41f-tp4-ring"))
    assert odd["spark-c"].status == "fail" and odd["spark-a"].status == "ok"
    assert odd["spark-c"].expected == "digest aaaaaaaaaaaa as on spark-a, spark-b, spark-d"
    assert "sparkctl weights sync ds41f-tp4-ring --from spark-a" in odd["spark-c"].fix
    # changed since verified, or partial: a warning that names the files; never hashed here: skipped
    edited = replace(same, digest=None, n_unverified=1, unverified=("config.json",), partial=1)
    mixed = files(ctx(facts={**facts, "spark-b": replace(facts["spark-b"], weights=edited),
                             "spark-d": replace(facts["spark-d"], weights=WeightsSummary("no-agent")),
                             "spark-a": replace(facts["spark-a"], weights=WeightsSummary("missing"))}))
    assert mixed["spark-b"].status == "warn" and "config.json" in mixed["spark-b"].observed
    assert "1 partial files" in mixed["spark-b"].observed
    assert mixed["spark-d"].status == "skip" and mixed["spark-a"].status == "warn"
    assert mixed["spark-c"].status == "ok" and not any(v.failed for v in mixed.values())
    unread = replace(facts["spark-b"], weights=None, unreadable={"weights": "cannot read the weights on spark-b"})
    assert files(ctx(facts={**facts, "spark-b": unread}))["spark-b"].status == "warn"


def test_denied_kernel_names_the_reason_and_the_pin() -> None:
    bad = replace(healthy("spark-c"), kernel="6.17.0-1031-nvidia")
    v = next(v for v in laws.judge(ctx(facts={"spark-c": bad})) if v.law == "kernel_pin" and v.node == "spark-c")
    assert "NV_ERR_NO_MEMORY" in v.fix and "6.17.0-1029-nvidia" in v.fix


def test_memory_floor_applies_while_an_engine_runs() -> None:
    from sparkctl.facts.nodefacts import EngineProc

    busy = replace(healthy("spark-a"), engines=[EngineProc(1, "ds41f serve")], mem_available_kib=8 * 1024 * 1024)
    assert ("memory_guard", "spark-a") in fails(ctx(facts={"spark-a": busy}))
    ok = replace(busy, mem_available_kib=14 * 1024 * 1024)
    assert ("memory_guard", "spark-a") not in fails(ctx(facts={"spark-a": ok}))


def test_mtu_mismatch_names_the_cable_both_ends() -> None:
    a = healthy("spark-b")
    links = dict(a.links)
    links["enp1s0f0np0"] = replace(links["enp1s0f0np0"], mtu=1500)
    v = [v for v in laws.judge(ctx(facts={"spark-b": replace(a, links=links)})) if v.law == "fabric" and v.failed]
    assert len(v) == 1 and "MTU 1500" in v[0].observed
    assert v[0].subject == "spark-b:enp1s0f0np0 <-> spark-c:enp1s0f1np1"


def test_stale_link_fails_both_ends_and_says_a_warm_reboot_did_not_clear_it() -> None:
    probe = laws.LinkProbe("spark-b", "enp1s0f0np0", "spark-c", "10.20.2.3", bandwidth_gbps=13.5)
    c = ctx(link_probes=(probe,), stale_seen={"spark-b:enp1s0f0np0": "old-boot"})
    vs = {v.node: v for v in laws.judge(c) if v.law == "ac_cycle" and v.failed}
    assert set(vs) == {"spark-b", "spark-c"}
    assert "warm reboot did not clear it" in vs["spark-b"].observed
    assert "unplug them from AC for at least 60 seconds" in vs["spark-c"].fix


def test_pending_hw_change_until_every_affected_node_booted() -> None:
    facts = {n: healthy(n) for n in INV.names}
    hw = laws.HwChange("moved B-C", "2026-11-29T10:00:00+00:00",
                       {n: facts[n].boot_id for n in ("spark-b", "spark-c")}, ("spark-b", "spark-c"))
    assert {x for x in fails(ctx(hw_change=hw)) if x[0] == "ac_cycle"} == {("ac_cycle", "spark-b"), ("ac_cycle", "spark-c")}
    rebooted = {n: replace(facts[n], boot_id="new-" + n) for n in ("spark-b", "spark-c")}
    assert not {x for x in fails(ctx(hw_change=hw, facts=rebooted)) if x[0] == "ac_cycle"}


def test_served_model_checks_the_name_not_the_port() -> None:
    assert ("served_model", "spark-a") in fails(ctx(endpoint_models={"spark-a": ["dsv41-flash-tensorfold"]}))
    assert ("served_model", "spark-a") not in fails(ctx(endpoint_models={"spark-a": ["deepseek-v4.1-flash"]}))


def test_unreachable_node_is_a_verdict_and_the_others_are_still_judged() -> None:
    c = ctx(facts={"spark-d": None}, unreachable={"spark-d": "unreachable: no answer within 5 s"})
    got = fails(c)
    assert ("reach", "spark-d") in got and ("page_size", "spark-a") in got and ("page_size", "spark-d") not in got


def test_unreadable_fact_fails_its_law_with_the_probe_message() -> None:
    bad = replace(healthy("spark-a"), kernel=None, unreadable={"kernel": "cannot read kernel on node spark-a: empty"})
    v = next(v for v in laws.judge(ctx(facts={"spark-a": bad})) if v.law == "kernel_pin" and v.node == "spark-a")
    assert v.failed and v.fix == "cannot read kernel on node spark-a: empty"


def test_clock_remedy_is_safe_and_quotes_paths() -> None:
    bad = replace(healthy("spark-a"), clock_lock_record=None)
    c = ctx(facts={"spark-a": bad})
    r = laws.remedy_clock(c, [v for v in laws.judge(c) if v.law == "clock_cap"])
    assert r is not None and r.safe and list(r.commands) == ["spark-a"]
    assert r.commands["spark-a"][0] == "nvidia-smi -lgc 0,2000"
    kr = laws.remedy_kernel(ctx(facts={"spark-a": replace(bad, held_packages=[])}),
                            [laws.Verdict("kernel_pin", "spark-a", "fail", "", "")])
    assert kr is not None and not kr.safe  # sparkctl never upgrades or re-pins on its own


def test_fabric_law_names_the_netplan_file_that_also_configures_a_port() -> None:
    from sparkctl.facts.netplanfiles import describe_file
    from sparkctl_sim import playbook

    ll = describe_file("40-cx7.yaml", playbook.LINK_LOCAL.encode())  # enp1s0f0np0, enp1s0f1np1
    own = describe_file("60-sparkctl-fabric.yaml", b"network: {version: 2, ethernets: {enp1s0f0np0: {}}}\n")
    a = replace(healthy("spark-a"), netplan_files=(own, ll))
    got = [v for v in laws.judge(ctx(facts={"spark-a": a})) if v.law == "fabric" and v.failed]
    assert {v.node for v in got} == {"spark-a"}
    assert sorted(v.observed for v in got) == [f"/etc/netplan/40-cx7.yaml also configures {nd}"
                                               for nd in ("enp1s0f0np0", "enp1s0f1np1")]
    assert all("takes /etc/netplan/40-cx7.yaml into its backup" in v.fix for v in got)
    assert not [v for v in laws.judge(ctx(facts={"spark-a": replace(a, netplan_files=(own,))}))
                if v.law == "fabric" and v.failed]  # sparkctl's own file is no foreign one
